"""The hostile-input table of ``test_server_hostile.py`` (issue 13): one ``Case`` per request.

Bodies are serialized the way Python's ``json`` emits them (``NaN``/``Infinity`` literals,
``\\ud800`` escapes for lone surrogates), unless a case gives the raw bytes itself. Each case names
the statuses the issue allows (400 invalid value, 401 auth, 404 unknown route or model, 405 wrong
method, 413 body too large; 200 where a value is odd but valid) and, for a 400, the ``param``
the error must name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MODEL = "tiny"
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
GENERATE = "/generate"
EMBEDDINGS = "/v1/embeddings"
JSON_TYPE = "application/json"

NAN = float("nan")
INF = float("inf")
I63 = 2**63
I64 = 2**64
BAD = frozenset({400})
OK = frozenset({200})
OK_OR_BAD = frozenset({200, 400})


@dataclass(frozen=True)
class Case:
    """``body`` is sent as JSON unless ``raw`` is given; ``expect`` holds the allowed statuses;
    ``param``: the prefix the error's ``param`` must have (checked on 400s when given)."""

    id: str
    path: str = CMPL
    body: Any = None
    raw: bytes | None = None
    method: str = "POST"
    content_type: str | None = JSON_TYPE
    expect: frozenset[int] = BAD
    param: str | None = None
    authorization: bytes | None = None

    def content(self) -> bytes | None:
        if self.raw is not None:
            return self.raw
        if self.body is None:
            return None
        return json.dumps(self.body).encode("ascii")  # allow_nan and ensure_ascii: Python's defaults

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = []
        if self.content_type and self.method == "POST":
            out.append((b"content-type", self.content_type.encode("ascii")))
        if self.authorization is not None:
            out.append((b"authorization", self.authorization))
        return out


def cmpl(**fields: Any) -> dict[str, Any]:
    """A small valid completion body with ``fields`` changed."""
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **fields}


def sampled(**fields: Any) -> dict[str, Any]:
    """A seeded sampled completion (the sampling path, not greedy's argmax) with ``fields`` changed."""
    return cmpl(**{"temperature": 1.0, "seed": 7, **fields})


def chat(**fields: Any) -> dict[str, Any]:
    """A small valid chat body with ``fields`` changed."""
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def bad(id: str, body: Any, param: str | None, path: str | None = None) -> Case:
    """A 400 naming ``param``; sent to chat completions when the body has messages and no prompt."""
    if path is None:
        path = CHAT if isinstance(body, dict) and "messages" in body and "prompt" not in body else CMPL
    return Case(id, path, body, param=param)


