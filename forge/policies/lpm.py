from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class LPM(Policy):
    """Longest prefix match first (SGLang's cache-aware scheduling).

    The waiting request whose known tokens have the longest prefix already in the prefix
    cache goes first, so requests sharing a cached prompt run while it is still cached.
    Keys are recomputed every step (``rekey_each_step``) from ``ctx.prefix_len``, since
    the cache changes while requests wait; ties by arrival. Without prefix caching every
    match is 0 and this is FCFS. When more than ``max_queue`` requests wait, matching
    them all each step is too costly and the policy falls back to FCFS order (as SGLang
    does). The latest arrival is preempted first.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    rekey_each_step = True

    def __init__(self, max_queue: int = 128) -> None:
        if max_queue < 0:
            raise ValueError(f"scheduler.max_queue must be >= 0, got {max_queue}")
        self.max_queue = max_queue

    def waiting_key(self, request: Request) -> tuple[int, float, str]:
        match = self.ctx.prefix_len(request) if self.ctx.num_waiting() <= self.max_queue else 0
        return (-match, request.arrival_time, request.request_id)

    def pick_victim(self, candidates: list[Request]) -> Request:
        return max(candidates, key=lambda r: (r.arrival_time, r.request_id))
