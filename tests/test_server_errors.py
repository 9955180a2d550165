"""Bad input never reaches the engine: every rule answers 4xx in OpenAI's error shape, and the
server keeps serving. Plus API keys (401), per-key rate limits (429) and the bounded queue (503)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, serving, start
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(["model=synthetic", "engine.max_model_len=256", "server.max_n=4"]) as s:
        yield s


GOOD = {"model": "synthetic", "prompt": "hello", "max_tokens": 4}
CHAT = {"model": "synthetic", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
BAD_COMPLETIONS = [
    ({"prompt": "hello", "max_tokens": 4}, "model"),  # missing model
    ({**GOOD, "max_tokens": -1}, "max_tokens"),
    ({**GOOD, "max_tokens": 0}, "max_tokens"),
    ({**GOOD, "max_tokens": 10**9}, "max_tokens"),
    ({**GOOD, "max_tokens": "many"}, "max_tokens"),
    ({**GOOD, "prompt": "x" * 300}, "prompt"),  # longer than max_model_len=256
    ({**GOOD, "prompt": ""}, "prompt"),
    ({**GOOD, "prompt": []}, "prompt"),
    ({**GOOD, "prompt": [1, 2, 100000]}, "prompt"),
    ({**GOOD, "prompt": 12}, "prompt"),
    ({**GOOD, "temperature": -1}, "temperature"),
    ({**GOOD, "temperature": "hot"}, "temperature"),
    ({**GOOD, "top_p": 0}, "top_p"),
    ({**GOOD, "top_k": -5}, "top_k"),
    ({**GOOD, "min_p": 2}, "min_p"),
    ({**GOOD, "presence_penalty": 3}, "presence_penalty"),
    ({**GOOD, "repetition_penalty": 0}, "repetition_penalty"),
    ({**GOOD, "n": 5}, "n"),
    ({**GOOD, "n": 0}, "n"),
    ({**GOOD, "logprobs": 50}, "logprobs"),
    ({**GOOD, "stop": [""]}, "stop"),
    ({**GOOD, "stop": ["a"] * 17}, "stop"),
    ({**GOOD, "stop_token_ids": [-3]}, "stop_token_ids"),
    ({**GOOD, "seed": "abc"}, "seed"),
    ({**GOOD, "regex": "(unclosed"}, "regex"),
    ({**GOOD, "json_schema": {"type": "bogus"}}, "json_schema"),
    ({**GOOD, "regex": "a", "json_schema": {"type": "string"}}, "regex"),
    # (a regex longer than max_tokens is no error: it is cut with finish_reason "length", as OpenAI and vLLM do;
    # tests/test_server_vllm_extras.py)
    ({**GOOD, "response_format": {"type": "json_schema"}}, "response_format"),
    ({**GOOD, "response_format": {"type": "yaml"}}, "response_format.type"),
    ({**GOOD, "logit_bias": {"not-a-token": 5}}, "logit_bias"),
    ({**GOOD, "suffix": "end"}, "suffix"),
    ({**GOOD, "best_of": 5}, "best_of"),  # above server.max_n
    ({**GOOD, "n": 2, "best_of": 1}, "best_of"),
    ({**GOOD, "stream": "yes"}, "stream"),
]
BAD_CHAT = [
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ({**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({**CHAT, "messages": "hi"}, "messages"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "tools": [{"type": "function"}]}, "tools"),
    ({**CHAT, "max_completion_tokens": -2}, "max_tokens"),
    ({**CHAT, "messages": [{"role": "user", "content": "y" * 400}]}, "messages"),
]


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS, ids=[p for _, p in BAD_COMPLETIONS])
def test_bad_completion_requests_are_400(server: BackgroundServer, body: dict[str, Any], param: str) -> None:
    err = error_of(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert err["param"] is not None and err["param"].startswith(param.split(".")[0]), err


@pytest.mark.parametrize(("body", "param"), BAD_CHAT, ids=[p for _, p in BAD_CHAT])
def test_bad_chat_requests_are_400(server: BackgroundServer, body: dict[str, Any], param: str) -> None:
    err = error_of(httpx.post(server.url + "/v1/chat/completions", json=body), 400)
    assert err["param"] is not None and err["param"].startswith(param.split(".")[0]), err


def test_malformed_json_unknown_model_and_bad_tokens(server: BackgroundServer) -> None:
    u = server.url
    headers = {"content-type": "application/json"}
    error_of(httpx.post(u + "/v1/completions", content=b'{"model": "synthetic", "prompt": ', headers=headers), 400)
    error_of(httpx.post(u + "/v1/chat/completions", content=b"[1, 2]", headers=headers), 400)
    err = error_of(httpx.post(u + "/v1/completions", json={**GOOD, "model": "gpt-9"}), 404)
    assert err["code"] == "model_not_found"
    error_of(httpx.post(u + "/detokenize", json={"tokens": [999999]}), 400)
    error_of(httpx.post(u + "/tokenize", json={}), 400)


def prompt_tokens_total(metrics: str) -> float:
    found = re.search(r'forge:prompt_tokens_total\{model_name="synthetic"\} ([0-9.]+)', metrics)
    assert found is not None, metrics[-2000:]
    return float(found.group(1))


def test_server_keeps_serving_and_nothing_reached_the_engine(server: BackgroundServer) -> None:
    for body, _ in BAD_COMPLETIONS[:5]:
        httpx.post(server.url + "/v1/completions", json=body)
    metrics = httpx.get(server.url + "/metrics").text
    before = prompt_tokens_total(metrics)
    for body, _ in BAD_COMPLETIONS:
        httpx.post(server.url + "/v1/completions", json=body)
    metrics = httpx.get(server.url + "/metrics").text
    after = prompt_tokens_total(metrics)
    assert after == before
    ok = httpx.post(server.url + "/v1/completions", json=GOOD)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_api_keys_and_rate_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORGE_API_KEY", "env-key")
    s = start(["model=synthetic", "server.api_keys=[k1]", "server.rate_limit_rps=0.5", "server.rate_limit_burst=2"])
    try:
        u = s.url + "/v1/completions"
        assert error_of(httpx.post(u, json=GOOD), 401)["type"] == "authentication_error"
        error_of(httpx.post(u, json=GOOD, headers={"Authorization": "Bearer wrong"}), 401)
        error_of(httpx.post(s.url + "/tokenize", json={"prompt": "a"}), 401)
        assert httpx.get(s.url + "/health").status_code == 200  # probes need no key
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="k1", max_retries=0)
        client.completions.create(model="synthetic", prompt="a", max_tokens=2)
        client.completions.create(model="synthetic", prompt="b", max_tokens=2)
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="synthetic", prompt="c", max_tokens=2)
        assert int(info.value.response.headers["Retry-After"]) >= 1
        other = openai.OpenAI(base_url=s.url + "/v1", api_key="env-key", max_retries=0)  # its own bucket
        other.completions.create(model="synthetic", prompt="d", max_tokens=2)
    finally:
        s.stop()


def test_bounded_waiting_queue_answers_503() -> None:
    s = start(["model=synthetic", "engine.max_num_seqs=1", "server.max_waiting=2"])
    body = {**GOOD, "max_tokens": 100000, "ignore_eos": True, "stream": True}
    try:
        with httpx.Client(base_url=s.url, timeout=30) as c:
            streams = [c.stream("POST", "/v1/completions", json={**body, "max_tokens": 2000}) for _ in range(3)]
            for st in streams:
                st.__enter__()
            waiting = 'forge:num_requests_waiting{model_name="synthetic"} 2.0'
            wait_until(lambda: waiting in c.get("/metrics").text, "two requests waiting in /metrics")
            err = error_of(c.post("/v1/completions", json=GOOD), 503)
            assert err["code"] == "overloaded"
            for st in streams:
                st.__exit__(None, None, None)
    finally:
        s.stop()
    assert s.app.state.forge.engine.leak is None
