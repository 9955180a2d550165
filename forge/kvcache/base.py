"""The KV cache manager contract."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from forge.core.decode_run import DecodeRun
from forge.core.kv_groups import KVCacheGroups
from forge.core.request import Request


# not frozen: one is built per step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass
class KVUsage:
    """Slot accounting at one instant (vLLM paper, Fig. 2 categories), in token slots.

    ``token_slots`` hold computed KV; ``reserved_slots`` are held for tokens the request
    will still produce; ``internal_frag_slots`` are held but will never be used;
    ``external_frag_slots`` are free but outside the largest free run, so unusable for a
    large contiguous allocation; ``free_slots`` counts all free slots (external included).
    """

    total_slots: int
    token_slots: int
    reserved_slots: int
    internal_frag_slots: int
    external_frag_slots: int
    free_slots: int

    @property
    def used_fraction(self) -> float:
        return 1.0 - self.free_slots / self.total_slots if self.total_slots else 0.0


# not frozen: one is built per step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass
class BlockOps:
    """KV tensor copies the runner must do before this step's forward, in this order:
    ``swap_out`` (GPU block -> CPU block), ``copy_blocks`` (GPU -> GPU, copy-on-write),
    ``swap_in`` (CPU block -> GPU block). Pairs are ``(src, dst)`` block ids."""

    swap_out: list[tuple[int, int]]
    copy_blocks: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]


NO_BLOCK_OPS = BlockOps([], [], [])


class KVCacheManager(ABC):
    """Maps each request to a block table over a pool of ``num_blocks`` x ``block_size`` slots.

    Building: a ``conf/kvcache/<name>.yaml`` names the class (or a factory) as ``_target_``; the engine
    calls it with a ``KVCacheContext`` (``forge.kvcache.context``: the pool the YAML's ``block_size`` and
    ``num_blocks`` describe, the model's layer groups, ``max_model_len``, the preemption mode, the KV
    dtype) as its first argument and the YAML's other keys as keyword arguments. The instance sets
    ``num_blocks`` and ``block_size`` (and ``num_cpu_blocks``, ``kv_groups`` if it swaps or lays pages
    out by group): the runner allocates the KV tensors its tables index from them. ``docs/kvcache.md``
    walks through one.

    - ``match_prefix(req)`` (fresh requests only) acquires cached blocks for a prefix of
      the prompt and returns how many tokens they hold (a multiple of ``block_size``, less
      than ``req.num_tokens``); managers without prefix caching return 0.
    - ``allocate_slots(req, num_tokens, num_cacheable)`` makes the table cover the first
      ``num_tokens`` positions, all-or-nothing; False if the pool cannot. The first
      ``num_cacheable`` tokens are final (no drafts) and may be shared by prefix caching.
    - ``decode_slot(req)``: for a plain decode (``Request.is_decoding``: one uncomputed token, known
      and cacheable), ``allocate_slots(req, n + 1, n + 1)`` with n its computed tokens, then its block
      table; None (nothing allocated) when the pool cannot. One call on the scheduler's hottest path.
    - ``trim(req, num_tokens)`` gives back blocks past ``num_tokens`` (rejected drafts).
    - ``free(req)`` releases everything the request holds (GPU and CPU); unknown ids are a no-op.
    - ``discard(req)``: ``free`` after the step that was to compute the request's scheduled tokens
      failed: blocks past its computed tokens may have been offered to a prefix cache but were
      never written, so no later request may hit them. Managers without prefix caching: ``free``.

    Optional abilities (the defaults say "not supported" and the scheduler falls back):

    - ``cached_prefix_len(req)``: tokens of ``req`` a ``match_prefix`` would hit now; a pure query.
    - ``fork(parent, child, num_tokens)``: ``child`` shares (references) the parent's blocks
      holding its first ``num_tokens`` tokens; a later write into a shared block copies it
      first (copy-on-write). False if unsupported.
    - ``swap_out(req)``: copy the request's blocks to the CPU pool and free them on the
      GPU; False if unsupported or the CPU pool is full. ``swap_in(req, num_tokens)``:
      bring them back into fresh GPU blocks covering ``num_tokens`` positions,
      all-or-nothing; False if the GPU pool cannot. The request keeps its computed tokens.
    - ``take_block_ops()``: the tensor copies (swap, copy-on-write) decided since the
      last call, for the runner; the scheduler calls it once per step.

    Fast paths (``forge.core.fast_paths``): an overridden ``decode_slot`` is called only for a class
    that sets ``fast_paths = True`` in its own body, promising it allocates exactly as
    ``allocate_slots`` and ``block_table`` would; for any other class (a subclass inherits no
    declaration) the scheduler uses this base class's ``decode_slot``. Decode runs are one optional
    interface, ``DecodeRunCache`` (below), for such declaring classes.

    KV cache groups (``forge.core.kv_groups``; the hybrid allocator): ``block_table`` is group 0's
    table and ``group_tables(request_id)`` the other groups' (empty with one group).
    ``token_capacity(max_chunk)``: the most tokens one request can hold in the whole pool, computed
    in chunks of at most ``max_chunk`` (``num_blocks * block_size`` unless windows free blocks);
    ``reserved_tokens(request, num_tokens)``: the slots it takes to hold ``num_tokens`` (more for a cache
    that reserves ahead), what the scheduler's refusal compares with that capacity.
    """

    num_blocks: int
    block_size: int
    num_cpu_blocks: int = 0
    kv_groups: KVCacheGroups | None = None  # the tensors' layout the tables index (None: one page holds every layer)

    @abstractmethod
    def match_prefix(self, request: Request) -> int: ...

    @abstractmethod
    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool: ...

    def decode_slot(self, request: Request) -> list[int] | None:
        end = request.num_computed_tokens + 1
        return self.block_table(request.request_id) if self.allocate_slots(request, end, end) else None

    @abstractmethod
    def trim(self, request: Request, num_tokens: int) -> None: ...

    @abstractmethod
    def free(self, request: Request) -> None: ...

    @abstractmethod
    def block_table(self, request_id: str) -> list[int]: ...

    @abstractmethod
    def num_free_blocks(self) -> int: ...

    @abstractmethod
    def usage(self, requests: list[Request]) -> KVUsage:
        """Accounting over the given live requests (those holding slots)."""

    @property
    def usage_fraction(self) -> float:
        return 1.0 - self.num_free_blocks() / self.num_blocks

    def discard(self, request: Request) -> None:
        self.free(request)

    def group_tables(self, request_id: str) -> tuple[list[int], ...]:
        return ()

    def token_capacity(self, max_chunk: int) -> int:
        return self.num_blocks * self.block_size

    def reserved_tokens(self, request: Request, num_tokens: int) -> int:
        """The token slots ``request`` takes once it holds ``num_tokens`` tokens (the scheduler refuses a
        request whose reservation exceeds ``token_capacity``): ``num_tokens``, for a cache that reserves
        no more than it writes."""
        return num_tokens

    def num_held(self) -> int:
        """Requests currently holding blocks (the engine checks it drops to 0)."""
        return 0

    def num_free_cpu_blocks(self) -> int:
        return self.num_cpu_blocks

    def cached_prefix_len(self, request: Request) -> int:
        return 0

    def fork(self, parent: Request, child: Request, num_tokens: int) -> bool:
        return False

    def swap_out(self, request: Request) -> bool:
        return False

    def swap_in(self, request: Request, num_tokens: int) -> bool:
        return False

    def take_block_ops(self) -> BlockOps:
        return NO_BLOCK_OPS

    def stats(self) -> dict[str, int]:
        """Counters such as prefix-cache queries and hits."""
        return {}


class DecodeRunCache(ABC):
    """The optional interface of a KV cache that takes ``DecodeRun``s (consecutive plain decode steps
    at once, ``forge.core.decode_run``); used only for a class that also declares ``fast_paths``.

    - ``decode_run_fits(run)``: whether the cache can take a ``DecodeRun`` of these requests (being
      every holder of blocks); a cheap pure query.
    - ``reserve_decode_run(run)`` then allocates its slots as its steps' ``decode_slot`` calls would,
      in the same order, and returns each step's ``usage`` of the requests still running after it (the
      finishing rows freed after their last); or None, nothing allocated, when the free blocks do not
      hold the run (a step would wait). ``reserve_decode_slots(run)``: the same reservation, the usage
      not returned (True: reserved)."""

    @abstractmethod
    def decode_run_fits(self, run: DecodeRun) -> bool: ...

    @abstractmethod
    def reserve_decode_run(self, run: DecodeRun) -> list[KVUsage] | None: ...

    def reserve_decode_slots(self, run: DecodeRun) -> bool:
        """``reserve_decode_run`` for a caller that reads no usage (a joining step, whose admissions change
        it): whether it reserved. A cache may skip computing the usage; this one does not."""
        return self.reserve_decode_run(run) is not None
