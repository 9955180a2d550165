"""What every model family reads from a GGUF the same way: the metadata keys under the file's
architecture (``<arch>.embedding_length``...), the rope scaling, the shared tensor names and
llama.cpp's Q/K row permutation. The family modules parse their configs with these; the GGUF
loader (``forge.models.gguf_loader``) dispatches to them through the registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from forge.models.gguf_file import GGUFError, GGUFFile

# Tensors outside the layers, the same in every family.
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# The linear weights of a layer (``blk.N.<gguf name>`` -> ``model.layers.N.<Hugging Face name>``);
# a family adds its norms (and biases) to these.
LINEAR_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
ROPE_FREQS = "rope_freqs.weight"


def metadata_key(gguf: GGUFFile, arch: str) -> Callable[..., Any]:
    """``key(name)``: the required value of ``<arch>.<name>``; ``key(name, default)``: optional."""

    def key(name: str, default: Any = None) -> Any:
        return gguf.require(f"{arch}.{name}") if default is None else gguf.metadata.get(f"{arch}.{name}", default)

    return key


def rope_scaling(gguf: GGUFFile, arch: str) -> dict[str, Any] | None:
    """The config's ``rope_scaling``: linear scaling from the metadata, or llama.cpp's ``rope_freqs``."""
    key = metadata_key(gguf, arch)
    scaling: dict[str, Any] | None = None
    scaling_type = key("rope.scaling.type", "none")
    if scaling_type == "linear":
        scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling_type != "none":
        raise GGUFError(f"{gguf.path}: rope scaling {scaling_type!r} is not supported (supported: linear)")
    if ROPE_FREQS in gguf.tensors:
        scaling = {"rope_type": "freq_factors", "factors": gguf.load(ROPE_FREQS).tolist()}
    return scaling


def context_length(gguf: GGUFFile, arch: str, default: int, max_position: int | None) -> int:
    """The file's context length (``default`` when absent), capped at ``max_position`` if given."""
    context = int(metadata_key(gguf, arch)("context_length", default))
    return min(context, max_position) if max_position else context


def unpermute_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Inverse of llama.cpp's ``permute``: rows ``(head, dim/2, 2)`` back to ``(head, 2, dim/2)``."""
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
