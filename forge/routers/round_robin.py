"""Round robin: request i goes to replica i mod N (Vidur's ``round_robin`` global scheduler)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router


class RoundRobin(Router):
    """The i-th request routed (in arrival order) goes to replica ``i mod N``."""

    reads_replicas = False  # only their number

    def __init__(self) -> None:
        self._count = 0

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        index = self._count % len(replicas)
        self._count += 1
        return index
