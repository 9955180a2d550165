"""The model contract and the batch it consumes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from forge.kernels.base import KernelBackend, KVLayer, KVSpec
from forge.kernels.kv_quant import SCALE_BYTES
from forge.tokenizers.base import Tokenizer

if TYPE_CHECKING:  # torch is imported where a tensor is made: a model computing on the host needs none
    import torch

    from forge.kernels.batch import ForwardBatch


@dataclass(frozen=True)
class ModelDims:
    """What a cost model needs to know about a transformer. A mixture-of-experts model has
    ``num_experts`` MLPs per layer (each ``intermediate_size`` wide) of which every token runs
    ``experts_per_token``: ``num_params`` counts them all (what memory holds and a step reads),
    ``active_params`` only those a token computes with."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    bytes_per_param: float = 2.0
    num_experts: int = 1
    experts_per_token: int = 1
    kv_quantized: bool = False

    @property
    def kv_value_bytes(self) -> float:
        """Bytes one cached K or V value takes: ``bytes_per_param``, or with an int8/fp8 KV cache
        (``kv_quantized``, ``forge.kernels.kv_quant``) one byte plus its row's float32 scale shared
        by ``head_dim`` values."""
        return 1 + SCALE_BYTES / self.head_dim if self.kv_quantized else self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes one token's K and V take over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_value_bytes

    @classmethod
    def of(cls, config: Any, bytes_per_param: float) -> ModelDims:
        """From a model config that has these fields under the same names (``LlamaConfig``, ``Gemma3Config``;
        ``num_experts`` and ``experts_per_token`` only when it is a mixture of experts, ``MixtralConfig``)."""
        c = config
        return cls(
            c.num_layers,
            c.hidden_size,
            c.num_heads,
            c.num_kv_heads,
            c.head_dim,
            c.intermediate_size,
            c.vocab_size,
            bytes_per_param,
            getattr(c, "num_experts", 1),
            getattr(c, "experts_per_token", 1),
        )

    @property
    def num_params(self) -> int:
        return self._params(self.num_experts)

    @property
    def active_params(self) -> int:
        """The parameters one token computes with: ``num_params`` with only ``experts_per_token`` experts."""
        return self._params(self.experts_per_token)

    def _params(self, experts: int) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size * experts
        router = self.hidden_size * self.num_experts if self.num_experts > 1 else 0
        return self.num_layers * (attn + mlp + router) + 2 * self.vocab_size * self.hidden_size


# not frozen: one is built per step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass
class OneHotLogits:
    """Logits kept on the host: row i is ``value`` at column ``tokens[i]`` and 0 elsewhere.

    What a model with no arithmetic returns from ``forward_host`` (``forge.engine.sim_runner.HostModel``);
    ``dense()`` is the float32 tensor ``forward`` would have returned. With ``value > 0`` each row's argmax is
    its ``tokens`` entry, so greedy sampling needs no tensor at all (nor torch). ``device``: where
    ``dense()`` puts the tensor (``cpu``, ``cuda``, a ``torch.device``)."""

    tokens: list[int]
    value: float
    vocab_size: int
    device: torch.device | str

    def dense(self) -> torch.Tensor:
        import torch

        logits = torch.zeros(len(self.tokens), self.vocab_size, dtype=torch.float32, device=self.device)
        if self.tokens:
            cols = torch.tensor(self.tokens, dtype=torch.long, device=self.device)
            logits[torch.arange(len(self.tokens), device=self.device), cols] = self.value
        return logits


class Model(ABC):
    """A causal LM over a paged KV cache.

    ``forward`` writes the KV of every token in the batch to the cache (layer l at
    ``batch.attn_for(l).slot_mapping``, reading through that metadata's block tables: a model with
    windowed layers may have its layers' KV in several cache groups) and returns float32 logits
    ``[len(logits_indices), vocab]``.
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

    def layer_windows(self) -> tuple[int | None, ...]:
        """Each layer's sliding attention window (None: full attention); the KV cache frees the blocks
        that lie wholly before every windowed layer's window (``forge.core.kv_groups``)."""
        return (None,) * self.kv_spec.num_layers


@runtime_checkable
class HiddenStateModel(Protocol):
    """A model that also gives its final hidden states (after the final norm), what embedding
    requests pool (``forge.core.pooling``).

    ``forward_hidden(batch, kv_caches, backend, rows)`` does what ``forward`` does (writes the
    batch's KV, returns the same logits) and also returns the final hidden states of the flat
    batch's ``rows`` (``[len(rows), hidden]``, in the model's dtype)."""

    def forward_hidden(
        self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
