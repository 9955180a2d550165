"""The Llama family (Llama 2/3, TinyLlama, SmolLM2, Mistral with its sliding window, Qwen2/2.5 with
their QKV bias) over a paged KV cache: the decoder skeleton (``forge.models.decoder``) as it is.

Weights arrive in Hugging Face naming (``model.layers.0.self_attn.q_proj.weight``...) from
any loader; ``Llama.from_state_dict`` fuses QKV and gate/up and stores every linear weight
``[in, out]`` (K x N contiguous), which CPU sgemm runs fastest for small batches.
``LLAMA`` tells the loaders how GGUF files (``llama``, ``qwen2``) and Hugging Face directories
(``llama``, ``mistral``, ``qwen2``) give its config and tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.kernels.base import KernelBackend
from forge.models.decoder import DecoderLayer, DecoderModel, TensorReader, apply_linear
from forge.models.family import GGUFFormat, HFFormat, ModelFamily
from forge.models.gguf_file import GGUFFile
from forge.models.gguf_metadata import LINEAR_NAMES, context_length, metadata_key, rope_scaling, unpermute_qk
from forge.models.hf_config import decoder_fields, sliding_window
from forge.tokenizers.base import ByteTokenizer, Tokenizer


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
    sliding_window: int | None = None  # Mistral: each position attends to its last ``sliding_window``

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")


@dataclass
class LlamaLayer(DecoderLayer):
    bqkv: torch.Tensor | None = None


def attention_tensors(r: TensorReader, prefix: str) -> dict[str, torch.Tensor]:
    """A Llama-style layer's norms and attention weights (``prefix``: ``model.layers.N.``), under
    ``DecoderLayer``'s field names."""
    return {
        "attn_norm": r.get(prefix + "input_layernorm.weight"),
        "wqkv": r.fused(*(prefix + f"self_attn.{n}_proj.weight" for n in "qkv")),
        "wo": r.linear(prefix + "self_attn.o_proj.weight"),
        "mlp_norm": r.get(prefix + "post_attention_layernorm.weight"),
    }


def mlp_tensors(r: TensorReader, prefix: str) -> dict[str, torch.Tensor]:
    """A Llama-style layer's gated MLP weights (``prefix``: ``model.layers.N.``)."""
    return {
        "w_gate_up": r.fused(prefix + "mlp.gate_proj.weight", prefix + "mlp.up_proj.weight"),
        "w_down": r.linear(prefix + "mlp.down_proj.weight"),
    }


def outer_tensors(r: TensorReader, tie_word_embeddings: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(embeddings, final norm, LM head [in, out])``; the embeddings serve as LM head when tied or
    when the checkpoint has no ``lm_head.weight``."""
    head_name = "model.embed_tokens.weight" if tie_word_embeddings else "lm_head.weight"
    if head_name not in r.state:
        head_name = "model.embed_tokens.weight"
    return r.get("model.embed_tokens.weight"), r.get("model.norm.weight"), r.linear(head_name)


class Llama(DecoderModel[LlamaConfig, LlamaLayer]):
    """The decoder skeleton as it is (``forge.models.decoder``), plus an optional QKV bias and
    Mistral's sliding window (every layer)."""

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
        r = TensorReader(state, dtype, device)
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            bqkv = None
            if config.attention_bias:
                bqkv = torch.cat([r.get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
            layers.append(LlamaLayer(**attention_tensors(r, p), **mlp_tensors(r, p), bqkv=bqkv))
        return cls(config, layers, *outer_tensors(r, config.tie_word_embeddings), tokenizer)

    def qkv(self, layer: LlamaLayer, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        qkv = apply_linear(backend, x, layer.wqkv)
        return qkv if layer.bqkv is None else qkv + layer.bqkv

    def attention_window(self, index: int, layer: LlamaLayer) -> int | None:
        return self.config.sliding_window


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


def config_from_gguf(gguf: GGUFFile, arch: str, max_position: int | None = None) -> LlamaConfig:
    """The ``LlamaConfig`` of a ``llama`` / ``qwen2`` file (keys ``<arch>.*``)."""
    key = metadata_key(gguf, arch)
    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    return LlamaConfig(
        vocab_size=gguf.tensor_shape("token_embd.weight")[0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=int(key("block_count")),
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=int(key("attention.key_length", hidden // heads)),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling(gguf, arch),
        max_position=context_length(gguf, arch, 4096, max_position),
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
        sliding_window=sliding_window_of(gguf, arch),
    )


def sliding_window_of(gguf: GGUFFile, arch: str) -> int | None:
    """``<arch>.attention.sliding_window`` (a Mistral written as ``llama``), None when absent or 0."""
    window = int(metadata_key(gguf, arch)("attention.sliding_window", 0))
    return window or None


GGUF_LAYER_NAMES = {
    **LINEAR_NAMES,
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
# Architectures whose converter permuted the Q/K rows (llama.cpp's ``LlamaModel.permute``).
PERMUTED_QK = ("llama",)


def tensor_from_gguf(name: str, tensor: torch.Tensor, config: LlamaConfig, arch: str) -> torch.Tensor:
    """Undo llama.cpp's Q/K row permutation (``llama`` files; ``qwen2`` ones are not permuted)."""
    if arch in PERMUTED_QK and name.endswith("attn_q.weight"):
        return unpermute_qk(tensor, config.num_heads)
    if arch in PERMUTED_QK and name.endswith("attn_k.weight"):
        return unpermute_qk(tensor, config.num_kv_heads)
    return tensor


def config_from_hf(hf: dict[str, Any], directory: str = "", max_position: int | None = None) -> LlamaConfig:
    """``LlamaConfig`` from a ``config.json`` dict (``llama``, ``mistral`` with its sliding window,
    ``qwen2`` with its QKV bias; transformers v4 and v5 spellings)."""
    model_type = hf.get("model_type")
    return LlamaConfig(
        **decoder_fields(hf, directory, max_position),
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
        sliding_window=sliding_window(hf, directory),
    )


LLAMA = ModelFamily(
    name="llama",
    build=Llama.from_state_dict,
    gguf=GGUFFormat(("llama", "qwen2"), config_from_gguf, GGUF_LAYER_NAMES, tensor_from_gguf),
    hf=HFFormat(("llama", "mistral", "qwen2"), config_from_hf),
)
