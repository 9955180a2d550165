"""Models from GGUF files (llama.cpp's format).

``load_gguf(path)`` reads the config from the metadata, dequantizes every tensor to
float32, renames it to Hugging Face naming (undoing the Q/K row permutation llama.cpp's
converter applies for its interleaved rope, as ``transformers`` does), builds the
tokenizer from the metadata, and hands all of it to the model class of the file's
``general.architecture``:

- ``llama`` (Llama 2/3, TinyLlama, SmolLM2, Mistral-as-llama) and ``qwen2`` (QKV bias, no
  permutation): ``Llama.from_state_dict``;
- ``gemma3`` (the text model): ``Gemma3.from_state_dict``. llama.cpp's converter stores Gemma's
  norm weights plus one; they are stored back minus one, as transformers does.

Anything else is a ``GGUFError`` naming the file.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from forge.gguf_tokenizer import GGUFTokenizerError, tokenizer_from_gguf
from forge.models.fast_weights import apply_weight_format
from forge.models.fetch import gemma3_path, smollm2_path
from forge.models.gemma3 import Gemma3, Gemma3Config
from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.llama import Llama, LlamaConfig
from forge.tokenizer import Tokenizer

LLAMA_ARCHITECTURES = ("llama", "qwen2")
SUPPORTED_ARCHITECTURES = (*LLAMA_ARCHITECTURES, "gemma3")
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
_GEMMA3_LAYER_NAMES = {
    **{k: v for k, v in _LAYER_NAMES.items() if "norm" not in k and ".bias" not in k},
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")
_ROPE_FREQS = "rope_freqs.weight"
# Gemma-3 facts the GGUF does not store; llama.cpp (src/llama-model.cpp, LLM_ARCH_GEMMA3) and
# transformers' Gemma3TextConfig defaults agree on both.
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_ROPE_LOCAL_THETA = 10_000.0


def hf_name(gguf_name: str, architecture: str = "llama") -> str | None:
    """Hugging Face name of a GGUF tensor, or None if it is not a weight of ``architecture``."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA3_LAYER_NAMES if architecture == "gemma3" else _LAYER_NAMES
    match = _LAYER_RE.fullmatch(gguf_name)
    if match and match.group(2) in names:
        return f"model.layers.{match.group(1)}.{names[match.group(2)]}"
    return None


def unpermute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: rows ``(head, dim/2, 2)`` back to ``(head, 2, dim/2)``."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _check_architecture(gguf: GGUFFile, supported: tuple[str, ...]) -> str:
    arch = gguf.architecture
    if arch not in supported:
        raise GGUFError(f"{gguf.path}: architecture {arch!r} is not supported "
                        f"(supported: {', '.join(supported)})")
    return arch


def _metadata_key(gguf: GGUFFile, arch: str) -> Any:
    def key(name: str, default: Any = None) -> Any:
        return gguf.require(f"{arch}.{name}") if default is None else gguf.metadata.get(f"{arch}.{name}", default)

    return key


def _rope_scaling(gguf: GGUFFile, arch: str) -> dict[str, Any] | None:
    key = _metadata_key(gguf, arch)
    rope_scaling: dict[str, Any] | None = None
    scaling_type = key("rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling_type != "none":
        raise GGUFError(f"{gguf.path}: rope scaling {scaling_type!r} is not supported (supported: linear)")
    if _ROPE_FREQS in gguf.tensors:
        rope_scaling = {"rope_type": "freq_factors", "factors": gguf.load(_ROPE_FREQS).tolist()}
    return rope_scaling


def config_from_gguf(gguf: GGUFFile, max_position: int | None = None) -> LlamaConfig:
    """The ``LlamaConfig`` of a Llama-family file (``LLAMA_ARCHITECTURES``)."""
    arch = _check_architecture(gguf, LLAMA_ARCHITECTURES)
    key = _metadata_key(gguf, arch)
    hidden = int(key("embedding_length"))
    heads = int(key("attention.head_count"))
    rope_scaling = _rope_scaling(gguf, arch)
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


def gemma3_config_from_gguf(gguf: GGUFFile, max_position: int | None = None) -> Gemma3Config:
    """The ``Gemma3Config`` of a ``gemma3`` file (keys ``gemma3.*``)."""
    arch = _check_architecture(gguf, ("gemma3",))
    key = _metadata_key(gguf, arch)
    if "gemma3.attn_logit_softcapping" in gguf.metadata:
        raise GGUFError(f"{gguf.path}: attention logit soft-capping is not supported")
    hidden, heads, layers = int(key("embedding_length")), int(key("attention.head_count")), int(key("block_count"))
    head_dim = int(key("attention.key_length"))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise GGUFError(f"{gguf.path}: key and value head sizes differ")
    # llama.cpp scales attention by 1/sqrt(hidden / heads) for the 27B model (62 layers) and by
    # 1/sqrt(head_dim) for the others: their query_pre_attn_scalar in the original configs.
    query_pre_attn_scalar = hidden / heads if layers == 62 else head_dim
    softcap = gguf.metadata.get("gemma3.final_logit_softcapping")
    context = int(key("context_length", 32768))
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
        sliding_window_pattern=GEMMA3_SLIDING_WINDOW_PATTERN,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(key("rope.freq_base", 1_000_000.0)),
        rope_scaling=_rope_scaling(gguf, arch),
        rope_local_theta=GEMMA3_ROPE_LOCAL_THETA,
        final_logit_softcapping=float(softcap) if softcap else None,
        max_position=min(context, max_position) if max_position else context,
        tie_word_embeddings="output.weight" not in gguf.tensors,
    )


