"""``kvcache=paged``: PagedAttention's block manager as vLLM V1's KV cache coordinator. Per KV cache
group (``forge.core.kv_groups``) a block table per request over one shared ``BlockPool``, with prefix
caching, fork with copy-on-write and swapping to a CPU pool; the classic layout is its one-group case.
Allocation, fork, free, swapping and decode runs are here; prefix caching is ``paged_prefix.py``,
introspection (tables, holders, usage, counters) ``paged_introspection.py``, both mixins of the class,
and the pure slot arithmetic ``paged_usage.py``."""

from __future__ import annotations

from forge.core.decode_run import DecodeRun
from forge.core.request import Request
from forge.kvcache.base import BlockOps, DecodeRunCache, KVCacheManager, KVUsage
from forge.kvcache.block_pool import BlockPool
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged_introspection import PagedIntrospection
from forge.kvcache.paged_prefix import PagedPrefixCache
from forge.kvcache.paged_usage import decode_run_openings, decode_run_usage
from forge.kvcache.pages import Pages
from forge.kvcache.swap_space import SwapSpace
from forge.kvcache.window_prefix import first_needed_block


class PagedKVCache(PagedPrefixCache, PagedIntrospection, KVCacheManager, DecodeRunCache):
    """Block tables over a ``BlockPool`` of ``ctx.num_blocks`` blocks (``ctx.pages()`` pages of the
    model's hybrid layout when it has windowed layers and ``free_outside_window``).

    Groups: with the hybrid layout each request has a table per group (``block_table`` group 0's,
    ``group_tables`` the others'). A group with a window ``w`` needs, for a request whose next query is
    at position ``c`` (its computed tokens), only positions ``c - w + 1`` onwards: ``allocate_slots``
    first frees the pages before that (drafts lie after ``c``, so a rollback never needs them back).
    Without windowed layers (or ``free_outside_window=false``): one group, one table, every layer.

    Prefix caching (``enable_prefix_caching``): every full block of final tokens is keyed by
    ``chain_hash`` over its parent's key and its tokens, rooted at ``hash_seed`` (per group:
    ``group_key``); a new request acquires (ref count + 1) the cached blocks of its longest cached
    prefix, the longest every group has (a windowed group needs only its window's blocks of it).
    Unreferenced cached blocks stay in the free queue and are evicted LRU.

    Fork: a child references the parent's blocks; the first write into a block with more than one
    holder allocates a fresh block and records a ``(src, dst)`` copy.

    Swap: ``num_cpu_blocks`` host blocks (None: the pool's size under ``preemption_mode=swap``, else 0);
    a swapped-out request's blocks are copied there and freed on the GPU (``SwapSpace``).
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)
    event_runs = True  # its steps are those of forge.sim.event_replica's model, where it applies

    def __init__(
        self,
        ctx: KVCacheContext,
        enable_prefix_caching: bool = False,
        hash_seed: int = 0,
        num_cpu_blocks: int | None = 0,
        free_outside_window: bool = True,
    ) -> None:
        groups = ctx.hybrid_groups if free_outside_window else None
        self.num_blocks = ctx.pages() if groups is not None else ctx.num_blocks
        self.block_size = ctx.block_size
        self.num_cpu_blocks = ctx.cpu_blocks(num_cpu_blocks, self.num_blocks)
        self.groups = self.kv_groups = groups
        self.windows: tuple[int | None, ...] = (None,) if groups is None else groups.windows
        self._plain = groups is None  # one group of full attention (no windows): the fast paths' case
        self.enable_prefix_caching = enable_prefix_caching
        self._no_caching_plain = self._plain and not enable_prefix_caching  # (on the decode hot path)
        self.hash_seed = hash_seed
        self.pool = BlockPool(self.num_blocks, enable_prefix_caching)
        self.swap = SwapSpace(self.num_cpu_blocks)
        self._pages: dict[str, Pages] = {}
        self._spare: list[Pages] = []  # freed requests' one-group records, reused (allocating them costs)
        self._hashes: dict[str, list[int]] = {}
        self.prefix_queries = self.prefix_hits = self.num_cow_copies = 0
        self.num_window_freed = 0

    # -- allocation ----------------------------------------------------------------------
    def _free_outside_window(self, pages: Pages, position: int) -> None:
        """Free each windowed group's pages that a query at ``position`` (or later) never reads."""
        for g, window in enumerate(self.windows):
            if window is not None:
                drop = pages.skip(g, first_needed_block(window, position, self.block_size))
                self.num_window_freed += len(drop)
                self.pool.free(drop)

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        pages = self._pages.get(request.request_id)
        if not self._plain:
            if pages is None:
                pages = self._pages[request.request_id] = Pages(len(self.windows))
            return self._allocate_groups(request, pages, num_tokens, num_cacheable)
        # The classic layout (one group, no window): the hot path of every step, its one table directly.
        bs, pool = self.block_size, self.pool
        if pages is None:
            pages = self._pages[request.request_id] = self._spare.pop() if self._spare else Pages.one_group()
        elif self._no_caching_plain and not pool.num_shared and num_tokens <= len(pages.tables[0]) * bs:
            return True  # no block shared, nothing to cache, the positions held: a no-op
        blocks = pages.blocks[0]
        need = -(-num_tokens // bs) - len(blocks)
        cow = False
        if pool.num_shared:
            computed = request.num_computed_tokens
            first = computed // bs
            cow = num_tokens > computed and first < len(blocks) and blocks[first].ref_cnt > 1  # type: ignore[union-attr]
        if need > 0 or cow:
            if max(need, 0) + cow > pool.free_queue.size:
                return False
            if cow:
                self._copy_on_write(pages, 0, first)
            if need > 0:
                new = pool.allocate(need)
                assert new is not None
                blocks += new
                pages.tables[0] += [b.block_id for b in new]
        if self.enable_prefix_caching and num_cacheable // bs > pages.offered[0]:
            self._offer(request, pages, num_cacheable)
        return True

    def _allocate_groups(self, request: Request, pages: Pages, num_tokens: int, num_cacheable: int) -> bool:
        """``allocate_slots`` of the hybrid layout: each windowed group's pages outside its window
        freed, then every group's table grown to ``num_tokens`` (copy-on-write first), then offered."""
        computed = request.num_computed_tokens
        self._free_outside_window(pages, computed)
        n_blocks = -(-num_tokens // self.block_size)
        need = [max(0, n_blocks - len(blocks)) for blocks in pages.blocks]
        first = computed // self.block_size
        cow = pages.shared_groups(first) if self.pool.num_shared and num_tokens > computed else []
        total = sum(need)
        if total + len(cow) > self.pool.num_free:
            return False
        for g in cow:
            self._copy_on_write(pages, g, first)
        if total:
            new = self.pool.allocate(total)
            assert new is not None
            taken = 0
            for g, n in enumerate(need):
                if n:
                    pages.append(g, new[taken : taken + n])
                    taken += n
        if self.enable_prefix_caching and num_cacheable // self.block_size > min(pages.offered):
            self._offer(request, pages, num_cacheable)  # (some group has full blocks not offered yet)
        return True

    def decode_slot(self, request: Request) -> list[int] | None:
        pages = self._pages.get(request.request_id)
        end = request.num_computed_tokens + 1
        if pages is not None and self._no_caching_plain and not self.pool.num_shared:
            table = pages.tables[0]
            if end <= len(table) * self.block_size:
                return table  # the token's slot is in a block it holds alone, nothing to cache: no allocation
        return self.block_table(request.request_id) if self.allocate_slots(request, end, end) else None

    def _copy_on_write(self, pages: Pages, group: int, index: int) -> None:
        src = pages.blocks[group][index]
        assert src is not None
        new = self.pool.allocate(1)
        assert new is not None
        self.pool.free([src])
        pages.replace(group, index, new[0])
        self.swap.copy(src, new[0])
        self.num_cow_copies += 1

    def fork(self, parent: Request, child: Request, num_tokens: int) -> bool:
        src = self._pages.get(parent.request_id)
        n = -(-num_tokens // self.block_size)
        if src is None or any(len(b) < n for b in src.blocks) or child.request_id in self._pages:
            return False
        pages = self._pages[child.request_id] = Pages(len(self.windows))
        full = num_tokens // self.block_size
        parent_hashes = self._hashes.get(parent.request_id, [])
        for g, blocks in enumerate(src.blocks):
            shared = blocks[:n]
            for block in shared:
                if block is not None:
                    self.pool.acquire(block)
            pages.set_group(g, shared, offered=min(full, len(parent_hashes)))
        self._hashes[child.request_id] = parent_hashes[:full]
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        pages = self._pages.get(request.request_id)
        if pages is not None:
            self.pool.free(pages.truncate(-(-num_tokens // self.block_size)))

    def free(self, request: Request) -> None:
        rid = request.request_id
        pages = self._pages.pop(rid, None)
        self._hashes.pop(rid, None)
        self.swap.release(rid)
        if pages is None:
            return
        if not self._plain:
            self.pool.free(pages.held())  # (each group's tail blocks first, as below)
            return
        # Tail blocks first, so they are evicted before the shared prefix blocks.
        blocks = pages.blocks[0]
        self.pool.free(blocks[::-1])  # type: ignore[arg-type]
        # The record serves the next new request (its table is a new list: callers may hold the old one).
        blocks.clear()
        pages.tables[0] = []
        pages.offered[0] = pages.skipped[0] = 0
        self._spare.append(pages)

    def discard(self, request: Request) -> None:
        pages = self._pages.get(request.request_id)
        if pages is not None:
            for blocks in pages.blocks:
                for block in blocks[request.num_computed_tokens // self.block_size :]:
                    if block is not None:
                        self.pool.uncache(block)
        self.free(request)

    # -- swapping ------------------------------------------------------------------------
    def swap_out(self, request: Request) -> bool:
        pages = self._pages.get(request.request_id)
        if pages is None or not self.swap.swap_out(request.request_id, pages):
            return False
        del self._pages[request.request_id]
        self.pool.free(pages.held())
        return True

    def swap_in(self, request: Request, num_tokens: int) -> bool:
        rid, n = request.request_id, -(-num_tokens // self.block_size)
        need = self.swap.blocks_to_swap_in(rid, n)
        new = None if need is None else self.pool.allocate(need)
        if new is None:
            return False
        pages = self._pages[rid] = Pages(len(self.windows))
        for g, blocks in enumerate(self.swap.swap_in(rid, iter(new), n)):
            pages.set_group(g, blocks)
        return True

    def num_free_cpu_blocks(self) -> int:
        return self.swap.num_free

    def take_block_ops(self) -> BlockOps:
        return self.swap.take_ops()

    # -- decode runs (DecodeRunCache) ----------------------------------------------------
    def decode_run_fits(self, run: DecodeRun) -> bool:
        """One group, without prefix caching, shared or swapped blocks, the run's requests holding every
        block (whether the free pool holds what the run needs, ``reserve_decode_run`` tells)."""
        shared = self.enable_prefix_caching or self.pool.num_shared or self.swap.num_swapped
        return self._plain and not shared and len(self._pages) == len(run.requests)

    def reserve_decode_run(self, run: DecodeRun) -> list[KVUsage] | None:
        free_before = self.pool.num_free
        allocated = self._reserve(run)
        if allocated is None:
            return None
        return decode_run_usage(run, self.num_blocks, self.block_size, free_before, allocated)

    def reserve_decode_slots(self, run: DecodeRun) -> bool:
        if type(self).reserve_decode_run is not PagedKVCache.reserve_decode_run:  # a subclass's own rule decides
            return super().reserve_decode_slots(run)
        return self._reserve(run) is not None

    def _reserve(self, run: DecodeRun) -> list[int] | None:
        """``run``'s new blocks, in ``decode_slot``'s order: how many each step took (None, nothing taken,
        when the free blocks do not hold them)."""
        opening = decode_run_openings(run, self.block_size)
        if not opening:
            return [0] * run.steps
        if len(opening) > self.pool.num_free:
            return None  # some step would wait for a row's free: step by step
        new = self.pool.allocate(len(opening))
        assert new is not None
        allocated = [0] * run.steps
        requests, pages = run.requests, self._pages
        for (j, i), block in zip(opening, new, strict=True):
            row = pages[requests[i].request_id]
            row.blocks[0].append(block)
            row.tables[0].append(block.block_id)
            allocated[j] += 1
        return allocated
