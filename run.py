"""``python run.py [group=option ...] [key=value ...]`` — see README.md."""

from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from forge.config import register_schema

register_schema()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.mode == "serve":
        from forge.server.app import serve

        serve(cfg)
        return
    from forge.main import format_summary, run_offline

    summary = run_offline(cfg, run_dir)
    print(format_summary(summary))
    print(f"run directory: {run_dir}")


if __name__ == "__main__":
    main()
