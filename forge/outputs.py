"""Plain data passed between the scheduler, the model runner and the caller."""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledRequest]
    num_batched_tokens: int
    preempted_ids: list[str] = field(default_factory=list)
    num_waiting: int = 0
    # KV tensor copies to do before the forward, in this order; (src, dst) block ids.
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # GPU -> CPU pool
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)  # GPU -> GPU (copy-on-write)
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # CPU pool -> GPU

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(frozen=True)
class ModelOutput:
    """Per request: the accepted tokens this step (one, or several after speculation)."""

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[dict[int, float]]] = field(default_factory=dict)


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
