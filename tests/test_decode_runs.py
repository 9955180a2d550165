"""A run of plain decode steps taken at once (``DecodeRun``), and a step of the running decodes taken
column-wise with the admissions that join them (``Scheduler.schedule_joining``), give what stepping
through the plain loop gives: the same tokens, finals in the same order, the same per-request and
per-step metrics (KV usage included) and the same KV cache state, whatever ends or interrupts them
(length limits, arrivals, preemption, swaps, requests they cannot take)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from forge.config import compose_config
from forge.core.decode_run import DecodeRun
from forge.core.outputs import SchedulerOutput
from forge.core.request import Request, RequestStatus
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine, workload_requests
from forge.engine.engine import Engine
from forge.kvcache.base import DecodeRunCache, KVUsage
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.sched.running_decodes import RunningDecodes

BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]
POISSON = ["workload=poisson", "workload.num_requests=40", "workload.arrivals.rate=40", "workload.output_len.high=64"]
V0 = ["scheduler=vllm_v0", "engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=2048"]
SWAP = ["engine.preemption_mode=swap", "kvcache.num_cpu_blocks=96"]
CASES = {
    "vllm_v0-operators": [
        *POISSON,
        "scheduler=vllm_v0",
        "clock.cost=operators",
        "engine.enable_chunked_prefill=false",
        "engine.max_num_batched_tokens=2048",
    ],
    "vllm_v0-preemption": [*POISSON, *V0, "kvcache.num_blocks=48"],
    "vllm_v0-swap": [
        *POISSON,
        *V0,
        "kvcache.num_blocks=48",
        "engine.preemption_mode=swap",
        "kvcache.num_cpu_blocks=96",
    ],
    "vllm_v0-max-model-len": [*POISSON, *V0, "engine.max_model_len=160", "workload.input_len.high=120"],
    "vllm_v0-chunked": [*POISSON, "scheduler=vllm_v0", "engine.max_num_batched_tokens=64"],
    "fcfs-roofline": [*POISSON, "scheduler=fcfs"],
    "sjf": [*POISSON, "scheduler=sjf"],
    "priority": [*POISSON, "scheduler=priority", "workload.num_priorities=3"],
    "sarathi": [*POISSON, "scheduler=sarathi"],
    "decode_first": [*POISSON, "scheduler=decode_first"],
    "all-at-once": ["workload=sharegpt", "workload.num_requests=30"],
    "max-model-len": [*POISSON, "engine.max_model_len=160", "workload.input_len.high=120"],
    "preemption": [*POISSON, "kvcache.num_blocks=48", "engine.max_num_batched_tokens=256"],
    "swap": [*POISSON, "kvcache.num_blocks=48", *SWAP],
    "block-size-1": [*POISSON, "kvcache.block_size=1", "kvcache.num_blocks=4096"],
    "order5-bs4": [*POISSON, "model.order=5", "kvcache.block_size=4", "kvcache.num_blocks=2048"],
    "mixed-sampling": [*POISSON, "sampling=random"],
    "prefix-caching": ["workload=shared_prefix", "workload.num_requests=12", "kvcache.enable_prefix_caching=true"],
    "naive-cache": [*POISSON, "kvcache=naive"],
}


def run(overrides: list[str], decode_runs: bool) -> tuple[list[tuple[str, list[int]]], Engine, int, int]:
    """Finals (id, tokens) in the order ``run`` returns them, the engine, the steps taken in runs and
    the steps taken as joining steps (``Scheduler.schedule_joining``)."""
    cfg = compose_config([*BASE, *overrides, f"engine.fast_paths={str(decode_runs).lower()}"])
    engine = build_engine(cfg)
    assert engine.decode_runs is (decode_runs and "kvcache=naive" not in overrides)  # no DecodeRunCache
    start, join = engine.scheduler.start_decode_run, engine.scheduler.schedule_joining
    in_runs, joined = [], []

    def counting(run: DecodeRun) -> list[KVUsage] | None:
        usage = start(run)
        in_runs.append(run.steps if usage is not None else 0)
        return usage

    def joining() -> tuple[SchedulerOutput, DecodeRun] | None:
        step = join()
        joined.append(step is not None)
        return step

    engine.scheduler.start_decode_run = counting  # type: ignore[method-assign]
    engine.scheduler.schedule_joining = joining  # type: ignore[method-assign]
    finals = engine.run(workload_requests(cfg, engine))
    taken = sum(in_runs)
    return [(rid, list(out.token_ids)) for rid, out in finals.items()], engine, taken, sum(joined)


def same_run(a: Engine, b: Engine) -> None:
    assert a.recorder.steps_frame().equals(b.recorder.steps_frame())
    assert a.recorder.requests_frame().equals(b.recorder.requests_frame())
    assert a.scheduler.kv.stats() == b.scheduler.kv.stats()
    assert a.clock.now() == b.clock.now()


@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_runs_equal_stepping(case: str) -> None:
    fast, e1, taken, joined = run(CASES[case], decode_runs=True)
    slow, e2, none, none_joined = run(CASES[case], decode_runs=False)
    assert none == 0 and none_joined == 0 and len(fast) >= 12
    assert fast == slow
    same_run(e1, e2)
    if case in ("prefix-caching", "naive-cache", "mixed-sampling") or case.startswith("vllm_v0"):
        assert joined == 0  # no runs, or a waiting-first policy: arrivals never join the decodes column-wise
    else:
        assert joined > 20  # arrivals joined the running decodes (and preemption: decodes that all fit)
    if case in ("prefix-caching", "naive-cache", "mixed-sampling"):  # caches or requests runs do not take
        assert taken == 0
    elif case.endswith(("preemption", "swap")):  # requests wait for blocks most of the time: few runs
        assert taken > 10
    else:
        assert taken > len(e1.recorder.steps) // 3  # most decode steps went through runs


def test_a_declared_cache_with_its_own_run_reservation_is_asked_at_joining_steps_too() -> None:
    """A user's paged cache whose ``reserve_decode_run`` refuses every run: its rule holds for the one-step
    run of a joining step as for a decode run (none of either is taken), with the plain loop's answer."""
    case = [*POISSON, "kvcache._target_=tests.fast_path_components.RunRefusingPaged"]
    fast, e1, taken, joined = run(case, decode_runs=True)
    slow, e2, _, _ = run(case, decode_runs=False)
    assert fast == slow
    same_run(e1, e2)
    assert taken == 0 and joined == 0
    counts = e1.scheduler.kv.calls.counts  # type: ignore[attr-defined]
    assert counts["reserve_decode_run"] > 20


