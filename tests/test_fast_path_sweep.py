"""``python -m benchmarks.fast_path_sweep``: its configs compose, its comparison names the first
difference, and a run of it reports each config and exits 1 on a finding (0 when all agree)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd

from benchmarks.fast_path_draw import draw
from benchmarks.fast_path_sweep import compare_runs
from forge.config import compose_config

ROOT = Path(__file__).resolve().parent.parent


def test_the_drawn_configs_compose() -> None:
    """Every key a draw sets is a setting (a typo would make every config a refusal)."""
    for seed in range(20):
        d = draw(random.Random(seed))
        compose_config(["model=synthetic", "clock=simulated", *d.overrides])


def test_the_same_seed_draws_the_same_configs() -> None:
    assert draw(random.Random(3)).overrides == draw(random.Random(3)).overrides


def write_run(path: Path, ttft: list[float], summary: dict[str, object]) -> Path:
    path.mkdir()
    pd.DataFrame({"request_id": ["a", "b"], "ttft": ttft}).to_parquet(path / "requests.parquet")
    pd.DataFrame({"step": [0, 1], "num_tokens": [5, 2]}).to_parquet(path / "steps.parquet")
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_compare_runs_names_the_first_difference_and_ignores_the_commit(tmp_path: Path) -> None:
    nan = float("nan")  # (a summary's p99 TPOT when no request has two tokens: equal to itself here)
    a = write_run(tmp_path / "a", [0.5, 0.25], {"commit": "abc", "machine": "m1", "mean_ttft_ms": 1.0, "p": nan})
    same = write_run(tmp_path / "same", [0.5, 0.25], {"commit": "def", "machine": "m2", "mean_ttft_ms": 1.0, "p": nan})
    other = write_run(tmp_path / "other", [0.5, 0.2500001], {"commit": "abc", "mean_ttft_ms": 1.1, "p": nan})
    assert compare_runs(a, same) == []
    assert compare_runs(a, other) == [
        "requests.parquet: column ttft row 1: 0.25 vs 0.2500001",
        "summary.json mean_ttft_ms: 1.0 vs 1.1",
    ]


def sweep(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "benchmarks.fast_path_sweep", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_a_sweep_reports_each_config_and_its_counts(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    proc = sweep("--configs", "2", "--seed", "1", "--set", "workload.num_requests=20", "--log", str(log))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["i"] for r in lines] == [0, 1] and all(r["status"] in ("ok", "refused") for r in lines)
    assert "workload.num_requests=20" in lines[0]["overrides"]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(counts.values()) == 2 and counts.get("ok", 0) >= 1
