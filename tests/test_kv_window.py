"""Sliding-window layers that free their KV blocks (the hybrid layout of ``forge.kvcache.paged``):
the same greedy tokens as keeping every block, fewer blocks held, no leaks."""

from __future__ import annotations

import random

import pytest
import torch

from forge.config import compose_config
from forge.core.kv_groups import KVCacheGroups, group_layers
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.engine import Engine
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.models.base import Model
from tests.forward_helpers import greedy
from tests.sched_helpers import request, scheduler, step
from tests.window_fixtures import tiny_gemma3

GEMMA3_270M = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))  # its 18 layers' windows


def test_gemma3_layers_form_one_full_and_five_windowed_groups_of_three() -> None:
    groups = group_layers(GEMMA3_270M)
    assert groups.windows == (None, 512, 512, 512, 512, 512)
    assert groups.layers_per_page == 3 and groups.pages_for(10) == 60
    assert [groups.layer_group[i] for i in (5, 11, 17)] == [0, 0, 0]
    pairs = sorted(zip(groups.layer_group, groups.layer_slot, strict=True))
    assert pairs == [(g, s) for g in range(6) for s in range(3)]
    assert group_layers((8, 8, 8)) == KVCacheGroups.single(3, 8) and group_layers((8, 8, 8)).is_hybrid
    assert not group_layers((None, None)).is_hybrid
    ragged = group_layers((4, None, 4, 4, None, 4, 4))  # 2 full layers, 5 windowed: the last group has one
    assert ragged.windows == (None, 4, 4, 4) and ragged.layers_per_page == 2


