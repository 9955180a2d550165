from __future__ import annotations

from forge.policies.base import Policy
from forge.request import Request


class FCFS(Policy):
    """First come, first served; the latest arrival is preempted first."""

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)
