"""Llama-family models from a Hugging Face directory: ``config.json``, ``tokenizer.json``,
and ``model.safetensors`` or shards listed in ``model.safetensors.index.json``.

``model_type`` ``llama``, ``mistral`` (without sliding window) and ``qwen2`` are accepted;
anything else is a ``CheckpointError`` naming the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from forge.models.fast_weights import apply_weight_format
from forge.models.llama import Llama, LlamaConfig
from forge.tokenizers_hf import load_hf_tokenizer

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class CheckpointError(ValueError):
    """An unusable checkpoint directory; the message names it and the problem."""


def _read_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{directory}: no config.json (expected a Hugging Face model directory)")
    with open(path, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    return config


def config_from_hf(hf: dict[str, Any], directory: str = "", max_position: int | None = None) -> LlamaConfig:
    """``LlamaConfig`` from a ``config.json`` dict (transformers v4 and v5 spellings)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{directory}: model_type {model_type!r} is not supported "
                              f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if model_type == "mistral" and hf.get("sliding_window"):
        window, context = hf["sliding_window"], hf.get("max_position_embeddings", 0)
        if window < context:
            raise CheckpointError(f"{directory}: sliding-window attention ({window}) is not supported")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    if rope.get("rope_type", rope.get("type")) in (None, "default"):
        rope = {}
    heads = int(hf["num_attention_heads"])
    context = int(hf.get("max_position_embeddings", 2048))
    return LlamaConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or 0),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        rope_theta=theta,
        rope_scaling=rope or None,
        max_position=min(context, max_position) if max_position else context,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
    )


def shard_files(directory: str) -> list[str]:
    """The safetensors files holding the weights: the index's shards, or the single file."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            weight_map: dict[str, str] = json.load(f)["weight_map"]
        files = [os.path.join(directory, name) for name in sorted(set(weight_map.values()))]
    else:
        files = [os.path.join(directory, "model.safetensors")]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise CheckpointError(f"{directory}: missing weight file(s): {', '.join(missing)}")
    return files


def read_state_dict(directory: str) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in shard_files(directory):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    state[name] = f.get_tensor(name)
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"{path}: unreadable safetensors file ({exc})") from exc
    return state


def load_safetensors(
    path: str,
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
) -> Llama:
    """A ``Llama`` from the Hugging Face directory ``path``; weights cast to ``dtype``."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face model directory)")
    config = config_from_hf(_read_config(path), path, max_position)
    tokenizer = load_hf_tokenizer(path)
    state = read_state_dict(path)
    try:
        model = Llama.from_state_dict(config, state, tokenizer, getattr(torch, dtype), device)
    except KeyError as exc:
        raise CheckpointError(f"{path}: {exc.args[0]}") from exc
    return apply_weight_format(model, weights)
