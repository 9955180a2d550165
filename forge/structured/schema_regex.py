"""A JSON schema as a regex that matches only JSON texts valid against it (forge's own compiler,
used by both structured backends; the keywords it enforces are ``schema_rules.SUPPORTED``).

The regex may match fewer valid texts than the schema allows (properties in the order given,
optional ones omitted or present; numbers as ``schema_numbers`` writes them; no whitespace but
single spaces), never an invalid one. Per keyword: ``type`` (a name or a list), ``enum`` /
``const`` (each value checked against the whole subschema with ``jsonschema``, so the other
keywords beside it hold too), ``anyOf``, ``oneOf`` (disjoint branches only), ``allOf`` (merged:
``schema_merge``), local ``$ref`` (``$defs``, ``definitions``, any pointer; a reference met
``max_recursion_depth`` times on one path stops there: an optional property or array item is
then left out, a required one makes the branch impossible), numeric bounds and integer
``multipleOf`` (``schema_numbers``), ``minLength`` / ``maxLength`` / ``pattern`` / ``format``
(``schema_strings``), ``properties`` / ``required`` / ``additionalProperties`` (a schema for the
values of a map without ``properties``; with ``properties`` only those are written),
``items`` / ``prefixItems`` / ``minItems`` / ``maxItems``. A schema that accepts no value
(``enum: []``, ``minimum`` above ``maximum``, a required property that cannot be written, ...)
is refused with the place and the reason, as is anything forge cannot enforce."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from forge.structured.schema_containers import ANY_VALUE, alt, array_regex, object_regex
from forge.structured.schema_merge import Disjointness, merge
from forge.structured.schema_numbers import Bounds, int_range, multiples, number_range
from forge.structured.schema_rules import (
    ANNOTATIONS,
    MAX_DEPTH,
    Path,
    SchemaRefused,
    check_keywords,
    check_tree,
    count,
    number,
    refuse,
    resolve,
    schema_list,
    types,
)
from forge.structured.schema_strings import (
    FORMAT_LENGTHS,
    FORMATS,
    PatternRefused,
    escape_literal,
    pattern_regex,
    string_regex,
)

_INTO_VALUE = frozenset({"properties", "additionalProperties", "items", "prefixItems", "additionalItems"})


@dataclass(frozen=True)
class At:
    """Where the compiler is: the place in the schema (for messages; a reference's target is named
    by its own pointer), the references followed (all, and those since the walk last went into a
    property or item: one of those met again is a cycle that never reaches the value's parts),
    and the levels walked so far."""

    path: Path = ()
    refs: tuple[str, ...] = ()
    depth: int = 0
    here: tuple[str, ...] = ()

    def down(self, *keys: str | int) -> At:
        if self.depth + len(keys) > MAX_DEPTH:
            raise refuse(self.path, f"the schema nests deeper than {MAX_DEPTH} levels (references followed included)")
        here = () if keys and keys[0] in _INTO_VALUE else self.here
        return At((*self.path, *keys), self.refs, self.depth + len(keys), here)

    def via(self, ref: str) -> At:
        if ref in self.here:
            raise refuse(
                (*self.path, "$ref"), f"{ref[:64]!r} refers back to itself without going into a property or item"
            )
        target = tuple(p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/")[1:])
        return At(target, (*self.refs, ref), self.down("$ref").depth, (*self.here, ref))

    def counting(self, ref: str, there: At) -> At:
        """This place, also counting ``ref`` (followed to ``there``) as followed."""
        return At(self.path, (*self.refs, ref), max(self.depth, there.depth), (*self.here, ref))


class SchemaCompiler:
    """Compiles one schema (``regex()``); ``max_recursion_depth`` bounds recursive references."""

    def __init__(self, root: Any, max_recursion_depth: int) -> None:
        self.root = root
        self.max_refs = max(1, max_recursion_depth)
        self.why_empty: SchemaRefused | None = None
        self.disjoint = Disjointness(lambda ref, path: resolve(self.root, ref, path))
        self._validator: Any = None

    def regex(self) -> str:
        check_tree(self.root)  # every keyword, also where it would not apply
        out = self.node(self.root, At())
        if out is None:
            raise self.why_empty or refuse((), "no value satisfies the schema")
        return out

    def nothing(self, at: At, why: str) -> str | None:
        """No value here (None); the first such reason is the message should the whole schema accept none."""
        if self.why_empty is None:
            self.why_empty = refuse(at.path, f"no value satisfies it: {why}")
        return None

    def node(self, schema: Any, at: At) -> str | None:
        if schema is True:
            return ANY_VALUE
        if schema is False:
            return self.nothing(at, "the schema is false")
        if not isinstance(schema, dict):
            raise refuse(at.path, "a schema must be an object or a boolean")
        check_keywords(schema, at.path)
        if "$ref" in schema:
            return self.reference(schema, at)
        if "allOf" in schema:
            return self.all_of(schema, at)
        if "enum" in schema or "const" in schema:
            return self.listed(schema, schema, at)
        if "anyOf" in schema or "oneOf" in schema:
            return self.any_of(schema, at)
        return self.typed(schema, at)

    def follow(self, ref: Any, at: At) -> tuple[Any, At] | None:
        """The target of ``ref`` and where it is; None where recursion stops."""
        target = resolve(self.root, ref, at.path)
        if at.refs.count(ref) >= self.max_refs:
            self.nothing(at, f"$ref {ref[:64]!r} recurses deeper than max_recursion_depth={self.max_refs}")
            return None
        return target, at.via(ref)

    def reference(self, schema: dict[str, Any], at: At) -> str | None:
        rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
        if rest:
            return self.all_of({"allOf": [rest, {"$ref": schema["$ref"]}]}, at)
        found = self.follow(schema["$ref"], at)
        return None if found is None else self.node(*found)

    def expand(self, schema: dict[str, Any], at: At) -> tuple[list[Any], At]:
        """``schema``'s ``allOf`` flattened, top-level references followed (each part keeps the
        chain of references it came through, so only a true cycle is one); and where the merged
        schema is (every reference followed counted)."""
        parts: list[Any] = []
        own = {k: v for k, v in schema.items() if k != "allOf"}
        todo = [(p, at) for p in [own, *schema_list(schema, "allOf", at.path)]]
        inner = at
        while todo:
            part, where = todo.pop(0)
            if isinstance(part, dict) and "$ref" in part:
                check_keywords(part, where.path)
                found = self.follow(part["$ref"], where)
                rest = {k: v for k, v in part.items() if k != "$ref"}
                todo += [(rest, where), found if found is not None else (False, where)]
                if found is not None:
                    inner = inner.counting(part["$ref"], found[1])
            elif isinstance(part, dict) and "allOf" in part:
                check_keywords(part, where.path)
                rest = {k: v for k, v in part.items() if k != "allOf"}
                todo += [(p, where) for p in [rest, *schema_list(part, "allOf", where.path)]]
            elif part is not True:
                parts.append(part)
        return parts, inner

    def all_of(self, schema: dict[str, Any], at: At) -> str | None:
        parts, inner = self.expand(schema, at)
        if any(p is False for p in parts):
            return self.nothing(at, "an allOf branch is false (or recurses too deep)")
        if not all(isinstance(p, dict) for p in parts):
            raise refuse((*at.path, "allOf"), "a schema must be an object or a boolean")
        listed = next((p for p in parts if "enum" in p or "const" in p), None)
        if listed is not None:
            return self.listed(listed, schema, at)
        choice = next((p for p in parts if "anyOf" in p or "oneOf" in p), None)
        if choice is not None:
            key = "anyOf" if "anyOf" in choice else "oneOf"
            branches = schema_list(choice, key, inner.path)
            if key == "oneOf":
                self.disjoint.check(branches, inner.path)
            others = [p for p in parts if p is not choice] + [{k: v for k, v in choice.items() if k != key}]
            return self.node({"anyOf": [{"allOf": [*others, b]} for b in branches]}, inner.down("allOf"))
        return self.typed(merge(parts, inner.path), inner)

    def valid(self, schema: Any, value: Any) -> bool:
        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.root, default=jsonschema.Draft202012Validator)
            root = self.root if isinstance(self.root, dict) else {}
            self._validator = cls(root, format_checker=cls.FORMAT_CHECKER)
        return bool(self._validator.evolve(schema=schema).is_valid(value))

    def listed(self, source: dict[str, Any], schema: dict[str, Any], at: At) -> str | None:
        """``source``'s enum / const values that are valid against ``schema``, written out."""
        values = [source["const"]] if "const" in source else source["enum"]
        if not isinstance(values, list):
            raise refuse((*at.path, "enum"), "enum must be a list")
        try:
            kept = [v for v in values if self.valid(schema, v)]
        except Exception as exc:  # the validator's errors for a schema it cannot use
            raise refuse(at.path, f"its enum/const values cannot be checked against it: {exc}") from exc
        if not kept:
            return self.nothing(at, "no enum/const value satisfies the schema's other keywords")
        texts = dict.fromkeys(json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in kept)
        return alt([escape_literal(t) for t in texts])

    def any_of(self, schema: dict[str, Any], at: At) -> str | None:
        key = "anyOf" if "anyOf" in schema else "oneOf"
        branches = schema_list(schema, key, at.path)
        if key == "oneOf":
            self.disjoint.check(branches, at.path)
        rest = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        return alt(
            [self.node({"allOf": [rest, b]} if rest else b, at.down(key, i)) for i, b in enumerate(branches)]
        ) or self.nothing(at, f"no {key} branch can be satisfied")

    def typed(self, schema: dict[str, Any], at: At) -> str | None:
        names = types(schema, at.path)
        writers = {
            "null": lambda: "null",
            "boolean": lambda: "(?:true|false)",
            "integer": lambda: self.integer(schema, at),
            "number": lambda: self.number(schema, at),
            "string": lambda: self.string(schema, at),
            "array": lambda: self.array(schema, at),
            "object": lambda: self.object(schema, at),
        }
        if not names:
            return self.nothing(at, "no type is left (allOf branches of different types?)")
        out = alt([writers[t]() for t in names])
        return out if out is not None else self.nothing(at, f"no value of type {', '.join(names)} fits")

    def bounds(self, schema: dict[str, Any], at: At) -> Bounds:
        lo, xlo = number(schema, "minimum", at.path), number(schema, "exclusiveMinimum", at.path)
        hi, xhi = number(schema, "maximum", at.path), number(schema, "exclusiveMaximum", at.path)
        low = (xlo, True) if xlo is not None and (lo is None or xlo >= lo) else (lo, False)
        high = (xhi, True) if xhi is not None and (hi is None or xhi <= hi) else (hi, False)
        return Bounds(low[0], low[1], high[0], high[1])

    def integer(self, schema: dict[str, Any], at: At) -> str | None:
        bounds = self.bounds(schema, at)
        lo, hi = bounds.int_lo(), bounds.int_hi()
        if lo is not None and hi is not None and lo > hi:
            return self.nothing(at, "no integer lies within its minimum/maximum bounds")
        step = schema.get("multipleOf")
        if step is None:
            return int_range(lo, hi)
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if isinstance(step, bool) or not isinstance(step, int) or step <= 0:
            raise refuse((*at.path, "multipleOf"), "forge enforces multipleOf only for a positive integer")
        try:
            out = multiples(step, lo, hi)
        except ValueError as exc:
            raise refuse((*at.path, "multipleOf"), str(exc)) from exc
        return out if out is not None else self.nothing(at, "no multiple of multipleOf lies within its bounds")

    def number(self, schema: dict[str, Any], at: At) -> str | None:
        if "multipleOf" in schema:
            return self.integer(schema, at)
        out = number_range(self.bounds(schema, at))
        return out if out is not None else self.nothing(at, "forge writes no number within its bounds")

    def string(self, schema: dict[str, Any], at: At) -> str | None:
        low, high = count(schema, "minLength", at.path) or 0, count(schema, "maxLength", at.path)
        if high is not None and low > high:
            return self.nothing(at, "minLength is above maxLength")
        if "format" in schema:
            return self.formatted(schema, low, high, at)
        if "pattern" in schema and ("minLength" in schema or "maxLength" in schema):
            raise refuse((*at.path, "pattern"), "forge cannot combine pattern with minLength/maxLength")
        pattern = schema.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise refuse((*at.path, "pattern"), "pattern must be a string")
            try:
                return pattern_regex(pattern)
            except PatternRefused as exc:
                raise refuse((*at.path, "pattern"), str(exc)) from exc
        return string_regex(low, high)

    def formatted(self, schema: dict[str, Any], low: int, high: int | None, at: At) -> str:
        fmt = schema["format"]
        if not isinstance(fmt, str) or fmt not in FORMATS:
            raise refuse((*at.path, "format"), f"forge enforces only the formats {', '.join(FORMATS)}")
        if "pattern" in schema:
            raise refuse((*at.path, "format"), "forge cannot combine format with pattern")
        shortest, longest = FORMAT_LENGTHS[fmt]
        if low > shortest or (high is not None and high < longest):
            raise refuse(
                (*at.path, "format"),
                f"forge enforces format {fmt} only with minLength <= {shortest} and maxLength >= {longest}",
            )
        return f'"{FORMATS[fmt]}"'

    def array(self, schema: dict[str, Any], at: At) -> str | None:
        return array_regex(self, schema, at)

    def object(self, schema: dict[str, Any], at: At) -> str | None:
        return object_regex(self, schema, at)


def schema_regex(schema: Any, max_recursion_depth: int) -> str:
    """The regex of a JSON schema (``SchemaRefused`` for what forge cannot enforce)."""
    return SchemaCompiler(schema, max_recursion_depth).regex()