def test_a_long_request_holds_full_layers_whole_and_windowed_layers_only_their_window() -> None:
    """Gemma-3-270M's layout, a 2,048-token prompt then 64 decodes: after every step the pool's used
    pages are the full group's blocks plus, per windowed group, the blocks from the window's start."""
    bs, budget = 16, 256
    kv = PagedKVCache(KVCacheContext(160, bs, group_layers(GEMMA3_270M)))  # 6 x 160 pages of 3 layers
    sched = scheduler(kv=kv, budget=budget, max_model_len=4096)
    sched.add_request(request("long", 2048, max_tokens=64))
    most = 0
    for _ in range(2048 // budget + 64):
        so, _ = step(sched)
        if not sched.running:
            break
        (r,) = sched.running
        start = so.scheduled[0].start if so.scheduled else r.num_computed_tokens  # the step's first query
        end = -(-r.num_computed_tokens // bs)
        window = end - max(0, start - 512 + 1) // bs
        used = kv.num_blocks - kv.num_free_blocks()
        assert used == end + 5 * window
        assert window <= -(-(511 + budget) // bs) + 1
        most = max(most, used)
    assert most < 6 * 132 / 2  # under half the pages the whole context needs in every group
    assert not sched.num_unfinished and kv.num_free_blocks() == kv.num_blocks


def _engine(model: Model, *overrides: str) -> Engine:
    return build_engine(compose_config(["model=tiny", "kvcache.block_size=4", *overrides]), model=model)


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    requests = [Request(f"r{i}", p, params, arrival_time=0.0) for i, p in enumerate(prompts)]
    finals = engine.run(requests)
    return [list(finals[f"r{i}"].token_ids) for i in range(len(prompts))]


@pytest.fixture(scope="module")
def model() -> Model:
    return tiny_gemma3()


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 300) for _ in range(n)]


PROMPTS = [_prompt(i, n) for i, n in enumerate((5, 37, 30, 23))]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def test_tiny_windowed_model_gives_the_same_greedy_tokens_with_and_without_freeing(model: Model) -> None:
    """Windows of 10 over 4-token blocks; a 16-token budget chunks the prompts; the pool is small
    enough that keeping every block preempts. Freeing: the single-sequence tokens, fewer pages."""
    want = [greedy(model, p, GREEDY.max_tokens) for p in PROMPTS]
    common = ("engine.max_num_batched_tokens=16", "kvcache.num_blocks=36")
    kept = _engine(model, "kvcache.free_outside_window=false", *common)
    freed = _engine(model, *common)
    assert kept.scheduler.kv.kv_groups is None and freed.scheduler.kv.kv_groups is not None  # classic vs hybrid
    assert _run(kept, PROMPTS, GREEDY) == want
    assert _run(freed, PROMPTS, GREEDY) == want
    assert kept.scheduler.num_preemptions > freed.scheduler.num_preemptions
    assert freed.scheduler.kv.stats()["kv_window_freed_blocks"] > 0


SHARED = [[7] * 20 + p for p in PROMPTS]  # a common 20-token prefix: prefix-cache hits past the window
SAMPLED = SamplingParams(max_tokens=16, temperature=0.9, seed=3, n=2, ignore_eos=True)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(("kvcache.enable_prefix_caching=true", "engine.preemption_mode=swap"), id="prefix-cache+swap"),
        pytest.param(("drafter=ngram", "kvcache.enable_prefix_caching=true"), id="ngram-drafts+prefix-cache"),
    ],
)
def test_prefix_caching_swap_forks_and_drafts_give_the_same_tokens_with_freeing(
    model: Model, overrides: tuple[str, ...]
) -> None:
    """Seeded sampling with n=2 (forked children share the parent's pages), shared prefixes, and a
    pool small enough to preempt: the tokens do not depend on whether windows free their blocks."""
    common = ("engine.max_num_batched_tokens=24", "kvcache.num_blocks=40", *overrides)
    kept = _engine(model, "kvcache.free_outside_window=false", *common)
    freed = _engine(model, *common)
    for prompts, params in ((SHARED, GREEDY), (SHARED[:2], SAMPLED)):
        assert _run(freed, prompts, params) == _run(kept, prompts, params)
    stats = freed.scheduler.kv.stats()
    assert stats["kv_window_freed_blocks"] > 0 and stats["prefix_cache_hits"] > 0
    assert freed.scheduler.num_preemptions > 0 or kept.scheduler.num_preemptions > 0


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_the_native_backends_read_each_groups_pages(backend: str) -> None:
    """backend=cpu (forge's C decode kernel) and backend=cuda on its CPU execution layer (forge's CUDA C
    kernels, eager: several groups' tables are not captured in graphs) over the hybrid layout: the
    tokens of the classic layout that keeps every block (float32, on the same backend)."""
    from forge.kernels.cpu import native

    if backend == "cpu" and not native.available():
        pytest.skip("no C compiler for backend=cpu")
    model = tiny_gemma3(dtype=torch.float32)
    cuda = ["backend=cuda", "backend.device=cpu", "backend.runtime=cpu", "backend.cuda_graphs=false"]
    common = (
        *(["backend=cpu"] if backend == "cpu" else cuda),
        "engine.max_num_batched_tokens=16",
        "kvcache.num_blocks=36",
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    kept = _engine(model, "kvcache.free_outside_window=false", *common)
    freed = _engine(model, *common)
    assert freed.scheduler.kv.kv_groups is not None
    assert _run(freed, PROMPTS[1:3], params) == _run(kept, PROMPTS[1:3], params)


def test_auto_sized_pool_has_the_same_memory_and_holds_longer_requests(model: Model) -> None:
    """``kvcache.num_blocks=auto`` from 1 MiB: as many pages (2 layers each) as that memory holds, not
    classic blocks (6 layers each); one request may then grow longer (the 2 full layers hold every
    block, the 4 windowed ones a bounded ring), and the KV-usage metric of the same run is lower."""
    common = ("kvcache.num_blocks=auto", "engine.kv_cache_memory_gib=0.0009765625", "engine.max_num_batched_tokens=16")
    kept = _engine(model, "kvcache.free_outside_window=false", *common)
    freed = _engine(model, *common)
    per_block = 2 * 6 * 2 * 16 * 8 * 4  # K and V, 6 layers, 2 KV heads of 16, float64, 4 tokens
    assert kept.scheduler.kv.num_blocks == 2**20 // per_block
    assert freed.scheduler.kv.num_blocks == kept.scheduler.kv.num_blocks * 6 // 2
    ring = -(-(10 - 1 + 16) // 4) + 1  # a windowed group's blocks: its window and a 16-token chunk
    assert kept.scheduler.kv.token_capacity(16) == 4 * kept.scheduler.kv.num_blocks
    assert freed.scheduler.kv.token_capacity(16) == 4 * (freed.scheduler.kv.num_blocks - 2 * ring)  # 2.8x
    prompts = [_prompt(7, 60)]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert _run(freed, prompts, params) == _run(kept, prompts, params)
    peak = [e.recorder.steps_frame()["kv_usage"].max() for e in (kept, freed)]
    assert peak[1] < 0.6 * peak[0]  # 17 + 2 x 5 of 255 pages against 17 of 85 blocks


def test_window_memory_rows_compare_freeing_on_and_off(model: Model) -> None:
    """``experiments.window_memory.window_rows`` (the on/off rows of the KV memory study) on the toy model."""
    from experiments.window_memory import window_rows

    overrides = ["model=tiny", "kvcache.block_size=4", "kvcache.num_blocks=64", "engine.max_num_batched_tokens=16"]
    off, on = window_rows(overrides, context=40, new_tokens=4, model=model)
    assert on["same_tokens_as_off"] and len(on["tokens"]) == 4
    assert (off["last_pages_held"], off["page_kib"]) == (11, 6 * 4 * 2 * 2 * 16 * 8 / 1024)  # 44 tokens, 6 layers
    # the last decode computes position 42 (43 tokens): the full group holds blocks 0..10, each of the
    # two windowed groups (window 10) blocks 8..10, from position 42 - 10 + 1 = 33
    assert on["last_pages_held"] == 11 + 2 * 3
    assert on["page_kib"] == off["page_kib"] / 3  # a page holds 2 of the 6 layers
    assert on["last_kv_mib"] == pytest.approx(17 / 33 * off["last_kv_mib"])  # 17 pages of a third against 11 blocks
