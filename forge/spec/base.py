"""The drafter contract, per-request draft bounds, and the speculative-decoding counters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.core.request import Request


@dataclass(frozen=True)
class Draft:
    """Proposed tokens for one request. Sampled requests are verified by coupling (the target's own
    draw at each position, ``forge.spec.verify``), so a drafter reports no distribution: one that
    samples should draw with the target's generator for the position to be accepted often."""

    token_ids: list[int]


class Drafter(ABC):
    """Proposes draft tokens for running requests; the target verifies them (``forge.spec.verify``).

    - ``propose(requests, limits)``: drafts for some of ``requests`` (every one is decode-ready:
      all its known tokens but the last are in the target's KV cache), at most
      ``limits[request_id]`` tokens each, and at most ``num_speculative_tokens``. A request
      may get none. Must not modify the requests.
    - ``observe(request_id, num_draft, num_accepted)``: how many of a request's drafts the
      target accepted (drafts may have been cut short by the scheduler's budget).
    - ``remove(request_id)``: the request finished or was aborted; drop what is kept for it.
    - ``num_tracked()``: requests the drafter keeps state for (the engine checks it drops to 0).
    """

    num_speculative_tokens: int

    @abstractmethod
    def propose(self, requests: Sequence[Request], limits: Mapping[str, int]) -> dict[str, Draft]: ...

    def observe(self, request_id: str, num_draft: int, num_accepted: int) -> None:
        """Verification outcome of one request's drafts (default: ignored)."""

    @abstractmethod
    def remove(self, request_id: str) -> None: ...

    @abstractmethod
    def num_tracked(self) -> int: ...


def draft_limit(request: Request, max_model_len: int) -> int:
    """Most draft tokens ``request`` may carry this step: 0 unless it is decoding (everything
    but its last token computed, no drafts yet, no token constraint); drafts plus the bonus
    token never exceed ``max_tokens``, and draft positions stay below ``max_model_len``. An
    embedding request (``pooling_params``) samples nothing, so it never drafts."""
    if request.spec_token_ids or request.constraint is not None or request.pooling_params is not None:
        return 0
    if request.num_computed_tokens != request.num_tokens - 1:
        return 0
    left = request.sampling_params.max_tokens - request.num_output_tokens - 1
    return max(min(left, max_model_len - request.num_tokens), 0)


@dataclass
class SpecDecodeStats:
    """Counters over verified drafts (vLLM's ``spec_decode_*`` metrics).

    A *draft* is one request's proposal verified in one step; accepted tokens are counted at
    verification (before a stop condition may cut the emitted tokens short).
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    drafts_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft: int, num_accepted: int) -> None:
        if not 0 <= num_accepted <= num_draft:
            raise ValueError(f"accepted {num_accepted} of {num_draft} drafts")
        if num_draft == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        grow = num_draft - len(self.drafts_per_position)
        if grow > 0:
            self.drafts_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(num_draft):
            self.drafts_per_position[i] += 1
            self.accepted_per_position[i] += i < num_accepted

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verified draft: accepted drafts + the correction/bonus token."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_per_position, self.drafts_per_position, strict=True)]

    def counters(self) -> dict[str, int]:
        """Monotone counters under vLLM's Prometheus names (without the prefix)."""
        return {
            "spec_decode_num_drafts_total": self.num_drafts,
            "spec_decode_num_draft_tokens_total": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens_total": self.num_accepted_tokens,
        }

    def summary(self) -> dict[str, Any]:
        return {
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_acceptance_rate": self.acceptance_rate,
            "spec_mean_acceptance_length": self.mean_acceptance_length,
            "spec_acceptance_per_position": [round(x, 4) for x in self.acceptance_per_position],
        }
