"""Phi-3 over a paged KV cache: Llama's math with the projections stored fused (``qkv_proj`` is
q|k|v, ``gate_up_proj`` is gate|up, as forge's skeleton keeps them anyway) and an optional sliding
window on every layer, as transformers' ``Phi3ForCausalLM`` computes it.

The family is a ``Llama``: ``from_state_dict`` splits the fused checkpoint tensors into Llama's
names. LongRoPE (``rope_scaling`` type ``longrope``, or ``su`` in older configs) divides each rotary
frequency by a factor and scales cos/sin by an attention factor; transformers switches from the
``short_factor`` list to the ``long_factor`` one once the longest sequence *in the batch* passes
``original_max_position_embeddings``, which would make a request's output depend on its batch
neighbours. forge serves such a model up to ``original_max_position_embeddings`` (its context is
capped there) with the short factors, where both agree. ``PHI3`` tells the loaders how ``phi3``
directories and GGUF files (``attn_qkv``, and ``ffn_up`` holding gate|up) give its config and tensors.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from forge.models.family import CheckpointError, GGUFFormat, HFFormat, ModelFamily
from forge.models.hf_config import decoder_fields, sliding_window
from forge.models.llama import Llama, LlamaConfig, config_from_gguf
from forge.tokenizers.base import Tokenizer


def split_fused(config: LlamaConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with each layer's ``qkv_proj`` and ``gate_up_proj`` split into Llama's names."""
    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    out = dict(state)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for fused, parts, sizes in (
            ("self_attn.qkv_proj.weight", ("q", "k", "v"), (q_rows, kv_rows, kv_rows)),
            ("mlp.gate_up_proj.weight", ("gate", "up"), (config.intermediate_size,) * 2),
        ):
            if p + fused not in out:
                raise KeyError(f"checkpoint lacks tensor {p + fused!r}")
            weight = out.pop(p + fused)
            if weight.shape[0] != sum(sizes):
                raise KeyError(f"tensor {p + fused!r} has {weight.shape[0]} rows, the config gives {sum(sizes)}")
            prefix = p + fused.split(".")[0] + "."
            for name, piece in zip(parts, weight.split(sizes), strict=True):
                out[f"{prefix}{name}_proj.weight"] = piece
    return out


def from_state_dict(
    config: LlamaConfig,
    state: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Llama:
    """A ``Llama`` from Phi-3's Hugging Face-named tensors (fused ``qkv_proj`` and ``gate_up_proj``)."""
    return Llama.from_state_dict(config, split_fused(config, state), tokenizer, dtype, device)


LONGROPE_TYPES = ("longrope", "su")


def config_from_hf(hf: dict[str, Any], directory: str = "", max_position: int | None = None) -> LlamaConfig:
    """The config of a ``phi3`` ``config.json`` (LongRoPE as the module doc says)."""
    fields = decoder_fields(hf, directory, max_position, rope_types=LONGROPE_TYPES)
    rope = fields["rope_scaling"]
    if rope is not None and rope.get("rope_type", rope.get("type")) in LONGROPE_TYPES:
        fields["rope_scaling"], original = short_longrope(rope, hf, directory)
        fields["max_position"] = min(fields["max_position"], original)
    return LlamaConfig(**fields, sliding_window=sliding_window(hf, directory))


def short_longrope(rope: dict[str, Any], hf: dict[str, Any], directory: str) -> tuple[dict[str, Any], int]:
    """LongRoPE's regime up to ``original_max_position_embeddings`` as forge's ``freq_factors``
    scaling (``short_factor`` divisors, transformers' attention factor), and that length."""
    original = int(rope.get("original_max_position_embeddings") or hf.get("original_max_position_embeddings") or 0)
    if original < 1 or not rope.get("short_factor"):
        raise CheckpointError(f"{directory}: longrope needs original_max_position_embeddings and short_factor")
    factor = float(rope.get("factor") or int(hf.get("max_position_embeddings", original)) / original)
    attention = rope.get("attention_factor")
    if attention is None:
        attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    scaling = {"rope_type": "freq_factors", "factors": list(rope["short_factor"]), "attention_factor": float(attention)}
    return scaling, original


GGUF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

PHI3 = ModelFamily(
    name="phi3",
    build=from_state_dict,
    gguf=GGUFFormat(("phi3",), config_from_gguf, GGUF_LAYER_NAMES),
    hf=HFFormat(("phi3",), config_from_hf),
)
