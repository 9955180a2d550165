"""How much KV memory block sharing saves (vLLM paper, Fig. 15): logical blocks (the sum of every
sequence's block-table length, what it would hold alone) vs physical blocks (distinct blocks held)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from forge.kvcache.base import KVCacheManager


@dataclass(frozen=True)
class Sharing:
    logical_blocks: int
    physical_blocks: int

    def __add__(self, other: Sharing) -> Sharing:
        return Sharing(self.logical_blocks + other.logical_blocks, self.physical_blocks + other.physical_blocks)

    @property
    def saved_fraction(self) -> float:
        """1 - physical / logical: the share of blocks that sharing made unnecessary."""
        return 1.0 - self.physical_blocks / self.logical_blocks if self.logical_blocks else 0.0


def block_sharing(kv: KVCacheManager, request_ids: Iterable[str]) -> Sharing:
    """Sharing among the given requests' block tables at this instant."""
    logical = 0
    physical: set[int] = set()
    for rid in request_ids:
        table = kv.block_table(rid)
        logical += len(table)
        physical.update(table)
    return Sharing(logical, len(physical))
