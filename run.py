"""``python run.py [group=option ...] [key=value ...]`` — see README.md.

A ``ConfigError`` (a setting forge refuses, with the setting's name in the message) is printed as
one line on stderr and exits with status 2, without a traceback; in a sweep (``-m``) it fails
that job as any other error does."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from forge.config import ConfigError, register_schema

register_schema()

CONFIG_ERROR_EXIT_CODE = 2


def run(cfg: DictConfig, run_dir: Path) -> None:
    if cfg.mode == "serve":
        from forge.server.app import serve

        serve(cfg)
        return
    from forge.main import format_summary, run_offline

    summary = run_offline(cfg, run_dir)
    print(format_summary(summary))
    print(f"run directory: {run_dir}")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    try:
        run(cfg, Path(hydra_cfg.runtime.output_dir))
    except ConfigError as exc:
        if hydra_cfg.mode == RunMode.MULTIRUN:
            raise
        print(f"config error: {exc}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)


if __name__ == "__main__":
    main()
