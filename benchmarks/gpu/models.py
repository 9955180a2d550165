"""The model a GPU benchmark runs, for forge and for Hugging Face transformers alike.

``smollm2``: SmolLM2-135M-Instruct from its GGUF (fetched on first use; 98 MB, more than a device
call can carry). ``smollm2-shape``: SmolLM2-135M's shapes (30 layers, hidden 576, 9 heads, 3 KV
heads, vocabulary 49,152) with seeded random weights, built on the spot by forge's ``model=tiny``
and by ``random_state_dict`` for transformers: the same arithmetic per token as SmolLM2, and no
file to carry. ``tiny``: forge's toy Llama (the dry run's model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SMOLLM2_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_layers": 30,
    "num_heads": 9,
    "num_kv_heads": 3,
    "max_position": 8192,
}
SHAPES: dict[str, dict[str, int]] = {"tiny": {}, "smollm2-shape": SMOLLM2_SHAPE}
MODELS = ("smollm2", *SHAPES)


@dataclass(frozen=True)
class BenchModel:
    """One of ``MODELS`` in one dtype; random-weight models are seeded with ``seed``."""

    name: str
    dtype: str
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise ValueError(f"unknown model {self.name!r}; one of {MODELS}")

    def overrides(self) -> list[str]:
        """forge config overrides selecting this model."""
        if self.name == "smollm2":
            return ["model=smollm2", f"model.dtype={self.dtype}"]
        shape = [f"model.{key}={value}" for key, value in SHAPES[self.name].items()]
        return ["model=tiny", f"model.dtype={self.dtype}", f"seed={self.seed}", *shape]

    def config(self) -> Any:
        """The model's ``LlamaConfig`` (SmolLM2's from its GGUF's metadata)."""
        if self.name == "smollm2":
            from forge.models.fetch import smollm2_path
            from forge.models.gguf_file import GGUFFile
            from forge.models.gguf_loader import config_from_gguf

            return config_from_gguf(GGUFFile(str(smollm2_path())))
        from forge.models.llama import tiny_config

        return tiny_config(**SHAPES[self.name])

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads in ``dtype``: every layer's and the LM head's once
        (the embedding lookup reads a row per token, left out; a tied LM head is read once either way)."""
        from forge.models.base import ModelDims

        element = torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()
        dims = ModelDims.of(self.config(), bytes_per_param=element)
        return int((dims.num_params - dims.vocab_size * dims.hidden_size) * element)

    def state_dict(self, config: Any) -> dict[str, torch.Tensor]:
        """Hugging Face-named float weights: the GGUF's, or the seeded ones forge's ``model=tiny`` builds."""
        if self.name == "smollm2":
            from forge.models.fetch import smollm2_path
            from forge.models.gguf_file import GGUFFile
            from forge.models.gguf_loader import state_dict_from_gguf

            return state_dict_from_gguf(GGUFFile(str(smollm2_path())), config)
        from forge.models.llama import random_state_dict

        return random_state_dict(config, self.seed)

    def hf_model(self, device: str) -> Any:
        """The same weights in transformers' ``LlamaForCausalLM``, on ``device`` in ``dtype``, EOS off."""
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = self.config()
        hf_cfg = LlamaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            max_position_embeddings=cfg.max_position,
            tie_word_embeddings=cfg.tie_word_embeddings,
        )
        model = LlamaForCausalLM(hf_cfg)
        missing, unexpected = model.load_state_dict(self.state_dict(cfg), strict=False)
        # lm_head.weight may be absent: tied to the embedding by the config; nothing else may be.
        if set(missing) - {"lm_head.weight"} or unexpected:
            raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
        model.generation_config.eos_token_id = None
        return torch.nn.Module.to(model, device=device, dtype=getattr(torch, self.dtype)).eval()
