"""A request in flight: prompt, generated tokens, and how many of them the KV cache holds."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from forge.core.beam_params import BeamSearchParams
from forge.core.pooling import PooledPrefix, PoolingParams
from forge.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self is not _WAITING and self is not _RUNNING


_WAITING, _RUNNING = RequestStatus.WAITING, RequestStatus.RUNNING


class TokenConstraint(Protocol):
    """Structured-output state of one request (see ``forge.structured``).

    ``allowed_mask(vocab_size)`` is a bool tensor of the tokens allowed next (None: any);
    ``accept(token)`` advances the state after a token is appended to the output."""

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None: ...

    def accept(self, token: int) -> None: ...


@dataclass(eq=False, slots=True)  # slots: ~300 bytes less a request (a million-request run holds them all)
class Request:
    """One generation request.

    There are no prefill or decode phases: the request has ``num_tokens`` known tokens
    (prompt + output, plus any draft tokens) of which ``num_computed_tokens`` are in the
    KV cache. Each step the scheduler schedules (part of) the gap.

    With ``pooling_params`` set it is an embedding request (``forge.core.pooling``): it computes its
    prompt, samples nothing (``sampling_params`` is unused) and finishes with the pooled embedding;
    ``pooled`` is the pool of its prompt positions computed so far.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    expected_output_len: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # the prefix-cache hit of its latest admission (0 again after a preemption)
    # the hit of its first admission, never reset: its prompt's cached tokens as a client is told
    prompt_cached_tokens: int | None = None
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    constraint: TokenConstraint | None = None
    # filled while the prompt is computed when sampling_params.prompt_logprobs is set (see RequestOutput)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_ranks: list[int | None] | None = None  # each prompt token's rank, alongside prompt_logprobs
    pooling_params: PoolingParams | None = None
    pooled: PooledPrefix | None = None
    # set: a beam search over this prompt, run above the engine (``forge.frontend.BeamSearchFrontend``; the
    # engine refuses it); the request is the search's template
    beam_search: BeamSearchParams | None = None

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens (prompt + output), draft tokens excluded."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Decoding (a plain decode step): everything but its last token is computed, that token is
        an output token, and it carries no drafts; its next step computes that one token and samples
        the one after it. The one definition the scheduler, the runner and the model's fast paths share."""
        out = self.output_token_ids
        return (
            not self.spec_token_ids
            and len(out) > 0
            and self.num_computed_tokens == len(self.prompt_token_ids) + len(out) - 1
        )

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens at positions [start, end) of prompt + output + drafts, to read: the whole prompt is
        ``prompt_token_ids`` itself (shared, as in ``RequestOutput``), any other range a new list."""
        n_prompt = len(self.prompt_token_ids)
        if end == start + 1 and start >= n_prompt and not self.spec_token_ids:  # the decode fast path
            return [self.output_token_ids[start - n_prompt]]
        if end <= n_prompt:  # within the prompt (a prompt chunk)
            return self.prompt_token_ids if start == 0 and end == n_prompt else self.prompt_token_ids[start:end]
        out: list[int] = []
        if start < n_prompt:
            out.extend(self.prompt_token_ids[start : min(end, n_prompt)])
        if end > n_prompt:
            tail = self.output_token_ids + self.spec_token_ids
            out.extend(tail[max(start - n_prompt, 0) : end - n_prompt])
        return out

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def finished(self) -> bool:
        status = self.status
        return status is not _WAITING and status is not _RUNNING
