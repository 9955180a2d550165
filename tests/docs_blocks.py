"""The code blocks of forge's documentation (README.md and docs/**/*.md), collected and run.

A fenced block in ``bash``/``sh``/``shell``/``console`` or ``python``/``py`` is collected; it runs unless
the line before its opening fence (blank lines between allowed) is ``<!-- docs-test: skip (reason) -->``.
A page's blocks run in one temporary directory: its shell blocks one after another in ``bash -e -o
pipefail`` (a ``console`` block: its ``$`` lines), then its Python blocks one after another in one
interpreter (a later block sees an earlier one's names). docs/contributing.md describes this for writers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = frozenset({"bash", "sh", "shell", "console"})
PYTHON_LANGS = frozenset({"python", "py"})
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s*\((.*\S.*)\)\s*$")
BLOCK_TIMEOUT_S = 180

# Runs a page's Python blocks (a JSON list of [label, code]) in one namespace; names the failing one.
PY_DRIVER = """
import json, sys, traceback
namespace = {"__name__": "__main__"}
for label, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, label, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"docs-test: the block at {label} failed", file=sys.stderr)
        sys.exit(1)
"""


class MarkerError(ValueError):
    """A ``docs-test:`` comment that is not ``skip (reason)``."""


@dataclass(frozen=True)
class Block:
    """One collected block: where it starts, ``shell`` or ``python``, its text, and why it is skipped."""

    label: str
    kind: str
    code: str
    skip: str | None


def doc_pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def fence_end(lines: list[str], start: int, fence: str) -> int:
    """Index of the line closing the fence opened at ``start`` (a longer fence of the same character)."""
    closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
    for i in range(start + 1, len(lines)):
        if closing.match(lines[i]):
            return i
    return len(lines)


def marker_before(lines: list[str], start: int, label: str) -> str | None:
    """The skip reason given just before line ``start``, or None; a malformed marker raises."""
    i = start - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    found = MARKER.match(lines[i]) if i >= 0 else None
    if found is None:
        return None
    skip = SKIP.match(found.group(1))
    if skip is None:
        raise MarkerError(f"{label}: write '<!-- docs-test: skip (the reason) -->', not {lines[i].strip()!r}")
    return skip.group(1).strip()


def collect(text: str, page: str) -> list[Block]:
    """The shell and Python blocks of one page, each with its skip reason (None: it runs)."""
    lines, blocks, i = text.split("\n"), [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = fence_end(lines, i, opening.group(1))
        lang = opening.group(2).lower()
        if lang in SHELL_LANGS | PYTHON_LANGS:
            label = f"{page}:{i + 1}"
            kind = "python" if lang in PYTHON_LANGS else "shell"
            code = "\n".join(lines[i + 1 : end])
            blocks.append(
                Block(
                    label, kind, console_commands(code) if lang == "console" else code, marker_before(lines, i, label)
                )
            )
        i = end + 1
    return blocks


def console_commands(code: str) -> str:
    """A console block's commands: its ``$ `` lines and their backslash continuations, prompts removed."""
    commands: list[str] = []
    continued = False
    for line in code.split("\n"):
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.rstrip().endswith("\\")
    return "\n".join(commands)


def block_env(root: Path, workdir: Path) -> dict[str, str]:
    """The environment blocks run in: this interpreter as ``python`` first on PATH, the checkout importable."""
    bin_dir = workdir / ".docs-test-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").unlink(missing_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    env["MPLBACKEND"] = "Agg"
    return env


def run_page(blocks: list[Block], root: Path, workdir: Path) -> list[str]:
    """Run a page's unskipped blocks in ``workdir`` (a copy of run.py put there); the failures, described."""
    shutil.copy(root / "run.py", workdir / "run.py")
    env = block_env(root, workdir)
    failures = [run_shell(block, workdir, env) for block in blocks if block.kind == "shell" and not block.skip]
    python = [(b.label, b.code) for b in blocks if b.kind == "python" and not b.skip]
    if python:
        failures.append(run_python(python, workdir, env))
    return [failure for failure in failures if failure]


def run_shell(block: Block, workdir: Path, env: dict[str, str]) -> str:
    """Run one shell block; its output if it failed, else ''."""
    code, out, err = run_group(["bash", "-e", "-o", "pipefail", "-c", block.code], workdir, env, BLOCK_TIMEOUT_S)
    if code == 0:
        return ""
    return f"{block.label} exited {code}:\n{out[-2000:]}\n{err[-3000:]}"


def run_python(blocks: list[tuple[str, str]], workdir: Path, env: dict[str, str]) -> str:
    """Run a page's Python blocks in one interpreter; its output if one raised, else ''."""
    (workdir / ".docs-test-blocks.json").write_text(json.dumps(blocks))
    (workdir / ".docs-test-driver.py").write_text(PY_DRIVER)
    argv = [sys.executable, ".docs-test-driver.py", ".docs-test-blocks.json"]
    code, out, err = run_group(argv, workdir, env, BLOCK_TIMEOUT_S * len(blocks))
    if code == 0:
        return ""
    return f"python blocks {[label for label, _ in blocks]}:\n{out[-2000:]}\n{err[-3000:]}"


def run_group(argv: list[str], workdir: Path, env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``argv`` in its own process group, its output to files (a process it leaves running keeps no pipe
    open); whatever is left of the group afterwards (a server started with ``&``, a block past its time) is
    killed. Exit status (-9 on timeout), stdout, stderr."""
    out_path, err_path = workdir / ".docs-test-stdout", workdir / ".docs-test-stderr"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = -9
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    timed_out = f"\ndocs-test: killed after {timeout_s} s" if code == -9 else ""
    return code, out_path.read_text(errors="replace"), err_path.read_text(errors="replace") + timed_out
