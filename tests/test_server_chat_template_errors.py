"""A chat template that fails while rendering a request is that request's 400 (OpenAI's error shape,
``param: messages``), never a 500, whatever Python error the template's expressions raise: found by
llama.cpp's server tests (issue 37), whose functionary templates start with ``bos_token + '...'``,
a TypeError on a model without a BOS token (model=tiny); vLLM answers such errors with a 400 too.
Through the official ``openai`` client, streamed and not; the server stays healthy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from forge.server.background import BackgroundServer
from tests.server_helpers import serving

TEMPLATES = {
    "bos": "{{ bos_token + 'system: hi' }}{% for m in messages %}{{ m.content }}{% endfor %}",  # TypeError
    "divide": "{{ (1 / (messages | length - 1)) }}{% for m in messages %}{{ m.content }}{% endfor %}",  # ZeroDivision
    "key": "{{ {'a': 1}[messages[0].role] + 1 }}",  # Undefined + 1: Jinja2's own error (a 400 already)
}
MSGS: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", params=["bos", "divide", "key"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    path = Path(tmp_path_factory.mktemp("template")) / "chat.jinja"
    path.write_text(TEMPLATES[request.param], encoding="utf-8")
    with serving(["model=tiny", f"server.chat_template={path}"], "tiny") as s:
        yield s


@pytest.mark.parametrize("stream", [False, True])
def test_a_template_that_raises_while_rendering_is_a_400(server: BackgroundServer, stream: bool) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, stream=stream)
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "messages", body
    assert body["message"].startswith("chat template failed"), body
    assert httpx.get(server.url + "/health").status_code == 200
    tokenized = httpx.post(server.url + "/tokenize", json={"model": "tiny", "messages": MSGS})
    assert tokenized.status_code == 400 and tokenized.json()["error"]["param"] == "messages"
