"""HTTP-level hardening: unencodable text, odd API keys, the rate-limit key, stop-string limits,
header/body timeouts and the body-size limit, errors in OpenAI's shape everywhere, and the drain
on SIGTERM (a real ``run.py mode=serve`` subprocess)."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.engine.build import build_engine
from forge.server.app import build_app
from forge.server.background import BackgroundServer
from forge.server.settings import ServerSettings
from tests import server_helpers
from tests.server_helpers import error_of, server_process, serving

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"model": "synthetic", "prompt": "hello", "max_tokens": 4}
JSON = {"content-type": "application/json"}


def start(overrides: list[str]) -> BackgroundServer:
    return server_helpers.start(["model=synthetic", *overrides])


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(
        ["model=synthetic", "engine.max_model_len=256", "server.body_timeout_s=1", "server.header_timeout_s=1"]
    ) as s:
        yield s


# -- item 3: text that is not valid Unicode ------------------------------------------------
LONE_SURROGATE = [
    ("/v1/completions", '{"model": "synthetic", "prompt": "a\\ud800b", "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"model": "synthetic", "prompt": ["ok", "\\udc00"], "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"model": "synthetic", "prompt": "a", "stop": ["\\ud800"], "max_tokens": 4}', "stop"),
    (
        "/v1/chat/completions",
        '{"model": "synthetic", "messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 4}',
        "messages",
    ),
    ("/tokenize", '{"prompt": "a\\ud800b"}', "prompt"),
    ("/tokenize", '{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages"),
]


@pytest.mark.parametrize(("path", "body", "param"), LONE_SURROGATE)
def test_lone_surrogates_are_400(server: BackgroundServer, path: str, body: str, param: str) -> None:
    err = error_of(httpx.post(server.url + path, content=body.encode(), headers=JSON), 400)
    assert err["param"].startswith(param), err
    assert "Unicode" in err["message"]


# -- items 4 and 5: API keys and the rate-limit key ------------------------------------------
def test_non_ascii_bearer_token_is_401_and_a_non_ascii_key_works() -> None:
    s = start(["server.api_keys=[k1,'ключ']"])
    try:
        u = s.url + "/v1/completions"
        for token in ("Bearer ключ-не-тот".encode(), b"Bearer \xff\xfe", "Bearer é".encode("latin-1")):
            err = error_of(httpx.post(u, json=GOOD, headers={b"Authorization": token}), 401)
            assert err["type"] == "authentication_error"
        ok = httpx.post(u, json=GOOD, headers={b"Authorization": "Bearer ключ".encode()})
        assert ok.status_code == 200, ok.text
    finally:
        s.stop()


def test_rate_limit_without_auth_is_per_client_not_per_made_up_token() -> None:
    s = start(["server.rate_limit_rps=0.01", "server.rate_limit_burst=2"])
    try:
        u = s.url + "/v1/completions"
        codes = [
            httpx.post(u, json=GOOD, headers={"Authorization": f"Bearer made-up-{i}"}).status_code for i in range(4)
        ]
        assert codes[:2] == [200, 200] and codes[2:] == [429, 429], codes
    finally:
        s.stop()


# -- item 6: stop strings ------------------------------------------------------------------
def test_stop_strings_longer_than_the_cap_are_400(server: BackgroundServer) -> None:
    body = {**GOOD, "stop": ["x" * 100_000] * 16}
    err = error_of(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert err["param"] == "stop" and "1024" in err["message"]
    ok = httpx.post(server.url + "/v1/completions", json={**GOOD, "stop": ["x" * 1024] * 16})
    assert ok.status_code == 200, ok.text


# -- item 7: body size, body and header timeouts ---------------------------------------------
def test_oversized_bodies_are_413_before_being_parsed(server: BackgroundServer) -> None:
    big = json.dumps({**GOOD, "prompt": "x" * (5 * 1024 * 1024)}).encode()
    err = error_of(httpx.post(server.url + "/v1/completions", content=big, headers=JSON), 413)
    assert err["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield from (big[i : i + 65536] for i in range(0, len(big), 65536))

    r = httpx.post(server.url + "/v1/completions", content=chunks(), headers=JSON, timeout=60)
    error_of(r, 413)
    assert httpx.post(server.url + "/v1/completions", json=GOOD).status_code == 200


def raw_connection(server: BackgroundServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.settimeout(60)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (bounded by the socket timeout
    and a size cap); ``socket.timeout`` if it never closes."""
    data = b""
    while len(data) < 1 << 20:
        part = sock.recv(65536)
        if not part:
            return data
        data += part
    raise AssertionError("the server kept sending")


