"""PagedAttention's block manager: per-request block tables over a shared pool, with prefix caching."""

from __future__ import annotations

from forge.kvcache.base import KVCacheManager, KVUsage
from forge.kvcache.block_pool import Block, BlockPool
from forge.request import Request


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent block's hash (deterministic across runs)."""
    return hash((parent, tokens))


class PagedKVCache(KVCacheManager):
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        hash_seed: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"kvcache.num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"kvcache.block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._blocks: dict[str, list[Block]] = {}
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0

    def _block_hashes(self, request: Request, num_tokens: int) -> list[int]:
        """Chained hashes of the request's full blocks within its first ``num_tokens`` tokens."""
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

    def match_prefix(self, request: Request) -> int:
        if not self.enable_prefix_caching:
            return 0
        # Leave at least one token to compute so the request gets logits to sample from.
        hashes = self._block_hashes(request, request.num_tokens - 1)
        self.prefix_queries += request.num_tokens
        hit: list[Block] = []
        for h in hashes:
            block = self.pool.lookup(h)
            if block is None:
                break
            hit.append(block)
        for block in hit:
            self.pool.acquire(block)
        self._blocks[request.request_id] = hit
        self._tables[request.request_id] = [b.block_id for b in hit]
        num_hit = len(hit) * self.block_size
        self.prefix_hits += num_hit
        return num_hit

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        rid = request.request_id
        blocks = self._blocks.get(rid)
        if blocks is None:
            blocks = self._blocks[rid] = []
            self._tables[rid] = []
        need = -(-num_tokens // self.block_size) - len(blocks)
        if need > 0:
            new = self.pool.allocate(need)
            if new is None:
                return False
            blocks.extend(new)
            self._tables[rid].extend(b.block_id for b in new)
        if self.enable_prefix_caching and num_cacheable >= self.block_size:
            hashes = self._block_hashes(request, num_cacheable)
            for block, h in zip(blocks[: len(hashes)], hashes, strict=False):
                self.pool.cache(block, h)
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        blocks = self._blocks.get(request.request_id)
        if not blocks:
            return
        keep = -(-num_tokens // self.block_size)
        if keep < len(blocks):
            self.pool.free(blocks[keep:][::-1])
            del blocks[keep:]
            del self._tables[request.request_id][keep:]

    def free(self, request: Request) -> None:
        rid = request.request_id
        blocks = self._blocks.pop(rid, None)
        self._tables.pop(rid, None)
        self._hashes.pop(rid, None)
        if blocks:
            # Tail blocks first, so they are evicted before the shared prefix blocks.
            self.pool.free(blocks[::-1])

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def num_held(self) -> int:
        return len(self._blocks)

    def usage(self, requests: list[Request]) -> KVUsage:
        total = self.num_blocks * self.block_size
        free = self.pool.num_free * self.block_size
        counted: set[int] = set()
        tokens = 0
        for r in requests:
            blocks = self._blocks.get(r.request_id, [])
            new = [b for b in blocks if b.block_id not in counted]
            counted.update(b.block_id for b in new)
            shared = (len(blocks) - len(new)) * self.block_size
            tokens += max(min(r.num_computed_tokens, len(blocks) * self.block_size) - shared, 0)
        held = len(counted) * self.block_size
        return KVUsage(
            total_slots=total,
            token_slots=tokens,
            reserved_slots=0,
            internal_frag_slots=max(held - tokens, 0),
            external_frag_slots=0,
            free_slots=free,
        )

    def stats(self) -> dict[str, int]:
        return {"prefix_cache_queries": self.prefix_queries, "prefix_cache_hits": self.prefix_hits}
