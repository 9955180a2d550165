"""The model runner's side of embedding requests: which rows of the flat batch belong to them, and
each chunk's pooled final hidden states (``forge.core.pooling``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from forge.core.outputs import ScheduledRequest, SchedulerOutput
from forge.core.pooling import PooledChunk


@dataclass(frozen=True)
class PoolingRows:
    """The embedding requests' chunks of one step (``chunks``) and every one of their rows in the flat
    batch, chunk after chunk (``rows``: what the model's ``forward_hidden`` is asked for)."""

    chunks: list[ScheduledRequest]
    rows: list[int]

    @staticmethod
    def of(sched: SchedulerOutput) -> PoolingRows | None:
        """The step's embedding chunks (rows in ``build_forward_batch``'s order), or None if it has none."""
        chunks: list[ScheduledRequest] = []
        rows: list[int] = []
        row = len(sched.decodes)  # plain decodes come first, one row each, and never pool
        for s, r in zip(sched.chunks, sched.chunk_requests, strict=True):
            if r.pooling_params is not None:
                chunks.append(s)
                rows.extend(range(row, row + s.num_tokens))
            row += s.num_tokens
        return PoolingRows(chunks, rows) if chunks else None

    def pooled(self, hidden: torch.Tensor) -> dict[str, PooledChunk]:
        """Per chunk (by request id), its rows' sum (float64) and last row of ``hidden`` (the final
        hidden states of ``rows``, in that order)."""
        out: dict[str, PooledChunk] = {}
        at = 0
        for s in self.chunks:
            part = hidden[at : at + s.num_tokens].double()
            out[s.request_id] = PooledChunk(s.start, s.num_tokens, part.sum(dim=0).cpu(), part[-1].cpu())
            at += s.num_tokens
        return out
