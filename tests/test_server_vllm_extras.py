"""Served API conformance, round 2 (issue 37), through the official ``openai`` client against
model=tiny (a byte tokenizer: token i < 256 is byte i, 257 is EOS): ``max_tokens`` below a
format's shortest output, and vLLM's ``return_token_ids``, ``allowed_token_ids`` and
``chat_template_kwargs``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from forge.server.background import BackgroundServer
from tests.server_helpers import serving

MSGS: Any = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
X, Y, EOS = ord("x"), ord("y"), 257
# a Qwen3-style switch: enable_thinking=false appends " /no_think" to the generation prompt
TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:"
    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}{% endif %}"
)


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with serving(["model=tiny", "engine.max_num_seqs=8"], "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def refused(call: Any, param: str, says: str = "") -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param, body
    assert says in str(body.get("message")), body


def extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {})[key]


# -- max_tokens below the shortest output a format allows -------------------------------------


def test_max_tokens_below_the_shortest_regex_output_is_cut(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "prompt": "abc", "max_tokens": 3, "extra_body": {"regex": "hello world"}}
    r = client.completions.create(**kw).choices[0]
    assert (r.text, r.finish_reason) == ("hel", "length")
    chunks = list(client.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "hel"
    assert chunks[-1].choices[0].finish_reason == "length"
    whole = client.completions.create(**{**kw, "max_tokens": 20}).choices[0]
    assert (whole.text, whole.finish_reason) == ("hello world", "stop")


def test_max_tokens_below_the_shortest_json_is_a_prefix_of_valid_json(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=3, response_format=fmt).choices[0]
    assert r.finish_reason == "length" and r.message.content == '{"a'
    done = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40, response_format=fmt)
    assert isinstance(json.loads(done.choices[0].message.content or "")["a"], int)


# -- return_token_ids ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [[72, 105, 33], "Hi!"])
def test_completion_return_token_ids(client: openai.OpenAI, prompt: Any) -> None:
    kw: Any = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0, "n": 2}
    plain = client.completions.create(**kw).choices[0]
    assert "token_ids" not in (plain.model_extra or {}) and "prompt_token_ids" not in (plain.model_extra or {})
    r = client.completions.create(extra_body={"return_token_ids": True}, **kw)
    prompt_ids = [72, 105, 33] if isinstance(prompt, list) else [256, 72, 105, 33]  # text: BOS first
    for c in r.choices:
        assert extra(c, "prompt_token_ids") == prompt_ids
        assert extra(c, "token_ids") and len(extra(c, "token_ids")) <= 6
    assert r.usage is not None and sum(len(extra(c, "token_ids")) for c in r.choices) == r.usage.completion_tokens
    chunks = list(client.completions.create(stream=True, extra_body={"return_token_ids": True}, **kw))
    for c in r.choices:
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == c.index]
        assert extra(mine[0], "prompt_token_ids") == prompt_ids
        assert all("prompt_token_ids" not in (m.model_extra or {}) for m in mine[1:])
        assert [t for m in mine for t in extra(m, "token_ids")] == extra(c, "token_ids")


def test_chat_return_token_ids(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 5, "temperature": 0}
    plain = client.chat.completions.create(**kw)
    assert "prompt_token_ids" not in (plain.model_extra or {})
    r = client.chat.completions.create(extra_body={"return_token_ids": True}, **kw)
    prompt_ids = extra(r, "prompt_token_ids")
    assert bytes(t for t in prompt_ids if t < 256).decode() == "user: hi\nassistant:"
    assert r.usage is not None and len(prompt_ids) == r.usage.prompt_tokens
    ids = extra(r.choices[0], "token_ids")
    assert len(ids) == r.usage.completion_tokens
    same = client.completions.create(
        model="tiny", prompt=prompt_ids, max_tokens=5, temperature=0, extra_body={"return_token_ids": True}
    )
    assert extra(same.choices[0], "token_ids") == ids and same.choices[0].text == plain.choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, extra_body={"return_token_ids": True}, **kw))
    assert extra(chunks[0], "prompt_token_ids") == prompt_ids
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks[1:])
    assert [t for c in chunks[1:] for t in extra(c.choices[0], "token_ids")] == ids


# -- allowed_token_ids --------------------------------------------------------------------------


def token_ids(client: openai.OpenAI, **kw: Any) -> list[list[int]]:
    body = {"return_token_ids": True, **kw.pop("extra_body", {})}
    r = client.completions.create(model="tiny", prompt="abc", extra_body=body, **kw)
    return [extra(c, "token_ids") for c in r.choices]


def test_allowed_token_ids_restrict_sampling(client: openai.OpenAI) -> None:
    free = token_ids(client, max_tokens=30, temperature=1.0, seed=3)[0]
    assert set(free) - {X, Y}  # the model alone samples other tokens
    for seq in token_ids(client, max_tokens=30, temperature=1.0, seed=3, n=3, extra_body={"allowed_token_ids": [X, Y]}):
        assert len(seq) == 30 and set(seq) <= {X, Y}
    biased = {"allowed_token_ids": [X, Y], "logit_bias": {str(X): -100}}
    assert token_ids(client, max_tokens=12, temperature=1.0, seed=3, extra_body=biased)[0] == [Y] * 12
    held = {"allowed_token_ids": [X, EOS], "min_tokens": 6}
    assert token_ids(client, max_tokens=6, temperature=0, extra_body=held)[0] == [X] * 6


def test_allowed_token_ids_refused_where_they_cannot_be_honoured(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "prompt": "abc", "max_tokens": 4}
    for bad, param, says in (([], "", "empty"), ([X, 320], "", "vocabulary"), ([-1], ".0", "")):
        refused(
            lambda b=bad: client.completions.create(extra_body={"allowed_token_ids": b}, **kw),
            "allowed_token_ids" + param,
            says,
        )
    refused(
        lambda: client.completions.create(extra_body={"allowed_token_ids": [X], "regex": "x+"}, **kw),
        "allowed_token_ids",
        "structured output",
    )
    refused(
        lambda: client.completions.create(extra_body={"allowed_token_ids": [EOS], "min_tokens": 2}, **kw),
        "allowed_token_ids",
        "min_tokens",
    )
    refused(
        lambda: client.completions.create(extra_body={"allowed_token_ids": [X], "use_beam_search": True}, **kw),
        "allowed_token_ids",
    )


# -- chat_template_kwargs -----------------------------------------------------------------------


def test_chat_template_kwargs_refused_without_a_template_that_reads_them(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 2}
    kwargs: Any = {"enable_thinking": False}
    refused(
        lambda: client.chat.completions.create(extra_body={"chat_template_kwargs": kwargs}, **kw),
        "chat_template_kwargs",
        "'enable_thinking'",
    )


@pytest.fixture(scope="module")
def templated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    path = Path(tmp_path_factory.mktemp("template")) / "chat.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    with serving(["model=tiny", f"server.chat_template={path}"], "tiny") as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)


def test_chat_template_kwargs_reach_the_template(templated: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 2, "extra_body": {"return_token_ids": True}}

    def prompt(kwargs: dict[str, Any] | None) -> str:
        body = {**kw["extra_body"], **({"chat_template_kwargs": kwargs} if kwargs is not None else {})}
        r = templated.chat.completions.create(**{**kw, "extra_body": body})
        return bytes(extra(r, "prompt_token_ids")).decode()

    assert prompt(None) == prompt({"enable_thinking": True}) == "user: hi\nassistant:"
    assert prompt({"enable_thinking": False}) == "user: hi\nassistant: /no_think"
    for key, says in (("enable_reasoning", "does not use 'enable_reasoning'"), ("add_generation_prompt", "field")):
        refused(
            lambda k=key: templated.chat.completions.create(
                model="tiny", messages=MSGS, max_tokens=2, extra_body={"chat_template_kwargs": {k: True}}
            ),
            "chat_template_kwargs",
            says,
        )


# -- found by vLLM's suite (benchmarks/conformance_vllm) -----------------------------------------


def test_logit_bias_names_every_key_that_is_not_a_token_id(client: openai.OpenAI) -> None:
    """vLLM's test_chat_logit_bias_multiple_non_integer_keys: a client fixes all its keys after one 400."""
    bias: Any = {"bad1": 50.0, "7": 1.0, "bad2": 20.0}
    call = lambda: client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, logit_bias=bias)  # noqa: E731
    refused(call, "logit_bias", "'bad1'")
    refused(call, "logit_bias", "'bad2'")


def test_strict_inside_a_tools_parameters_is_an_annotation(client: openai.OpenAI) -> None:
    """vLLM's test_max_tokens_with_tool_choice_required puts OpenAI's function-level ``strict`` inside
    ``parameters``: not a JSON Schema keyword, so it constrains nothing and is no reason for a 400."""
    params = {"type": "object", "strict": True, "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    choices: list[Any] = ["required", {"type": "function", "function": {"name": "f"}}]
    for choice in choices:
        r = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=1, tools=tools, tool_choice=choice)
        assert r.choices[0].finish_reason == "length"
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "s", "schema": {**SCHEMA, "strict": True}}}
    done = client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=40, response_format=fmt)
    assert json.loads(done.choices[0].message.content or "")["a"] is not None
