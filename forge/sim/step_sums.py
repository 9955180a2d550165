"""What the per-operator cost models read of one step: token counts and sums over its decode and
prefill rows, from a ``SchedulerOutput`` (column-wise decodes summed at C speed) or a ``BatchShape``."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from forge.core.outputs import SchedulerOutput
from forge.sim.cost_model import BatchShape, CostModel, FastCostModel


# not frozen: one is built per simulated step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass(slots=True)
class StepSums:
    """A row of one new token is a decode (context ``s`` after the step); any other row is a prefill
    chunk of ``q`` tokens ending at ``s``. ``prefill_pairs``: Σ q·(s − (q − 1)/2), the (query, key)
    pairs of causal attention; ``prefill_query_sq``: Σ q²; ``prefill_cached_pairs``: Σ q·(s − q), the
    part of ``prefill_pairs`` whose keys were cached before the step (earlier chunks, prefix hits)."""

    tokens: int
    num_decodes: int
    decode_context: int
    num_prefills: int
    prefill_query_sq: int
    prefill_pairs: float
    num_sampled: int
    prefill_cached_pairs: int = 0

    @classmethod
    def of_batch(cls, batch: BatchShape) -> StepSums:
        dec = dec_ctx = pre = qsq = cached = 0
        pairs = 0.0
        for q, s in zip(batch.query_lens, batch.seq_lens, strict=True):
            if q == 1:
                dec += 1
                dec_ctx += s
            else:
                pre += 1
                qsq += q * q
                pairs += q * (s - (q - 1) / 2)
                cached += q * (s - q)
        return cls(sum(batch.query_lens), dec, dec_ctx, pre, qsq, pairs, batch.num_sampled, cached)

    @classmethod
    def of_sched(cls, sched: SchedulerOutput) -> StepSums:
        starts = sched.decodes.starts
        return cls.of_rows(sched.num_batched_tokens, len(starts), sum(starts) + len(starts), sched.chunks)

    @classmethod
    def of_rows(cls, tokens: int, num_decodes: int, decode_context: int, chunks: Sequence[Span]) -> StepSums:
        """The sums of ``num_decodes`` decodes whose contexts after the step sum to ``decode_context``, then
        ``chunks`` in row order (a one-token chunk counts as a decode)."""
        dec, dec_ctx, pre, qsq, cached, sampled = num_decodes, decode_context, 0, 0, 0, num_decodes
        pairs = 0.0
        for c in chunks:
            start, q = c.start, c.num_tokens
            end = start + q
            sampled += c.sample + c.num_draft_tokens
            if q == 1:
                dec += 1
                dec_ctx += end
            else:
                pre += 1
                qsq += q * q
                pairs += q * (end - (q - 1) / 2)
                cached += q * start
        return cls(tokens, dec, dec_ctx, pre, qsq, pairs, sampled, cached)


class Span(Protocol):
    """A chunk as ``StepSums.of_rows`` reads it (``ScheduledRequest`` is one): its first position, its tokens,
    whether it samples, and its draft tokens (each verified: one more sampled row)."""

    @property
    def start(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def sample(self) -> bool: ...

    @property
    def num_draft_tokens(self) -> int: ...


class SummedCostModel(CostModel, FastCostModel):
    """A cost model computed from a step's ``StepSums`` (``time_of``); an empty step costs 0."""

    @abstractmethod
    def time_of(self, sums: StepSums) -> float: ...

    def step_time(self, batch: BatchShape) -> float:
        if not batch.query_lens:
            return 0.0
        return self.time_of(StepSums.of_batch(batch))

    def step_time_of(self, sched: SchedulerOutput) -> float:
        if sched.num_batched_tokens == 0:
            return 0.0
        return self.time_of(StepSums.of_sched(sched))

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        n = num_decodes
        return self.time_of(StepSums(n, n, context_sum, 0, 0, 0.0, n))
