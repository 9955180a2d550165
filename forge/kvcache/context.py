"""What the engine tells a KV cache it builds: ``KVCacheContext``, the first argument of every cache's
constructor (or factory) that a ``conf/kvcache/*.yaml`` names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from forge.core.kv_groups import KVCacheGroups

CONTEXT_KEYS = ("block_size", "num_blocks")
"""The keys of every ``conf/kvcache`` YAML that size the pool: the engine reads them into the context
(``num_blocks: auto`` sized from memory); the YAML's other keys are the constructor's own settings."""

PreemptionMode = Literal["recompute", "swap"]


@dataclass(frozen=True)
class KVCacheContext:
    """The model's KV layout and the pool the engine sized for it.

    - ``num_blocks``: the pool in blocks of ``block_size`` tokens of every layer (the classic layout:
      ``kvcache.num_blocks``, or what fits the KV memory budget when that is ``auto``).
    - ``groups``: the model's layers grouped by sliding window (``forge.core.kv_groups``; one group
      when no layer is windowed); None: no model's layout is known (one group of every layer).
    - ``num_pages``: the same memory in pages of ``groups``' layout (``pages``; None: as many as
      ``groups.pages_for(num_blocks)``).
    - ``max_model_len``: the longest request in tokens; ``preemption_mode``: ``engine.preemption_mode``;
      ``dtype``: what one KV slot stores (the model's KV dtype name, e.g. ``float16`` or ``int8``).
    """

    num_blocks: int
    block_size: int = 16
    groups: KVCacheGroups | None = None
    num_pages: int | None = None
    max_model_len: int = 2048
    preemption_mode: PreemptionMode = "recompute"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(f"kvcache.num_blocks must be >= 1, got {self.num_blocks}")
        if self.block_size < 1:
            raise ValueError(f"kvcache.block_size must be >= 1, got {self.block_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"the pool must hold >= 1 page, got {self.num_pages}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"engine.preemption_mode must be recompute or swap, got {self.preemption_mode!r}")

    @property
    def hybrid_groups(self) -> KVCacheGroups | None:
        """``groups`` when they are not the classic layout (several tables, or windowed pages to free)."""
        return self.groups if self.groups is not None and self.groups.is_hybrid else None

    def pages(self) -> int:
        """The pool in pages of ``groups``' layout (``num_blocks`` without groups)."""
        if self.num_pages is not None:
            return self.num_pages
        return self.num_blocks if self.groups is None else self.groups.pages_for(self.num_blocks)

    def cpu_blocks(self, num_cpu_blocks: int | None, pool: int) -> int:
        """Host blocks for swapping: ``num_cpu_blocks`` when set, else (None) as many as the ``pool``
        under ``preemption_mode=swap`` and none under recompute."""
        if num_cpu_blocks is None:
            return pool if self.preemption_mode == "swap" else 0
        if num_cpu_blocks < 0:
            raise ValueError(f"kvcache.num_cpu_blocks must be >= 0, got {num_cpu_blocks}")
        return num_cpu_blocks
