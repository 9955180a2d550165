"""How a model's layers share one pool of KV pages (vLLM V1's hybrid KV cache manager).

Layers that attend alike (full attention, or one sliding window size) form *KV cache groups* of
``layers_per_page`` layers each; every group has its own block table per request over one shared
pool of pages, and a page holds ``block_size`` tokens of one group's ``layers_per_page`` layers.
The backend keeps ``layers_per_page`` K/V tensors; layer ``l`` stores its KV in tensor
``layer_slot[l]`` at the pages of group ``layer_group[l]``'s table. A full-attention group keeps
every page of a request; a windowed group frees the pages that lie wholly before its window.

With a single group (a model without windows, or with the freeing turned off) the layout is the
classic one: one page holds every layer, one block table per request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_CAPACITY = 2**40  # token_capacity's answer when only windowed groups (whose pages are bounded) exist


@dataclass(frozen=True)
class KVCacheGroups:
    """``windows[g]``: group g's sliding window (None: full attention); ``layer_group[l]`` and
    ``layer_slot[l]``: layer l's group and its tensor among the ``layers_per_page``."""

    windows: tuple[int | None, ...]
    layer_group: tuple[int, ...]
    layer_slot: tuple[int, ...]
    layers_per_page: int

    def __post_init__(self) -> None:
        if len(self.layer_group) != len(self.layer_slot) or not self.windows:
            raise ValueError("KVCacheGroups: one group and one slot per layer, at least one group")
        if any(w is not None and w < 1 for w in self.windows):
            raise ValueError(f"KVCacheGroups: windows must be >= 1, got {self.windows}")

    @classmethod
    def single(cls, num_layers: int, window: int | None = None) -> KVCacheGroups:
        """Every layer in one group (one page holds all layers): the classic paged layout."""
        return cls((window,), (0,) * num_layers, tuple(range(num_layers)), num_layers)

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_layers(self) -> int:
        return len(self.layer_group)

    @property
    def is_hybrid(self) -> bool:
        """More than one block table per request, or windowed pages to free: not the classic layout."""
        return self.num_groups > 1 or self.windows[0] is not None

    def pages_for(self, num_blocks: int) -> int:
        """Pages holding the memory of ``num_blocks`` classic blocks (each of every layer)."""
        return num_blocks * self.num_layers // self.layers_per_page

    def pages_held(self, num_tokens: int, block_size: int, max_chunk: int) -> int:
        """The most pages one request holds while computing ``num_tokens`` tokens in chunks of at most
        ``max_chunk``: a full-attention group every block, a windowed one its window and a chunk
        (``ceil((window - 1 + chunk) / block_size) + 1`` blocks at most, when pages outside it are freed)."""
        n = -(-num_tokens // block_size)
        ring = [n if w is None else min(n, -(-(w - 1 + max_chunk) // block_size) + 1) for w in self.windows]
        return sum(ring)

    def token_capacity(self, num_pages: int, block_size: int, max_chunk: int) -> int:
        """The most tokens one request can hold in ``num_pages`` pages computed in chunks of at most
        ``max_chunk`` (a binary search over ``pages_held``; only windowed groups: ``MAX_CAPACITY``)."""
        lo, hi = 0, MAX_CAPACITY
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.pages_held(mid, block_size, max_chunk) <= num_pages:
                lo = mid
            else:
                hi = mid - 1
        return lo


def group_layers(windows: Sequence[int | None]) -> KVCacheGroups:
    """Group layers by their window (``windows[l]``: layer l's, None for full attention) as vLLM does:
    the groups all have as many layers as the rarest kind has (the last group of a kind may be short,
    its unused slots padding); full-attention groups first, then windows by size."""
    if not windows:
        raise ValueError("a model with no layers has no KV cache groups")
    kinds: dict[int | None, list[int]] = {}
    for layer, window in enumerate(windows):
        kinds.setdefault(window, []).append(layer)
    if len(kinds) == 1:
        return KVCacheGroups.single(len(windows), windows[0])
    per_page = min(len(layers) for layers in kinds.values())
    order = sorted(kinds, key=lambda w: -1 if w is None else w)
    group_windows: list[int | None] = []
    layer_group = [0] * len(windows)
    layer_slot = [0] * len(windows)
    for window in order:
        layers = kinds[window]
        for start in range(0, len(layers), per_page):
            for slot, layer in enumerate(layers[start : start + per_page]):
                layer_group[layer] = len(group_windows)
                layer_slot[layer] = slot
            group_windows.append(window)
    return KVCacheGroups(tuple(group_windows), tuple(layer_group), tuple(layer_slot), per_page)
