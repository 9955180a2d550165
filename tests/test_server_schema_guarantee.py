"""Constrained output obeys its schema on every path that takes one (issue 40): response_format,
guided_json, structured_outputs, tool_choice named and required, on /v1/completions and
/v1/chat/completions, with both backends; a keyword forge cannot enforce, or a schema no value
satisfies, is a 400 naming the keyword and its place. model=tiny (random weights, sampled at
temperature 1), official ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import openai
import pydantic
import pytest

from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

VALID: list[tuple[str, dict[str, Any]]] = [  # the campaign's schemas (issue 40), and one per keyword family
    (
        "range-1-5",
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 5}}, "required": ["n"]},
    ),
    ("exclusive", {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 4}),
    ("number-bounds", {"type": "number", "minimum": -1.5, "exclusiveMaximum": 2}),
    ("multipleOf", {"type": "integer", "multipleOf": 4, "minimum": -20, "maximum": 40}),
    ("allOf", {"allOf": [{"type": "integer", "minimum": 0}, {"type": "number", "maximum": 9}]}),
    (
        "defs-enum-pattern",
        {
            "$defs": {"Tag": {"type": "string", "pattern": "^[a-z]{2}-\\d$"}},
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "minItems": 1, "maxItems": 2},
                "kind": {"enum": ["a", "b", 3]},
                "when": {"type": "string", "format": "date"},
            },
            "required": ["tags", "kind", "when"],
            "additionalProperties": False,
        },
    ),
]
REFUSED: list[tuple[str, Any, str]] = [  # (case, schema, what the message must name)
    ("enum-empty", {"enum": []}, "#: no value satisfies it"),
    ("anyOf-empty", {"anyOf": []}, "#/anyOf"),
    ("min-above-max", {"type": "integer", "minimum": 5, "maximum": 1}, "minimum/maximum"),
    ("allOf-string-integer", {"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),
    ("not", {"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, "#/properties/a/not"),
    ("patternProperties", {"type": "object", "patternProperties": {"^x": {}}}, "#/patternProperties"),
    ("uniqueItems", {"type": "array", "uniqueItems": True}, "#/uniqueItems"),
    ("multipleOf-unbounded-7", {"type": "integer", "multipleOf": 7}, "#/multipleOf"),
    ("multipleOf-fraction", {"type": "number", "multipleOf": 0.01}, "#/multipleOf"),
    ("format-unknown", {"type": "string", "format": "hostname"}, "#/format"),
    ("pattern-lookahead", {"type": "string", "pattern": "(?=a)b"}, "#/pattern"),
    ("oneOf-overlapping", {"oneOf": [{"type": "integer"}, {"type": "number"}]}, "#/oneOf"),
    ("ref-remote", {"$ref": "https://example.com/s.json"}, "#/$ref"),
    ("draft4-exclusive", {"type": "integer", "minimum": 1, "exclusiveMinimum": True}, "#/exclusiveMinimum"),
]
KW: Any = {"model": "tiny", "max_tokens": 96, "temperature": 1.0, "n": 2}
MSGS: Any = [{"role": "user", "content": "go"}]


def _tool(schema: dict[str, Any]) -> Any:
    return [{"type": "function", "function": {"name": "f", "parameters": schema}}]


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    """Tool parameters must be an object: the schema as its one required property ($defs kept at the top)."""
    inner = {k: v for k, v in schema.items() if k != "$defs"}
    return {"type": "object", "properties": {"v": inner}, "required": ["v"], "$defs": schema.get("$defs", {})}


Path = Callable[[openai.OpenAI, dict[str, Any], int], list[tuple[Any, dict[str, Any]]]]


def response_format(c: openai.OpenAI, schema: dict[str, Any], seed: int) -> list[tuple[Any, dict[str, Any]]]:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = c.chat.completions.create(messages=MSGS, response_format=fmt, seed=seed, **KW)
    return [(json.loads(ch.message.content or ""), schema) for ch in r.choices]


def guided_json(c: openai.OpenAI, schema: dict[str, Any], seed: int) -> list[tuple[Any, dict[str, Any]]]:
    r = c.completions.create(prompt="x", extra_body={"guided_json": schema}, seed=seed, **KW)
    return [(json.loads(ch.text), schema) for ch in r.choices]


def structured_outputs(c: openai.OpenAI, schema: dict[str, Any], seed: int) -> list[tuple[Any, dict[str, Any]]]:
    r = c.completions.create(prompt="x", extra_body={"structured_outputs": {"json": schema}}, seed=seed, **KW)
    return [(json.loads(ch.text), schema) for ch in r.choices]


def named_tool(c: openai.OpenAI, schema: dict[str, Any], seed: int) -> list[tuple[Any, dict[str, Any]]]:
    params = _object(schema)
    choice: Any = {"type": "function", "function": {"name": "f"}}
    r = c.chat.completions.create(messages=MSGS, tools=_tool(params), tool_choice=choice, seed=seed, **KW)
    return [(json.loads(call.function.arguments), params) for ch in r.choices for call in ch.message.tool_calls or []]


def required_tool(c: openai.OpenAI, schema: dict[str, Any], seed: int) -> list[tuple[Any, dict[str, Any]]]:
    params = _object(schema)
    r = c.chat.completions.create(messages=MSGS, tools=_tool(params), tool_choice="required", seed=seed, **KW)
    return [(json.loads(call.function.arguments), params) for ch in r.choices for call in ch.message.tool_calls or []]


PATHS: dict[str, tuple[Path, str]] = {
    "response_format": (response_format, "response_format"),
    "guided_json": (guided_json, "guided_json"),
    "structured_outputs": (structured_outputs, "structured_outputs"),
    "named_tool": (named_tool, "tool_choice"),
    "required_tool": (required_tool, "tool_choice"),
}


@pytest.fixture(scope="module", params=["outlines", "xgrammar"])
def client(request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    cfg = compose_config(["model=tiny", "engine.max_num_seqs=8", f"structured={request.param}"])
    app, _ = app_from_config(cfg, "tiny")
    with BackgroundServer(app) as s:
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
    assert app.state.forge.engine.leak is None and app.state.forge.engine.error is None


@pytest.mark.parametrize("path", list(PATHS))
def test_outputs_validate_on_every_path(client: openai.OpenAI, path: str) -> None:
    call, _ = PATHS[path]
    for _, schema in VALID:
        outputs = [out for seed in (1, 2) for out in call(client, schema, seed)]
        assert len(outputs) >= 4, outputs  # a required tool_choice may make several calls per choice
        for value, against in outputs:
            jsonschema.validate(value, against, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


@pytest.mark.parametrize("case,schema,named", REFUSED, ids=[c[0] for c in REFUSED])
def test_unenforceable_or_unsatisfiable_schemas_are_400(
    client: openai.OpenAI, case: str, schema: Any, named: str
) -> None:
    for path, (call, param) in PATHS.items():
        with pytest.raises(openai.BadRequestError) as info:
            call(client, schema, 1)
        body = info.value.body
        assert isinstance(body, dict), body
        if path.endswith("_tool") and body.get("param") == "tools":
            assert "invalid parameters schema" in str(body.get("message"))  # meta-validation came first
            continue
        assert body.get("param") == param, (path, body)
        inside = {"named_tool": "#/properties/v", "required_tool": "#/$defs/tool0/properties/v"}.get(path, "#")
        assert named.replace("#", inside, 1) in str(body.get("message")), (path, body)


class Addr(pydantic.BaseModel):
    street: str
    zip: int


class Person(pydantic.BaseModel):
    name: str
    home: Addr


def test_required_tool_choice_with_pydantic_defs(client: openai.OpenAI) -> None:
    """Issue 37 item 1: openai's ``pydantic_function_tool`` puts nested models under ``$defs``."""
    tool = openai.pydantic_function_tool(Person)
    kw: Any = {**KW, "max_tokens": 80}
    r = client.chat.completions.create(messages=MSGS, tools=[tool], tool_choice="required", seed=3, **kw)
    calls = [call for ch in r.choices for call in ch.message.tool_calls or []]
    assert calls and all(call.function.name == "Person" for call in calls)
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
