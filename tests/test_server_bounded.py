"""Issue 40's hostile cases against one live server: JSON nested past ``server.max_json_nesting``
(400 naming the setting, never a 500), nesting at the limit and at the setting's ceiling (served or
refused for another reason, never a 500: no walk reaches Python's recursion limit), requests whose
preparation is CPU-heavy (``/health`` answers within 1 s throughout), and proxy headers (trusted
only from ``server.trusted_proxies``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from forge.server.json_nesting import MAX_JSON_NESTING_CEILING
from forge.server.settings import ServerSettings
from tests.hostile_cases import (
    BAD,
    CHAT,
    CMPL,
    DETOKENIZE,
    EMBEDDINGS,
    GENERATE,
    JSON_TYPE,
    MODEL,
    NESTING_CASES,
    SLOT,
    TOKENIZE,
    Deep,
    call_message,
    chat,
    cmpl,
    deep_array,
    items_schema,
    named,
    tool,
    with_deep,
)
from tests.test_server_hostile import HealthProbe, assert_healthy, check_answer, start

HEALTH_BOUND_S = 1.0  # issue 40: /health answers within this while any one request is prepared
NESTING = "nesting_too_deep"


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    server = start()
    with httpx.Client(base_url=server.url, timeout=300) as c:
        yield c
    server.stop()


def post(client: httpx.Client, path: str, raw: bytes, content_type: str = JSON_TYPE) -> httpx.Response:
    return client.post(path, content=raw, headers={"content-type": content_type})


@pytest.mark.parametrize("case", NESTING_CASES, ids=[c.id for c in NESTING_CASES])
def test_deep_nesting_is_400_naming_the_limit(client: httpx.Client, case: Deep) -> None:
    r = post(client, case.path, case.raw, case.content_type)
    check_answer(r, BAD, case.param)
    err = r.json()["error"]
    assert err["code"] == NESTING and "server.max_json_nesting" in err["message"], err
    assert case.param is not None or err["param"] is None, err
    assert_healthy(client)


def positions(levels: int) -> list[tuple[str, str, bytes]]:
    """A body nesting exactly ``levels`` deep in each place the server parses JSON (the schemas
    are ``items`` chains, so each level is one of the text's)."""
    body_levels = {
        CMPL: 2,
        CHAT: 4,
    }  # the levels around the slot: {"response_format": {...}}, {"tools": [{"function": {...}}]}
    rf = {"type": "json_object", "schema": SLOT}
    msgs = call_message(SLOT)
    schema = items_schema
    return [
        ("response_format", CMPL, with_deep(cmpl(response_format=rf), schema(levels - body_levels[CMPL]))),
        ("guided_json-text", CMPL, with_deep(cmpl(guided_json=SLOT), schema(levels), True)),
        ("structured_outputs-text", CMPL, with_deep(cmpl(structured_outputs={"json": SLOT}), schema(levels), True)),
        ("tools", CHAT, with_deep(chat(tools=[tool(SLOT)]), schema(levels - body_levels[CHAT]))),
        (
            "tools-named",
            CHAT,
            with_deep(chat(tools=[tool(SLOT)], tool_choice=named()), schema(levels - body_levels[CHAT])),
        ),
        ("tools-required", CHAT, with_deep(chat(tools=[tool(SLOT)], tool_choice="required"), schema(levels - 4))),
        ("tool-call-arguments", CHAT, with_deep(chat(messages=msgs), schema(levels), True)),
        ("tokenize-tools", TOKENIZE, with_deep({"messages": msgs[:1], "tools": [tool(SLOT)]}, schema(levels - 4))),
        ("tokenize-arguments", TOKENIZE, with_deep({"messages": msgs}, schema(levels), True)),
        ("prompt", CMPL, with_deep(cmpl(prompt=SLOT), deep_array(levels - 1))),
        ("generate", GENERATE, with_deep({"prompt": SLOT}, deep_array(levels - 1))),
        ("detokenize", DETOKENIZE, with_deep({"tokens": SLOT}, deep_array(levels - 1))),
        ("embeddings", EMBEDDINGS, with_deep({"model": MODEL, "input": SLOT}, deep_array(levels - 1))),
    ]


def test_the_limit_is_exact(client: httpx.Client) -> None:
    """64 levels are served (a tool schema, 60 deep inside the body); 65 are refused."""
    at_limit = with_deep(chat(tools=[tool(SLOT)], max_tokens=1), items_schema(60))
    r = post(client, CHAT, at_limit)
    check_answer(r, frozenset({200}))
    r = post(client, CHAT, with_deep(chat(tools=[tool(SLOT)], max_tokens=1), items_schema(61)))
    check_answer(r, BAD)
    assert r.json()["error"]["code"] == NESTING


@pytest.mark.parametrize("setting", [64, MAX_JSON_NESTING_CEILING])
def test_nesting_within_the_limit_never_fails_the_server(setting: int) -> None:
    """Up to the setting (its default and the highest it may be set to), every place a body holds
    JSON is parsed and walked (schema checks, grammar builds, template renders) without reaching
    Python's recursion limit: each answer is a 200 or a 400 for another reason, never a 500."""
    server = start(f"server.max_json_nesting={setting}")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for name, path, raw in positions(setting):
                r = post(c, path, raw)
                check_answer(r, frozenset({200, 400}))
                assert r.status_code == 200 or r.json()["error"]["code"] != NESTING, (name, r.text[:300])
            assert_healthy(c)
    finally:
        server.stop()


def properties(n: int, width: int = 0) -> dict[str, Any]:
    """An object schema of ``n`` string properties (each with a ``width``-character description)."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "d" * width} for i in range(n)}}


def heavy_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """The campaign's worst single requests: tool schemas meta-checked and rendered (400 KB; 30,000
    properties), and bodies of many small parts (prompts, messages), each checked and tokenized."""
    big = [tool(properties(4_000, 60))]  # ~400 KB of schema
    wide = [tool(properties(30_000))]
    hi = [{"role": "user", "content": "hi"}]
    return [
        ("chat-tool-400kb", CHAT, chat(tools=big)),
        ("chat-tool-400kb-named", CHAT, chat(tools=big, tool_choice=named())),
        ("chat-tool-30000-properties", CHAT, chat(tools=wide)),
        ("tokenize-tool-400kb", TOKENIZE, {"messages": hi, "tools": big}),
        ("tokenize-tool-30000-properties", TOKENIZE, {"messages": hi, "tools": wide}),
        ("completion-200k-prompts", CMPL, cmpl(prompt=["ab"] * 200_000)),
        ("chat-100k-messages", CHAT, chat(messages=hi * 100_000)),
        ("tokenize-100k-messages", TOKENIZE, {"messages": hi * 100_000}),
    ]


HEAVY = heavy_cases()


@pytest.mark.parametrize(("path", "body"), [c[1:] for c in HEAVY], ids=[c[0] for c in HEAVY])
def test_health_answers_while_a_heavy_request_is_prepared(client: httpx.Client, path: str, body: Any) -> None:
    raw = json.dumps(body).encode()
    assert len(raw) < 4 * 1024 * 1024  # under server.max_body_bytes: the request is prepared, not refused
    with HealthProbe(str(client.base_url), period_s=0.05) as probe:
        r = post(client, path, raw)
    check_answer(r, frozenset({200, 400}))
    assert probe.latencies and probe.worst < HEALTH_BOUND_S, sorted(probe.latencies)[-5:]


FORWARDED = [
    ("untrusted", [], [200, 200, 200, 429, 429]),  # 127.0.0.1 is not a configured proxy: one bucket
    ("trusted", ["127.0.0.1"], [200] * 5),  # a configured proxy: each forwarded client its own bucket
]


@pytest.mark.parametrize(("proxies", "statuses"), [c[1:] for c in FORWARDED], ids=[c[0] for c in FORWARDED])
def test_forwarded_for_counts_only_from_trusted_proxies(proxies: list[str], statuses: list[int]) -> None:
    """With auth off the rate limit is per client address; ``X-Forwarded-For`` changes that address
    only when the connection comes from one of ``server.trusted_proxies`` (none by default)."""
    trusted = "[" + ",".join(proxies) + "]"
    server = start("server.rate_limit_rps=0.01", "server.rate_limit_burst=3", f"server.trusted_proxies={trusted}")
    try:
        got = [
            httpx.post(server.url + TOKENIZE, json={"prompt": "x"}, headers={"x-forwarded-for": f"10.0.0.{i}"})
            for i in range(5)
        ]
        assert [r.status_code for r in got] == statuses, [r.text[:200] for r in got]
    finally:
        server.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_deeply_nested_tool_call_in_the_output_is_plain_content(client: httpx.Client, stream: bool) -> None:
    """The model's text is parsed for tool calls too: a call nested 1,500 deep (forced here by a
    regex) is not a call (its JSON would recurse past Python's limit): the answer is that text."""
    body = chat(tools=[tool({"type": "object"})], regex="<tool_call>\\[{1500}", max_tokens=1600, stream=stream)
    r = client.post(CHAT, json=body)
    check_answer(r, frozenset({200}))
    if stream:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        content = "".join(d.get("content") or "" for d in deltas)
        assert not any("tool_calls" in d for d in deltas)
    else:
        message = r.json()["choices"][0]["message"]
        content = message["content"]
        assert "tool_calls" not in message, message
    assert content == "<tool_call>" + "[" * 1500


BAD_SETTINGS = [
    ("nesting-0", {"max_json_nesting": 0}, "server.max_json_nesting must be in 1..100, got 0"),
    ("nesting-past-ceiling", {"max_json_nesting": 101}, "server.max_json_nesting must be in 1..100, got 101"),
    ("proxy-name", {"trusted_proxies": ["proxy.local"]}, "server.trusted_proxies: 'proxy.local' is not an IP"),
    ("proxy-host-bits", {"trusted_proxies": ["10.0.0.1/8"]}, "server.trusted_proxies: '10.0.0.1/8' is not an IP"),
    ("proxy-star-and-more", {"trusted_proxies": ["*", "10.0.0.1"]}, "server.trusted_proxies: '*' is not an IP"),
]


@pytest.mark.parametrize(("fields", "message"), [c[1:] for c in BAD_SETTINGS], ids=[c[0] for c in BAD_SETTINGS])
def test_bad_limit_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        ServerSettings(**fields)
    assert str(info.value).startswith(message), info.value


def test_good_proxy_settings_are_taken() -> None:
    for proxies in (["*"], ["127.0.0.1", "::1", "10.0.0.0/8", "fd00::/8"]):
        assert ServerSettings(trusted_proxies=proxies).trusted_proxies == proxies


def long_chat(n: int, bad_at: int | None = None) -> dict[str, Any]:
    messages: list[Any] = [{"role": "user", "content": ""} for _ in range(n)]
    if bad_at is not None:
        messages[bad_at] = {"role": "robot", "content": ""}
    return chat(messages=messages, max_tokens=1)


LONG_LISTS = [  # past bodies.ITEM_BY_ITEM (256) the items are validated one at a time: the same answers
    ("257-messages", long_chat(257), 200, None),
    ("257-messages-last-bad", long_chat(257, 256), 400, "messages.256.role"),
    ("257-messages-first-bad", long_chat(257, 0), 400, "messages.0.role"),
    ("300-tools-one-bad", chat(tools=[tool({"type": "object"})] * 299 + [{"type": "fn"}]), 400, "tools.299.type"),
]


@pytest.mark.parametrize(("body", "status", "param"), [c[1:] for c in LONG_LISTS], ids=[c[0] for c in LONG_LISTS])
def test_long_lists_of_messages_and_tools_are_validated_as_before(
    client: httpx.Client, body: dict[str, Any], status: int, param: str | None
) -> None:
    r = client.post(CHAT, json=body)
    check_answer(r, frozenset({status}), param)
    if param is not None:
        assert r.json()["error"]["param"] == param, r.json()
