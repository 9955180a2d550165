"""OpenAI's Batch API: ``/v1/batches`` over ``/v1/files``, run by a background ``BatchRunner``.

POST /v1/batches, GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.
A batch goes validating -> in_progress -> finalizing -> completed (or failed when its input file
is gone or empty; cancelling -> cancelled when cancelled). Each batch is ``<id>.json`` under
``<state_dir>/batches`` plus ``<id>.results.jsonl``, one line appended per request that has
ended: the results file, not the counters, says what is done, so a server stopped mid-batch
loses only the requests that were in flight, and the next server on the same state dir runs
those and the rest (the batch is never lost silently).

Lower priority than interactive traffic: the runner keeps at most ``server.batch_max_in_flight``
batch requests in the engine (whatever the scheduler; with ``scheduler=fcfs`` this cap is the
whole of it), and each carries ``priority >= server.batch_priority``, so with
``scheduler=priority`` a waiting interactive request (priority 0 by default) is scheduled first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter

from forge.server.batch_lines import (
    BatchLine,
    Handler,
    LineError,
    error_record,
    is_success,
    read_lines,
    run_line,
)
from forge.server.files import BATCH_OUTPUT_PURPOSE, FileStore, write_atomically
from forge.server.protocol import APIError, CreateBatchRequest

log = logging.getLogger("forge.server")
COMPLETION_WINDOWS = ("24h",)
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")


@dataclass(frozen=True)
class Batch:
    """OpenAI's batch object."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    model: str | None = None
    metadata: dict[str, str] | None = None
    errors: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: dict[str, int] = field(default_factory=lambda: {"total": 0, "completed": 0, "failed": 0})
    object: str = "batch"

    def body(self) -> dict[str, Any]:
        return asdict(self)


def batch_not_found(batch_id: str) -> APIError:
    return APIError(f"No such Batch object: {batch_id[:64]}", 404, "invalid_request_error", "batch_id", "not_found")


