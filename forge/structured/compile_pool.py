"""Grammar compiles off the event loop, in worker processes, each bounded in time, DFA states and
memory (``CompileLimits``, the ``structured`` conf group's options).

A process, not a thread: outlines-core's index build (exponential in e.g. a string's
``maxLength``) cannot be interrupted, and only a process can be killed and given its own memory
limit. Each worker sets ``RLIMIT_AS`` to its size after imports plus ``compile_memory_mb``; an
allocation past it fails (``MemoryError``, or an abort in the Rust/C++ code, seen here as the
worker's death). A compile that outlives ``compile_timeout_s`` gets its worker killed (SIGKILL:
outlines-core ignores SIGTERM mid-compile); a dead worker is replaced. Workers are fresh
interpreters (``python -m forge.structured.compile_pool``) that exit when the server's end of
their socket closes, and an ``RLIMIT_CPU`` of twice the timeout per compile stops one whose
server vanished mid-compile. ``compile_workers`` threads of this process each drive one worker, so that
many compiles run at once and the event loop only awaits; up to ``max_pending_compiles`` more
wait for a thread, beyond that ``CompileBusy`` (the server answers 503). Artefacts come back
pickled (``GrammarBuilder`` contract); only successful compiles enter the backend's cache. The
worker's side (its loop, its limits, launching and killing one) is in ``forge.structured.compile_worker``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection

from forge.structured.base import ConstraintSpec, Grammar, GrammarError, GrammarTooLarge, StructuredBackend
from forge.structured.compile_worker import WorkerProcess, serve

_START_S = 120.0  # a spawned worker imports torch (xgrammar) on a possibly loaded machine


PRECOMPILED = (ConstraintSpec.json_object(),)  # what every server needs: compiled at start, off the request path
PRECOMPILE_BUDGET = 6.0  # a precompile may take this many times compile_timeout_s (a busy machine at start)
log = logging.getLogger("forge.structured")


class CompileTimeout(GrammarTooLarge):
    """A compile outlived its time budget: the grammar may be too large, or the machine only busy,
    so the pool tries it once more (a fresh worker, the same budget) before refusing."""


class CompileBusy(Exception):
    """No compile can start now: every worker is busy and the waiting line is full, or a worker
    failed to start (the server answers 503)."""


class CompilePool:
    """Compiles ``backend``'s specs within ``backend.limits``; ``await compile(spec)``."""

    def __init__(self, backend: StructuredBackend) -> None:
        self.backend = backend
        self.limits = backend.limits
        self._threads = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="grammar-compile")
        self._idle: queue.SimpleQueue[WorkerProcess | None] = queue.SimpleQueue()
        for _ in range(self.limits.workers):
            self._idle.put(None)  # started on first use (or by ``start``)
        self._live: set[WorkerProcess] = set()
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closed = False
        self._pending: dict[ConstraintSpec, Future[Grammar]] = {}  # one compile per spec at a time

    def start(self, precompile: tuple[ConstraintSpec, ...] = PRECOMPILED) -> None:
        """Start every worker in the background (a spawn imports the backend's libraries), then
        compile ``precompile`` into the cache there (``PRECOMPILE_BUDGET`` times the time budget):
        a request for one of them awaits that compile instead of starting its own."""
        for _ in range(self.limits.workers):
            self._threads.submit(self._warm)
        for spec in precompile:
            self._single_flight(spec, self.limits.timeout_s * PRECOMPILE_BUDGET).add_done_callback(self._log_failure)

    def _single_flight(self, spec: ConstraintSpec, timeout_s: float) -> Future[Grammar]:
        """The compile of ``spec`` in flight, or a new one (forgotten when it ends)."""
        with self._lock:
            job = self._pending.get(spec)
            if job is None:
                job = self._threads.submit(self.compile_blocking, spec, timeout_s)
                self._pending[spec] = job
                job.add_done_callback(lambda _: self._forget(spec))
            return job

    def _forget(self, spec: ConstraintSpec) -> None:
        with self._lock:
            self._pending.pop(spec, None)

    async def compile(self, spec: ConstraintSpec) -> Grammar:
        """The grammar, from the cache or a worker. ``GrammarError`` (``GrammarTooLarge`` past the
        budget); ``CompileBusy`` when too many compiles are already waiting."""
        cached = self.backend.cache.get(spec)
        if cached is not None:
            return cached
        with self._lock:
            running = self._pending.get(spec)
        if running is not None:  # the same grammar is being compiled (a precompile, another request)
            return await asyncio.wrap_future(running)
        with self._lock:
            if self._in_flight >= self.limits.workers + self.limits.max_pending:
                raise CompileBusy(
                    f"{self._in_flight} grammar compiles are running or waiting; retry later "
                    "or raise structured.max_pending_compiles"
                )
            self._in_flight += 1
        try:
            job = self._single_flight(spec, self.limits.timeout_s)
        except BaseException:
            self._release()
            raise
        # the slot is held until the compile ends, even when its caller is gone (a client that
        # disconnects cancels the await, not the compile): the cap stays a cap
        job.add_done_callback(lambda _: self._release())
        return await asyncio.wrap_future(job)

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def compile_blocking(self, spec: ConstraintSpec, timeout_s: float | None = None) -> Grammar:
        """``compile`` for a caller that may block (no waiting-line cap); a compile that times out
        is tried once more before ``CompileTimeout`` is raised."""
        budget = self.limits.timeout_s if timeout_s is None else timeout_s
        try:
            return self._compile_once(spec, budget)
        except CompileTimeout:
            log.warning("%s: compile timed out after %g s; trying once more", spec.description, budget)
            return self._compile_once(spec, budget)

    def _compile_once(self, spec: ConstraintSpec, timeout_s: float) -> Grammar:
        cached = self.backend.cache.get(spec)  # a compile that waited may find it done meanwhile
        if cached is not None:
            return cached
        worker = self._idle.get()
        try:
            if worker is not None and worker.process.poll() is not None:  # died while idle
                self._retire(worker)
                worker = None
            worker = worker or self._spawn()
            kind, payload = self._ask(worker, spec, timeout_s)
        except GrammarTooLarge:
            assert worker is not None
            self._retire(worker)
            worker = None
            self._threads.submit(self._warm)
            raise
        finally:
            self._idle.put(worker)
        if kind == "too_large":
            raise GrammarTooLarge(str(payload))
        if kind == "memory":
            raise GrammarTooLarge(self._memory_message(spec))
        if kind == "error":
            raise GrammarError(str(payload))
        grammar = self.backend.load(payload)
        self.backend.cache.put(spec, grammar)
        return grammar

    def _ask(self, worker: WorkerProcess, spec: ConstraintSpec, timeout_s: float) -> tuple[str, object]:
        try:
            worker.conn.send((spec, self.limits.max_states))
            if worker.conn.poll(timeout_s):
                kind, payload = worker.conn.recv()
                return str(kind), payload
        except (EOFError, OSError):  # the worker died: out of its address space (or killed)
            raise GrammarTooLarge(self._memory_message(spec)) from None
        raise CompileTimeout(
            f"{spec.description} is too large to compile within {timeout_s:g} s; "
            "simplify it or raise structured.compile_timeout_s"
        )

    def _memory_message(self, spec: ConstraintSpec) -> str:
        return (
            f"{spec.description} is too large to compile within {self.limits.memory_mb} MB; "
            "simplify it or raise structured.compile_memory_mb"
        )

    def _spawn(self) -> WorkerProcess:
        if self._closed:
            raise CompileBusy("the grammar compiler is shut down")
        worker = WorkerProcess.launch()  # not fork: unsafe in the threaded server process
        with self._lock:
            self._live.add(worker)
        try:
            worker.conn.send((self.backend.builder(), self.limits.memory_mb, self.limits.timeout_s))
            ready = worker.conn.poll(_START_S) and worker.conn.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._retire(worker)
            raise CompileBusy("a grammar compile worker failed to start; see the server log")
        return worker

    def _retire(self, worker: WorkerProcess) -> None:
        worker.kill()
        with self._lock:
            self._live.discard(worker)

    def _warm(self) -> None:
        worker = self._idle.get()
        try:
            if worker is None and not self._closed:
                worker = self._spawn()
        finally:
            self._idle.put(worker)

    @property
    def in_flight(self) -> int:
        """Compiles running or waiting for a worker (through ``compile``)."""
        with self._lock:
            return self._in_flight

    @property
    def num_workers(self) -> int:
        """Worker processes alive now."""
        with self._lock:
            return sum(w.process.poll() is None for w in self._live)

    def _log_failure(self, job: Future[Grammar]) -> None:
        """A precompile's failure, logged; not one the pool's ``close`` caused (its compiles in flight fail)."""
        if not self._closed and not job.cancelled() and job.exception() is not None:
            log.warning("precompile failed: %s", job.exception())

    def close(self) -> None:
        """Kill the workers; compiles in flight fail."""
        self._closed = True
        self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers = list(self._live)
            self._live.clear()
        for worker in workers:
            worker.kill()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
