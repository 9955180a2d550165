from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class PriorityPolicy(Policy):
    """Lower ``priority`` value first (vLLM's convention), ties by arrival; the
    lowest-priority, latest request is preempted first."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def waiting_key(self, request: Request) -> tuple[int, float, str]:
        return (request.priority, request.arrival_time, request.request_id)
