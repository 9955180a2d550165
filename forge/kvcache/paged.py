"""PagedAttention's block manager: per-request block tables over a shared pool, with prefix caching,
fork with copy-on-write, and swapping to a CPU pool."""

from __future__ import annotations

from forge.core.decode_run import DecodeRun
from forge.core.request import Request
from forge.kvcache.base import BlockOps, DecodeRunCache, KVCacheManager, KVUsage
from forge.kvcache.block_pool import Block, BlockPool


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent block's hash (deterministic across runs: ints only)."""
    return hash((parent, tokens))


class PagedKVCache(KVCacheManager, DecodeRunCache):
    """Block tables over a ``BlockPool`` of ``num_blocks`` GPU blocks.

    Prefix caching (``enable_prefix_caching``): every full block of final tokens is keyed
    by ``chain_hash`` over its parent's key and its tokens, rooted at ``hash_seed``; a new
    request acquires (ref count + 1) the cached blocks of its longest cached prefix.
    Unreferenced cached blocks stay in the free queue and are evicted LRU.

    Fork: a child references the parent's blocks; the first write into a block with more
    than one holder allocates a fresh block and records a ``(src, dst)`` copy.

    Swap: ``num_cpu_blocks`` host blocks (None: 0); a swapped-out request's blocks are copied there
    and freed on the GPU. CPU blocks released by a swap-in become reusable only after the
    step's ``take_block_ops`` (the copies of one step run together).
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        hash_seed: int = 0,
        num_cpu_blocks: int | None = 0,
    ) -> None:
        num_cpu_blocks = num_cpu_blocks or 0
        if num_blocks < 1:
            raise ValueError(f"kvcache.num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"kvcache.block_size must be >= 1, got {block_size}")
        if num_cpu_blocks < 0:
            raise ValueError(f"kvcache.num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self.num_cpu_blocks = num_cpu_blocks
        self.pool = BlockPool(num_blocks, enable_prefix_caching)
        self._blocks: dict[str, list[Block]] = {}
        self._tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[int]] = {}
        self._num_offered: dict[str, int] = {}  # leading blocks already offered to the prefix cache
        self._cpu_free = list(range(num_cpu_blocks - 1, -1, -1))
        self._cpu_pending: list[int] = []
        self._swapped: dict[str, list[int]] = {}
        self._swap_out: list[tuple[int, int]] = []
        self._copies: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.num_cow_copies = 0
        self.num_swapped_out = 0

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

    def _cached_prefix(self, request: Request) -> list[Block]:
        # Leave at least one token to compute so the request gets logits to sample from.
        hit: list[Block] = []
        for h in self._block_hashes(request, request.num_tokens - 1):
            block = self.pool.lookup(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def cached_prefix_len(self, request: Request) -> int:
        if not self.enable_prefix_caching:
            return 0
        return len(self._cached_prefix(request)) * self.block_size

    def match_prefix(self, request: Request) -> int:
        if not self.enable_prefix_caching:
            return 0
        hit = self._cached_prefix(request)
        self.prefix_queries += request.num_tokens
        for block in hit:
            self.pool.acquire(block)
        rid = request.request_id
        self._blocks[rid] = hit
        self._tables[rid] = [b.block_id for b in hit]
        self._num_offered[rid] = len(hit)
        num_hit = len(hit) * self.block_size
        self.prefix_hits += num_hit
        return num_hit

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        rid = request.request_id
        table = self._tables.get(rid)
        if (
            table is not None
            and num_tokens <= len(table) * self.block_size
            and not self.pool.num_shared
            and not self.enable_prefix_caching
        ):
            return True  # within the blocks it holds, none shared, nothing to cache (most decodes): a no-op
        blocks = self._blocks.get(rid)
        bs = self.block_size
        if blocks is None:
            blocks = self._blocks[rid] = []
            self._tables[rid] = []
        need = (num_tokens + bs - 1) // bs - len(blocks)
        # Copy-on-write: the first position written this step lies in a block others hold too.
        cow = False
        if self.pool.num_shared:
            first = request.num_computed_tokens // bs
            cow = first < len(blocks) and blocks[first].ref_cnt > 1 and num_tokens > request.num_computed_tokens
        if need > 0 or cow:
            if max(need, 0) + cow > self.pool.free_queue.size:
                return False
            if cow:
                self._copy_on_write(rid, blocks, first)
            if need > 0:
                new = self.pool.allocate(need)
                assert new is not None
                blocks += new
                self._tables[rid] += [b.block_id for b in new]
        if self.enable_prefix_caching:
            n_full = num_cacheable // bs
            offered = self._num_offered.get(rid, 0)
            if n_full > offered:
                n_full = min(n_full, len(blocks))
                hashes = self._block_hashes(request, num_cacheable)
                for i in range(offered, n_full):
                    self.pool.cache(blocks[i], hashes[i])
                self._num_offered[rid] = max(n_full, offered)
        return True

    def decode_slot(self, request: Request) -> list[int] | None:
        table = self._tables.get(request.request_id)
        if (
            table is not None
            and request.num_computed_tokens < len(table) * self.block_size
            and not self.pool.num_shared
            and not self.enable_prefix_caching
        ):
            return table  # the token's slot is in a block it holds alone, nothing to cache: no allocation
        end = request.num_computed_tokens + 1
        return self._tables[request.request_id] if self.allocate_slots(request, end, end) else None

    def decode_run_fits(self, run: DecodeRun) -> bool:
        """Without prefix caching, shared or swapped blocks, the run's requests holding every block
        (whether the free pool holds what the run needs, ``reserve_decode_run`` tells)."""
        shared = self.enable_prefix_caching or self.pool.num_shared or self._swapped
        return not shared and len(self._blocks) == len(run.requests)

    def reserve_decode_run(self, run: DecodeRun) -> list[KVUsage] | None:
        bs = self.block_size
        opening: list[tuple[int, int]] = []  # (step, row) of each position opening a new block
        for i, (start, n, table) in enumerate(zip(run.starts, run.num_steps, run.block_tables, strict=True)):
            j = len(table) * bs - start
            while j < n:
                opening.append((j, i))
                j += bs
        free_before = self.pool.num_free
        if len(opening) > free_before:
            return None  # some step would wait for a row's free: step by step
        opening.sort()
        new = self.pool.allocate(len(opening))
        assert new is not None
        allocated = [0] * run.steps
        rids = [r.request_id for r in run.requests]
        blocks, tables = self._blocks, self._tables
        for (j, i), block in zip(opening, new, strict=True):
            blocks[rids[i]].append(block)
            tables[rids[i]].append(block.block_id)
            allocated[j] += 1
        return self._run_usage(run, free_before, allocated)

    def _run_usage(self, run: DecodeRun, free: int, allocated: list[int]) -> list[KVUsage]:
        """``usage(running)`` after each step of ``run`` (``usage``'s one-holder-per-block case): ``free``
        blocks before it, ``allocated[j]`` taken at step j, a finishing row's blocks back after its last."""
        bs, total = self.block_size, self.num_blocks * self.block_size
        ending: dict[int, list[int]] = {}
        for i in run.finish_order:
            ending.setdefault(run.num_steps[i] - 1, []).append(i)
        rows, starts = len(run.starts), sum(run.starts)
        usages = []
        for j in range(run.steps):
            free -= allocated[j]
            for i in ending.get(j, ()):
                free += len(run.block_tables[i])
                rows -= 1
                starts -= run.starts[i]
            tokens = starts + rows * (j + 1)
            usages.append(KVUsage(total, tokens, 0, (self.num_blocks - free) * bs - tokens, 0, free * bs))
        return usages

    def _copy_on_write(self, rid: str, blocks: list[Block], index: int) -> None:
        src = blocks[index]
        new = self.pool.allocate(1)
        assert new is not None
        dst = new[0]
        self.pool.free([src])
        blocks[index] = dst
        self._tables[rid][index] = dst.block_id
        self._copies.append((src.block_id, dst.block_id))
        self.num_cow_copies += 1
        self._num_offered[rid] = min(self._num_offered.get(rid, 0), index)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> bool:
        src = self._blocks.get(parent.request_id)
        n = -(-num_tokens // self.block_size)
        if src is None or len(src) < n or child.request_id in self._blocks:
            return False
        shared = src[:n]
        for block in shared:
            self.pool.acquire(block)
        cid = child.request_id
        self._blocks[cid] = list(shared)
        self._tables[cid] = [b.block_id for b in shared]
        full = num_tokens // self.block_size
        parent_hashes = self._hashes.get(parent.request_id, [])
        self._hashes[cid] = parent_hashes[:full]
        self._num_offered[cid] = min(full, len(parent_hashes))
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        rid = request.request_id
        blocks = self._blocks.get(rid)
        if not blocks:
            return
        keep = -(-num_tokens // self.block_size)
        if keep < len(blocks):
            self.pool.free(blocks[keep:][::-1])
            del blocks[keep:]
            del self._tables[rid][keep:]
            self._num_offered[rid] = min(self._num_offered.get(rid, 0), keep)

    def free(self, request: Request) -> None:
        rid = request.request_id
        blocks = self._blocks.pop(rid, None)
        self._tables.pop(rid, None)
        self._hashes.pop(rid, None)
        self._num_offered.pop(rid, None)
        cpu = self._swapped.pop(rid, None)
        if cpu:
            self._cpu_pending.extend(cpu)
        if blocks:
            # Tail blocks first, so they are evicted before the shared prefix blocks.
            self.pool.free(blocks[::-1])

    def discard(self, request: Request) -> None:
        for block in self._blocks.get(request.request_id, [])[request.num_computed_tokens // self.block_size :]:
            self.pool.uncache(block)
        self.free(request)

    # -- swapping ------------------------------------------------------------------
    def swap_out(self, request: Request) -> bool:
        rid = request.request_id
        blocks = self._blocks.get(rid)
        if blocks is None or rid in self._swapped or len(blocks) > len(self._cpu_free):
            return False
        cpu = [self._cpu_free.pop() for _ in blocks]
        self._swap_out.extend((b.block_id, c) for b, c in zip(blocks, cpu, strict=True))
        self._swapped[rid] = cpu
        self.num_swapped_out += len(cpu)
        del self._blocks[rid], self._tables[rid]
        self._num_offered.pop(rid, None)
        self.pool.free(blocks[::-1])
        return True

    def swap_in(self, request: Request, num_tokens: int) -> bool:
        rid = request.request_id
        cpu = self._swapped.get(rid)
        if cpu is None:
            return False
        n = max(-(-num_tokens // self.block_size), len(cpu))
        new = self.pool.allocate(n)
        if new is None:
            return False
        del self._swapped[rid]
        self._swap_in.extend((c, b.block_id) for c, b in zip(cpu, new, strict=False))
        self._cpu_pending.extend(cpu)
        self._blocks[rid] = new
        self._tables[rid] = [b.block_id for b in new]
        self._num_offered[rid] = 0
        return True

    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free) + len(self._cpu_pending)

    def take_block_ops(self) -> BlockOps:
        if not (self._swap_out or self._copies or self._swap_in or self._cpu_pending):  # (most steps)
            return BlockOps([], [], [])
        ops = BlockOps(self._swap_out, self._copies, self._swap_in)
        self._swap_out, self._copies, self._swap_in = [], [], []
        self._cpu_free.extend(self._cpu_pending)
        self._cpu_pending = []
        return ops

    # -- introspection -----------------------------------------------------------------
    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def num_held(self) -> int:
        return len(self._blocks) + len(self._swapped)

    def holders(self) -> dict[str, list[int]]:
        """Request id -> GPU block ids it references (a copy; for checks and sharing measurements)."""
        return {rid: list(t) for rid, t in self._tables.items()}

    def swapped_holders(self) -> dict[str, list[int]]:
        """Request id -> CPU block ids holding its swapped-out KV (a copy)."""
        return {rid: list(c) for rid, c in self._swapped.items()}

    def usage(self, requests: list[Request]) -> KVUsage:
        """Token states: distinct computed positions (a block shared by k holders counts once);
        internal fragmentation: the rest of the held blocks. Paged never reserves ahead and
        any free block serves any request, so reserved and external are 0."""
        bs = self.block_size
        total = self.num_blocks * bs
        free = self.pool.num_free * bs
        if not self.pool.num_shared and len(requests) == len(self._blocks):
            # The requests are the holders and every used block has one holder; a request's computed
            # tokens always lie in its blocks (allocated before they are computed): no per-request pass.
            held = (self.num_blocks - self.pool.num_free) * bs
            tokens = sum([r.num_computed_tokens for r in requests])
            return KVUsage(total, tokens, 0, held - tokens, 0, free)
        filled: dict[int, int] = {}
        for r in requests:
            blocks = self._blocks.get(r.request_id)
            if not blocks:
                continue
            computed = min(r.num_computed_tokens, len(blocks) * bs)
            n_full, rest = divmod(computed, bs)
            for b in blocks[:n_full]:
                filled[b.block_id] = bs
            if rest:
                bid = blocks[n_full].block_id
                filled[bid] = max(filled.get(bid, 0), rest)
            for b in blocks[n_full + (1 if rest else 0) :]:
                filled.setdefault(b.block_id, 0)
        tokens = sum(filled.values())
        held = len(filled) * bs
        return KVUsage(
            total_slots=total,
            token_slots=tokens,
            reserved_slots=0,
            internal_frag_slots=held - tokens,
            external_frag_slots=0,
            free_slots=free,
        )

    def stats(self) -> dict[str, int]:
        return {
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "kv_cow_copies": self.num_cow_copies,
            "kv_swapped_out_blocks": self.num_swapped_out,
        }
