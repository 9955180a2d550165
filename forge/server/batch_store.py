"""Batch records and their results files under ``<state_dir>/batches``, trusted only once read.

``<id>.json`` is the batch object plus its owner's key fingerprint (written whole, then
renamed); one that does not read back as a batch (damaged on disk) is listed as a failed batch
whose ``errors`` say so (``failed_at`` null until the runner has delivered what it had), and
nothing else is affected. ``<id>.results.jsonl`` holds one checksummed line per request that has
ended (``store_io.Disk.append``); a line whose checksum fails (torn by a stop mid-write, or
damaged), that is not a valid output record, or that names a line the input does not have is
ignored: that request runs again."""

from __future__ import annotations

import json
import re
from collections.abc import Container, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from forge.server.batch_lines import is_record, is_success
from forge.server.files import read_record, record_owner
from forge.server.protocol import APIError
from forge.server.store_io import Disk

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
STATUSES = frozenset({*ACTIVE, "completed", "failed", "expired", "cancelled"})
BATCH_ID = re.compile(r"batch_[0-9a-zA-Z]{1,64}", re.ASCII)
DAMAGED = "damaged_record"


@dataclass(frozen=True)
class Batch:
    """OpenAI's batch object; ``owner`` (the creator's key fingerprint) is stored, never sent."""

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
    owner: str | None = field(default=None, repr=False)

    def body(self) -> dict[str, Any]:
        out = asdict(self)
        del out["owner"]
        return out

    @property
    def damaged(self) -> bool:
        """A record that did not read back, whose results the runner has not delivered yet."""
        return self.status == "failed" and self.failed_at is None and error_code(self) == DAMAGED


RECORD = TypeAdapter(Batch)


def error_code(batch: Batch) -> Any:
    data = (batch.errors or {}).get("data")
    first = data[0] if isinstance(data, list) and data else None
    return first.get("code") if isinstance(first, dict) else None


def errors(code: str, message: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]}


def batch_not_found(batch_id: str) -> APIError:
    return APIError(f"No such Batch object: {batch_id[:64]}", 404, "invalid_request_error", "batch_id", "not_found")


def _check(batch: Batch, batch_id: str) -> str | None:
    """Why a record that has a batch's shape is still not this batch (None: it is)."""
    counts = batch.request_counts
    if batch.id != batch_id:
        return "it names another batch"
    if batch.status not in STATUSES:
        return f"unknown status {batch.status[:32]!r}"
    if set(counts) != {"total", "completed", "failed"} or min(counts.values()) < 0:
        return "bad request_counts"
    return None


def _damaged(batch_id: str, path: Path, data: bytes, reason: str) -> Batch:
    owner = record_owner(data)
    when = int(path.stat().st_mtime)
    message = f"the batch's record is damaged ({reason[:200]}); the results it had are in its files"
    return Batch(batch_id, "", "", "24h", "failed", when, when, errors=errors(DAMAGED, message), owner=owner)


class BatchStore:
    """Batch records and their results files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root  # made by the first batch

    def _path(self, batch_id: str, suffix: str) -> Path:
        if not BATCH_ID.fullmatch(batch_id):
            raise batch_not_found(batch_id)
        return self.root / f"{batch_id}{suffix}"

    def save(self, batch: Batch) -> Batch:
        self.root.mkdir(parents=True, exist_ok=True)
        Disk.write(self._path(batch.id, ".json"), json.dumps(asdict(batch)).encode())
        return batch

    def get(self, batch_id: str) -> Batch:
        path = self._path(batch_id, ".json")
        if not path.exists():
            raise batch_not_found(batch_id)
        data = b""
        try:
            data = read_record(path, "the record")
            batch = RECORD.validate_json(data, strict=True)
        except ValidationError as exc:
            return _damaged(batch_id, path, data, f"{exc.error_count()} invalid fields")
        except ValueError as exc:
            return _damaged(batch_id, path, data, str(exc))
        problem = _check(batch, batch_id)
        return batch if problem is None else _damaged(batch_id, path, data, problem)

    def list(self) -> list[Batch]:
        """Newest first."""
        batches = [b for b in (self._listed(p.stem) for p in self.root.glob("batch_*.json")) if b is not None]
        return sorted(batches, key=lambda b: (b.created_at, b.id), reverse=True)

    def _listed(self, batch_id: str) -> Batch | None:
        try:
            return self.get(batch_id)
        except (APIError, FileNotFoundError):  # removed meanwhile, or not a name this store makes
            return None

    def results(self, batch_id: str, lines: Container[int] | None = None) -> dict[int, dict[str, Any]]:
        """The valid records of the requests that have ended, by input line (only ``lines``, when given)."""
        out: dict[int, dict[str, Any]] = {}
        for text in Disk.lines(self._path(batch_id, ".results.jsonl")):
            try:
                entry = json.loads(text)
            except (ValueError, RecursionError):
                continue
            line = entry.get("line") if isinstance(entry, dict) else None
            if type(line) is int and (lines is None or line in lines) and is_record(entry.get("record")):
                out[line] = entry["record"]
        return out

    def append_results(self, batch_id: str, records: Iterable[tuple[int, dict[str, Any]]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        texts = (json.dumps({"line": line, "record": record}) for line, record in records)
        Disk.append(self._path(batch_id, ".results.jsonl"), texts)

    def clear_results(self, batch_id: str) -> None:
        self._path(batch_id, ".results.jsonl").unlink(missing_ok=True)


@dataclass
class Tally:
    """A batch's request counts, kept as requests end (O(1) per request)."""

    total: int
    completed: int = 0
    failed: int = 0

    @classmethod
    def of(cls, total: int, results: dict[int, dict[str, Any]]) -> Tally:
        completed = sum(1 for r in results.values() if is_success(r))
        return cls(total, completed, len(results) - completed)

    def add(self, record: dict[str, Any]) -> None:
        if is_success(record):
            self.completed += 1
        else:
            self.failed += 1

    def counts(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}
