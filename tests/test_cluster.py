"""Replicas behind a router (``forge.cluster``): one replica is the engine alone, bit for bit, with any
router and across policies and caches; several replicas give the same run with fast paths on and off
and on every rerun; the summary says how evenly the load spread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from forge.cluster.build import build_pool, build_router, cluster_spec
from forge.cluster.loop import ReplicaPool
from forge.cluster.results import load_balance, merged_frames, summed_counters
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.results.metrics import summarize

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]
SMALL = ["workload.num_requests=30", "workload.arrivals.rate=30"]
ROUTERS = ["round_robin", "random", "least_outstanding", "vidur_lor", "least_kv", "power_of_two", "prefix_aware"]
CASES = {
    "fcfs": SMALL,
    "sarathi": ["scheduler=sarathi", *SMALL],
    "vllm_v0": [
        "scheduler=vllm_v0",
        "engine.enable_chunked_prefill=false",
        "engine.max_num_batched_tokens=2048",
        *SMALL,
    ],
    "priority": ["scheduler=priority", "workload.num_priorities=3", *SMALL],
    "naive-cache": ["kvcache=naive", *SMALL],
    "preemption-swap": [*SMALL, "kvcache.num_blocks=40", "engine.preemption_mode=swap"],
    "prefix-caching": ["workload=shared_prefix", "workload.num_requests=24", "kvcache.enable_prefix_caching=true"],
    "ngram-drafter": ["drafter=ngram", *SMALL],
}


def pool_of(overrides: list[str]) -> tuple[ReplicaPool, Any]:
    cfg = compose_config([*BASE, *overrides])
    return build_pool(cfg, cluster_spec(cfg).pools()[0], build_router(cfg)), cfg


def run_pool(overrides: list[str]) -> tuple[ReplicaPool, dict[str, Any], pd.DataFrame, pd.DataFrame, dict[str, Any]]:
    """The pool after a run; its finals' tokens by id, its merged frames and summary."""
    pool, cfg = pool_of(overrides)
    finals = pool.run(workload_requests(cfg, pool.replicas[0].engine))
    req, steps = merged_frames(pool.replicas)
    summary = summarize(req, steps, summed_counters(pool.replicas))
    return pool, {rid: list(o.token_ids) for rid, o in finals.items()}, req, steps, summary


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_one_replica_is_the_engine_alone_bit_for_bit(case: str, router: str) -> None:
    overrides = [*CASES[case], f"router={router}"]
    cfg = compose_config([*BASE, *overrides])
    engine = build_engine(cfg)
    alone = engine.run(workload_requests(cfg, engine))
    alone_summary = summarize(
        engine.recorder.requests_frame(), engine.recorder.steps_frame(), engine.scheduler.kv.stats()
    )
    pool, finals, req, steps, summary = run_pool(overrides)
    assert len(finals) >= 20
    assert finals == {rid: list(o.token_ids) for rid, o in alone.items()}
    assert list(finals) == list(alone)  # in the same order
    assert (req["replica"] == 0).all() and (steps["replica"] == 0).all()
    assert req.drop(columns="replica").equals(engine.recorder.requests_frame())
    assert steps.drop(columns="replica").equals(engine.recorder.steps_frame())
    assert summary == alone_summary
    assert pool.replicas[0].engine.clock.now() == engine.clock.now()


@pytest.mark.parametrize("router", ROUTERS)
def test_several_replicas_are_the_same_with_fast_paths_off_and_on_rerun(router: str) -> None:
    overrides = ["cluster.replicas=3", f"router={router}", "workload.num_requests=60", "workload.arrivals.rate=600"]
    on = run_pool([*overrides, "engine.fast_paths=true"])
    again = run_pool([*overrides, "engine.fast_paths=true"])
    off = run_pool([*overrides, "engine.fast_paths=false"])
    assert any(r.engine.decode_runs for r in on[0].replicas) and not any(r.engine.decode_runs for r in off[0].replicas)
    for other in (again, off):
        assert other[1] == on[1]
        assert other[2].equals(on[2]) and other[3].equals(on[3])
        assert other[4] == on[4]
    assert on[2]["replica"].nunique() == 3  # every replica took requests


def test_round_robin_sends_request_i_to_replica_i_mod_n() -> None:
    _, _, req, _, _ = run_pool(["cluster.replicas=4", "router=round_robin", *SMALL])
    order = req.sort_values("arrival_time", kind="stable")
    assert order["replica"].tolist() == [i % 4 for i in range(len(order))]


def test_random_routing_follows_its_seed() -> None:
    def routes(seed: int) -> list[int]:
        req = run_pool(["cluster.replicas=4", "router=random", f"router.seed={seed}", *SMALL])[2]
        return req.set_index("request_id")["replica"].sort_index().tolist()

    assert routes(1) == routes(1)
    assert routes(1) != routes(2)


