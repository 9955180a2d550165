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
(``block_sparse_moe.gate`` and ``block_sparse_moe.experts.E.w1/w2/w3``, transformers' saved layout),
and the GGUF loader how llama.cpp writes them: architecture ``llama`` with ``llama.expert_count`` /
``llama.expert_used_count``, Q/K rows permuted as for Llama, the router as ``blk.N.ffn_gate_inp`` and
each layer's experts stacked ``[experts, out, in]`` as ``blk.N.ffn_gate_exps`` / ``ffn_up_exps`` /
``ffn_down_exps`` (w1 / w3 / w2).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from forge.kernels.base import KernelBackend
from forge.models import llama
from forge.models.decoder import DecoderLayer, DecoderModel, TensorReader
from forge.models.family import CheckpointError, GGUFFormat, HFFormat, ModelFamily
from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.gguf_metadata import metadata_key
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
        """Build from Hugging Face-named tensors (``[out, in]`` linear weights, one set per expert, or
        each layer's ``experts.w1/w2/w3.weight`` stacked ``[experts, out, in]`` as the GGUF loader gives them)."""
        r = TensorReader(per_expert(state, config), dtype, device)
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


def per_expert(state: dict[str, torch.Tensor], config: MixtralConfig) -> dict[str, torch.Tensor]:
    """``state`` with every stacked ``block_sparse_moe.experts.wK.weight`` ``[experts, out, in]`` split
    into ``experts.E.wK.weight``; a stack of the wrong expert count is a ``KeyError`` naming it."""
    split = dict(state)
    for i in range(config.num_layers):
        p = f"model.layers.{i}.block_sparse_moe.experts."
        for w in ("w1", "w2", "w3"):
            stacked = split.pop(f"{p}{w}.weight", None)
            if stacked is None:
                continue
            if stacked.shape[0] != config.num_experts:
                raise KeyError(f"{p}{w}.weight stacks {stacked.shape[0]} experts, the config has {config.num_experts}")
            split.update({f"{p}{e}.{w}.weight": weight for e, weight in enumerate(stacked.unbind(0))})
    return split


def is_mixtral_gguf(gguf: GGUFFile) -> bool:
    """A ``llama`` file with experts (``llama.expert_count`` above 0) is a Mixtral."""
    return int(gguf.metadata.get(f"{gguf.architecture}.expert_count", 0)) > 0


def config_from_gguf(gguf: GGUFFile, arch: str, max_position: int | None = None) -> MixtralConfig:
    """The config of a Mixtral written as ``llama``: Llama's keys plus ``expert_count`` / ``expert_used_count``."""
    base = llama.config_from_gguf(gguf, arch, max_position)
    key = metadata_key(gguf, arch)
    experts, top_k = int(key("expert_count")), int(key("expert_used_count"))
    if not 1 <= top_k <= experts:
        raise GGUFError(f"{gguf.path}: {arch}.expert_used_count {top_k} not in 1..{experts}")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return MixtralConfig(**fields, num_experts=experts, experts_per_token=top_k)


GGUF_LAYER_NAMES = {
    **{k: v for k, v in llama.GGUF_LAYER_NAMES.items() if not v.startswith("mlp.")},  # attention, norms
    "ffn_gate_inp.weight": "block_sparse_moe.gate.weight",
    "ffn_gate_exps.weight": "block_sparse_moe.experts.w1.weight",
    "ffn_down_exps.weight": "block_sparse_moe.experts.w2.weight",
    "ffn_up_exps.weight": "block_sparse_moe.experts.w3.weight",
}


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


MIXTRAL = ModelFamily(
    name="mixtral",
    build=Mixtral.from_state_dict,
    gguf=GGUFFormat(("llama",), config_from_gguf, GGUF_LAYER_NAMES, llama.tensor_from_gguf, is_mixtral_gguf),
    hf=HFFormat(("mixtral",), config_from_hf),
)
