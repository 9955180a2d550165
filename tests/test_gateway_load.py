"""The gateway's load estimate between polls (``forge.gateway.load.LoadBook``): what it adds to a poll's
figures for the requests sent since, what it takes off for those finished since, and that each poll
resets it (no drift, no double count); and, through ``forge route`` over fake backends that hold their
requests open, that the routers reading it spread new requests while the polled figures stay frozen."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

from forge.gateway.backends import parse_metrics
from forge.gateway.load import Cost, LoadBook, Polled
from forge.gateway.spawn import gateway
from tests.gateway_fakes import IDLE_METRICS, HeldBackend, held_backends

CAPACITY = 1000  # KV tokens
IDLE = Polled(running=0, waiting=0, kv_usage=0.0, kv_capacity_tokens=CAPACITY)


def figures(book: LoadBook) -> tuple[int, int, float]:
    """The estimate now: (running, waiting, KV usage to 9 places)."""
    load = book.load()
    return load.running, load.waiting, round(load.kv_usage, 9)


def answered(book: LoadBook, polled: Polled) -> None:
    """A poll that begins and answers with ``polled`` (nothing sent or finished in between)."""
    book.poll_answered(book.poll_begun(), polled)


def test_requests_sent_since_the_poll_count_as_waiting_and_their_prompt_as_kv() -> None:
    book = LoadBook()
    answered(book, IDLE)
    book.send(Cost(tokens=150, kv_tokens=100))
    book.send(Cost(tokens=70, kv_tokens=50))
    assert figures(book) == (0, 2, 0.15)
    assert (book.outstanding, book.outstanding_tokens) == (2, 220)


def test_a_request_finished_before_any_poll_saw_it_leaves_no_trace() -> None:
    book = LoadBook()
    answered(book, IDLE)
    ticket = book.send(Cost(tokens=10, kv_tokens=100))
    book.done(ticket)
    assert figures(book) == (0, 0, 0.0)
    assert (book.outstanding, book.outstanding_tokens) == (0, 0)


def test_a_poll_takes_over_the_requests_sent_before_it_began() -> None:
    book = LoadBook()
    answered(book, IDLE)
    book.send(Cost(tokens=10, kv_tokens=100))
    number = book.poll_begun()
    book.send(Cost(tokens=10, kv_tokens=200))  # sent while the poll is out: not in its figures
    book.poll_answered(number, Polled(running=1, waiting=0, kv_usage=0.1, kv_capacity_tokens=CAPACITY))
    assert figures(book) == (1, 1, 0.3)


def test_a_request_the_poll_counted_that_finishes_after_it_is_taken_off_once() -> None:
    book = LoadBook()
    answered(book, IDLE)
    first = book.send(Cost(tokens=10, kv_tokens=100))
    book.send(Cost(tokens=10, kv_tokens=100))
    answered(book, Polled(running=2, waiting=0, kv_usage=0.2, kv_capacity_tokens=CAPACITY))
    book.done(first)
    assert figures(book) == (1, 0, 0.1)
    answered(book, Polled(running=1, waiting=0, kv_usage=0.1, kv_capacity_tokens=CAPACITY))
    assert figures(book) == (1, 0, 0.1)  # not taken off again


def test_finished_requests_leave_running_first_then_waiting_and_never_go_below_zero() -> None:
    book = LoadBook()
    answered(book, IDLE)
    tickets = [book.send(Cost(tokens=1, kv_tokens=400)) for _ in range(3)]
    answered(book, Polled(running=1, waiting=1, kv_usage=0.5, kv_capacity_tokens=CAPACITY))
    for ticket in tickets:
        book.done(ticket)
    assert figures(book) == (0, 0, 0.0)


def test_without_the_backends_capacity_the_polled_kv_usage_stands() -> None:
    book = LoadBook()
    answered(book, Polled(running=0, waiting=0, kv_usage=0.25))
    book.send(Cost(tokens=10, kv_tokens=500))
    assert figures(book) == (0, 1, 0.25)


def test_with_no_poll_answered_the_estimate_is_the_gateways_own_requests() -> None:
    book = LoadBook()
    tickets = [book.send(Cost(tokens=1, kv_tokens=1)) for _ in range(3)]
    book.poll_begun()  # a poll that never answers (the backend is down)
    book.done(tickets[0])
    assert figures(book) == (0, 2, 0.0)


# Through the gateway: ``forge route`` over fake backends that hold every request open, polled once.


def polled_once(url: str) -> list[dict[str, Any]]:
    """``GET /gateway/backends`` once the gateway's first health check has read every backend's /metrics."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows: list[dict[str, Any]] = httpx.get(f"{url}/gateway/backends").json()["backends"]
        if all(r["polls"] >= 1 for r in rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"no poll answered: {rows}")


def sent(url: str) -> list[float]:
    """The requests the gateway sent to each backend, in backend order."""
    text = httpx.get(f"{url}/metrics").text
    counts = dict(re.findall(r'forge_router:requests_total\{backend="([^"]+)"\} ([0-9.]+)', text))
    return [float(counts.get(r["url"], 0)) for r in httpx.get(f"{url}/gateway/backends").json()["backends"]]


