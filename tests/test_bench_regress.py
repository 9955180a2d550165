"""The regression gate (``forge bench regress``, benchmarks/regress.py), driven through the command with
synthetic pytest-benchmark JSON (``--from-json``) so that no verdict depends on this machine's speed:
normalised by the calibration loop, failed on a slowdown past the threshold and, as stale, on a speed-up
past it; the baseline records the machine and commit. Its behaviour on real runs: reports/regress/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.regress import CALIBRATION, PYTEST_ARGS, ROOT, compare, normalise
from forge.cli import main as forge

TIMES = {CALIBRATION: 2e-4, "test_decode_step": 4e-4, "test_simulated_run": 0.1}


def bench_json(times: dict[str, float], timer: str = "process_time") -> dict[str, Any]:
    """What ``pytest benchmarks/suites --benchmark-json`` writes, reduced to what the gate reads."""
    return {
        "machine_info": {
            "python_version": "3.11.7",
            "machine": "x86_64",
            "cpu": {"brand_raw": "Test CPU 9000", "count": 4},
            "load_average": [0.25, 0.5, 0.75],
        },
        "commit_info": {"id": "0123456789abcdef", "dirty": False},
        "datetime": "2026-11-27T10:00:00",
        "benchmarks": [
            {"name": name, "options": {"timer": timer, "disable_gc": True}, "stats": {"min": t}}
            for name, t in times.items()
        ],
    }


def regress(tmp_path: Path, times: dict[str, float], *args: str, timer: str = "process_time") -> int:
    """``forge bench regress --from-json`` on ``times``; the exit status (a refusal is raised)."""
    measured = tmp_path / f"measured-{len(list(tmp_path.iterdir()))}.json"
    measured.write_text(json.dumps(bench_json(times, timer)))
    try:
        forge(["bench", "regress", "--from-json", str(measured), "--baseline", str(tmp_path / "base.json"), *args])
    except SystemExit as exc:
        if not isinstance(exc.code, int):  # a refusal's message, not a verdict
            raise
        return exc.code
    return 0


def test_save_records_machine_and_commit_and_the_same_times_pass(tmp_path: Path, capsys: Any) -> None:
    assert regress(tmp_path, TIMES, "--save") == 0
    base = json.loads((tmp_path / "base.json").read_text())
    assert base["commit"] == "0123456" and base["commit_dirty"] is False
    assert base["machine"] == {
        "cpu_model": "Test CPU 9000",
        "cores": 4,
        "python": "3.11.7",
        "load_average_1m_5m_15m": [0.25, 0.5, 0.75],
    }
    assert base["benchmarks"] == pytest.approx({"test_decode_step": 2.0, "test_simulated_run": 500.0})
    capsys.readouterr()
    assert regress(tmp_path, TIMES) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "commit 0123456 on Test CPU 9000, 4 cores, Python 3.11.7, load average 0.25" in out


def test_a_planted_20_percent_slowdown_fails(tmp_path: Path, capsys: Any) -> None:
    regress(tmp_path, TIMES, "--save")
    slower = {**TIMES, "test_simulated_run": TIMES["test_simulated_run"] * 1.2}
    capsys.readouterr()
    assert regress(tmp_path, slower) == 1
    out = capsys.readouterr().out
    assert "FAIL: 1 benchmark(s) slower by more than 10%: test_simulated_run" in out
    assert "stale" not in out


def test_a_baseline_twice_as_slow_as_measured_fails_as_stale(tmp_path: Path, capsys: Any) -> None:
    regress(tmp_path, {**TIMES, "test_decode_step": TIMES["test_decode_step"] * 2}, "--save")
    capsys.readouterr()
    assert regress(tmp_path, TIMES) == 1
    out = capsys.readouterr().out
    assert "baseline stale: re-save" in out and "forge bench regress --save" in out
    assert "test_decode_step" in out.split("baseline stale")[1] and "slower by more" not in out


def test_a_benchmark_the_baseline_lacks_leaves_it_stale(tmp_path: Path, capsys: Any) -> None:
    regress(tmp_path, TIMES, "--save")
    capsys.readouterr()
    assert regress(tmp_path, {**TIMES, "test_new": 1e-3}) == 1
    assert "baseline stale: re-save" in capsys.readouterr().out


def test_a_json_timed_otherwise_is_refused(tmp_path: Path) -> None:
    regress(tmp_path, TIMES, "--save")
    with pytest.raises(SystemExit, match="not timed as the gate times"):
        regress(tmp_path, TIMES, timer="perf_counter")


def test_normalise_divides_by_the_calibration_loop_and_drops_it() -> None:
    assert normalise({CALIBRATION: 2e-4, "a": 5e-4, "b": 1e-4}) == pytest.approx({"a": 2.5, "b": 0.5})
    with pytest.raises(SystemExit, match=CALIBRATION):
        normalise({"a": 1.0})


def test_a_machine_twice_as_slow_overall_is_no_regression() -> None:
    fast = normalise({CALIBRATION: 1e-4, "step": 3e-4})
    slow = normalise({CALIBRATION: 2e-4, "step": 6e-4})
    verdict = compare(slow, fast, 0.1)
    assert verdict.slower == [] and verdict.stale == []


def test_the_suites_json_carries_the_load_average_and_commit(tmp_path: Path) -> None:
    """The real pipeline's provenance (the calibration suite alone, a few seconds): the conftest adds
    the load average, pytest-benchmark the commit, and --save writes both into the baseline."""
    measured = tmp_path / "bench.json"
    suite = ROOT / "benchmarks" / "suites" / "test_bench_calibration.py"
    cmd = [sys.executable, "-m", "pytest", str(suite), *PYTEST_ARGS, f"--benchmark-json={measured}"]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    base = tmp_path / "base.json"
    forge(["bench", "regress", "--from-json", str(measured), "--baseline", str(base), "--save"])
    record = json.loads(base.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert len(record["commit"]) == 7 and head.startswith(record["commit"])
    load = record["machine"]["load_average_1m_5m_15m"]
    assert len(load) == 3 and all(x >= 0 for x in load)
    assert record["machine"]["cores"] >= 1 and record["machine"]["python"] == ".".join(map(str, sys.version_info[:3]))
