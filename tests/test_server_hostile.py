"""Hostile input against one live server (issue 13): every case in ``hostile_cases.CASES`` plus the
ones that need their own setup (a 1 MB model name, a 20 MB body, 100k-character stop strings,
pathological grammars, API keys, a rate limit). Every answer is a status the issue allows, in
OpenAI's error shape, with no library text, and the server stays healthy; the last test checks
that after all of it a greedy request returns the tokens it returned before, /health is 200 and
the KV cache holds no block (read from /metrics)."""

from __future__ import annotations

import gc
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from tests.hostile_cases import CASES, CHAT, CMPL, JSON_TYPE, MODEL, TOKENIZE, Case, chat, cmpl
from tests.waiting import wait_until

COMPILE_BUDGET_S = 5.0  # structured.compile_timeout_s's default
HEALTH_PROBE_S = 2.0  # the longest /health may take while a hostile request is being served
LIBRARY_TEXT = re.compile(r"Traceback|File \"|\.py\b|torch|pydantic|outlines|xgrammar|interegular|object at 0x")
GREEDY = {"model": MODEL, "prompt": "The hostile suite", "max_tokens": 24, "temperature": 0, "ignore_eos": True}


@dataclass(frozen=True)
class Greedy:
    """A greedy completion's text and its tokens (from ``logprobs``)."""

    text: str
    tokens: list[str]

    @classmethod
    def of(cls, client: httpx.Client) -> Greedy:
        r = client.post(CMPL, json={**GREEDY, "logprobs": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return cls(choice["text"], choice["logprobs"]["tokens"])


@dataclass(frozen=True)
class Live:
    server: BackgroundServer
    client: httpx.Client
    before: Greedy


def start(*overrides: str) -> BackgroundServer:
    app, _ = app_from_config(compose_config(["model=tiny", *overrides]), MODEL)
    return BackgroundServer(app).start()


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    """The one server every hostile case is sent to (auth and rate limit off)."""
    server = start()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield Live(server, client, Greedy.of(client))
    server.stop()


@pytest.fixture(scope="module")
def keyed() -> Iterator[httpx.Client]:
    server = start("server.api_keys=[k1]")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
    server.stop()


@pytest.fixture(scope="module")
def limited() -> Iterator[httpx.Client]:
    server = start("server.rate_limit_rps=0.1", "server.rate_limit_burst=3")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
    server.stop()


def check_answer(r: httpx.Response, allowed: frozenset[int], param: str | None = None) -> None:
    """The status is one the case allows; an error is in OpenAI's shape, names ``param`` (a 400's)
    and carries no library text; a 200 is a whole answer."""
    assert r.status_code in allowed, (r.status_code, r.text[:500])
    if r.request.method == "HEAD":
        assert not r.content
    elif r.status_code >= 400:
        assert r.headers.get("content-type", "").startswith(JSON_TYPE), r.headers
        body = r.json()
        assert set(body) == {"error"}, body
        err = body["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert isinstance(err["message"], str) and 0 < len(err["message"]) <= 1000, err
        assert not LIBRARY_TEXT.search(err["message"]), err["message"]
        if param is not None and r.status_code == 400:
            assert isinstance(err["param"], str) and err["param"].startswith(param), err
    elif r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text[-500:]
    elif r.headers.get("content-type", "").startswith(JSON_TYPE):
        body = r.json()
        assert "error" not in body, body


def assert_healthy(client: httpx.Client) -> None:
    assert client.get("/health", timeout=HEALTH_PROBE_S).status_code == 200


def send(client: httpx.Client, case: Case, timeout: float = 30.0) -> httpx.Response:
    return client.request(case.method, case.path, content=case.content(), headers=case.headers(), timeout=timeout)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_request(live: Live, case: Case) -> None:
    check_answer(send(live.client, case), case.expect, case.param)
    assert_healthy(live.client)


def test_a_1mb_model_name_is_not_echoed(live: Live) -> None:
    for path, body in [(CMPL, cmpl(model="m" * 1_000_000)), (TOKENIZE, {"model": "m" * 1_000_000, "prompt": "x"})]:
        r = live.client.post(path, json=body)
        check_answer(r, frozenset({400, 404}), "model")
        assert len(r.content) < 2000, len(r.content)
    assert_healthy(live.client)


def test_a_20mb_body_is_413(live: Live) -> None:
    body = json.dumps(cmpl(prompt="x" * 20_000_000)).encode()
    r = live.client.post(CMPL, content=body, headers={"content-type": JSON_TYPE})
    check_answer(r, frozenset({413}))
    assert_healthy(live.client)


class HealthProbe:
    """Polls /health on its own thread (its own connection) while a hostile request is served;
    ``worst`` is the slowest answer (a failed or timed-out probe counts as ``inf``).

    While it polls, the objects that already exist are frozen out of the cyclic GC (``gc.freeze``):
    the server runs in pytest's process, whose heap late in a full run (every earlier test's objects)
    makes one full collection take about a second, a pause of the test process and not of a ``forge
    serve`` process. The server's own objects, made while the probe runs, are still collected."""

    def __init__(self, url: str, period_s: float = 0.2, deadline_s: float = 120.0) -> None:
        self.url = url
        self.period_s = period_s
        self.deadline_s = deadline_s
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        end = time.monotonic() + self.deadline_s
        with httpx.Client(base_url=self.url) as c:
            while not self._stop.is_set() and time.monotonic() < end:
                t0 = time.monotonic()
                try:
                    ok = c.get("/health", timeout=HEALTH_PROBE_S).status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.monotonic() - t0 if ok else float("inf"))
                self._stop.wait(self.period_s)

    def __enter__(self) -> HealthProbe:
        gc.freeze()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(HEALTH_PROBE_S + 1)
        gc.unfreeze()

    @property
    def worst(self) -> float:
        return max(self.latencies, default=0.0)


def timed(client: httpx.Client, path: str, body: dict[str, Any], timeout: float) -> tuple[httpx.Response, float]:
    t0 = time.monotonic()
    r = client.post(path, json=body, timeout=timeout)
    return r, time.monotonic() - t0


def test_long_stop_strings_answer_promptly(live: Live) -> None:
    """16 stop strings of 100k characters (item 6): refused, or served about as fast as the same
    request without them and without stalling the loop (unbounded, the hold-back scan over 2,000
    generated characters makes the request ~3x slower and starves /health). The characters are
    two bytes in UTF-8 (3.2 MB of JSON, under the body limit) and two in CPython's strings."""
    stops = [chr(0x100 + i) * 100_000 for i in range(16)]
    body = {**cmpl(max_tokens=2000, ignore_eos=True, temperature=0), "stream": True}
    content = json.dumps({**body, "stop": stops}, ensure_ascii=False).encode()
    with HealthProbe(live.server.url) as probe:
        t0 = time.monotonic()
        r = live.client.post(CMPL, content=content, headers={"content-type": JSON_TYPE}, timeout=90)
        took = time.monotonic() - t0
    check_answer(r, frozenset({200, 400}), "stop")
    assert probe.worst < HEALTH_PROBE_S, probe.latencies
    if r.status_code == 200:
        plain, plain_took = timed(live.client, CMPL, body, 90)
        check_answer(plain, frozenset({200}))
        assert took < 1.5 * plain_took + 2.0, (took, plain_took)


PATHOLOGICAL_GRAMMARS = (
    ("maxLength-25", {"json_schema": {"type": "string", "maxLength": 25}}),
    ("regex-a{100000}", {"regex": "a{100000}"}),
    ("minItems-100000", {"json_schema": {"type": "array", "minItems": 100000}}),
    ("regex-[ab]*a[ab]{16}", {"regex": "[ab]*a[ab]{16}"}),
    (
        "response_format-maxLength-25",
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string", "maxLength": 25}}}},
    ),
)


@pytest.mark.parametrize("fields", [f for _, f in PATHOLOGICAL_GRAMMARS], ids=[i for i, _ in PATHOLOGICAL_GRAMMARS])
def test_pathological_grammar_is_400_within_the_compile_budget(live: Live, fields: dict[str, Any]) -> None:
    """Item 2: the compile is bounded (400 within the budget) and off the event loop (/health answers)."""
    limit = COMPILE_BUDGET_S + 10  # margin for a loaded machine
    with HealthProbe(live.server.url) as probe:
        r, took = timed(live.client, CMPL, cmpl(max_tokens=64, **fields), limit)
    check_answer(r, frozenset({400}))
    assert took < limit, took
    assert probe.worst < HEALTH_PROBE_S, probe.latencies


KEYED_CASES = (
    ("no-header", None, 401),
    ("wrong-key", b"Bearer wrong", 401),
    ("non-ascii-key", "Bearer ключ".encode(), 401),
    ("latin1-key", b"Bearer k1\xe9", 401),
    ("non-ascii-scheme", "Bearér k1".encode(), 401),
    ("basic-scheme", b"Basic azE6", 401),
    ("bearer-no-token", b"Bearer", 401),
    ("4k-key", b"Bearer " + b"k" * 4096, 401),
    ("good-key", b"Bearer k1", 200),
    ("good-key-lowercase-scheme", b"bearer k1", 200),
)


@pytest.mark.parametrize(("authorization", "status"), [c[1:] for c in KEYED_CASES], ids=[c[0] for c in KEYED_CASES])
def test_api_keys(keyed: httpx.Client, authorization: bytes | None, status: int) -> None:
    """Item 4: whatever the bearer token, 401 in OpenAI's shape (never 500), on every protected route."""
    headers = [(b"authorization", authorization)] if authorization is not None else []
    for path, body in [
        (CMPL, cmpl()),
        (CHAT, chat()),
        (TOKENIZE, {"prompt": "x"}),
    ]:
        r = keyed.post(
            path, content=json.dumps(body).encode(), headers=[(b"content-type", b"application/json"), *headers]
        )
        check_answer(r, frozenset({status}))
        if status == 401:
            assert r.json()["error"]["type"] == "authentication_error"
    assert_healthy(keyed)


def test_rate_limit_with_auth_off_is_keyed_on_the_client_address(limited: httpx.Client) -> None:
    """Item 5: made-up bearer tokens (auth off) do not give a client fresh buckets."""
    statuses = []
    for i in range(5):
        r = limited.post(TOKENIZE, json={"prompt": "x"}, headers={"authorization": f"Bearer made-up-{i}"})
        statuses.append(r.status_code)
        if r.status_code == 429:
            check_answer(r, frozenset({429}))
            assert int(r.headers["retry-after"]) >= 1
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [429, 429], statuses
    assert_healthy(limited)


def kv_gauges(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    names = ("kv_cache_usage_perc", "num_requests_running", "num_requests_waiting")
    found = {n: re.search(rf'^forge:{n}\{{model_name="{MODEL}"\}} (\S+)$', text, re.M) for n in names}
    return {n: float(m.group(1)) for n, m in found.items() if m is not None}


def test_after_the_suite_the_server_is_as_before(live: Live) -> None:
    """Last in the module: same greedy tokens as before the suite, /health 200, no KV block held."""
    assert_healthy(live.client)
    after = Greedy.of(live.client)
    assert after == live.before
    idle = {"kv_cache_usage_perc": 0.0, "num_requests_running": 0.0, "num_requests_waiting": 0.0}
    wait_until(lambda: kv_gauges(live.client) == idle, lambda: f"gauges {kv_gauges(live.client)}")
