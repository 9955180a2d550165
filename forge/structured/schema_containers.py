"""Arrays and objects of ``schema_regex``'s compiler: the item and property regexes come from the
compiler (``SchemaCompiler.node``), these functions lay them out.

Arrays: ``prefixItems`` (or draft 7's list-form ``items`` with ``additionalItems``) in order, then
``items`` (any value when absent; ``false``: none), between ``minItems`` and ``maxItems``; a
position whose schema accepts nothing ends the array there. Objects: the ``properties`` in the
order given (then ``required`` names not among them, valued by ``additionalProperties``), each
optional one present or not; without ``properties``, a map whose values follow
``additionalProperties`` (any values nesting one level when it is absent or true)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from forge.structured.schema_numbers import UNBOUNDED_NUMBER
from forge.structured.schema_rules import count, refuse
from forge.structured.schema_strings import escape_literal, string_regex

if TYPE_CHECKING:
    from forge.structured.schema_regex import At, SchemaCompiler

WS = "[ ]?"
SEP = f"{WS},{WS}"
_STRING = string_regex(0, None)
_SCALAR = f"(?:{_STRING}|{UNBOUNDED_NUMBER}|true|false|null)"
_ARRAY = rf"\[{WS}(?:{_SCALAR}(?:{SEP}{_SCALAR})*)?{WS}\]"
_MEMBER = f"{_STRING}{WS}:{WS}(?:{_SCALAR}|{_ARRAY})"
_OBJECT = rf"\{{{WS}(?:{_MEMBER}(?:{SEP}{_MEMBER})*)?{WS}\}}"
ANY_VALUE = f"(?:{_SCALAR}|{_ARRAY}|{_OBJECT})"  # any JSON value nesting at most one level (a subset)


def alt(parts: list[str | None]) -> str | None:
    found = list(dict.fromkeys(p for p in parts if p is not None))
    if not found:
        return None
    return found[0] if len(found) == 1 else "(?:" + "|".join(found) + ")"


def _repeat(item: str, lo: int, hi: int | None) -> str:
    if hi == 0:
        return ""
    return f"(?:{item}){{{lo},{'' if hi is None else hi}}}"


def _item_parts(c: SchemaCompiler, schema: dict[str, Any], at: At) -> tuple[list[Any], Any, str]:
    """The positional schemas, the schema of the rest, and the keyword that names the positions."""
    items, prefix = schema.get("items"), schema.get("prefixItems")
    if isinstance(items, list):
        if prefix is not None:
            raise refuse((*at.path, "items"), "give prefixItems or list-form items, not both")
        return items, schema.get("additionalItems", True), "items"
    if prefix is not None and not isinstance(prefix, list):
        raise refuse((*at.path, "prefixItems"), "prefixItems must be a list of schemas")
    return prefix or [], True if items is None else items, "prefixItems"


def array_regex(c: SchemaCompiler, schema: dict[str, Any], at: At) -> str | None:
    low, high = count(schema, "minItems", at.path) or 0, count(schema, "maxItems", at.path)
    positional, rest, key = _item_parts(c, schema, at)
    regexes: list[str] = []
    for i, sub in enumerate(positional):
        if high is not None and i >= high:
            break
        one = c.node(sub, at.down(key, i))
        if one is None:
            high = i if high is None else min(high, i)
            break
        regexes.append(one)
    item = c.node(rest, at.down("items")) if rest is not False and (high is None or high > len(regexes)) else None
    if item is None or len(regexes) < len(positional):
        high = len(regexes) if high is None else min(high, len(regexes))
    if high is not None and low > high:
        return c.nothing(at, f"minItems={low} but at most {high} items can be written")
    n = len(regexes)
    if item is None:
        tail = ""
    elif n == 0:
        more = _repeat(SEP + item, max(low - 1, 0), None if high is None else high - 1)
        tail = item + more if low > 0 else f"(?:{item}{more})?"
    else:
        tail = _repeat(SEP + item, max(low - n, 0), None if high is None else high - n)
    for i in range(n - 1, -1, -1):
        one = (SEP if i > 0 else "") + regexes[i] + tail
        tail = one if i < low else f"(?:{one})?"
    return rf"\[{WS}{tail}{WS}\]"


def _members(c: SchemaCompiler, schema: dict[str, Any], at: At) -> list[tuple[str, bool]] | None:
    props, required, extra = (
        schema.get("properties", {}),
        schema.get("required", []),
        schema.get("additionalProperties"),
    )
    if not isinstance(props, dict):
        raise refuse((*at.path, "properties"), "properties must be an object")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise refuse((*at.path, "required"), "required must be a list of names")
    if extra is not None and not isinstance(extra, bool | dict):
        raise refuse((*at.path, "additionalProperties"), "additionalProperties must be a schema")
    members = []
    for name in dict.fromkeys([*props, *required]):
        sub = props.get(name, True if extra is None else extra)
        value = c.node(sub, at.down("properties" if name in props else "additionalProperties", name))
        if value is None and name in required:
            c.nothing(at, f"the required property {name[:64]!r} cannot be written")
            return None
        if value is not None:
            key = escape_literal(json.dumps(name, ensure_ascii=False))
            members.append((f"{key}{WS}:{WS}{value}", name in required))
    return members


def _map(c: SchemaCompiler, extra: Any, at: At) -> str:
    value = ANY_VALUE if extra is None or extra is True else c.node(extra, at.down("additionalProperties"))
    if value is None or extra is False:
        return rf"\{{{WS}\}}"
    member = f"{_STRING}{WS}:{WS}{value}"
    return rf"\{{{WS}(?:{member}(?:{SEP}{member})*)?{WS}\}}"


def object_regex(c: SchemaCompiler, schema: dict[str, Any], at: At) -> str | None:
    if not isinstance(schema.get("properties", {}), dict):
        raise refuse((*at.path, "properties"), "properties must be an object")
    if not schema.get("properties") and not schema.get("required"):
        return _map(c, schema.get("additionalProperties"), at)
    members = _members(c, schema, at)
    if members is None:
        return None
    later, first = "", ""  # the members from i on, after some member / as the first one
    for regex, required in reversed(members):
        first = f"{regex}{later}" if required else f"(?:{regex}{later}|{first})" if first else f"(?:{regex}{later})?"
        later = f"{SEP}{regex}{later}" if required else f"(?:{SEP}{regex})?{later}"
    return rf"\{{{WS}{first}{WS}\}}"
