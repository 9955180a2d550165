"""Tool calling (issue 17): tools reach the prompt, tool_choice none/auto/required/named, the
parsers, message.tool_calls and streamed delta.tool_calls; official ``openai`` client, model=tiny."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from gguf_fixtures import write_tiny_gguf

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer
from forge.server.protocol import ChatCompletionRequest
from forge.server.settings import TOOL_CALL_PARSERS
from forge.server.tools import PARSERS, tool_plan

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]
MSGS: Any = [{"role": "user", "content": "weather?"}]
HERMES_CALL = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Oslo", "days": 2\}\}</tool_call>'


def serve(parser: str) -> Iterator[openai.OpenAI]:
    cfg = compose_config(["model=tiny", "engine.max_num_seqs=8", f"server.tool_call_parser={parser}"])
    app, _ = app_from_config(cfg, "tiny")
    with BackgroundServer(app) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    yield from serve("hermes")


@pytest.fixture(scope="module")
def mistral_client() -> Iterator[openai.OpenAI]:
    yield from serve("mistral")


def refused(call: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param, body


def test_tools_and_tool_messages_reach_the_prompt(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "max_tokens": 1, "temperature": 0}
    plain = client.chat.completions.create(messages=MSGS, **kw).usage
    with_tools = client.chat.completions.create(messages=MSGS, tools=TOOLS, tool_choice="none", **kw).usage
    assert plain is not None and with_tools is not None
    assert with_tools.prompt_tokens > plain.prompt_tokens + len(json.dumps(WEATHER))
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    turns: Any = [
        *MSGS,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    without_call: Any = [*MSGS, {"role": "assistant", "content": ""}, {"role": "user", "content": "sunny"}]
    a = client.chat.completions.create(messages=turns, **kw).usage
    b = client.chat.completions.create(messages=without_call, **kw).usage
    assert a is not None and b is not None and a.prompt_tokens > b.prompt_tokens + len("get_weather")


def test_malformed_tools_are_400(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 4}
    bad_schema: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}]
    refused(lambda: client.chat.completions.create(tools=bad_schema, **kw), "tools")
    named: Any = {"type": "function", "function": {"name": "nope"}}
    refused(lambda: client.chat.completions.create(tools=TOOLS, tool_choice=named, **kw), "tool_choice")
    refused(lambda: client.chat.completions.create(tool_choice="required", **kw), "tool_choice")
    orphan: Any = [*MSGS, {"role": "tool", "tool_call_id": "missing", "content": "x"}]
    refused(lambda: client.chat.completions.create(**{**kw, "messages": orphan}), "messages.1.tool_call_id")
    bad_args: Any = [
        *MSGS,
        {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{"}}],
        },
    ]
    refused(lambda: client.chat.completions.create(**{**kw, "messages": bad_args}), "messages.1.tool_calls.0")


def test_named_and_required_tool_choice_validate(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "tools": TOOLS, "max_tokens": 60, "temperature": 1.0}
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    for seed in (1, 2):
        r = client.chat.completions.create(tool_choice=named, seed=seed, **kw).choices[0]
        assert r.finish_reason == "tool_calls" and r.message.tool_calls
        call = r.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, seed=3, **kw).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.tool_calls and len(r.message.tool_calls) == 1
    name = r.message.tool_calls[0].function.name
    assert name in ("get_weather", "ping")
    if name == "get_weather":
        jsonschema.validate(json.loads(r.message.tool_calls[0].function.arguments), WEATHER)
    chunks = list(client.chat.completions.create(tool_choice=named, seed=1, stream=True, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert len(calls) == 1 and calls[0].function is not None and calls[0].index == 0
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(calls[0].function.arguments or ""), WEATHER)


def test_auto_tool_calls_parsed_from_hermes_text(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "tools": TOOLS, "max_tokens": 150, "temperature": 0}
    regex = "Sure\\. " + HERMES_CALL
    r = client.chat.completions.create(extra_body={"guided_regex": regex}, **kw).choices[0]
    assert r.finish_reason == "tool_calls" and r.message.content == "Sure. "
    assert r.message.tool_calls and r.message.tool_calls[0].function.name == "get_weather"
    assert json.loads(r.message.tool_calls[0].function.arguments) == {"city": "Oslo", "days": 2}
    chunks = list(client.chat.completions.create(extra_body={"guided_regex": regex}, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Sure. " and "<" not in content
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert len(calls) == 1 and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(extra_body={"guided_regex": "no tools here"}, **kw).choices[0]
    assert plain.message.content == "no tools here" and not plain.message.tool_calls and plain.finish_reason == "stop"


def test_mistral_parser_by_config(mistral_client: openai.OpenAI) -> None:
    regex = r'\[TOOL_CALLS\]\[\{"name": "ping", "arguments": \{\}\}, \{"name": "ping", "arguments": \{\}\}\]'
    kw: Any = {
        "model": "tiny",
        "messages": MSGS,
        "tools": TOOLS,
        "max_tokens": 150,
        "extra_body": {"guided_regex": regex},
    }
    r = mistral_client.chat.completions.create(**kw).choices[0]
    assert r.message.tool_calls and [c.function.name for c in r.message.tool_calls] == ["ping", "ping"]
    one = mistral_client.chat.completions.create(parallel_tool_calls=False, **kw).choices[0]
    assert one.message.tool_calls and len(one.message.tool_calls) == 1


def test_parsers_read_their_formats() -> None:
    def calls(parser: str, text: str) -> tuple[str, list[tuple[str, Any]]]:
        body = ChatCompletionRequest(model="m", messages=MSGS, tools=TOOLS)
        plan = tool_plan(body, parser)
        assert plan is not None
        content, found = plan.parse(text)
        return content, [(c.name, json.loads(c.arguments)) for c in found]

    assert set(PARSERS) == {"hermes", "llama3_json", "mistral"} == set(TOOL_CALL_PARSERS)  # the settings' copy
    assert calls("hermes", 'hi<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>') == ("hi", [("ping", {})])
    assert calls("llama3_json", '{"name": "ping", "parameters": {"a": 1}}; {"name": "x", "parameters": {}}') == (
        "",
        [("ping", {"a": 1}), ("x", {})],
    )
    assert calls("llama3_json", '<|python_tag|>{"name": "ping", "arguments": "{}"}') == ("", [("ping", {})])
    assert calls("mistral", '[TOOL_CALLS] [{"name": "ping", "arguments": {"b": 2}}]') == ("", [("ping", {"b": 2})])
    assert calls("hermes", "<tool_call>{not json</tool_call>") == ("<tool_call>{not json</tool_call>", [])
    assert calls("llama3_json", "plain words") == ("plain words", [])


HERMES_TEMPLATE = """{% if tools %}<|im_start|>system
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools><|im_end|>
{% endif %}{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant
{% for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
SMALL: Any = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        },
    }
]


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-tools.gguf"
    write_tiny_gguf(path, chat_template=HERMES_TEMPLATE)
    app, _ = app_from_config(compose_config(["model=gguf", f"model.path={path}"]), "tiny-tools")
    with BackgroundServer(app) as s:
        yield s
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


