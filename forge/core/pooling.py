"""Embedding requests: how a prompt's final hidden states become one vector (``PoolingParams``),
and the running pool a request carries while its prompt is computed chunk by chunk.

An embedding request (``Request.pooling_params`` set) is a prompt-only request: the scheduler
computes its prompt like any other (chunked prefill, preemption), it samples nothing, and it
finishes once its whole prompt is computed, with ``RequestOutput.embedding``. Each step the model
runner gives, per chunk of such a request, the sum of the chunk's final hidden states (after the
model's final norm) and the last one (``PooledChunk``); the request accumulates them
(``PooledPrefix``). Tensors are used only through their methods: this module imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

POOLING_TYPES = ("mean", "last")


@dataclass(frozen=True)
class PoolingParams:
    """``pooling``: ``mean`` (the average of the prompt's final hidden states) or ``last`` (the last
    prompt token's); ``normalize``: divide the result by its L2 norm (a zero vector stays zero)."""

    pooling: str = "mean"
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling not in POOLING_TYPES:
            raise ValueError(f"embedding.pooling must be one of {', '.join(POOLING_TYPES)}, got {self.pooling!r}")


@dataclass(frozen=True)
class PooledChunk:
    """One step's contribution to a request's pool: prompt positions ``[start, start + num_tokens)``,
    ``total`` the sum of their final hidden states (float64, ``[hidden]``), ``last`` the last one's."""

    start: int
    num_tokens: int
    total: torch.Tensor
    last: torch.Tensor


@dataclass(frozen=True)
class PooledPrefix:
    """The pool of a request's first ``num_tokens`` prompt positions."""

    num_tokens: int
    total: torch.Tensor
    last: torch.Tensor

    @staticmethod
    def extend(prefix: PooledPrefix | None, chunk: PooledChunk) -> PooledPrefix:
        """``prefix`` followed by ``chunk``. A chunk from position 0 starts afresh (the prompt is being
        recomputed after a preemption); otherwise it must continue exactly where ``prefix`` ends."""
        if chunk.start == 0 or prefix is None:
            if chunk.start != 0:
                raise ValueError(f"a pooled chunk at position {chunk.start} has no pool before it")
            return PooledPrefix(chunk.num_tokens, chunk.total, chunk.last)
        if chunk.start != prefix.num_tokens:
            raise ValueError(f"a pooled chunk at position {chunk.start} after a pool of {prefix.num_tokens} tokens")
        return PooledPrefix(prefix.num_tokens + chunk.num_tokens, prefix.total + chunk.total, chunk.last)

    def embedding(self, params: PoolingParams) -> list[float]:
        """The pooled vector as plain floats (computed in float64)."""
        vector = self.total / self.num_tokens if params.pooling == "mean" else self.last.double()
        if params.normalize:
            norm = vector.norm()
            if float(norm) > 0.0:
                vector = vector / norm
        values: list[float] = vector.tolist()
        return values
