"""``PagedKVCache``'s introspection (a mixin of ``forge.kvcache.paged.PagedKVCache``): its requests'
block tables and pages, who holds which blocks (on the GPU and swapped out), the free blocks, the
token capacity, the slot accounting (``usage``, with ``forge.kvcache.paged_usage``) and the counters."""

from __future__ import annotations

from forge.core.kv_groups import KVCacheGroups
from forge.core.request import Request
from forge.kvcache.base import KVUsage
from forge.kvcache.block_pool import BlockPool
from forge.kvcache.paged_usage import holders_usage, pages_usage
from forge.kvcache.pages import Pages
from forge.kvcache.swap_space import SwapSpace


class PagedIntrospection:
    """The read-only methods; the state is the cache's (``PagedKVCache.__init__``)."""

    num_blocks: int
    block_size: int
    groups: KVCacheGroups | None
    pool: BlockPool
    swap: SwapSpace
    prefix_queries: int
    prefix_hits: int
    num_cow_copies: int
    num_window_freed: int
    _plain: bool
    _pages: dict[str, Pages]

    def block_table(self, request_id: str) -> list[int]:
        return self._pages[request_id].tables[0]

    def group_tables(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(self._pages[request_id].tables[1:])

    def token_capacity(self, max_chunk: int) -> int:
        if self.groups is None:
            return self.num_blocks * self.block_size
        return self.groups.token_capacity(self.num_blocks, self.block_size, max_chunk)

    def group_pages(self, request_id: str) -> list[list[int | None]]:
        """Per group, the page of each of the request's blocks (None: freed outside the window)."""
        return [[None if b is None else b.block_id for b in blocks] for blocks in self._pages[request_id].blocks]

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def num_held(self) -> int:
        return len(self._pages) + self.swap.num_swapped

    def holders(self) -> dict[str, list[int]]:
        """Request id -> every block it references, all groups (outside-window entries left out; a copy)."""
        return {rid: [b.block_id for g in p.blocks for b in g if b is not None] for rid, p in self._pages.items()}

    def swapped_holders(self) -> dict[str, list[int]]:
        """Request id -> CPU block ids holding its swapped-out KV (a copy)."""
        return self.swap.holders()

    def usage(self, requests: list[Request]) -> KVUsage:
        """Token states: distinct computed positions (a block shared by k holders counts once; a position
        held by k groups fills k pages' slots); internal fragmentation: the rest of the held blocks. It
        never reserves ahead and any free block serves any request, so reserved and external are 0."""
        bs = self.block_size
        total, free = self.num_blocks * bs, self.pool.num_free * bs
        if self._plain and not self.pool.num_shared and len(requests) == len(self._pages):
            return holders_usage(requests, self.num_blocks - self.pool.num_free, bs, total, free)
        return pages_usage(self._pages, requests, bs, total, free)

    def stats(self) -> dict[str, int]:
        counters = {
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "kv_cow_copies": self.num_cow_copies,
            "kv_swapped_out_blocks": self.swap.num_swapped_out,
        }
        return counters if self._plain else {**counters, "kv_window_freed_blocks": self.num_window_freed}
