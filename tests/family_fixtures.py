"""Small random checkpoints of each model family, made here with transformers: the architecture
built from a config (each family's special features switched on), weights redrawn so activations
stay O(1) and greedy tokens vary, saved as SafeTensors with a tokenizer.json (a byte-level BPE
trained on ``gguf_fixtures.CORPUS``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf_fixtures import SPECIAL, byte_level_vocab
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SIZES: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
}


@dataclass(frozen=True)
class FamilySpec:
    """A ``model_type`` and the ``config.json`` settings (over ``SIZES``) that switch its features on."""

    model_type: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.model_type


def write_tokenizer(directory: Path) -> int:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE; returns its vocabulary size."""
    tokens, merges = byte_level_vocab()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    return len(tokens)


def redraw_weights(model: torch.nn.Module, seed: int) -> None:
    """Linear weights ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1²), embeddings ~ N(0, 1), biases ~ N(0, 0.1²);
    the LM head scaled by 4 so the next-token distribution is peaked."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:
                value = 1.0 + 0.1 * noise
            elif "embed_tokens" in name:
                value = noise
            elif p.dim() == 1:
                value = 0.1 * noise
            else:
                value = noise / math.sqrt(p.shape[-1]) * (4.0 if name.startswith("lm_head") else 1.0)
            p.copy_(value.to(p.dtype))


def write_checkpoint(directory: Path, spec: FamilySpec, seed: int = 0) -> Any:
    """A random ``spec`` model saved in ``directory`` (SafeTensors, config.json, tokenizer.json);
    returns the transformers model (float64, eval mode) as the reference."""
    transformers = pytest.importorskip("transformers")
    vocab_size = write_tokenizer(directory)
    settings = {**SIZES, "vocab_size": vocab_size, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    config = transformers.AutoConfig.for_model(spec.model_type, **{**settings, **spec.settings})
    # eager experts: the grouped-matmul ones do not run in float64
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="eager")
    redraw_weights(model, seed)
    model.save_pretrained(str(directory))
    return model.to(torch.float64).eval()
