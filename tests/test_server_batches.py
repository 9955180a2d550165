"""/v1/files + /v1/batches through the official OpenAI client, and a batch that survives a server stop."""

from __future__ import annotations

import io
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, server_process

TERMINAL = ("completed", "failed", "cancelled", "expired")


def start(state_dir: Path, *overrides: str) -> BackgroundServer:
    cfg = compose_config(["model=tiny", f"server.state_dir={state_dir}", *overrides])
    app, _ = app_from_config(cfg, "tiny")
    return BackgroundServer(app)


def request_line(custom_id: str, body: dict[str, Any], url: str = "/v1/completions") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def completion(prompt: str, max_tokens: int = 6) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}


def wait_for(
    client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = TERMINAL, timeout_s: float = 60.0
) -> Any:
    deadline = time.monotonic() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in statuses:
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.05)
        batch = client.batches.retrieve(batch_id)
    return batch


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    with start(tmp_path_factory.mktemp("state")) as s:
        yield s
    assert s.app.state.forge.engine.leak is None


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_batch_through_the_openai_client(client: openai.OpenAI) -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    lines = [
        request_line("a", completion("Hello")),
        "{not json",
        request_line("b", completion("abc", 0)),  # a request the endpoint refuses: a 400 response
        "",
        request_line("c", chat, url="/v1/chat/completions"),  # not the batch's endpoint
        request_line("a", completion("again")),  # custom_id repeated
        request_line("d", completion("World", 5)),
    ]
    upload = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes == len("\n".join(lines).encode())
    assert client.files.content(upload.id).text == "\n".join(lines)
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    assert batch.status == "validating" and batch.endpoint == "/v1/completions"
    batch = wait_for(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 2, 4)
    assert batch.output_file_id is not None and batch.error_file_id is not None

    outputs = jsonl(client.files.content(batch.output_file_id).text)
    assert [o["custom_id"] for o in outputs] == ["a", "d"]
    for out, (prompt, n) in zip(outputs, [("Hello", 6), ("World", 5)], strict=True):
        assert out["error"] is None and out["response"]["status_code"] == 200
        direct = client.completions.create(model="tiny", prompt=prompt, max_tokens=n, temperature=0)
        assert out["response"]["body"]["choices"][0]["text"] == direct.choices[0].text
        assert out["response"]["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens  # type: ignore[union-attr]

    errors = jsonl(client.files.content(batch.error_file_id).text)
    by_line = {e["error"]["line"]: e for e in errors if e["error"] is not None}
    assert set(by_line) == {2, 5, 6}  # 1-based line numbers; the blank line 4 is no request
    assert by_line[2]["error"]["code"] == "invalid_json" and "line 2" in by_line[2]["error"]["message"]
    assert by_line[5]["custom_id"] == "c" and by_line[6]["error"]["code"] == "duplicate_custom_id"
    refused = [e for e in errors if e["error"] is None]
    assert [e["custom_id"] for e in refused] == ["b"]
    assert refused[0]["response"]["status_code"] == 400 and refused[0]["response"]["body"]["error"]["param"]

    assert batch.id in [b.id for b in client.batches.list()]
    assert {upload.id, batch.output_file_id} <= {f.id for f in client.files.list()}
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_bad_batch_requests_get_openai_errors(server: BackgroundServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_0123456789abcdef")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    upload = client.files.create(
        file=("x.jsonl", io.BytesIO(request_line("a", completion("x")).encode())), purpose="batch"
    )
    url = server.url + "/v1/batches"
    body = {"input_file_id": upload.id, "endpoint": "/v1/completions", "completion_window": "24h"}
    for unknown in (httpx.get(url + "/batch_nope"), httpx.post(url + "/batch_nope/cancel")):
        assert error_of(unknown, 404)["type"] == "invalid_request_error"
    assert error_of(httpx.post(url, json={**body, "endpoint": "/v1/models"}), 400)["param"] == "endpoint"
    assert error_of(httpx.post(url, json={**body, "completion_window": "1h"}), 400)["param"] == "completion_window"
    assert error_of(httpx.post(url, json={**body, "priority": 1}), 400)["param"] == "priority"
    files = server.url + "/v1/files"
    assert error_of(httpx.post(files, files={"file": ("x.jsonl", b"{}")}, data={"purpose": "fine-tune"}), 400)
    assert error_of(httpx.post(files, files={"file": ("x.jsonl", b"\xff\xfe")}, data={"purpose": "batch"}), 400)
    assert error_of(httpx.get(files + "/../../etc/passwd"), 404)
    page = httpx.get(files, params={"limit": 1, "order": "asc"}).json()
    assert len(page["data"]) == 1 and page["has_more"] and page["first_id"] == page["last_id"]
    rest = httpx.get(files, params={"after": page["last_id"], "order": "asc"}).json()["data"]
    assert rest and page["last_id"] not in [f["id"] for f in rest]
    assert error_of(httpx.get(files, params={"limit": 0}), 400)["param"] == "limit"


def test_cancel_stops_a_running_batch(tmp_path: Path) -> None:
    long = {**completion("slow", 150), "ignore_eos": True}
    long_lines = "\n".join(request_line(f"r{i}", long) for i in range(20))
    short_lines = "\n".join(request_line(f"s{i}", {**completion("quick", 60), "ignore_eos": True}) for i in range(4))
    with start(tmp_path, "server.batch_max_in_flight=1") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)

        def create(lines: str) -> Any:
            upload = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
            return client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")

        running, queued = create(short_lines), create(long_lines)
        wait_for(client, running.id, ("in_progress", *TERMINAL))  # polled: it may have ended meanwhile
        assert client.batches.cancel(queued.id).status == "cancelling"
        done = wait_for(client, running.id)  # cancelling another batch leaves this one running to the end
        assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 4
        cancelled = wait_for(client, queued.id)
        assert cancelled.status == "cancelled" and cancelled.output_file_id is None

        batch = create(long_lines)
        wait_for(client, batch.id, ("in_progress",))
        assert client.batches.cancel(batch.id).status == "cancelling"
        batch = wait_for(client, batch.id)
        assert batch.status == "cancelled" and batch.cancelled_at is not None
        assert batch.request_counts is not None and batch.request_counts.completed < 20
        engine = s.app.state.forge.engine.engine
        deadline = time.monotonic() + 10
        while engine.has_unfinished():  # the request in flight was aborted, not left to finish
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert error_of(httpx.post(f"{s.url}/v1/batches/{done.id}/cancel"), 409)["code"] == "invalid_state"