def numeric_cases() -> list[Case]:
    """Non-finite, subnormal, tiny and huge numbers in every numeric field (issue 13 item 1)."""
    out: list[Case] = []
    for name, value in [("nan", NAN), ("inf", INF), ("-inf", -INF), ("1e300", 1e300)]:
        out.append(bad(f"temperature={name}", sampled(temperature=value), "temperature"))
        out.append(bad(f"chat-temperature={name}", chat(temperature=value, seed=1), "temperature"))
    for name, value in [("1e-300", 1e-300), ("1e-45", 1e-45), ("5e-324", 5e-324)]:  # rejected, or clamped as vLLM does
        out.append(Case(f"temperature={name}", body=sampled(temperature=value), expect=OK_OR_BAD, param="temperature"))
        out.append(
            Case(
                f"chat-temperature={name}", CHAT, chat(temperature=value, seed=1), expect=OK_OR_BAD, param="temperature"
            )
        )
    out.append(bad("temperature=nan-stream", sampled(temperature=NAN, stream=True), "temperature"))
    for field in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        for name, value in [("nan", NAN), ("inf", INF)]:
            out.append(bad(f"{field}={name}", sampled(**{field: value}), field))
            out.append(bad(f"{field}={name}-greedy", cmpl(temperature=0, **{field: value}), field))
    for name, body in [
        ("1e-300", sampled(repetition_penalty=1e-300)),
        ("1e-45", sampled(repetition_penalty=1e-45)),
        ("1e-300-greedy", cmpl(temperature=0, repetition_penalty=1e-300)),
    ]:
        out.append(Case(f"repetition_penalty={name}", body=body, expect=OK_OR_BAD, param="repetition_penalty"))
    out.append(bad("repetition_penalty=1e300", sampled(repetition_penalty=1e300), "repetition_penalty"))
    out.append(bad("presence_penalty=-inf", sampled(presence_penalty=-INF), "presence_penalty"))
    out.append(Case("presence_penalty=1e-300", body=sampled(presence_penalty=1e-300), expect=OK_OR_BAD))
    out.append(Case("frequency_penalty=-1e-45", body=sampled(frequency_penalty=-1e-45), expect=OK_OR_BAD))
    out.append(bad("chat-frequency_penalty=nan", chat(frequency_penalty=NAN), "frequency_penalty"))
    out.append(bad("top_p=nan", sampled(top_p=NAN), "top_p"))
    out.append(bad("top_p=inf", sampled(top_p=INF), "top_p"))
    out.append(Case("top_p=1e-300", body=sampled(top_p=1e-300), expect=OK_OR_BAD, param="top_p"))
    out.append(bad("min_p=nan", sampled(min_p=NAN), "min_p"))
    out.append(bad("min_p=-inf", sampled(min_p=-INF), "min_p"))
    out.append(Case("min_p=1e-300", body=sampled(min_p=1e-300), expect=OK_OR_BAD, param="min_p"))
    out.append(Case("top_k=2^63", body=sampled(top_k=I63), expect=OK_OR_BAD, param="top_k"))
    out.append(bad("top_k=-2^63", sampled(top_k=-I63), "top_k"))
    out.append(bad("top_k=1.5", sampled(top_k=1.5), "top_k"))
    return out


def int_cases() -> list[Case]:
    """Huge, negative and mistyped integers: max_tokens, n, logprobs, seeds, priority."""
    out = [
        bad("max_tokens=0", cmpl(max_tokens=0), "max_tokens"),
        bad("max_tokens=-1", cmpl(max_tokens=-1), "max_tokens"),
        bad("max_tokens=2^63", cmpl(max_tokens=I63), "max_tokens"),
        bad("max_tokens=2^64", cmpl(max_tokens=I64), "max_tokens"),
        bad("max_tokens=-2^63", cmpl(max_tokens=-I63), "max_tokens"),
        bad("max_tokens=1e9", cmpl(max_tokens=10**9), "max_tokens"),
        bad("max_tokens=float", cmpl(max_tokens=4.0), "max_tokens"),
        bad("max_tokens=str", cmpl(max_tokens="4"), "max_tokens"),
        bad("max_tokens=bool", cmpl(max_tokens=True), "max_tokens"),
        bad("chat-max_completion_tokens=0", chat(max_completion_tokens=0), "max"),
        bad("chat-max_tokens=2^64", chat(max_tokens=I64), "max_tokens"),
        bad("n=10^6", cmpl(n=10**6), "n"),
        bad("n=2^63", cmpl(n=I63), "n"),
        bad("n=0", cmpl(n=0), "n"),
        bad("n=-1", cmpl(n=-1), "n"),
        bad("chat-n=10^6", chat(n=10**6), "n"),
        bad("logprobs=10^6", cmpl(logprobs=10**6), "logprobs"),
        bad("logprobs=2^63", cmpl(logprobs=I63), "logprobs"),
        bad("logprobs=-1", cmpl(logprobs=-1), "logprobs"),
        bad("chat-top_logprobs=10^6", chat(logprobs=True, top_logprobs=10**6), None),
        bad("chat-top_logprobs=-1", chat(logprobs=True, top_logprobs=-1), None),
        bad("chat-logprobs=int", chat(logprobs=5), "logprobs"),
        bad("seed=float", sampled(seed=1.5), "seed"),
        bad("seed=str", sampled(seed="7"), "seed"),
        bad("priority=str", cmpl(priority="high"), "priority"),
        Case("max_tokens=5000-digits", raw=b'{"model":"tiny","prompt":"x","max_tokens":' + b"9" * 5000 + b"}"),
    ]
    for name, seed in [("2^63", I63), ("2^64", I64), ("-1", -1), ("-2^63-1", -I63 - 1), ("2^63-1", I63 - 1)]:
        out.append(Case(f"seed={name}", body=sampled(seed=seed), expect=OK_OR_BAD, param="seed"))
    out.append(Case("chat-seed=2^64", CHAT, chat(temperature=1.0, seed=I64), expect=OK_OR_BAD, param="seed"))
    out.append(Case("priority=2^64", body=cmpl(priority=I64), expect=OK_OR_BAD, param="priority"))
    return out


