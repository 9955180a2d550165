"""Gathering a sweep and writing its report; the Hydra multirun path end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from forge.config import compose_config
from forge.main import run_offline
from forge.results.sweep import gather, sweep_axes, write_sweep_report

REPO = Path(__file__).resolve().parent.parent


def make_runs(root: Path) -> None:
    import yaml

    for i, (pol, rate) in enumerate([(p, r) for p in ("fcfs", "priority") for r in (4, 64)]):
        overrides = [f"scheduler={pol}", f"workload.arrivals.rate={rate}"]
        run_dir = root / str(i)
        run_dir.mkdir(parents=True)
        (run_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        cfg = compose_config(
            [
                "model=synthetic",
                "clock=simulated",
                "workload.num_requests=8",
                "workload.num_priorities=2",
                "progress=false",
                "report=false",
                *overrides,
            ]
        )
        run_offline(cfg, run_dir)


def test_gather_and_report(tmp_path) -> None:
    make_runs(tmp_path)
    df = gather(tmp_path)
    assert len(df) == 4
    assert sweep_axes(df) == ["scheduler", "workload.arrivals.rate"]
    assert set(df["workload.arrivals.rate"]) == {4, 64}
    assert ((df["goodput"] >= 0) & (df["goodput"] <= df["request_throughput"] + 1e-9)).all()
    assert df["kv_share_token"].between(0, 1).all()
    report = write_sweep_report(tmp_path)
    text = report.read_text()
    assert "| scheduler | workload.arrivals.rate |" in text
    for png in ("latency_vs_x.png", "goodput_vs_x.png", "cdfs.png", "kv_breakdown.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert len(pd.read_parquet(tmp_path / "sweep.parquet")) == 4


def test_goodput_tightens_with_the_slo(tmp_path) -> None:
    make_runs(tmp_path)
    loose = gather(tmp_path, ttft_slo=100.0, tbt_slo=100.0)
    tight = gather(tmp_path, ttft_slo=1e-9, tbt_slo=1e-9)
    assert (loose["slo_attainment"] == 1.0).all()
    assert (tight["slo_attainment"] == 0.0).all()


def test_hydra_multirun_with_local_launcher(tmp_path) -> None:
    cmd = [
        sys.executable,
        "run.py",
        "-m",
        "model=synthetic",
        "clock=simulated",
        "workload.num_requests=4",
        "scheduler=fcfs,priority",
        "report=false",
        f"hydra.sweep.dir={tmp_path}",
        "hydra.launcher.n_jobs=2",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "sweep_report.md").is_file()
    df = pd.read_parquet(tmp_path / "sweep.parquet")
    assert sorted(df["scheduler"]) == ["fcfs", "priority"]
