"""A wall-clock run on an oversubscribed machine says so (summary, printed table, report), the
KV-usage plot is scaled to the range the run used, and every plot has units and the run's config (issue 23)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from forge.config import compose_config
from forge.main import format_summary, oversubscription_warning, run_offline
from forge.results.report import kv_axis_top, report_figures, write_report


def test_oversubscription_is_a_load_average_above_the_cores() -> None:
    assert oversubscription_warning(2.0, 2) is None
    warning = oversubscription_warning(7.5, 2)
    assert warning is not None and "load average 7.5 on 2 cores" in warning and "backend.num_threads" in warning


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    cfg = compose_config(["model=synthetic", "clock=simulated", "workload.num_requests=8", "progress=false"])
    summary = run_offline(cfg, out)
    assert "warnings" not in summary  # simulated time does not depend on the machine's load
    return out


def test_a_warning_reaches_the_printed_summary_and_the_report(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    warning = oversubscription_warning(9.0, 2)
    assert warning is not None
    assert format_summary({**summary, "warnings": [warning]}).splitlines()[-1] == f"warning: {warning}"
    (run_dir / "summary.json").write_text(json.dumps({**summary, "warnings": [warning]}))
    report = write_report(run_dir).read_text()
    assert f"> **warning:** {warning}" in report
    assert "| warnings |" not in report


def test_the_kv_axis_is_scaled_to_the_used_range(run_dir: Path) -> None:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    used = (
        sum(steps[c] for c in ("kv_token_slots", "kv_reserved_slots", "kv_internal_frag_slots"))
        + steps["kv_external_frag_slots"]
    )
    peak = float((100 * used / steps["kv_total_slots"]).max())
    top = kv_axis_top(steps)
    assert peak < top <= 2.5 * peak + 1e-9 and top < 100


def test_the_kv_axis_tops_at_100_for_a_full_pool() -> None:
    full = pd.DataFrame(
        {
            "kv_total_slots": [100, 100],
            "kv_token_slots": [50, 95],
            "kv_reserved_slots": [0, 0],
            "kv_internal_frag_slots": [0, 0],
            "kv_external_frag_slots": [0, 0],
        }
    )
    assert kv_axis_top(full) == 100.0
    assert kv_axis_top(full.assign(kv_token_slots=[0, 0])) == 100.0  # nothing used: the whole pool
    assert kv_axis_top(full.assign(kv_token_slots=[1, 3])) == 5.0


def test_every_plot_has_units_and_the_runs_key_config_in_its_title(run_dir: Path) -> None:
    figures = report_figures(run_dir)
    assert set(figures) == {"latency_cdf.png", "batch.png", "kv_usage.png"}
    run = "model=synthetic · scheduler=fcfs · kvcache=paged (block 16) · clock=simulated (h100) · workload=poisson"
    for name, fig in figures.items():
        title = fig.get_suptitle()
        assert run in title and "8 requests, " in title and " req/s)" in title, (name, title)
        for ax in fig.axes:
            if ax.get_xlabel():  # a shared x axis is labelled once, on the lowest plot
                assert re.search(r"\((s|ms)\)$", ax.get_xlabel()), (name, ax.get_xlabel())
            assert re.search(r"\((count|0-1)\)$|^% of", ax.get_ylabel()), (name, ax.get_ylabel())
        assert any(ax.get_xlabel() for ax in fig.axes)
        plt.close(fig)
    assert f"Run: {run}" in write_report(run_dir).read_text()
