"""Event runs (``forge.engine.event_runs``, ``forge.sim.event_replica``): where every component declares
them, a cluster's run computed event by event records the same requests and steps, bit for bit, as the
engine's plain loop and its decode runs (one replica and several; prompts cut to the budget; admissions
held by ``max_num_seqs`` or waiting whole; blocks of 8 and 32; the A100's measured prefill profile); where
a run leaves the model (a preemption) or a component does not declare them, nothing changes and the engine
runs it."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from forge.cluster.build import build_pool, build_router, cluster_spec
from forge.cluster.loop import ReplicaPool
from forge.cluster.results import merged_frames
from forge.config import compose_config
from forge.core.request import Request
from forge.engine.build import workload_requests
from forge.engine.event_runs import run_by_events
from forge.kvcache.paged import PagedKVCache
from forge.policies.fcfs import FCFS

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
    "a100-llama": ["cluster.replicas=2", "clock.hardware=a100", "clock.model=llama-2-7b",
                   "workload.num_requests=1500", "workload.arrivals.rate=30", "workload.input_len.high=1500"],
    "burst": ["workload=fixed", "workload.num_requests=400", "cluster.replicas=2"],
    "gamma-bursts": ["workload=gamma", "workload.num_requests=2000", "cluster.replicas=2",
                     "workload.arrivals.rate=150"],
    "azure-conv-trace": ["workload=azure_conv", "workload.max_requests=1500", "workload.time_scale=0.05",
                         "cluster.replicas=4", "engine.max_model_len=4096"],
}  # fmt: skip
PREEMPTS = ["workload.num_requests=300", "workload.arrivals.rate=400", "kvcache.num_blocks=40"]


class MyFCFS(FCFS):
    """A user's policy: FCFS's behaviour, but its class declares nothing (so the engine runs it)."""


class ShrinkingBudget(FCFS):
    """A user's policy with state: every third step's budget is smaller (it counts its calls)."""

    def __init__(self) -> None:
        self.calls = 0

    def token_budget(self, engine_budget: int) -> int:
        self.calls += 1
        return engine_budget - 384 * (self.calls % 3 == 0)


class CountingPaged(PagedKVCache):
    """A user's KV cache overriding a hook (it counts ``allocate_slots`` calls, allocating as its base)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.allocations = 0

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        self.allocations += 1
        return super().allocate_slots(request, num_tokens, num_cacheable)


def pool_and_requests(overrides: list[str]) -> tuple[ReplicaPool, list[Request]]:
    cfg = compose_config([*BASE, *overrides])
    pool = build_pool(cfg, cluster_spec(cfg).pools()[0], build_router(cfg))
    return pool, workload_requests(cfg, pool.replicas[0].engine)


def by_events(pool: ReplicaPool, requests: list[Request]) -> bool:
    """``run_by_events`` on round robin's routes (request i in arrival order on replica i mod N)."""
    n = len(pool.replicas)
    ordered = sorted(requests, key=lambda r: r.arrival_time)
    own = [ordered[i::n] for i in range(n)]
    return run_by_events([r.engine for r in pool.replicas], [r.offset for r in pool.replicas], own)


