"""``PagedKVCache``'s prefix caching (a mixin of ``forge.kvcache.paged.PagedKVCache``): each request's
chained block hashes, the longest prefix every group can hit, acquiring it, and offering the full
blocks of final tokens to the cache as a request computes them."""

from __future__ import annotations

from forge.core.request import Request
from forge.kvcache.block_pool import BlockPool
from forge.kvcache.pages import Pages, extend_hashes
from forge.kvcache.window_prefix import acquire_hit, group_key, longest_hit


class PagedPrefixCache:
    """The prefix-caching methods; the state is the cache's (``PagedKVCache.__init__``)."""

    block_size: int
    hash_seed: int
    enable_prefix_caching: bool
    windows: tuple[int | None, ...]
    pool: BlockPool
    prefix_queries: int
    prefix_hits: int
    _pages: dict[str, Pages]
    _hashes: dict[str, list[int]]

    def _block_hashes(self, request: Request, num_tokens: int) -> list[int]:
        hashes = self._hashes.setdefault(request.request_id, [])
        return extend_hashes(hashes, request, num_tokens, self.block_size, self.hash_seed)

    def _prefix_hit(self, request: Request) -> tuple[list[int], int]:
        """The request's block hashes and how many of them every group can hit (leaving at least one
        token to compute, so the request gets logits to sample from)."""
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
        pages = self._pages[request.request_id] = Pages(len(self.windows))
        for g, window in enumerate(self.windows):
            pages.set_group(g, acquire_hit(self.pool, g, window, self.block_size, hashes[:n]), offered=n)
        self.prefix_hits += n * self.block_size
        return n * self.block_size

    def _offer(self, request: Request, pages: Pages, num_cacheable: int) -> None:
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
