"""OpenAI's Batch API: ``/v1/batches`` over ``/v1/files``, run by a background ``BatchRunner``.

POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.
A batch goes validating -> in_progress -> finalizing -> completed (or failed when its input file
is gone or empty, or the disk is full; cancelling -> cancelled when cancelled). Each batch is
``<id>.json`` under ``<state_dir>/batches`` plus ``<id>.results.jsonl``, one checksummed line
appended per request that has ended (``batch_store``): the results file, not the counters, says
what is done, so a server stopped mid-batch loses only the requests that were in flight, and the
next server on the same state dir runs those and the rest (the batch is never lost silently).
A batch that ends failed still gets output and error files for the requests that had ended.
With API keys set, a batch belongs to the key that created it (``owners``).

Lower priority than interactive traffic: the runner keeps at most ``server.batch_max_in_flight``
batch requests in the engine (whatever the scheduler; with ``scheduler=fcfs`` this cap is the
whole of it), and each carries ``priority >= server.batch_priority``, so with
``scheduler=priority`` a waiting interactive request (priority 0 by default) is scheduled first.
Reading and checking an input file runs on a worker thread, never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from forge.server.batch_finish import end_batch
from forge.server.batch_lines import BatchLine, Handler, LineError, error_record, read_lines, run_line
from forge.server.batch_store import ACTIVE, Batch, BatchStore, Tally, batch_not_found, errors
from forge.server.files import FileStore
from forge.server.owners import Caller
from forge.server.protocol import APIError, CreateBatchRequest
from forge.server.store_io import FULL

log = logging.getLogger("forge.server")
COMPLETION_WINDOWS = ("24h",)
RETRY_S = 1.0  # how long the runner waits before it tries again after its own storage failed
COUNTS_EVERY_S = 1.0  # the running batch's counts are written this often (and when its run stops)


class BatchRunner:
    """Runs the active batches one at a time, oldest first, on the server's event loop; only the
    batches created on a server of the same model (``model_name``): a server of another model on
    the same state dir lists them but leaves them for theirs."""

    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        handlers: dict[str, Handler],
        model_name: str,
        max_in_flight: int,
        priority: int,
        window_s: int = 24 * 3600,
    ) -> None:
        self.store = store
        self.model_name = model_name
        self.files = files
        self.handlers = handlers
        self.max_in_flight = max_in_flight
        self.priority = priority
        self.window_s = window_s  # completion_window 24h; past expires_at a batch expires
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._cancelled: set[str] = set()
        self._running: str | None = None  # the batch whose requests are in flight
        self._cancel_running = asyncio.Event()  # set: that batch was cancelled
        self._live: tuple[str, Tally] | None = None  # the running batch's counts, newer than its record

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="forge-batches")

    async def stop(self) -> None:
        """Stop at once: requests in flight are aborted and run again by the next server."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def create(self, req: CreateBatchRequest, caller: Caller) -> Batch:
        if req.endpoint not in self.handlers:
            raise APIError(f"endpoint must be one of {sorted(self.handlers)}", param="endpoint")
        if req.completion_window not in COMPLETION_WINDOWS:
            raise APIError(f"completion_window must be one of {list(COMPLETION_WINDOWS)}", param="completion_window")
        if self.files.get(req.input_file_id, caller).purpose != "batch":
            raise APIError("the input file's purpose must be batch", param="input_file_id")
        now = int(time.time())
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            endpoint=req.endpoint,
            input_file_id=req.input_file_id,
            completion_window=req.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + self.window_s,
            model=self.model_name,
            metadata=req.metadata,
            owner=caller.owner,
        )
        self.store.save(batch)
        self._wake.set()
        return batch

    def get(self, batch_id: str, caller: Caller) -> Batch:
        batch = self.store.get(batch_id)
        if not caller.sees(batch.owner):
            raise batch_not_found(batch_id)
        return self._shown(batch)

    def visible(self, caller: Caller) -> list[Batch]:
        """The batches ``caller`` sees, newest first."""
        return [self._shown(b) for b in self.store.list() if caller.sees(b.owner)]

    def _shown(self, batch: Batch) -> Batch:
        """``batch`` with its live counts while it runs (its record has them at most a second late)."""
        if self._live is None or self._live[0] != batch.id or batch.status not in ACTIVE:
            return batch
        return replace(batch, request_counts=self._live[1].counts())

    def input_in_use(self, file_id: str) -> bool:
        """``file_id`` is the input of a batch that has not ended (it is kept until the batch ends)."""
        return any(b.input_file_id == file_id and b.status in ACTIVE for b in self.store.list())

    def cancel(self, batch_id: str, caller: Caller) -> Batch:
        batch = self.get(batch_id, caller)
        if batch.status in ("cancelling", "cancelled"):
            return batch
        if batch.status not in ACTIVE:
            raise APIError(f"a batch that is {batch.status} cannot be cancelled", 409, code="invalid_state")
        self._cancelled.add(batch_id)
        if batch_id == self._running:
            self._cancel_running.set()
        self._wake.set()
        return self.store.save(replace(batch, status="cancelling", cancelling_at=int(time.time())))

    # -- the runner's task ------------------------------------------------------------
    async def _serve(self) -> None:
        while True:
            try:
                batch = self._next()
                if batch is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._step(batch)
            except asyncio.CancelledError:
                raise
            except Exception:  # the runner's own storage failed: it waits and tries again, never dies
                log.exception("the batch runner could not read or write its state; retrying in %s s", RETRY_S)
                await asyncio.sleep(RETRY_S)

    def _next(self) -> Batch | None:
        """The oldest batch of this model that has a step to take (a damaged record: its delivery)."""
        mine = [b for b in self.store.list() if b.damaged or (b.status in ACTIVE and b.model == self.model_name)]
        return min(mine, key=lambda b: (b.created_at, b.id), default=None)

    async def _step(self, batch: Batch) -> None:
        """One step; a failure of this batch (not of the runner) fails it, with what it had delivered."""
        try:
            await self._advance(batch)
        except asyncio.CancelledError:
            raise
        except OSError as exc:
            if exc.errno not in FULL:
                raise
            log.error("batch %s failed: the disk is full", batch.id)
            await self._finalize(batch, "failed", errors("insufficient_storage", "the server's disk is full"))
        except Exception as exc:  # one broken batch must not stop the others
            log.exception("batch %s failed", batch.id)
            message = f"the batch runner failed: {type(exc).__name__}"
            await self._finalize(batch, "failed", errors("internal_error", message))

    async def _lines(self, batch: Batch) -> list[BatchLine | LineError]:
        """The input file's lines, read and checked on a worker thread."""

        def read() -> list[BatchLine | LineError]:
            data = self.files.content(batch.input_file_id, Caller(None, admin=True))
            return read_lines(data.decode("utf-8"), batch.endpoint, self.handlers)

        return await asyncio.to_thread(read)

    async def _advance(self, batch: Batch) -> None:
        """One step of ``batch``'s life (validating, running, finalizing); the loop calls again."""
        if batch.damaged:
            await self._finalize(batch, "failed", batch.errors)
        elif batch.status in ("validating", "in_progress") and time.time() >= batch.expires_at:
            await self._finalize(batch, "expired")
        elif batch.status == "cancelling" or batch.id in self._cancelled:
            await self._finalize(batch, "cancelled")
        elif batch.status == "validating":
            await self._validate(batch)
        elif batch.status == "in_progress":
            if await self._run(batch):
                now = int(time.time())
                self.store.save(replace(self.store.get(batch.id), status="finalizing", finalizing_at=now))
        else:
            await self._finalize(batch, "completed")

    async def _read_input(self, batch: Batch) -> list[BatchLine | LineError] | None:
        """The input's lines, or None when it cannot be read (the batch is then failed)."""
        try:
            return await self._lines(batch)
        except APIError:
            message = f"the input file {batch.input_file_id} no longer exists"
            await self._finalize(batch, "failed", errors("file_not_found", message))
        except UnicodeDecodeError:
            await self._finalize(batch, "failed", errors("invalid_file", "the input file is not UTF-8 text"))
        return None

    async def _validate(self, batch: Batch) -> None:
        items = await self._read_input(batch)
        if items is None:
            return
        if not items:
            await self._finalize(batch, "failed", errors("empty_file", "the input file has no requests"))
            return
        bad = [e for e in items if isinstance(e, LineError)]

        def record_errors() -> None:
            self.store.clear_results(batch.id)
            self.store.append_results(batch.id, [(e.line, error_record(e)) for e in bad])

        await asyncio.to_thread(record_errors)
        counts = Tally(len(items), 0, len(bad)).counts()
        self.store.save(replace(batch, status="in_progress", in_progress_at=int(time.time()), request_counts=counts))

    async def _run(self, batch: Batch) -> bool:
        """Run the requests not yet done; True when every line has its record (not cancelled)."""
        items = await self._read_input(batch)
        if items is None:
            return False
        numbers = {i.line for i in items}
        done = await asyncio.to_thread(self.store.results, batch.id, numbers)
        tally = Tally.of(len(items), done)
        todo = iter([i for i in items if isinstance(i, BatchLine) and i.line not in done])

        saved = [time.monotonic()]

        async def worker() -> None:  # O(1) per request: one appended line, counts in memory
            for line in todo:
                if batch.id in self._cancelled:
                    return
                record = await run_line(self.handlers, line, self.priority)
                self.store.append_results(batch.id, [(line.line, record)])
                done[line.line] = record
                tally.add(record)
                if time.monotonic() - saved[0] >= COUNTS_EVERY_S:
                    self._save_counts(batch.id, tally)
                    saved[0] = time.monotonic()

        self._live = (batch.id, tally)
        try:
            await self._in_flight(batch, [worker() for _ in range(self.max_in_flight)])
        finally:
            self._live = None
            with contextlib.suppress(OSError):  # a full disk: the results file still has them
                self._save_counts(batch.id, tally)
        if batch.id in self._cancelled:
            return False
        recorded = await asyncio.to_thread(self.store.results, batch.id, numbers)
        return len(recorded) == len(items)  # what the file holds, not what was sent to it

    def _save_counts(self, batch_id: str, tally: Tally) -> None:
        current = self.store.get(batch_id)
        if current.status in ACTIVE:
            self.store.save(replace(current, request_counts=tally.counts()))

    async def _in_flight(self, batch: Batch, workers: list[Any]) -> None:
        """Run ``workers`` until they end or ``batch`` is cancelled; a worker's error is raised."""
        self._running = batch.id
        self._cancel_running.clear()
        tasks = [asyncio.create_task(w) for w in workers]
        all_done = asyncio.gather(*tasks)
        cancelled = asyncio.create_task(self._cancel_running.wait())
        expiry = asyncio.create_task(asyncio.sleep(max(0.0, batch.expires_at - time.time())))
        try:
            waiters: list[asyncio.Future[Any]] = [all_done, cancelled, expiry]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if all_done.done():
                all_done.result()
        finally:  # a cancel aborts the requests in flight: their engine requests end with the tasks
            cancelled.cancel()
            expiry.cancel()
            all_done.cancel()
            await asyncio.gather(*tasks, cancelled, expiry, return_exceptions=True)
            with contextlib.suppress(BaseException):
                all_done.exception()  # retrieved: no "exception was never retrieved" at shutdown
            self._running = None

    async def _finalize(self, batch: Batch, status: str, errs: dict[str, Any] | None = None) -> None:
        """The output and error files from the results so far, then the final status (``failed``
        with ``errs``), written on a worker thread; an ``expired`` batch's requests that did not run
        get ``batch_expired`` records first."""
        try:
            items: list[BatchLine | LineError] | None = await self._lines(batch)
        except (APIError, UnicodeDecodeError):
            items = None  # the input cannot be read: every result is kept, no request is named
        await asyncio.to_thread(end_batch, self.store, self.files, batch.id, status, errs, items)
        self._cancelled.discard(batch.id)
