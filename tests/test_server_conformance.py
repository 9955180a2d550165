"""OpenAI-API conformance (issue 17): every field honoured or refused with a 400, streaming and
logprobs in OpenAI's / vLLM's shape; the official ``openai`` client against model=tiny."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

MSGS: Any = [{"role": "user", "content": "hi"}]
CONTINUOUS: Any = {"include_usage": True, "continuous_usage_stats": True}


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    app, _ = app_from_config(compose_config(["model=tiny", "engine.max_num_seqs=16"]), "tiny")
    with BackgroundServer(app) as s:
        yield s
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


@pytest.fixture(scope="module")
def client(server: BackgroundServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def refused(call: Any, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param, body


def test_unknown_fields_refused_harmless_ones_accepted(client: openai.OpenAI) -> None:
    for field in ("frobnicate", "grammar", "skip_special_tokens"):
        refused(
            lambda f=field: client.completions.create(model="tiny", prompt="a", max_tokens=2, extra_body={f: 1}),
            field,
        )
        refused(
            lambda f=field: client.chat.completions.create(
                model="tiny", messages=MSGS, max_tokens=2, extra_body={f: 1}
            ),
            field,
        )
    r = client.chat.completions.create(
        model="tiny", messages=MSGS, max_tokens=2, user="u", metadata={"k": "v"}, store=False
    )
    assert r.choices[0].message.role == "assistant"
    odd: Any = [{"role": "user", "content": "x", "frob": 1}]  # a message field nobody reads
    refused(lambda: client.chat.completions.create(model="tiny", messages=odd, max_tokens=2), "messages.0.frob")


def test_stream_options_without_stream_and_seed_range(client: openai.OpenAI) -> None:
    refused(
        lambda: client.completions.create(
            model="tiny", prompt="a", max_tokens=2, stream_options={"include_usage": True}
        ),
        "stream_options",
    )
    refused(lambda: client.completions.create(model="tiny", prompt="a", max_tokens=2, seed=1 << 64), "seed")
    refused(lambda: client.completions.create(model="tiny", prompt="a", max_tokens=2, seed=(1 << 64) - 1, n=2), "seed")
    kw: Any = {"model": "tiny", "prompt": "seed", "max_tokens": 24, "temperature": 1.0}
    zero = client.completions.create(seed=0, **kw).choices[0].text
    big = client.completions.create(seed=1 << 63, **kw).choices[0].text  # was masked to 63 bits: seed 0
    assert big != zero


def test_min_tokens_suppresses_ending_tokens(server: BackgroundServer, client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "prompt": "abc", "max_tokens": 12, "temperature": 0}
    free = client.completions.create(**kw).choices[0].text
    first = httpx.post(server.url + "/tokenize", json={"prompt": free[:1], "add_special_tokens": False}).json()
    stop_ids = first["tokens"]
    stopped = client.completions.create(extra_body={"stop_token_ids": stop_ids}, **kw)
    assert stopped.usage is not None and stopped.usage.completion_tokens == 1
    held = client.completions.create(extra_body={"stop_token_ids": stop_ids, "min_tokens": 5}, **kw)
    assert held.usage is not None and held.usage.completion_tokens >= 5
    refused(lambda: client.completions.create(extra_body={"min_tokens": 13}, **kw), "min_tokens")
    refused(lambda: client.completions.create(extra_body={"min_tokens": 2, "regex": "a+"}, **kw), "min_tokens")


def test_min_tokens_with_stop_strings_as_vllm(client: openai.OpenAI) -> None:
    """vLLM's rule (issue 38): stop strings are not checked in the first ``min_tokens`` tokens' text; a
    stop string ending in a later token's text ends the choice, wherever it starts. ``logit_bias`` makes
    every token "x" (the byte tokenizer: one token, one character)."""
    kw: Any = {"model": "tiny", "prompt": "abc", "max_tokens": 10, "temperature": 0, "logit_bias": {"120": 100}}
    assert client.completions.create(**kw).choices[0].text == "x" * 10
    assert client.completions.create(stop=["x"], **kw).choices[0].text == ""
    held = client.completions.create(stop=["x"], extra_body={"min_tokens": 3}, **kw).choices[0]
    assert (held.text, held.finish_reason) == ("xxx", "stop")
    # "xx" first ends at the 4th character: the match starting at the 3rd cuts the text there
    straddle = client.completions.create(stop=["xx"], extra_body={"min_tokens": 3}, **kw).choices[0]
    assert straddle.text == "xx"
    kept = client.completions.create(
        stop=["xx"], extra_body={"min_tokens": 3, "include_stop_str_in_output": True}, **kw
    )
    assert kept.choices[0].text == "xxxx"
    stream = client.completions.create(stop=["x"], stream=True, extra_body={"min_tokens": 5}, **kw)
    chunks = [c.choices[0] for c in stream if c.choices]
    assert "".join(c.text for c in chunks) == "xxxxx" and chunks[-1].finish_reason == "stop"
    msgs: Any = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(
        model="tiny",
        messages=msgs,
        max_tokens=10,
        temperature=0,
        logit_bias={"120": 100},
        stop="x",
        extra_body={"min_tokens": 2},
    )
    assert chat.choices[0].message.content == "xx" and chat.choices[0].finish_reason == "stop"


def test_include_stop_str_in_output(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "prompt": "abc", "max_tokens": 12, "temperature": 0}
    full = client.completions.create(**kw).choices[0].text
    stop = full[3:5]
    assert stop and stop not in full[:4]
    cut = client.completions.create(stop=[stop], **kw).choices[0].text
    kept = client.completions.create(stop=[stop], extra_body={"include_stop_str_in_output": True}, **kw)
    assert kept.choices[0].text == cut + stop and kept.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        stop=[stop], stream=True, extra_body={"include_stop_str_in_output": True}, **kw
    )
    assert "".join(c.choices[0].text for c in streamed) == cut + stop


def test_continuous_usage_stats(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options=CONTINUOUS,
    )
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert len(counts) == len(chunks) and counts == sorted(counts) and counts[-1] == 6


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_continuous_usage_stats_needs_include_usage(server: BackgroundServer, endpoint: str) -> None:
    """vLLM's rule (issue 37, item 4): ``continuous_usage_stats`` adds usage to the chunks only with
    ``include_usage``; without it no chunk carries usage, as with no ``stream_options``."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    kw: Any = {"model": "tiny", "max_tokens": 6, "temperature": 0, "stream": True}
    options: Any = {"include_usage": False, "continuous_usage_stats": True}
    if endpoint == "chat":
        chunks = list(client.chat.completions.create(messages=MSGS, stream_options=options, **kw))
    else:
        chunks = list(client.completions.create(prompt="abc", stream_options=options, **kw))
    assert len(chunks) >= 2 and all(c.usage is None for c in chunks)
    raw = httpx.post(
        f"{server.url}/v1/{'chat/' if endpoint == 'chat' else ''}completions",
        json={**kw, "stream_options": options, **({"messages": MSGS} if endpoint == "chat" else {"prompt": "abc"})},
    )
    events = [json.loads(line[6:]) for line in raw.text.splitlines() if line.startswith("data: {")]
    assert events and all("usage" not in e for e in events)


