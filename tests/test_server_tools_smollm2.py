"""Tool calling on SmolLM2-135M-Instruct's own chat template (issue 17), official ``openai`` client:
its ChatML template shows no tools, so ``required`` and named calls come from the JSON schema the
server builds, and ``auto`` must answer with content or calls that parse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

pytestmark = pytest.mark.realmodel

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
}
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "description": "weather", "parameters": PARAMS}}]
MSGS: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    app, _ = app_from_config(compose_config(["model=smollm2", "engine.max_num_seqs=4"]), "smollm2")
    with BackgroundServer(app) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


def test_named_and_required_calls_validate(client: openai.OpenAI) -> None:
    kw: Any = {"model": "smollm2", "messages": MSGS, "tools": TOOLS, "max_tokens": 40, "temperature": 0}
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(tool_choice=named, **kw).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.tool_calls
    jsonschema.validate(json.loads(r.message.tool_calls[0].function.arguments), PARAMS)
    chunks = list(client.chat.completions.create(tool_choice="required", stream=True, **{**kw, "max_tokens": 60}))
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert calls and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments or ""), PARAMS)


def test_auto_and_tool_results_in_the_conversation(client: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns: Any = [
        *MSGS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
    ]
    r = client.chat.completions.create(model="smollm2", messages=turns, tools=TOOLS, max_tokens=24, temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    streamed = list(
        client.chat.completions.create(
            model="smollm2", messages=turns, tools=TOOLS, max_tokens=24, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == (choice.message.content or "")
