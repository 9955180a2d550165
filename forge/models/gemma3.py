"""Gemma 3 (the text model) over a paged KV cache.

The decoder skeleton (``forge.models.decoder``) with these hooks overridden (each as in
transformers' ``Gemma3ForCausalLM``):

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

The linear weights have the skeleton's layout (``[in, out]``, QKV and gate/up fused), so every
weight format applies. ``layer_windows`` (each local layer's window, None for the global ones) lets
``kvcache=paged`` lay the cache out as vLLM's hybrid allocator does (``forge.core.kv_groups``): the
global layers keep every block, the local layers free the blocks before their window
(``kvcache.free_outside_window=false`` keeps every layer's full context). ``GEMMA3`` tells the GGUF
loader how ``gemma3`` files give its config and tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.kernels.base import KernelBackend, LinearWeight
from forge.models.decoder import DecoderLayer, DecoderModel, TensorReader, rope_cos_sin
from forge.models.family import GGUFFormat, ModelFamily
from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.gguf_metadata import LINEAR_NAMES, context_length, metadata_key, rope_scaling
from forge.tokenizers.base import Tokenizer


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
class Gemma3Layer(DecoderLayer):
    # attn_norm and mlp_norm, like every norm here, hold the multiplier 1 + weight
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    post_mlp_norm: torch.Tensor
    window: int | None  # sliding window of this layer, None for global layers


class Gemma3(DecoderModel[Gemma3Config, Gemma3Layer]):
    def __init__(
        self,
        config: Gemma3Config,
        layers: list[Gemma3Layer],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: LinearWeight,
        tokenizer: Tokenizer,
    ) -> None:
        super().__init__(config, layers, embed, norm, lm_head, tokenizer)  # rope tables: the global layers'
        # transformers keeps the scale as a float32 tensor and casts it to the weights' dtype
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(embed.dtype)
        local = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
        self.cos_sin_local = rope_cos_sin(local, self.rope_dtype, embed.device)
        self.attention_scale = config.query_pre_attn_scalar**-0.5

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
        r = TensorReader(state, dtype, device)

        def norm(name: str) -> torch.Tensor:  # as Gemma3RMSNorm: 1 + weight in float32
            return (1.0 + r.raw(name).float()).to(device=device, dtype=dtype)

        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            layers.append(
                Gemma3Layer(
                    attn_norm=norm(p + "input_layernorm.weight"),
                    wqkv=r.fused(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                    wo=r.linear(p + "self_attn.o_proj.weight"),
                    mlp_norm=norm(p + "pre_feedforward_layernorm.weight"),
                    w_gate_up=r.fused(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                    w_down=r.linear(p + "mlp.down_proj.weight"),
                    q_norm=norm(p + "self_attn.q_norm.weight"),
                    k_norm=norm(p + "self_attn.k_norm.weight"),
                    post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                    post_mlp_norm=norm(p + "post_feedforward_layernorm.weight"),
                    window=config.sliding_window if config.is_sliding(i) else None,
                )
            )
        if config.tie_word_embeddings or "lm_head.weight" not in state:
            # One copy of the vocabulary, stored [hidden, vocab] for the LM head GEMM (twice as fast
            # there as a transposed view); the embedding lookup reads its columns through a view.
            lm_head = r.linear("model.embed_tokens.weight")
            embed = lm_head.t()
        else:
            embed, lm_head = r.get("model.embed_tokens.weight"), r.linear("lm_head.weight")
        return cls(config, layers, embed, norm("model.norm.weight"), lm_head, tokenizer)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(input_ids) * self.embed_scale

    def qk_heads(
        self, layer: Gemma3Layer, q: torch.Tensor, k: torch.Tensor, backend: KernelBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        return backend.rms_norm(q, layer.q_norm, eps), backend.rms_norm(k, layer.k_norm, eps)

    def rope_table(self, index: int, layer: Gemma3Layer) -> torch.Tensor:
        return self.cos_sin if layer.window is None else self.cos_sin_local

    def attention_window(self, index: int, layer: Gemma3Layer) -> int | None:
        return layer.window

    def attention_output(self, layer: Gemma3Layer, h: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return backend.rms_norm(h, layer.post_attn_norm, self.config.rms_norm_eps)

    def gated_activation(self, gate_up: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return backend.gelu_tanh_mul(gate_up)

    def mlp_output(self, layer: Gemma3Layer, h: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return backend.rms_norm(h, layer.post_mlp_norm, self.config.rms_norm_eps)

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap


# Gemma-3 facts the GGUF does not store; llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3) and
# transformers' Gemma3TextConfig defaults agree on both.
GGUF_SLIDING_WINDOW_PATTERN = 6
GGUF_ROPE_LOCAL_THETA = 10_000.0


def config_from_gguf(gguf: GGUFFile, arch: str = "gemma3", max_position: int | None = None) -> Gemma3Config:
    """The ``Gemma3Config`` of a ``gemma3`` file (keys ``gemma3.*``)."""
    key = metadata_key(gguf, arch)
    if f"{arch}.attn_logit_softcapping" in gguf.metadata:
        raise GGUFError(f"{gguf.path}: attention logit soft-capping is not supported")
    hidden, heads, layers = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    head_dim = int(key("attention.key_length"))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise GGUFError(f"{gguf.path}: key and value head sizes differ")
    # llama.cpp scales attention by 1/sqrt(hidden / heads) for the 27B model (62 layers) and by
    # 1/sqrt(head_dim) for the others: their query_pre_attn_scalar in the original configs.
    query_pre_attn_scalar = hidden / heads if layers == 62 else head_dim
    softcap = gguf.metadata.get(f"{arch}.final_logit_softcapping")
    return Gemma3Config(
        vocab_size=gguf.tensor_shape("token_embd.weight")[0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(key("attention.head_count_kv", heads)),
        head_dim=head_dim,
        query_pre_attn_scalar=float(query_pre_attn_scalar),
        sliding_window=int(key("attention.sliding_window")),
        sliding_window_pattern=GGUF_SLIDING_WINDOW_PATTERN,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 1_000_000.0)),
        rope_scaling=rope_scaling(gguf, arch),
        rope_local_theta=GGUF_ROPE_LOCAL_THETA,
        final_logit_softcapping=float(softcap) if softcap else None,
        max_position=context_length(gguf, arch, 32768, max_position),
        tie_word_embeddings="output.weight" not in gguf.tensors,
    )


GGUF_LAYER_NAMES = {
    **LINEAR_NAMES,
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


def tensor_from_gguf(name: str, tensor: torch.Tensor, config: Gemma3Config, arch: str) -> torch.Tensor:
    """llama.cpp's converter stored each norm as 1 + weight: back to weight, as transformers does."""
    return tensor - 1.0 if name.endswith("norm.weight") else tensor


GEMMA3 = ModelFamily(
    name="gemma3",
    build=Gemma3.from_state_dict,
    gguf=GGUFFormat(("gemma3",), config_from_gguf, GGUF_LAYER_NAMES, tensor_from_gguf),
)
