"""Against a live server: sampling values that once killed the engine are refused with 400 in
OpenAI's shape, a model step that raises fails only its requests (500 / an error chunk then
[DONE]), and afterwards /health is 200, no KV block is held and a request gets the same tokens."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.waiting import wait_until

GOOD = {"model": "synthetic", "prompt": "hello", "max_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    app, _ = app_from_config(compose_config(["model=synthetic", "engine.max_model_len=256"]), "synthetic")
    s = BackgroundServer(app).start()
    yield s
    s.stop()
    assert s.app.state.forge.engine.leak is None


def _completion(server: BackgroundServer, body: dict[str, Any] | bytes) -> httpx.Response:
    if isinstance(body, bytes):
        headers = {"content-type": "application/json"}
        return httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=30)
    return httpx.post(server.url + "/v1/completions", json=body, timeout=30)


def _assert_serving(server: BackgroundServer, expected_text: str) -> None:
    """/health 200, the engine idle with every KV block free, and a request answered as before."""
    engine = server.app.state.forge.engine.engine
    kv = engine.scheduler.kv
    wait_until(lambda: not engine.has_unfinished() and kv.num_free_blocks() == kv.num_blocks, "engine not idle")
    assert httpx.get(server.url + "/health").status_code == 200
    r = _completion(server, GOOD)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected_text


@pytest.fixture(scope="module")
def expected_text(server: BackgroundServer) -> str:
    r = _completion(server, GOOD)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["text"])


def _raw(field: str, literal: str) -> bytes:
    """A body with ``field`` set to a raw JSON literal (NaN and Infinity are not JSON, but Python's
    json module reads them)."""
    body = json.dumps({"model": "synthetic", "prompt": "x", "max_tokens": 4, "temperature": 0.7})
    return body[:-1].encode() + f', "{field}": {literal}}}'.encode()


HOSTILE = [
    ("temperature", "1e-300"),
    ("temperature", "1e-45"),
    ("temperature", "0.009"),
    ("temperature", "NaN"),
    ("temperature", "Infinity"),
    ("temperature", "2.5"),
    ("presence_penalty", "NaN"),
    ("frequency_penalty", "-Infinity"),
    ("frequency_penalty", "2.01"),
    ("repetition_penalty", "1e-300"),
    ("repetition_penalty", "NaN"),
    ("top_p", "NaN"),
    ("top_p", "1e-400"),
    ("min_p", "NaN"),
    ("top_k", "-2"),
    ("seed", str(1 << 64)),
    ("seed", str(-(1 << 63) - 1)),
    ("logit_bias", '{"1": NaN}'),
    ("logit_bias", '{"1": 101}'),
    ("n", "0"),
]


@pytest.mark.parametrize(("field", "literal"), HOSTILE, ids=[f"{f}={v}" for f, v in HOSTILE])
def test_out_of_range_sampling_values_are_400(
    server: BackgroundServer, expected_text: str, field: str, literal: str
) -> None:
    r = _completion(server, _raw(field, literal))
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] is not None and err["param"].startswith(field)
    _assert_serving(server, expected_text)


def test_the_issue_examples_then_a_normal_request(server: BackgroundServer, expected_text: str) -> None:
    assert _completion(server, {**GOOD, "temperature": 1e-300}).status_code == 400
    assert _completion(server, _raw("presence_penalty", "NaN")).status_code == 400
    _assert_serving(server, expected_text)


def test_the_schema_declares_the_ranges(server: BackgroundServer) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["CompletionRequest"]
    props = schema["properties"]

    def bounds(name: str) -> dict[str, Any]:
        spec = props[name]
        for option in spec.get("anyOf", [spec]):
            if option.get("type") in ("number", "integer"):
                return {k: option[k] for k in ("minimum", "maximum", "exclusiveMinimum") if k in option}
        raise AssertionError(f"{name}: no numeric schema in {spec}")

    assert bounds("temperature") == {"minimum": 0.0, "maximum": 2.0}
    assert bounds("top_p") == {"exclusiveMinimum": 0.0, "maximum": 1.0}
    assert bounds("presence_penalty") == {"minimum": -2.0, "maximum": 2.0}
    assert bounds("repetition_penalty") == {"minimum": 0.01, "maximum": 10.0}


class FailNextStep:
    """Wraps the served model's step: the next call after ``arm()`` raises."""

    def __init__(self, server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> None:
        model = server.app.state.forge.engine.engine.runner.model
        self.forward_host = model.forward_host
        self.armed = threading.Event()
        self.fired = threading.Event()
        monkeypatch.setattr(model, "forward_host", self)

    def arm(self) -> None:
        self.fired.clear()
        self.armed.set()

    def __call__(self, *args: Any) -> Any:
        if self.armed.is_set():
            self.armed.clear()
            self.fired.set()
            raise RuntimeError("injected model step failure")
        return self.forward_host(*args)


def test_a_failed_model_step_fails_its_request_and_the_server_goes_on(
    server: BackgroundServer, expected_text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault = FailNextStep(server, monkeypatch)
    fault.arm()
    r = _completion(server, GOOD)
    assert fault.fired.is_set()
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "model step failed" in err["message"]
    _assert_serving(server, expected_text)

    fault.arm()
    with httpx.stream("POST", server.url + "/v1/completions", json={**GOOD, "stream": True}, timeout=30) as s:
        lines = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert fault.fired.is_set()
    assert lines[-1] == "data: [DONE]"
    assert "model step failed" in json.loads(lines[-2][len("data: ") :])["error"]["message"]
    _assert_serving(server, expected_text)
    assert httpx.get(server.url + "/health").status_code == 200
