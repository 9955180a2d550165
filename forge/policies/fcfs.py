from __future__ import annotations

from forge.core.request import Request
from forge.policies.base import Policy


class FCFS(Policy):
    """First come, first served; the latest arrival is preempted first."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)
    event_runs = True  # its steps are those of forge.sim.event_replica's model, where it applies

    def waiting_key(self, request: Request) -> tuple[float, str]:
        return (request.arrival_time, request.request_id)