def test_a_body_that_never_ends_gets_408_and_the_connection_closes(server: BackgroundServer) -> None:
    with raw_connection(server) as sock:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        sock.sendall(head + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\n')
        reply = read_until_closed(sock)
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"code":"request_timeout"' in rest


def test_slow_headers_are_cut_off(server: BackgroundServer) -> None:
    with raw_connection(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        t0 = time.monotonic()
        assert read_until_closed(sock) == b""
        assert time.monotonic() - t0 < 50
    with raw_connection(server) as sock:  # a connection that sends nothing at all
        assert read_until_closed(sock) == b""
    with raw_connection(server) as sock:  # a prompt client is unaffected
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")


# -- item 9: errors in OpenAI's shape --------------------------------------------------------
def test_routing_and_parse_errors_are_in_openai_shape(server: BackgroundServer) -> None:
    u = server.url
    assert error_of(httpx.get(u + "/v1/nothing-here"), 404)["code"] == "not_found"
    r = httpx.get(u + "/v1/completions")
    assert error_of(r, 405)["code"] == "method_not_allowed" and "POST" in r.headers["allow"]
    error_of(httpx.post(u + "/v1/completions", content=b"prompt=x", headers={"content-type": "text/plain"}), 400)
    error_of(httpx.post(u + "/v1/completions", content=b"\xff\xfe{", headers=JSON), 400)
    err = error_of(httpx.post(u + "/v1/completions", content=b'{"model": ', headers=JSON), 400)
    assert "JSON" in err["message"] and "Expecting" not in err["message"]
    for path in ("/health", "/v1/models", "/metrics"):
        assert httpx.head(u + path).status_code == 200, path
        r = httpx.options(u + path)
        assert error_of(r, 405)["code"] == "method_not_allowed" and r.headers["allow"] == "GET", path


MALFORMED_HTTP = [
    ("request-line", b"BLAH\r\n\r\n"),
    ("header-without-colon", b"GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"),
    ("bad-content-length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"),
    ("two-content-lengths", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}"),
    ("no-host", b"GET /health HTTP/1.1\r\n\r\n"),
    ("bad-chunk-size", b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
    ("head-past-max_header_bytes", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000),
    ("binary", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),  # a TLS hello
]


@pytest.mark.parametrize("raw", [c[1] for c in MALFORMED_HTTP], ids=[c[0] for c in MALFORMED_HTTP])
def test_malformed_http_gets_a_400_in_openai_shape(server: BackgroundServer, raw: bytes) -> None:
    """What is not valid HTTP/1.1 is answered 400 in OpenAI's error shape (uvicorn's is plain text),
    and the connection is closed."""
    with raw_connection(server) as sock:
        sock.sendall(raw)
        reply = read_until_closed(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), reply[:300]
    assert b"content-type: application/json" in head.lower(), head
    if b"transfer-encoding: chunked" in head.lower():
        body = b"".join(body.split(b"\r\n")[1::2])
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_http", err
    assert httpx.get(server.url + "/health").status_code == 200


def test_long_model_names_are_cut_in_errors(server: BackgroundServer) -> None:
    name = "m" * 1_000_000
    for path, body in (("/v1/completions", {**GOOD, "model": name}), ("/tokenize", {"model": name, "prompt": "a"})):
        r = httpx.post(server.url + path, json=body)
        err = error_of(r, 404)
        assert err["code"] == "model_not_found" and len(r.content) < 1000


def test_openapi_documents_the_error_responses(server: BackgroundServer) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/tokenize"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("400", "401", "404", "413", "429", "500", "503"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorResponse"), (path, status)
        assert "422" not in responses  # validation errors are 400s
    assert "application/json" not in schema["paths"]["/health"]["get"]["responses"]["200"].get("content", {})
    error_fields = schema["components"]["schemas"]["ErrorDetail"]["properties"]
    assert set(error_fields) == {"message", "type", "param", "code"}


def test_engine_failures_do_not_leak_library_text(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = build_engine(compose_config(["model=synthetic"]))
    library_text = "CUDA error: device-side assert triggered (torch internals)"

    def failing_step() -> list[Any]:
        raise RuntimeError(library_text)

    def failing_encode(*_: Any, **__: Any) -> list[int]:
        raise RuntimeError(library_text)

    monkeypatch.setattr(engine, "step", failing_step)
    monkeypatch.setattr(engine, "step_outputs", failing_step)  # what the server's frontend calls each step
    monkeypatch.setattr(engine.tokenizer, "encode", failing_encode)
    with BackgroundServer(build_app(engine, ServerSettings(), model_name="synthetic")) as s:
        r = httpx.post(s.url + "/tokenize", json={"prompt": "a"})
        assert error_of(r, 500)["type"] == "internal_error" and "device-side" not in r.text
        r = httpx.post(s.url + "/v1/completions", json={**GOOD, "prompt": [1, 2], "stream": True})
        assert r.status_code in (200, 500, 503), r.text
        assert "device-side" not in r.text and "torch" not in r.text
        if r.status_code == 200:
            assert '"error"' in r.text and r.text.rstrip().endswith("data: [DONE]")
        r = httpx.post(s.url + "/v1/completions", json={**GOOD, "prompt": [1, 2]})
        assert r.status_code in (500, 503) and "device-side" not in r.text
        error_of(r, r.status_code)


# -- item 8: SIGTERM (and, issue 40, SIGHUP) drains open streams --------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_sends_each_open_stream_its_final_chunk(tmp_path: Path, sig: signal.Signals) -> None:
    cmd = [
        sys.executable,
        "run.py",
        "mode=serve",
        "model=synthetic",
        "engine.max_model_len=32768",
        "server.port=0",
        "server.shutdown_timeout_s=1",
        f"hydra.run.dir={tmp_path}",
    ]
    with server_process(cmd) as (proc, port):
        body = {**GOOD, "ignore_eos": True, "stream": True}  # 20k tokens: ~30 s, far past the drain
        url = f"http://127.0.0.1:{port}/v1/completions"
        with httpx.stream("POST", url, json={**body, "max_tokens": 20_000}, timeout=60) as r:
            events = r.iter_lines()
            first = next(e for e in events if e.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["finish_reason"] is None
            proc.send_signal(sig)
            rest = [e[6:] for e in events if e.startswith("data: ")]
        assert rest[-1] == "[DONE]", rest[-3:]
        final = json.loads(rest[-2])["choices"][0]
        assert final["finish_reason"] == "abort", final
        assert proc.wait(timeout=60) in (0, -sig)  # uvicorn re-raises the signal it caught
