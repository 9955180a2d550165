"""Whether starting processes with multiprocessing's ``spawn`` would re-run the caller's script:
``spawn`` re-imports the main module in each child (as ``__mp_main__``), so a script that builds an
``LLM(..., engine.tensor_parallel_size=2)`` at module level, outside ``if __name__ == "__main__":``,
would have every rank build its own engine and spawn ranks of its own. Checked before any rank
starts (``unguarded_main_call``), the way vLLM asks for the guard."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType


def _main_file() -> Path | None:
    """The main module's file when ``spawn`` re-imports it in a child; None when it does not (``-c``,
    an interactive session, a package's ``__main__``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__") or Path(path).name == "__main__.py":
        return None
    return Path(path)


def _is_main_guard(node: ast.If) -> bool:
    """``if __name__ == "__main__":`` (either operand order)."""
    test = node.test
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _spans(node: ast.stmt, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def _guarded(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in the body of a top-level ``if __name__ == "__main__":``."""
    for node in tree.body:
        if _spans(node, line):
            return isinstance(node, ast.If) and _is_main_guard(node) and any(_spans(s, line) for s in node.body)
    return True  # not a statement of the module: nothing to say


def _module_level_line(frame: FrameType | None, main_globals: dict[str, object]) -> int | None:
    """The line of the main module's top-level code that the current call runs under, if any."""
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            return frame.f_lineno
        frame = frame.f_back
    return None


def unguarded_main_call() -> str | None:
    """``"script.py:LINE"`` when this call runs under the main script's module-level code outside an
    ``if __name__ == "__main__":`` block (so a spawned child would run it again), else None."""
    path = _main_file()
    if path is None:
        return None
    line = _module_level_line(sys._getframe(1), vars(sys.modules["__main__"]))
    if line is None:
        return None
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    return None if _guarded(tree, line) else f"{path.name}:{line}"


class UnguardedMainError(RuntimeError):
    """Spawning would re-run the caller's script (see the module doc)."""


def check_spawn_guard(what: str) -> None:
    """Raise ``UnguardedMainError`` (one line, naming the script's line) when ``what`` is about to
    spawn processes from module-level code of the main script outside the ``__main__`` guard."""
    where = unguarded_main_call()
    if where is not None:
        raise UnguardedMainError(
            f"{what} starts processes with multiprocessing's spawn, which re-imports your script, so the call "
            f'at {where} would run again in each of them: put it under `if __name__ == "__main__":`'
        )
