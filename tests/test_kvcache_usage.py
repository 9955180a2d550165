"""Per-step KV memory accounting (vLLM paper Fig. 2 categories), on hand-computed cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge import LLM, SamplingParams
from forge.core.request import Request
from forge.kvcache.base import KVCacheManager, KVUsage
from forge.kvcache.context import KVCacheContext
from forge.kvcache.naive import NaiveKVCache
from forge.kvcache.paged import PagedKVCache
from tests.sched_helpers import request


def place(kv: KVCacheManager, r: Request, computed: int) -> None:
    assert kv.allocate_slots(r, computed, computed)
    r.num_computed_tokens = computed


def test_naive_max_reserves_max_model_len_and_first_fit_fragments() -> None:
    kv = NaiveKVCache(KVCacheContext(20, 4, max_model_len=32), reservation="max")
    a = request("a", 5, max_tokens=9, expected_output_len=3)  # true final 8 tokens
    b = request("b", 6, max_tokens=9, expected_output_len=10)  # true final 16
    place(kv, a, 5)
    place(kv, b, 6)
    assert kv.block_table("a") == list(range(8)) and kv.block_table("b") == list(range(8, 16))
    assert kv.usage([a, b]) == KVUsage(
        total_slots=80,
        token_slots=11,
        reserved_slots=(8 - 5) + (16 - 6),
        internal_frag_slots=(32 - 8) + (32 - 16),
        external_frag_slots=0,
        free_slots=16,
    )
    kv.free(a)  # free runs: blocks 0-7 and 16-19; the smaller one is external fragmentation
    u = kv.usage([b])
    assert (u.free_slots, u.external_frag_slots) == (48, 16)
    # First fit: a new request lands in the lowest free run that fits.
    c = request("c", 3, max_tokens=1)
    place(kv, c, 3)
    assert kv.block_table("c") == list(range(8))
    assert kv.usage([b, c]).external_frag_slots == 0
    # 16 slots free, but no run of 8 blocks: a request needing 32 slots cannot be placed.
    assert not kv.allocate_slots(request("d", 3), 3, 3)
    kv.free(b)  # runs 8-15 and 16-19 merge
    assert kv.usage([c]) == KVUsage(80, 3, 1, 28, 0, 48)
    assert kv.block_table("c") == list(range(8))
    place(kv, request("d", 3), 3)
    assert kv.block_table("d") == list(range(8, 16))


def test_naive_pow2_and_oracle() -> None:
    kv = NaiveKVCache(KVCacheContext(16, 4, max_model_len=64), reservation="pow2")
    a = request("a", 5, max_tokens=6)  # final 11 -> 16 slots = 4 blocks
    place(kv, a, 5)
    assert kv.usage([a]) == KVUsage(64, 5, 6, 5, 0, 48)
    kv = NaiveKVCache(KVCacheContext(16, 4, max_model_len=64), reservation="oracle")
    a = request("a", 5, max_tokens=9, expected_output_len=6)  # final 11 -> 3 blocks (12 slots)
    place(kv, a, 5)
    assert kv.usage([a]) == KVUsage(64, 5, 6, 1, 0, 52)
    a.output_token_ids += [7] * 6
    a.num_computed_tokens = 11
    assert kv.usage([a]) == KVUsage(64, 11, 0, 1, 0, 52)


def test_paged_counts_the_last_block_tail_as_internal_fragmentation() -> None:
    kv = PagedKVCache(KVCacheContext(10, 4))
    a, b = request("a", 10), request("b", 4)
    place(kv, a, 10)  # 3 blocks: 10 tokens + 2 empty slots
    place(kv, b, 4)  # 1 full block
    assert kv.usage([a, b]) == KVUsage(40, 14, 0, 2, 0, 24)


def test_paged_counts_shared_blocks_once() -> None:
    kv = PagedKVCache(KVCacheContext(10, 4))
    parent, child = request("p", 10), request("c", 10)
    place(kv, parent, 10)
    assert kv.fork(parent, child, 9)
    child.num_computed_tokens = 9
    assert kv.usage([parent, child]) == KVUsage(40, 10, 0, 2, 0, 28)


@pytest.mark.parametrize("kvcache", ["paged", "naive"])
def test_steps_parquet_columns_add_up(kvcache: str, tmp_path: Path) -> None:
    llm = LLM(
        "model=synthetic",
        f"kvcache={kvcache}",
        "kvcache.block_size=4",
        "kvcache.num_blocks=64",
        "engine.max_model_len=64",
    )
    prompts = [list(range(40, 40 + 3 + 5 * i)) for i in range(6)]
    llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    steps = llm.engine.recorder.steps_frame()
    path = tmp_path / "steps.parquet"
    steps.to_parquet(path)
    import pandas as pd

    steps = pd.read_parquet(path)
    parts = ["kv_token_slots", "kv_reserved_slots", "kv_internal_frag_slots", "kv_free_slots"]
    assert (steps[parts].sum(axis=1) == steps["kv_total_slots"]).all()
    assert (steps["kv_external_frag_slots"] <= steps["kv_free_slots"]).all()
    assert steps["kv_token_slots"].max() > 0
    if kvcache == "naive":
        assert steps["kv_internal_frag_slots"].max() > steps["kv_token_slots"].max()  # max reservation
    else:
        assert (steps["kv_reserved_slots"] == 0).all() and (steps["kv_internal_frag_slots"] < 4 * 6).all()