@contextmanager
def frozen_gateway(router: str) -> Iterator[tuple[str, list[HeldBackend]]]:
    """``forge route`` over three held backends, each polled once at the start and not again for 600 s."""
    with held_backends(3) as fakes:
        args = [a for f in fakes for a in ("--backend", f.url)]
        with gateway(["--health-interval", "600", *args, f"router={router}"]) as url:
            rows = polled_once(url)
            assert all(r["kv_capacity_tokens"] == 16 * 64 and r["estimated"]["waiting"] == 0 for r in rows), rows
            yield url, fakes


@pytest.mark.parametrize("router", ["prefix_aware", "least_kv", "vidur_lor"])
def test_new_prefixes_spread_over_the_backends_between_two_polls(router: str) -> None:
    """Six streams with prompts of one length that no backend has seen, each in flight before the next
    is sent, while every backend's figures are those of one poll: two per backend, not six on backend 0."""
    with frozen_gateway(router) as (url, _), ExitStack() as streams:
        open_lines = []  # a line iterator let go of closes its stream (the client disconnects)
        for i in range(6):
            body = {"model": "fake", "prompt": f"{i:02d} " + "new topic " * 6, "max_tokens": 8, "stream": True}
            r = streams.enter_context(httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30))
            open_lines.append(r.iter_lines())
            assert r.status_code == 200 and next(open_lines[-1]).startswith("data: ")
        assert sent(url) == [2.0, 2.0, 2.0]
        rows = httpx.get(f"{url}/gateway/backends").json()["backends"]
        assert [r["estimated"]["waiting"] for r in rows] == [r["outstanding"] for r in rows] == [2, 2, 2], rows
        kv = 2 * 16 / (16 * 64)  # two 63-byte prompts there: 16 tokens each (bytes / 4, rounded up)
        assert all(r["kv_usage"] == 0.0 and abs(r["estimated"]["kv_usage"] - kv) < 1e-9 for r in rows), rows


def test_a_non_streamed_request_counts_as_outstanding_from_its_send() -> None:
    """A backend answers a non-streamed completion when it has finished it; the gateway counts it from
    its send, so least_outstanding sends three that overlap to three backends."""
    with frozen_gateway("least_outstanding") as (url, fakes), ThreadPoolExecutor(3) as pool:
        body = {"model": "fake", "prompt": "hello", "max_tokens": 8}
        replies = []
        for i in range(3):
            replies.append(pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=30))
            deadline = time.monotonic() + 10
            while sum(r["outstanding"] for r in httpx.get(f"{url}/gateway/backends").json()["backends"]) <= i:
                assert time.monotonic() < deadline, "the request in flight is not counted"
                time.sleep(0.02)
        assert sent(url) == [1.0, 1.0, 1.0]
        for fake in fakes:
            fake.release()
        assert [r.result().status_code for r in replies] == [200, 200, 200]
        rows = httpx.get(f"{url}/gateway/backends").json()["backends"]
        assert [(r["outstanding"], r["estimated"]["waiting"], r["estimated"]["kv_usage"]) for r in rows] == [
            (0, 0, 0.0)
        ] * 3


def test_a_request_whose_client_left_before_the_backend_answered_is_uncounted() -> None:
    """A client that gives up while the backend has not answered yet (a non-streamed completion is answered
    at its end): once the backend answers, the gateway uncounts the request (no count leaks)."""
    with frozen_gateway("round_robin") as (url, fakes):
        body = {"model": "fake", "prompt": "hello", "max_tokens": 8}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=0.5)
        assert [r["outstanding"] for r in httpx.get(f"{url}/gateway/backends").json()["backends"]] == [1, 0, 0]
        fakes[0].release()
        deadline = time.monotonic() + 10
        while (rows := httpx.get(f"{url}/gateway/backends").json()["backends"])[0]["outstanding"] != 0:
            assert time.monotonic() < deadline, f"the abandoned request is still counted: {rows}"
            time.sleep(0.05)
        assert rows[0]["estimated"]["waiting"] == 0, rows


def test_a_request_sent_before_the_poll_reads_metrics_is_counted_once() -> None:
    """A poll asks /health, then /metrics. A request sent while /health is answering (slowly, here) is
    in the /metrics figures the poll reads: once the poll answers, it is counted there, not also as
    a request the poll did not see."""
    with ExitStack() as stack:
        fake = HeldBackend(health_delay_s=3.0, count_held=True).start()
        stack.callback(fake.stop)
        url = stack.enter_context(gateway(["--health-interval", "600", "--backend", fake.url, "router=round_robin"]))
        body = {"model": "fake", "prompt": "hello", "max_tokens": 8, "stream": True}
        r = stack.enter_context(httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30))
        lines = r.iter_lines()  # (let go of, it would close the stream)
        assert r.status_code == 200 and next(lines).startswith("data: ")
        row = polled_once(url)[0]
        assert row["waiting"] == 1, "the request was not held before the poll read /metrics: the test tests nothing"
        assert (row["outstanding"], row["estimated"]["waiting"]) == (1, 1), row


@pytest.mark.parametrize("bad", ["inf", "nan", "-inf", "fa"])
def test_a_gauge_that_is_not_a_finite_number_is_missing_not_a_crash(bad: str) -> None:
    """A backend whose /metrics has ``inf`` or ``nan`` in a load gauge: no figures from that poll (the
    estimate goes on), rather than an error out of the health loop that checks every backend."""
    good = parse_metrics(IDLE_METRICS)
    assert good is not None and good.kv_capacity_tokens == 16 * 64
    assert parse_metrics(IDLE_METRICS.replace('{model_name="fake"} 0.0', '{model_name="fake"} ' + bad, 1)) is None
