"""Plain data passed between the scheduler, the model runner and the caller."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(slots=True)
class ScheduledRequest:
    """Tokens [start, start + num_tokens) of one request are computed this step.

    ``sample`` says whether the last scheduled position is the last known token, i.e. a
    new token is sampled after it. ``num_draft_tokens`` of the scheduled tokens are
    speculative drafts to be verified.
    """

    request_id: str
    start: int
    num_tokens: int
    token_ids: list[int]
    block_table: list[int]
    sample: bool
    num_draft_tokens: int = 0


@dataclass(slots=True)
class DecodeRows:
    """Plain decodes, column-wise (as vLLM's ``CachedRequestData``): row i computes one token,
    ``token_ids[i]`` (its request's last output token), at position ``starts[i]`` through
    ``block_tables[i]`` and samples the token after it; no drafts. Equal to the rows ``rows()`` gives."""

    request_ids: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request_ids)

    def rows(self) -> list[ScheduledRequest]:
        """The same rows as ``ScheduledRequest`` objects."""
        return [
            ScheduledRequest(rid, start, 1, [token], table, True)
            for rid, start, token, table in zip(
                self.request_ids, self.starts, self.token_ids, self.block_tables, strict=True
            )
        ]


@dataclass(frozen=True, slots=True)
class StepTotals:
    """Sums over a step's chunks that the simulated clock and the metrics need. The scheduler folds
    them in as it schedules, so neither needs a pass over the chunks; ``of`` computes them from the
    chunks (for a ``SchedulerOutput`` built elsewhere, and as the reference in tests)."""

    num_prefill_tokens: int  # scheduled tokens at prompt positions
    num_draft_tokens: int
    num_sampled: int  # rows of logits: one per sampling chunk plus one per draft token
    sum_seq_lens: int  # sum of start + num_tokens: each chunk's context after the step
    sum_query_seq: int  # sum of num_tokens * (start + num_tokens)
    sum_query_sq: int  # sum of num_tokens ** 2

    @classmethod
    def of(cls, chunks: Sequence[ScheduledRequest], num_prompt_tokens: Callable[[str], int]) -> StepTotals:
        """``num_prompt_tokens(request_id)``: the prompt length of each chunk's request."""
        prefill = drafts = sampled = seq = query_seq = query_sq = 0
        for c in chunks:
            q, end = c.num_tokens, c.start + c.num_tokens
            n_prompt = num_prompt_tokens(c.request_id)
            if c.start < n_prompt:
                prefill += min(end, n_prompt) - c.start
            drafts += c.num_draft_tokens
            sampled += c.sample + c.num_draft_tokens
            seq += end
            query_seq += q * end
            query_sq += q * q
        return cls(prefill, drafts, sampled, seq, query_seq, query_sq)

    def plus_decodes(self, num_rows: int, sum_seq_lens: int) -> StepTotals:
        """These totals plus ``num_rows`` one-token sampling chunks at output positions."""
        return StepTotals(
            self.num_prefill_tokens,
            self.num_draft_tokens,
            self.num_sampled + num_rows,
            self.sum_seq_lens + sum_seq_lens,
            self.sum_query_seq + sum_seq_lens,
            self.sum_query_sq + num_rows,
        )


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's rows: ``decodes`` (plain decodes, column-wise) first, then ``chunks``; ``scheduled``
    is every row in that order as ``ScheduledRequest`` objects (built on first use). Consumers that
    only need the rows generically read ``scheduled``; the host fast path reads the two parts."""

    chunks: list[ScheduledRequest]
    num_batched_tokens: int
    preempted_ids: list[str] = field(default_factory=list)
    num_waiting: int = 0
    # KV tensor copies to do before the forward, in this order; (src, dst) block ids.
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # GPU -> CPU pool
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)  # GPU -> GPU (copy-on-write)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # CPU pool -> GPU
    # Sums over ``scheduled`` (the scheduler's output has them; None: consumers compute them).
    totals: StepTotals | None = None
    decodes: DecodeRows = field(default_factory=DecodeRows)

    @cached_property
    def scheduled(self) -> list[ScheduledRequest]:
        return self.decodes.rows() + self.chunks if self.decodes else self.chunks

    @property
    def num_rows(self) -> int:
        return len(self.decodes) + len(self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.decodes


@dataclass(frozen=True)
class ModelOutput:
    """Per request: the accepted tokens this step (one, or several after speculation).
    ``decode_token_ids``, when given, are the tokens of the step's ``decodes`` rows, one each in
    their order (with no logprobs), and ``sampled_token_ids`` holds only the chunks' requests.
    ``failed``: requests whose sampling (or constraint, or verification) failed this step, with
    the reason; they have no tokens here and the engine finishes them with that error."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    decode_token_ids: list[int] | None = None
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    text: str = ""
    num_cached_tokens: int = 0
    # per new token: {token id: logprob} of the chosen token and the top-k (when sampling_params.logprobs is set)
    logprobs: list[dict[int, float]] | None = None
    # why the request failed (finish_reason "error"): its sampling or the model step raised
    error: str | None = None
