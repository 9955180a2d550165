"""The per-request output budget (``server.max_output_units``, issue 40): a request that may produce more
output units (per choice ``max_tokens x (1 + logprob entries)``, plus echoed and prompt-logprob prompt
tokens) than the limit is a 400 naming the limit and its setting, before it runs; one at the limit is served."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, serving

MODEL = "synthetic"
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]  # ten token ids
CAMPAIGN = {"model": MODEL, "prompt": [f"prompt {i}" for i in range(16)], "n": 16, "logprobs": 20, "ignore_eos": True}


@pytest.fixture(scope="module")
def default() -> Iterator[BackgroundServer]:
    with serving(["model=synthetic", "engine.max_num_seqs=256"]) as s:
        yield s


@pytest.fixture(scope="module")
def small() -> Iterator[BackgroundServer]:
    with serving(["model=synthetic", "server.max_output_units=1340"]) as s:
        yield s


def prompt_tokens(server: BackgroundServer) -> float:
    m = re.search(
        r'forge:prompt_tokens_total\{model_name="synthetic"\} ([0-9.e+]+)', httpx.get(server.url + "/metrics").text
    )
    assert m is not None
    return float(m.group(1))


def refused(r: httpx.Response, units: int, limit: int) -> None:
    err = error_of(r, 400)
    assert err["param"] == "max_tokens" and err["code"] == "output_budget_exceeded"
    assert f"may produce {units} output units" in err["message"]
    assert f"at most {limit} (server.max_output_units)" in err["message"]


def test_the_campaigns_request_is_refused_before_it_runs(default: BackgroundServer) -> None:
    """16 prompts x n=16 x logprobs=20 x 300 tokens (a 21 MB response, +257 MB RSS in the campaign)."""
    before = prompt_tokens(default)
    r = httpx.post(default.url + "/v1/completions", json={**CAMPAIGN, "max_tokens": 300}, timeout=30)
    refused(r, 16 * 16 * 300 * 22, 1024 * 1024)
    assert prompt_tokens(default) == before  # nothing reached the engine


def test_the_campaigns_shape_just_under_the_default_is_served(default: BackgroundServer) -> None:
    r = httpx.post(default.url + "/v1/completions", json={**CAMPAIGN, "max_tokens": 186}, timeout=300)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert len(choices) == 256 and all(len(c["logprobs"]["tokens"]) == 186 for c in choices)
    r = httpx.post(default.url + "/v1/completions", json={**CAMPAIGN, "max_tokens": 187}, timeout=30)
    refused(r, 256 * 187 * 22, 1024 * 1024)


def test_ordinary_requests_pass_the_default(default: BackgroundServer) -> None:
    """n up to server.max_n with the whole context, and chat's default max_tokens (the room left)."""
    body = {"model": MODEL, "prompt": "x", "n": 16, "max_tokens": 2000, "ignore_eos": True}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 16, "logprobs": True}
    for path, b in (("/v1/completions", body), ("/v1/chat/completions", {**chat, "top_logprobs": 20})):
        r = httpx.post(default.url + path, json={**b, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    r = httpx.post(default.url + "/v1/completions", json={**body, "max_tokens": 64}, timeout=60)
    assert r.status_code == 200, r.text


# each pair: a body of exactly 1340 units (served) and one just over (refused)
AT_LIMIT: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    # 2 x 100 x (1 + 5) = 1200, echo: 2 x 10, the echoed prompt's logprobs: 2 x 10 x 6 = 120
    "echo": (
        "/v1/completions",
        {"prompt": PROMPT, "n": 2, "logprobs": 4, "echo": True, "max_tokens": 100},
        {"prompt": PROMPT, "n": 2, "logprobs": 4, "echo": True, "max_tokens": 101},
    ),
    # 1340 sequences' tokens without logprobs
    "n": (
        "/v1/completions",
        {"prompt": PROMPT, "n": 2, "max_tokens": 670},
        {"prompt": PROMPT, "n": 1, "max_tokens": 1341},
    ),
    # best_of counts every sequence sampled, and the sampled token's logprob it ranks them by: 2 x 335 x (1 + 1)
    "best_of": (
        "/v1/completions",
        {"prompt": PROMPT, "n": 1, "best_of": 2, "max_tokens": 335},
        {"prompt": PROMPT, "n": 1, "best_of": 2, "max_tokens": 336},
    ),
    # prompt_logprobs=1: 10 x (1 + 2) = 30, plus 1310 tokens
    "prompt_logprobs": (
        "/v1/completions",
        {"prompt": PROMPT, "prompt_logprobs": 1, "max_tokens": 1310},
        {"prompt": PROMPT, "prompt_logprobs": 2, "max_tokens": 1310},
    ),
    # beam search: its 2 results x 670
    "beam": (
        "/v1/completions",
        {"prompt": PROMPT, "n": 2, "use_beam_search": True, "temperature": 0, "max_tokens": 670},
        {"prompt": PROMPT, "n": 2, "use_beam_search": True, "temperature": 0, "max_tokens": 671},
    ),
    # chat: 2 x 134 x (1 + 4)
    "chat": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "n": 2,
            "logprobs": True,
            "top_logprobs": 3,
            "max_tokens": 134,
        },
        {
            "messages": [{"role": "user", "content": "hi"}],
            "n": 2,
            "logprobs": True,
            "top_logprobs": 3,
            "max_tokens": 135,
        },
    ),
}


@pytest.mark.parametrize("kind", list(AT_LIMIT))
def test_at_the_limit_served_just_over_refused(small: BackgroundServer, kind: str) -> None:
    path, at, over = AT_LIMIT[kind]
    r = httpx.post(small.url + path, json={"model": MODEL, **at, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200, r.text
    r = httpx.post(small.url + path, json={"model": MODEL, **over, "ignore_eos": True}, timeout=30)
    assert error_of(r, 400)["code"] == "output_budget_exceeded"
    assert "(server.max_output_units)" in r.json()["error"]["message"]


def test_embeddings_count_inputs_times_dimensions(default: BackgroundServer) -> None:
    """synthetic's embeddings have 4096 numbers: 256 inputs are the default's 1048576 units, 257 are over
    (2048 inputs were a 172 MiB response and +1 GiB of server RSS)."""
    body = {"model": MODEL, "encoding_format": "base64"}
    r = httpx.post(default.url + "/v1/embeddings", json={**body, "input": [[5, 6]] * 256}, timeout=120)
    assert r.status_code == 200 and len(r.json()["data"]) == 256
    for n in (257, 2048):
        r = httpx.post(default.url + "/v1/embeddings", json={**body, "input": ["a b"] * n}, timeout=30)
        err = error_of(r, 400)
        assert err["param"] == "input" and err["code"] == "output_budget_exceeded"
        assert (
            f"may produce {n * 4096} output units" in err["message"] and "(server.max_output_units)" in err["message"]
        )