def test_tools_aware_template_gets_tools_calls_and_results(hermes_server: BackgroundServer) -> None:
    call = {"id": "c9", "type": "function", "function": {"name": "f", "arguments": '{"n": 7}'}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c9", "content": "49"},
    ]
    tokens = httpx.post(hermes_server.url + "/tokenize", json={"messages": messages, "tools": SMALL}).json()["tokens"]
    text = httpx.post(hermes_server.url + "/detokenize", json={"tokens": tokens}).json()["prompt"]
    assert json.dumps(SMALL[0]) in text  # HF's tools=: the template lists them
    assert '<tool_call>\n{"name": "f", "arguments": {"n": 7}}\n</tool_call>' in text  # arguments as an object
    assert "<tool_response>49</tool_response>" in text and text.endswith("assistant\n")


def test_required_tool_choice_on_a_bpe_model(hermes_server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=hermes_server.url + "/v1", api_key="unused", max_retries=0)
    kw: Any = {"model": "tiny-tools", "messages": MSGS, "tools": SMALL, "max_tokens": 70, "seed": 4}
    for stream in (False, True):
        if stream:
            chunks = list(client.chat.completions.create(tool_choice="required", stream=True, **kw))
            calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
            args = [t.function.arguments if t.function else None for t in calls]
            reason = chunks[-1].choices[0].finish_reason
        else:
            choice = client.chat.completions.create(tool_choice="required", **kw).choices[0]
            args = [t.function.arguments for t in choice.message.tool_calls or []]
            reason = choice.finish_reason
        assert args and reason == "tool_calls"
        for a in args:
            assert isinstance(json.loads(a or ""), dict) and isinstance(json.loads(a or "")["n"], int)


def test_continue_final_message_leaves_it_open(hermes_server: BackgroundServer) -> None:
    client = openai.OpenAI(base_url=hermes_server.url + "/v1", api_key="unused", max_retries=0)
    msgs: Any = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "The quick"}]
    kw: Any = {"model": "tiny-tools", "messages": msgs, "max_tokens": 2, "temperature": 0}
    closed = client.chat.completions.create(extra_body={"add_generation_prompt": False}, **kw).usage
    opened = client.chat.completions.create(
        extra_body={"add_generation_prompt": False, "continue_final_message": True}, **kw
    ).usage
    tail = httpx.post(hermes_server.url + "/tokenize", json={"prompt": "<|im_end|>\n", "add_special_tokens": False})
    assert closed is not None and opened is not None
    assert opened.prompt_tokens == closed.prompt_tokens - tail.json()["count"]
    refused(
        lambda: client.chat.completions.create(extra_body={"continue_final_message": True}, **kw),
        "continue_final_message",
    )