class BatchStore:
    """Batch records and their results files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root  # made by the first batch

    def _path(self, batch_id: str, suffix: str) -> Path:
        if not (batch_id.startswith("batch_") and batch_id[6:].isalnum()):
            raise batch_not_found(batch_id)
        return self.root / f"{batch_id}{suffix}"

    def save(self, batch: Batch) -> Batch:
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(self._path(batch.id, ".json"), json.dumps(batch.body()).encode())
        return batch

    def get(self, batch_id: str) -> Batch:
        path = self._path(batch_id, ".json")
        if not path.exists():
            raise batch_not_found(batch_id)
        return Batch(**json.loads(path.read_text()))

    def list(self) -> list[Batch]:
        """Newest first."""
        batches = [self.get(p.stem) for p in self.root.glob("batch_*.json")]
        return sorted(batches, key=lambda b: (b.created_at, b.id), reverse=True)

    def results(self, batch_id: str) -> dict[int, dict[str, Any]]:
        """The records of the requests that have ended, by input line; a last line cut short by
        a stop mid-write is ignored (that request runs again)."""
        path = self._path(batch_id, ".results.jsonl")
        out: dict[int, dict[str, Any]] = {}
        if path.exists():
            for raw in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(raw)
                    out[int(entry["line"])] = entry["record"]
        return out

    def append_result(self, batch_id: str, line: int, record: dict[str, Any]) -> None:
        with self._path(batch_id, ".results.jsonl").open("a") as f:
            f.write(json.dumps({"line": line, "record": record}) + "\n")
            f.flush()

    def clear_results(self, batch_id: str) -> None:
        self._path(batch_id, ".results.jsonl").unlink(missing_ok=True)


def _counts(total: int, results: dict[int, dict[str, Any]]) -> dict[str, int]:
    completed = sum(1 for r in results.values() if is_success(r))
    return {"total": total, "completed": completed, "failed": len(results) - completed}


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
    ) -> None:
        self.store = store
        self.model_name = model_name
        self.files = files
        self.handlers = handlers
        self.max_in_flight = max_in_flight
        self.priority = priority
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._cancelled: set[str] = set()
        self._running: str | None = None  # the batch whose requests are in flight
        self._cancel_running = asyncio.Event()  # set: that batch was cancelled

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve(), name="forge-batches")

    async def stop(self) -> None:
        """Stop at once: requests in flight are aborted and run again by the next server."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def create(self, req: CreateBatchRequest) -> Batch:
        if req.endpoint not in self.handlers:
            raise APIError(f"endpoint must be one of {sorted(self.handlers)}", param="endpoint")
        if req.completion_window not in COMPLETION_WINDOWS:
            raise APIError(f"completion_window must be one of {list(COMPLETION_WINDOWS)}", param="completion_window")
        if self.files.get(req.input_file_id).purpose != "batch":
            raise APIError("the input file's purpose must be batch", param="input_file_id")
        now = int(time.time())
        batch = Batch(
            id=f"batch_{uuid.uuid4().hex[:24]}",
            endpoint=req.endpoint,
            input_file_id=req.input_file_id,
            completion_window=req.completion_window,
            status="validating",
            created_at=now,
            expires_at=now + 24 * 3600,
            model=self.model_name,
            metadata=req.metadata,
        )
        self.store.save(batch)
        self._wake.set()
        return batch

    def cancel(self, batch_id: str) -> Batch:
        batch = self.store.get(batch_id)
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
            mine = (b for b in self.store.list() if b.status in ACTIVE and b.model == self.model_name)
            active = sorted(mine, key=lambda b: (b.created_at, b.id))
            if not active:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self._advance(active[0])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one broken batch must not stop the others
                log.exception("batch %s failed", active[0].id)
                self._fail(active[0], "internal_error", f"the batch runner failed: {type(exc).__name__}")

    def _fail(self, batch: Batch, code: str, message: str) -> None:
        errors = {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}
        self.store.save(replace(self.store.get(batch.id), status="failed", failed_at=int(time.time()), errors=errors))

    def _lines(self, batch: Batch) -> list[BatchLine | LineError]:
        text = self.files.content(batch.input_file_id).decode("utf-8")
        return read_lines(text, batch.endpoint, self.handlers)

    async def _advance(self, batch: Batch) -> None:
        """One step of ``batch``'s life (validating, running, finalizing); the loop calls again."""
        if batch.status == "cancelling" or batch.id in self._cancelled:
            await self._finalize(batch, "cancelled")
        elif batch.status == "validating":
            self._validate(batch)
        elif batch.status == "in_progress":
            if await self._run(batch):
                now = int(time.time())
                self.store.save(replace(self.store.get(batch.id), status="finalizing", finalizing_at=now))
        else:
            await self._finalize(batch, "completed")

    def _validate(self, batch: Batch) -> None:
        try:
            items = self._lines(batch)
        except APIError:
            self._fail(batch, "file_not_found", f"the input file {batch.input_file_id} no longer exists")
            return
        except UnicodeDecodeError:
            self._fail(batch, "invalid_file", "the input file is not UTF-8 text")
            return
        if not items:
            self._fail(batch, "empty_file", "the input file has no requests")
            return
        self.store.clear_results(batch.id)
        for err in (item for item in items if isinstance(item, LineError)):
            self.store.append_result(batch.id, err.line, error_record(err))
        counts = _counts(len(items), self.store.results(batch.id))
        self.store.save(replace(batch, status="in_progress", in_progress_at=int(time.time()), request_counts=counts))

    async def _run(self, batch: Batch) -> bool:
        """Run the requests not yet done; True when every line has its record (not cancelled)."""
        try:
            items = self._lines(batch)
        except (APIError, UnicodeDecodeError):
            self._fail(batch, "file_not_found", f"the input file {batch.input_file_id} no longer exists")
            return False
        done = self.store.results(batch.id)
        todo: Iterator[BatchLine] = (i for i in items if isinstance(i, BatchLine) and i.line not in done)

        async def worker() -> None:
            for line in todo:
                if batch.id in self._cancelled:
                    return
                record = await run_line(self.handlers, line, self.priority)
                self.store.append_result(batch.id, line.line, record)
                done[line.line] = record
                current = self.store.get(batch.id)
                self.store.save(replace(current, request_counts=_counts(len(items), done)))

        self._running = batch.id
        self._cancel_running.clear()
        workers = [asyncio.create_task(worker()) for _ in range(self.max_in_flight)]
        all_done = asyncio.gather(*workers)
        cancelled = asyncio.create_task(self._cancel_running.wait())
        try:
            waiters: list[asyncio.Future[Any]] = [all_done, cancelled]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if all_done.done():
                all_done.result()
        finally:  # a cancel aborts the requests in flight: their engine requests end with the tasks
            cancelled.cancel()
            all_done.cancel()
            await asyncio.gather(*workers, cancelled, return_exceptions=True)
            self._running = None
        return batch.id not in self._cancelled and len(self.store.results(batch.id)) == len(items)

    async def _finalize(self, batch: Batch, status: str) -> None:
        """The output and error files from the results so far, then the final status."""
        results = self.store.results(batch.id)
        ok = [results[n] for n in sorted(results) if is_success(results[n])]
        bad = [results[n] for n in sorted(results) if not is_success(results[n])]

        def write(records: list[dict[str, Any]], kind: str) -> str | None:
            if not records:
                return None
            data = "".join(json.dumps(r) + "\n" for r in records).encode()
            return self.files.create(f"{batch.id}_{kind}.jsonl", BATCH_OUTPUT_PURPOSE, data).id

        now = int(time.time())
        total = batch.request_counts.get("total", 0)
        ended = replace(
            self.store.get(batch.id),
            status=status,
            output_file_id=write(ok, "output"),
            error_file_id=write(bad, "error"),
            request_counts=_counts(total, results),
        )
        if status == "completed":
            self.store.save(replace(ended, completed_at=now))
        else:
            self.store.save(replace(ended, cancelled_at=now))
        self._cancelled.discard(batch.id)


def batches_router(runner: BatchRunner) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/batches")
    async def create(body: CreateBatchRequest) -> dict[str, Any]:
        return runner.create(body).body()

    @router.get("/v1/batches")
    async def list_batches(after: str | None = None, limit: int = 20) -> dict[str, Any]:
        if not 1 <= limit <= 100:
            raise APIError("limit must be in 1..100", param="limit")
        batches = runner.store.list()
        if after is not None:
            ids = [b.id for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        page = batches[:limit]
        return {
            "object": "list",
            "data": [b.body() for b in page],
            "first_id": page[0].id if page else None,
            "last_id": page[-1].id if page else None,
            "has_more": len(batches) > limit,
        }

    @router.get("/v1/batches/{batch_id}")
    async def retrieve(batch_id: str) -> dict[str, Any]:
        return runner.store.get(batch_id).body()

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel(batch_id: str) -> dict[str, Any]:
        return runner.cancel(batch_id).body()

    return router
