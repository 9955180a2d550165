"""``kvcache=paged``: the block manager for the model's KV cache groups (``forge.core.kv_groups``)."""

from __future__ import annotations

from forge.core.kv_groups import KVCacheGroups
from forge.kvcache.base import KVCacheManager
from forge.kvcache.hybrid import HybridKVCache
from forge.kvcache.paged import PagedKVCache


def paged_kv_cache(
    num_blocks: int,
    block_size: int = 16,
    enable_prefix_caching: bool = False,
    hash_seed: int = 0,
    num_cpu_blocks: int | None = 0,
    free_outside_window: bool = True,
    groups: KVCacheGroups | None = None,
) -> KVCacheManager:
    """The hybrid allocator (``HybridKVCache``, ``num_blocks`` pages of ``groups.layers_per_page``
    layers) when the model has windowed layers (``groups`` hybrid) and ``free_outside_window``;
    otherwise ``PagedKVCache`` (``num_blocks`` blocks of every layer; windowed layers keep their
    whole context)."""
    if free_outside_window and groups is not None and groups.is_hybrid:
        return HybridKVCache(num_blocks, groups, block_size, enable_prefix_caching, hash_seed, num_cpu_blocks)
    return PagedKVCache(num_blocks, block_size, enable_prefix_caching, hash_seed, num_cpu_blocks)
