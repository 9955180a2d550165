"""Completions ``echo`` of a token-id prompt holding special tokens (issue 37, item 5), official ``openai``
client on SmolLM2 (whose ChatML markers are special tokens): the echoed text keeps them, so ``text`` is
``logprobs.tokens`` joined and each ``text_offset`` is where its token starts in ``text``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

pytestmark = pytest.mark.realmodel
CHAT = "<|im_start|>user\nhi<|im_end|>"


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    app, _ = app_from_config(compose_config(["model=smollm2", "engine.max_num_seqs=4"]), "smollm2")
    with BackgroundServer(app) as s:
        yield s
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


@pytest.mark.parametrize("stream", [False, True])
def test_echoed_special_tokens_match_tokens_and_offsets(server: BackgroundServer, stream: bool) -> None:
    ids = httpx.post(server.url + "/tokenize", json={"prompt": CHAT, "add_special_tokens": False}).json()["tokens"]
    assert ids[0] == ids[-1] - 1  # <|im_start|> and <|im_end|>: one token each
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kw: Any = {"model": "smollm2", "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    chunks = list(client.completions.create(stream=True, **kw)) if stream else [client.completions.create(**kw)]
    text = ""
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in chunks:
        choice = chunk.choices[0]
        assert choice.logprobs is not None
        text += choice.text
        tokens += choice.logprobs.tokens or []
        offsets += choice.logprobs.text_offset or []
    assert text.startswith(CHAT) and len(tokens) == len(ids) + 1
    assert text == "".join(tokens)
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