def test_a_batch_in_progress_resumes_on_the_next_server(tmp_path: Path) -> None:
    """Stopped mid-batch, the next server on the same state dir runs what is left: every request once."""
    prompts = [f"line {i}" for i in range(6)]
    lines = "\n".join(request_line(p, {**completion(p, 60), "ignore_eos": True}) for p in prompts)
    with start(tmp_path, "server.batch_max_in_flight=1") as first:
        client = openai.OpenAI(base_url=first.url + "/v1", api_key="unused", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 60
        while (client.batches.retrieve(batch.id).request_counts or batch.request_counts).completed < 1:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.02)
    stopped = json.loads((tmp_path / "batches" / f"{batch.id}.json").read_text())
    assert stopped["status"] == "in_progress" and 1 <= stopped["request_counts"]["completed"] < 6

    with start(tmp_path) as second:
        client = openai.OpenAI(base_url=second.url + "/v1", api_key="unused", max_retries=0)
        done = wait_for(client, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 0)
        outputs = jsonl(client.files.content(done.output_file_id or "").text)
        assert sorted(o["custom_id"] for o in outputs) == sorted(prompts)
        for out in outputs:
            direct = client.completions.create(
                model="tiny", prompt=out["custom_id"], max_tokens=60, temperature=0, extra_body={"ignore_eos": True}
            )
            assert out["response"]["body"]["choices"][0]["text"] == direct.choices[0].text


def test_interactive_requests_go_before_waiting_batch_requests(tmp_path: Path) -> None:
    """scheduler=priority, one sequence at a time, 4 batch requests in the engine: an interactive
    request waits for the running batch request only, not for the 3 queued behind it."""
    lines = "\n".join(request_line(f"r{i}", {**completion(f"p{i}", 60), "ignore_eos": True}) for i in range(12))
    overrides = ("scheduler=priority", "engine.max_num_seqs=1", "server.batch_max_in_flight=4")
    with start(tmp_path, *overrides) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
        engine = s.app.state.forge.engine.engine
        deadline = time.monotonic() + 30
        while len(engine.scheduler.waiting) < 3:  # the runner's 4: one running, three waiting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        before = client.batches.retrieve(batch.id).request_counts
        client.completions.create(model="tiny", prompt="interactive", max_tokens=5, temperature=0)
        after = client.batches.retrieve(batch.id).request_counts
        assert before is not None and after is not None
        assert after.completed - before.completed <= 2  # the running one (+1 if it ended between the reads)
        client.batches.cancel(batch.id)
        assert wait_for(client, batch.id).status == "cancelled"


@pytest.mark.slow
def test_a_batch_survives_a_killed_server_process(tmp_path: Path) -> None:
    """SIGKILL mid-batch (no drain at all): the next server process on the state dir finishes it."""
    cmd = [
        *(sys.executable, "run.py", "mode=serve", "model=tiny", "server.port=0", "server.batch_max_in_flight=1"),
        *(f"server.state_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"),
    ]
    prompts = [f"kill {i}" for i in range(6)]
    lines = "\n".join(request_line(p, {**completion(p, 80), "ignore_eos": True}) for p in prompts)
    with server_process(cmd) as (proc, port):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        upload = client.files.create(file=("in.jsonl", io.BytesIO(lines.encode())), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while (client.batches.retrieve(batch.id).request_counts or batch.request_counts).completed < 1:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    with server_process(cmd) as (_, port):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        done = wait_for(client, batch.id, timeout_s=120)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (6, 0)
        outputs = jsonl(client.files.content(done.output_file_id or "").text)
        assert sorted(o["custom_id"] for o in outputs) == sorted(prompts)


def test_an_embeddings_batch_answers_as_the_route(client: openai.OpenAI) -> None:
    lines = [request_line(f"e{i}", {"model": "tiny", "input": text}, "/v1/embeddings") for i, text in enumerate("ab")]
    upload = client.files.create(file=("e.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = wait_for(client, batch.id)
    assert batch.status == "completed" and batch.output_file_id is not None
    outputs = jsonl(client.files.content(batch.output_file_id).text)
    for out, text in zip(outputs, "ab", strict=True):
        direct = client.embeddings.create(model="tiny", input=text, encoding_format="float")
        assert out["response"]["body"]["data"][0]["embedding"] == direct.data[0].embedding
