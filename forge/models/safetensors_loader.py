"""Models from a Hugging Face directory: ``config.json``, ``tokenizer.json``, and
``model.safetensors`` or shards listed in ``model.safetensors.index.json``.

``config.json``'s ``model_type`` is looked up in the model registry (``forge.models.registry``:
``llama``, ``mistral`` without sliding window, ``qwen2``), whose family parses the config and
builds the model; anything else is a ``CheckpointError`` naming the directory.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from forge.models.decoder import DecoderModel
from forge.models.family import CheckpointError, HFFormat, ModelFamily, ModelRegistry
from forge.models.fast_weights import apply_weight_format
from forge.models.registry import MODEL_REGISTRY
from forge.tokenizers.base import Tokenizer
from forge.tokenizers.hf import load_hf_tokenizer
from forge.tokenizers.none import CHOICES, no_tokenizer_from_hf

__all__ = ["CheckpointError", "config_from_hf", "load_safetensors", "read_state_dict", "shard_files"]


def _read_config(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{directory}: no config.json (expected a Hugging Face model directory)")
    with open(path, encoding="utf-8") as f:
        config: dict[str, Any] = json.load(f)
    return config


def family_of(
    hf: dict[str, Any], directory: str = "", registry: ModelRegistry = MODEL_REGISTRY
) -> tuple[ModelFamily, HFFormat]:
    """The registered family of ``config.json``'s ``model_type`` (a ``CheckpointError`` if none)."""
    model_type = hf.get("model_type")
    found = registry.for_hf(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise CheckpointError(
            f"{directory}: model_type {model_type!r} is not supported (supported: {', '.join(registry.hf_model_types)})"
        )
    return found


def config_from_hf(
    hf: dict[str, Any], directory: str = "", max_position: int | None = None, registry: ModelRegistry = MODEL_REGISTRY
) -> Any:
    """The config of ``config.json``'s family (``LlamaConfig``...), as that family parses it."""
    return family_of(hf, directory, registry)[1].config(hf, directory, max_position)


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


def _tokenizer(path: str, choice: str, vocab_size: int) -> Tokenizer:
    if choice not in CHOICES:
        raise CheckpointError(f"model.tokenizer={choice!r}: expected one of {', '.join(CHOICES)}")
    return load_hf_tokenizer(path) if choice == "auto" else no_tokenizer_from_hf(path, vocab_size)


def load_safetensors(
    path: str,
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    registry: ModelRegistry = MODEL_REGISTRY,
    tokenizer: str = "auto",
) -> DecoderModel[Any, Any]:
    """The model in the Hugging Face directory ``path``, of the family its ``model_type`` names in
    ``registry``; weights cast to ``dtype`` and stored as ``weights`` (``forge.models.fast_weights``).
    ``tokenizer``: ``auto`` reads ``tokenizer.json``; ``none`` builds no tokenizer (token ids only,
    ``forge.tokenizers.none``), so the directory needs no tokenizer files."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (expected a Hugging Face model directory)")
    hf = _read_config(path)
    family, fmt = family_of(hf, path, registry)
    config = fmt.config(hf, path, max_position)
    tok = _tokenizer(path, tokenizer, int(config.vocab_size))
    state = read_state_dict(path)
    try:
        model = family.build(config, state, tok, getattr(torch, dtype), device)
    except KeyError as exc:
        raise CheckpointError(f"{path}: {exc.args[0]}") from exc
    return apply_weight_format(model, weights)
