"""Dimensions of well-known transformers, for the simulated clock's cost model."""

from __future__ import annotations

from forge.models.base import ModelDims

MODEL_PRESETS: dict[str, ModelDims] = {
    "llama-3-8b": ModelDims(32, 4096, 32, 8, 128, 14336, 128256),
    "llama-2-7b": ModelDims(32, 4096, 32, 32, 128, 11008, 32000),
    "llama-2-13b": ModelDims(40, 5120, 40, 40, 128, 13824, 32000),
    # OPT-13B (vLLM paper): MHA, 2-matrix MLP of 20480 — expressed as a gated MLP of equal size (2/3 x 20480).
    "opt-13b": ModelDims(40, 5120, 40, 40, 128, 13653, 50272),
    "mistral-7b": ModelDims(32, 4096, 32, 8, 128, 14336, 32000),
    "smollm2-135m": ModelDims(30, 576, 9, 3, 64, 1536, 49152),
    "tinyllama-1.1b": ModelDims(22, 2048, 32, 4, 64, 5632, 32000),
    # 8 experts, 2 per token: 46.7B parameters held, 12.9B computed with per token
    "mixtral-8x7b": ModelDims(32, 4096, 32, 8, 128, 14336, 32000, num_experts=8, experts_per_token=2),
}


def model_dims(name: str) -> ModelDims:
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model dims preset {name!r}; known: {sorted(MODEL_PRESETS)}") from None
