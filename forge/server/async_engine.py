"""The engine on its own thread, driven through a thread-safe inbox.

HTTP handlers (on the asyncio loop) call ``add`` / ``abort``; those only enqueue commands. The
engine thread drains the inbox before every step (so an abort frees its KV blocks before the
next step is scheduled), steps while anything is unfinished, and hands each step's outputs back
to the loop with one ``call_soon_threadsafe``, where they land in per-request asyncio queues.
The engine object is touched only by the engine thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Literal

from forge.core.outputs import RequestOutput
from forge.core.request import Request
from forge.engine.engine import Engine
from forge.frontend import BeamSearchFrontend
from forge.sched.fork import output_ids
from forge.server.metrics import ServerMetrics, ServingRecorder

log = logging.getLogger("forge.server")


class EngineOverloaded(RuntimeError):
    """The waiting queue is full (HTTP 503)."""


class EngineClosed(RuntimeError):
    """The server is shutting down or the engine failed (HTTP 503)."""


class RequestFailed(RuntimeError):
    """One request failed inside the engine (its sampling, or the model step it was in); the
    engine goes on. Delivered to that request's stream in place of an output."""


@dataclass(frozen=True)
class _Command:
    kind: Literal["add", "abort", "abort_all", "stop"]
    request: Request | None = None
    request_id: str = ""
    reason: str = "abort"


Item = RequestOutput | BaseException
Stream = asyncio.Queue[tuple[str, Item]]


class AsyncEngine:
    def __init__(self, engine: Engine, metrics: ServerMetrics, max_waiting: int, idle_poll_s: float = 0.05) -> None:
        self.engine = engine
        self.frontend = BeamSearchFrontend(engine)  # beam searches, over the engine's plain requests
        self.metrics = metrics
        self.recorder = ServingRecorder(metrics)
        engine.recorder = self.recorder
        self.max_waiting = max_waiting
        self.idle_poll_s = idle_poll_s
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._num_engine_waiting = 0
        self.error: BaseException | None = None
        self.leak: str | None = None

    # -- lifecycle (event loop side) -------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="forge-engine", daemon=True)
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    async def shutdown(self, timeout_s: float) -> None:
        """Refuse new requests, let in-flight ones finish for up to ``timeout_s``, abort the rest
        (their streams get a final ``abort`` output), stop the thread, and check for leaks."""
        self._closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._streams and loop.time() < deadline and self.healthy:
            await asyncio.sleep(0.02)
        self._inbox.put(_Command("abort_all"))
        self._inbox.put(_Command("stop"))
        if self._thread is not None:
            await loop.run_in_executor(None, self._thread.join)
        self.engine.close()

    # -- requests (event loop side) ---------------------------------------------------
    def add(self, request: Request, stream: Stream) -> None:
        """Queue a request; ``(request_id, output)`` pairs arrive in ``stream`` (several requests
        may share one), or ``(request_id, exception)`` if the engine refused it or it failed
        there (``RequestFailed``: the engine goes on). The request's last output has ``finished`` set."""
        if self._closing or not self.healthy:
            raise EngineClosed("the server is shutting down" if self._closing else f"engine failed: {self.error}")
        if self._num_engine_waiting + self._inbox.qsize() >= self.max_waiting:
            raise EngineOverloaded(f"too many requests waiting (server.max_waiting={self.max_waiting})")
        for rid in output_ids(request):  # n > 1 sequences or a beam search's results: one id each
            self._streams[rid] = stream
        request.arrival_time = self.engine.clock.now()
        self._inbox.put(_Command("add", request=request))

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """Stop a request (client gone, or a stop string matched: ``reason="stop"``)."""
        if self._streams.pop(request_id, None) is not None:
            self._inbox.put(_Command("abort", request_id=request_id, reason=reason))

    def _deliver(self, items: list[tuple[str, Item]]) -> None:
        for rid, item in items:
            stream = self._streams.get(rid)
            if stream is None:
                continue
            stream.put_nowait((rid, item))
            if isinstance(item, BaseException) or item.finished:
                del self._streams[rid]

    def _send(self, items: list[tuple[str, Item]]) -> None:
        if items and self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop closed under us at interpreter exit
                self._loop.call_soon_threadsafe(self._deliver, items)

    # -- engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop_forever()
        except BaseException as exc:
            log.exception("engine thread failed")
            self.error = exc
            self._send([(rid, exc) for rid in list(self._streams)])
            with contextlib.suppress(Exception):
                for rid in list(self.engine.requests):
                    self.engine.abort(rid)
        with contextlib.suppress(Exception):
            self.engine.check_idle()
            return
        self.leak = "engine not idle after shutdown"

    def _loop_forever(self) -> None:
        engine = self.engine
        while True:
            block = not engine.has_unfinished()
            stop = False
            replies: list[tuple[str, Item]] = []
            while True:
                try:
                    cmd = self._inbox.get(timeout=self.idle_poll_s) if block else self._inbox.get_nowait()
                except queue.Empty:
                    break
                block = False
                stop = self._handle(cmd, replies) or stop
            self._send(replies)
            if stop and not engine.has_unfinished():
                return
            if engine.has_unfinished():
                outputs = self.frontend.step()
                self._send([(o.request_id, o if o.error is None else RequestFailed(o.error)) for o in outputs])
            self._num_engine_waiting = engine.scheduler.num_unfinished - len(engine.scheduler.running)
            self.metrics.sync(engine)

    def _handle(self, cmd: _Command, replies: list[tuple[str, Item]]) -> bool:
        engine = self.frontend
        if cmd.kind == "add":
            assert cmd.request is not None
            try:
                engine.add_request(cmd.request)
            except ValueError as exc:
                replies.extend((rid, exc) for rid in output_ids(cmd.request))
        elif cmd.kind == "abort":
            for rid in engine.abort_requests(cmd.request_id):
                self.recorder.on_abort(rid, cmd.reason)
        elif cmd.kind == "abort_all":
            for rid in list(self.engine.requests):
                self.recorder.on_abort(rid, "abort")
            replies.extend((o.request_id, o) for o in engine.abort_all())
        return cmd.kind == "stop"
