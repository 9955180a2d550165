"""The Llama family (Llama 2/3, TinyLlama, SmolLM2, Qwen2-style QKV bias) over a paged KV cache.

Weights arrive in Hugging Face naming (``model.layers.0.self_attn.q_proj.weight``...) from
any loader; ``Llama.from_state_dict`` fuses QKV and gate/up and stores every linear weight
``[in, out]`` (K x N contiguous), which CPU sgemm runs fastest for small batches.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from forge.kernels.base import KernelBackend, KVLayer, KVSpec
from forge.models.base import ForwardBatch, Model, ModelDims
from forge.tokenizer import ByteTokenizer, Tokenizer


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    max_position: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")


class PackedLinear(ABC):
    """A linear weight kept in a backend-specific packed format (``forge.models.fast_weights``);
    ``packed(x)`` computes ``x @ weight``. Plain tensors go through ``backend.linear``."""

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


LinearWeight = torch.Tensor | PackedLinear


def apply_linear(backend: KernelBackend, x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    return weight(x) if isinstance(weight, PackedLinear) else backend.linear(x, weight)


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor
    wqkv: LinearWeight
    bqkv: torch.Tensor | None
    wo: LinearWeight
    mlp_norm: torch.Tensor
    w_gate_up: LinearWeight
    w_down: LinearWeight


class RopeParams(Protocol):
    """What a rotary table is built from (a ``LlamaConfig`` is one)."""

    @property
    def head_dim(self) -> int: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def rope_scaling(self) -> dict[str, Any] | None: ...
    @property
    def max_position(self) -> int: ...


def rope_inv_freq(config: RopeParams) -> torch.Tensor:
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(mid, scaled, inv_freq)
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "freq_factors":  # llama.cpp's ``rope_freqs`` tensor: one divisor per frequency
        factors = torch.tensor(scaling["factors"], dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope freq_factors has {factors.numel()} entries, head_dim/2 is {inv_freq.numel()}")
        inv_freq = inv_freq / factors
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv_freq


def rope_cos_sin(config: RopeParams, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[max_position, head_dim]``: cos of each frequency, then sin."""
    t = torch.arange(config.max_position, dtype=torch.float64)
    freqs = torch.outer(t, rope_inv_freq(config))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype=dtype, device=device)


