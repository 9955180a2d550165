"""vLLM's ``chat_template_kwargs`` and ``return_token_ids`` on SmolLM2-135M-Instruct's own ChatML
template (issue 37), official ``openai`` client: the template reads no ``enable_thinking``, so that key
is refused, and the prompt's ids are the template's render."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from forge.server.background import BackgroundServer
from tests.server_helpers import serving

pytestmark = pytest.mark.realmodel

MSGS: Any = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(["model=smollm2", "engine.max_num_seqs=2"], "smollm2") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_template_kwargs_the_template_does_not_read_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="smollm2",
            messages=MSGS,
            max_tokens=2,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    body: Any = info.value.body
    assert body["param"] == "chat_template_kwargs" and "'enable_thinking'" in body["message"]


def test_return_token_ids_are_the_rendered_template(server: BackgroundServer, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="smollm2", messages=MSGS, max_tokens=4, temperature=0, extra_body={"return_token_ids": True}
    )
    prompt_ids = (r.model_extra or {})["prompt_token_ids"]
    rendered = httpx.post(server.url + "/tokenize", json={"model": "smollm2", "messages": MSGS}).json()
    assert prompt_ids == rendered["tokens"]
    assert r.usage is not None and len(prompt_ids) == r.usage.prompt_tokens
    ids = (r.choices[0].model_extra or {})["token_ids"]
    assert len(ids) == r.usage.completion_tokens