SURROGATE = "a\ud800b"


def text_cases() -> list[Case]:
    """Lone surrogates, empty and wrongly typed prompts, messages and stop strings (items 3, 9)."""
    msgs = [{"role": "user", "content": SURROGATE}]
    return [
        bad("surrogate-prompt", cmpl(prompt=SURROGATE), "prompt"),
        bad("surrogate-prompt-list", cmpl(prompt=["ok", SURROGATE]), "prompt"),
        bad("surrogate-prompt-stream", cmpl(prompt=SURROGATE, stream=True), "prompt"),
        bad("surrogate-low-prompt", cmpl(prompt="\udc00"), "prompt"),
        bad("surrogate-chat", chat(messages=msgs), "messages", CHAT),
        bad(
            "surrogate-chat-part",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": SURROGATE}]}]),
            "messages",
            CHAT,
        ),
        bad(
            "surrogate-chat-system",
            chat(messages=[{"role": "system", "content": SURROGATE}, {"role": "user", "content": "x"}]),
            "messages",
            CHAT,
        ),
        bad("surrogate-tokenize-prompt", {"prompt": SURROGATE}, "prompt", TOKENIZE),
        bad("surrogate-tokenize-messages", {"messages": msgs}, "messages", TOKENIZE),
        Case("surrogate-model", body=cmpl(model=SURROGATE), expect=frozenset({400, 404})),
        Case("surrogate-stop", body=cmpl(stop=[SURROGATE]), expect=OK_OR_BAD, param="stop"),
        Case("surrogate-user", body=cmpl(user=SURROGATE), expect=OK_OR_BAD, param="user"),
        Case("surrogate-pair-ok", body=cmpl(prompt="a\ud83d\ude00b"), expect=OK),
        Case("nul-and-controls-ok", body=cmpl(prompt="a\x00\x01\x1bb"), expect=OK),
        bad("prompt-empty", cmpl(prompt=""), "prompt"),
        bad("prompt-empty-list", cmpl(prompt=[]), "prompt"),
        bad("prompt-empty-nested", cmpl(prompt=[[]]), "prompt"),
        bad("prompt-list-with-empty", cmpl(prompt=["a", ""]), "prompt"),
        bad("prompt-dict", cmpl(prompt={"text": "x"}), "prompt"),
        bad("prompt-mixed-list", cmpl(prompt=[1, "a"]), "prompt"),
        bad("prompt-floats", cmpl(prompt=[1.5, 2.0]), "prompt"),
        bad("prompt-bool", cmpl(prompt=True), "prompt"),
        bad("prompt-null", cmpl(prompt=None), "prompt"),
        bad("prompt-token-negative", cmpl(prompt=[1, -1]), "prompt"),
        bad("prompt-token-2^63", cmpl(prompt=[I63]), "prompt"),
        bad("prompt-token-2^64", cmpl(prompt=[[1], [I64]]), "prompt"),
        bad("messages-empty", chat(messages=[]), "messages", CHAT),
        bad("messages-dict", chat(messages={"role": "user", "content": "x"}), "messages", CHAT),
        bad("messages-no-role", chat(messages=[{"content": "x"}]), "messages", CHAT),
        bad("messages-role-null", chat(messages=[{"role": None, "content": "x"}]), "messages", CHAT),
        bad("messages-content-int", chat(messages=[{"role": "user", "content": 5}]), "messages", CHAT),
        bad(
            "messages-part-text-int",
            chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            "messages",
            CHAT,
        ),
        bad("messages-string-items", chat(messages=["hi"]), "messages", CHAT),
        Case("messages-empty-content", CHAT, chat(messages=[{"role": "user", "content": ""}]), expect=OK),
        bad("stop-int", cmpl(stop=5), "stop"),
        bad("stop-int-list", cmpl(stop=[1, 2]), "stop"),
        bad("stop-empty-string", cmpl(stop=[""]), "stop"),
        bad("stop-17", cmpl(stop=[f"s{i}" for i in range(17)]), "stop"),
        bad("stop_token_ids-str", cmpl(stop_token_ids=["a"]), "stop_token_ids"),
        bad("stop_token_ids-2^63", cmpl(stop_token_ids=[I63]), "stop_token_ids"),
        bad("stream-str", cmpl(stream="yes"), "stream"),
        bad("stream_options-str", cmpl(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
        bad("echo-str", cmpl(echo="yes"), "echo"),
        bad("ignore_eos-str", cmpl(ignore_eos="true"), "ignore_eos"),
        bad("user-int", cmpl(user=5), "user"),
        bad("model-int", cmpl(model=5), "model"),
        bad("model-missing", {"prompt": "x", "max_tokens": 4}, "model"),
        Case("unknown-field-ignored", body=cmpl(frobnicate={"a": [1, 2]}), expect=OK_OR_BAD),
        bad("logit_bias-bad-key", cmpl(logit_bias={"abc": 1}), "logit_bias"),
        bad("logit_bias-nan", cmpl(logit_bias={"1": NAN}), "logit_bias"),
        bad("logit_bias-negative-id", cmpl(logit_bias={"-1": 5}), "logit_bias"),
        bad("logit_bias-huge-id", cmpl(logit_bias={str(I64): 5}), "logit_bias"),
        bad("logit_bias-1e300", cmpl(logit_bias={"1": 1e300}), "logit_bias"),
        bad("logit_bias-list", cmpl(logit_bias=[1, 2]), "logit_bias"),
        bad("logit_bias-str-value", cmpl(logit_bias={"1": "up"}), "logit_bias"),
    ]


def format_cases() -> list[Case]:
    """Malformed structured-output requests that are cheap to reject (the pathological ones that
    need the compile budget are ``PATHOLOGICAL_GRAMMARS`` in the test module)."""
    return [
        bad("response_format-str", cmpl(response_format="json"), "response_format"),
        bad("response_format-no-schema", cmpl(response_format={"type": "json_schema"}), "response_format"),
        bad(
            "response_format-schema-int",
            cmpl(response_format={"type": "json_schema", "json_schema": {"schema": 5}}),
            "response_format",
        ),
        bad("response_format-bad-type", cmpl(response_format={"type": "yaml"}), "response_format"),
        bad("json_schema-bogus-type", cmpl(json_schema={"type": "bogus"}), "json_schema"),
        bad("json_schema-false", cmpl(json_schema=False, max_tokens=8), "json_schema"),
        bad("json_schema-list", cmpl(json_schema=[1, 2]), "json_schema"),
        bad("regex-unclosed", cmpl(regex="(unclosed"), "regex"),
        bad("regex-bad-escape", cmpl(regex="\\"), "regex"),
        bad("regex-int", cmpl(regex=5), "regex"),
        bad("regex-and-schema", cmpl(regex="a", json_schema={"type": "string"}), "regex"),
    ]


def body_cases() -> list[Case]:
    """Bodies that are not a request at all: malformed JSON, wrong types, wrong content types."""
    deep = b"[" * 100_000
    deep_field = b'{"model":"tiny","prompt":"x","json_schema":' + b'{"a":' * 20_000 + b"1" + b"}" * 20_000 + b"}"
    return [
        Case("json-truncated", raw=b'{"model": "tiny", "prompt": '),
        Case("json-empty-body", raw=b""),
        Case("json-trailing-garbage", raw=b'{"model":"tiny","prompt":"x","max_tokens":2} xyz'),
        Case("json-single-quotes", raw=b"{'model': 'tiny'}"),
        Case("json-array", raw=b"[1, 2]"),
        Case("json-null", raw=b"null"),
        Case("json-string", raw=b'"hello"'),
        Case("json-number", raw=b"123"),
        Case("json-empty-object", raw=b"{}"),
        Case("json-invalid-utf8", raw=b'{"model":"tiny","prompt":"\xff\xfe","max_tokens":2}'),
        Case("json-utf16", raw='{"model":"tiny","prompt":"x","max_tokens":2}'.encode("utf-16"), expect=OK_OR_BAD),
        Case("json-deeply-nested", raw=deep),
        Case("json-deeply-nested-field", raw=deep_field),
        Case("json-chat-truncated", CHAT, raw=b'{"model":"tiny","messages":[{"role":'),
        Case("json-tokenize-garbage", TOKENIZE, raw=b"\x00\x01\x02"),
        Case("json-detokenize-truncated", DETOKENIZE, raw=b'{"tokens":[1,2'),
        Case("ctype-text-plain", body=cmpl(), content_type="text/plain", expect=frozenset({400, 415})),
        Case(
            "ctype-form",
            raw=b"model=tiny&prompt=x",
            content_type="application/x-www-form-urlencoded",
            expect=frozenset({400, 415}),
        ),
        Case(
            "ctype-multipart",
            raw=b"--b\r\n\r\nx\r\n--b--\r\n",
            content_type="multipart/form-data; boundary=b",
            expect=frozenset({400, 415}),
        ),
        Case("ctype-missing", body=cmpl(), content_type=None, expect=frozenset({200, 400, 415})),
        Case("ctype-chat-xml", CHAT, raw=b"<messages/>", content_type="application/xml", expect=frozenset({400, 415})),
        bad("tokenize-empty", {}, "prompt", TOKENIZE),
        bad("tokenize-both", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt", TOKENIZE),
        bad("tokenize-prompt-int", {"prompt": 5}, "prompt", TOKENIZE),
        bad("detokenize-negative", {"tokens": [-1]}, "tokens", DETOKENIZE),
        bad("detokenize-2^63", {"tokens": [I63]}, "tokens", DETOKENIZE),
        bad("detokenize-2^64", {"tokens": [1, I64]}, "tokens", DETOKENIZE),
        bad("detokenize-str", {"tokens": "abc"}, "tokens", DETOKENIZE),
        bad("detokenize-float", {"tokens": [1.5]}, "tokens", DETOKENIZE),
        bad("detokenize-int-as-str", {"tokens": ["5"]}, "tokens", DETOKENIZE),
        bad("detokenize-int-as-float", {"tokens": [72, 5.0]}, "tokens", DETOKENIZE),
        bad("detokenize-bool", {"tokens": [True]}, "tokens", DETOKENIZE),
        bad("detokenize-unknown-field", {"tokens": [72], "frobnicate": 1}, "frobnicate", DETOKENIZE),
        bad("tokenize-unknown-field", {"prompt": "x", "frobnicate": 1}, "frobnicate", TOKENIZE),
        bad("tokenize-chat_template", {"prompt": "x", "chat_template": "{{ 1 }}"}, "chat_template", TOKENIZE),
        bad(
            "tokenize-add_special_tokens-str",
            {"prompt": "x", "add_special_tokens": "false"},
            "add_special_tokens",
            TOKENIZE,
        ),
        Case("detokenize-100k-ids", DETOKENIZE, {"tokens": [72] * 100_000}, expect=OK),
    ]


def route_cases() -> list[Case]:
    """Unknown routes and wrong methods answer in OpenAI's shape (item 9)."""

    def get(id: str, path: str, expect: frozenset[int], method: str = "GET") -> Case:
        return Case(id, path, method=method, content_type=None, expect=expect)

    not_found, not_allowed = frozenset({404}), frozenset({405})
    return [
        get("route-unknown", "/v1/nope", not_found),
        get("route-root", "/", not_found),
        get("route-engines", "/v1/engines", not_found),
        Case("route-post-unknown", "/v1/completions/extra", cmpl(), expect=not_found),
        get("route-dotdot", "/v1/../../etc/passwd", not_found),
        get("route-long-path", "/v1/" + "x" * 8000, not_found),
        get("route-percent", "/v1/%ff%00", not_found),
        get("method-get-completions", CMPL, not_allowed),
        get("method-put-chat", CHAT, not_allowed, "PUT"),
        get("method-delete-health", "/health", not_allowed, "DELETE"),
        get("method-get-tokenize", TOKENIZE, not_allowed),
        get("method-post-health", "/health", not_allowed, "POST"),
        get("method-patch-models", "/v1/models", not_allowed, "PATCH"),
        get("method-options-completions", CMPL, frozenset({200, 204, 405}), "OPTIONS"),
        get("model-retrieve", "/v1/models/tiny", frozenset({200, 404})),
        get("models-junk-query", "/v1/models?x=%ff&&=", OK),
        get("head-health", "/health", OK, "HEAD"),
        get("head-metrics", "/metrics", frozenset({200, 405}), "HEAD"),
    ]


def store_id_cases() -> list[Case]:
    """Ids of files and batches that name no file: too long for the file system, path characters,
    non-ASCII letters and digits, control characters (issue 40): each a 404, never a 500."""
    ids = {
        "long": "a" * 400,
        "long-unicode": "ß" * 200,
        "65": "1" * 65,
        "fullwidth-digits": "１２３",
        "letter-a-umlaut": "ä",
        "dotdot": "..%2F..%2Fetc%2Fpasswd",
        "nul": "a%00b",
        "u2028": "a%E2%80%A8",
        "dot": ".",
        "empty": "",
    }

    def missing(id: str, path: str, method: str) -> Case:
        return Case(id, path, method=method, content_type=None, expect=frozenset({404}))

    cases = []
    for name, tail in ids.items():
        file, batch = f"/v1/files/file-{tail}", f"/v1/batches/batch_{tail}"
        cases += [
            missing(f"file-id-{name}", file, "GET"),
            missing(f"file-content-id-{name}", f"{file}/content", "GET"),
            missing(f"file-delete-id-{name}", file, "DELETE"),
            missing(f"batch-id-{name}", batch, "GET"),
            missing(f"batch-cancel-id-{name}", f"{batch}/cancel", "POST"),
        ]
    return cases


def bearer_cases() -> list[Case]:
    """With auth off, any bearer token is ignored: made-up, non-ASCII, huge (items 4, 5)."""
    body = {"prompt": "abc"}
    return [
        Case("auth-off-bogus-bearer", TOKENIZE, body, expect=OK, authorization=b"Bearer made-up-1"),
        Case("auth-off-non-ascii-bearer", TOKENIZE, body, expect=OK, authorization="Bearer ключ".encode()),
        Case("auth-off-latin1-bearer", TOKENIZE, body, expect=OK, authorization=b"Bearer \xff\xfe"),
        Case("auth-off-basic", CMPL, cmpl(), expect=OK, authorization=b"Basic dXNlcjpwYXNz"),
        Case("auth-off-4k-bearer", CMPL, cmpl(), expect=OK, authorization=b"Bearer " + b"k" * 4096),
    ]


def budget_cases() -> list[Case]:
    """Requests whose output would be too large to hold (issue 40): 400 before they run (server.max_output_units)."""
    prompts = [f"prompt {i}" for i in range(16)]
    long = ["x" * 1000 for _ in range(16)]
    return [
        bad("budget-16x16-logprobs20-300", cmpl(prompt=prompts, n=16, logprobs=20, max_tokens=300), "max_tokens"),
        bad("budget-best_of16", cmpl(prompt=prompts, best_of=16, logprobs=20, max_tokens=300), "max_tokens"),
        bad("budget-echo-prompt_logprobs", cmpl(prompt=long, n=16, echo=True, prompt_logprobs=20), "max_tokens"),
    ]


CASES: tuple[Case, ...] = (
    *numeric_cases(),
    *int_cases(),
    *text_cases(),
    *format_cases(),
    *body_cases(),
    *route_cases(),
    *bearer_cases(),
    *budget_cases(),
)


# -- issue 40: JSON nested past server.max_json_nesting (64), in the body or in JSON text a body carries
DEEP = 950  # the campaign's depth for schemas (Python's recursion limit is 1000)
DEEPEST = 100_000  # and for whole bodies
SLOT = "@@deep@@"


def deep_schema(levels: int) -> str:
    """A valid JSON schema whose text nests ``levels`` deep (odd: a chain of ``properties``)."""
    half = (levels - 1) // 2
    return '{"type":"object","properties":{"a":' * half + '{"type":"string"}' + "}}" * half


def items_schema(levels: int) -> str:
    """A valid JSON schema whose text nests exactly ``levels`` deep (a chain of array ``items``)."""
    return '{"type":"array","items":' * (levels - 1) + '{"type":"string"}' + "}" * (levels - 1)


def deep_array(levels: int) -> str:
    """``[[...[1]...]]``, ``levels`` deep."""
    return "[" * levels + "1" + "]" * levels


def with_deep(body: dict[str, Any], text: str, as_string: bool = False) -> bytes:
    """``body`` as JSON with the value ``"@@deep@@"`` replaced by the JSON text ``text`` (or by a
    string holding it): no JSON encoder can write such a body, it recurses."""
    value = json.dumps(text) if as_string else text
    return json.dumps(body).replace(json.dumps(SLOT), value).encode()


def tool(parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def named(name: str = "f") -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def call_message(arguments: Any) -> list[dict[str, Any]]:
    """A chat whose assistant turn made a call with ``arguments`` (JSON text), and its result."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
    ]


@dataclass(frozen=True)
class Deep:
    """A body nested past the limit (``raw``); ``param``: what the 400 must name (None: the body)."""

    id: str
    path: str
    raw: bytes
    param: str | None = None
    content_type: str = JSON_TYPE


def nesting_cases() -> list[Deep]:
    schema, array = deep_schema(DEEP), deep_array(DEEPEST)
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": SLOT}}
    msgs = call_message(SLOT)
    return [
        Deep("body-100k", CMPL, with_deep(cmpl(prompt=SLOT), array)),
        Deep("body-100k-unclosed", CMPL, b"[" * DEEPEST),
        Deep("generate-100k", GENERATE, with_deep({"prompt": SLOT}, array)),
        Deep("generate-100k-form-type", GENERATE, with_deep({"prompt": SLOT}, array), content_type="text/plain"),
        Deep("response_format-950", CMPL, with_deep(cmpl(response_format=rf), schema)),
        Deep("json_schema-950", CMPL, with_deep(cmpl(json_schema=SLOT), schema)),
        Deep("guided_json-950", CMPL, with_deep(cmpl(guided_json=SLOT), schema)),
        Deep("guided_json-text-100k", CMPL, with_deep(cmpl(guided_json=SLOT), array, True), "guided_json"),
        Deep("structured_outputs-950", CMPL, with_deep(cmpl(structured_outputs={"json": SLOT}), schema)),
        Deep(
            "structured_outputs-text-100k",
            CMPL,
            with_deep(cmpl(structured_outputs={"json": SLOT}), array, True),
            "structured_outputs",
        ),
        Deep("tools-950", CHAT, with_deep(chat(tools=[tool(SLOT)]), schema)),
        Deep("tools-named-950", CHAT, with_deep(chat(tools=[tool(SLOT)], tool_choice=named()), schema)),
        Deep("tools-required-950", CHAT, with_deep(chat(tools=[tool(SLOT)], tool_choice="required"), schema)),
        Deep("tool-call-arguments-100k", CHAT, with_deep(chat(messages=msgs), array, True), "messages.1.tool_calls"),
        Deep("tokenize-tools-950", TOKENIZE, with_deep({"messages": msgs[:1], "tools": [tool(SLOT)]}, schema)),
        Deep(
            "tokenize-tool-call-arguments-100k",
            TOKENIZE,
            with_deep({"messages": msgs}, array, True),
            "messages.1.tool_calls",
        ),
        Deep("detokenize-100k", DETOKENIZE, with_deep({"tokens": SLOT}, array)),
        Deep("embeddings-100k", EMBEDDINGS, with_deep({"model": MODEL, "input": SLOT}, array)),
    ]


NESTING_CASES: tuple[Deep, ...] = tuple(nesting_cases())

# sent by test_server_store_hostile.py to a server whose state dir holds files and batches (an id
# too long for the file system only fails once the directory it would be looked up in exists)
STORE_ID_CASES: tuple[Case, ...] = tuple(store_id_cases())