def test_runs_stop_before_an_arrival_and_at_each_length_limit() -> None:
    """Requests with different lengths and arrivals: the run ends before the step that sees the next
    arrival, and a row whose length limit comes first leaves it at that step."""
    lengths = [(5, 0.0), (40, 0.0), (3, 0.0), (12, 0.05), (7, 0.3)]
    results = []
    for decode_runs in ("true", "false"):
        engine = build_engine(compose_config([*BASE, "workload=poisson", f"engine.fast_paths={decode_runs}"]))
        requests = [
            Request(f"r{i}", [40 + i] * (20 + i), SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), at)
            for i, (n, at) in enumerate(lengths)
        ]
        finals = engine.run(requests)
        results.append(([(rid, list(o.token_ids)) for rid, o in finals.items()], engine))
    (fast, e1), (slow, e2) = results
    assert fast == slow
    assert sorted(len(t) for _, t in fast) == [3, 5, 7, 12, 40]
    same_run(e1, e2)


def decoding(kv: PagedKVCache, rid: str, computed: int, outputs: int) -> Request:
    """A request decoding after ``computed`` tokens (its prompt and all but its last output) with its blocks."""
    r = Request(rid, [1] * (computed - outputs + 1), SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    r.output_token_ids = [2] * outputs
    assert kv.allocate_slots(r, computed, computed)
    r.num_computed_tokens = computed
    return r


def test_reserved_blocks_and_usage_are_those_of_step_by_step_decode_slots() -> None:
    """``reserve_decode_run`` hands out blocks in ``decode_slot``'s order, step by step, and reports the
    usage ``usage(running)`` reads after each step (rows freed after their last)."""
    computed = [(16, 1), (31, 3), (5, 2)]  # at a block boundary, one short of it, inside a block
    num_steps, finishing = [20, 33, 2], [True, False, True]
    stepped, reserved = PagedKVCache(KVCacheContext(64, 16)), PagedKVCache(KVCacheContext(64, 16))
    rows = [decoding(stepped, f"r{i}", c, o) for i, (c, o) in enumerate(computed)]
    twins = [decoding(reserved, f"r{i}", c, o) for i, (c, o) in enumerate(computed)]
    run = DecodeRun(
        twins,
        [r.num_computed_tokens for r in twins],
        [r.output_token_ids[-1] for r in twins],
        [reserved.block_table(r.request_id) for r in twins],
        num_steps,
        finishing,
    )
    assert reserved.decode_run_fits(run)
    usages: list[Any] = []
    at_finish: dict[str, list[int]] = {}
    running = list(rows)
    for j in range(run.steps):
        for r in list(running):
            assert stepped.decode_slot(r) is not None
            r.num_computed_tokens += 1
        for i, r in enumerate(rows):
            if finishing[i] and num_steps[i] == j + 1:
                at_finish[r.request_id] = stepped.holders()[r.request_id]
                running.remove(r)
                stepped.free(r)
        usages.append(stepped.usage(running))
    assert reserved.reserve_decode_run(run) == usages
    held = reserved.holders()
    assert held == {**stepped.holders(), **at_finish}
    assert run.running_after() == [3] + [2] * 18 + [1] * 14
    assert list(run.step_shapes())[19] == (2, (16 + 20) + (31 + 20))


def test_a_run_that_does_not_fit_the_free_blocks_is_refused() -> None:
    kv = PagedKVCache(KVCacheContext(4, 4))
    r = decoding(kv, "a", 12, 1)  # 3 blocks held, one free
    run = DecodeRun([r], [12], [2], [kv.block_table("a")], [4], [True])
    assert kv.decode_run_fits(run)
    held = kv.holders()
    assert kv.reserve_decode_run(run.__class__([r], [12], [2], [kv.block_table("a")], [9], [True])) is None
    assert kv.holders() == held and kv.num_free_blocks() == 1  # refused: nothing allocated
    assert kv.reserve_decode_run(run) is not None
    assert run.truncated(2).num_steps == [2] and run.truncated(2).finishing == [False]


def test_reserving_the_slots_alone_takes_the_blocks_a_reserved_run_takes() -> None:
    """``reserve_decode_slots`` (a joining step's reservation, whose usage no one reads) allocates what
    ``reserve_decode_run`` allocates, in the same order, and refuses, nothing allocated, what it refuses."""
    caches = [PagedKVCache(KVCacheContext(12, 4)) for _ in range(2)]
    runs = []
    for kv in caches:
        rows = [decoding(kv, f"r{i}", c, 1) for i, c in enumerate((12, 7, 4))]
        tables = [kv.block_table(r.request_id) for r in rows]
        runs.append(DecodeRun(rows, [12, 7, 4], [2, 2, 2], tables, [6, 6, 3], [False, False, True]))
    assert caches[0].reserve_decode_run(runs[0]) is not None
    assert caches[1].reserve_decode_slots(runs[1]) is True
    assert caches[0].holders() == caches[1].holders() and caches[0].num_free_blocks() == caches[1].num_free_blocks()
    kv = caches[1]
    held, free = kv.holders(), kv.num_free_blocks()
    rows = runs[1].requests
    tables = [kv.block_table(r.request_id) for r in rows]
    too_long = DecodeRun(rows, [12, 7, 4], [2, 2, 2], tables, [40] * 3, [True] * 3)  # 13 blocks for r0 alone
    assert kv.reserve_decode_slots(too_long) is False
    assert kv.holders() == held and kv.num_free_blocks() == free


class PlanOnlyCache(DecodeRunCache):
    """A user's ``DecodeRunCache`` with only the abstract methods: its usage-free reservation is its run's."""

    def __init__(self, fits: bool) -> None:
        self.fits = fits
        self.reserved: list[DecodeRun] = []

    def decode_run_fits(self, run: DecodeRun) -> bool:
        return True

    def reserve_decode_run(self, run: DecodeRun) -> list[KVUsage] | None:
        self.reserved.append(run)
        return [KVUsage(16, 1, 0, 0, 0, 15)] if self.fits else None


def test_a_cache_without_its_own_slot_reservation_reserves_the_run() -> None:
    run = DecodeRun([], [], [], [], [1], [False])
    for fits in (True, False):
        cache = PlanOnlyCache(fits)
        assert cache.reserve_decode_slots(run) is fits and cache.reserved == [run]


def test_step_shapes_and_running_after_count_each_steps_rows() -> None:
    """Per step, the rows it holds and their contexts after it, and the rows running after it, against a
    count of the rows step by step (rows ending early are finishing; a row that is not runs every step)."""
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 7)
        num_steps = [rng.randint(1, 6) for _ in range(n)]
        last = max(num_steps)
        finishing = [k < last or rng.random() < 0.5 for k in num_steps]
        starts = [rng.randint(0, 90) for _ in range(n)]
        run = DecodeRun([], starts, [0] * n, [[]] * n, num_steps, finishing)
        held = [[i for i in range(n) if num_steps[i] > j] for j in range(last)]
        assert list(run.step_shapes()) == [(len(h), sum(starts[i] + j + 1 for i in h)) for j, h in enumerate(held)]
        ends = [sum(1 for i in range(n) if finishing[i] and num_steps[i] <= j + 1) for j in range(last)]
        assert run.running_after() == [n - e for e in ends] and run.steps == last


