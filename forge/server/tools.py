"""Tool calling: what a chat request's ``tools`` / ``tool_choice`` ask for (``ToolPlan``) and how
tool calls are read back from the model's text (``ToolCallParser``, one per model family's
format, chosen by ``server.tool_call_parser``).

``tool_choice``: ``none`` -- the tools reach the template, no call is read back; ``auto`` (the
default with tools) -- free text, read by the parser; ``required`` / a named function -- the
output is constrained by a JSON schema through forge's structured output (vLLM's shapes: the
arguments object for a named function, ``[{"name", "parameters"}, ...]`` for ``required``), so
every call parses and its arguments validate."""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from forge.server.json_nesting import MAX_JSON_NESTING_CEILING, check_nesting
from forge.server.protocol import APIError, ChatCompletionRequest, ToolDef
from forge.structured.base import ConstraintSpec


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object

    def body(self, index: int | None = None) -> dict[str, Any]:
        """OpenAI's ``tool_calls`` entry (``index``: the streamed form's)."""
        out: dict[str, Any] = {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return out if index is None else {"index": index, **out}


def _loads(text: str) -> Any:
    """``json.loads`` of the model's text; ValueError for text nested deeper than any JSON the server
    takes (parsing it would reach Python's recursion limit)."""
    check_nesting(text, MAX_JSON_NESTING_CEILING, "the tool call")
    return json.loads(text)


def _raw_decode(text: str) -> tuple[Any, int]:
    """``JSONDecoder.raw_decode`` with ``_loads``' nesting check."""
    check_nesting(text, MAX_JSON_NESTING_CEILING, "the tool call")
    return json.JSONDecoder().raw_decode(text)


def _call(obj: Any, args_key: str = "arguments") -> ToolCall:
    """A ``{"name", "arguments"}`` object as a call; ValueError if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("a tool call needs a name")
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        args = _loads(args)
    if not isinstance(args, dict):
        raise ValueError("tool call arguments must be an object")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolCallParser(ABC):
    """Reads tool calls from a model's output. Contract: ``start(text)`` is where tool-call text
    begins (None: nowhere yet); ``hold(text)`` how many trailing characters may be the start of
    one (held back while streaming); ``calls(tool_text)`` parses the text from ``start`` on, or
    raises ValueError (the whole output is then plain content)."""

    marker: str

    def start(self, text: str) -> int | None:
        at = text.find(self.marker)
        return None if at < 0 else at

    def hold(self, text: str) -> int:
        for k in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if text.endswith(self.marker[:k]):
                return k
        return 0

    @abstractmethod
    def calls(self, tool_text: str) -> list[ToolCall]: ...

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The output split into content and calls (no calls if it holds none that parse)."""
        at = self.start(text)
        if at is None:
            return text, []
        try:
            found = self.calls(text[at:])
        except ValueError:
            return text, []
        return (text[:at], found) if found else (text, [])


class HermesParser(ToolCallParser):
    """Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, repeated."""

    marker = "<tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def calls(self, tool_text: str) -> list[ToolCall]:
        return [_call(_loads(body)) for body in self._block.findall(tool_text)]


class Llama3JsonParser(ToolCallParser):
    """Llama 3.x: the output is ``{"name": ..., "parameters": {...}}`` (optionally after
    ``<|python_tag|>``), several separated by ``;``."""

    marker = "<|python_tag|>"

    def start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith("{"):
            return len(text) - len(stripped)
        return super().start(text)

    def hold(self, text: str) -> int:
        return len(text) if not text.strip() else super().hold(text)

    def calls(self, tool_text: str) -> list[ToolCall]:
        rest = tool_text.removeprefix(self.marker).strip()
        out = []
        while rest:
            obj, end = _raw_decode(rest)
            out.append(_call(obj, "parameters"))
            rest = rest[end:].strip().removeprefix(";").strip()
        return out


class MistralParser(ToolCallParser):
    """Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``."""

    marker = "[TOOL_CALLS]"

    def calls(self, tool_text: str) -> list[ToolCall]:
        obj, _ = _raw_decode(tool_text.removeprefix(self.marker).strip())
        return [_call(x) for x in (obj if isinstance(obj, list) else [obj])]


PARSERS: dict[str, type[ToolCallParser]] = {
    "hermes": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """What one request's tools ask for; ``spec`` constrains the output (required / named)."""

    mode: Mode
    tools: list[dict[str, Any]]
    parallel: bool
    parser: ToolCallParser | None
    spec: ConstraintSpec | None = None
    name: str | None = None

    @property
    def reads_calls(self) -> bool:
        return self.mode != "none"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """The finished output split into content and calls."""
        if self.mode == "named" and self.name is not None:
            try:
                return "", [_call({"name": self.name, "arguments": _loads(text)})]
            except ValueError:
                return text, []
        if self.mode == "required":
            try:
                items = _loads(text)
                return "", [_call(x, "parameters") for x in items]
            except (ValueError, TypeError):
                return text, []
        if self.mode == "auto" and self.parser is not None:
            content, found = self.parser.parse(text)
            return content, found if self.parallel else found[:1]
        return text, []


def _parameters(tool: ToolDef) -> dict[str, Any]:
    params = tool.function.parameters if tool.function.parameters is not None else {"type": "object"}
    try:
        jsonschema.validators.validator_for(params).check_schema(params)
    except jsonschema.SchemaError as exc:
        raise APIError(
            f"tools: function {tool.function.name!r} has an invalid parameters schema: {exc.message}", param="tools"
        ) from exc
    return params


_VALUES = frozenset({"enum", "const", "default", "examples"})  # keywords whose values are data, not schemas
_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})


