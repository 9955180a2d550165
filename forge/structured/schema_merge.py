"""``allOf`` as one schema, and the check that lets ``oneOf`` be compiled as ``anyOf``.

``merge`` intersects keyword by keyword: types (``integer`` within ``number``), the tighter of each
bound and length, ``multipleOf`` as the least common multiple, ``required`` as the union,
``properties`` / ``additionalProperties`` per name (a name one side does not list gets that
side's ``additionalProperties``: ``false`` makes it absent), ``items`` as an ``allOf``. Two
different ``pattern`` or ``format`` values, or ``prefixItems`` on both sides, are refused. The
caller handles ``$ref``, ``enum`` / ``const`` and ``anyOf`` / ``oneOf`` before merging.

``oneOf`` holds exactly when its branches are pairwise disjoint: different JSON types, different
``enum`` / ``const`` values, or objects whose common required property has different values
there (a discriminator). Otherwise it is refused: a grammar for "any branch" could emit a value
that matches two."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from forge.structured.schema_rules import ANNOTATIONS, TYPES, Path, count, number, refuse, types

_LOWER = ("minimum", "exclusiveMinimum")
_UPPER = ("maximum", "exclusiveMaximum")
_COUNT_LOWER = ("minLength", "minItems")
_COUNT_UPPER = ("maxLength", "maxItems")
_EQUAL = ("pattern", "format")
_OBJECT = ("properties", "additionalProperties")
KINDS = frozenset({"null", "boolean", "number", "string", "array", "object"})
Resolver = Callable[[Any, Path], Any]


def _types(a: dict[str, Any], b: dict[str, Any], path: Path) -> list[str]:
    ta, tb = set(types(a, path)), set(types(b, path))
    both = ta & tb
    if ("integer" in ta and "number" in tb) or ("number" in ta and "integer" in tb):
        both.add("integer")
    return [t for t in TYPES if t in both]


def _side(schema: dict[str, Any], name: str) -> Any:
    """What ``schema`` requires of property ``name`` (None: nothing)."""
    props = schema.get("properties", {})
    if name in props:
        return props[name]
    extra = schema.get("additionalProperties")
    return extra if extra is False or isinstance(extra, dict) else None


def _both(x: Any, y: Any) -> Any:
    parts = [s for s in (x, y) if s is not None]
    return parts[0] if len(parts) == 1 else {"allOf": parts}


def _merge_objects(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], path: Path) -> None:
    for s in (a, b):
        if not isinstance(s.get("properties", {}), dict):
            raise refuse((*path, "properties"), "properties must be an object")
    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    if names:
        out["properties"] = {n: _both(_side(a, n), _side(b, n)) for n in names}
    extra = [s.get("additionalProperties") for s in (a, b) if "additionalProperties" in s]
    extra = [e for e in extra if e is not True]
    if False in extra:
        out["additionalProperties"] = False
    elif extra:
        out["additionalProperties"] = extra[0] if len(extra) == 1 else {"allOf": extra}


def _merge_key(key: str, x: Any, y: Any, a: dict[str, Any], b: dict[str, Any], path: Path) -> Any:
    where = (*path, key)
    if key in _LOWER or key in _UPPER:
        nx, ny = number(a, key, path), number(b, key, path)
        return x if (nx >= ny if key in _LOWER else nx <= ny) else y  # type: ignore[operator]
    if key in _COUNT_LOWER or key in _COUNT_UPPER:
        cx, cy = count(a, key, path), count(b, key, path)
        return max(cx, cy) if key in _COUNT_LOWER else min(cx, cy)  # type: ignore[type-var]
    if key == "multipleOf":
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (x, y)):
            raise refuse(where, "allOf combines multipleOf values forge can merge only when both are integers")
        return math.lcm(x, y)
    if key in _EQUAL or key == "prefixItems":
        if x != y:
            raise refuse(where, f"allOf combines two different {key} values, which forge cannot intersect")
        return x
    if key == "required":
        if not isinstance(x, list) or not isinstance(y, list):
            raise refuse(where, "required must be a list of names")
        return list(dict.fromkeys([*x, *y]))
    if key in ("items", "additionalItems"):
        return {"allOf": [x, y]}
    if key == "uniqueItems":
        return x or y
    raise refuse(where, f"forge cannot combine {key!r} in allOf")


def merge(parts: list[dict[str, Any]], path: Path) -> dict[str, Any]:
    """The intersection of ``parts`` (no ``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``enum`` or
    ``const`` at their top level) as one schema."""
    out: dict[str, Any] = {}
    for part in parts:
        merged = {k: v for k, v in out.items() if k not in _OBJECT}
        for key, value in part.items():
            if key in ANNOTATIONS or key in _OBJECT:
                continue
            if key == "type":
                merged["type"] = _types(out, part, path)
            elif key in merged:
                merged[key] = _merge_key(key, merged[key], value, out, part, path)
            else:
                merged[key] = value
        _merge_objects(out, part, merged, path)
        out = merged
    return out


def _canonical(value: Any) -> str:
    def norm(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [norm(x) for x in v]
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        return v

    return json.dumps(norm(value), sort_keys=True)


def _kind(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _values(schema: Any) -> set[str] | None:
    """The canonical texts of the values an ``enum`` / ``const`` schema allows (None: not listed)."""
    if not isinstance(schema, dict) or ("enum" not in schema and "const" not in schema):
        return None
    listed = [schema["const"]] if "const" in schema else list(schema.get("enum", []))
    return {_canonical(v) for v in listed}


class Disjointness:
    """Decides whether ``oneOf`` branches are pairwise disjoint (refs resolved by ``resolve``)."""

    def __init__(self, resolve: Resolver) -> None:
        self.resolve = resolve

    def target(self, schema: Any, path: Path, depth: int = 0) -> Any:
        while isinstance(schema, dict) and "$ref" in schema and depth < 8:
            schema, depth = self.resolve(schema["$ref"], path), depth + 1
        return schema

    def kinds(self, schema: Any, path: Path, depth: int = 0) -> frozenset[str]:
        schema = self.target(schema, path)
        if not isinstance(schema, dict) or depth > 8:
            return KINDS if schema is not False else frozenset()
        out = KINDS
        if "type" in schema:
            out = frozenset("number" if t == "integer" else t for t in types(schema, path))
        listed = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(listed, list):
            out = out & {_kind(v) for v in listed}
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                out = out & frozenset().union(*(self.kinds(s, path, depth + 1) for s in schema[key]))
        for sub in schema.get("allOf", []) if isinstance(schema.get("allOf"), list) else []:
            out = out & self.kinds(sub, path, depth + 1)
        return out

    def _tagged_apart(self, a: Any, b: Any, path: Path) -> bool:
        objects = frozenset({"object"})
        if not (isinstance(a, dict) and isinstance(b, dict)):
            return False
        if not (self.kinds(a, path) <= objects and self.kinds(b, path) <= objects):
            return False
        ra, pa, rb, pb = a.get("required"), a.get("properties"), b.get("required"), b.get("properties")
        if not (isinstance(ra, list) and isinstance(rb, list) and isinstance(pa, dict) and isinstance(pb, dict)):
            return False
        for name in {n for n in ra if isinstance(n, str)} & {n for n in rb if isinstance(n, str)}:
            va = _values(self.target(pa.get(name), path))
            vb = _values(self.target(pb.get(name), path))
            if va is not None and vb is not None and not va & vb:
                return True
        return False

    def apart(self, a: Any, b: Any, path: Path) -> bool:
        a, b = self.target(a, path), self.target(b, path)
        if not self.kinds(a, path) & self.kinds(b, path):
            return True
        va, vb = _values(a), _values(b)
        if va is not None and vb is not None and not va & vb:
            return True
        return self._tagged_apart(a, b, path)

    def check(self, branches: list[Any], path: Path) -> None:
        for i, a in enumerate(branches):
            for j in range(i + 1, len(branches)):
                if not self.apart(a, branches[j], path):
                    raise refuse(
                        (*path, "oneOf"),
                        f"branches {i} and {j} may both match a value; forge enforces oneOf only for disjoint "
                        "branches (different types, different enum/const values, or a required property with "
                        "different const values); use anyOf",
                    )
