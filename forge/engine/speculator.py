"""Speculative decoding around the engine's step: drafts attached before scheduling, verification
outcomes recorded after the step, the drafter told when a request leaves."""

from __future__ import annotations

from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.core.request import Request
from forge.spec.base import Drafter, SpecDecodeStats, draft_limit


class Speculator:
    """The engine's one handle on a ``Drafter`` (None: no speculation, every call a no-op).

    ``propose(running, max_model_len)`` attaches drafts (``Request.spec_token_ids``) to the decoding
    requests the drafter proposes for, each within its ``draft_limit``; the scheduler then schedules
    them all or none and the runner verifies them. ``record(sched, out)`` counts what the target
    accepted (``stats``) and tells the drafter. ``forget(request_id)``: the request left."""

    def __init__(self, drafter: Drafter | None) -> None:
        self.drafter = drafter
        self.stats = SpecDecodeStats()

    def propose(self, running: list[Request], max_model_len: int) -> None:
        if self.drafter is None:
            return
        limits = {r.request_id: n for r in running if (n := draft_limit(r, max_model_len)) > 0}
        if not limits:
            return
        ready = [r for r in running if r.request_id in limits]
        by_id = {r.request_id: r for r in ready}
        for rid, draft in self.drafter.propose(ready, limits).items():
            by_id[rid].spec_token_ids = draft.token_ids[: limits[rid]]

    def record(self, sched: SchedulerOutput, out: ModelOutput) -> None:
        if self.drafter is None:
            return
        for s in sched.chunks:  # the decodes have no drafts
            if s.sample and s.num_draft_tokens and s.request_id not in out.failed:
                accepted = len(out.sampled_token_ids[s.request_id]) - 1
                self.stats.record(s.num_draft_tokens, accepted)
                self.drafter.observe(s.request_id, s.num_draft_tokens, accepted)

    def forget(self, request_id: str) -> None:
        if self.drafter is not None:
            self.drafter.remove(request_id)

    def leak(self) -> str | None:
        """What the drafter still tracks when the engine is idle (None: nothing)."""
        n = self.drafter.num_tracked() if self.drafter is not None else 0
        return f"the drafter still tracks {n} requests" if n else None
