"""``forge capacity``: the highest rate within an SLO, found deterministically and checked by the runs
just below and above it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from forge.capacity.search import SLO, RateKnob, gpus_of, probe, search
from forge.config import ConfigError, compose_config

BASE = ["model=synthetic", "clock=simulated", "workload.num_requests=60"]
SLO_ = SLO(ttft_s=0.2, tpot_s=0.05, attainment=0.9)


def test_the_answer_is_deterministic_and_bracketed_by_a_miss_just_above() -> None:
    first, second = search(BASE, SLO_, tol=0.05), search(BASE, SLO_, tol=0.05)
    assert first.rate == second.rate > 0
    assert first.probes == second.probes
    assert first.below is not None and first.above is not None
    assert first.below.rate == first.rate and first.below.meets(SLO_)
    assert not first.above.meets(SLO_) and first.rate < first.above.rate <= first.rate * 1.05
    assert first.monotone
    knob = RateKnob(compose_config(BASE))  # checked by fresh runs just below and just above
    assert probe(BASE, knob, first.rate, SLO_).meets(SLO_)
    assert not probe(BASE, knob, first.above.rate, SLO_).meets(SLO_)


def test_a_stricter_slo_gives_a_lower_capacity() -> None:
    loose = search(BASE, SLO_, tol=0.05)
    strict = search(BASE, SLO(ttft_s=0.05, tpot_s=0.05), tol=0.05)
    assert strict.rate < loose.rate
    assert loose.gpus == 1 and loose.goodput_per_gpu == loose.rate


def test_gpus_count_tensor_parallel_ranks() -> None:
    assert gpus_of(compose_config([*BASE, "clock.hardware=a100", "clock.tensor_parallel=2"])) == 2
    assert gpus_of(compose_config(["model=tiny", "engine.tensor_parallel_size=2"])) == 2


def test_a_trace_is_scaled_by_its_time_scale() -> None:
    overrides = ["model=synthetic", "clock=simulated", "workload=azure_code", "workload.max_requests=80"]
    result = search(overrides, SLO(ttft_s=1.0, tpot_s=0.1), tol=0.1)
    knob = RateKnob(compose_config(overrides))
    assert knob.trace_rate is not None and knob.overrides(2 * knob.trace_rate) == [f"workload.time_scale={0.5!r}"]
    assert result.rate > 0 and result.above is not None and not result.above.meets(result.slo)


@pytest.mark.parametrize(
    ("slo", "message"),
    [((0.0, 0.1, 0.9), "the ttft SLO must be"), ((1.0, -1, 0.9), "the tpot SLO must be"), ((1, 1, 1.5), "attainment")],
)
def test_a_bad_slo_is_a_config_error(slo: tuple[float, float, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SLO(*slo)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forge.cli", "capacity", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ttft", "0", "--tpot", "0.1"], "config error: capacity: the ttft SLO must be"),
        (["scheduler=nope", "--ttft", "1", "--tpot", "0.1"], "config error: scheduler=nope: no such option"),
        (
            ["model=tiny", "workload=fixed", "--ttft", "1", "--tpot", "0.1"],
            "config error: capacity: the workload has no",
        ),
    ],
)
def test_bad_capacity_commands_print_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = _cli(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().startswith(message) and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_cli_writes_a_report_per_configuration(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    args = [*BASE, "--ttft", "0.2", "--tpot", "0.05", "--tol", "0.1", "--output-dir", str(out)]
    done = _cli(*args, "--config", "scheduler=fcfs", "--config", "scheduler=sjf", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out / "capacity.csv")
    assert len(table) == 2 and (table["rate"] > 0).all()
    assert set(pd.read_csv(out / "probes.csv")["config"]) == set(table["config"])
    assert (out / "attainment.png").stat().st_size > 0
    assert "best goodput per GPU" in (out / "report.md").read_text()


def test_a_cluster_configuration_searches_its_replicas() -> None:
    big = [*BASE, "workload.num_requests=240"]  # enough requests that the load, not the workload's end, decides
    one = search(big, SLO_, tol=0.1)
    two = search([*big, "cluster.replicas=2"], SLO_, tol=0.1)
    assert two.gpus == 2 and two.rate > 1.5 * one.rate  # two replicas carry about twice the load
    split = [*big, "cluster=disaggregated"]
    knob = RateKnob(compose_config(split))
    assert gpus_of(compose_config(split)) == 2
    assert probe(split, knob, two.rate, SLO_) != probe([*big, "cluster.replicas=2"], knob, two.rate, SLO_)
