"""Small random checkpoints of each model family, made here with transformers: the architecture
built from a config (each family's special features switched on), weights redrawn so activations
stay O(1) and greedy tokens vary, saved as SafeTensors with a tokenizer.json (a byte-level BPE
trained on ``gguf_fixtures.CORPUS``); and the same weights as a GGUF written with ``gguf``'s writer."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_fixtures import SPECIAL, byte_level_vocab, permute_qk, permute_qk_inverse
from safetensors.torch import load_file, save_file
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
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or self.model_type


def write_tokenizer(directory: Path) -> int:
    """tokenizer.json + tokenizer_config.json of a byte-level BPE; returns its vocabulary size."""
    tokens, merges = byte_level_vocab()
    pairs = [(a, b) for a, b in (m.split(" ") for m in merges)]
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=pairs)
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


# general.architecture llama.cpp's converter writes for each model_type (Mistral and Mixtral are written as llama)
GGUF_ARCH = {
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mistral": "llama",
    "mixtral": "llama",
    "phi3": "phi3",
    "llama": "llama",
}
_EXPERT_RE = re.compile(r"(model\.layers\.\d+\.block_sparse_moe\.experts)\.(\d+)\.(w[123])\.weight")


def stack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with each layer's per-expert ``experts.E.wK.weight`` stacked into one
    ``experts.wK.weight`` ``[experts, out, in]``, as llama.cpp's converter merges Mixtral's experts."""
    stacked: dict[str, list[tuple[int, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        match = _EXPERT_RE.fullmatch(name)
        if match is None:
            out[name] = tensor
        else:
            stacked.setdefault(f"{match.group(1)}.{match.group(3)}.weight", []).append((int(match.group(2)), tensor))
    for name, experts in stacked.items():
        out[name] = torch.stack([tensor for _, tensor in sorted(experts, key=lambda pair: pair[0])])
    return out


def unstack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``stack_experts``."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        match = re.fullmatch(r"(.+\.experts)\.(w[123])\.weight", name)
        if match is None:
            out[name] = tensor
        else:
            out.update({f"{match.group(1)}.{e}.{match.group(2)}.weight": t for e, t in enumerate(tensor.unbind(0))})
    return out


def write_gguf(path: Path, directory: Path, qtype: GGMLQuantizationType) -> dict[str, torch.Tensor]:
    """The checkpoint in ``directory`` as llama.cpp's converter lays it out (tensor names from
    ``gguf``'s own name map, Q/K rows permuted for ``llama``), 2-D weights stored as ``qtype``; returns
    the float32 state dict the file encodes, in Hugging Face naming and layout."""
    hf = json.loads((directory / "config.json").read_text())
    arch = GGUF_ARCH[hf["model_type"]]
    layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
    kv_heads = hf["num_key_value_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), layers)
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(layers)
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(hf["hidden_size"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(hf.get("rope_parameters", {}).get("rope_theta", hf.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    if hf.get("sliding_window"):
        w.add_sliding_window(hf["sliding_window"])
    if "num_local_experts" in hf:
        w.add_expert_count(hf["num_local_experts"])
        w.add_expert_used_count(hf["num_experts_per_tok"])
    tokens, merges = byte_level_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    encoded: dict[str, torch.Tensor] = {}
    for name, tensor in sorted(stack_experts(load_file(str(directory / "model.safetensors"))).items()):
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert target is not None, name
        data = tensor.float().numpy()
        permuted = arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight"))
        n_head = heads if "q_proj" in name else kv_heads
        stored = permute_qk(data, n_head) if permuted else data
        if data.ndim >= 2 and qtype != GGMLQuantizationType.F32:
            raw = gguf.quants.quantize(stored, qtype)
            w.add_tensor(target, raw, raw_shape=raw.shape, raw_dtype=qtype)
            back = gguf.quants.dequantize(raw, qtype)
            data = permute_qk_inverse(back, n_head) if permuted else back
        else:
            w.add_tensor(target, stored)
        encoded[name] = torch.from_numpy(np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return unstack_experts(encoded)


def reference_on(directory: Path, weights: dict[str, torch.Tensor], into: Path) -> Any:
    """transformers' model (float64, eval mode) of the checkpoint in ``directory`` with ``weights``
    (Hugging Face naming, as saved) in place of its own; every weight must be named."""
    transformers = pytest.importorskip("transformers")
    into.mkdir()
    (into / "config.json").write_text((directory / "config.json").read_text())
    save_file({k: v.contiguous() for k, v in weights.items()}, str(into / "model.safetensors"))
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(into), dtype=torch.float64, experts_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval()
