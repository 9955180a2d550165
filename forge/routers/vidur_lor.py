"""Vidur's ``lor`` global scheduler: the replica with the fewest requests not yet scheduled there.

Vidur (microsoft/vidur, ``vidur/scheduler/global_scheduler/lor_global_scheduler.py``) counts each
replica scheduler's ``num_pending_requests``, the length of its request queue: requests that arrived
and have not been scheduled, preempted ones put back included; the running batch is not counted.
Ties go to the lowest replica id (``min`` over the replicas in id order)."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router, least


class VidurLOR(Router):
    """The replica with the fewest waiting requests (ties: the lowest index), running ones ignored."""

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return least(replicas, "num_waiting")
