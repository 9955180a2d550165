"""A batch past its completion window expires (OpenAI's Batch API): the requests that ended keep their
results in the output file, every other request gets a ``batch_expired`` record in the error file, and
the counts add up. ``server.batch_window_s`` shortens the 24 h window for the test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.store_helpers import Store, line

WINDOW_S = 2
LINES = 40  # 40 x 400 tokens one at a time: far longer than the window on any machine


LONG = "\n".join(line(f"r{i}", "count", max_tokens=400) for i in range(LINES))


def serve(state: Path) -> BackgroundServer:
    overrides = ["model=tiny", f"server.state_dir={state}", "server.batch_max_in_flight=1"]
    cfg = compose_config([*overrides, f"server.batch_window_s={WINDOW_S}"])
    app, _ = app_from_config(cfg, "tiny")
    return BackgroundServer(app).start()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    state: Path = tmp_path_factory.mktemp("state")
    server = serve(state)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Store(client, state)
    server.stop()
    assert server.app.state.forge.engine.leak is None


def ended_ids(store: Store, done: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The custom ids in the output file, and each error record's custom id -> its code."""
    out = store.content(done["output_file_id"]) if done["output_file_id"] else []
    err = store.content(done["error_file_id"])
    return [r["custom_id"] for r in out], {r["custom_id"]: r["error"]["code"] for r in err}


def expired_as_openai_says(store: Store, done: dict[str, Any]) -> dict[str, int]:
    """``done`` expired, its counts add up, each request is in the output file (ended in time) or has a
    ``batch_expired`` record in the error file, once; its counts."""
    assert done["status"] == "expired" and done["expired_at"] >= done["expires_at"], done
    assert done["expires_at"] == done["created_at"] + WINDOW_S, done
    counts: dict[str, int] = done["request_counts"]
    assert counts["total"] == LINES and counts["completed"] + counts["failed"] == LINES and counts["failed"] > 0
    outputs, expired = ended_ids(store, done)
    assert len(outputs) == counts["completed"] and len(expired) == counts["failed"], (outputs, expired)
    assert sorted(outputs + list(expired)) == sorted(f"r{i}" for i in range(LINES))  # each request once
    assert set(expired.values()) == {"batch_expired"}
    return counts


def test_a_batch_running_past_its_window_expires_with_the_rest_as_batch_expired(store: Store) -> None:
    running = store.create(store.upload(LONG))
    expired_as_openai_says(store, store.wait(running, bound_s=60))
    assert store.client.get("/health").status_code == 200
    assert store.wait(store.create(store.upload(line("after"))), bound_s=30)["status"] == "completed"  # in time


def test_a_batch_found_past_its_window_at_start_expires_without_running(tmp_path: Path) -> None:
    """A server stopped mid-batch; the next one, started after the window, expires the batch at once."""
    first = serve(tmp_path)
    with httpx.Client(base_url=first.url, timeout=60) as client:
        batch_id = Store(client, tmp_path).create(Store(client, tmp_path).upload(LONG))
    first.stop()
    results = tmp_path / "batches" / f"{batch_id}.results.jsonl"  # one line per request that ended
    ran = len(results.read_text().splitlines()) if results.exists() else 0
    time.sleep(WINDOW_S + 1)
    second = serve(tmp_path)
    try:
        with httpx.Client(base_url=second.url, timeout=60) as client:
            store = Store(client, tmp_path)
            counts = expired_as_openai_says(store, store.wait(batch_id, bound_s=30))
            assert counts["completed"] == ran, (counts, ran)  # none ran on the second server
    finally:
        second.stop()


def test_batch_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_window_s"):
        app_from_config(compose_config(["model=tiny", "server.batch_window_s=0"]), "tiny")
