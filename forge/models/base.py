"""The model contract and the batch it consumes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from forge.kernels.base import AttentionMetadata, KernelBackend, KVLayer, KVSpec
from forge.tokenizer import Tokenizer


@dataclass(frozen=True)
class ModelDims:
    """What a cost model needs to know about a transformer."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: float = 2.0

    @property
    def num_params(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_layers * (attn + mlp) + 2 * self.vocab_size * self.hidden_size


@dataclass(frozen=True)
class ForwardBatch:
    """Flat batch of the tokens scheduled this step.

    ``logits_indices`` are the rows of the flat batch whose next-token logits the caller
    needs (one per sampling request, several for requests verifying drafts).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor


class Model(ABC):
    """A causal LM over a paged KV cache.

    ``forward`` writes the KV of every token in the batch to the cache (at
    ``attn.slot_mapping``) and returns float32 logits ``[len(logits_indices), vocab]``.
    It must not keep state between calls: everything it knows about a request is in the
    cache and the batch.
    """

    tokenizer: Tokenizer
    kv_spec: KVSpec
    dims: ModelDims
    vocab_size: int
    max_position: int

    @abstractmethod
    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor: ...
