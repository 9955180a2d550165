"""The JSON Schema keywords forge enforces when it constrains output, and how their values are read.

Every keyword of a schema is in ``SUPPORTED`` (enforced by the grammar) or ``ANNOTATIONS`` (no
effect on which values are valid), or the schema is refused with a ``SchemaRefused`` naming the
keyword and its place (a JSON pointer), as OpenAI's strict mode refuses what it cannot enforce.
A keyword whose value forge cannot read (``minimum: "1"``, draft 4's boolean
``exclusiveMinimum``) is refused the same way."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from forge.structured.base import GrammarError

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$comment", "deprecated", "readOnly", "writeOnly"}
    | {"$defs", "definitions", "discriminator"}
    # OpenAI's function-level flag, often found inside ``parameters`` (vLLM's own tests put it there): not
    # a JSON Schema keyword, so it restricts no value
    | {"strict"}
)
GENERIC = frozenset({"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"})
NUMERIC = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
STRING = frozenset({"minLength", "maxLength", "pattern", "format"})
ARRAY = frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"})
OBJECT = frozenset({"properties", "required", "additionalProperties"})
SUPPORTED = GENERIC | NUMERIC | STRING | ARRAY | OBJECT
Path = tuple[str | int, ...]
MAX_DEPTH = 128  # levels of subschemas walked (across references) before refusing


class SchemaRefused(GrammarError):
    """The schema uses a keyword (or value) forge cannot enforce, or accepts no value."""


def pointer(path: Path) -> str:
    """``path`` as a JSON pointer into the schema (``#`` is its root)."""
    parts = (str(p).replace("~", "~0").replace("/", "~1") for p in path)
    return "#" + "".join("/" + p for p in parts)


def refuse(path: Path, message: str) -> SchemaRefused:
    return SchemaRefused(f"the JSON schema at {pointer(path)}: {message}")


def check_keywords(schema: Mapping[str, Any], path: Path) -> None:
    """Refuse the first keyword that forge neither enforces nor may ignore."""
    for key in schema:
        if key == "$id" and not path:
            continue
        if key not in SUPPORTED and key not in ANNOTATIONS:
            raise refuse((*path, key), f"forge cannot enforce the keyword {key[:64]!r}")
    if schema.get("uniqueItems", False) is not False:
        raise refuse((*path, "uniqueItems"), "forge cannot enforce uniqueItems: true")
    if "anyOf" in schema and "oneOf" in schema:
        raise refuse((*path, "oneOf"), "forge does not combine anyOf and oneOf in one schema")


_ONE = ("items", "additionalItems", "additionalProperties")
_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_MAPS = ("properties", "$defs", "definitions")


def _children(schema: Mapping[str, Any], path: Path) -> list[tuple[Any, Path]]:
    out: list[tuple[Any, Path]] = [(schema[k], (*path, k)) for k in _ONE if isinstance(schema.get(k), dict)]
    for key in _LISTS:
        if isinstance(schema.get(key), list):
            out.extend((sub, (*path, key, i)) for i, sub in enumerate(schema[key]))
    for key in _MAPS:
        if isinstance(schema.get(key), dict):
            out.extend((sub, (*path, key, name)) for name, sub in schema[key].items())
    return out


def check_tree(root: Any) -> None:
    """``check_keywords`` on every subschema, used or not (iterative: any depth)."""
    todo: list[tuple[Any, Path]] = [(root, ())]
    while todo:
        schema, path = todo.pop()
        if isinstance(schema, dict):
            check_keywords(schema, path)
            todo.extend(_children(schema, path))


def types(schema: Mapping[str, Any], path: Path) -> list[str]:
    """The schema's ``type`` as a list (every type when absent)."""
    value = schema.get("type", list(TYPES))
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n in TYPES for n in names):
        raise refuse((*path, "type"), f"type must be one of {', '.join(TYPES)} or a list of them")
    return names


def count(schema: Mapping[str, Any], key: str, path: Path) -> int | None:
    """A non-negative integer keyword (``minLength`` ...), or None when absent."""
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refuse((*path, key), f"{key} must be a non-negative integer")
    return value


def number(schema: Mapping[str, Any], key: str, path: Path) -> Fraction | None:
    """A numeric keyword as its exact value, or None when absent."""
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise refuse((*path, key), f"{key} must be a finite number")
    return Fraction(value)


def schema_list(schema: Mapping[str, Any], key: str, path: Path) -> list[Any]:
    value = schema[key]
    if not isinstance(value, list):
        raise refuse((*path, key), f"{key} must be a list of schemas")
    if not value:
        raise refuse((*path, key), f"{key} is empty, so no value satisfies it")
    return value


def resolve(root: Any, ref: Any, path: Path) -> Any:
    """The subschema a local ``$ref`` (``#/$defs/Name``, any JSON pointer into the root) names."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise refuse((*path, "$ref"), "forge resolves only local references (#/...)")
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("%25", "%").replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise refuse((*path, "$ref"), f"the reference {ref[:64]!r} names nothing in the schema")
    if not isinstance(node, dict | bool):
        raise refuse((*path, "$ref"), f"the reference {ref[:64]!r} does not name a schema")
    return node
