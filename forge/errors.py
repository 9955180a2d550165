"""Expected failures, reported by every command as one line on stderr and an exit status
(docs/errors.md): 2 when the command line or its input is wrong (a ``ConfigError``, a file or
directory that is not what the command reads), 3 when something outside forge that the command
needs is missing or refuses (a server that cannot be reached or refuses the API key, a port in
use, no Ray cluster). ``FORGE_FULL_ERROR=1`` (or ``HYDRA_FULL_ERROR=1``) shows the traceback
instead. A gate's verdict (``forge bench regress``) exits 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

from forge.config import ConfigError

INPUT_EXIT_CODE = 2
ENVIRONMENT_EXIT_CODE = 3
T = TypeVar("T")


class CommandError(Exception):
    """An expected failure that is not a setting: the message is the line printed, ``exit_code``
    the status (``INPUT_EXIT_CODE`` or ``ENVIRONMENT_EXIT_CODE``)."""

    def __init__(self, message: str, exit_code: int = INPUT_EXIT_CODE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def full_errors_wanted() -> bool:
    """``FORGE_FULL_ERROR=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``): show an expected failure's traceback."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("FORGE_FULL_ERROR", "HYDRA_FULL_ERROR"))


def error_line(exc: ConfigError | CommandError) -> tuple[str, int]:
    """The line a command prints for ``exc`` and the status it exits with."""
    if isinstance(exc, ConfigError):
        return f"config error: {exc}", INPUT_EXIT_CODE
    return str(exc), exc.exit_code


def exit_with_line(exc: ConfigError | CommandError) -> NoReturn:
    """Print ``exc`` as one line on stderr and exit with its status."""
    line, code = error_line(exc)
    print(line, file=sys.stderr)
    sys.exit(code)


def exit_on_expected_error(exc: ConfigError | CommandError) -> NoReturn:
    """``exit_with_line``, or re-raise ``exc`` under ``FORGE_FULL_ERROR=1``."""
    if full_errors_wanted():
        raise exc
    exit_with_line(exc)


def run_main(main: Callable[[], T]) -> T:
    """``main()`` for a ``python -m`` entry point, its expected failures as one line and a status."""
    try:
        return main()
    except (ConfigError, CommandError) as exc:
        exit_on_expected_error(exc)
