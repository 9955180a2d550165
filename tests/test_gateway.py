"""``forge route``: the gateway over real ``forge serve`` backends (model=tiny, loopback ports): each
router's distribution, streaming pass-through, keys, a backend killed mid-run, and bad command lines."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from forge.gateway.spawn import Spawned, spawned
from forge.gateway.spawn import gateway as spawn_gateway

TINY = ["model=tiny", "engine.max_num_seqs=16"]


@contextmanager
def gateway(*args: str) -> Iterator[str]:
    """``forge route ARGS`` in a child process, health checks every 0.5 s unless ARGS say otherwise."""
    with spawn_gateway(["--health-interval", "0.5", *args]) as url:
        yield url


def per_backend(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(r'forge_router:requests_total\{backend="([^"]+)"\} ([0-9.]+)', text)}


@pytest.fixture(scope="module")
def backends() -> Iterator[list[Spawned]]:
    with spawned(3, TINY) as children:
        yield children


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_round_robin_spreads_requests_exactly_evenly_streamed_or_not(backends: list[Spawned]) -> None:
    urls = [b.url for b in backends]
    with gateway(*(a for u in urls for a in ("--backend", u)), "router=round_robin") as url:
        api = client(url)
        for i in range(12):
            if i % 2:
                out = api.completions.create(model="tiny", prompt=f"req {i}", max_tokens=4)
                assert out.choices[0].finish_reason == "length"
            else:
                chunks = list(api.completions.create(model="tiny", prompt=f"req {i}", max_tokens=4, stream=True))
                assert chunks[-1].choices[0].finish_reason == "length"
        assert per_backend(url) == {u: 4.0 for u in urls}
        assert api.models.list().data[0].id == "tiny"


def test_the_bench_client_runs_through_the_gateway_over_three_backends_without_failures(
    backends: list[Spawned], tmp_path: Path
) -> None:
    from benchmarks.serve import main as bench

    urls = [b.url for b in backends]
    with gateway(*(a for u in urls for a in ("--backend", u)), "router=round_robin") as url:
        workload = ["workload.input_len.high=64", "workload.output_len.low=4", "workload.output_len.high=12"]
        argv = ["--url", url, "--num-prompts", "12", "--request-rate", "30", "--output-dir", str(tmp_path)]
        summary = bench([*argv, "--set", *workload])
        assert (summary["completed"], summary["failed"]) == (12, 0)
        assert summary["total_output_tokens"] >= 12 * 4
        assert per_backend(url) == {u: 4.0 for u in urls}


def test_prefix_aware_keeps_a_shared_prefix_session_on_one_backend(backends: list[Spawned]) -> None:
    urls = [b.url for b in backends]
    system = "You are a careful assistant for the forge project. " * 8
    with gateway(*(a for u in urls for a in ("--backend", u)), "router=prefix_aware") as url:
        api = client(url)
        history = [{"role": "system", "content": system}]
        for turn in range(6):
            history.append({"role": "user", "content": f"question {turn}"})
            reply = api.chat.completions.create(model="tiny", messages=history, max_tokens=3)  # type: ignore[arg-type]
            history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        counts = per_backend(url)
        assert sorted(counts.values()) == [6.0], counts  # every turn on the backend that holds the prefix


def test_keys_are_checked_at_the_gateway_and_the_backend_key_is_sent_on() -> None:
    keys = ("--api-key", "gw-secret", "--backend-api-key", "backend-secret")
    with (
        spawned(1, [*TINY, "server.api_keys=[backend-secret]"]) as (backend,),
        gateway("--backend", backend.url, *keys) as url,
    ):
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="tiny", prompt="x", max_tokens=2)
        out = client(url, "gw-secret").completions.create(model="tiny", prompt="x", max_tokens=2)
        assert len(out.choices) == 1


def _stream(url: str, i: int) -> str:
    """A long stream's outcome: 'done' (finished), 'error' (an error chunk, then [DONE]) or 'failed' (an HTTP error)."""
    body = {"model": "tiny", "prompt": f"s{i}", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            if r.status_code != 200:
                return "failed"
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
    except httpx.HTTPError:
        return "failed"
    assert events[-1] == "data: [DONE]", events[-3:]
    return "error" if any('"error"' in e for e in events) else "done"


def test_a_backend_killed_mid_run_fails_its_streams_cleanly_and_later_requests_go_elsewhere() -> None:
    with (
        spawned(2, TINY) as (a, b),
        gateway(
            "--backend",
            a.url,
            "--backend",
            b.url,
            "router=round_robin",
            "--health-interval",
            "600",  # no re-check
        ) as url,
    ):
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(_stream, url, i) for i in range(4)]
            time.sleep(1.0)
            b.process.kill()  # streams 1 and 3 are on b
            outcomes = [s.result(timeout=90) for s in streams]
        assert outcomes.count("done") == 2 and set(outcomes) <= {"done", "error"}, outcomes
        api = client(url)
        for i in range(4):  # b is gone: the first try on b fails to connect and is retried on a
            assert api.completions.create(model="tiny", prompt=f"after {i}", max_tokens=2).choices
        listed = httpx.get(f"{url}/gateway/backends").json()["backends"]
        assert [x["up"] for x in listed] == [True, False]  # marked down by the failed send, not a health check
        assert re.search(r"^forge_router:retries_total 1\.0$", httpx.get(f"{url}/metrics").text, re.MULTILINE)


def test_no_backend_left_is_a_503() -> None:
    with spawned(1, TINY) as (only,), gateway("--backend", only.url) as url:
        only.process.kill()
        only.process.wait()
        time.sleep(1.5)  # the health check marks it down
        answer = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert answer.status_code == 503 and answer.json()["error"]["message"] == "no backend is up"
        assert httpx.get(f"{url}/health").status_code == 503


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "forge route needs backends"),
        (["--backend", "localhost:8000"], "not a URL like http://127.0.0.1:8000"),
        (["--backend", "http://127.0.0.1:99999"], "not a URL like"),
        (["--backend", "http://127.0.0.1:8001", "router=nope"], "router=nope: no such option"),
        (["--backend", "http://127.0.0.1:8001", "model=tiny"], "model=tiny: not a router setting"),
        (["--backend", "http://127.0.0.1:8001", "--port", "70000"], "--port 70000: not a TCP port"),
        (["--backend", "http://127.0.0.1:8001", "--api-key", " "], "--api-key: an empty key"),
    ],
)
def test_bad_command_lines_print_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "forge.cli", "route", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_bad_bodies_are_refused_before_routing(backends: list[Spawned]) -> None:
    with gateway("--backend", backends[0].url) as url:
        answer = httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "not JSON" in answer.json()["error"]["message"]
        assert per_backend(url) == {}


def test_a_client_that_disconnects_cancels_the_backend_request(backends: list[Spawned]) -> None:
    body = {"model": "tiny", "prompt": "long", "max_tokens": 1800, "stream": True, "ignore_eos": True}
    with gateway("--backend", backends[0].url) as url:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            next(r.iter_lines())  # the first chunk has arrived: the request runs on the backend
        deadline = time.monotonic() + 10
        aborted = 0.0
        while time.monotonic() < deadline and not aborted:
            text = httpx.get(f"{backends[0].url}/metrics").text
            m = re.search(r'forge:request_success_total\{[^}]*finished_reason="abort"[^}]*\} ([0-9.]+)', text)
            aborted = float(m.group(1)) if m else 0.0
            time.sleep(0.1)
        assert aborted >= 1.0
