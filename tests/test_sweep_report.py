"""Gathering a sweep and writing its report; the Hydra multirun path end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from forge.config import compose_config
from forge.main import run_offline
from forge.results.stats import MeanCI, mean_ci95
from forge.results.sweep import KV_SHARES, gather, sweep_axes, write_sweep_report
from forge.results.sweep_context import sweep_title
from forge.results.sweep_plots import kv_figure, metric_figure
from forge.results.sweep_stats import aggregate, coinciding

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


def make_seeded_runs(root: Path) -> pd.DataFrame:
    """Three seeds of fcfs and of sjf (which coincide at one priority class and no preemption) at two
    rates: the per-run metrics."""
    import yaml

    runs = []
    points = [(p, r, s) for p in ("fcfs", "sjf") for r in (4, 64) for s in (1, 2, 3)]
    for i, (pol, rate, seed) in enumerate(points):
        overrides = [f"scheduler={pol}", f"workload.arrivals.rate={rate}", f"seed={seed}"]
        run_dir = root / str(i)
        run_dir.mkdir(parents=True)
        (run_dir / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        cfg = compose_config([*cfg_overrides(), *overrides])
        summary = run_offline(cfg, run_dir)
        runs.append({"scheduler": pol, "rate": rate, "seed": seed, **summary})
    return pd.DataFrame(runs)


def cfg_overrides() -> list[str]:
    return ["model=synthetic", "clock=simulated", "workload.num_requests=8", "progress=false", "report=false"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame, str]:
    root = tmp_path_factory.mktemp("seeds")
    runs = make_seeded_runs(root)
    return root, runs, write_sweep_report(root).read_text()


def test_a_seeds_sweep_is_aggregated_as_mean_and_95_ci(seeded: tuple[Path, pd.DataFrame, str]) -> None:
    _, runs, report = seeded
    assert "mean ± 95% CI over 3 seeds" in report
    lines = report.splitlines()
    table = [line for line in lines if line.startswith("| fcfs | 64 | 3 |") and " ± " in line]
    assert len(table) == 1  # one row per configuration, with its 3 runs
    cells = table[0].strip("| ").split(" | ")
    header = next(line for line in lines if line.startswith("| scheduler | workload.arrivals.rate | runs |"))
    col = header.strip("| ").split(" | ").index("mean_tpot_ms")
    values = runs[(runs["scheduler"] == "fcfs") & (runs["rate"] == 64)]["mean_tpot_ms"]
    expected = mean_ci95(values.tolist())
    assert expected.half_width > 0 and cells[col] == str(expected)


def test_the_plots_show_each_configurations_ci_as_error_bars(seeded: tuple[Path, pd.DataFrame, str]) -> None:
    root, runs, _ = seeded
    df = gather(root)
    agg = aggregate(df, sweep_axes(df), ["mean_tpot_ms"])
    fig = metric_figure(agg, "workload.arrivals.rate", ["scheduler"], [("mean_tpot_ms", "TPOT mean (ms)")], "t")
    assert fig is not None
    bars = [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one curve per scheduler
    fcfs = runs[runs["scheduler"] == "fcfs"]
    want = sorted(2 * mean_ci95(fcfs[fcfs["rate"] == r]["mean_tpot_ms"].tolist()).half_width for r in (4, 64))
    spans = sorted(float(seg[1][1] - seg[0][1]) for seg in bars[0].lines[2][0].get_segments())
    assert spans == pytest.approx(want)


def test_coinciding_configurations_are_marked_not_hidden(seeded: tuple[Path, pd.DataFrame, str]) -> None:
    root, _, report = seeded
    # one priority class, nothing preempted: sjf orders requests as fcfs does, run for run
    assert "- TPOT mean (ms): coincide (identical or CIs overlap everywhere): scheduler=fcfs = scheduler=sjf" in report
    df = gather(root)
    agg = aggregate(df, sweep_axes(df), ["mean_tpot_ms"])
    fig = metric_figure(agg, "workload.arrivals.rate", ["scheduler"], [("mean_tpot_ms", "TPOT mean (ms)")], "t")
    assert fig is not None
    legend_box = fig.axes[0].get_legend()
    assert legend_box is not None
    legend = [t.get_text() for t in legend_box.get_texts()]
    assert legend == ["scheduler=fcfs (= scheduler=sjf)", "scheduler=sjf (= scheduler=fcfs)"]
    assert any("coincide" in t.get_text() for t in fig.axes[0].texts)
    xs = [tuple(np.asarray(line.get_xdata())) for line in fig.axes[0].get_lines()]
    xs = [x for x in xs if len(x) == 2]
    assert len(set(xs)) == 2  # drawn side by side, not one exactly on top of the other


def test_coinciding_means_identical_or_overlapping_cis_at_every_point() -> None:
    a = {4: MeanCI(1.0, 0.1, 3), 64: MeanCI(2.0, 0.1, 3)}
    b = {4: MeanCI(1.15, 0.1, 3), 64: MeanCI(2.0, 0.0, 3)}  # CIs overlap at both rates
    c = {4: MeanCI(1.0, 0.1, 3), 64: MeanCI(2.5, 0.1, 3)}  # apart at 64
    d = {4: MeanCI(1.0, math.nan, 1), 64: MeanCI(2.5, math.nan, 1)}  # single runs: identical to c's means
    assert coinciding({"a": a, "b": b, "c": c}) == [["a", "b"]]
    assert coinciding({"c": c, "d": d}) == [["c", "d"]]
    assert coinciding({"a": a, "d": d}) == []


def test_sweep_plot_titles_name_model_clock_and_workload_and_the_kv_axis_fits(
    seeded: tuple[Path, pd.DataFrame, str],
) -> None:
    root, _, _ = seeded
    df = gather(root)
    title = sweep_title(root, df)
    assert title.startswith("model=synthetic · clock=simulated (h100) · workload=poisson (8 requests")
    agg = aggregate(df, sweep_axes(df), [c for c, _ in KV_SHARES])
    fig = kv_figure(agg, ["scheduler", "workload.arrivals.rate"], KV_SHARES, title)
    assert fig is not None and "clock=simulated (h100)" in fig.get_suptitle()
    stacks = 100 * agg[[c for c, _ in KV_SHARES if c in agg]].sum(axis=1)
    top = fig.axes[0].get_ylim()[1]
    assert float(stacks.max()) < top <= 2.5 * float(stacks.max()) and top < 100


def test_every_runs_warnings_reach_the_sweep_report(tmp_path: Path) -> None:
    make_runs(tmp_path)
    path = tmp_path / "2" / "summary.json"
    warning = "the machine was oversubscribed at the start (load average 9.0 on 2 cores): ..."
    path.write_text(json.dumps({**json.loads(path.read_text()), "warnings": [warning]}))
    report = write_sweep_report(tmp_path).read_text()
    assert f"> **warning (run `2`, scheduler=priority workload.arrivals.rate=4):** {warning}" in report
    assert "## Warnings (1)" in report
    assert "How the jobs ran was not recorded (no `launch.json`" in report  # made without a launcher