def frames(overrides: list[str], how: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The merged (requests, steps) frames of a run: ``events`` (asserted taken), ``runs`` (the engine with its
    decode runs: ``keep=True`` takes no event run) or ``plain`` (``engine.fast_paths=false``)."""
    pool, requests = pool_and_requests([*overrides, *(["engine.fast_paths=false"] if how == "plain" else [])])
    if how == "events":
        assert by_events(pool, requests)
    else:
        pool.run(requests, keep=how == "runs")
    return merged_frames(pool.replicas)


def assert_equal(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for c in a.columns:
        assert a[c].equals(b[c]) or all(map(_same_array, a[c], b[c])), f"column {c} differs"


def _same_array(x: Any, y: Any) -> bool:
    return bool((x == y).all()) if hasattr(x, "all") else bool(x == y)


@pytest.mark.parametrize("case", sorted(CASES))
def test_event_runs_record_what_the_engine_records(case: str) -> None:
    events = frames(CASES[case], "events")
    for how in ("plain", "runs"):
        engine = frames(CASES[case], how)
        assert_equal(events[0], engine[0])
        assert_equal(events[1], engine[1])


def test_a_run_keeping_no_outputs_takes_them() -> None:
    """``pool.run(keep=False)`` (what ``run.py`` calls) takes them — the engine never sees the requests, so
    they keep no output tokens — and records what the plain loop records."""
    pool, requests = pool_and_requests(CASES["four-replicas"])
    pool.run(requests, keep=False)
    assert not any(r.output_token_ids for r in requests)
    got = merged_frames(pool.replicas)
    plain = frames(CASES["four-replicas"], "plain")
    assert_equal(got[0], plain[0])
    assert_equal(got[1], plain[1])
    for r in pool.replicas:
        r.engine.check_idle()


def test_the_cases_exercise_what_they_are_named_for() -> None:
    for case in ("max-num-seqs", "budget-no-chunking"):
        _, steps = frames(CASES[case], "plain")
        assert (steps["num_waiting"] > 0).sum() > 50, case  # admissions held back while rows decode
    _, steps = frames(CASES["one-replica"], "plain")  # prompts cut to the budget, finished the next step
    assert ((steps["num_tokens"] == 512) & (steps["num_prefill_tokens"] > 0)).sum() > 5


def test_a_run_that_preempts_is_left_to_the_engine_unchanged() -> None:
    pool, requests = pool_and_requests(PREEMPTS)
    before = [(r.arrival_time, r.num_computed_tokens) for r in requests]
    assert not by_events(pool, requests)
    assert [(r.arrival_time, r.num_computed_tokens) for r in requests] == before
    assert all(not r.engine.recorder.requests and not len(r.engine.recorder.steps) for r in pool.replicas)
    pool.run(requests, keep=False)
    assert all(r.output_token_ids for r in requests)  # the engine ran them
    req, steps = merged_frames(pool.replicas)
    assert req["num_preemptions"].sum() > 0
    plain = frames(PREEMPTS, "plain")
    assert_equal(req, plain[0])
    assert_equal(steps, plain[1])


def test_a_request_the_engine_refuses_is_refused_the_same() -> None:
    """``add_request`` refuses a request whose prompt and ``max_tokens`` exceed the pool (here by one slot, which
    its last token never takes): so event runs do not take the run, which they could compute."""
    overrides = ["workload=fixed", "workload.num_requests=1", "workload.input_len.value=128"]
    pool, requests = pool_and_requests([*overrides, "workload.output_len.value=33", "kvcache.num_blocks=10"])
    assert not by_events(pool, requests)
    with pytest.raises(ValueError, match="may need"):
        pool.run(requests, keep=False)


@pytest.mark.parametrize(
    ("override", "count"),
    [(f"scheduler._target_={__name__}.ShrinkingBudget", "calls"), (f"kvcache._target_={__name__}.CountingPaged", "")],
)
def test_a_users_component_with_state_runs_as_the_plain_loop_runs_it(override: str, count: str) -> None:
    """``run.py``'s path (``keep=False``) with a stateful policy or an overridden KV hook of the user's: no
    event run; the same records as with fast paths off, and the user's hook called as often."""
    overrides = [*CASES["four-replicas"], override]
    pool, requests = pool_and_requests(overrides)
    assert not by_events(pool, requests)
    runs = []
    for flag in ("true", "false"):
        pool, requests = pool_and_requests([*overrides, f"engine.fast_paths={flag}"])
        pool.run(requests, keep=False)
        assert all(r.output_token_ids for r in requests)  # the engine ran them
        scheduler = pool.replicas[0].engine.scheduler
        calls = scheduler.policy.calls if count else scheduler.kv.allocations  # type: ignore[attr-defined]
        runs.append((merged_frames(pool.replicas), calls))
    (fast, fast_calls), (plain, plain_calls) = runs
    assert_equal(fast[0], plain[0])
    assert_equal(fast[1], plain[1])
    if count:  # a stateful budget is read at every step, fast paths or not
        assert fast_calls == plain_calls == len(plain[1][plain[1]["replica"] == 0])
    assert fast_calls > 0


@pytest.mark.parametrize(
    "overrides",
    [
        ["scheduler=sjf"],
        ["kvcache=naive"],
        ["model.timing_only=false"],
        ["clock.cost=roofline"],
        [f"scheduler._target_={__name__}.MyFCFS"],
        ["engine.fast_paths=false"],
    ],
)
def test_components_that_do_not_declare_event_runs_get_the_engine(overrides: list[str]) -> None:
    pool, requests = pool_and_requests(["workload.num_requests=50", *overrides])
    assert not by_events(pool, requests)
