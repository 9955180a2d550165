"""``python run.py`` end to end: the run directory has everything the README promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_run_py_writes_a_complete_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "scheduler=priority",
            "kvcache=naive",
            "model=synthetic",
            "clock=simulated",
            "workload=poisson",
            "workload.num_requests=16",
            f"hydra.run.dir={out}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in (
        "requests.parquet",
        "steps.parquet",
        "summary.json",
        "config.yaml",
        "report.md",
        "latency_cdf.png",
        "batch.png",
        "kv_usage.png",
    ):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 16
    for key in ("p50_ttft_ms", "p99_tpot_ms", "p90_itl_ms", "p99_e2e_ms", "peak_kv_usage", "num_preemptions"):
        assert key in summary
    assert "TTFT" in proc.stdout and "preemptions" in proc.stdout


def test_report_regenerates_from_files_alone(tmp_path: Path) -> None:
    from forge.config import compose_config
    from forge.main import run_offline
    from forge.results.report import write_report

    run_offline(
        compose_config(["model=synthetic", "workload.num_requests=6", "report=false", "progress=false"]), tmp_path
    )
    report = write_report(tmp_path).read_text()
    assert "![latency CDFs](latency_cdf.png)" in report
    assert (tmp_path / "kv_usage.png").stat().st_size > 1000
