"""Property: every output a JSON-schema grammar allows validates against the schema, for both
backends. Hypothesis draws schemas over every keyword forge accepts (``schema_rules.SUPPORTED``);
each is compiled by both backends and walked at random (``tests/structured_walks.py``); each
ended walk is parsed and checked with ``jsonschema`` (formats included). A schema forge cannot
enforce may be refused (``SchemaRefused``, a 400 when serving), never compiled loosely.
CI runs a small instance; ``-m slow`` a larger one."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forge.structured.base import ConstraintSpec, GrammarError, GrammarTooLarge
from forge.structured.compile_pool import CompilePool
from forge.structured.outlines_backend import DFAGrammar, OutlinesBackend
from forge.structured.schema_regex import schema_regex
from forge.structured.schema_rules import ANNOTATIONS, SUPPORTED, SchemaRefused
from forge.structured.schema_strings import FORMATS
from forge.structured.xgrammar_backend import XGrammarBackend
from tests.structured_walks import TOKENIZER, guarded_walk, steered_walk

WALKS = 4
PATTERNS = ["^[a-c]+$", "x\\d{2}", "^(ab|c)*$", "[^a-z]", "\\w-\\s", '^"q\\\\$', ".{1,3}", "[é-ü]?z", "^\\D\\W$"]
NAMES = st.sampled_from(["a", "b", "id", "x y", "é", 'q"'])
BOUND = st.one_of(st.integers(-40, 40), st.sampled_from([-2.5, -0.5, 0.25, 1.5, 7.75, 1e3, -1e3]))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-99, 99) | st.sampled_from([0.5, -2.25, 1.0]) | st.text(max_size=3),
    lambda c: st.lists(c, max_size=2) | st.dictionaries(st.text(max_size=2), c, max_size=2),
    max_leaves=4,
)
REF = {"$ref": "#/$defs/D"}


def _typed(kind: str, **optional: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({"type": st.just(kind)}, optional=optional)


def _numbers() -> st.SearchStrategy[dict[str, Any]]:
    bounds = {"minimum": BOUND, "maximum": BOUND, "exclusiveMinimum": BOUND, "exclusiveMaximum": BOUND}
    return _typed("integer", **bounds, multipleOf=st.sampled_from([1, 2, 3, 5, 25])) | _typed("number", **bounds)


def _strings() -> st.SearchStrategy[dict[str, Any]]:
    return (
        _typed("string", minLength=st.integers(0, 4), maxLength=st.integers(0, 6))
        | _typed("string", format=st.sampled_from(sorted(FORMATS)), minLength=st.sampled_from([0, 5]))
        | _typed("string", pattern=st.sampled_from(PATTERNS))
    )


def _leaves() -> st.SearchStrategy[Any]:
    return st.one_of(
        _typed("null"),
        _typed("boolean"),
        _numbers(),
        _strings(),
        st.fixed_dictionaries({"enum": st.lists(JSON_VALUES, max_size=4)}),
        st.fixed_dictionaries({"const": JSON_VALUES}),
        st.fixed_dictionaries(
            {"type": st.lists(st.sampled_from(["null", "boolean", "integer", "string"]), min_size=1, unique=True)},
            optional={"minimum": BOUND, "maxLength": st.integers(0, 3)},
        ),
        st.just(REF),
        st.booleans(),
    )


def _all_of_scalars() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"allOf": st.lists(st.one_of(_numbers(), _strings(), _leaves()), min_size=2, max_size=3)}
    )


def _object(child: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return _typed(
        "object",
        properties=st.dictionaries(NAMES, child, max_size=3),
        required=st.lists(NAMES, max_size=3, unique=True),
        additionalProperties=st.booleans() | child,
        title=st.just("annotated"),
    )


def _extend(child: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    branches = st.lists(child, min_size=1, max_size=3)
    return st.one_of(
        _typed(
            "array",
            items=child,
            prefixItems=st.lists(child, max_size=2),
            minItems=st.integers(0, 3),
            maxItems=st.integers(0, 4),
        ),
        _object(child),
        st.fixed_dictionaries({"anyOf": branches}),
        st.fixed_dictionaries({"oneOf": branches}),
        st.fixed_dictionaries({"allOf": st.lists(child, min_size=1, max_size=2)}),
    )


SCHEMAS = st.recursive(_leaves(), _extend, max_leaves=6)


@st.composite
def rooted(draw: st.DrawFn) -> Any:
    """A schema with ``$defs.D`` (which ``REF`` names: it may be recursive)."""
    top, definition = draw(SCHEMAS), draw(SCHEMAS)
    if isinstance(top, dict):
        return {**top, "$defs": {"D": definition}}
    return top


def _uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    parts = urllib.parse.urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def validator(schema: Any) -> jsonschema.protocols.Validator:
    checker = jsonschema.FormatChecker(())  # draft 2020-12's checkers (the global one's "time" is draft 3's)
    checker.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("uri")(_uri)  # jsonschema checks it only with rfc3987 installed
    return jsonschema.Draft202012Validator(schema, format_checker=checker)


Pools = tuple[CompilePool, CompilePool, CompilePool]


@pytest.fixture(scope="module")
def backends() -> Iterator[Pools]:
    """outlines, xgrammar, xgrammar without the length guard; each compiling in a worker bounded in
    time and memory, as when serving (a schema past the budget is skipped)."""
    pools = (
        CompilePool(OutlinesBackend(TOKENIZER, compile_timeout_s=20, compile_memory_mb=1024)),
        CompilePool(XGrammarBackend(TOKENIZER, compile_timeout_s=20, compile_memory_mb=1024)),
        CompilePool(XGrammarBackend(TOKENIZER, length_guard=False, compile_timeout_s=20, compile_memory_mb=1024)),
    )
    yield pools
    for pool in pools:
        pool.close()


def check_schema_outputs(pools: Pools, schema: Any) -> int:
    """Walk both backends' grammars of ``schema``; every ended walk must validate. Returns how
    many outputs were checked (0: refused or over the compile budget)."""
    spec = ConstraintSpec.json_schema(schema)
    try:
        outlines, xgrammar, free = (pool.compile_blocking(spec) for pool in pools)
    except (SchemaRefused, GrammarTooLarge):
        return 0
    except GrammarError as exc:  # a refusal crosses back from the worker as a GrammarError
        assert str(exc).startswith("the JSON schema at #"), exc
        return 0
    assert isinstance(outlines, DFAGrammar)
    check = validator(schema)
    texts = [guarded_walk(g, seed) for g in (outlines, xgrammar) for seed in range(WALKS)]
    texts += [t for seed in range(WALKS) if (t := steered_walk(free, outlines.guide, seed)) is not None]
    for text in texts:
        errors = [e.message for e in check.iter_errors(json.loads(text))]
        assert not errors, f"{text!r} violates {json.dumps(schema)}: {errors}"
    return len(texts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=st.one_of(_numbers(), _strings(), _leaves(), _all_of_scalars()))
def test_every_output_of_a_scalar_schema_validates(backends: Pools, schema: Any) -> None:
    """Many small schemas: each numeric and string keyword at the root, where every walk meets it."""
    check_schema_outputs(backends, schema)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=rooted())
def test_every_output_validates(backends: Pools, schema: Any) -> None:
    check_schema_outputs(backends, schema)


MALFORMED = st.recursive(
    JSON_VALUES,
    lambda c: (
        st.dictionaries(st.sampled_from(sorted(SUPPORTED | ANNOTATIONS | {"not", "x"})), c, max_size=4)
        | st.lists(c, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(schema=MALFORMED)
def test_any_json_as_a_schema_compiles_or_is_refused(schema: Any) -> None:
    """Keywords with values of any type: a regex or a ``SchemaRefused`` (a 400), never a crash."""
    try:
        assert isinstance(schema_regex(schema, 3), str)
    except SchemaRefused as exc:
        assert str(exc).startswith("the JSON schema at #")


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schema=rooted())
def test_every_output_validates_large(backends: Pools, schema: Any) -> None:
    check_schema_outputs(backends, schema)
