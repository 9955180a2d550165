"""A client that disconnects from a non-streamed request frees the engine (issue 40): completions and chat,
``n > 1``, ``best_of``, beam search and embeddings are aborted, their KV blocks freed and the running and
waiting counts in ``/metrics`` back to 0 within 1 s of the connection closing."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, serving

MODEL = "tiny"  # real torch steps: a request's engine time is seconds, not a fraction of one
FREED_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    overrides = ["engine.max_model_len=4096", "engine.max_num_seqs=32"]
    with serving(["model=tiny", *overrides], model_name=MODEL) as s:
        yield s


def samples(url: str) -> dict[tuple[str, str], float]:
    """``/metrics``' samples by (name, finished_reason or "")."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        (s.name, s.labels.get("finished_reason", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def busy(m: dict[tuple[str, str], float]) -> tuple[float, float, float]:
    return m["forge:num_requests_running", ""], m["forge:num_requests_waiting", ""], m["forge:kv_cache_usage_perc", ""]


def aborted(m: dict[tuple[str, str], float]) -> float:
    return m["forge:request_success_total", "abort"]


def send_raw(server: BackgroundServer, path: str, body: dict[str, Any]) -> socket.socket:
    """A connection that has sent ``body`` (its answer is never read)."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(head.encode() + data)
    return sock


def send_then_leave(server: BackgroundServer, path: str, body: dict[str, Any]) -> tuple[float, float]:
    """Send ``body`` without reading the answer, wait until the engine runs it, close the connection;
    the seconds until ``/metrics`` shows nothing running or waiting and no KV block in use (at most 5),
    and how many more requests ``/metrics`` then counts as aborted."""
    before = aborted(samples(server.url))
    sock = send_raw(server, path, body)
    try:
        deadline = time.monotonic() + 60
        while busy(samples(server.url))[0] == 0:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.02)
        time.sleep(0.1)  # into its work (each request takes about 2 s here)
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    left = time.monotonic()
    while any(busy(samples(server.url))) and time.monotonic() - left < 5:
        time.sleep(0.02)
    freed_after = time.monotonic() - left
    return freed_after, aborted(samples(server.url)) - before


LONG: dict[str, Any] = {"model": MODEL, "max_tokens": 4000, "ignore_eos": True}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("/v1/completions", {**LONG, "prompt": "a long one"}),
    "chat": ("/v1/chat/completions", {**LONG, "messages": [{"role": "user", "content": "a long one"}]}),
    "n": ("/v1/completions", {**LONG, "prompt": "many", "n": 16, "max_tokens": 2000}),
    "chat_n": ("/v1/chat/completions", {**LONG, "messages": [{"role": "user", "content": "x"}], "n": 8}),
    "best_of": ("/v1/completions", {**LONG, "prompt": "best", "n": 2, "best_of": 8}),
    "beam": ("/v1/completions", {**LONG, "prompt": "beam", "n": 4, "use_beam_search": True, "temperature": 0}),
    "generate": ("/generate", {"prompt": "a long one", "max_tokens": 4000}),
    "embeddings": ("/v1/embeddings", {"model": MODEL, "input": [[1 + i % 9] * 500 for i in range(2048)]}),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_disconnect_frees_the_engine(server: BackgroundServer, kind: str) -> None:
    path, body = CASES[kind]
    freed_after, newly_aborted = send_then_leave(server, path, body)
    assert freed_after < FREED_WITHIN_S, f"{kind}: engine still busy {freed_after:.2f} s after the client left"
    assert newly_aborted >= 1, "the request finished instead of being aborted"
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_client_that_stays_gets_its_answer(server: BackgroundServer) -> None:
    body = {"model": MODEL, "prompt": "short", "max_tokens": 8, "n": 2, "ignore_eos": True}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and [c["finish_reason"] for c in r.json()["choices"]] == ["length", "length"]
    e = httpx.post(server.url + "/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]}, timeout=30)
    assert e.status_code == 200 and len(e.json()["data"]) == 2


def test_a_grammar_compile_keeps_its_slot_after_its_client_left() -> None:
    """The compile a gone client started still runs in its worker, so it still counts against
    structured.max_pending_compiles: a second compile meanwhile is a 503, not queued past the cap."""
    slow = {"model": "synthetic", "prompt": "x", "max_tokens": 8, "regex": "[ab]*a[ab]{16}"}  # past the compile budget
    limits = [
        "structured.compile_timeout_s=4",
        "structured.compile_workers=1",
        "structured.max_pending_compiles=0",
        "structured.max_states=100000000",
    ]  # so the slow compile runs into its time budget, not its state cap
    with serving(["model=synthetic", "engine.max_model_len=256", *limits]) as s:
        assert httpx.post(s.url + "/v1/completions", json={**slow, "regex": "a"}, timeout=60).status_code == 200
        sock = send_raw(s, "/v1/completions", slow)
        time.sleep(1.0)  # its compile is running
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        time.sleep(0.2)  # the handler is cancelled
        r = httpx.post(s.url + "/v1/completions", json={**slow, "regex": "[ab]*b[ab]{16}"}, timeout=60)
        assert error_of(r, 503)["code"] == "overloaded"
        deadline = time.monotonic() + 60
        while httpx.post(s.url + "/v1/completions", json={**slow, "regex": "b"}, timeout=60).status_code == 503:
            assert time.monotonic() < deadline, "the slot was never given back"
            time.sleep(0.2)
