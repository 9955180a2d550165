"""``PagedKVCache``'s slot accounting (``KVUsage``) over its requests' pages, and the block arithmetic of
a ``DecodeRun`` (which steps open new blocks, the usage after each step)."""

from __future__ import annotations

from collections.abc import Mapping

from forge.core.decode_run import DecodeRun
from forge.core.request import Request
from forge.kvcache.base import KVUsage
from forge.kvcache.block_pool import Block
from forge.kvcache.pages import Pages


def holders_usage(requests: list[Request], held_blocks: int, block_size: int, total: int, free: int) -> KVUsage:
    """``pages_usage`` when ``requests`` are every holder (one group) and every held block has one: a
    request's computed tokens always lie in its blocks (allocated before they are computed), so the
    computed tokens are the token slots and the rest of the ``held_blocks`` internal fragmentation."""
    tokens = sum([r.num_computed_tokens for r in requests])
    return KVUsage(total, tokens, 0, held_blocks * block_size - tokens, 0, free)


def pages_usage(pages: Mapping[str, Pages], requests: list[Request], block_size: int, total: int, free: int) -> KVUsage:
    """``KVUsage`` of ``requests``: each held block filled with the computed positions it holds (the most
    over its holders), the rest of it internal fragmentation; ``total`` and ``free`` slots as given."""
    filled: dict[int, int] = {}
    for r in requests:
        held = pages.get(r.request_id)
        if held is not None:
            for g, blocks in enumerate(held.blocks):
                _fill(filled, blocks, held.skipped[g], r.num_computed_tokens, block_size)
    tokens = sum(filled.values())
    return KVUsage(total, tokens, 0, len(filled) * block_size - tokens, 0, free)


def _fill(filled: dict[int, int], blocks: list[Block | None], skipped: int, computed: int, bs: int) -> None:
    """Record in ``filled`` (block id -> slots holding computed tokens) a table's blocks from ``skipped``
    on, whose first ``computed`` positions are computed."""
    n_full, rest = divmod(min(computed, len(blocks) * bs), bs)
    for b in blocks[skipped:n_full]:
        if b is not None:
            filled[b.block_id] = bs
    for i in range(max(n_full, skipped), len(blocks)):
        b = blocks[i]
        if b is not None:
            n = rest if i == n_full else 0
            filled[b.block_id] = max(filled.get(b.block_id, 0), n)


def decode_run_openings(run: DecodeRun, block_size: int) -> list[tuple[int, int]]:
    """``(step, row)`` of each position of ``run`` that opens a new block, in the order step-by-step
    ``decode_slot`` calls would allocate them (by step, then row)."""
    bs, num_steps, tables, starts = block_size, run.num_steps, run.block_tables, run.starts
    opening: list[tuple[int, int]] = []
    append = opening.append
    for i in range(len(starts)):  # (by index: faster than unpacking a zip here)
        j = len(tables[i]) * bs - starts[i]  # the row's first step whose position lies past its blocks (start + step)
        if j < num_steps[i]:
            append((j, i))
    more = [(j + bs, i) for j, i in opening if j + bs < num_steps[i]]  # rows opening several blocks
    while more:
        opening += more
        more = [(j + bs, i) for j, i in more if j + bs < num_steps[i]]
    opening.sort()
    return opening


def decode_run_usage(
    run: DecodeRun, num_blocks: int, block_size: int, free: int, allocated: list[int]
) -> list[KVUsage]:
    """``usage(running)`` after each step of ``run`` (the one-holder-per-block case, one group): ``free``
    blocks before it, ``allocated[j]`` taken at step j, a finishing row's blocks back after its last."""
    bs, total = block_size, num_blocks * block_size
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
        usages.append(KVUsage(total, tokens, 0, (num_blocks - free) * bs - tokens, 0, free * bs))
    return usages
