"""Mixtral (sparse mixture of experts) over a paged KV cache: Llama's attention (with Mistral's
optional sliding window) and, in place of the MLP, ``num_experts`` SwiGLU experts of which each
token uses ``experts_per_token``, as transformers' ``MixtralForCausalLM`` computes it:

- the router is a linear layer ``hidden -> num_experts``; its logits go through a float32 softmax,
  the top ``experts_per_token`` probabilities are kept and renormalised to sum to 1;
- each token's output is the weighted sum of its chosen experts' outputs.

The experts run grouped: the (token, expert) pairs are sorted by expert, and each expert that has
tokens runs one batched gate/up and down matmul over all of them (a loop over experts, never over
tokens); the results are scattered back with ``index_add_``. The attention weights are the
skeleton's and take every weight format; the experts stay in the model dtype.

``MIXTRAL`` tells the SafeTensors loader how ``mixtral`` directories give its config and tensors
(``block_sparse_moe.gate`` and ``block_sparse_moe.experts.E.w1/w2/w3``, transformers' saved layout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from forge.kernels.base import KernelBackend
from forge.models.decoder import DecoderLayer, DecoderModel, TensorReader
from forge.models.family import CheckpointError, HFFormat, ModelFamily
from forge.models.hf_config import decoder_fields, sliding_window
from forge.models.llama import LlamaConfig, attention_tensors, outer_tensors
from forge.tokenizers.base import Tokenizer


@dataclass(frozen=True)
class MixtralConfig(LlamaConfig):
    num_experts: int = 8
    experts_per_token: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token {self.experts_per_token} not in 1..{self.num_experts}")


@dataclass
class MixtralLayer(DecoderLayer):
    """``w_gate_up`` is every expert's fused gate|up stacked ``[experts, hidden, 2 * intermediate]``,
    ``w_down`` every expert's down projection ``[experts, intermediate, hidden]``; only the attention
    linears take a packed weight format."""

    LINEARS: ClassVar[tuple[str, ...]] = ("wqkv", "wo")

    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    router: torch.Tensor  # [hidden, experts]


class Mixtral(DecoderModel[MixtralConfig, MixtralLayer]):
    @classmethod
    def from_state_dict(
        cls,
        config: MixtralConfig,
        state: dict[str, torch.Tensor],
        tokenizer: Tokenizer,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> Mixtral:
        """Build from Hugging Face-named tensors (``[out, in]`` linear weights, one set per expert)."""
        r = TensorReader(state, dtype, device)
        layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}.block_sparse_moe."
            experts = [f"{p}experts.{e}." for e in range(config.num_experts)]
            layers.append(
                MixtralLayer(
                    **attention_tensors(r, f"model.layers.{i}."),
                    w_gate_up=torch.stack([r.fused(e + "w1.weight", e + "w3.weight") for e in experts]),
                    w_down=torch.stack([r.linear(e + "w2.weight") for e in experts]),
                    router=r.linear(p + "gate.weight"),
                )
            )
        return cls(config, layers, *outer_tensors(r, config.tie_word_embeddings), tokenizer)

    def attention_window(self, index: int, layer: MixtralLayer) -> int | None:
        return self.config.sliding_window

    def mlp(self, layer: MixtralLayer, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        k = self.config.experts_per_token
        probs = torch.softmax(backend.linear(x, layer.router).float(), dim=-1)
        weights, experts = probs.topk(k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        pairs = experts.flatten()
        order = pairs.argsort(stable=True)  # (token, expert) pairs grouped by expert
        tokens = order // k
        rows = x.index_select(0, tokens)
        counts = torch.bincount(pairs, minlength=self.config.num_experts).tolist()
        outputs = []
        start = 0
        for expert, count in enumerate(counts):
            if count:
                hidden = backend.silu_mul(backend.linear(rows[start : start + count], layer.w_gate_up[expert]))
                outputs.append(backend.linear(hidden, layer.w_down[expert]))
            start += count
        out = torch.zeros_like(x)
        if not outputs:  # no rows
            return out
        weighted = torch.cat(outputs) * weights.flatten()[order, None]
        return out.index_add_(0, tokens, weighted.to(x.dtype))


def config_from_hf(hf: dict[str, Any], directory: str = "", max_position: int | None = None) -> MixtralConfig:
    """The config of a ``mixtral`` ``config.json``."""
    experts, top_k = int(hf.get("num_local_experts", 8)), int(hf.get("num_experts_per_tok", 2))
    if not 1 <= top_k <= experts:
        raise CheckpointError(f"{directory}: num_experts_per_tok {top_k} not in 1..{experts}")
    return MixtralConfig(
        **decoder_fields(hf, directory, max_position),
        sliding_window=sliding_window(hf, directory),
        num_experts=experts,
        experts_per_token=top_k,
    )


MIXTRAL = ModelFamily(name="mixtral", build=Mixtral.from_state_dict, hf=HFFormat(("mixtral",), config_from_hf))