def state_dict_from_gguf(gguf: GGUFFile, config: LlamaConfig | Gemma3Config) -> dict[str, torch.Tensor]:
    """Every weight dequantized to float32 under its Hugging Face name."""
    gguf.check_types()
    arch = gguf.architecture
    unknown = [n for n in gguf.tensors if n != _ROPE_FREQS and hf_name(n, arch) is None]
    if unknown:
        raise GGUFError(f"{gguf.path}: tensors this {arch} loader does not know: {', '.join(unknown[:5])}")
    permuted = arch in _PERMUTED_QK
    state: dict[str, torch.Tensor] = {}
    for name in gguf.tensors:
        target = hf_name(name, arch)
        if target is None:
            continue
        tensor = gguf.load(name)
        if arch == "gemma3" and name.endswith("norm.weight"):
            tensor = tensor - 1.0  # llama.cpp's converter stored 1 + weight
        elif permuted and name.endswith("attn_q.weight"):
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
) -> Llama | Gemma3:
    """The model with tokenizer in the GGUF at ``path``, by its ``general.architecture``.

    ``dtype`` is the compute/KV-cache dtype; ``weights`` the storage format of the linear
    weights (``forge.models.fast_weights``: ``same`` keeps ``dtype``; Llama-family only);
    ``max_position`` caps the context length the rope tables are built for (default: the file's).
    """
    gguf = _open_checked(path)
    if _check_architecture(gguf, SUPPORTED_ARCHITECTURES) == "gemma3":
        return _load_gemma3(gguf, dtype, device, weights, max_position)
    return _load_llama(gguf, dtype, device, weights, max_position)


def _open_checked(path: str) -> GGUFFile:
    """The file at ``path``, its tensor types checked (a clear error for an unsupported one)."""
    gguf = GGUFFile(path)
    gguf.check_types()
    return gguf


def _load_llama(gguf: GGUFFile, dtype: str, device: str, weights: str, max_position: int | None) -> Llama:
    config = config_from_gguf(gguf, max_position)
    tokenizer = tokenizer_of(gguf)
    state = state_dict_from_gguf(gguf, config)
    try:
        model = Llama.from_state_dict(config, state, tokenizer, getattr(torch, dtype), device)
    except KeyError as exc:
        raise GGUFError(f"{gguf.path}: {exc.args[0]}") from exc
    return apply_weight_format(model, weights)


def _load_gemma3(gguf: GGUFFile, dtype: str, device: str, weights: str, max_position: int | None) -> Gemma3:
    if weights != "same":
        raise ValueError(f"weights={weights!r} is implemented for Llama-family models only; Gemma-3 takes 'same'")
    config = gemma3_config_from_gguf(gguf, max_position)
    tokenizer = tokenizer_of(gguf)
    state = state_dict_from_gguf(gguf, config)
    try:
        return Gemma3.from_state_dict(config, state, tokenizer, getattr(torch, dtype), device)
    except KeyError as exc:
        raise GGUFError(f"{gguf.path}: {exc.args[0]}") from exc


def load_smollm2(
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    cache_dir: str | None = None,
) -> Llama:
    """SmolLM2-135M-Instruct (Q4_1 GGUF), fetched into the forge cache on first use."""
    return _load_llama(_open_checked(str(smollm2_path(cache_dir))), dtype, device, weights, max_position)


def load_gemma3(
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    cache_dir: str | None = None,
) -> Gemma3:
    """Gemma-3-270M (Q4_K_M GGUF), fetched into the forge cache on first use."""
    return _load_gemma3(_open_checked(str(gemma3_path(cache_dir))), dtype, device, weights, max_position)
