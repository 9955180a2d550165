"""A tensor-parallel shard's place in its group (``Shard``, set on a ``DecoderModel`` by
``forge.parallel.shard``) and the collectives its forward calls (``TensorParallelGroup``, implemented
on ``torch.distributed`` by ``forge.parallel.group``). Part of ``forge.models.decoder``, which
re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class TensorParallelGroup(Protocol):
    """The collectives a tensor-parallel shard of a model calls inside its forward, in the same order
    on every rank (``forge.parallel.group`` implements them on ``torch.distributed``)."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``x`` over the ranks."""
        ...

    def gather_columns(self, x: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
        """Every rank's ``x`` (rank ``r``'s has ``widths[r]`` columns) side by side, in rank order."""
        ...


@dataclass(frozen=True)
class Shard:
    """A tensor-parallel shard's place: its group, its vocabulary rows ``[vocab_start, vocab_end)``
    and every rank's vocabulary width (for gathering the logits)."""

    group: TensorParallelGroup
    vocab_start: int
    vocab_end: int
    vocab_widths: tuple[int, ...]
