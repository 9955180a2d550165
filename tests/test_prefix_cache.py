"""Prefix caching in the paged KV manager, through its public API."""

from __future__ import annotations

from forge.core.request import Request
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.kvcache.pages import chain_hash
from tests.sched_helpers import request


def admit(kv: PagedKVCache, r: Request, n: int | None = None) -> int:
    """What the scheduler does on admission: match, then allocate the rest and compute it."""
    hit = kv.match_prefix(r)
    r.num_computed_tokens = hit
    end = r.num_tokens if n is None else n
    assert kv.allocate_slots(r, end, min(end, r.num_tokens))
    r.num_computed_tokens = end
    return hit


def ref_counts_match_holders(kv: PagedKVCache) -> None:
    holders: dict[int, int] = {}
    for table in kv.holders().values():
        for b in table:
            holders[b] = holders.get(b, 0) + 1
    free = {b.block_id for b in kv.pool.free_queue}
    for block in kv.pool.blocks:
        assert block.ref_cnt == holders.get(block.block_id, 0), block.block_id
        assert (block.block_id in free) == (block.ref_cnt == 0), block.block_id
    assert len(free) == kv.num_free_blocks()


def test_shared_prefix_hits_whole_blocks_and_counts() -> None:
    kv = PagedKVCache(KVCacheContext(32, 4), enable_prefix_caching=True)
    a = request("a", list(range(1, 15)))  # 14 tokens: 3 full blocks + 2
    assert admit(kv, a) == 0
    b = request("b", [*range(1, 11), 99, 98, 97])  # shares 10 tokens: 2 full blocks
    assert admit(kv, b) == 8
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    assert kv.block_table("b")[2] != kv.block_table("a")[2]
    assert kv.stats()["prefix_cache_hits"] == 8
    assert kv.stats()["prefix_cache_queries"] == 14 + 13
    ref_counts_match_holders(kv)
    assert kv.pool.blocks[kv.block_table("a")[0]].ref_cnt == 2


def test_full_match_leaves_one_token_to_compute() -> None:
    kv = PagedKVCache(KVCacheContext(32, 4), enable_prefix_caching=True)
    admit(kv, request("a", list(range(1, 9))))
    assert kv.match_prefix(request("b", list(range(1, 9)))) == 4  # not 8: the last token needs logits


def test_cached_block_reused_after_owner_finished() -> None:
    kv = PagedKVCache(KVCacheContext(8, 4), enable_prefix_caching=True)
    a = request("a", list(range(1, 10)))
    admit(kv, a)
    first = kv.block_table("a")[:2]
    kv.free(a)
    assert kv.num_free_blocks() == 8 and kv.num_held() == 0
    b = request("b", list(range(1, 10)))
    assert kv.cached_prefix_len(b) == 8  # a pure query...
    assert kv.num_free_blocks() == 8  # ...that takes nothing
    assert admit(kv, b) == 8
    assert kv.block_table("b")[:2] == first
    ref_counts_match_holders(kv)


def test_eviction_is_lru_and_tail_blocks_go_first() -> None:
    kv = PagedKVCache(KVCacheContext(6, 2), enable_prefix_caching=True)
    a, b = request("a", [1, 2, 3, 4, 5]), request("b", [11, 12, 13, 14, 15])
    admit(kv, a)  # 3 blocks: [1,2] [3,4] [5]
    admit(kv, b)
    ta, tb = kv.block_table("a"), kv.block_table("b")
    kv.free(a)  # freed first: evicted first
    kv.free(b)
    assert [blk.block_id for blk in kv.pool.free_queue] == [*ta[::-1], *tb[::-1]]
    # Two new blocks evict a's tail ([5], then [3,4]); a's first block and all of b stay cached.
    admit(kv, request("c", [21, 22, 23]))
    assert kv.block_table("c") == ta[::-1][:2]
    assert kv.cached_prefix_len(request("a2", [1, 2, 3, 4, 5])) == 2
    assert kv.cached_prefix_len(request("b2", [11, 12, 13, 14, 15])) == 4
    # b3 hits b's two full blocks and evicts the LRU block (a's first) for its last token;
    # freed again, b's hit blocks move behind b's never-reused tail block (recency refreshed).
    b3 = request("b3", [11, 12, 13, 14, 15])
    admit(kv, b3)
    assert kv.block_table("b3") == [tb[0], tb[1], ta[0]]
    kv.free(b3)
    assert [blk.block_id for blk in kv.pool.free_queue] == [tb[2], ta[0], tb[1], tb[0]]
    ref_counts_match_holders(kv)