def test_logit_bias(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "prompt": "lb", "max_tokens": 8, "temperature": 0}
    forced = client.completions.create(logit_bias={"65": 100}, **kw).choices[0].text
    assert forced == "A" * 8
    sampled = client.completions.create(logit_bias={"66": 100}, seed=5, **{**kw, "temperature": 1.0})
    assert sampled.choices[0].text == "B" * 8
    refused(lambda: client.completions.create(logit_bias={"x": 1}, **kw), "logit_bias")
    refused(lambda: client.completions.create(logit_bias={"99999": 1}, **kw), "logit_bias")


def test_guided_fields(client: openai.OpenAI) -> None:
    kw: Any = {"model": "tiny", "messages": MSGS, "max_tokens": 12, "temperature": 1.0, "seed": 1}
    choice = client.chat.completions.create(extra_body={"guided_choice": ["yes", "no (maybe)"]}, **kw)
    assert choice.choices[0].message.content in ("yes", "no (maybe)")
    so = client.chat.completions.create(extra_body={"structured_outputs": {"choice": ["a.b", "c"]}}, **kw)
    assert so.choices[0].message.content in ("a.b", "c")
    rx = client.chat.completions.create(extra_body={"guided_regex": "[0-9]{4}"}, **kw)
    assert re.fullmatch("[0-9]{4}", rx.choices[0].message.content or "")
    schema = {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        out = client.chat.completions.create(extra_body=extra, **{**kw, "max_tokens": 20})
        jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    fmt: Any = {"type": "json_object", "schema": schema}
    out = client.chat.completions.create(response_format=fmt, **{**kw, "max_tokens": 20})
    jsonschema.validate(json.loads(out.choices[0].message.content or ""), schema)
    refused(
        lambda: client.chat.completions.create(extra_body={"guided_regex": "a", "guided_choice": ["b"]}, **kw),
        "guided_choice",
    )


def test_chat_stream_sends_empty_content_not_empty_delta(client: openai.OpenAI) -> None:
    stream = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MSGS, max_tokens=16, temperature=0, stream=True, stop=["zz"]
    )
    chunks = [json.loads(line[6:]) for line in stream.http_response.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert all("content" in d for d in deltas)


def test_completion_top_logprobs_include_sampled_token(client: openai.OpenAI) -> None:
    r = client.completions.create(model="tiny", prompt="lp", max_tokens=6, temperature=1.0, seed=2, logprobs=1)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.top_logprobs
    for tok, top in zip(lp.tokens, lp.top_logprobs, strict=True):
        assert tok in top and 1 <= len(top) <= 2
    zero = client.completions.create(model="tiny", prompt="lp", max_tokens=3, temperature=0, logprobs=0)
    assert zero.choices[0].logprobs is not None
    assert [list(t) for t in zero.choices[0].logprobs.top_logprobs or []] == [
        [t] for t in zero.choices[0].logprobs.tokens or []
    ]


def test_chat_echo_prepends_the_final_assistant_message(client: openai.OpenAI) -> None:
    msgs: Any = [{"role": "user", "content": "tell"}, {"role": "assistant", "content": "Once upon"}]
    kw: Any = {"model": "tiny", "messages": msgs, "max_tokens": 5, "temperature": 0}
    plain = client.chat.completions.create(**kw).choices[0].message.content or ""
    echoed = client.chat.completions.create(extra_body={"echo": True}, **kw).choices[0].message.content
    assert echoed == "Once upon" + plain
    chunks = list(client.chat.completions.create(stream=True, extra_body={"echo": True}, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == echoed
    user_last = client.chat.completions.create(extra_body={"echo": True}, **{**kw, "messages": msgs[:1]})
    assert (
        user_last.choices[0].message.content
        == client.chat.completions.create(**{**kw, "messages": msgs[:1]}).choices[0].message.content
    )
