"""The Orca-style baseline: one contiguous region per request in a first-fit arena."""

from __future__ import annotations

import bisect
from typing import Literal

from forge.core.request import Request
from forge.kvcache.base import KVCacheManager, KVUsage
from forge.kvcache.context import KVCacheContext

Reservation = Literal["max", "pow2", "oracle"]


class NaiveKVCache(KVCacheManager):
    """Each request reserves, on admission, a contiguous run of blocks sized by ``reservation``:

    - ``max``: ``ctx.max_model_len`` tokens (what Orca must do without knowing output lengths);
    - ``pow2``: the next power of two of prompt + true output length;
    - ``oracle``: exactly prompt + true output length.

    The true output length is ``request.expected_output_len`` when the workload knows it,
    else ``max_tokens``. Runs come from the lowest free extent that fits (first fit), so
    external fragmentation is real. A request outgrowing its run extends in place if the
    next blocks are free, else allocation fails (and the scheduler preempts).
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, ctx: KVCacheContext, reservation: Reservation = "max") -> None:
        if reservation not in ("max", "pow2", "oracle"):
            raise ValueError(f"kvcache.reservation must be max, pow2 or oracle, got {reservation!r}")
        num_blocks = self.num_blocks = ctx.num_blocks
        self.block_size = ctx.block_size
        self.max_model_len = ctx.max_model_len
        self.reservation = reservation
        self._free: list[tuple[int, int]] = [(0, num_blocks)]  # sorted (start, length) extents
        self._runs: dict[str, tuple[int, int]] = {}
        self._tables: dict[str, list[int]] = {}
        self._final_len: dict[str, int] = {}
        self._num_free = num_blocks

    def _final_tokens(self, request: Request) -> int:
        out = request.expected_output_len or request.sampling_params.max_tokens
        return min(request.num_prompt_tokens + out, self.max_model_len)

    def _reserve_tokens(self, request: Request, num_tokens: int) -> int:
        if self.reservation == "max":
            want = self.max_model_len
        elif self.reservation == "pow2":
            want = min(1 << (self._final_tokens(request) - 1).bit_length(), self.max_model_len)
        else:
            want = self._final_tokens(request)
        return max(want, num_tokens)

    def reserved_tokens(self, request: Request, num_tokens: int) -> int:
        return self._reserve_tokens(request, num_tokens)

    def match_prefix(self, request: Request) -> int:
        return 0

    def allocate_slots(self, request: Request, num_tokens: int, num_cacheable: int) -> bool:
        rid = request.request_id
        need = -(-num_tokens // self.block_size)
        run = self._runs.get(rid)
        if run is None:
            size = -(-self._reserve_tokens(request, num_tokens) // self.block_size)
            start = self._take_first_fit(size)
            if start is None:
                return False
            self._runs[rid] = (start, size)
            self._tables[rid] = list(range(start, start + size))
            self._final_len[rid] = self._final_tokens(request)
            return True
        start, size = run
        if need <= size:
            return True
        if not self._take_at(start + size, need - size):
            return False
        self._runs[rid] = (start, need)
        self._tables[rid].extend(range(start + size, start + need))
        return True

    def trim(self, request: Request, num_tokens: int) -> None:
        """Reservations are fixed for the request's life; nothing to give back early."""

    def free(self, request: Request) -> None:
        rid = request.request_id
        run = self._runs.pop(rid, None)
        self._tables.pop(rid, None)
        self._final_len.pop(rid, None)
        if run is not None:
            self._give_back(*run)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables[request_id]

    def num_free_blocks(self) -> int:
        return self._num_free

    def num_held(self) -> int:
        return len(self._runs)

    def usage(self, requests: list[Request]) -> KVUsage:
        bs = self.block_size
        tokens = reserved = internal = 0
        for r in requests:
            run = self._runs.get(r.request_id)
            if run is None:
                continue
            held = run[1] * bs
            final = max(self._final_len[r.request_id], r.num_computed_tokens)
            used = min(r.num_computed_tokens, held)
            tokens += used
            reserved += max(min(final, held) - used, 0)
            internal += max(held - final, 0)
        largest = max((length for _, length in self._free), default=0)
        return KVUsage(
            total_slots=self.num_blocks * bs,
            token_slots=tokens,
            reserved_slots=reserved,
            internal_frag_slots=internal,
            external_frag_slots=(self._num_free - largest) * bs,
            free_slots=self._num_free * bs,
        )

    def _take_first_fit(self, size: int) -> int | None:
        for i, (start, length) in enumerate(self._free):
            if length >= size:
                if length == size:
                    del self._free[i]
                else:
                    self._free[i] = (start + size, length - size)
                self._num_free -= size
                return start
        return None

    def _take_at(self, start: int, size: int) -> bool:
        i = bisect.bisect_left(self._free, (start, 0))
        if i == len(self._free) or self._free[i][0] != start or self._free[i][1] < size:
            return False
        s, length = self._free[i]
        if length == size:
            del self._free[i]
        else:
            self._free[i] = (s + size, length - size)
        self._num_free -= size
        return True

    def _give_back(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self._free, (start, 0))
        self._free.insert(i, (start, size))
        self._num_free += size
        # Merge with the right, then the left neighbour.
        if i + 1 < len(self._free) and start + size == self._free[i + 1][0]:
            self._free[i] = (start, size + self._free[i + 1][1])
            del self._free[i + 1]
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
            del self._free[i]