def test_hash_is_chained_and_seeded() -> None:
    assert chain_hash(0, (1, 2)) == chain_hash(0, (1, 2))
    assert chain_hash(0, (1, 2)) != chain_hash(1, (1, 2))
    k0, k1 = (
        PagedKVCache(KVCacheContext(8, 2), True, hash_seed=0),
        PagedKVCache(KVCacheContext(8, 2), True, hash_seed=1),
    )
    for kv in (k0, k1):
        admit(kv, request("a", [1, 2, 3, 4, 5]))
    assert set(k0.pool.cached) != set(k1.pool.cached)
    # Same block tokens under a different parent do not hit.
    kv = PagedKVCache(KVCacheContext(16, 2), True)
    admit(kv, request("a", [1, 2, 3, 4, 5]))
    assert kv.cached_prefix_len(request("b", [9, 9, 3, 4, 5])) == 0


def test_no_caching_means_no_hits_and_no_hashes() -> None:
    kv = PagedKVCache(KVCacheContext(16, 2), enable_prefix_caching=False)
    admit(kv, request("a", [1, 2, 3, 4, 5]))
    assert kv.match_prefix(request("b", [1, 2, 3, 4, 5])) == 0
    assert kv.pool.cached == {}


def test_fork_shares_blocks_and_copies_on_first_write() -> None:
    kv = PagedKVCache(KVCacheContext(16, 4), enable_prefix_caching=True)
    parent = request("p", list(range(1, 11)))  # 10 tokens: blocks [0..3] [4..7] [8, 9]
    admit(kv, parent)
    child = request("c", list(range(1, 11)))
    assert kv.fork(parent, child, 9)  # shares all 3 blocks (9 tokens)
    child.num_computed_tokens = 9
    assert kv.block_table("c") == kv.block_table("p")
    ref_counts_match_holders(kv)
    used = 16 - kv.num_free_blocks()
    assert used == 3
    # The child writes position 9, inside the shared third block: copy-on-write.
    assert kv.allocate_slots(child, 10, 10)
    ops = kv.take_block_ops()
    src, dst = ops.copy_blocks[0]
    assert src == kv.block_table("p")[2] and dst == kv.block_table("c")[2] and src != dst
    assert kv.block_table("c")[:2] == kv.block_table("p")[:2]
    assert kv.take_block_ops().copy_blocks == []
    ref_counts_match_holders(kv)
    # The parent now holds its third block alone: its next write is in place.
    parent.output_token_ids.append(7)
    assert kv.allocate_slots(parent, 11, 11)
    assert kv.take_block_ops().copy_blocks == []
    kv.free(parent)
    kv.free(child)
    assert kv.num_free_blocks() == 16 and kv.num_held() == 0


def test_cow_fails_cleanly_when_pool_is_full() -> None:
    kv = PagedKVCache(KVCacheContext(3, 4), enable_prefix_caching=False)
    parent = request("p", list(range(1, 11)))
    admit(kv, parent)
    child = request("c", list(range(1, 11)))
    assert kv.fork(parent, child, 9)
    child.num_computed_tokens = 9
    before = kv.block_table("c")
    assert not kv.allocate_slots(child, 10, 10)  # needs a copy, no block free
    assert kv.block_table("c") == before and kv.take_block_ops().copy_blocks == []
    ref_counts_match_holders(kv)


def test_swap_out_and_in_round_trip() -> None:
    kv = PagedKVCache(KVCacheContext(8, 4), enable_prefix_caching=True, num_cpu_blocks=4)
    r = request("r", list(range(1, 11)))
    admit(kv, r)
    gpu = kv.block_table("r")
    assert kv.swap_out(r)
    assert kv.num_free_blocks() == 8 and kv.num_held() == 1
    ops = kv.take_block_ops()
    assert [g for g, _ in ops.swap_out] == gpu
    cpu = [c for _, c in ops.swap_out]
    assert kv.swapped_holders() == {"r": cpu}
    assert kv.num_free_cpu_blocks() == 1
    assert kv.swap_in(r, 11)
    ops = kv.take_block_ops()
    assert [c for c, _ in ops.swap_in] == cpu and [g for _, g in ops.swap_in] == kv.block_table("r")[:3]
    assert len(kv.block_table("r")) == 3 and kv.num_free_cpu_blocks() == 4
    kv.free(r)
    assert kv.num_free_blocks() == 8 and kv.num_held() == 0


def test_swap_out_refused_when_cpu_pool_is_small() -> None:
    kv = PagedKVCache(KVCacheContext(8, 4), num_cpu_blocks=2)
    r = request("r", list(range(1, 11)))
    admit(kv, r)
    assert not kv.swap_out(r)
    assert len(kv.block_table("r")) == 3


def test_cpu_blocks_freed_by_swap_in_not_reused_in_the_same_step() -> None:
    kv = PagedKVCache(KVCacheContext(8, 4), num_cpu_blocks=3)
    a, b = request("a", list(range(1, 11))), request("b", list(range(21, 31)))
    admit(kv, a)
    assert kv.swap_out(a)
    kv.take_block_ops()
    admit(kv, b)
    assert kv.swap_in(a, 10)
    assert not kv.swap_out(b)  # a's CPU blocks are still being read this step
    kv.take_block_ops()
    assert kv.swap_out(b)
