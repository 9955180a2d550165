"""Plain data passed between the scheduler, the model runner and the caller."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from forge.core.pooling import PooledChunk
    from forge.core.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """Tokens [start, start + num_tokens) of one request are computed this step.

    ``sample`` says whether the last scheduled position is the last known token, i.e. a
    new token is sampled after it. ``num_draft_tokens`` of the scheduled tokens are
    speculative drafts to be verified. ``num_prompt_logprob_rows``: the first that many scheduled
    positions (from ``start``) each predict a prompt token whose logprob the request asked for
    (``SamplingParams.prompt_logprobs``): position p gives prompt token p + 1's. ``block_table`` is the
    table of the KV cache's first group, ``group_tables`` those of the others (``forge.core.kv_groups``;
    empty with one group).
    """

    request_id: str
    start: int
    num_tokens: int
    token_ids: list[int]
    block_table: list[int]
    sample: bool
    num_draft_tokens: int = 0
    num_prompt_logprob_rows: int = 0
    group_tables: tuple[list[int], ...] = ()


@dataclass(slots=True)
class DecodeRows:
    """The step's plain decodes, all of them, column-wise (as vLLM's ``CachedRequestData``): row i
    computes one token, ``token_ids[i]`` (its request's last output token), at position ``starts[i]``
    through ``block_tables[i]`` and samples the token after it; no drafts. Equal to the rows
    ``rows()`` gives.
    ``requests[i]``: the row's request (filled by the scheduler; empty for rows built elsewhere).
    ``group_tables[i]``: its other KV cache groups' tables (empty when the cache has one group)."""

    request_ids: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    block_tables: list[list[int]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    group_tables: list[tuple[list[int], ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.request_ids)

    def rows(self) -> list[ScheduledRequest]:
        """The same rows as ``ScheduledRequest`` objects."""
        rows = [
            ScheduledRequest(rid, start, 1, [token], table, True)
            for rid, start, token, table in zip(
                self.request_ids, self.starts, self.token_ids, self.block_tables, strict=True
            )
        ]
        for row, groups in zip(rows, self.group_tables, strict=False):
            row.group_tables = groups
        return rows


# not frozen: one is built per step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass
class SchedulerOutput:
    """One step's rows: ``decodes`` (every plain decode, ``Request.is_decoding``, column-wise) first,
    then ``chunks`` (every other row: prompt chunks, drafts to verify; never a plain decode, so a
    decode has one representation); ``scheduled`` is every row in that order as ``ScheduledRequest``
    objects (built on first use). Consumers that only need the rows generically read ``scheduled``;
    the fast paths (sums over the step, the host model) read the two parts.
    Self-contained: ``requests`` are the rows' requests in the same order (``decodes.requests``, then
    ``chunk_requests``), so neither the runner nor ``Scheduler.update`` looks a request up by id."""

    chunks: list[ScheduledRequest]
    num_batched_tokens: int
    preempted_ids: list[str] = field(default_factory=list)
    num_waiting: int = 0
    # KV tensor copies to do before the forward, in this order; (src, dst) block ids.
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # GPU -> CPU pool
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)  # GPU -> GPU (copy-on-write)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # CPU pool -> GPU
    decodes: DecodeRows = field(default_factory=DecodeRows)
    chunk_requests: list[Request] = field(default_factory=list)  # the request of each of ``chunks``

    @cached_property
    def scheduled(self) -> list[ScheduledRequest]:
        return self.decodes.rows() + self.chunks if self.decodes else self.chunks

    @property
    def requests(self) -> list[Request]:
        """The request of each row of ``scheduled``, in that order."""
        return self.decodes.requests + self.chunk_requests if self.decodes else self.chunk_requests

    @property
    def num_rows(self) -> int:
        return len(self.decodes.request_ids) + len(self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks and not self.decodes.request_ids


# not frozen: one is built per step, and a frozen dataclass's __init__ costs several times a plain one's
@dataclass
class ModelOutput:
    """Per request: the accepted tokens this step (one, or several after speculation).
    ``decode_token_ids``, when given, are the tokens of the step's ``decodes`` rows, one each in
    their order (with no logprobs), and ``sampled_token_ids`` holds only the chunks' requests.
    ``failed``: requests whose sampling (or constraint, or verification) failed this step, with
    the reason; they have no tokens here and the engine finishes them with that error.
    ``prompt_logprobs``: per request with prompt-logprob rows this step, one entry per row (the
    chunk's ``num_prompt_logprob_rows``), in position order; ``prompt_ranks`` the same rows' prompt
    token's rank in the whole vocabulary (1: the most likely; vLLM's: how many tokens are at least as
    likely).
    ``pooled``: per embedding request scheduled this step, its chunk's pooled hidden states."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    prompt_logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    prompt_ranks: dict[str, list[int]] = field(default_factory=dict)
    decode_token_ids: list[int] | None = None
    failed: dict[str, str] = field(default_factory=dict)
    pooled: dict[str, PooledChunk] = field(default_factory=dict)

    def decode_tokens(self, decodes: DecodeRows) -> list[int]:
        """The token of each of ``decodes``' rows, in their order, whichever way they came (-1 for a
        request in ``failed``, which has none; the engine aborts those before ``update``)."""
        if self.decode_token_ids is not None:
            return self.decode_token_ids
        sampled = self.sampled_token_ids
        if self.failed:
            return [sampled[rid][0] if rid in sampled else -1 for rid in decodes.request_ids]
        return [sampled[rid][0] for rid in decodes.request_ids]


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
    # on the request's first output when sampling_params.prompt_logprobs is set: per prompt token,
    # {token id: logprob} of it and the top-k given the tokens before it (None for the first token)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # with prompt_logprobs: each prompt token's rank in the vocabulary (ModelOutput.prompt_ranks; None for the first)
    prompt_ranks: list[int | None] | None = None
    # an embedding request's (``Request.pooling_params``) pooled prompt, on its final output
    embedding: list[float] | None = None
    # a beam search result's sum of its tokens' logprobs (the raw model distribution)
    cumulative_logprob: float | None = None
    # the prefix-cache hit of the request's first admission (``Request.prompt_cached_tokens``): what the
    # server reports as usage.prompt_tokens_details.cached_tokens; num_cached_tokens is the latest one's
    prompt_cached_tokens: int = 0


def stopped_output(request: Request, finish_reason: str, error: str | None = None) -> RequestOutput:
    """The final output of a request stopped from outside its step (aborted, or failed): what it has
    generated so far, no new tokens."""
    return RequestOutput(
        request_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        token_ids=list(request.output_token_ids),
        new_token_ids=[],
        finished=True,
        finish_reason=finish_reason,
        num_cached_tokens=request.num_cached_tokens,
        error=error,
        prompt_cached_tokens=request.prompt_cached_tokens or 0,
    )
