"""Hydra launchers: a sweep run by Ray (forge's launcher, on a two-node cluster started with ``ray start``)
or by submitit's local executor gathers the same ``sweep.parquet`` as forge's local launcher
(``python -m experiments.run launchers`` is the report of the same comparison)."""

from __future__ import annotations

import importlib.util
import shutil
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
