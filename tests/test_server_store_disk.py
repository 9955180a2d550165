"""The batch store when the disk fills up or its files change under it, and across restarts
(issue 40): a full disk is a 507 (never a 500), a batch that cannot record its results fails
with what it had, one that cannot even record that waits and resumes once there is room, and a
server restarted after damaged results or a vanished input loses nothing complete and
duplicates nothing. The disk is filled by patching ``store_io.Disk``, the state dir's one
write layer."""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from forge.server.batches import RETRY_S
from forge.server.store_io import Disk
from tests.store_helpers import Store, line

INPUT = [f"d{i}" for i in range(6)]


def full(*_: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def serve(state: Path) -> BackgroundServer:
    cfg = compose_config(["model=tiny", f"server.state_dir={state}", "server.batch_max_in_flight=1"])
    app, _ = app_from_config(cfg, "tiny")
    return BackgroundServer(app).start()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    server = serve(tmp_path)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Store(client, tmp_path)
    server.stop()
    assert server.app.state.forge.engine.leak is None


def started(store: Store) -> str:
    """A batch of ``INPUT`` (60 tokens a line, one at a time) with at least one line done."""
    batch_id = store.create(store.upload("\n".join(line(c, f"p {c}", 60) for c in INPUT)))
    store.wait_completed(batch_id, 1)
    return batch_id


def fill(monkeypatch: pytest.MonkeyPatch, *methods: str) -> None:
    for method in methods:
        monkeypatch.setattr(Disk, method, staticmethod(full))


def test_a_full_disk_is_507_for_writes_and_reads_still_answer(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    file_id = store.upload(line("x"))
    fill(monkeypatch, "write", "append")
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    files = {"file": ("in.jsonl", line("y").encode())}
    for r in (
        store.client.post("/v1/files", files=files, data={"purpose": "batch"}),
        store.client.post("/v1/batches", json=body),
    ):
        assert r.status_code == 507, r.text
        assert r.json()["error"]["code"] == "insufficient_storage" and "Traceback" not in r.text
    for path in ("/v1/files", "/v1/batches", f"/v1/files/{file_id}", "/health"):
        assert store.client.get(path).status_code == 200, path
    monkeypatch.undo()
    assert store.run(line("after"))["status"] == "completed"


def test_a_batch_that_cannot_record_results_fails_with_what_it_had(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = started(store)
    fill(monkeypatch, "append")
    done = store.wait(batch_id)
    assert done["status"] == "failed" and done["errors"]["data"][0]["code"] == "insufficient_storage", done
    delivered = [o["custom_id"] for o in store.content(done["output_file_id"])]
    assert delivered and len(set(delivered)) == len(delivered) and set(delivered) <= set(INPUT), delivered
    assert store.client.get("/health").status_code == 200
    monkeypatch.undo()
    assert store.run(line("after"))["status"] == "completed"


def test_a_batch_that_cannot_record_anything_resumes_when_there_is_room(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = started(store)
    fill(monkeypatch, "write", "append")
    time.sleep(1.5 * RETRY_S)  # the runner meets the full disk, then retries each RETRY_S
    for _ in range(3):  # the runner retries; meanwhile the batch is still answered as it was
        assert store.batch(batch_id)["status"] == "in_progress"
        assert store.client.get("/health").status_code == 200
    monkeypatch.undo()
    done = store.wait(batch_id)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == len(INPUT), done
    assert sorted(o["custom_id"] for o in store.content(done["output_file_id"])) == INPUT


# -- restarts -----------------------------------------------------------------------------------
def plant_garbage(state: Path, batch_id: str) -> None:
    results = state / "batches" / f"{batch_id}.results.jsonl"
    with results.open("a") as f:
        f.write('[]\n{"line": 1}\n1e400\n')
    Disk.append(results, ['{"line": 99, "record": {}}', "[]"])
    with results.open("a") as f:
        f.write('0badc0de {"line": 2, "rec')  # torn


def delete_input(state: Path, batch_id: str) -> None:
    file_id = json.loads((state / "batches" / f"{batch_id}.json").read_text())["input_file_id"]
    for suffix in (".json", ".bin"):
        (state / "files" / f"{file_id}{suffix}").unlink()


# (case, what happens to the state dir while no server runs, the status the batch ends in)
RESTART_CASES: tuple[tuple[str, Callable[[Path, str], None], str], ...] = (
    ("garbage-results", plant_garbage, "completed"),
    ("input-deleted", delete_input, "failed"),
)


@pytest.mark.parametrize(("damage", "status"), [c[1:] for c in RESTART_CASES], ids=[c[0] for c in RESTART_CASES])
def test_a_restart_after_damage_loses_nothing_complete(
    tmp_path: Path, damage: Callable[[Path, str], None], status: str
) -> None:
    first = serve(tmp_path)
    with httpx.Client(base_url=first.url, timeout=60) as client:
        batch_id = started(Store(client, tmp_path))
    first.stop()
    stopped = json.loads((tmp_path / "batches" / f"{batch_id}.json").read_text())
    assert stopped["status"] == "in_progress", stopped
    damage(tmp_path, batch_id)
    second = serve(tmp_path)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            store = Store(client, tmp_path)
            done = store.wait(batch_id)
            assert done["status"] == status, done
            delivered = [o["custom_id"] for o in store.content(done["output_file_id"])]
            assert len(set(delivered)) == len(delivered) and set(delivered) <= set(INPUT), delivered
            expected = len(INPUT) if status == "completed" else stopped["request_counts"]["completed"]
            assert len(delivered) == expected, (delivered, stopped)
    finally:
        second.stop()
