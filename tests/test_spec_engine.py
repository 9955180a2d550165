"""Speculative decoding inside continuous batching: greedy outputs equal non-speculative greedy
outputs for every request, across drafters, schedulers, caches, mixed batches and preemption."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from forge import LLM, SamplingParams
from forge.config import compose_config
from forge.core.request import Request
from forge.engine.build import build_engine
from forge.engine.engine import Engine
from forge.main import run_offline
from forge.models.synthetic import SyntheticModel
from forge.spec.draft_model import DraftModelDrafter

TEXT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
PROMPTS = [
    TEXT * 2,
    "the cat sat on the mat; the cat sat on the",
    "abcabcabcabcabc",
    "Speculative decoding verifies drafts.",
    "x",
    TEXT + "def mul(a, b):\n    return a",
]
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SAMPLED = SamplingParams(max_tokens=16, temperature=0.8, top_k=20, seed=3)
# Requests 4 (one token, nothing to draft) and 5 (sampled) never / differently speculate.
PARAMS = [GREEDY, GREEDY, GREEDY, GREEDY, SamplingParams(max_tokens=1, temperature=0.0), SAMPLED]
DRAFTERS = {
    "ngram": ["drafter=ngram"],
    "draft_model": ["drafter=draft_model", "drafter.num_speculative_tokens=3"],
}


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return [o.token_ids for o in LLM("model=tiny").generate(PROMPTS, PARAMS)]


def _run(*overrides: str) -> tuple[list[list[int]], Engine]:
    llm = LLM("model=tiny", *overrides)
    return [o.token_ids for o in llm.generate(PROMPTS, PARAMS)], llm.engine


def _assert_greedy_equal(got: list[list[int]], ref: list[list[int]]) -> None:
    for i, params in enumerate(PARAMS):
        if params.greedy:
            assert got[i] == ref[i], f"request {i} differs"


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
@pytest.mark.parametrize("scheduler", ["fcfs", "priority"])
@pytest.mark.parametrize("kvcache", ["paged", "naive"])
def test_greedy_with_speculation_equals_greedy_without(
    reference: list[list[int]], drafter: str, scheduler: str, kvcache: str
) -> None:
    got, engine = _run(*DRAFTERS[drafter], f"scheduler={scheduler}", f"kvcache={kvcache}", "engine.max_model_len=256")
    _assert_greedy_equal(got, reference)
    stats = engine.spec_stats
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens
    assert len(got[4]) == 1


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_greedy_equal_with_preemption_in_the_middle(drafter: str) -> None:
    """Every prompt fits the 80-block cache at once (one step admits them all), their outputs do not."""
    params = [SamplingParams(max_tokens=40, temperature=0.0)] * len(PROMPTS)
    ref = [o.token_ids for o in LLM("model=tiny").generate(PROMPTS, params)]
    llm = LLM("model=tiny", *DRAFTERS[drafter], "kvcache.num_blocks=80", "kvcache.block_size=4")
    assert [o.token_ids for o in llm.generate(PROMPTS, params)] == ref
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.spec_stats.num_accepted_tokens > 0


def test_small_token_budget_cuts_drafts_instead_of_splitting_them(reference: list[list[int]]) -> None:
    got, engine = _run("drafter=ngram", "engine.max_num_batched_tokens=8")
    _assert_greedy_equal(got, reference)
    assert engine.spec_stats.num_accepted_tokens > 0


@pytest.mark.parametrize("drafter", sorted(DRAFTERS))
def test_sampled_requests_are_reproducible_and_batch_independent(drafter: str) -> None:
    alone = LLM("model=tiny", *DRAFTERS[drafter]).generate(PROMPTS[5], SAMPLED)[0].token_ids
    got, engine = _run(*DRAFTERS[drafter])
    assert got[5] == alone  # same draws in another batch and another engine: reproducible too
    assert engine.spec_stats.num_drafts > 0


def test_draft_model_survives_aborts_and_leaves_nothing_behind() -> None:
    llm = LLM("model=tiny", *DRAFTERS["draft_model"])
    engine = llm.engine
    for i, prompt in enumerate(PROMPTS[:4]):
        engine.add_request(Request(f"r{i}", llm.tokenizer.encode(prompt), GREEDY))
    for _ in range(3):
        engine.step()
    drafter = engine.drafter
    assert drafter is not None and drafter.num_tracked() == 4
    assert engine.abort("r1") and engine.abort("r2")
    assert drafter.num_tracked() == 2
    while engine.has_unfinished():
        engine.step()
    engine.check_idle()
    assert isinstance(drafter, DraftModelDrafter) and drafter.kv.num_free_blocks() == drafter.kv.num_blocks


def test_synthetic_model_drafting_for_synthetic_target() -> None:
    overrides = ["model=synthetic", "clock=simulated", "model.repetitiveness=0.7"]
    prompts = [[40 + (i * 7 + j) % 30 for j in range(20 + i)] for i in range(6)]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(*overrides).generate(prompts, params)]
    base = build_engine(compose_config(overrides))
    draft = SyntheticModel(seed=0, repetitiveness=1.0)
    drafter = DraftModelDrafter(draft, base.runner.backend, num_speculative_tokens=4, num_blocks=64, block_size=8)
    engine = Engine(base.scheduler, base.runner, base.clock, drafter=drafter)
    requests = [Request(f"s{i}", p, params) for i, p in enumerate(prompts)]
    finals = engine.run(requests)
    assert [finals[r.request_id].token_ids for r in requests] == ref
    assert 0 < engine.spec_stats.acceptance_rate < 1


def test_run_offline_reports_speculation(tmp_path: Path) -> None:
    cfg = compose_config(
        [
            "model=synthetic",
            "model.repetitiveness=0.9",
            "clock=simulated",
            "workload=fixed",
            "workload.num_requests=8",
            "workload.input_len.value=64",
            "workload.output_len.value=64",
            "drafter=ngram",
            "report=false",
            "progress=false",
        ]
    )
    summary = run_offline(cfg, tmp_path)
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert summary == {**json.loads((tmp_path / "summary.json").read_text())}
    assert summary["spec_num_draft_tokens"] == steps["num_draft_tokens"].sum() > 0
    assert summary["spec_num_accepted_tokens"] == steps["num_accepted_tokens"].sum() > 0
    assert summary["total_output_tokens"] == 8 * 64
    assert 0 < summary["spec_acceptance_rate"] < 1
    assert len(summary["spec_acceptance_per_position"]) == 5


def test_seeded_sampling_with_ngram_drafts_does_not_depend_on_the_pool() -> None:
    """A 13-block pool preempts; a seeded sampled request still emits the tokens it emits with the
    auto-sized pool, and the ones it emits with no drafter at all."""
    prompts = [f"the cat sat on the mat {i} the cat sat on the mat {i} the cat" for i in range(8)]
    params = [SamplingParams(max_tokens=24, temperature=0.8, seed=i) for i in range(8)]
    auto = [o.token_ids for o in LLM("model=tiny", "drafter=ngram").generate(prompts, params)]
    small = LLM("model=tiny", "drafter=ngram", "kvcache.num_blocks=13")
    assert [o.token_ids for o in small.generate(prompts, params)] == auto
    assert small.engine.scheduler.num_preemptions > 0 and small.engine.spec_stats.num_accepted_tokens > 0
    assert [o.token_ids for o in LLM("model=tiny").generate(prompts, params)] == auto


def test_seeded_sampling_with_a_draft_model_does_not_depend_on_the_pool() -> None:
    """The draft model draws with the target's generator at each position and verification emits
    the target's own draws: a seeded request's tokens are the same with a preempting 13-block pool,
    the auto pool and no drafter, and the coupled drafts are still accepted."""
    prompts = [f"speculate {i} with a draft model" for i in range(8)]
    params = [SamplingParams(max_tokens=24, temperature=0.8, seed=i) for i in range(8)]
    auto = LLM("model=tiny", "drafter=draft_model")
    tokens = [o.token_ids for o in auto.generate(prompts, params)]
    small = LLM("model=tiny", "drafter=draft_model", "kvcache.num_blocks=13")
    assert [o.token_ids for o in small.generate(prompts, params)] == tokens
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in LLM("model=tiny").generate(prompts, params)] == tokens
    stats = auto.engine.spec_stats
    assert stats.num_accepted_tokens > 0.5 * stats.num_draft_tokens
