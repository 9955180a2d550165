"""The engine's requests (a mixin of ``forge.engine.engine.Engine``): adding one (with its ``n > 1``
siblings), forking, aborting and stopping them, and the check that an idle engine holds nothing
(``check_idle``, ``LeakError``)."""

from __future__ import annotations

from forge.core.outputs import RequestOutput, stopped_output
from forge.core.request import Request
from forge.engine.runner_base import Runner
from forge.engine.speculator import Speculator
from forge.results.metrics import MetricsRecorder
from forge.sched.fork import fan_out, output_ids
from forge.sched.scheduler import Scheduler


class LeakError(RuntimeError):
    """The engine went idle while KV blocks or requests were still held."""


class EngineRequests:
    """What ``Engine`` does to its requests outside a step; the state is the engine's (``Engine.__init__``)."""

    scheduler: Scheduler
    runner: Runner
    recorder: MetricsRecorder
    requests: dict[str, Request]
    speculator: Speculator

    def add_request(self, request: Request) -> None:
        """Queue ``request``; its final outputs come under ``output_ids(request)``: its n sequences
        (``n > 1``: siblings that fork onto its prompt's KV). ValueError if it can never run here
        (e.g. an embedding request on a model that gives no hidden states) or is a beam search,
        which runs above the engine, over plain requests (``forge.frontend.BeamSearchFrontend``)."""
        if request.pooling_params is not None and self.runner.hidden_model is None:
            name = type(self.runner.model).__name__
            raise ValueError(f"request {request.request_id}: {name} gives no hidden states, so no embeddings")
        if request.beam_search is not None:
            raise ValueError(f"request {request.request_id}: a beam search runs in forge.frontend, not the engine")
        if request.sampling_params.n == 1:  # (most requests: one sequence, no siblings)
            if request.request_id in self.requests:
                raise ValueError(f"duplicate request id {request.request_id!r}")
            self.scheduler.add_request(request)
            self._track(request)
            return
        for rid in output_ids(request):
            if rid in self.requests:
                raise ValueError(f"duplicate request id {rid!r}")
        children = fan_out(request)  # n > 1: siblings that fork onto this request's prompt KV
        self.scheduler.add_request(request, forks=children)
        for r in (request, *children):
            self._track(r)

    def _track(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.recorder.on_arrival(request, request.arrival_time)

    def fork(self, parent: Request, child: Request) -> None:
        """Add ``child``, a new request whose first tokens are ``parent``'s computed ones: it shares
        their KV blocks (copy-on-write, ``KVCacheManager.fork``) instead of computing them, or waits
        and computes them itself where the scheduler cannot fork it now (``Scheduler.fork``)."""
        self.scheduler.fork(parent, child, parent.num_computed_tokens)
        self._track(child)

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; False if it is unknown."""
        return bool(self.abort_requests(request_id))

    def abort_requests(self, request_id: str) -> list[str]:
        """``abort``, returning the ids of the engine requests it stopped (``[request_id]`` or none)."""
        request = self.scheduler.abort(request_id)
        self.requests.pop(request_id, None)
        self.speculator.forget(request_id)
        return [request_id] if request is not None else []

    def stop(self, request_id: str, reason: str) -> None:
        """End a request its caller needs no more of (a pruned beam) as finished with ``reason``: its
        blocks freed, and recorded as finishing now (``MetricsRecorder.on_abort``)."""
        if self.abort(request_id):
            self.recorder.on_abort(request_id, reason)

    def abort_all(self) -> list[RequestOutput]:
        """Stop every request; an ``abort`` output per id a caller waits on (``output_ids``)."""
        outputs = []
        for rid, request in list(self.requests.items()):
            if self.abort(rid):
                outputs.append(stopped_output(request, "abort"))
            self.requests.pop(rid, None)
        return outputs

    def check_idle(self) -> None:
        """Every request finished and every block free; raises LeakError otherwise."""
        kv = self.scheduler.kv
        problems = []
        if self.scheduler.num_unfinished:
            problems.append(f"{self.scheduler.num_unfinished} requests unfinished")
        if kv.num_held():
            problems.append(f"{kv.num_held()} requests still hold KV blocks")
        if kv.num_free_blocks() != kv.num_blocks:
            problems.append(f"{kv.num_blocks - kv.num_free_blocks()} of {kv.num_blocks} KV blocks not free")
        if (leak := self.speculator.leak()) is not None:
            problems.append(leak)
        if problems:
            raise LeakError("engine idle but " + "; ".join(problems))
