"""The ``forge`` command (``[project.scripts]``); ``python run.py`` is ``forge run``.

    forge run [overrides ...]          a run (Hydra's command line: overrides, -m sweeps, --cfg job, ...)
    forge serve [MODEL] [overrides] [--port N --host H --max-num-seqs N --max-model-len N --block-size N
                --tensor-parallel-size N --kv-cache-dtype DTYPE --served-model-name NAME --api-key KEY]
                                       mode=serve; the vLLM flags are mapped onto the config
    forge bench serve [args]           the ``vllm bench serve``-style client (benchmarks/serve.py)
    forge bench startup [args]         import / model load / first-token times (benchmarks/startup.py)
    forge bench regress [args]         the regression gate of benchmarks/suites (benchmarks/regress.py)
    forge sweep DIR                    (re)write a sweep directory's sweep_report.md
    forge report DIR [DIR ...]         (re)write a run directory's report.md and plots
    forge route --backend URL [...] | --spawn N [overrides] [router=NAME]
                                       an OpenAI-compatible gateway over forge serve backends (forge/gateway/cli.py)
    forge capacity [overrides] --ttft S --tpot S [--config "OVERRIDES" ...]
                                       the highest rate each configuration serves within an SLO (forge/capacity/cli.py)

``forge serve --config FILE.yaml`` also takes settings from a YAML and from ``FORGE_*`` variables
(``FORGE_SERVER__PORT=9000``, ``FORGE_ENGINE__MAX_NUM_SEQS=16``: every ``server.*`` and ``engine.*``
key; forge/server/config_sources.py): flags > environment > YAML > defaults. ``FORGE_ADMIN_KEY``
is the key ``POST /shutdown`` needs.

A ``ConfigError`` (a setting forge refuses) is printed as one line, ``config error: ...``, on stderr
and the command exits with status 2; the other expected failures (``forge.core.errors.CommandError``: an
input that is not what the command reads, exit 2; a server that cannot be reached or refuses the key,
a port in use, no Ray cluster, exit 3) are one line too; ``FORGE_FULL_ERROR=1`` (or
``HYDRA_FULL_ERROR=1``) shows the traceback (docs/errors-and-outputs.md).

The benchmark clients live in the checkout's ``benchmarks/`` package, not in the installed ``forge``
package: forge is installed editable from its checkout (``conf/``, the Hydra config every command
composes, lives there too), so ``forge bench`` imports them from the checkout beside ``forge/`` and
says so when that checkout is not there."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# the sub-commands' modules beside this one: forge run (cli_run.py), forge serve (cli_serve.py)
from forge.cli_run import CONFIG_ERROR_EXIT_CODE, compose_errors_as_config_errors, hydra_error_line, run_app
from forge.cli_serve import (
    API_KEY_ENV,
    API_KEY_FLAG,
    HYDRA_OWN_CONFIG_FLAGS,
    SERVE_FLAGS,
    check_serve_config,
    serve_command,
    serve_overrides,
)
from forge.config import CONF_DIR, ConfigError
from forge.core.errors import CommandError, exit_on_expected_error
from forge.engine.gc_pause import no_collection_at_exit, rare_gc

__all__ = [
    "API_KEY_ENV",
    "API_KEY_FLAG",
    "BENCHMARKS",
    "CHECKOUT",
    "COMMANDS",
    "CONFIG_ERROR_EXIT_CODE",
    "HYDRA_OWN_CONFIG_FLAGS",
    "SERVE_FLAGS",
    "USAGE_EXIT_CODE",
    "bench_command",
    "capacity_command",
    "check_serve_config",
    "compose_errors_as_config_errors",
    "hydra_error_line",
    "main",
    "report_command",
    "route_command",
    "run_app",
    "serve_command",
    "serve_overrides",
    "sweep_command",
]

USAGE_EXIT_CODE = 2
CHECKOUT = CONF_DIR.parent

BENCHMARKS = {
    "serve": "benchmarks.serve",
    "startup": "benchmarks.startup",
    "regress": "benchmarks.regress",
}


def bench_command(argv: Sequence[str]) -> None:
    if not argv or argv[0] not in BENCHMARKS:
        raise CommandError(f"usage: forge bench {{{','.join(BENCHMARKS)}}} [args ...]")
    module_name = BENCHMARKS[argv[0]]
    if not (CHECKOUT / "benchmarks" / "__init__.py").exists():
        raise CommandError(
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
        raise CommandError("usage: forge report RUN_DIR [RUN_DIR ...]")
    from forge.results.report import write_report

    for run_dir in argv:
        if not (Path(run_dir) / "summary.json").exists():
            raise CommandError(f"forge report: {run_dir} is not a run directory (no summary.json)")
        print(write_report(run_dir))


def capacity_command(argv: Sequence[str]) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from forge.capacity.cli import main

    try:
        main(argv)
    except (HydraException, OmegaConfBaseException) as exc:  # a configuration Hydra cannot compose
        raise ConfigError(hydra_error_line(exc)) from exc


def route_command(argv: Sequence[str]) -> None:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from forge.gateway.cli import main

    try:
        main(argv)
    except (HydraException, OmegaConfBaseException) as exc:  # a router option or setting Hydra cannot compose
        raise ConfigError(hydra_error_line(exc)) from exc


COMMANDS: dict[str, Callable[[Sequence[str]], None]] = {
    "run": run_app,
    "serve": serve_command,
    "bench": bench_command,
    "sweep": sweep_command,
    "report": report_command,
    "capacity": capacity_command,
    "route": route_command,
}


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        print(__doc__, file=sys.stderr if args and args[0] not in ("-h", "--help") else sys.stdout)
        if args and args[0] not in ("-h", "--help"):
            sys.exit(USAGE_EXIT_CODE)
        return
    # the command's imports, config composition and model build with few GC passes (forge serve's
    # serving loop runs with Python's own thresholds), and no full collection as the process exits
    no_collection_at_exit()
    try:
        with rare_gc():
            COMMANDS[args[0]](args[1:])
    except CommandError as exc:  # ConfigError included
        exit_on_expected_error(exc)


if __name__ == "__main__":
    main()
