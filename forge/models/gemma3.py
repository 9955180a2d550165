"""Gemma 3 (the text model) over a paged KV cache.

What differs from ``forge.models.llama`` (each as in transformers' ``Gemma3ForCausalLM``):

- the token embeddings are multiplied by ``sqrt(hidden_size)`` (rounded to the model dtype);
- RMSNorm multiplies by ``1 + weight``: checkpoints in Hugging Face naming store ``weight``
  (llama.cpp's converter stores ``1 + weight``; the GGUF loader subtracts the 1 again, as
  transformers does), and ``from_state_dict`` folds the 1 back in, in float32;
- four norms per layer: before attention, after attention (before the residual add), before the
  MLP and after the MLP; and RMSNorm over each head of q and k (QK-norm) before the rotary embedding;
- GeGLU MLP (``gelu`` with the tanh approximation, gated);
- attention scaled by ``query_pre_attn_scalar ** -0.5`` rather than ``head_dim ** -0.5``;
- local layers attend to a sliding window of the last ``sliding_window`` positions, with their own
  rotary base (10k); every ``sliding_window_pattern``-th layer is global (full context, rotary base
  and scaling from the config);
- optional final logit soft-capping ``tanh(logits / cap) * cap``; tied embeddings by default.

The linear weights reuse Llama's layout (``[in, out]``, QKV and gate/up fused); the KV cache holds
every layer's full context (windowed layers read only its end; no memory is saved on them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.kernels.base import KernelBackend, KVLayer, KVSpec
from forge.models.base import ForwardBatch, Model, ModelDims
from forge.models.llama import LinearWeight, apply_linear, rope_cos_sin
from forge.tokenizer import Tokenizer


@dataclass(frozen=True)
class Gemma3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    query_pre_attn_scalar: float
    sliding_window: int
    sliding_window_pattern: int = 6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0  # global layers
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)  # global layers
    rope_local_theta: float = 10_000.0
    final_logit_softcapping: float | None = None
    max_position: int = 32768
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.sliding_window < 1 or self.sliding_window_pattern < 1:
            raise ValueError("sliding_window and sliding_window_pattern must be >= 1")

    def is_sliding(self, layer: int) -> bool:
        """Local (sliding-window) layer? Every ``sliding_window_pattern``-th layer is global."""
        return (layer + 1) % self.sliding_window_pattern != 0


@dataclass
class Gemma3Layer:
    attn_norm: torch.Tensor  # all norms hold the multiplier 1 + weight
    wqkv: LinearWeight
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    wo: LinearWeight
    post_attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: LinearWeight
    w_down: LinearWeight
    post_mlp_norm: torch.Tensor
    window: int | None  # sliding window of this layer, None for global layers


class Gemma3(Model):
    def __init__(
        self,
        config: Gemma3Config,
        layers: list[Gemma3Layer],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: LinearWeight,
        tokenizer: Tokenizer,
    ) -> None:
        self.config = config
        self.layers = layers
        self.embed = embed
        self.norm = norm
        self.lm_head = lm_head
        self.tokenizer = tokenizer
        self.vocab_size = config.vocab_size
        self.max_position = config.max_position
        self.dtype = embed.dtype
        # transformers keeps the scale as a float32 tensor and casts it to the weights' dtype
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(embed.dtype)
        table_dtype = torch.float32 if embed.dtype != torch.float64 else embed.dtype
        local = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
        self.cos_sin_local = rope_cos_sin(local, table_dtype, embed.device)
        self.cos_sin_global = rope_cos_sin(config, table_dtype, embed.device)
        self.kv_spec = KVSpec(config.num_layers, config.num_kv_heads, config.head_dim, embed.dtype)
        self.dims = ModelDims.of(config, bytes_per_param=embed.element_size())

    @classmethod
    def from_state_dict(
        cls,
        config: Gemma3Config,
        state: dict[str, torch.Tensor],
        tokenizer: Tokenizer,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Gemma3:
        """Build from Hugging Face-named tensors (``[out, in]`` linear weights, norms as ``weight``
        of ``x * (1 + weight)``)."""

        def raw(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint lacks tensor {name!r}")
            return state[name]

        def get(name: str) -> torch.Tensor:
            return raw(name).to(device=device, dtype=dtype)

        def t(name: str) -> torch.Tensor:
            return get(name).t().contiguous()

        def norm(name: str) -> torch.Tensor:  # as Gemma3RMSNorm: 1 + weight in float32
            return (1.0 + raw(name).float()).to(device=device, dtype=dtype)

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            layers.append(
                Gemma3Layer(
                    attn_norm=norm(p + "input_layernorm.weight"),
                    wqkv=torch.cat([t(p + f"self_attn.{n}_proj.weight") for n in "qkv"], dim=1).contiguous(),
                    q_norm=norm(p + "self_attn.q_norm.weight"),
                    k_norm=norm(p + "self_attn.k_norm.weight"),
                    wo=t(p + "self_attn.o_proj.weight"),
                    post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                    mlp_norm=norm(p + "pre_feedforward_layernorm.weight"),
                    w_gate_up=torch.cat([t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")], 1).contiguous(),
                    w_down=t(p + "mlp.down_proj.weight"),
                    post_mlp_norm=norm(p + "post_feedforward_layernorm.weight"),
                    window=config.sliding_window if config.is_sliding(i) else None,
                )
            )
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            # One copy of the vocabulary, stored [hidden, vocab] for the LM head GEMM (twice as fast
            # there as a transposed view); the embedding lookup reads its columns through a view.
            lm_head = t("model.embed_tokens.weight")
            embed = lm_head.t()
        else:
            embed, lm_head = get("model.embed_tokens.weight"), t("lm_head.weight")
        return cls(config, layers, embed, norm("model.norm.weight"), lm_head, tokenizer)

    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor:
        cfg = self.config
        eps = cfg.rms_norm_eps
        nq, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        scale = cfg.query_pre_attn_scalar**-0.5
        meta = batch.attn
        h = self.embed.index_select(0, batch.input_ids) * self.embed_scale
        residual = h
        x = backend.rms_norm(h, self.layers[0].attn_norm, eps)
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches, strict=True)):
            qkv = apply_linear(backend, x, layer.wqkv)
            q, k, v = qkv.split((nq * d, nkv * d, nkv * d), dim=-1)
            q = backend.rms_norm(q.reshape(-1, nq, d), layer.q_norm, eps)
            k = backend.rms_norm(k.reshape(-1, nkv, d), layer.k_norm, eps)
            cos_sin = self.cos_sin_global if layer.window is None else self.cos_sin_local
            q, k = backend.rope(q, k, batch.positions, cos_sin)
            backend.write_kv(kv, k, v.reshape(-1, nkv, d), meta.slot_mapping)
            attn = backend.attention(q, kv, meta, scale, window=layer.window)
            h = backend.rms_norm(apply_linear(backend, attn.reshape(-1, nq * d), layer.wo), layer.post_attn_norm, eps)
            x, residual = backend.add_rms_norm(h, residual, layer.mlp_norm, eps)
            gate_up = apply_linear(backend, x, layer.w_gate_up)
            h = backend.rms_norm(apply_linear(backend, backend.gelu_tanh_mul(gate_up), layer.w_down),
                                 layer.post_mlp_norm, eps)
            if i + 1 < len(self.layers):
                x, residual = backend.add_rms_norm(h, residual, self.layers[i + 1].attn_norm, eps)
        rows = batch.logits_indices
        x, _ = backend.add_rms_norm(h.index_select(0, rows), residual.index_select(0, rows), self.norm, eps)
        logits = apply_linear(backend, x, self.lm_head).float()
        if cfg.final_logit_softcapping is not None:
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits
