"""The paged cache after a free: a request's table handed out before the free keeps its ids, and the
next request (which takes over the freed request's bookkeeping) starts from nothing."""

from __future__ import annotations

from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from tests.sched_helpers import request


def test_a_table_handed_out_keeps_its_ids_after_the_free() -> None:
    kv = PagedKVCache(KVCacheContext(16, 4))
    a = request("a", 10)
    assert kv.allocate_slots(a, 10, 10)
    table = kv.block_table("a")
    ids = list(table)
    kv.free(a)
    b = request("b", 6)
    assert kv.allocate_slots(b, 6, 6)
    assert table == ids  # (a step's rows may still hold it)
    assert len(kv.block_table("b")) == 2
    assert kv.num_free_blocks() == 14


def test_the_next_request_offers_its_own_blocks_to_the_prefix_cache() -> None:
    kv = PagedKVCache(KVCacheContext(32, 4), enable_prefix_caching=True)
    a = request("a", list(range(1, 13)))  # 3 full blocks, offered
    assert kv.allocate_slots(a, 12, 12)
    kv.free(a)
    b = request("b", list(range(50, 62)))  # 3 full blocks of other tokens
    assert kv.allocate_slots(b, 12, 12)
    c = request("c", [*range(50, 62), 7])
    assert kv.cached_prefix_len(c) == 12  # b's blocks were offered from its first one
    assert kv.block_table("b") != [] and len(kv.holders()["b"]) == 3
