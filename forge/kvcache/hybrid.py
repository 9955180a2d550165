"""The hybrid allocator (vLLM V1's hybrid KV cache manager): per KV cache group a block table over one
shared pool of pages; windowed groups free the pages that fall wholly before their sliding window."""

from __future__ import annotations

from collections.abc import Iterator

from forge.core.kv_groups import KVCacheGroups
from forge.core.request import Request
from forge.kvcache.base import BlockOps, KVCacheManager, KVUsage
from forge.kvcache.block_pool import Block, BlockPool
from forge.kvcache.paged import chain_hash
from forge.kvcache.window_prefix import first_needed_block, group_key, longest_hit

MAX_CAPACITY = 2**40  # token_capacity's answer when only windowed groups (whose pages are bounded) exist

NULL_BLOCK = 0
"""The table entry of a page freed outside its group's window: a valid page id that attention never
reads unmasked (every backend's windowed attention starts at, or masks everything before, the window)."""


class _Pages:
    """One request's pages: per group its blocks (None: freed outside the window, always a prefix of
    ``skipped`` entries), the table of their ids, and how many leading ones were offered to the cache."""

    __slots__ = ("blocks", "offered", "skipped", "tables")

    def __init__(self, num_groups: int) -> None:
        self.blocks: list[list[Block | None]] = [[] for _ in range(num_groups)]
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.offered = [0] * num_groups
        self.skipped = [0] * num_groups

    def held(self) -> Iterator[Block]:
        """Every page it holds, each group's last first."""
        for blocks in self.blocks:
            yield from (b for b in reversed(blocks) if b is not None)


