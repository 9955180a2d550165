"""Property tests: random sequences of add / step / abort (with preemption forced by tiny pools,
by recompute or swap, prefix caching and forks) never break the KV invariants."""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.kvcache.block_pool import BlockPool
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.sched.scheduler import Scheduler
from tests.sched_helpers import request, scheduler, step


def check_pool(pool: BlockPool, holders: dict[int, int]) -> None:
    free_ids = [b.block_id for b in pool.free_queue]
    assert len(free_ids) == len(set(free_ids)) == pool.num_free
    free = set(free_ids)
    for b in pool.blocks:
        assert b.ref_cnt == holders.get(b.block_id, 0), f"block {b.block_id}: ref {b.ref_cnt}"
        assert (b.block_id in free) == (b.ref_cnt == 0), f"block {b.block_id} both free and used"
    for h, b in pool.cached.items():
        assert b.block_hash == h


def check_kv(kv: PagedKVCache, sched: Scheduler) -> None:
    holders: dict[int, int] = {}
    tables = kv.holders()
    for table in tables.values():
        for bid in table:
            holders[bid] = holders.get(bid, 0) + 1
    check_pool(kv.pool, holders)
    cpu = [c for blocks in kv.swapped_holders().values() for c in blocks]
    assert len(cpu) == len(set(cpu))
    assert len(cpu) + kv.num_free_cpu_blocks() == kv.num_cpu_blocks
    running = {r.request_id for r in sched.running}
    swapped = {r.request_id for r in sched.swapped}
    assert set(kv.swapped_holders()) == swapped
    assert running <= set(tables)
    for r in sched.running:
        assert len(tables[r.request_id]) * kv.block_size >= r.num_computed_tokens
    assert kv.num_held() == len(set(tables) | swapped)


AddOp = tuple[Literal["add"], list[int], int, int]  # prompt, max_tokens, n
StepOp = tuple[Literal["step"], int]  # steps
AbortOp = tuple[Literal["abort"], int]  # index into the ids added so far
op: st.SearchStrategy[AddOp | StepOp | AbortOp] = st.one_of(
    st.tuples(
        st.just("add"),
        st.lists(st.integers(1, 3), min_size=1, max_size=14),  # tiny alphabet: shared prefixes
        st.integers(1, 8),
        st.integers(1, 3),  # n
    ),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 40)),
)


def run_ops(
    ops: list[AddOp | StepOp | AbortOp], num_blocks: int, block_size: int, caching: bool, mode: str, budget: int
) -> None:
    kv = PagedKVCache(KVCacheContext(num_blocks, block_size), enable_prefix_caching=caching, num_cpu_blocks=num_blocks)
    sched = scheduler(kv=kv, preemption_mode=mode, budget=budget, max_num_seqs=6, max_model_len=64)
    ids: list[str] = []
    for o in ops:
        if o[0] == "add":
            _, prompt, out, n = o
            rid = f"r{len(ids)}"
            need = -(-(len(prompt) + out) // block_size)
            if need > num_blocks:
                continue
            children = [request(f"{rid}#{i}", prompt, max_tokens=out) for i in range(1, n)]
            sched.add_request(request(rid, prompt, max_tokens=out), forks=children)
            ids += [rid] + [c.request_id for c in children]
        elif o[0] == "step":
            for _ in range(o[1]):
                step(sched)
                check_kv(kv, sched)
        elif ids:
            sched.abort(ids[o[1] % len(ids)])
        check_kv(kv, sched)
    for _ in range(5000):  # finish everything: nothing may leak
        if not sched.num_unfinished:
            break
        step(sched)
        check_kv(kv, sched)
    assert sched.num_unfinished == 0
    kv.take_block_ops()
    assert kv.num_free_blocks() == num_blocks and kv.num_held() == 0
    assert kv.num_free_cpu_blocks() == num_blocks


CASE = dict(
    ops=st.lists(op, max_size=30),
    num_blocks=st.integers(4, 12),
    block_size=st.sampled_from([1, 2, 4]),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
    budget=st.integers(1, 32),
)
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@settings(SETTINGS, max_examples=200)
@given(**CASE)
def test_scheduler_and_cache_invariants(
    ops: list[AddOp | StepOp | AbortOp], num_blocks: int, block_size: int, caching: bool, mode: str, budget: int
) -> None:
    run_ops(ops, num_blocks, block_size, caching, mode, budget)


@pytest.mark.slow
@settings(SETTINGS, max_examples=10_000)
@given(**CASE)
def test_scheduler_and_cache_invariants_long(
    ops: list[AddOp | StepOp | AbortOp], num_blocks: int, block_size: int, caching: bool, mode: str, budget: int
) -> None:
    run_ops(ops, num_blocks, block_size, caching, mode, budget)


PoolOp = tuple[Literal["alloc", "free", "hit"], int] | tuple[Literal["cache"], int, int]
pool_op: st.SearchStrategy[PoolOp] = st.one_of(
    st.tuples(st.just("alloc"), st.integers(1, 4)),
    st.tuples(st.just("free"), st.integers(0, 50)),
    st.tuples(st.just("hit"), st.integers(0, 50)),
    st.tuples(st.just("cache"), st.integers(0, 50), st.integers(0, 5)),
)


def pool_ops(ops: list[PoolOp], num_blocks: int) -> None:
    pool = BlockPool(num_blocks, enable_caching=True)
    held: list[list[int]] = []  # each holder's blocks
    for o in ops:
        if o[0] == "alloc":
            got = pool.allocate(o[1])
            if got is None:
                assert o[1] > pool.num_free
            else:
                held.append([b.block_id for b in got])
        elif o[0] == "free" and held:
            pool.free([pool.blocks[i] for i in held.pop(o[1] % len(held))])
        elif o[0] == "hit" and pool.cached:
            hashes = sorted(pool.cached)
            block = pool.lookup(hashes[o[1] % len(hashes)])
            assert block is not None
            pool.acquire(block)
            held.append([block.block_id])
        elif o[0] == "cache" and held:
            blocks = held[o[1] % len(held)]
            pool.cache(pool.blocks[blocks[0]], o[2])
        counts: dict[int, int] = {}
        for blocks in held:
            for b in blocks:
                counts[b] = counts.get(b, 0) + 1
        check_pool(pool, counts)
    for blocks in held:
        pool.free([pool.blocks[i] for i in blocks])
    assert pool.num_free == num_blocks


@settings(SETTINGS, max_examples=200)
@given(ops=st.lists(pool_op, max_size=40), num_blocks=st.integers(1, 8))
def test_block_pool_invariants(ops: list[PoolOp], num_blocks: int) -> None:
    pool_ops(ops, num_blocks)


@pytest.mark.slow
@settings(SETTINGS, max_examples=10_000)
@given(ops=st.lists(pool_op, max_size=60), num_blocks=st.integers(1, 8))
def test_block_pool_invariants_long(ops: list[PoolOp], num_blocks: int) -> None:
    pool_ops(ops, num_blocks)
