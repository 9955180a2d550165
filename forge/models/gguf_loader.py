"""Llama-family models from GGUF files (llama.cpp's format).

``load_gguf(path)`` reads the config from the metadata, dequantizes every tensor to
float32, renames it to Hugging Face naming (undoing the Q/K row permutation llama.cpp's
converter applies for its interleaved rope, as ``transformers`` does), builds the
tokenizer from the metadata, and hands all of it to ``Llama.from_state_dict``.

Architectures: ``llama`` (Llama 2/3, TinyLlama, SmolLM2, Mistral-as-llama) and ``qwen2``
(QKV bias, no permutation). Anything else is a ``GGUFError`` naming the file.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from forge.gguf_tokenizer import GGUFTokenizerError, tokenizer_from_gguf
from forge.models.fast_weights import apply_weight_format
from forge.models.fetch import smollm2_path
from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.llama import Llama, LlamaConfig
from forge.tokenizer import Tokenizer

SUPPORTED_ARCHITECTURES = ("llama", "qwen2")
# Architectures whose converter permuted the Q/K rows (llama.cpp's ``LlamaModel.permute``).
_PERMUTED_QK = {"llama"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_ROPE_FREQS = "rope_freqs.weight"


def hf_name(gguf_name: str) -> str | None:
    """Hugging Face name of a GGUF tensor, or None if it is not a Llama weight."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"model.layers.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}"
    return None


def unpermute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: rows ``(head, dim/2, 2)`` back to ``(head, 2, dim/2)``."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def config_from_gguf(gguf: GGUFFile, max_position: int | None = None) -> LlamaConfig:
    arch = gguf.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{gguf.path}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        return gguf.require(f"{arch}.{name}") if default is None else gguf.metadata.get(f"{arch}.{name}", default)

    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    rope_scaling: dict[str, Any] | None = None
    scaling_type = key("rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling_type != "none":
        raise GGUFError(f"{gguf.path}: rope scaling {scaling_type!r} is not supported (supported: linear)")
    if _ROPE_FREQS in gguf.tensors:
        rope_scaling = {"rope_type": "freq_factors", "factors": gguf.load(_ROPE_FREQS).tolist()}
    context = int(key("context_length", 4096))
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
        rope_scaling=rope_scaling,
        max_position=min(context, max_position) if max_position else context,
        tie_word_embeddings="output.weight" not in gguf.tensors,
        attention_bias="blk.0.attn_q.bias" in gguf.tensors,
    )


def state_dict_from_gguf(gguf: GGUFFile, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every weight dequantized to float32 under its Hugging Face name."""
    gguf.check_types()
    unknown = [n for n in gguf.tensors if n != _ROPE_FREQS and hf_name(n) is None]
    if unknown:
        raise GGUFError(f"{gguf.path}: tensors this Llama loader does not know: {', '.join(unknown[:5])}")
    permuted = gguf.architecture in _PERMUTED_QK
    state: dict[str, torch.Tensor] = {}
    for name in gguf.tensors:
        target = hf_name(name)
        if target is None:
            continue
        tensor = gguf.load(name)
        if permuted and name.endswith("attn_q.weight"):
            tensor = unpermute_qk(tensor, config.num_heads)
        elif permuted and name.endswith("attn_k.weight"):
            tensor = unpermute_qk(tensor, config.num_kv_heads)
        state[target] = tensor
    return state


def tokenizer_of(gguf: GGUFFile) -> Tokenizer:
    try:
        return tokenizer_from_gguf(gguf.metadata)
    except GGUFTokenizerError as exc:
        raise GGUFError(f"{gguf.path}: {exc}") from exc


def load_gguf(
    path: str,
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
) -> Llama:
    """A ``Llama`` with tokenizer from the GGUF at ``path``.

    ``dtype`` is the compute/KV-cache dtype; ``weights`` the storage format of the linear
    weights (``forge.models.fast_weights``: ``same`` keeps ``dtype``); ``max_position``
    caps the context length the rope table is built for (default: the file's).
    """
    gguf = GGUFFile(path)
    gguf.check_types()
    config = config_from_gguf(gguf, max_position)
    tokenizer = tokenizer_of(gguf)
    state = state_dict_from_gguf(gguf, config)
    try:
        model = Llama.from_state_dict(config, state, tokenizer, getattr(torch, dtype), device)
    except KeyError as exc:
        raise GGUFError(f"{path}: {exc.args[0]}") from exc
    return apply_weight_format(model, weights)


def load_smollm2(
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    cache_dir: str | None = None,
) -> Llama:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), fetched into the forge cache on first use."""
    return load_gguf(str(smollm2_path(cache_dir)), dtype, device, weights, max_position)
