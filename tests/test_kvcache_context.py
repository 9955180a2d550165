"""Caches are built from a ``KVCacheContext``: the pool, the model's layer groups and the engine's
preemption mode reach the cache through it, and a YAML's own keys are its constructor's settings."""

from __future__ import annotations

import pytest

from forge.config import ConfigError, compose_config
from forge.core.kv_groups import group_layers
from forge.engine.build import build_engine
from forge.kvcache.context import KVCacheContext
from forge.kvcache.naive import NaiveKVCache
from forge.kvcache.paged import PagedKVCache

WINDOWED = group_layers((None, 8, 8, None, 8, 8))  # 2 full layers, 4 windowed: 3 groups of 2


@pytest.mark.parametrize(("mode", "want"), [("swap", 10), ("recompute", 0)])
def test_unset_swap_space_follows_the_preemption_mode(mode: str, want: int) -> None:
    ctx = KVCacheContext(10, 4, preemption_mode=mode)  # type: ignore[arg-type]
    assert PagedKVCache(ctx, num_cpu_blocks=None).num_cpu_blocks == want
    assert PagedKVCache(ctx, num_cpu_blocks=3).num_cpu_blocks == 3
    with pytest.raises(ValueError, match="num_cpu_blocks must be >= 0"):
        PagedKVCache(ctx, num_cpu_blocks=-1)


def test_windowed_layers_get_the_hybrid_layout_unless_turned_off() -> None:
    ctx = KVCacheContext(10, 4, WINDOWED, preemption_mode="swap")
    hybrid, classic = PagedKVCache(ctx, num_cpu_blocks=None), PagedKVCache(ctx, free_outside_window=False)
    assert hybrid.kv_groups == WINDOWED and hybrid.num_blocks == 30 == hybrid.num_cpu_blocks  # 10 x 6 / 2 pages
    assert classic.kv_groups is None and classic.num_blocks == 10
    assert "kv_window_freed_blocks" in hybrid.stats() and "kv_window_freed_blocks" not in classic.stats()
    sized = PagedKVCache(KVCacheContext(10, 4, WINDOWED, num_pages=7))  # the engine's auto-sized pages
    assert sized.num_blocks == 7


def test_the_context_refuses_an_empty_pool() -> None:
    with pytest.raises(ValueError, match="num_blocks must be >= 1"):
        KVCacheContext(0, 4)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        KVCacheContext(4, 0)


def test_the_engine_builds_the_context_from_its_settings() -> None:
    """``engine.preemption_mode`` and ``engine.max_model_len`` reach the caches without a cache key."""
    base = ["model=synthetic", "clock=simulated", "kvcache.num_blocks=50", "engine.max_model_len=1000"]
    swap = build_engine(compose_config([*base, "engine.preemption_mode=swap"])).scheduler.kv
    assert (swap.num_blocks, swap.num_cpu_blocks) == (50, 50)
    naive = build_engine(compose_config([*base, "kvcache=naive"])).scheduler.kv
    assert isinstance(naive, NaiveKVCache) and naive.max_model_len == 1000 and naive.num_blocks == 50


def test_a_key_the_cache_does_not_take_is_refused() -> None:
    with pytest.raises(ConfigError, match="kvcache.reservation: not a setting of forge.kvcache.paged.PagedKVCache"):
        compose_config(["+kvcache.reservation=max"])
