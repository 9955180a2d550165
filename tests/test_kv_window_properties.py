"""Property tests of the hybrid allocator: random add / step / abort sequences (preemption by
recompute or swap forced by tiny pools, prefix caching, forks) over models whose layers mix full
attention and sliding windows never leak a page, and every page a query can read is held."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forge.core.kv_groups import group_layers
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.sched.scheduler import Scheduler
from tests.sched_helpers import request, scheduler, step
from tests.test_properties import SETTINGS, AbortOp, AddOp, StepOp, check_pool, op

LAYOUTS = [(None, 1, 1), (2,), (None, 3, 3, 5), (4, None, 4, 4, None, 4), (None, None, 6, 6)]


def check_hybrid(kv: PagedKVCache, sched: Scheduler, budget: int) -> None:
    holders: dict[int, int] = {}
    for pages in kv.holders().values():
        for page in pages:
            holders[page] = holders.get(page, 0) + 1
    check_pool(kv.pool, holders)
    cpu = [c for pages in kv.swapped_holders().values() for c in pages]
    assert len(cpu) == len(set(cpu)) and len(cpu) + kv.num_free_cpu_blocks() == kv.num_cpu_blocks
    assert set(kv.swapped_holders()) == {r.request_id for r in sched.swapped}
    bs = kv.block_size
    for r in sched.running:
        c = r.num_computed_tokens
        for window, table in zip(kv.windows, kv.group_pages(r.request_id), strict=True):
            first = 0 if window is None else max(0, c - window + 1) // bs
            assert len(table) * bs >= c
            assert all(p is not None for p in table[first : -(-c // bs)]), "a page the next query reads was freed"
            if window is not None:
                held = sum(p is not None for p in table)
                assert held <= -(-(window - 1 + budget) // bs) + 1, "a windowed group holds pages outside its window"
    assert kv.num_held() == len(set(kv.holders()) | set(kv.swapped_holders()))


def run_ops(
    ops: list[AddOp | StepOp | AbortOp],
    layout: int,
    num_blocks: int,
    block_size: int,
    caching: bool,
    mode: str,
    budget: int,
) -> None:
    groups = group_layers(LAYOUTS[layout])
    ctx = KVCacheContext(num_blocks, block_size, groups, num_pages=num_blocks)
    kv = PagedKVCache(ctx, enable_prefix_caching=caching, num_cpu_blocks=num_blocks)
    sched = scheduler(kv=kv, preemption_mode=mode, budget=budget, max_num_seqs=6, max_model_len=64)
    ids: list[str] = []
    for o in ops:
        if o[0] == "add":
            _, prompt, out, n = o
            rid = f"r{len(ids)}"
            if groups.pages_held(len(prompt) + out, block_size, budget) > num_blocks:
                continue
            children = [request(f"{rid}#{i}", prompt, max_tokens=out) for i in range(1, n)]
            sched.add_request(request(rid, prompt, max_tokens=out), forks=children)
            ids += [rid] + [c.request_id for c in children]
        elif o[0] == "step":
            for _ in range(o[1]):
                step(sched)
                check_hybrid(kv, sched, budget)
        elif ids:
            sched.abort(ids[o[1] % len(ids)])
        check_hybrid(kv, sched, budget)
    for _ in range(5000):  # finish everything: nothing may leak
        if not sched.num_unfinished:
            break
        step(sched)
        check_hybrid(kv, sched, budget)
    assert sched.num_unfinished == 0
    kv.take_block_ops()
    assert kv.num_free_blocks() == num_blocks and kv.num_held() == 0
    assert kv.num_free_cpu_blocks() == num_blocks


CASE = dict(
    ops=st.lists(op, max_size=30),
    layout=st.integers(0, len(LAYOUTS) - 1),
    num_blocks=st.integers(8, 30),
    block_size=st.sampled_from([1, 2, 4]),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
    budget=st.integers(1, 32),
)


@settings(SETTINGS, max_examples=60)
@given(**CASE)
def test_hybrid_cache_invariants(
    ops: list[AddOp | StepOp | AbortOp],
    layout: int,
    num_blocks: int,
    block_size: int,
    caching: bool,
    mode: str,
    budget: int,
) -> None:
    run_ops(ops, layout, num_blocks, block_size, caching, mode, budget)


@pytest.mark.slow
@settings(SETTINGS, max_examples=10_000)
@given(**CASE)
def test_hybrid_cache_invariants_long(
    ops: list[AddOp | StepOp | AbortOp],
    layout: int,
    num_blocks: int,
    block_size: int,
    caching: bool,
    mode: str,
    budget: int,
) -> None:
    run_ops(ops, layout, num_blocks, block_size, caching, mode, budget)