def test_load_aware_routers_spread_a_burst_evenly() -> None:
    burst = ["cluster.replicas=4", "workload.num_requests=40", "workload.arrivals.rate=100000"]
    counts = run_pool([*burst, "router=least_outstanding"])[2]["replica"].value_counts()
    assert counts.to_dict() == {0: 10, 1: 10, 2: 10, 3: 10}
    spread = {}
    for router in ("power_of_two", "random"):  # the same draws: the better of two beats one
        pool, _, req, steps, summary = run_pool([*burst, f"router={router}"])
        spread[router] = load_balance(req, steps, pool.replicas, summary["duration_s"])["replica_tokens_max_over_mean"]
    assert spread["power_of_two"] < spread["random"], spread


def test_prefix_aware_routing_keeps_a_shared_prefix_on_one_replica() -> None:
    common = [
        "cluster.replicas=4",
        "workload=shared_prefix",
        "workload.num_requests=48",
        "kvcache.enable_prefix_caching=true",
    ]
    hits = {}
    for router in ("prefix_aware", "round_robin"):
        summary = run_pool([*common, f"router={router}"])[4]
        hits[router] = summary["prefix_cache_hits"] / summary["prefix_cache_queries"]
    assert hits["prefix_aware"] > hits["round_robin"] + 0.05, hits


def test_heterogeneous_replicas_take_their_own_hardware() -> None:
    overrides = ["cluster.replicas=2", "cluster.hardware=[a100,h100]", "router=round_robin", *SMALL]
    pool, _, req, steps, summary = run_pool(overrides)
    assert [r.hardware for r in pool.replicas] == ["a100", "h100"]
    balance = load_balance(req, steps, pool.replicas, summary["duration_s"])
    busy = {row["hardware"]: row["busy_s"] for row in balance["per_replica"]}
    assert busy["a100"] > 1.2 * busy["h100"]  # the same share of requests takes the slower GPU longer
    assert balance["replicas"] == 2 and sum(row["requests"] for row in balance["per_replica"]) == 30


def test_per_replica_overrides_reach_their_replica_only() -> None:
    pool, _ = pool_of(["cluster.replicas=2", "cluster.overrides=[{engine:{max_num_seqs:3}},{}]"])
    assert [r.engine.scheduler.limits.max_num_seqs for r in pool.replicas] == [3, 64]


def test_load_balance_is_max_over_mean() -> None:
    pool, _, req, steps, summary = run_pool(["cluster.replicas=2", "router=round_robin", *SMALL])
    balance = load_balance(req, steps, pool.replicas, summary["duration_s"])
    counts = [row["requests"] for row in balance["per_replica"]]
    assert counts == [15, 15] and balance["replica_requests_max_over_mean"] == 1.0
    fractions = [row["busy_fraction"] for row in balance["per_replica"]]
    assert all(0 < f <= 1 for f in fractions)
    assert balance["replica_busy_max_over_mean"] == pytest.approx(max(fractions) / (sum(fractions) / 2))


def test_a_run_directory_records_each_replica(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            *BASE[:2],
            "progress=false",
            "report=true",
            "cluster.replicas=3",
            "router=least_outstanding",
            "workload.num_requests=24",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "replicas (LeastOutstanding)" in proc.stdout and "max/mean: requests 1.00" in proc.stdout
    req, steps = pd.read_parquet(run_dir / "requests.parquet"), pd.read_parquet(run_dir / "steps.parquet")
    assert sorted(req["replica"].unique()) == [0, 1, 2] and sorted(steps["replica"].unique()) == [0, 1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["replicas"] == 3 and summary["router"] == "LeastOutstanding"
    assert [row["requests"] for row in summary["per_replica"]] == req["replica"].value_counts().sort_index().tolist()
    assert summary["replica_requests_max_over_mean"] == 1.0  # 24 requests, 8 each
    report = (run_dir / "report.md").read_text()
    assert (run_dir / "replicas.png").exists() and "## Replicas" in report
    assert "· cluster=3 replicas (router=least_outstanding)" in report  # the run's label names its cluster


def test_wall_clock_replicas_are_real_engines_with_the_engines_tokens() -> None:
    tiny = ["model=tiny", "clock=wall", "workload.num_requests=6", "workload.output_len.high=12", "progress=false"]
    cfg = compose_config(tiny)
    engine = build_engine(cfg)
    alone = {rid: list(o.token_ids) for rid, o in engine.run(workload_requests(cfg, engine)).items()}
    pool, cfg2 = pool_of([*tiny[1:], "model=tiny", "cluster.replicas=2"])
    finals = pool.run(workload_requests(cfg2, pool.replicas[0].engine))
    assert {rid: list(o.token_ids) for rid, o in finals.items()} == alone  # greedy float64: batch-shape invariant
    assert pool.replicas[1].engine.runner.model is pool.replicas[0].engine.runner.model  # one loaded model
    req, _ = merged_frames(pool.replicas)
    assert req["replica"].tolist() == [0, 1, 0, 1, 0, 1] and req["ttft"].notna().all()
