"""Least outstanding requests: the replica with the fewest unfinished requests (waiting + running)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router, least


class LeastOutstanding(Router):
    """The replica with the fewest unfinished requests, queued or running (ties: the lowest index).
    Unlike ``vidur_lor`` it counts the running requests too."""

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least(replicas, "num_outstanding")
