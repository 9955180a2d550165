"""Prefix-cache hits over KV cache groups (``PagedKVCache.match_prefix``, as vLLM's hybrid
coordinator finds them): a full-attention group needs every block of the prefix, a windowed group only
the blocks its window reads from the prefix's end; the hit is the longest prefix every group has."""

from __future__ import annotations

from collections.abc import Sequence

from forge.kvcache.block_pool import Block, BlockPool


def group_key(group: int, block_hash: int) -> int:
    """The prefix-cache key of a group's block (group 0 keeps the plain chained hash)."""
    return block_hash if group == 0 else hash((group, block_hash))


def first_needed_block(window: int | None, position: int, block_size: int) -> int:
    """The first block a query at ``position`` reads (0 for full attention): its window's first position's."""
    return 0 if window is None else max(0, position - window + 1) // block_size


def group_hit(pool: BlockPool, group: int, window: int | None, block_size: int, hashes: list[int], limit: int) -> int:
    """The most blocks ``m <= limit`` of the prefix whose blocks ``group`` needs (to compute position
    ``m * block_size`` next) are all cached."""
    lookup = pool.lookup
    if window is None:
        m = 0
        while m < limit and lookup(group_key(group, hashes[m])) is not None:
            m += 1
        return m
    m = limit
    while m > 0:
        first = first_needed_block(window, m * block_size, block_size)
        i = m - 1
        while i >= first and lookup(group_key(group, hashes[i])) is not None:
            i -= 1
        if i < first:
            return m
        m = i  # block i is missing: only prefixes that end before it can hit
    return 0


def longest_hit(pool: BlockPool, windows: Sequence[int | None], block_size: int, hashes: list[int]) -> int:
    """The most leading blocks of ``hashes`` every group can hit: each group in turn lowers the candidate
    until none does (a windowed group's hits are not prefix-closed, so shorter candidates are re-checked)."""
    n = len(hashes)
    while True:
        m = n
        for group, window in enumerate(windows):
            m = group_hit(pool, group, window, block_size, hashes, m)
        if m == n:
            return n
        n = m


def acquire_hit(
    pool: BlockPool, group: int, window: int | None, block_size: int, hashes: list[int]
) -> list[Block | None]:
    """``group``'s blocks of a hit on every block of ``hashes`` (``longest_hit``'s), each acquired: the
    blocks a query after the hit reads, None before them (a windowed group's, outside its window)."""
    first = first_needed_block(window, len(hashes) * block_size, block_size)
    blocks: list[Block | None] = [None] * first
    for i in range(first, len(hashes)):
        block = pool.lookup(group_key(group, hashes[i]))
        assert block is not None
        pool.acquire(block)
        blocks.append(block)
    return blocks
