"""One event loop over a pool of replicas behind a router.

Under a simulated clock each replica keeps its own clock; the loop always acts on the earliest event:
the next arrival (routed at its arrival time, then queued on its replica; ties go to the arrival, as
``Engine.run`` adds a request arriving at the very time a step would start before that step) or the
next step of the busy replica whose clock is earliest (ties: the lowest index). A replica steps
through ``Engine.advance`` with the time of the next request that may reach it as its deadline, so
it keeps its decode runs (``forge.core.fast_paths``) between the events that touch it: with a router
that reads no replica state (``Router.reads_replicas``) every request is routed up front and that is
the replica's own next arrival; otherwise any arrival may go to any replica, and the next arrival
anywhere bounds every run. Either way every replica has taken exactly the steps that start before an
arrival when the router sees it, so the routing and every record are those of stepping one step at a
time: a pure function of the config. One replica is ``Engine.run``, step for step.

A router sees a replica as it is after its last step, which may end after the arrival being routed
(a step's effects are applied when it is taken): at most one step's look-ahead.

Under the wall clock the replicas are real engines stepped in turn in this process.

When no output is kept (``run(keep=False)``, as ``python run.py`` runs) and the routes are fixed up front,
replicas whose components all declare it run by events (``forge.engine.event_runs``): the same records."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from forge.cluster.view import EngineView
from forge.core.outputs import RequestOutput
from forge.core.request import Request
from forge.engine.engine import Engine
from forge.engine.event_runs import run_by_events
from forge.engine.gc_pause import rare_gc
from forge.engine.progress import progress_bar
from forge.routers.base import Router, reads_replicas

_ARRIVAL_TIME = attrgetter("arrival_time")


@dataclass(frozen=True)
class Replica:
    """One engine of the cluster: ``index`` (its place in the pool), ``hardware`` (its clock's
    preset, or None for a clock without one), ``offset`` (its clock's time when the run started)."""

    index: int
    engine: Engine
    hardware: str | None
    offset: float = 0.0


class Arrivals:
    """The requests still to arrive, in arrival order; with ``targets`` (routes fixed up front) each
    replica's own next arrival, else the next arrival anywhere bounds every replica."""

    def __init__(self, pending: list[Request], targets: list[int] | None, num_replicas: int) -> None:
        self.pending, self.i, self.targets = pending, 0, targets
        self._own: list[deque[float]] = [deque() for _ in range(num_replicas)]
        for request, target in zip(pending, targets or [], strict=False):
            self._own[target].append(request.arrival_time)

    def next_time(self) -> float:
        return self.pending[self.i].arrival_time if self.i < len(self.pending) else math.inf

    def deadline(self, replica: int) -> float:
        """The arrival time of the next request that may reach ``replica``."""
        if self.targets is None:
            return self.next_time()
        own = self._own[replica]
        return own[0] if own else math.inf

    def pop(self) -> tuple[Request, int | None]:
        request, target = self.pending[self.i], self.targets[self.i] if self.targets is not None else None
        self.i += 1
        if target is not None:
            self._own[target].popleft()
        return request, target


class ReplicaPool:
    """Replicas behind one router, run as one event loop (the module's docstring)."""

    def __init__(self, replicas: Sequence[Replica], router: Router) -> None:
        if not replicas:
            raise ValueError("a pool needs at least one replica")
        self.replicas = list(replicas)
        self.router = router
        self.views = [EngineView(r.index, r.engine) for r in self.replicas]
        # each replica's clock (cluster time) while busy, inf while idle: kept by ``admit`` and
        # ``advance`` under simulated clocks, which move only then; None: wall clocks, read live
        simulated = all(r.engine.clock.simulated for r in self.replicas)
        self._busy_at: list[float] | None = (
            [self._busy_time(i) for i in range(len(self.replicas))] if simulated else None
        )

    def run(self, requests: Iterable[Request], progress: bool = False, keep: bool = True) -> dict[str, RequestOutput]:
        """Route each request at its ``arrival_time`` (seconds from the start) and run every replica
        until all finish; the finals by request id (``keep=False``: none kept, an empty dict; the
        records are the engines'). Every replica must be idle at the end."""
        with rare_gc():
            finals = self._run(sorted(requests, key=_ARRIVAL_TIME), progress, keep)
        for r in self.replicas:
            r.engine.check_idle()
        return finals

    def _run(self, pending: list[Request], progress: bool, keep: bool) -> dict[str, RequestOutput]:
        targets = None if reads_replicas(self.router) else [self.router.route(r, self.views) for r in pending]
        if targets is not None and not keep and self._by_events(pending, targets):
            with progress_bar(len(pending), progress) as bar:
                bar.update(len(pending))
            return {}
        arrivals = Arrivals(pending, targets, len(self.replicas))
        finals: dict[str, RequestOutput] = {}
        with progress_bar(len(pending), progress) as bar:
            while True:
                busy = self.earliest_busy()
                t = arrivals.next_time()
                if busy is None and t == math.inf:
                    return finals
                if busy is None or t <= busy[0]:
                    request, target = arrivals.pop()
                    self.admit(self.router.route(request, self.views) if target is None else target, request)
                    continue
                done = self.advance(busy[1], arrivals.deadline(busy[1]))
                if keep:
                    finals.update((out.request_id, out) for out in done)
                bar.update(len(done))

    def _by_events(self, pending: list[Request], targets: list[int]) -> bool:
        """Every replica's requests (routed up front) run by events (``forge.engine.event_runs``), if all can."""
        n = len(self.replicas)
        if not all(0 <= t < n for t in targets):
            return False  # (``admit`` names the router's mistake)
        own: list[list[Request]] = [[] for _ in range(n)]
        for request, target in zip(pending, targets, strict=True):
            own[target].append(request)
        engines, offsets = [r.engine for r in self.replicas], [r.offset for r in self.replicas]
        return run_by_events(engines, offsets, own)

    def advance(self, index: int, deadline: float) -> list[RequestOutput]:
        """``Engine.advance`` of replica ``index`` up to ``deadline`` (cluster time): its finished outputs."""
        replica = self.replicas[index]
        done = replica.engine.advance(replica.offset + deadline)
        if self._busy_at is not None:
            self._busy_at[index] = self._busy_time(index)
        return done

    def _busy_time(self, index: int) -> float:
        """Replica ``index``'s clock in cluster time while it is busy, inf while idle."""
        r = self.replicas[index]
        return r.engine.clock.now() - r.offset if r.engine.has_unfinished() else math.inf

    def earliest_busy(self) -> tuple[float, int] | None:
        """(time, index) of the busy replica whose clock is earliest (ties: the lowest index); None
        when all are idle."""
        times = self._busy_at if self._busy_at is not None else [self._busy_time(i) for i in range(len(self.replicas))]
        t = min(times)
        return (t, times.index(t)) if t != math.inf else None

    def admit(self, target: int, request: Request) -> None:
        """Queue ``request`` on replica ``target`` at its arrival (an idle replica's clock waits for it)."""
        if not 0 <= target < len(self.replicas):
            raise ValueError(f"router {type(self.router).__name__} chose replica {target} of {len(self.replicas)}")
        replica = self.replicas[target]
        engine = replica.engine
        request.arrival_time += replica.offset
        if not engine.has_unfinished():
            engine.clock.wait_until(request.arrival_time)
        engine.add_request(request)
        if self._busy_at is not None:  # (``_busy_time``: the replica holds this request, so it is busy)
            self._busy_at[target] = engine.clock.now() - replica.offset
