"""Determinism, scheduling invariance of greedy outputs, and no leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from forge import SamplingParams
from forge.config import compose_config
from forge.core.request import Request
from forge.engine.build import build_engine, workload_requests
from forge.engine.engine import LeakError
from forge.main import run_offline

SMALL = ["workload=poisson", "workload.num_requests=12", "workload.input_len.high=96", "workload.output_len.high=24"]


def run_tokens(*overrides: str) -> dict[str, list[int]]:
    cfg = compose_config([*SMALL, *overrides])
    engine = build_engine(cfg)
    finals = engine.run(workload_requests(cfg, engine))
    return {rid: list(out.token_ids) for rid, out in finals.items()}


@pytest.mark.parametrize("model", ["tiny", "synthetic"])
def test_same_config_same_tokens(model: str) -> None:
    assert run_tokens(f"model={model}") == run_tokens(f"model={model}")


def test_simulated_runs_are_bit_identical(tmp_path: Path) -> None:
    overrides = [*SMALL, "model=synthetic", "clock=simulated", "report=false", "progress=false"]
    a, b = tmp_path / "a", tmp_path / "b"
    sa = run_offline(compose_config(overrides), a)
    sb = run_offline(compose_config(overrides), b)
    assert sa == sb
    assert (a / "summary.json").read_bytes() == (b / "summary.json").read_bytes()
    pd.testing.assert_frame_equal(pd.read_parquet(a / "requests.parquet"), pd.read_parquet(b / "requests.parquet"))
    assert json.loads((a / "summary.json").read_text())["clock"] == "simulated"


SCHEDULES = [
    ["scheduler=fcfs", "kvcache=paged", "engine.max_num_batched_tokens=512"],
    ["scheduler=priority", "kvcache=paged", "engine.max_num_batched_tokens=16", "workload.num_priorities=3"],
    ["scheduler=fcfs", "kvcache=naive", "engine.max_num_batched_tokens=64"],
    ["scheduler=priority", "kvcache=naive", "engine.max_num_batched_tokens=512", "workload.num_priorities=3"],
    # pools small enough to force preemption
    [
        "scheduler=fcfs",
        "kvcache=paged",
        "kvcache.num_blocks=12",
        "kvcache.block_size=16",
        "engine.max_num_batched_tokens=48",
    ],
    [
        "scheduler=priority",
        "kvcache=paged",
        "kvcache.num_blocks=40",
        "kvcache.block_size=4",
        "workload.num_priorities=3",
    ],
    [
        "scheduler=fcfs",
        "kvcache=naive",
        "kvcache.num_blocks=16",
        "kvcache.reservation=oracle",
        "kvcache.block_size=8",
        "engine.max_model_len=128",
    ],
]


@pytest.mark.parametrize("model", ["tiny", "synthetic"])
def test_greedy_outputs_do_not_depend_on_scheduling(model: str) -> None:
    reference = run_tokens(f"model={model}", "engine.max_num_seqs=1", "engine.max_num_batched_tokens=2048")
    for schedule in SCHEDULES:
        assert run_tokens(f"model={model}", *schedule) == reference, schedule


def test_small_pool_actually_preempts(tmp_path: Path) -> None:
    overrides = [*SMALL, *SCHEDULES[4], "model=synthetic", "clock=simulated", "report=false", "progress=false"]
    summary = run_offline(compose_config(overrides), tmp_path)
    assert summary["num_preemptions"] > 0


def test_engine_detects_leaks() -> None:
    engine = build_engine(compose_config(["model=synthetic"]))
    engine.add_request(Request("r", [65] * 40, SamplingParams(max_tokens=8, temperature=0)))
    engine.step()
    with pytest.raises(LeakError, match="KV blocks"):
        engine.check_idle()
    while engine.has_unfinished():
        engine.step()
    engine.check_idle()


def test_abort_frees_blocks() -> None:
    engine = build_engine(compose_config(["model=synthetic"]))
    for i in range(4):
        engine.add_request(Request(f"r{i}", [65] * 40, SamplingParams(max_tokens=50, temperature=0)))
    engine.step()
    engine.step()
    for i in range(4):
        assert engine.abort(f"r{i}")
    assert not engine.has_unfinished()
    engine.check_idle()
