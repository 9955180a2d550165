"""Each model family against transformers on a random checkpoint made here (``family_fixtures``):
prefill logits within float32 tolerance, and 40-token greedy continuations identical through the
engine with paged KV, chunked prefill and preemption (windowed families past their window)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from family_fixtures import FamilySpec, write_checkpoint
from forward_helpers import prefill_logits
from gguf_fixtures import CORPUS

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.models.base import Model
from forge.models.safetensors_loader import load_safetensors

FAMILIES = [
    FamilySpec("qwen3", {"head_dim": 24}),  # attention width 96 != hidden 64
    FamilySpec("mistral", {"sliding_window": 16}),  # prompts and continuations run past the window
    FamilySpec("qwen2", {"tie_word_embeddings": True}),  # QKV bias
]
NEW_TOKENS = 40
# 8-token blocks, a 16-token step budget (chunked prefill) and a pool that cannot hold every
# request at once (preemption by recompute)
ENGINE = [
    "model=tiny",
    "backend.num_threads=1",
    "engine.max_model_len=96",
    "scheduler=fcfs",
    "kvcache=paged",
    "kvcache.block_size=8",
    "kvcache.num_blocks=12",
    "engine.max_num_batched_tokens=16",
]


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda spec: spec.name)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    spec: FamilySpec = request.param
    directory = tmp_path_factory.mktemp(spec.name)
    return directory, write_checkpoint(directory, spec)


def prompts(model: Model) -> list[list[int]]:
    return [model.tokenizer.encode(text)[:40] for text in CORPUS]


def test_prefill_logits_match_transformers(checkpoint: tuple[Path, Any]) -> None:
    directory, reference = checkpoint
    model = load_safetensors(str(directory), dtype="float32")
    for ids in prompts(model):
        with torch.no_grad():
            expected = reference(torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(prefill_logits(model, ids), expected, rtol=0, atol=1e-4)


def test_greedy_through_engine_matches_transformers(checkpoint: tuple[Path, Any]) -> None:
    directory, reference = checkpoint
    model = load_safetensors(str(directory), dtype="float64")
    engine = build_engine(compose_config(ENGINE), model=model)
    batch = prompts(model)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    finals = engine.run([Request(f"r{i}", ids, params) for i, ids in enumerate(batch)])
    assert engine.scheduler.num_preemptions > 0
    for i, ids in enumerate(batch):
        with torch.no_grad():
            out = reference.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
        assert list(finals[f"r{i}"].token_ids) == out[0, len(ids) :].tolist(), f"prompt {i}"
