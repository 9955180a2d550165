"""A study's provenance names the CPUs it was pinned to (``taskset``), so a wall-clock figure measured
on one reserved core of a shared machine says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MACHINE = "from experiments.common import provenance; print(provenance()['machine'])"


def machine_line(*prefix: str) -> str:
    cmd = [*prefix, sys.executable, "-c", MACHINE]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True, timeout=120).stdout.strip()


@pytest.mark.skipif(shutil.which("taskset") is None or (os.cpu_count() or 1) < 2, reason="needs taskset and 2 CPUs")
def test_a_pinned_study_says_which_cpu_it_ran_on() -> None:
    assert "pinned to CPU 0 (taskset)" in machine_line("taskset", "-c", "0")
    every = f"0-{(os.cpu_count() or 1) - 1}"
    assert "pinned" not in machine_line("taskset", "-c", every)
