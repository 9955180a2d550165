"""The synthetic model's timing-only mode (``model.timing_only=true``, docs/cluster.md's Scale): the same
requests, steps and summary as the id-materialising path wherever both apply, prompts held as one
shared list per length (a fraction of the memory), and a one-line config error where an id could
change a length or a time."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from forge.cluster.run import build_cluster
from forge.config import ConfigError, compose_config
from forge.engine.build import workload_requests
from forge.main import run_offline

BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]


def run_dir_of(tmp_path: Path, name: str, overrides: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """``run_offline`` of ``overrides``: its requests and steps frames and its summary (less the commit,
    which names the tree)."""
    cfg = compose_config([*BASE, *overrides])
    out = tmp_path / name
    run_offline(cfg, out)
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("commit")
    return pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "steps.parquet"), summary


@pytest.mark.parametrize(
    "case",
    [
        ["cluster.replicas=4", "router=least_outstanding", "workload.num_requests=2000", "workload.arrivals.rate=400"],
        [
            "cluster=disaggregated",
            "cluster.prefill_replicas=2",
            "cluster.decode_replicas=2",
            "workload.num_requests=300",
        ],
        ["workload=sharegpt", "workload.num_requests=300", "kvcache.num_blocks=300", "engine.preemption_mode=swap"],
    ],
    ids=["4-replicas", "disaggregated", "preempting-one-engine"],
)
def test_timing_only_gives_the_same_run_as_token_ids(tmp_path: Path, case: list[str]) -> None:
    ids = run_dir_of(tmp_path, "ids", [*case, "model.timing_only=false"])
    lengths = run_dir_of(tmp_path, "lengths", [*case, "model.timing_only=true"])
    pd.testing.assert_frame_equal(ids[0], lengths[0])
    pd.testing.assert_frame_equal(ids[1], lengths[1])
    assert ids[2] == lengths[2]


def prompt_memory(timing_only: bool) -> int:
    """Bytes that building 20,000 requests of the default workload leaves allocated."""
    cfg = compose_config([*BASE, "workload.num_requests=20000", f"model.timing_only={str(timing_only).lower()}"])
    cluster = build_cluster(cfg)
    tracemalloc.start()
    try:
        requests = workload_requests(cfg, cluster.first)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(requests) == 20000
    return held


def test_timing_only_holds_prompts_as_lengths() -> None:
    ids, lengths = prompt_memory(False), prompt_memory(True)
    assert ids > 20000 * 1000  # ~136 token ids a prompt
    assert lengths < ids / 3  # what is left: the Request objects (~440 B each)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("clock=wall", "needs clock=simulated"),
        ("kvcache.enable_prefix_caching=true", "kvcache.enable_prefix_caching=false"),
        ("drafter=ngram", "needs no drafter"),
        ("+sampling.stop=[x]", "sampling.stop"),
        ("+sampling.stop_token_ids=[65]", "sampling.stop"),
        ("workload.ignore_eos=false", "workload.ignore_eos=true"),
    ],
)
def test_timing_only_refuses_what_reads_token_ids(override: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        compose_config(["model=synthetic", "clock=simulated", "model.timing_only=true", override])
    message = str(err.value)
    assert message.startswith("model.timing_only=true") and says in message
    assert "\n" not in message


def test_timing_only_is_refused_in_a_replica_override() -> None:
    overrides = "cluster.overrides=[{},{kvcache:{enable_prefix_caching:true}}]"
    cfg = compose_config(
        ["model=synthetic", "clock=simulated", "model.timing_only=true", "cluster.replicas=2", overrides]
    )
    with pytest.raises(ConfigError, match=r"cluster replica 1: model.timing_only=true needs kvcache"):
        build_cluster(cfg)
