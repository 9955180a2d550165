"""Hydra launchers: a sweep run by Ray (forge's launcher, on a two-node cluster started with ``ray start``)
or by submitit's local executor gathers the same ``sweep.parquet`` as forge's local launcher
(``python -m experiments.run launchers`` is the report of the same comparison)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from itertools import pairwise
from pathlib import Path

import pytest

from experiments.launchers import LAUNCHERS, POINTS, SWEEP, differing_columns, multirun, ray_cluster

TINY_SWEEP = [*SWEEP, *POINTS["tiny"]]


@pytest.mark.slow  # ~25 s: each job is its own process
@pytest.mark.skipif(
    importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
    reason="hydra-submitit-launcher is not installed (the sweep extra)",
)
def test_submitit_local_sweep_equals_the_local_launchers(tmp_path: Path) -> None:
    local, _, _ = multirun(tmp_path / "local", [*LAUNCHERS["local"], *TINY_SWEEP])
    got, _, _ = multirun(tmp_path / "submitit", [*LAUNCHERS["submitit_local"], *TINY_SWEEP])
    assert len(local) == 2
    assert differing_columns(got, local) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ray") is None, reason="ray is not installed (the sweep extra)")
def test_ray_sweep_on_two_nodes_equals_the_local_launchers(tmp_path: Path) -> None:
    local, _, _ = multirun(tmp_path / "local", [*LAUNCHERS["local"], *TINY_SWEEP])
    with ray_cluster(nodes=2) as address:
        ray = [*LAUNCHERS["ray"], f"hydra.launcher.address={address}"]
        got, log, _ = multirun(tmp_path / "ray", [*ray, *TINY_SWEEP])
    assert len(local) == 2
    assert differing_columns(got, local) == []
    assert log.count("ran on Ray node") == 2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ray") is None, reason="ray is not installed (the sweep extra)")
def test_ray_runs_wall_clock_jobs_one_at_a_time(tmp_path: Path) -> None:
    wall = ["model=synthetic", "clock=wall", "workload.num_requests=4", "workload.arrivals.rate=4", "report=false"]
    with ray_cluster(nodes=2) as address:
        ray = [*LAUNCHERS["ray"], f"hydra.launcher.address={address}"]
        df, _, _ = multirun(tmp_path, [*ray, *wall, "scheduler=fcfs,priority,sjf"])
    assert len(df) == 3
    spans = sorted(
        (t["started_at"], t["ended_at"])
        for t in (json.loads((tmp_path / run / "timing.json").read_text()) for run in df["run"])
    )
    assert all(end <= next_start for (_, end), (next_start, _) in pairwise(spans))
    report = (tmp_path / "sweep_report.md").read_text()
    assert "- 3 wall-clock jobs ran one Ray task at a time, after the parallel jobs" in report
    assert "no wall-clock run overlapped another run" in report
