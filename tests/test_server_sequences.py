"""Completions' sequence fields over HTTP: ``n > 1`` on the copy-on-write fork, ``best_of`` and vLLM's
beam search extension (``use_beam_search``, ``beam_width``, ``length_penalty``, ``early_stopping``),
with the combinations they cannot honour refused (400, OpenAI's error shape)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from forge import LLM
from forge.server.background import BackgroundServer
from tests.server_helpers import error_of, serving


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(["model=tiny", "kvcache.block_size=4"], "tiny") as s:
        yield s


def complete(server: BackgroundServer, **body: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"model": "tiny", **body}, timeout=60)


def test_n_forks_one_prefill_and_keeps_the_derived_seeds(server: BackgroundServer) -> None:
    """``n = 3`` is one request forked three ways (copy-on-write copies happen); choice j has the
    tokens of a separate request seeded ``seed + j``, as before the fork."""
    kv = server.app.state.forge.engine.engine.scheduler.kv
    base = {"prompt": "Forked prompts share their blocks", "max_tokens": 6, "temperature": 1.0, "ignore_eos": True}
    copies = kv.stats()["kv_cow_copies"]
    forked = complete(server, n=3, seed=5, **base).json()
    assert kv.stats()["kv_cow_copies"] > copies
    for j, choice in enumerate(sorted(forked["choices"], key=lambda c: c["index"])):
        alone = complete(server, n=1, seed=5 + j, **base).json()
        assert choice["text"] == alone["choices"][0]["text"]


def test_best_of_returns_the_n_highest_cumulative_logprobs(server: BackgroundServer) -> None:
    base = {"prompt": "Best of", "max_tokens": 5, "temperature": 1.0, "ignore_eos": True, "logprobs": 0}
    got = complete(server, n=2, best_of=4, seed=3, **base).json()
    samples = []
    for j in range(4):
        choice = complete(server, seed=3 + j, **base).json()["choices"][0]
        samples.append((sum(choice["logprobs"]["token_logprobs"]), choice["text"]))
    best = sorted(samples, reverse=True)[:2]
    assert [c["index"] for c in got["choices"]] == [0, 1]
    assert [c["text"] for c in got["choices"]] == [text for _, text in best]
    assert got["usage"]["completion_tokens"] == 4 * 5  # every sequence sampled counts (OpenAI's)
    plain = complete(server, n=1, best_of=3, seed=3, **{**base, "logprobs": None}).json()
    assert plain["choices"][0]["logprobs"] is None  # ranked by logprobs, not returned unless asked


def test_beam_search_returns_the_library_results(server: BackgroundServer) -> None:
    body = {"prompt": "q?", "max_tokens": 6, "use_beam_search": True, "n": 3, "length_penalty": 0.5}
    got = complete(server, **body).json()
    want = LLM("model=tiny").beam_search("q?", 3, 6, length_penalty=0.5)[0].sequences
    assert [c["index"] for c in got["choices"]] == [0, 1, 2]
    assert [c["text"] for c in got["choices"]] == [s.text for s in want]
    assert [c["finish_reason"] for c in got["choices"]] == [s.finish_reason for s in want]
    by_width = complete(server, **{**body, "n": 1, "beam_width": 3}).json()
    assert [c["text"] for c in by_width["choices"]] == [s.text for s in want]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 3, "best_of": 2}, "best_of"),
        ({"n": 1, "best_of": 2, "stream": True}, "best_of"),
        ({"use_beam_search": True, "beam_width": 0}, "beam_width"),
        ({"use_beam_search": True, "n": 2, "temperature": 0.8}, "temperature"),
        ({"use_beam_search": True, "n": 2, "stream": True}, "stream"),
        ({"use_beam_search": True, "n": 2, "logprobs": 1}, "logprobs"),
        ({"use_beam_search": True, "n": 2, "stop": ["x"]}, "stop"),
        ({"use_beam_search": True, "n": 2, "beam_width": 3}, "beam_width"),
        ({"beam_width": 2}, "beam_width"),
        ({"length_penalty": 0.5}, "length_penalty"),
        ({"early_stopping": True}, "early_stopping"),
    ],
)
def test_refused_combinations(server: BackgroundServer, body: dict[str, Any], param: str) -> None:
    err = error_of(complete(server, prompt="hi", max_tokens=4, **body), 400)
    assert param in (err["param"] or "") or param in err["message"]