def _rebased(schema: Any, base: str) -> Any:
    """A copy of ``schema`` whose local ``$ref``s (``#/...``) point under ``base`` (a JSON pointer)."""
    out: Any = {} if isinstance(schema, dict) else [] if isinstance(schema, list) else schema
    todo = [(schema, out, False)]  # (source, its copy, whether the source maps names to schemas)
    while todo:
        src, dst, is_map = todo.pop()
        pairs = src.items() if isinstance(src, dict) else enumerate(src)
        for key, value in pairs:
            if isinstance(dst, dict) and not is_map and key == "$ref" and isinstance(value, str):
                copy: Any = base + value[1:] if value.startswith("#") else value
            elif isinstance(value, dict | list) and (is_map or key not in _VALUES or isinstance(dst, list)):
                copy = {} if isinstance(value, dict) else []
                todo.append((value, copy, isinstance(dst, dict) and not is_map and key in _SCHEMA_MAPS))
            else:
                copy = value
            if isinstance(dst, dict):
                dst[key] = copy
            else:
                dst.append(copy)
    return out


def required_schema(params: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """vLLM's schema for ``tool_choice: "required"``: ``[{"name", "parameters"}, ...]``. Each
    function's parameters go under ``$defs`` with their references rebased there, so a
    ``#/$defs/...`` of pydantic's (``openai.pydantic_function_tool``) still resolves."""
    defs = {f"tool{i}": _rebased(p, f"#/$defs/tool{i}") for i, p in enumerate(params.values())}
    calls = [
        {
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": {"$ref": f"#/$defs/tool{i}"}},
            "required": ["name", "parameters"],
        }
        for i, name in enumerate(params)
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}, "$defs": defs}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def tool_plan(body: ChatCompletionRequest, parser_name: str | None) -> ToolPlan | None:
    """The request's tool plan (None without tools); 400 for a choice that names no given tool,
    ``tool_choice`` without ``tools``, or a bad parameters schema."""
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise APIError("tool_choice needs tools", param="tool_choice")
        return None
    names = [t.function.name for t in body.tools]
    if len(set(names)) != len(names):
        raise APIError("tools: function names must be unique", param="tools")
    params = {t.function.name: _parameters(t) for t in body.tools}
    tools = [t.model_dump(exclude_none=True) for t in body.tools]
    parser = PARSERS[parser_name]() if parser_name is not None else None
    if choice is None or choice == "auto":
        if parser is None:
            raise APIError("tool_choice auto needs a tool-call parser (server.tool_call_parser)", param="tool_choice")
        return ToolPlan("auto", tools, body.parallel_tool_calls, parser)
    if choice == "none":
        return ToolPlan("none", tools, body.parallel_tool_calls, parser)
    if choice == "required":
        spec = ConstraintSpec.json_schema(required_schema(params, body.parallel_tool_calls))
        return ToolPlan("required", tools, body.parallel_tool_calls, parser, spec)
    name = choice.function.name
    if name not in params:
        raise APIError(f"tool_choice names function {name[:64]!r}, which is not in tools", param="tool_choice")
    spec = ConstraintSpec.json_schema(params[name])
    return ToolPlan("named", tools, body.parallel_tool_calls, parser, spec, name)


class ToolStream:
    """One streamed choice's text under a plan: ``push`` returns the content that may be sent
    now (text that may begin a tool call is held back; everything from a call's start on, and the
    whole output of a required/named choice, is kept for ``finish``)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text = ""
        self.sent = 0
        self.tool_at: int | None = None

    def push(self, piece: str) -> str:
        self.text += piece
        parser = self.plan.parser
        if self.plan.mode in ("required", "named") or self.tool_at is not None:
            return ""
        if self.plan.mode == "none" or parser is None:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        self.tool_at = parser.start(self.text)
        limit = self.tool_at if self.tool_at is not None else len(self.text) - parser.hold(self.text)
        out = self.text[self.sent : max(limit, self.sent)]
        self.sent = max(limit, self.sent)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not sent yet and the calls, once the choice has ended."""
        content, found = self.plan.parse(self.text)
        if found:
            return content[self.sent :], found
        return self.text[self.sent :], []
