"""Qwen3 (dense) over a paged KV cache: Llama's skeleton with RMSNorm over each head of q and k
(QK-norm) before the rotary embedding, no QKV bias and an explicit ``head_dim`` (so the attention
width need not be ``hidden_size``), as transformers' ``Qwen3ForCausalLM`` computes it.

``QWEN3`` tells the loaders how Hugging Face directories (``model_type`` ``qwen3``) and GGUF files
(``general.architecture`` ``qwen3``, Q/K rows not permuted, llama.cpp's ``attn_q_norm`` /
``attn_k_norm``) give its config and tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forge.kernels.base import KernelBackend
from forge.models.decoder import DecoderLayer, DecoderModel, TensorReader
from forge.models.family import CheckpointError, GGUFFormat, HFFormat, ModelFamily
from forge.models.gguf_file import GGUFFile
from forge.models.hf_config import decoder_fields, sliding_window
from forge.models.llama import GGUF_LAYER_NAMES, LlamaConfig, attention_tensors, mlp_tensors, outer_tensors
from forge.models.llama import config_from_gguf as llama_config_from_gguf
from forge.tokenizers.base import Tokenizer


@dataclass
class Qwen3Layer(DecoderLayer):
    q_norm: torch.Tensor  # [head_dim], shared by every head
    k_norm: torch.Tensor


class Qwen3(DecoderModel[LlamaConfig, Qwen3Layer]):
    @classmethod
    def from_state_dict(
        cls,
        config: LlamaConfig,
        state: dict[str, torch.Tensor],
        tokenizer: Tokenizer,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Qwen3:
        """Build from Hugging Face-named tensors (``[out, in]`` linear weights)."""
        r = TensorReader(state, dtype, device)
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            layers.append(
                Qwen3Layer(
                    **attention_tensors(r, p),
                    **mlp_tensors(r, p),
                    q_norm=r.get(p + "self_attn.q_norm.weight"),
                    k_norm=r.get(p + "self_attn.k_norm.weight"),
                )
            )
        return cls(config, layers, *outer_tensors(r, config.tie_word_embeddings), tokenizer)

    def qk_heads(
        self, layer: Qwen3Layer, q: torch.Tensor, k: torch.Tensor, backend: KernelBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        eps = self.config.rms_norm_eps
        return backend.rms_norm(q, layer.q_norm, eps), backend.rms_norm(k, layer.k_norm, eps)


def config_from_hf(hf: dict[str, Any], directory: str = "", max_position: int | None = None) -> LlamaConfig:
    """The config of a ``qwen3`` ``config.json`` (a QKV bias or Qwen's per-layer window is refused)."""
    if hf.get("attention_bias"):
        raise CheckpointError(f"{directory}: attention_bias is not supported for qwen3")
    if sliding_window(hf, directory) is not None:
        raise CheckpointError(f"{directory}: sliding_window is not supported for qwen3")
    return LlamaConfig(**decoder_fields(hf, directory, max_position))


def config_from_gguf(gguf: GGUFFile, arch: str = "qwen3", max_position: int | None = None) -> LlamaConfig:
    """The config of a ``qwen3`` file: Llama's keys (``qwen3.attention.key_length`` gives ``head_dim``)."""
    return llama_config_from_gguf(gguf, arch, max_position)


GGUF_QWEN3_LAYER_NAMES = {
    **GGUF_LAYER_NAMES,
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
}

QWEN3 = ModelFamily(
    name="qwen3",
    build=Qwen3.from_state_dict,
    gguf=GGUFFormat(("qwen3",), config_from_gguf, GGUF_QWEN3_LAYER_NAMES),
    hf=HFFormat(("qwen3",), config_from_hf),
)
