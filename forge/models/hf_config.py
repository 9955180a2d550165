"""What every family reads from a Hugging Face ``config.json`` the same way: the decoder's sizes,
the rotary base and scaling (transformers v4 ``rope_theta`` / ``rope_scaling`` and v5
``rope_parameters`` spellings), and the checks that refuse what no family here computes (an
activation other than SiLU, a rope scaling type the rotary table does not know). The family modules
build their configs from these; each failure is a ``CheckpointError`` naming the directory and the
setting."""

from __future__ import annotations

from typing import Any

from forge.models.family import CheckpointError

# rope_scaling types ``forge.models.rope.rope_inv_freq`` computes
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_settings(
    hf: dict[str, Any], directory: str, also: tuple[str, ...] = ()
) -> tuple[float, dict[str, Any] | None]:
    """``(rope_theta, rope_scaling)`` of ``config.json``; ``rope_scaling`` is None for plain RoPE.
    A scaling type forge does not compute, or rotary over part of each head, is a ``CheckpointError``
    naming it; ``also`` names further types the caller converts itself (it gets them as they are)."""
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    partial = float(rope.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0:
        raise CheckpointError(f"{directory}: partial_rotary_factor {partial} is not supported")
    kind = rope.get("rope_type", rope.get("type"))
    if kind is not None and kind not in (*SUPPORTED_ROPE_TYPES, *also):
        supported = ", ".join((*SUPPORTED_ROPE_TYPES, *also))
        raise CheckpointError(f"{directory}: rope scaling type {kind!r} is not supported (supported: {supported})")
    return theta, (None if kind in (None, "default") else rope)


def require_silu(hf: dict[str, Any], directory: str) -> None:
    """Every family here gates its MLP with SiLU; any other ``hidden_act`` is refused by name."""
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{directory}: hidden_act {act!r} is not supported (supported: silu)")


def decoder_fields(
    hf: dict[str, Any], directory: str, max_position: int | None, rope_types: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The fields every family's config shares (``LlamaConfig``'s names), from ``config.json``;
    ``max_position`` caps the context length; ``rope_types``: as ``rope_settings``' ``also``."""
    require_silu(hf, directory)
    theta, scaling = rope_settings(hf, directory, rope_types)
    heads = int(hf["num_attention_heads"])
    context = int(hf.get("max_position_embeddings", 2048))
    return {
        "vocab_size": int(hf["vocab_size"]),
        "hidden_size": int(hf["hidden_size"]),
        "intermediate_size": int(hf["intermediate_size"]),
        "num_layers": int(hf["num_hidden_layers"]),
        "num_heads": heads,
        "num_kv_heads": int(hf.get("num_key_value_heads") or heads),
        "head_dim": int(hf.get("head_dim") or 0),
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-5)),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position": min(context, max_position) if max_position else context,
        "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
    }


def sliding_window(hf: dict[str, Any], directory: str) -> int | None:
    """The sliding window of a Mistral-style config (every layer attends to its last
    ``sliding_window`` positions), None when it has none. Qwen-style ``use_sliding_window`` (windowed
    layers chosen by ``max_window_layers``) is refused by name."""
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{directory}: use_sliding_window (Qwen's per-layer sliding window) is not supported")
    window = hf.get("sliding_window")
    if window is None or "use_sliding_window" in hf:  # Qwen configs carry a window they do not use
        return None
    if int(window) < 1:
        raise CheckpointError(f"{directory}: sliding_window {window} must be >= 1")
    return int(window)
