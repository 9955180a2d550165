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
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from forge.config import CONF_DIR, ConfigError
from forge.core.errors import CommandError, exit_on_expected_error, exit_with_line, full_errors_wanted
from forge.engine.gc_pause import no_collection_at_exit, rare_gc
from forge.server.port_check import check_port_free

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
    "--tensor-parallel-size": "engine.tensor_parallel_size",
    "--kv-cache-dtype": "engine.kv_cache_dtype",
    "--served-model-name": "server.served_model_name",
}
API_KEY_FLAG = "--api-key"
API_KEY_ENV = "FORGE_API_KEY"  # read by forge.server.settings; keeps the key out of every written config
# Hydra flags after which forge serve's config is not the one compose() would give (sweeps, another
# config): the early check is left to the job
HYDRA_OWN_CONFIG_FLAGS = ("-m", "--multirun", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")

BENCHMARKS = {
    "serve": "benchmarks.serve",
    "startup": "benchmarks.startup",
    "regress": "benchmarks.regress",
}


def _run_job(cfg: Any, run_dir: Path) -> None:
    from forge.config import validate_settings

    validate_settings(cfg)  # what needs no import first: a bad setting is one line before torch loads
    if cfg.mode == "serve":
        from forge.server.app import serve

        serve(cfg)
        return
    from forge.main import format_summary, run_offline

    summary = run_offline(cfg, run_dir)
    print(format_summary(summary))
    print(f"run directory: {run_dir}")


def hydra_error_line(exc: BaseException) -> str:
    """Hydra's (or OmegaConf's) multi-line message about a command line it could not compose, as
    one line naming the override: an option that does not exist (with the options there are), a
    key that is not a setting, an override that does not parse, a value of the wrong type."""
    from hydra.errors import InstantiationException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    def first_line(err: BaseException) -> str:
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        return lines[0] if lines else type(err).__name__

    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options:
        group, _, name = exc.missing_cfg_file.rpartition("/")
        return f"{group}={name}: no such option (options: {', '.join(exc.options)})"
    if isinstance(exc, OverrideParseException):
        return f"{exc.override}: not an override Hydra can parse ({first_line(exc)})"
    if isinstance(exc, InstantiationException) and isinstance(exc.__cause__, ValueError):
        return first_line(exc.__cause__)
    cause = exc.__cause__
    if isinstance(cause, ConfigKeyError | ConfigAttributeError) and getattr(cause, "full_key", None):
        return f"{cause.full_key}: not a setting ({first_line(cause)})"
    parts = [first_line(exc)]
    if cause is not None and first_line(cause) not in parts:
        parts.append(first_line(cause))
    return ": ".join(parts)


def _is_compose_error(exc: BaseException, job_started: bool) -> bool:
    """An error of the command line itself: an override Hydra cannot parse or apply, an option or a
    key that does not exist, a value of the wrong type. Raised by Hydra before the job starts (or, in
    a sweep, while composing a later job's config); errors from inside a job are not these."""
    from hydra.errors import CompactHydraException, InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(exc, InstantiationException):  # a Hydra plugin's setting (hydra.launcher.*) it refused
        return not job_started and "full_key: hydra." in str(exc)
    if isinstance(exc, CompactHydraException):
        return True
    return not job_started and isinstance(exc, OmegaConfBaseException)


def run_app(argv: Sequence[str]) -> None:
    """``python run.py <argv>``: Hydra's command line over ``conf/``; a ConfigError, and a command
    line Hydra cannot compose (an unknown option or key, bad override syntax, a wrong type), print one
    line and exit 2 (a ConfigError inside a sweep fails that job as any other error does);
    ``FORGE_FULL_ERROR=1`` / ``HYDRA_FULL_ERROR=1`` show the traceback instead."""
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import DictConfig

    from forge.config import register_schema

    register_schema()
    job_started: list[bool] = []
    full_errors = full_errors_wanted()

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
    def job(cfg: DictConfig) -> None:
        job_started.append(True)
        hydra_cfg = HydraConfig.get()
        try:
            _run_job(cfg, Path(hydra_cfg.runtime.output_dir))
        except CommandError as exc:  # ConfigError included
            if hydra_cfg.mode == RunMode.MULTIRUN or full_errors:
                raise
            exit_with_line(exc)

    sys.argv = ["forge", *argv]
    # Hydra prints its own errors (several lines, exit 1) unless HYDRA_FULL_ERROR is set; set, it
    # raises them: those of the command line become one line and exit 2 here, the rest propagate.
    hydra_full_error = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        job()
    except CommandError as exc:  # the launcher's (no Ray cluster): one line, as a job's would be
        if full_errors or isinstance(exc, ConfigError):  # a sweep job's ConfigError fails as any error does
            raise
        exit_with_line(exc)
    except Exception as exc:
        if full_errors or not _is_compose_error(exc, bool(job_started)):
            raise
        print(f"config error: {hydra_error_line(exc)}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    finally:
        if hydra_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = hydra_full_error


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


@contextmanager
def compose_errors_as_config_errors() -> Iterator[None]:
    """Hydra's errors composing a command line (an unknown option, a value of the wrong type) as the
    one-line ``ConfigError`` ``run_app`` would print for them."""
    try:
        yield
    except Exception as exc:
        if full_errors_wanted() or not _is_compose_error(exc, job_started=False):
            raise
        raise ConfigError(hydra_error_line(exc)) from None


def check_serve_config(settings: Sequence[Any], overrides: Sequence[str]) -> Any:
    """The config ``forge serve`` will run, composed and checked (``forge.config.validate_settings``)
    before Hydra's job starts: a bad setting is one line within a second, before any model, backend
    or server is imported, and before the startup line names the settings. None when the command
    line brings its own config (a sweep, another config file)."""
    if any(arg.partition("=")[0] in HYDRA_OWN_CONFIG_FLAGS for arg in overrides):
        return None
    from forge.config import validate_settings
    from forge.server.config_checks import naming_sources
    from forge.server.config_sources import compose_unchecked

    plain = [o for o in overrides if "=" in o and not o.startswith("-")]
    with compose_errors_as_config_errors():
        cfg = compose_unchecked([*(s.override for s in settings), *plain])
    try:
        validate_settings(cfg)
    except ConfigError as exc:
        raise naming_sources(exc, settings) from None
    return cfg


def serve_command(argv: Sequence[str]) -> None:
    """``--config FILE`` and the ``FORGE_*`` variables (forge/server/config_sources.py) under the flags."""
    from forge.server.config_sources import announce, layered, pop_config_flag

    args, config_file = pop_config_flag(argv)
    overrides, api_key = serve_overrides(args)
    if api_key is not None:
        os.environ[API_KEY_ENV] = api_key
    with compose_errors_as_config_errors():  # the YAML is checked against the command line's options
        settings = layered(overrides, config_file, os.environ)
    cfg = check_serve_config(settings, overrides)
    if cfg is not None:
        check_port_free(str(cfg.server.host), int(cfg.server.port))
    if settings:
        print(announce(settings), file=sys.stderr)
    run_app([*(s.override for s in settings), *overrides])


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
