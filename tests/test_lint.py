"""ruff and mypy are part of the test command, so CI and a local `pytest` agree. Both run as modules of
the interpreter running the tests (never whatever is first on PATH), and a missing one fails the test
with the install hint instead of skipping it silently."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_module(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed for {sys.executable}: pip install -e .[dev]")
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_clean() -> None:
    proc = run_module("ruff", "check", "forge", "run.py", "tests", "experiments", "benchmarks")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_ruff_format_clean() -> None:
    proc = run_module(
        "ruff", "format", "--check", "forge", "run.py", "tests", "experiments", "benchmarks", "hydra_plugins"
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_clean() -> None:
    """pyproject's [tool.mypy] names what is checked: forge, tests and benchmarks."""
    proc = run_module("mypy")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
