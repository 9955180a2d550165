"""The ``forge`` command (``[project.scripts]``); ``python run.py`` is ``forge run``.

    forge run [overrides ...]          a run (Hydra's command line: overrides, -m sweeps, --cfg job, ...)
    forge serve [MODEL] [overrides] [--port N --host H --max-num-seqs N --max-model-len N --block-size N
                --kv-cache-dtype DTYPE --served-model-name NAME --api-key KEY]
                                       mode=serve; the vLLM flags are mapped onto the config
    forge bench serve [args]           the ``vllm bench serve``-style client (benchmarks/serve.py)
    forge bench startup [args]         import / model load / first-token times (benchmarks/startup.py)
    forge bench regress [args]         the regression gate of benchmarks/suites (benchmarks/regress.py)
    forge sweep DIR                    (re)write a sweep directory's sweep_report.md
    forge report DIR [DIR ...]         (re)write a run directory's report.md and plots

A ``ConfigError`` (a setting forge refuses) is printed as one line, ``config error: ...``, on stderr
and the command exits with status 2; ``FORGE_FULL_ERROR=1`` (or ``HYDRA_FULL_ERROR=1``) shows its traceback.

The benchmark clients live in the checkout's ``benchmarks/`` package, not in the installed ``forge``
package: forge is installed editable from its checkout (``conf/``, the Hydra config every command
composes, lives there too), so ``forge bench`` imports them from the checkout beside ``forge/`` and
says so when that checkout is not there."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from forge.config import CONF_DIR, ConfigError

CONFIG_ERROR_EXIT_CODE = 2
USAGE_EXIT_CODE = 2
CHECKOUT = CONF_DIR.parent

# vLLM's ``serve`` flags -> the forge setting each one sets
SERVE_FLAGS = {
    "--port": "server.port",
    "--host": "server.host",
    "--max-num-seqs": "engine.max_num_seqs",
    "--max-model-len": "engine.max_model_len",
    "--block-size": "kvcache.block_size",
    "--kv-cache-dtype": "engine.kv_cache_dtype",
    "--served-model-name": "server.served_model_name",
}
API_KEY_FLAG = "--api-key"
API_KEY_ENV = "FORGE_API_KEY"  # read by forge.server.settings; keeps the key out of every written config

BENCHMARKS = {
    "serve": "benchmarks.serve",
    "startup": "benchmarks.startup",
    "regress": "benchmarks.regress",
}


def print_config_error(exc: ConfigError) -> None:
    print(f"config error: {exc}", file=sys.stderr)


def full_errors_wanted() -> bool:
    """``FORGE_FULL_ERROR=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``): show a ConfigError's traceback."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("FORGE_FULL_ERROR", "HYDRA_FULL_ERROR"))


def _run_job(cfg: Any, run_dir: Path) -> None:
    if cfg.mode == "serve":
        from forge.server.app import serve

        serve(cfg)
        return
    from forge.main import format_summary, run_offline

    summary = run_offline(cfg, run_dir)
    print(format_summary(summary))
    print(f"run directory: {run_dir}")


def run_app(argv: Sequence[str]) -> None:
    """``python run.py <argv>``: Hydra's command line over ``conf/``; a ConfigError exits 2 (in a
    sweep it fails that job as any other error does)."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from forge.config import register_schema

    register_schema()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def job(cfg: DictConfig) -> None:
        hydra_cfg = HydraConfig.get()
        try:
            _run_job(cfg, Path(hydra_cfg.runtime.output_dir))
        except ConfigError as exc:
            if hydra_cfg.mode == RunMode.MULTIRUN or full_errors_wanted():
                raise
            print_config_error(exc)
            sys.exit(CONFIG_ERROR_EXIT_CODE)

    sys.argv = ["forge", *argv]
    job()


def serve_overrides(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """Hydra overrides for ``forge serve <argv>`` and the API key given by ``--api-key`` (if any).
    A first argument without ``=`` or a leading ``-`` names the model option (``forge serve tiny``)."""
    args = list(argv)
    overrides = ["mode=serve"]
    api_key = None
    if args and "=" not in args[0] and not args[0].startswith("-"):
        overrides.append(f"model={args.pop(0)}")
    while args:
        arg = args.pop(0)
        flag, eq, inline = arg.partition("=")
        if flag in SERVE_FLAGS or flag == API_KEY_FLAG:
            if eq:
                value = inline
            elif args:
                value = args.pop(0)
            else:
                raise ConfigError(f"{flag} needs a value")
            if flag == API_KEY_FLAG:
                api_key = value
            else:
                overrides.append(f"{SERVE_FLAGS[flag]}={value}")
        elif arg.startswith("--") and "=" not in arg and arg not in ("--cfg", "--help", "--info"):
            known = ", ".join([*SERVE_FLAGS, API_KEY_FLAG])
            raise ConfigError(f"forge serve: unknown flag {arg} (the vLLM flags forge maps: {known})")
        else:
            overrides.append(arg)
    return overrides, api_key


def serve_command(argv: Sequence[str]) -> None:
    overrides, api_key = serve_overrides(argv)
    if api_key is not None:
        os.environ[API_KEY_ENV] = api_key
    run_app(overrides)


def bench_command(argv: Sequence[str]) -> None:
    if not argv or argv[0] not in BENCHMARKS:
        raise SystemExit(f"usage: forge bench {{{','.join(BENCHMARKS)}}} [args ...]")
    module_name = BENCHMARKS[argv[0]]
    if not (CHECKOUT / "benchmarks" / "__init__.py").exists():
        raise SystemExit(
            f"forge bench {argv[0]} runs {module_name} from forge's checkout, which is not at {CHECKOUT} "
            "(install forge editable from a git checkout: pip install -e .)"
        )
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))
    module = importlib.import_module(module_name)
    status = module.main(list(argv[1:]))
    if isinstance(status, int) and status != 0:  # a gate's verdict (forge bench regress)
        sys.exit(status)


def sweep_command(argv: Sequence[str]) -> None:
    from forge.results.sweep import main

    main(list(argv))


def report_command(argv: Sequence[str]) -> None:
    if not argv:
        raise SystemExit("usage: forge report RUN_DIR [RUN_DIR ...]")
    from forge.results.report import write_report

    for run_dir in argv:
        if not (Path(run_dir) / "summary.json").exists():
            raise SystemExit(f"forge report: {run_dir} is not a run directory (no summary.json)")
        print(write_report(run_dir))


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {
    "run": run_app,
    "serve": serve_command,
    "bench": bench_command,
    "sweep": sweep_command,
    "report": report_command,
}


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(__doc__, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        if args and args[0] not in ("-h", "--help"):
            sys.exit(USAGE_EXIT_CODE)
        return
    try:
        COMMANDS[args[0]](args[1:])
    except ConfigError as exc:
        if full_errors_wanted():
            raise
        print_config_error(exc)
        sys.exit(CONFIG_ERROR_EXIT_CODE)


if __name__ == "__main__":
    main()
