"""A toy Gemma-3 (seeded random weights, byte tokenizer, float64) whose layers mix full attention and
sliding windows: the hybrid KV cache's test model (Gemma-3's real layout at toy size)."""

from __future__ import annotations

import math

import torch

from forge.models.gemma3 import Gemma3, Gemma3Config
from forge.tokenizers.base import ByteTokenizer


def tiny_gemma3_config(window: int = 10, pattern: int = 3, num_layers: int = 6) -> Gemma3Config:
    """Every ``pattern``-th layer global, the others attend to their last ``window`` positions."""
    return Gemma3Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16.0,
        sliding_window=window,
        sliding_window_pattern=pattern,
        max_position=1024,
        tie_word_embeddings=False,
    )


def tiny_gemma3(
    seed: int = 0,
    window: int = 10,
    pattern: int = 3,
    num_layers: int = 6,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
) -> Gemma3:
    config = tiny_gemma3_config(window, pattern, num_layers)
    g = torch.Generator().manual_seed(seed)
    hs, d = config.hidden_size, config.head_dim

    def rnd(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g, dtype=torch.float64) / math.sqrt(in_f)

    def norm(n: int) -> torch.Tensor:
        return 0.1 * torch.randn(n, generator=g, dtype=torch.float64)

    state = {"model.embed_tokens.weight": torch.randn(config.vocab_size, hs, generator=g, dtype=torch.float64) / 8}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, rows in (("q", config.num_heads * d), ("k", config.num_kv_heads * d), ("v", config.num_kv_heads * d)):
            state[p + f"self_attn.{name}_proj.weight"] = rnd(rows, hs)
        state[p + "self_attn.o_proj.weight"] = rnd(hs, config.num_heads * d)
        state[p + "mlp.gate_proj.weight"] = rnd(config.intermediate_size, hs)
        state[p + "mlp.up_proj.weight"] = rnd(config.intermediate_size, hs)
        state[p + "mlp.down_proj.weight"] = rnd(hs, config.intermediate_size)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm"):
            state[p + f"{name}.weight"] = norm(hs)
        state[p + "post_feedforward_layernorm.weight"] = norm(hs)
        state[p + "self_attn.q_norm.weight"] = norm(d)
        state[p + "self_attn.k_norm.weight"] = norm(d)
    state["model.norm.weight"] = norm(hs)
    state["lm_head.weight"] = 4.0 * rnd(config.vocab_size, hs)
    return Gemma3.from_state_dict(config, state, ByteTokenizer(config.vocab_size), dtype, device)
