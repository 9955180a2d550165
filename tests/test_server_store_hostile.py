"""The batch store against damaged state (issue 40): results lines and batch and file records
that do not read back, a line that names no input line, an input file deleted mid-batch, odd
batch lines (nested 3,000 deep, raw U+2028 / U+0085) and a big batch validated while ``/health``
is probed. Each case is one row of a table; every answer is in OpenAI's error shape, never a
500, and after each case the runner still runs batches."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from forge.server.store_io import Disk
from tests.hostile_cases import STORE_ID_CASES, Case
from tests.store_helpers import LINE_CASES, Store, line
from tests.test_server_hostile import HEALTH_PROBE_S, HealthProbe, check_answer, send
from tests.waiting import wait_until

VALID = {"id": "batch_req_x", "custom_id": "planted", "response": {"status_code": 200, "body": {}}, "error": None}


def serve(state: Path, *overrides: str) -> BackgroundServer:
    cfg = compose_config(["model=tiny", f"server.state_dir={state}", "server.batch_max_in_flight=1", *overrides])
    app, _ = app_from_config(cfg, "tiny")
    return BackgroundServer(app).start()


# The longest /health may take while a batch's lines are read and checked. 150k lines read on the loop
# (planted): worst probe 0.98-1.12 s; off it: 0.11-0.33 s, 2 of 6 runs over 0.3 s (one core shared with a
# full test run, taskset -c 1, at 9e9f085).
LOOP_STALL_S = 0.5


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    state = tmp_path_factory.mktemp("state")
    server = serve(state, "server.max_body_bytes=67108864")
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield Store(client, state)
    server.stop()
    assert server.app.state.forge.engine.leak is None


def assert_runner_alive(store: Store) -> None:
    """/health is 200 and a new batch still runs to its end."""
    assert store.client.get("/health").status_code == 200
    done = store.run(line("alive"))
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 1, done


@pytest.mark.parametrize("case", STORE_ID_CASES, ids=[c.id for c in STORE_ID_CASES])
def test_an_odd_file_or_batch_id_is_404(store: Store, case: Case) -> None:
    if not (store.state / "batches").exists():
        store.run(line("first"))  # the files and batches directories exist from here on
    check_answer(send(store.client, case), case.expect)
    assert store.client.get("/health").status_code == 200


# -- results lines that are not results ------------------------------------------------------
# (id, the text appended to a running batch's results file, whether it carries a valid checksum)
RESULTS_CASES = (
    ("empty-list", "[]", False),
    ("line-only", '{"line": 1}', False),
    ("huge-number", "1e400", False),
    ("status-OK", json.dumps({"line": 1, "record": {**VALID, "response": {"status_code": "OK", "body": {}}}}), False),
    ("line-not-in-input", json.dumps({"line": 13, "record": VALID}), False),
    ("torn", '{"line": 2, "rec', False),
    ("checksummed-empty-list", "[]", True),
    ("checksummed-line-only", '{"line": 1}', True),
    ("checksummed-status-OK", json.dumps({"line": 1, "record": {**VALID, "response": {"status_code": "OK"}}}), True),
    ("checksummed-status-true", json.dumps({"line": 2, "record": {**VALID, "response": {"status_code": True}}}), True),
    ("checksummed-line-not-in-input", json.dumps({"line": 13, "record": VALID}), True),
    ("checksummed-line-string", json.dumps({"line": "1", "record": VALID}), True),
    ("checksummed-deep", "[" * 100_000 + "]" * 100_000, True),
)


@pytest.mark.parametrize(("text", "checksummed"), [c[1:] for c in RESULTS_CASES], ids=[c[0] for c in RESULTS_CASES])
def test_a_results_line_that_is_no_result_is_run_again(store: Store, text: str, checksummed: bool) -> None:
    """Planted while the batch runs: the batch completes, each input line answered exactly once."""
    ids = [f"r{i}" for i in range(4)]
    batch_id = store.create(store.upload("\n".join(line(c, f"p {c}", 40) for c in ids)))
    store.wait(batch_id, ("in_progress",))
    if checksummed:
        Disk.append(store.results(batch_id), [text])
    else:
        with store.results(batch_id).open("a") as f:
            f.write(text + "\n")
    assert store.batch(batch_id)["status"] == "in_progress"  # planted before the batch ended
    done = store.wait(batch_id)
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}, done
    assert sorted(o["custom_id"] for o in store.content(done["output_file_id"])) == ids
    assert done["error_file_id"] is None
    assert_runner_alive(store)


# -- batch and file records that are not records ----------------------------------------------
RECORD_CASES = (
    ("garbage", b"garbage"),
    ("empty", b""),
    ("list", b"[]"),
    ("empty-object", b"{}"),
    ("non-utf8", b"\xff\xfe{"),
    ("nested-100k", b"[" * 100_000 + b"]" * 100_000),
    ("200k-record", json.dumps({"id": "x" * 200_000}).encode()),
)
# batch records with a batch's shape and one field wrong
FIELD_CASES = (
    ("created_at-string", {"created_at": "yesterday"}),
    ("created_at-1e400", {"created_at": 1e400}),
    ("expires_at-float", {"expires_at": 1.5}),
    ("status-unknown", {"status": "weird"}),
    ("status-int", {"status": 3}),
    ("counts-missing", {"request_counts": {"total": 1}}),
    ("counts-negative", {"request_counts": {"total": 1, "completed": -1, "failed": 0}}),
    ("counts-bool", {"request_counts": {"total": True, "completed": 1, "failed": 0}}),
    ("another-id", {"id": "batch_someoneelse"}),
    ("metadata-list", {"metadata": ["a"]}),
)


def damaged_batch_cases() -> list[tuple[str, Any]]:
    return [*RECORD_CASES, *FIELD_CASES]


@pytest.mark.parametrize("damage", [c[1] for c in damaged_batch_cases()], ids=[c[0] for c in damaged_batch_cases()])
def test_a_damaged_batch_record_fails_that_batch_only(store: Store, damage: Any) -> None:
    """Listing stays 200, the batch is failed with a reason, its results are still delivered, and
    the runner goes on."""
    batch_id = store.run(line("kept", "keep me", 6))["id"]
    record = store.record(batch_id)
    data = damage if isinstance(damage, bytes) else json.dumps({**json.loads(record.read_text()), **damage}).encode()
    record.write_bytes(data)
    listed = store.client.get("/v1/batches", params={"limit": 100})
    assert listed.status_code == 200, listed.text
    shown = {b["id"]: b for b in listed.json()["data"]}[batch_id]
    assert shown["status"] == "failed" and shown["errors"]["data"][0]["code"] == "damaged_record", shown
    assert store.batch(batch_id)["status"] == "failed"
    assert store.client.post(f"/v1/batches/{batch_id}/cancel").status_code == 409
    assert_runner_alive(store)
    wait_until(lambda: store.batch(batch_id)["failed_at"] is not None, lambda: str(store.batch(batch_id)))
    delivered = store.batch(batch_id)
    assert [o["custom_id"] for o in store.content(delivered["output_file_id"])] == ["kept"]


@pytest.mark.parametrize("damage", [c[1] for c in RECORD_CASES], ids=[c[0] for c in RECORD_CASES])
def test_a_damaged_file_record_is_listed_as_an_error(store: Store, damage: bytes) -> None:
    file_id, other = store.upload(line("a")), store.upload(line("b"))
    (store.state / "files" / f"{file_id}.json").write_bytes(damage)
    listed = store.client.get("/v1/files")
    assert listed.status_code == 200, listed.text
    shown = {f["id"]: f for f in listed.json()["data"]}
    assert shown[file_id]["status"] == "error" and "damaged" in shown[file_id]["status_details"]
    assert shown[other]["status"] == "processed"
    assert store.client.get(f"/v1/files/{file_id}/content").text == line("a")
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    r = store.client.post("/v1/batches", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id", r.text
    assert_runner_alive(store)


# -- input files --------------------------------------------------------------------------------
def test_the_input_of_a_running_batch_is_kept_until_it_ends(store: Store) -> None:
    file_id = store.upload("\n".join(line(f"k{i}", "keep", 40) for i in range(3)))
    batch_id = store.create(file_id)
    refused = store.client.delete(f"/v1/files/{file_id}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "file_in_use", refused.text
    done = store.wait(batch_id)
    assert done["status"] == "completed" and done["request_counts"]["completed"] == 3, done
    assert store.client.delete(f"/v1/files/{file_id}").json()["deleted"] is True


# -- batch lines ----------------------------------------------------------------------------------
def test_odd_batch_lines_are_each_answered_on_their_own(store: Store) -> None:
    """A line nested 3,000 deep is that line's error (not the whole batch failing), and a raw
    U+2028 / U+0085 / U+2029 inside a string does not end a line (lines end at \\n only)."""
    done = store.run("\n".join(text for _, _, text, _ in LINE_CASES))
    assert done["status"] == "completed", done
    assert done["request_counts"]["total"] == len(LINE_CASES), done
    records = store.content(done["output_file_id"]) + store.content(done["error_file_id"])
    assert len(records) == len(LINE_CASES)
    unread = {r["error"]["line"]: r["error"] for r in records if r["error"] is not None}
    answered = {r["custom_id"] for r in records if r["error"] is None}
    for number, (case, custom_id, _, code) in enumerate(LINE_CASES, 1):
        if code is None:
            assert custom_id in answered, case
        else:
            assert unread[number]["code"] == code and "nests" in unread[number]["message"], (case, unread)


def test_health_answers_while_a_150k_line_batch_is_validated(store: Store) -> None:
    """Reading, checking and recording 150,000 lines (here all refused, so the engine does no work)
    happens off the event loop: /health answers within ``LOOP_STALL_S`` throughout. (Read on the
    loop, these lines stall it 0.6-1.2 s on the 2-core dev VM; off it, the worst probe took 0.03 s unloaded,
    up to 0.33 s on a core shared with a full test run.)"""
    text = "\n".join(line(f"v{i}", "x", url="/v1/embeddings") for i in range(150_000))
    with HealthProbe(str(store.client.base_url)) as probe:
        done = store.run(text)
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 150_000, done
    assert probe.worst < LOOP_STALL_S < HEALTH_PROBE_S, sorted(probe.latencies)[-5:]
