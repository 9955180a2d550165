"""The engine against an independent model of one configuration (``tests/reference_cycle.py``: FCFS, paged
KV cache, simulated clock, timing-only synthetic model, round robin): the same requests and steps frames, bit
for bit, with fast paths on and off, for one replica and several, with admissions held back by the batch
budget (prompts cut into chunks, or waiting whole) and by ``max_num_seqs``; where the engine preempts, the
model says it left its configuration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from forge.cluster.build import build_pool, build_router, cluster_spec
from forge.cluster.loop import ReplicaPool
from forge.cluster.results import merged_frames
from forge.config import compose_config
from forge.engine.build import workload_requests
from forge.sim.clock import SimulatedClock
from forge.sim.step_sums import SummedCostModel
from tests.reference_cycle import REQUEST_COLUMNS, STEP_COLUMNS, Arrival, Limits, replica_frames

BASE = ["model=synthetic", "model.timing_only=true", "clock=simulated", "progress=false", "report=false"]
CASES = {
    "one-replica": ["workload.num_requests=1500", "workload.arrivals.rate=60"],
    "four-replicas": ["cluster.replicas=4", "workload.num_requests=3000", "workload.arrivals.rate=256"],
    "max-num-seqs": ["cluster.replicas=2", "workload.num_requests=1500", "workload.arrivals.rate=200",
                     "engine.max_num_seqs=6"],
    "blocks-of-32": ["cluster.replicas=3", "workload.num_requests=2000", "workload.arrivals.rate=240",
                     "kvcache.block_size=32", "engine.max_num_batched_tokens=1024"],
    "budget-no-chunking": ["workload.num_requests=1500", "workload.arrivals.rate=120",
                           "engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=300",
                           "engine.max_model_len=300", "kvcache.block_size=8"],
}  # fmt: skip


def limits_of(pool: ReplicaPool) -> Limits:
    scheduler = pool.replicas[0].engine.scheduler
    kv, lim, policy = scheduler.kv, scheduler.limits, scheduler.policy
    return Limits(
        budget=policy.token_budget(lim.max_num_batched_tokens),
        max_num_seqs=lim.max_num_seqs,
        num_blocks=kv.num_blocks,
        block_size=kv.block_size,
        max_model_len=lim.max_model_len,
        chunked_prefill=lim.enable_chunked_prefill,
        watermark_blocks=policy.admission_watermark * kv.num_blocks,
    )


Frames = tuple[pd.DataFrame, pd.DataFrame]


def engine_and_model(overrides: list[str]) -> tuple[pd.DataFrame, pd.DataFrame, Frames | None]:
    """The engine's merged (requests, steps) frames and the model's for the same config and requests."""
    cfg = compose_config([*BASE, *overrides])
    pool = build_pool(cfg, cluster_spec(cfg).pools()[0], build_router(cfg))
    requests = workload_requests(cfg, pool.replicas[0].engine)
    arrivals = [
        Arrival(r.request_id, r.arrival_time, r.num_prompt_tokens, r.sampling_params.max_tokens, r.priority)
        for r in requests
    ]
    clock = pool.replicas[0].engine.clock
    assert isinstance(clock, SimulatedClock)
    cost = clock.cost_model
    assert isinstance(cost, SummedCostModel)
    model = replica_frames(arrivals, len(pool.replicas), limits_of(pool), cost)
    pool.run(requests, keep=False)
    req, steps = merged_frames(pool.replicas)
    return req, steps, model


def assert_same(engine: pd.DataFrame, model: pd.DataFrame, columns: tuple[str, ...]) -> None:
    assert len(engine) == len(model)
    for c in columns:
        if c == "itl":
            same = all(np.array_equal(a, b) for a, b in zip(engine[c], model[c], strict=True))
        else:
            same = np.array_equal(engine[c].to_numpy(), model[c].to_numpy(), equal_nan=engine[c].dtype.kind == "f")
        assert same, f"column {c} differs"


@pytest.mark.parametrize("fast_paths", [True, False])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_engine_runs_the_reference_model_bit_for_bit(case: str, fast_paths: bool) -> None:
    req, steps, model = engine_and_model([*CASES[case], f"engine.fast_paths={str(fast_paths).lower()}"])
    assert model is not None, "the case left the modelled configuration"
    assert_same(req, model[0], REQUEST_COLUMNS)
    assert_same(steps, model[1], STEP_COLUMNS)
    assert (req["finish_reason"] == "length").all() and not req["num_preemptions"].any()
    assert not steps[["num_draft_tokens", "num_preempted", "kv_reserved_slots", "kv_external_frag_slots"]].any().any()


def test_the_cases_hold_admissions_back() -> None:
    """Each case exercises what it is named for: waiting requests while rows decode."""
    for case in ("max-num-seqs", "budget-no-chunking"):
        _, steps, _ = engine_and_model(CASES[case])
        assert (steps["num_waiting"] > 0).sum() > 50, case
    _, steps, _ = engine_and_model(CASES["one-replica"])  # a prompt cut to the budget, finished the next step
    assert ((steps["num_tokens"] == 512) & (steps["num_prefill_tokens"] > 0)).sum() > 5


def test_the_model_gives_up_where_the_engine_preempts() -> None:
    *_, model = engine_and_model(["workload.num_requests=300", "workload.arrivals.rate=400", "kvcache.num_blocks=40"])
    assert model is None
