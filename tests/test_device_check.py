"""The GPU device check (issue 39) cannot rot between device loans: its dry run passes every step.

``benchmarks/gpu/device_check.sh --dry-run`` runs the device check's eight steps (install, machine,
the kernel tests, the throughput benchmark, the three compute-sanitizer steps' test commands, the
full shape matrix's)
on the CPU execution layer with a toy model. These tests run it as a user would and read its
summary and output files; they also check that the check fails, rather than passes, where there
is no GPU, and that its time budget stops steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "device_check.sh"
STEPS = ["install", "machine", "pytest-gpu", "throughput", "memcheck", "racecheck", "synccheck", "pytest-full"]
DRY_SECTIONS = [
    "batch-forge-cuda",
    "batch-forge-torch",
    "batch-hf",
    "bandwidth",
    "forge-cuda",
    "forge-torch",
    "hf-generate",
]
STEP_LINE = re.compile(r"^STEP (\S+) +(\S+) +(\d+)s", re.MULTILINE)


def run_check(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PYTHON": sys.executable, "DEVICE_CHECK_OUT": str(out), **env}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=900
    )


def steps(text: str) -> dict[str, str]:
    return {name: status for name, status, _ in STEP_LINE.findall(text)}


@pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU execution layer needs g++")
def test_dry_run_passes_every_step(tmp_path: Path) -> None:
    proc = run_check(tmp_path, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert steps(proc.stdout) == dict.fromkeys(STEPS, "pass")
    summary = (tmp_path / "summary.txt").read_text()
    assert steps(summary) == dict.fromkeys(STEPS, "pass")
    assert "device_check (dry-run): 8 of 8 steps passed" in summary
    # The kernel tests ran (on the CPU layer) and none was skipped.
    assert re.search(r"^4 passed", (tmp_path / "pytest_gpu.log").read_text(), re.MULTILINE)
    assert (tmp_path / "sanitizer.log").read_text().count("1 passed") == 3
    assert re.search(r"^1 passed", (tmp_path / "pytest_gpu_full.log").read_text(), re.MULTILINE)
    assert f"torch: {torch.__version__}" in (tmp_path / "machine.txt").read_text()
    results = json.loads((tmp_path / "throughput.json").read_text())
    for section in DRY_SECTIONS:
        assert "error" not in results[section], results[section]
    for engine in ("batch-forge-cuda", "batch-forge-torch", "batch-hf"):
        rows = results[engine]
        assert sorted(rows) == ["1", "2"] and all(row["output_tokens_each"] == 3 for row in rows.values())
    assert results["forge-cuda"]["output_tokens"] > 0
    assert "backend.runtime=cpu" in results["forge-cuda"]["overrides"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_the_device_check_fails_instead_of_skipping(tmp_path: Path) -> None:
    proc = run_check(tmp_path)
    assert proc.returncode != 0
    status = steps(proc.stdout)
    assert list(status) == STEPS
    # GPU tests that skip are a failure, not a pass; so are the benchmark and the sanitizers. (install
    # depends on this machine: no wheel folder in CI, cp312 wheels on another Python.)
    assert all(status[name] != "pass" for name in STEPS[1:]), status
    assert "tests skipped or none ran" in (tmp_path / "pytest_gpu.log").read_text()
    passed = sum(s == "pass" for s in status.values())
    assert f"device_check (device): {passed} of 8 steps passed" in (tmp_path / "summary.txt").read_text()


def test_spent_budget_leaves_steps_not_run_and_fails(tmp_path: Path) -> None:
    proc = run_check(tmp_path, "--dry-run", DEVICE_CHECK_BUDGET_S="3")
    assert proc.returncode != 0
    assert steps(proc.stdout) == dict.fromkeys(STEPS, "not-run")
    assert "0 of 8 steps passed" in proc.stdout


def python312() -> str | None:
    """A working Python 3.12: $PYTHON312, or python3.12 on the PATH (a pyenv shim may not run)."""
    exe = os.environ.get("PYTHON312") or shutil.which("python3.12")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"], capture_output=True)
    return exe if probe.stdout.strip() == b"True" else None


@pytest.mark.slow
def test_wheel_set_installs_offline_on_python_312(tmp_path: Path) -> None:
    """Needs PyPI: fetches the wheel set, installs it with --no-index into a 3.12 venv."""
    exe = python312()
    if exe is None:
        pytest.skip("needs a Python 3.12 (set PYTHON312)")
    wheels = tmp_path / "wheels"
    fetch = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu/fetch_wheels.sh"), str(wheels)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
    )
    assert fetch.returncode == 0, fetch.stderr[-2000:]
    check = ROOT / "benchmarks/gpu/check_wheels_py312.sh"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHON312": exe}
    proc = subprocess.run(["bash", str(check), str(wheels)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "python 3.12" in proc.stdout and "composed forge.models.synthetic.SyntheticModel" in proc.stdout
