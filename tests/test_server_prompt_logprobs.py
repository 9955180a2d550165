"""Prompt logprobs through the OpenAI client: vLLM's ``prompt_logprobs`` and completions' ``echo`` +
``logprobs``, against the model's own full-prompt forward (chunked prefill, prefix caching on)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from openai.types import Completion

from forge.server.background import BackgroundServer
from tests.forward_helpers import prefill_logits
from tests.server_helpers import serving

PROMPT = [(5 * i + 11) % 200 + 1 for i in range(21)]  # 21 tokens: three chunks of 8


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    overrides = ["model=tiny", "engine.max_num_batched_tokens=8", "kvcache.enable_prefix_caching=true"]
    with serving(overrides, "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(server: BackgroundServer) -> torch.Tensor:
    """``[len(PROMPT), vocab]`` log-softmax of the full-prompt forward: row p predicts token p + 1."""
    model = server.app.state.forge.engine.engine.runner.model
    return torch.log_softmax(prefill_logits(model, PROMPT).float(), dim=-1)


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


def test_completion_prompt_logprobs_in_vllm_shape(client: openai.OpenAI, expected: torch.Tensor) -> None:
    for _ in range(2):  # the second time the prompt is in the prefix cache: still computed whole
        r = client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=2, temperature=0, extra_body={"prompt_logprobs": 2}
        )
        plp: Any = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
        assert len(plp) == len(PROMPT) and plp[0] is None
        for pos in range(1, len(PROMPT)):
            row, tok = expected[pos - 1], PROMPT[pos]
            entry = plp[pos]
            assert _close(entry[str(tok)]["logprob"], float(row[tok]))
            vals, ids = row.topk(2)
            for rank, (t, v) in enumerate(zip(ids.tolist(), vals.tolist(), strict=True), start=1):
                assert _close(entry[str(t)]["logprob"], v) and entry[str(t)]["rank"] == rank
            assert set(entry) == {str(tok), *map(str, ids.tolist())}


@pytest.mark.parametrize("k", [0, 1])
def test_prompt_token_rank_in_the_whole_vocabulary(client: openai.OpenAI, expected: torch.Tensor, k: int) -> None:
    """vLLM's rank for a prompt token outside the top k: how many tokens are at least as likely."""
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=1, extra_body={"prompt_logprobs": k})
    plp: Any = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    ranks = [plp[pos][str(PROMPT[pos])]["rank"] for pos in range(1, len(PROMPT))]
    want = [int((expected[pos - 1] >= expected[pos - 1][PROMPT[pos]]).sum()) for pos in range(1, len(PROMPT))]
    assert ranks == want and max(want) > k + 1  # some prompt tokens lie far outside the top k


def test_chat_prompt_logprobs_on_the_response(client: openai.OpenAI) -> None:
    c = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi there"}],
        max_tokens=2,
        temperature=0,
        extra_body={"prompt_logprobs": 0},
    )
    plp: Any = (c.model_extra or {})["prompt_logprobs"]
    assert plp[0] is None and len(plp) > 1
    assert all(len(e) == 1 and next(iter(e.values()))["logprob"] <= 0 for e in plp[1:])
    assert all(isinstance(next(iter(e.values()))["rank"], int) for e in plp[1:])


@pytest.mark.parametrize("stream", [False, True])
def test_echo_logprobs_cover_the_prompt_then_the_output(
    client: openai.OpenAI, expected: torch.Tensor, stream: bool
) -> None:
    kw: dict[str, Any] = {"model": "tiny", "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
    tokens: list[str] = []
    lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    text = ""
    chunks: list[Completion] = (
        list(
            client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1, stream=True
            )
        )
        if stream
        else [
            client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=1)
        ]
    )
    for ch in chunks:
        choice = ch.choices[0]
        assert choice.logprobs is not None
        tokens += choice.logprobs.tokens or []
        lps += choice.logprobs.token_logprobs or []
        tops += choice.logprobs.top_logprobs or []
        offsets += choice.logprobs.text_offset or []
        text += choice.text
    plain = client.completions.create(**kw, logprobs=1)
    generated = plain.choices[0].logprobs
    assert generated is not None and generated.token_logprobs is not None
    n = len(PROMPT)
    assert len(lps) == n + 3 and lps[0] is None and tops[0] is None
    for pos in range(1, n):
        assert _close(lps[pos], float(expected[pos - 1][PROMPT[pos]]))
        top = tops[pos]
        assert top is not None and max(top.values()) == pytest.approx(float(expected[pos - 1].max()), abs=1e-4)
    for got, want in zip(lps[n:], generated.token_logprobs, strict=True):
        assert _close(got, want) if want is not None else got is None
    assert text == "".join(tokens) == "".join(tokens[:n]) + plain.choices[0].text
    # the prompt's offsets from 0; the output's from the end of the echoed prompt (a stream anchors
    # each chunk's at the text sent so far, which a held-back partial character may trail)
    assert offsets[: n + 1] == [sum(len(t) for t in tokens[:i]) for i in range(n + 1)]
    assert offsets[n:] == sorted(offsets[n:])


def test_prompt_logprobs_above_the_limit_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="a", max_tokens=1, extra_body={"prompt_logprobs": 10**6})
    assert isinstance(info.value.body, dict) and info.value.body.get("param") == "prompt_logprobs"


def test_streamed_chat_refuses_prompt_logprobs(server: BackgroundServer) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "prompt_logprobs": 1}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
