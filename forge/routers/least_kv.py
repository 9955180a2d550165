"""Least KV: the replica whose KV cache has the lowest fraction of its blocks in use."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router, least


class LeastKV(Router):
    """The replica with the lowest ``kv_usage`` (ties: the lowest index)."""

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least(replicas, "kv_usage")
