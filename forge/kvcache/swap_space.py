"""The host (CPU) block pool swapped-out requests wait in, and the queue of KV tensor copies (swap out,
copy-on-write, swap in) the runner does before the next forward (``BlockOps``)."""

from __future__ import annotations

from collections.abc import Iterator

from forge.kvcache.base import BlockOps
from forge.kvcache.block_pool import Block
from forge.kvcache.pages import Pages

CpuTables = list[list[int | None]]
"""A swapped-out request's CPU block per group and block (None: freed outside the window)."""


class SwapSpace:
    """``num_cpu_blocks`` host blocks, the swapped-out requests' CPU tables (by request id) and the
    copies decided since the last ``take_ops``. CPU blocks a swap-in or a free releases become reusable
    only after the step's ``take_ops`` (the copies of one step run together)."""

    def __init__(self, num_cpu_blocks: int) -> None:
        self.num_cpu_blocks = num_cpu_blocks
        self._free = list(range(num_cpu_blocks - 1, -1, -1))
        self._pending: list[int] = []
        self._swap_out: list[tuple[int, int]] = []
        self._copies: list[tuple[int, int]] = []
        self._swap_in: list[tuple[int, int]] = []
        self._swapped: dict[str, CpuTables] = {}
        self.num_swapped_out = 0  # blocks copied out, ever

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._pending)

    def copy(self, src: Block, dst: Block) -> None:
        """A GPU -> GPU copy (copy-on-write) for the runner."""
        self._copies.append((src.block_id, dst.block_id))

    @property
    def num_swapped(self) -> int:
        """Requests swapped out."""
        return len(self._swapped)

    def holders(self) -> dict[str, list[int]]:
        """Request id -> CPU block ids holding its swapped-out KV (a copy)."""
        return {rid: [c for t in cpu for c in t if c is not None] for rid, cpu in self._swapped.items()}

    def swap_out(self, request_id: str, pages: Pages) -> bool:
        """Copy every page ``pages`` holds to a CPU block; False (nothing done) when the request is
        swapped out already or too few CPU blocks are free."""
        if request_id in self._swapped or pages.num_held() > len(self._free):
            return False
        cpu: CpuTables = []
        for blocks in pages.blocks:
            table: list[int | None] = []
            for block in blocks:
                c = None if block is None else self._free.pop()
                if block is not None and c is not None:
                    self._swap_out.append((block.block_id, c))
                table.append(c)
            cpu.append(table)
        self._swapped[request_id] = cpu
        self.num_swapped_out += pages.num_held()
        return True

    def blocks_to_swap_in(self, request_id: str, num_blocks: int) -> int | None:
        """GPU blocks a swap-in of the request needs to cover ``num_blocks`` blocks in every group (None:
        it is not swapped out)."""
        cpu = self._swapped.get(request_id)
        if cpu is None:
            return None
        return sum(sum(c is not None for c in t) + max(0, num_blocks - len(t)) for t in cpu)

    def swap_in(self, request_id: str, fresh: Iterator[Block], num_blocks: int) -> list[list[Block | None]]:
        """Per group, the GPU blocks (from ``fresh``) the request's CPU blocks are copied back into, then
        fresh ones up to ``num_blocks``; its CPU blocks are released."""
        groups: list[list[Block | None]] = []
        for table in self._swapped.pop(request_id):
            blocks: list[Block | None] = []
            for c in table:
                block = None if c is None else next(fresh)
                if block is not None and c is not None:
                    self._swap_in.append((c, block.block_id))
                    self._pending.append(c)
                blocks.append(block)
            blocks.extend(next(fresh) for _ in range(max(0, num_blocks - len(table))))
            groups.append(blocks)
        return groups

    def release(self, request_id: str) -> None:
        """Forget a swapped-out request (it was freed): its CPU blocks are released."""
        cpu = self._swapped.pop(request_id, None)
        if cpu:
            self._pending.extend(c for table in cpu for c in table if c is not None)

    def take_ops(self) -> BlockOps:
        """The copies decided since the last call; released CPU blocks become free."""
        if not (self._swap_out or self._copies or self._swap_in or self._pending):  # (most steps)
            return BlockOps([], [], [])
        ops = BlockOps(self._swap_out, self._copies, self._swap_in)
        self._swap_out, self._copies, self._swap_in = [], [], []
        self._free.extend(self._pending)
        self._pending = []
        return ops