class HybridKVCache(KVCacheManager):
    """``PagedKVCache``'s abilities (prefix caching, fork with copy-on-write, swapping) over
    ``groups.num_groups`` block tables per request sharing one pool of ``num_blocks`` pages
    (``forge.core.kv_groups``). ``block_table`` is group 0's table, ``group_tables`` the others'.

    A group with a window ``w`` needs, for a request whose next query is at position ``c`` (its
    computed tokens), only positions ``c - w + 1`` onwards: ``allocate_slots`` first frees the pages
    before that (speculative drafts lie after ``c``, so a rollback never needs them back). A
    prefix-cache hit of ``L`` tokens needs every full-attention group's pages for ``[0, L)`` and only
    the window's pages (from ``L - w + 1``) of a windowed group; the hit is the longest ``L`` all
    groups have. Pages are cached under a key per (group, chained block hash)."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(
        self,
        num_blocks: int,
        groups: KVCacheGroups,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        hash_seed: int = 0,
        num_cpu_blocks: int | None = 0,
    ) -> None:
        num_cpu_blocks = num_cpu_blocks or 0
        if num_blocks < 1 or block_size < 1 or num_cpu_blocks < 0:
            raise ValueError(
                f"kvcache.num_blocks and block_size must be >= 1 and num_cpu_blocks >= 0, got "
                f"{num_blocks}, {block_size}, {num_cpu_blocks}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.groups = self.kv_groups = groups
        self.windows = groups.windows
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self.num_cpu_blocks = num_cpu_blocks
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._pages: dict[str, _Pages] = {}
        self._hashes: dict[str, list[int]] = {}
        self._cpu_free = list(range(num_cpu_blocks - 1, -1, -1))
        self._cpu_pending: list[int] = []
        self._swapped: dict[str, list[list[int | None]]] = {}
        self._swap_out: list[tuple[int, int]] = []
        self._copies: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.num_cow_copies = 0
        self.num_swapped_out = 0
        self.num_window_freed = 0

    def _first_needed(self, group: int, position: int) -> int:
        """The first block a query at ``position`` reads in ``group`` (0 for full attention)."""
        return first_needed_block(self.windows[group], position, self.block_size)

    # -- prefix caching ------------------------------------------------------------------
    def _block_hashes(self, request: Request, num_tokens: int) -> list[int]:
        hashes = self._hashes.setdefault(request.request_id, [])
        bs = self.block_size
        n_full = num_tokens // bs
        if len(hashes) < n_full:
            tokens = request.token_ids(len(hashes) * bs, n_full * bs)
            parent = hashes[-1] if hashes else self.hash_seed
            for i in range(n_full - len(hashes)):
                parent = chain_hash(parent, tuple(tokens[i * bs : (i + 1) * bs]))
                hashes.append(parent)
        return hashes

    def _prefix_hit(self, request: Request) -> tuple[list[int], int]:
        """The request's block hashes and how many of them every group can hit (leaving at least one
        token to compute)."""
        hashes = self._block_hashes(request, request.num_tokens - 1)
        return hashes, longest_hit(self.pool, self.windows, self.block_size, hashes)

    def cached_prefix_len(self, request: Request) -> int:
        if not self.enable_prefix_caching:
            return 0
        return self._prefix_hit(request)[1] * self.block_size

    def match_prefix(self, request: Request) -> int:
        if not self.enable_prefix_caching:
            return 0
        hashes, n = self._prefix_hit(request)
        self.prefix_queries += request.num_tokens
        pages = self._pages[request.request_id] = _Pages(len(self.windows))
        for g in range(len(self.windows)):
            first = self._first_needed(g, n * self.block_size)
            blocks: list[Block | None] = [None] * first
            for i in range(first, n):
                block = self.pool.lookup(group_key(g, hashes[i]))
                assert block is not None
                self.pool.acquire(block)
                blocks.append(block)
            pages.blocks[g] = blocks
            pages.tables[g] = [NULL_BLOCK if b is None else b.block_id for b in blocks]
            pages.offered[g] = n
            pages.skipped[g] = first
        self.prefix_hits += n * self.block_size
        return n * self.block_size

    def _offer(self, request: Request, pages: _Pages, num_cacheable: int) -> None:
        """Offer the full blocks of final tokens not offered yet to the prefix cache."""
        n_full = num_cacheable // self.block_size
        hashes: list[int] | None = None
        for g, blocks in enumerate(pages.blocks):
            m = min(n_full, len(blocks))
            if m <= pages.offered[g]:
                continue
            hashes = hashes or self._block_hashes(request, num_cacheable)
            for i in range(pages.offered[g], m):
                block = blocks[i]
                if block is not None:
                    self.pool.cache(block, group_key(g, hashes[i]))
            pages.offered[g] = m

    # -- allocation ----------------------------------------------------------------------
    def _free_outside_window(self, pages: _Pages, position: int) -> None:
        """Free each windowed group's pages that a query at ``position`` (or later) never reads."""
        for g, window in enumerate(self.windows):
            if window is None:
                continue
            end = min(self._first_needed(g, position), len(pages.blocks[g]))
            start = pages.skipped[g]
            if end <= start:
                continue
            blocks, table = pages.blocks[g], pages.tables[g]
            drop = [b for b in blocks[start:end] if b is not None]
            blocks[start:end] = [None] * (end - start)
            table[start:end] = [NULL_BLOCK] * (end - start)
            pages.skipped[g] = end
            self.num_window_freed += len(drop)
            self.pool.free(drop)

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        rid = request.request_id
        pages = self._pages.get(rid)
        if pages is None:
            pages = self._pages[rid] = _Pages(len(self.windows))
        computed = request.num_computed_tokens
        self._free_outside_window(pages, computed)
        n_blocks = -(-num_tokens // self.block_size)
        need = [max(0, n_blocks - len(blocks)) for blocks in pages.blocks]
        cow: list[int] = []  # groups whose first written block others hold too (copy-on-write)
        first = computed // self.block_size
        if self.pool.num_shared and num_tokens > computed:
            for g, blocks in enumerate(pages.blocks):
                block = blocks[first] if first < len(blocks) else None
                if block is not None and block.ref_cnt > 1:
                    cow.append(g)
        if sum(need) + len(cow) > self.pool.num_free:
            return False
        for g in cow:
            self._copy_on_write(pages, g, first)
        new = self.pool.allocate(sum(need))
        assert new is not None
        taken = 0
        for g, n in enumerate(need):
            if n:
                pages.blocks[g].extend(new[taken : taken + n])
                pages.tables[g].extend(b.block_id for b in new[taken : taken + n])
                taken += n
        if self.enable_prefix_caching:
            self._offer(request, pages, num_cacheable)
        return True

    def _copy_on_write(self, pages: _Pages, group: int, index: int) -> None:
        src = pages.blocks[group][index]
        assert src is not None
        new = self.pool.allocate(1)
        assert new is not None
        dst = new[0]
        self.pool.free([src])
        pages.blocks[group][index] = dst
        pages.tables[group][index] = dst.block_id
        self._copies.append((src.block_id, dst.block_id))
        self.num_cow_copies += 1
        pages.offered[group] = min(pages.offered[group], index)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> bool:
        src = self._pages.get(parent.request_id)
        n = -(-num_tokens // self.block_size)
        if src is None or any(len(b) < n for b in src.blocks) or child.request_id in self._pages:
            return False
        pages = self._pages[child.request_id] = _Pages(len(self.windows))
        full = num_tokens // self.block_size
        parent_hashes = self._hashes.get(parent.request_id, [])
        for g in range(len(self.windows)):
            shared = src.blocks[g][:n]
            for block in shared:
                if block is not None:
                    self.pool.acquire(block)
            pages.blocks[g] = shared
            pages.tables[g] = src.tables[g][:n]
            pages.skipped[g] = min(src.skipped[g], n)
            pages.offered[g] = min(full, len(parent_hashes))
        self._hashes[child.request_id] = parent_hashes[:full]
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        pages = self._pages.get(request.request_id)
        if pages is None:
            return
        keep = -(-num_tokens // self.block_size)
        for g, blocks in enumerate(pages.blocks):
            if keep < len(blocks):
                self.pool.free([b for b in reversed(blocks[keep:]) if b is not None])
                del blocks[keep:]
                del pages.tables[g][keep:]
                pages.offered[g] = min(pages.offered[g], keep)
                pages.skipped[g] = min(pages.skipped[g], keep)

    def free(self, request: Request) -> None:
        rid = request.request_id
        pages = self._pages.pop(rid, None)
        self._hashes.pop(rid, None)
        cpu = self._swapped.pop(rid, None)
        if cpu:
            self._cpu_pending.extend(c for table in cpu for c in table if c is not None)
        if pages is not None:
            self.pool.free(list(pages.held()))

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
        rid = request.request_id
        pages = self._pages.get(rid)
        if pages is None or rid in self._swapped:
            return False
        held = [b for blocks in pages.blocks for b in blocks if b is not None]
        if len(held) > len(self._cpu_free):
            return False
        cpu: list[list[int | None]] = []
        for blocks in pages.blocks:
            table: list[int | None] = []
            for block in blocks:
                if block is None:
                    table.append(None)
                    continue
                c = self._cpu_free.pop()
                self._swap_out.append((block.block_id, c))
                table.append(c)
            cpu.append(table)
        self._swapped[rid] = cpu
        self.num_swapped_out += len(held)
        del self._pages[rid]
        self.pool.free(list(pages.held()))
        return True

    def swap_in(self, request: Request, num_tokens: int) -> bool:
        rid = request.request_id
        cpu = self._swapped.get(rid)
        if cpu is None:
            return False
        n = -(-num_tokens // self.block_size)
        need = sum(sum(c is not None for c in t) + max(0, n - len(t)) for t in cpu)
        new = self.pool.allocate(need)
        if new is None:
            return False
        del self._swapped[rid]
        fresh = iter(new)
        pages = self._pages[rid] = _Pages(len(self.windows))
        for g, table in enumerate(cpu):
            blocks: list[Block | None] = []
            for c in table:
                if c is None:
                    blocks.append(None)
                    continue
                block = next(fresh)
                self._swap_in.append((c, block.block_id))
                self._cpu_pending.append(c)
                blocks.append(block)
            blocks.extend(next(fresh) for _ in range(max(0, n - len(table))))
            pages.blocks[g] = blocks
            pages.tables[g] = [NULL_BLOCK if b is None else b.block_id for b in blocks]
            pages.skipped[g] = next((i for i, b in enumerate(blocks) if b is not None), len(blocks))
        return True

    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free) + len(self._cpu_pending)

    def take_block_ops(self) -> BlockOps:
        ops = BlockOps(self._swap_out, self._copies, self._swap_in)
        self._swap_out, self._copies, self._swap_in = [], [], []
        self._cpu_free.extend(self._cpu_pending)
        self._cpu_pending = []
        return ops

    # -- introspection -------------------------------------------------------------------
    def block_table(self, request_id: str) -> list[int]:
        return self._pages[request_id].tables[0]

    def group_tables(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(self._pages[request_id].tables[1:])

    def token_capacity(self, max_chunk: int) -> int:
        lo, hi = 0, MAX_CAPACITY  # the most tokens whose pages fit: a binary search (windows only: unbounded)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.groups.pages_held(mid, self.block_size, max_chunk) <= self.num_blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def group_pages(self, request_id: str) -> list[list[int | None]]:
        """Per group, the page of each of the request's blocks (None: freed outside the window)."""
        pages = self._pages[request_id]
        return [[None if b is None else b.block_id for b in blocks] for blocks in pages.blocks]

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def num_held(self) -> int:
        return len(self._pages) + len(self._swapped)

    def holders(self) -> dict[str, list[int]]:
        """Request id -> every page it references, all groups (outside-window entries left out)."""
        return {rid: [b.block_id for b in p.held()] for rid, p in self._pages.items()}

    def swapped_holders(self) -> dict[str, list[int]]:
        return {rid: [c for t in cpu for c in t if c is not None] for rid, cpu in self._swapped.items()}

    def usage(self, requests: list[Request]) -> KVUsage:
        """As ``PagedKVCache.usage`` in page slots: a position held by k groups fills k pages' slots."""
        bs = self.block_size
        filled: dict[int, int] = {}
        for r in requests:
            pages = self._pages.get(r.request_id)
            if pages is None:
                continue
            computed = r.num_computed_tokens
            for g, blocks in enumerate(pages.blocks):
                for i in range(pages.skipped[g], len(blocks)):
                    block = blocks[i]
                    if block is not None:
                        n = min(bs, max(0, computed - i * bs))
                        filled[block.block_id] = max(filled.get(block.block_id, 0), n)
        tokens = sum(filled.values())
        held = len(filled) * bs
        return KVUsage(self.num_blocks * bs, tokens, 0, held - tokens, 0, self.pool.num_free * bs)

    def stats(self) -> dict[str, int]:
        return {
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "kv_cow_copies": self.num_cow_copies,
            "kv_swapped_out_blocks": self.num_swapped_out,
            "kv_window_freed_blocks": self.num_window_freed,
        }
