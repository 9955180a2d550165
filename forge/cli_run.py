"""``forge run`` (and ``python run.py``): Hydra's command line over ``conf/`` running one job (offline, or
``mode=serve``'s server), and a command line Hydra cannot compose as the one-line ``config error: ...``
(``hydra_error_line``; ``compose_errors_as_config_errors`` for the commands and the ``LLM`` class that
compose without ``@hydra.main``). Part of ``forge.cli``, which dispatches the sub-commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from forge.config import CONF_DIR, ConfigError
from forge.core.errors import CommandError, exit_with_line, full_errors_wanted

CONFIG_ERROR_EXIT_CODE = 2


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


def is_compose_error(exc: BaseException, job_started: bool) -> bool:
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
        if full_errors or not is_compose_error(exc, bool(job_started)):
            raise
        print(f"config error: {hydra_error_line(exc)}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)
    finally:
        if hydra_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = hydra_full_error


@contextmanager
def compose_errors_as_config_errors() -> Iterator[None]:
    """Hydra's errors composing a command line (an unknown option, a value of the wrong type) as the
    one-line ``ConfigError`` ``run_app`` would print for them."""
    try:
        yield
    except Exception as exc:
        if full_errors_wanted() or not is_compose_error(exc, job_started=False):
            raise
        raise ConfigError(hydra_error_line(exc)) from None