class Llama(Model):
    def __init__(
        self,
        config: LlamaConfig,
        layers: list[LlamaLayer],
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
        self.cos_sin = rope_cos_sin(
            config, torch.float32 if embed.dtype != torch.float64 else embed.dtype, embed.device
        )
        self.kv_spec = KVSpec(config.num_layers, config.num_kv_heads, config.head_dim, embed.dtype)
        self.dims = ModelDims.of(config, bytes_per_param=embed.element_size())

    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state: dict[str, torch.Tensor],
        tokenizer: Tokenizer,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Llama:
        """Build from Hugging Face-named tensors (``[out, in]`` linear weights)."""

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint lacks tensor {name!r}")
            return state[name].to(device=device, dtype=dtype)

        def t(name: str) -> torch.Tensor:
            return get(name).t().contiguous()

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            wqkv = torch.cat([t(p + f"self_attn.{n}_proj.weight") for n in "qkv"], dim=1)
            bqkv = None
            if config.attention_bias:
                bqkv = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            layers.append(
                LlamaLayer(
                    attn_norm=get(p + "input_layernorm.weight"),
                    wqkv=wqkv.contiguous(),
                    bqkv=bqkv,
                    wo=t(p + "self_attn.o_proj.weight"),
                    mlp_norm=get(p + "post_attention_layernorm.weight"),
                    w_gate_up=torch.cat([t(p + "mlp.gate_proj.weight"), t(p + "mlp.up_proj.weight")], 1).contiguous(),
                    w_down=t(p + "mlp.down_proj.weight"),
                )
            )
        embed = get("model.embed_tokens.weight")
        head_name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        if head_name not in state:
            head_name = "model.embed_tokens.weight"
        lm_head = t(head_name)
        return cls(config, layers, embed, get("model.norm.weight"), lm_head, tokenizer)

    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor:
        cfg = self.config
        eps = cfg.rms_norm_eps
        nq, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        scale = d**-0.5
        meta = batch.attn
        h = self.embed.index_select(0, batch.input_ids)  # cheaper than advanced indexing, same rows
        residual: torch.Tensor | None = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            if residual is None:
                residual = h
                x = backend.rms_norm(h, layer.attn_norm, eps)
            else:
                x, residual = backend.add_rms_norm(h, residual, layer.attn_norm, eps)
            qkv = apply_linear(backend, x, layer.wqkv)
            if layer.bqkv is not None:
                qkv = qkv + layer.bqkv
            q, k, v = qkv.split((nq * d, nkv * d, nkv * d), dim=-1)
            q, k = backend.rope(q.view(-1, nq, d), k.view(-1, nkv, d), batch.positions, self.cos_sin)
            backend.write_kv(kv, k, v.view(-1, nkv, d), meta.slot_mapping)
            attn = backend.attention(q, kv, meta, scale)
            h = apply_linear(backend, attn.reshape(-1, nq * d), layer.wo)
            x, residual = backend.add_rms_norm(h, residual, layer.mlp_norm, eps)
            gate_up = apply_linear(backend, x, layer.w_gate_up)
            h = apply_linear(backend, backend.silu_mul(gate_up), layer.w_down)
        assert residual is not None
        rows = batch.logits_indices
        x, _ = backend.add_rms_norm(h.index_select(0, rows), residual.index_select(0, rows), self.norm, eps)
        return apply_linear(backend, x, self.lm_head).float()


def random_state_dict(config: LlamaConfig, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights in Hugging Face naming, scaled so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    hs, d = config.hidden_size, config.head_dim

    def rnd(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=g, dtype=torch.float64) / math.sqrt(in_f)

    def norm_w() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hs, generator=g, dtype=torch.float64)

    state = {"model.embed_tokens.weight": torch.randn(config.vocab_size, hs, generator=g, dtype=torch.float64)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = rnd(config.num_heads * d, hs)
        state[p + "self_attn.k_proj.weight"] = rnd(config.num_kv_heads * d, hs)
        state[p + "self_attn.v_proj.weight"] = rnd(config.num_kv_heads * d, hs)
        state[p + "self_attn.o_proj.weight"] = rnd(hs, config.num_heads * d)
        state[p + "mlp.gate_proj.weight"] = rnd(config.intermediate_size, hs)
        state[p + "mlp.up_proj.weight"] = rnd(config.intermediate_size, hs)
        state[p + "mlp.down_proj.weight"] = rnd(hs, config.intermediate_size)
        state[p + "input_layernorm.weight"] = norm_w()
        state[p + "post_attention_layernorm.weight"] = norm_w()
    state["model.norm.weight"] = norm_w()
    state["lm_head.weight"] = 4.0 * rnd(config.vocab_size, hs)
    return state


def tiny_config(
    vocab_size: int = 320,
    hidden_size: int = 64,
    intermediate_size: int = 160,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position: int = 4096,
) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position=max_position,
    )


def build_tiny(
    seed: int = 0,
    vocab_size: int = 320,
    hidden_size: int = 64,
    intermediate_size: int = 160,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position: int = 4096,
    dtype: str = "float64",
    device: str = "cpu",
) -> Llama:
    """The real Llama code path at toy size with seeded weights and a byte tokenizer.

    float64 by default, so greedy argmax never flips on the last-bit differences that
    different batch shapes cause in BLAS reductions.
    """
    config = tiny_config(vocab_size, hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, max_position)
    state = random_state_dict(config, seed)
    return Llama.from_state_dict(config, state, ByteTokenizer(vocab_size), getattr(torch, dtype), device)