def test_truncation_keeps_the_rows_that_end_within_it() -> None:
    run = DecodeRun([], [0, 0, 0], [1, 1, 1], [[], [], []], [2, 5, 3], [True, True, False])
    assert run.truncated(5) is run
    cut = run.truncated(3)
    assert cut.num_steps == [2, 3, 3] and cut.finishing == [True, False, False]
    assert run.truncated(1).num_steps == [1, 1, 1] and run.truncated(1).finishing == [False, False, False]


def test_running_decodes_extend_advance_and_refuse() -> None:
    """``RunningDecodes``: extended by the requests after its own (else read afresh), its finishing rows
    gone after a run, and None when a request is not a plain greedy decode."""
    kv = PagedKVCache(KVCacheContext(64, 4))
    a, b, c = (decoding(kv, rid, 9 + i, 2) for i, rid in enumerate("abc"))  # 98 tokens left each
    for r in (a, b, c):
        r.status = RequestStatus.RUNNING
    rows = RunningDecodes.of([a, b], 2048, kv.block_table)
    assert rows is not None and rows.stops == [9 + 98, 10 + 98]
    grown = rows.extended([a, b, c], 2048, kv.block_table)
    assert grown == RunningDecodes.of([a, b, c], 2048, kv.block_table) and grown is not None
    assert grown.tables[0] is rows.tables[0]  # a and b's rows are not read again
    assert rows.extended([b, a], 2048, kv.block_table) == RunningDecodes.of([b, a], 2048, kv.block_table)
    assert rows.extended([a], 2048, kv.block_table) == RunningDecodes.of([a], 2048, kv.block_table)
    run = grown.run(3)
    assert run.starts == [9, 10, 11] and run.token_ids == [2, 2, 2]
    assert run.num_steps == [3, 3, 3] and run.finishing == [False] * 3
    assert grown.after(run) is grown
    short = RunningDecodes.of([a, b], 10 + 2, kv.block_table)  # max_model_len 12: a has 12 - 8 - 2 = 2 tokens left
    assert short is not None and short.stops == [9 + 2, 10 + 1]
    run = short.run(4)
    assert run.num_steps == [2, 1] and run.finishing == [True, True]
    assert short.after(run.truncated(1)).requests == [a]  # b finished after its only step
    c.spec_token_ids = [3]  # not a plain decode any more
    assert RunningDecodes.of([a, c], 2048, kv.block_table) is None
    assert rows.extended([a, b, c], 2048, kv.block_table) is None
