"""Disaggregated prefill and decode: one event loop over a prefill pool and a decode pool.

A request arrives at the prefill pool (its router), which computes its prompt and first token (the
request with ``max_tokens=1``). When that finishes (a *handoff* event at the prefill's finish time),
the decode pool's router picks a decode replica and the prompt's KV crosses the link
(``Link.transfer_time``); at the transfer's end (a *KV arrival* event) the decode replica queues the
request with its prompt already computed and its first token known, and admits it when it has a batch
slot and KV blocks for it (the scheduler's ordinary admission: no prompt compute is charged there).
The first token reaches the user with the KV: TTFT includes the transfer.

The decode replica's cache is sized, timed and allocated for the prompt's KV, but only the timing of
the transfer is modelled: its blocks do not receive the prefill replica's token states, so a model
that reads its cache (``model=synthetic``) generates other tokens after the first than one engine
would; lengths and times are unaffected where lengths do not depend on the tokens
(``workload.ignore_eos``, which disaggregation requires).

Events go in time order: events (handoffs, then KV arrivals, by time) before a step starting at the
same time, arrivals after events of the same time, steps of the replica whose clock is earliest
(prefill replicas first). A decode replica's decode runs end before the next event that could touch
it: the next handoff or KV arrival known, the next arrival, or the earliest busy prefill replica's
clock (a handoff it makes comes later). So fast paths change nothing, as in ``forge.cluster.loop``."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from forge.cluster.loop import ReplicaPool
from forge.cluster.spec import Link
from forge.core.outputs import RequestOutput
from forge.core.request import Request
from forge.engine.gc_pause import rare_gc
from forge.engine.progress import progress_bar
from forge.sim.clock import SimulatedClock

HANDOFF, KV_ARRIVAL = 0, 1


@dataclass
class Handoff:
    """A request between its pools: the replicas it ran on (-1: none), when its prefill finished and
    its KV arrived (cluster time), and how long the transfer took."""

    output: RequestOutput  # the prefill's final output (its first token)
    first_token: int
    prefill_replica: int
    prefill_done: float
    decode_replica: int = -1
    kv_transfer_s: float = 0.0


class DisaggregatedCluster:
    """A prefill pool and a decode pool joined by ``link`` (the module's docstring)."""

    def __init__(self, prefill: ReplicaPool, decode: ReplicaPool, link: Link, layerwise_overlap: bool) -> None:
        for replica in prefill.replicas:
            if not isinstance(replica.engine.clock, SimulatedClock):
                raise ValueError("cluster=disaggregated needs clock=simulated (the KV transfer is simulated)")
        self.prefill, self.decode, self.link, self.layerwise = prefill, decode, link, layerwise_overlap
        self.handoffs: dict[str, Handoff] = {}
        self._events: list[tuple[float, int, int, str]] = []  # (time, kind, sequence, request id)
        self._sequence = itertools.count()

    def run(self, requests: Iterable[Request], progress: bool = False) -> dict[str, RequestOutput]:
        """Run every request through both pools; the finals by request id (a request of one output
        token: its prefill's)."""
        originals = sorted(requests, key=lambda r: r.arrival_time)
        with rare_gc():
            finals = self._run([_prefill_request(r) for r in originals], {r.request_id: r for r in originals}, progress)
        for pool in (self.prefill, self.decode):
            for replica in pool.replicas:
                replica.engine.check_idle()
        return finals

    def _run(self, pending: list[Request], originals: dict[str, Request], progress: bool) -> dict[str, RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        i = 0
        with progress_bar(len(pending), progress) as bar:
            while True:
                t_arrival = pending[i].arrival_time if i < len(pending) else math.inf
                t_event = self._events[0][0] if self._events else math.inf
                busy = self._earliest_busy()
                if busy is None and min(t_arrival, t_event) == math.inf:
                    return finals
                if busy is None or min(t_arrival, t_event) <= busy[0]:
                    if t_event <= t_arrival:
                        finals.update(self._event(originals))
                    else:
                        self.prefill.admit(self.prefill.router.route(pending[i], self.prefill.views), pending[i])
                        i += 1
                    continue
                done = self._step(busy, min(t_arrival, t_event), t_arrival, originals)
                finals.update(done)
                bar.update(len(done))

    def _earliest_busy(self) -> tuple[float, int, int] | None:
        """(time, pool: 0 prefill / 1 decode, index) of the busy replica whose clock is earliest."""
        found = [(b[0], k, b[1]) for k, p in enumerate((self.prefill, self.decode)) if (b := p.earliest_busy())]
        return min(found) if found else None

    def _step(
        self, busy: tuple[float, int, int], t_next: float, t_arrival: float, originals: dict[str, Request]
    ) -> dict[str, RequestOutput]:
        _, which, index = busy
        if which == 0:  # a prefill replica: runs until the next arrival could reach it
            for out in self.prefill.advance(index, t_arrival):
                self._prefill_done(index, out)
            return {}
        prefill_busy = self.prefill.earliest_busy()
        deadline = min(t_next, prefill_busy[0] if prefill_busy else math.inf)
        return {out.request_id: out for out in self.decode.advance(index, deadline)}

    def _prefill_done(self, index: int, out: RequestOutput) -> None:
        """Queue the handoff of a request whose prefill finished on prefill replica ``index``."""
        replica = self.prefill.replicas[index]
        done = replica.engine.recorder.requests[out.request_id].finish_time
        assert done is not None
        handoff = Handoff(out, out.token_ids[0], index, done - replica.offset)
        self.handoffs[out.request_id] = handoff
        self._push(handoff.prefill_done, HANDOFF, out.request_id)

    def _push(self, t: float, kind: int, request_id: str) -> None:
        heapq.heappush(self._events, (t, kind, next(self._sequence), request_id))

    def _event(self, originals: dict[str, Request]) -> dict[str, RequestOutput]:
        t, kind, _, rid = heapq.heappop(self._events)
        handoff = self.handoffs[rid]
        original = originals[rid]
        if kind == KV_ARRIVAL:
            self.decode.admit(handoff.decode_replica, _decode_request(original, handoff.first_token, t))
            return {}
        if original.sampling_params.max_tokens <= 1 or self._full(original):  # the prefill's output is final
            return {rid: handoff.output}
        handoff.decode_replica = self.decode.router.route(original, self.decode.views)
        handoff.kv_transfer_s = self._transfer_time(original, handoff)
        self._push(t + handoff.kv_transfer_s, KV_ARRIVAL, rid)
        return {}

    def _full(self, request: Request) -> bool:
        """Whether the prompt and its first token fill the context: the engine alone stops there too."""
        limits = self.decode.replicas[0].engine.scheduler.limits
        return request.num_prompt_tokens + 1 >= limits.max_model_len

    def _transfer_time(self, request: Request, handoff: Handoff) -> float:
        """The prompt's KV bytes (the prefill replica's simulated model) over the link."""
        replica = self.prefill.replicas[handoff.prefill_replica]
        clock = replica.engine.clock
        assert isinstance(clock, SimulatedClock)
        dims = clock.model_dims
        num_bytes = request.num_prompt_tokens * dims.kv_bytes_per_token
        if not self.layerwise:
            return self.link.transfer_time(num_bytes)
        timeline = replica.engine.recorder.requests[request.request_id]
        compute = handoff.prefill_done + replica.offset - (timeline.first_scheduled_time or 0.0)
        return self.link.transfer_time(num_bytes, dims.num_layers, compute)


def _prefill_request(request: Request) -> Request:
    """``request`` as its prefill pool runs it: its prompt and one output token."""
    params = dataclasses.replace(request.sampling_params, max_tokens=1)
    return dataclasses.replace(
        request, sampling_params=params, expected_output_len=1, output_token_ids=[], spec_token_ids=[]
    )


def _decode_request(request: Request, first_token: int, kv_arrival: float) -> Request:
    """``request`` as its decode replica queues it at ``kv_arrival``: its prompt computed (its KV
    arrived), its first token known, the rest of its outputs to generate."""
    return dataclasses.replace(
        request,
        arrival_time=kv_arrival,
        output_token_ids=[first_token],
        spec_token_ids=[],
        num_computed_tokens=request.num_prompt_tokens,
    )
