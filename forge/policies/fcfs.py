from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class FCFS(Policy):
    """First come, first served; the latest arrival is preempted first."""

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)
