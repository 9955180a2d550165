"""The router contract: a new request and a read-only view of every replica in, a replica index out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

from forge.core.request import Request


class ReplicaView(Protocol):
    """What a router may read of one replica, now (the cluster's time of the request's arrival).

    - ``index``: the replica's position (0 .. N-1) in the pool the router serves.
    - ``num_waiting``: requests queued there and not yet scheduled (preempted ones queued again
      count too); ``num_running``: requests holding a batch slot.
    - ``num_outstanding``: its unfinished requests (waiting + running + swapped).
    - ``outstanding_tokens``: tokens those requests have still to compute: prompt not yet in the KV
      cache plus outputs not yet generated (``max_tokens``; a request may stop earlier).
    - ``kv_usage``: the fraction of its KV blocks in use (0.0 .. 1.0).
    - ``prefix_match(request)``: tokens of ``request``'s prompt its prefix cache holds now (0 without
      prefix caching); a pure query, it takes no references.

    Every member is a query; nothing a router does through a view changes a replica.

    The simulator's views (``forge.cluster``) are exact. Behind ``forge route`` (``forge.gateway``) a
    replica is a server the gateway polls, and its views are estimates: ``num_waiting``,
    ``num_running`` and ``kv_usage`` are the last poll of its ``/metrics`` plus the requests the gateway
    sent or saw finish since (``forge.gateway.load``); ``num_outstanding`` and ``outstanding_tokens``
    count the gateway's own requests in flight there; ``prefix_match`` reads the gateway's record of
    the prompts it sent there."""

    @property
    def index(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_outstanding(self) -> int: ...

    @property
    def outstanding_tokens(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...

    def prefix_match(self, request: Request) -> int: ...


class Router(ABC):
    """Picks the replica for each new request, in arrival order.

    - ``route(request, replicas)``: the index of the replica (into ``replicas``, never empty) that
      takes ``request``. Called once per request, at its arrival time, after every replica has taken
      the steps that start before it; ``replicas`` are views, valid for this call only.
    - A router may keep state of its own (a counter, a seeded random generator), built from its
      settings only, so a run under ``clock=simulated`` stays a pure function of its config. It must
      not modify ``request`` and cannot reach an engine through a view.
    - ``reads_replicas``: False promises ``route`` reads nothing of ``replicas`` but their number
      (round robin, random). The cluster then routes every request up front and lets each replica
      take its decode runs (``forge.core.fast_paths``) up to its own next arrival; True (the default,
      and what a subclass gets unless its own class body says otherwise) routes at each arrival and
      bounds every replica's runs by the next arrival anywhere. The answers are the same either way."""

    reads_replicas: bool = True

    @abstractmethod
    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int: ...


def reads_replicas(router: Router) -> bool:
    """Whether ``router`` may read its views: True unless its own class sets ``reads_replicas = False``."""
    return vars(type(router)).get("reads_replicas", True) is not False


def least(replicas: Sequence[ReplicaView], load: str) -> int:
    """The index of the replica with the smallest ``load`` attribute (ties: the lowest index)."""
    best = min(replicas, key=lambda r: (getattr(r, load), r.index))
    return best.index
