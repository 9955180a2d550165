"""Each model family against transformers on a random checkpoint made here (``family_fixtures``):
prefill logits within float32 tolerance, and 40-token greedy continuations identical through the
engine with paged KV, chunked prefill and preemption (windowed families past their window)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from family_fixtures import GGUF_ARCH, SIZES, FamilySpec, reference_on, write_checkpoint, write_gguf
from forward_helpers import greedy, prefill_logits
from gguf import GGMLQuantizationType
from gguf_fixtures import CORPUS

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.models.base import Model, ModelDims
from forge.models.gguf_file import GGUFError
from forge.models.gguf_loader import load_gguf
from forge.models.presets import model_dims
from forge.models.safetensors_loader import CheckpointError, load_safetensors
from forge.sim.cost_model import BatchShape, hardware_preset
from forge.sim.roofline import RooflineCostModel

# head_dim 16: 8 frequencies; served up to original_max_position_embeddings with the short factors
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0, 3.0, 1.0, 4.0, 1.2, 2.5], "long_factor": [8.0] * 8}
FAMILIES = [
    FamilySpec("qwen3", {"head_dim": 24}),  # attention width 96 != hidden 64
    FamilySpec("mistral", {"sliding_window": 16}),  # prompts and continuations run past the window
    FamilySpec("qwen2", {"tie_word_embeddings": True}),  # QKV bias
    FamilySpec("mixtral", {"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 24}),
    FamilySpec("phi3", {"sliding_window": 20}),  # fused qkv_proj and gate_up_proj
    FamilySpec("phi3", {"rope_scaling": LONGROPE, "original_max_position_embeddings": 128}, label="phi3-longrope"),
]
NEW_TOKENS = 40
# 8-token blocks, a 16-token step budget (chunked prefill) and a pool that cannot hold every
# request at once (preemption by recompute); windowed layers free the blocks before their window
# (the hybrid allocator), so for them a 6-block pool (their window and a chunk: 5 or 6 blocks)
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
    assert model.max_position == min(
        json.loads((directory / "config.json").read_text()).get(
            "original_max_position_embeddings", SIZES["max_position_embeddings"]
        ),
        SIZES["max_position_embeddings"],
    )
    windowed = any(w is not None for w in model.layer_windows())
    engine = build_engine(compose_config([*ENGINE, *(["kvcache.num_blocks=6"] if windowed else [])]), model=model)
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


def test_dims_count_every_weight(checkpoint: tuple[Path, Any]) -> None:
    """``ModelDims.num_params``: the reference's weight matrices (every expert's), norms and biases aside."""
    directory, reference = checkpoint
    model = load_safetensors(str(directory))
    weights = sum(p.numel() for p in reference.parameters() if p.dim() >= 2)
    tied = model.config.tie_word_embeddings
    assert model.dims.num_params == weights + (model.vocab_size * model.config.hidden_size if tied else 0)
    assert model.dims == ModelDims.of(model.config, bytes_per_param=4)


def test_simulated_clock_charges_active_experts_only() -> None:
    dims = model_dims("mixtral-8x7b")
    assert round(dims.num_params / 1e9, 1) == 46.7 and round(dims.active_params / 1e9, 1) == 12.9
    hw = hardware_preset("a100")
    sparse = RooflineCostModel(dims, hw)
    dense = RooflineCostModel(dataclasses.replace(dims, experts_per_token=dims.num_experts), hw)
    prefill = BatchShape([4096], [4096], 1)  # compute-bound: the active experts' FLOPs
    decode = BatchShape([1], [512], 1)  # memory-bound: every expert's weights are read
    assert sparse.step_time(prefill) < 0.4 * dense.step_time(prefill)
    assert sparse.step_time(decode) == pytest.approx(dense.step_time(decode))


REFUSED = [
    ({"model_type": "gpt_bigcode"}, "model_type 'gpt_bigcode' is not supported"),
    ({"model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
    ({"model_type": "llama", "rope_scaling": {**LONGROPE, "original_max_position_embeddings": 64}}, "'longrope'"),
    ({"model_type": "phi3", "rope_scaling": {"type": "su", "long_factor": [1.0]}}, "longrope needs"),
    ({"model_type": "phi3", "partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16}, "use_sliding_window"),
    ({"model_type": "mistral", "hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok 3"),
]


@pytest.mark.parametrize(("settings", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_unsupported_settings_fail_at_load_naming_them(tmp_path: Path, settings: dict[str, Any], message: str) -> None:
    config = {**SIZES, "vocab_size": 400, **settings}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_safetensors(str(tmp_path))


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0], ids=lambda q: q.name)
def test_gguf_of_the_same_weights_matches_transformers(
    checkpoint: tuple[Path, Any], qtype: GGMLQuantizationType, tmp_path: Path
) -> None:
    directory, _ = checkpoint
    hf = json.loads((directory / "config.json").read_text())
    if hf["model_type"] not in GGUF_ARCH:
        pytest.skip(f"llama.cpp has no GGUF layout for {hf['model_type']} in forge")
    if hf.get("rope_parameters", {}).get("rope_type") == "longrope":
        pytest.skip("forge reads no LongRoPE factor tensors (rope_factors_short/long) from GGUF")
    encoded = write_gguf(tmp_path / "model.gguf", directory, qtype)
    model = load_gguf(str(tmp_path / "model.gguf"))
    from_hf = load_safetensors(str(directory))
    eps = from_hf.config.rms_norm_eps  # GGUF stores it as float32
    assert model.config.rms_norm_eps == pytest.approx(eps, rel=1e-6)
    assert dataclasses.replace(model.config, rms_norm_eps=eps) == from_hf.config
    quantized = reference_on(directory, encoded, tmp_path / "held")  # transformers on the weights the file holds
    exact = load_gguf(str(tmp_path / "model.gguf"), dtype="float64")
    for ids in prompts(model):
        with torch.no_grad():
            expected = quantized(torch.tensor([ids])).logits[0].float()
            tokens = quantized.generate(
                torch.tensor([ids]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False
            )
        torch.testing.assert_close(prefill_logits(model, ids), expected, rtol=0, atol=1e-4)
        assert greedy(exact, ids, NEW_TOKENS) == tokens[0, len(ids) :].tolist()


def test_mixtral_gguf_with_more_experts_per_token_than_experts_is_refused_naming_the_key(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, FamilySpec("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}))
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**hf, "num_experts_per_tok": 5}))
    write_gguf(tmp_path / "model.gguf", tmp_path, GGMLQuantizationType.F32)
    with pytest.raises(GGUFError, match=re.escape("llama.expert_used_count 5 not in 1..4")):
        load_gguf(str(tmp_path / "model.gguf"))
