"""Expected failures, reported by every command as one line on stderr and an exit status
(docs/errors-and-outputs.md): 2 when the command line or its input is wrong (``forge.config.ConfigError``
is one of these), 3 when something outside forge that the command needs is missing or refuses (a
server that cannot be reached or refuses the API key, a port in use, no Ray cluster).
``FORGE_FULL_ERROR=1`` (or ``HYDRA_FULL_ERROR=1``) shows the traceback instead. A gate's verdict
(``forge bench regress``) exits 1."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

INPUT_EXIT_CODE = 2
ENVIRONMENT_EXIT_CODE = 3
T = TypeVar("T")


class CommandError(Exception):
    """An expected failure: ``line()`` is what a command prints (``prefix`` + the message),
    ``exit_code`` its status (``INPUT_EXIT_CODE`` unless given)."""

    exit_code: int = INPUT_EXIT_CODE
    prefix: str = ""

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code

    def line(self) -> str:
        return f"{self.prefix}{self}"


def full_errors_wanted() -> bool:
    """``FORGE_FULL_ERROR=1`` (or Hydra's ``HYDRA_FULL_ERROR=1``): show an expected failure's traceback."""
    return any(os.environ.get(name, "") not in ("", "0") for name in ("FORGE_FULL_ERROR", "HYDRA_FULL_ERROR"))


def exit_with_line(exc: CommandError) -> NoReturn:
    """Print ``exc`` as one line on stderr and exit with its status."""
    print(exc.line(), file=sys.stderr)
    sys.exit(exc.exit_code)


def exit_on_expected_error(exc: CommandError) -> NoReturn:
    """``exit_with_line``, or re-raise ``exc`` under ``FORGE_FULL_ERROR=1``."""
    if full_errors_wanted():
        raise exc
    exit_with_line(exc)


def run_main(main: Callable[[], T]) -> T:
    """``main()`` for a ``python -m`` entry point, its expected failures as one line and a status."""
    try:
        return main()
    except CommandError as exc:
        exit_on_expected_error(exc)
