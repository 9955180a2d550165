"""How a batch ends (``BatchRunner._finalize``'s blocking part): its output and error files from the
results recorded so far, its final status and counts; and, for a batch past its completion window,
the ``batch_expired`` records of the requests that did not run (OpenAI's: they go to the error file,
the requests that ended keep their results)."""

from __future__ import annotations

import json
import time
from collections.abc import Container
from dataclasses import replace
from typing import Any

from forge.server.batch_lines import BatchLine, LineError, error_record, is_success
from forge.server.batch_store import Batch, BatchStore, Tally
from forge.server.files import BATCH_OUTPUT_PURPOSE, FileStore
from forge.server.store_io import FULL

EXPIRED = "This request could not be executed before the completion window expired."


def expired_records(items: list[BatchLine | LineError], done: Container[int]) -> list[tuple[int, dict[str, Any]]]:
    """(line, ``batch_expired`` error record) of each request of ``items`` without a result in ``done``."""
    left = [i for i in items if isinstance(i, BatchLine) and i.line not in done]
    return [(i.line, error_record(LineError(i.line, i.custom_id, "batch_expired", EXPIRED))) for i in left]


def end_batch(
    store: BatchStore,
    files: FileStore,
    batch_id: str,
    status: str,
    errs: dict[str, Any] | None,
    items: list[BatchLine | LineError] | None,
) -> None:
    """Write the output and error files and the final ``status`` (``failed`` with ``errs``) from the
    results of the input's lines ``items`` (None: the input cannot be read, every result is kept); an
    ``expired`` batch's requests without a result get their ``batch_expired`` records first. When the
    disk is too full for the files, a failed batch is still marked failed (its results stay in the state dir)."""
    results = store.results(batch_id, None if items is None else {i.line for i in items})
    if status == "expired" and items is not None:
        expired = expired_records(items, results)
        store.append_results(batch_id, expired)
        results.update(expired)
    current = store.get(batch_id)
    total = max(current.request_counts.get("total", 0), len(results))
    ended = replace(current, status=status, request_counts=Tally.of(total, results).counts())
    try:
        output, error = _write_outputs(files, current, results)
        ended = replace(ended, output_file_id=output, error_file_id=error)
    except OSError as exc:
        if status != "failed" or exc.errno not in FULL:
            raise
    now = int(time.time())
    if status == "completed":
        ended = replace(ended, completed_at=now)
    elif status == "cancelled":
        ended = replace(ended, cancelled_at=now)
    elif status == "expired":
        ended = replace(ended, expired_at=now)
    else:
        ended = replace(ended, failed_at=now, errors=errs)
    store.save(ended)


def _write_outputs(files: FileStore, batch: Batch, results: dict[int, dict[str, Any]]) -> tuple[str | None, str | None]:
    ok = [results[n] for n in sorted(results) if is_success(results[n])]
    bad = [results[n] for n in sorted(results) if not is_success(results[n])]

    def write(records: list[dict[str, Any]], kind: str) -> str | None:
        if not records:
            return None
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
        return files.create(f"{batch.id}_{kind}.jsonl", BATCH_OUTPUT_PURPOSE, data, batch.owner).id

    return write(ok, "output"), write(bad, "error")
