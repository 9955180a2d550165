"""One request's pages in each KV cache group (``PagedKVCache``'s per-request record), and the chained
block hashes prefix caching keys full blocks by."""

from __future__ import annotations

from typing import cast

from forge.core.request import Request
from forge.kvcache.block_pool import Block

NULL_BLOCK = 0
"""The table entry of a page freed outside its group's window: a valid page id that attention never
reads unmasked (every backend's windowed attention starts at, or masks everything before, the window)."""


def chain_hash(parent: int, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given its parent block's hash (deterministic across runs: ints only)."""
    return hash((parent, tokens))


def extend_hashes(hashes: list[int], request: Request, num_tokens: int, block_size: int, seed: int) -> list[int]:
    """``hashes`` (the request's chained block hashes so far, rooted at ``seed``) extended in place to
    every full block within its first ``num_tokens`` tokens; returns it."""
    bs = block_size
    n_full = num_tokens // bs
    if len(hashes) < n_full:
        tokens = request.token_ids(len(hashes) * bs, n_full * bs)
        parent = hashes[-1] if hashes else seed
        for i in range(n_full - len(hashes)):
            parent = chain_hash(parent, tuple(tokens[i * bs : (i + 1) * bs]))
            hashes.append(parent)
    return hashes


class Pages:
    """One request's pages: per group its blocks (None: freed outside the window, always a prefix of
    ``skipped`` entries), the table of their ids, and how many leading ones were offered to the cache."""

    __slots__ = ("blocks", "offered", "skipped", "tables")

    def __init__(self, num_groups: int) -> None:
        self.blocks: list[list[Block | None]] = [[] for _ in range(num_groups)]
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.offered = [0] * num_groups
        self.skipped = [0] * num_groups

    @classmethod
    def one_group(cls) -> Pages:
        """``Pages(1)`` (the classic layout's, one per new request: built without ``__init__``'s call)."""
        pages = cls.__new__(cls)
        pages.blocks, pages.tables, pages.offered, pages.skipped = [[]], [[]], [0], [0]
        return pages

    def set_group(self, group: int, blocks: list[Block | None], offered: int = 0) -> None:
        """Group ``group``'s blocks (its table and skipped prefix follow from them)."""
        self.blocks[group] = blocks
        self.tables[group] = [NULL_BLOCK if b is None else b.block_id for b in blocks]
        self.skipped[group] = next((i for i, b in enumerate(blocks) if b is not None), len(blocks))
        self.offered[group] = offered

    def append(self, group: int, new: list[Block]) -> None:
        self.blocks[group] += new
        self.tables[group] += [b.block_id for b in new]

    def shared_groups(self, index: int) -> list[int]:
        """The groups whose block ``index`` others hold too (a write there copies it first)."""
        shared = []
        for g, blocks in enumerate(self.blocks):
            block = blocks[index] if index < len(blocks) else None
            if block is not None and block.ref_cnt > 1:
                shared.append(g)
        return shared

    def replace(self, group: int, index: int, block: Block) -> None:
        """Block ``index`` of ``group`` is now ``block`` (a copy-on-write's copy)."""
        self.blocks[group][index] = block
        self.tables[group][index] = block.block_id
        self.offered[group] = min(self.offered[group], index)

    def skip(self, group: int, end: int) -> list[Block]:
        """Drop ``group``'s blocks before ``end`` (outside its window: their entries become None and
        ``NULL_BLOCK``); returns the dropped ones held."""
        end = min(end, len(self.blocks[group]))
        start = self.skipped[group]
        if end <= start:
            return []
        blocks, table = self.blocks[group], self.tables[group]
        drop = [b for b in blocks[start:end] if b is not None]
        blocks[start:end] = [None] * (end - start)
        table[start:end] = [NULL_BLOCK] * (end - start)
        self.skipped[group] = end
        return drop

    def truncate(self, keep: int) -> list[Block]:
        """Keep each group's first ``keep`` blocks; returns the dropped ones held, each group's last first."""
        dropped: list[Block] = []
        for g, blocks in enumerate(self.blocks):
            if keep < len(blocks):
                dropped += [b for b in reversed(blocks[keep:]) if b is not None]
                del blocks[keep:]
                del self.tables[g][keep:]
                self.offered[g] = min(self.offered[g], keep)
                self.skipped[g] = min(self.skipped[g], keep)
        return dropped

    def held(self) -> list[Block]:
        """Every page it holds, each group's last first (a group's blocks from ``skipped`` on are held)."""
        if len(self.blocks) == 1:
            return cast(list[Block], self.blocks[0][self.skipped[0] :][::-1])
        return [cast(Block, b) for g, blocks in enumerate(self.blocks) for b in blocks[self.skipped[g] :][::-1]]

    def num_held(self) -> int:
        return sum(len(blocks) - skipped for blocks, skipped in zip(self.blocks, self.skipped, strict=True))
