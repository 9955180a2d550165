"""Preemption by recompute and by swap: greedy outputs identical to an unconstrained run, even in a
preemption storm (a KV pool at ~10% of the demand)."""

from __future__ import annotations

import pytest

from forge import LLM, SamplingParams
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from tests.sched_helpers import request, scheduler, step

BLOCK = 4
SIZES = {"synthetic": (16, 24, 24), "tiny": (12, 8, 16)}  # requests, prompt, output (tiny is slow on CPU)


def run(model: str, *overrides: str) -> tuple[list[list[int]], LLM]:
    n_req, prompt, out = SIZES[model]
    prompts = [[32 + (i * 7 + j * 3) % 90 for j in range(prompt - i % 5)] for i in range(n_req)]
    params = SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True)
    llm = LLM(f"model={model}", f"kvcache.block_size={BLOCK}", "engine.max_num_batched_tokens=64", *overrides)
    return [o.token_ids for o in llm.generate(prompts, params)], llm


@pytest.mark.parametrize("model", ["tiny", "synthetic"])
def test_storm_at_ten_percent_of_demand(model: str) -> None:
    n_req, prompt, out = SIZES[model]
    demand = n_req * (prompt + out) // BLOCK  # blocks if every request ran at once
    ref, _ = run(model, f"kvcache.num_blocks={demand}")
    small = demand // 10
    assert small >= -(-(prompt + out) // BLOCK)  # one request alone still fits
    swap = ["engine.preemption_mode=swap", f"kvcache.num_cpu_blocks={demand}"]
    runs = {
        "recompute": ["engine.preemption_mode=recompute"],
        "swap": swap,
        "swap+prefix-caching": [*swap, "kvcache.enable_prefix_caching=true"],
    }
    for mode, extra in runs.items():
        outs, llm = run(model, f"kvcache.num_blocks={small}", *extra)
        assert outs == ref, mode
        steps = llm.engine.recorder.steps_frame()
        assert steps["num_preempted"].sum() >= n_req // 2, mode  # it really was a storm
        llm.engine.check_idle()
        if mode != "recompute":
            assert llm.engine.scheduler.kv.stats()["kv_swapped_out_blocks"] > 0
            assert llm.engine.scheduler.kv.num_free_cpu_blocks() == demand


def test_swap_keeps_computed_tokens_and_emits_copies() -> None:
    kv = PagedKVCache(KVCacheContext(6, 4), num_cpu_blocks=16)
    sched = scheduler(kv=kv, preemption_mode="swap", budget=64)
    a, b = request("a", list(range(1, 9)), max_tokens=8), request("b", list(range(21, 29)), max_tokens=8)
    sched.add_request(a)
    sched.add_request(b)
    swapped_out, swapped_in = [], []
    computed_at_swap: dict[str, int] = {}
    while sched.num_unfinished:
        so, _ = step(sched)
        swapped_out += so.swap_out
        swapped_in += so.swap_in
        for r in sched.swapped:
            computed_at_swap.setdefault(r.request_id, r.num_computed_tokens)
        for s in so.scheduled:
            if s.request_id in computed_at_swap and so.swap_in:
                assert s.start == computed_at_swap.pop(s.request_id)  # resumes where it stopped
        assert not (so.swap_out and so.swap_in)
    assert swapped_out and swapped_in
    assert sorted(c for _, c in swapped_out) == sorted(c for c, _ in swapped_in)
    assert a.num_preemptions + b.num_preemptions == sched.num_preemptions > 0
    assert kv.num_free_blocks() == 6 and kv.num_free_cpu_blocks() == 16 and kv.num_held() == 0


def test_swap_falls_back_to_recompute_without_cpu_space() -> None:
    kv = PagedKVCache(KVCacheContext(6, 4), num_cpu_blocks=0)
    sched = scheduler(kv=kv, preemption_mode="swap")
    for rid in "ab":
        sched.add_request(request(rid, 8, max_tokens=8))
    preempted = False
    while sched.num_unfinished:
        so, _ = step(sched)
        assert not so.swap_out and not sched.swapped
        preempted |= bool(so.preempted_ids)
    assert preempted


def test_abort_a_swapped_request_frees_its_cpu_blocks() -> None:
    kv = PagedKVCache(KVCacheContext(6, 4), num_cpu_blocks=16)
    sched = scheduler(kv=kv, preemption_mode="swap")
    for rid in "ab":
        sched.add_request(request(rid, 8, max_tokens=8))
    while not sched.swapped:
        step(sched)
    victim = sched.swapped[0].request_id
    assert sched.abort(victim) is not None
    step(sched)  # CPU blocks come back after the step's copies
    assert kv.num_free_cpu_blocks() == 16
    while sched.num_unfinished:
        step(sched)
    assert kv.num_free_blocks() == 6 and kv.num_held() == 0


@pytest.mark.parametrize("model", ["tiny", "synthetic"])
def test_parallel_sampling_forks_share_prompt_kv(model: str) -> None:
    prompts = [[32 + (i * 11 + j) % 90 for j in range(13 + i)] for i in range(3)]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    single = LLM(f"model={model}", "kvcache.block_size=4").generate(prompts, params)
    llm = LLM(f"model={model}", "kvcache.block_size=4")
    forked = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, n=3))
    assert len(forked) == 9
    for i, s in enumerate(single):
        assert [o.token_ids for o in forked[3 * i : 3 * i + 3]] == [s.token_ids] * 3
    assert llm.engine.scheduler.kv.stats()["kv_cow_copies"] > 0
    llm.engine.check_idle()
