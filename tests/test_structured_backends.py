"""Structured output backends: outputs always parse and validate, also when max_tokens cuts them."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.llm import LLM
from forge.structured.base import ConstraintSpec, GrammarError
from forge.structured.outlines_backend import OutlinesBackend
from forge.structured.vocab import token_bytes
from forge.structured.xgrammar_backend import XGrammarBackend, unpack_bitmask
from forge.tokenizers.base import ByteTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"enum": ["a", "b"]},
    },
    "required": ["name", "age", "tags", "kind"],
}
BACKENDS = [OutlinesBackend, XGrammarBackend]


@pytest.fixture(scope="module")
def llm() -> LLM:
    # synthetic: peaked logits (one token at +12, the rest 0), so masks decide whenever they exclude the peak
    return LLM("model=synthetic", "engine.max_num_seqs=32")


@pytest.fixture(scope="module")
def tiny() -> LLM:
    return LLM("model=tiny", "engine.max_num_seqs=32")


def run(llm: LLM, backend_cls: type, spec: ConstraintSpec, budgets: list[int], temps=(0.0, 1.0)) -> list[str]:
    backend = backend_cls(llm.tokenizer)
    grammar = backend.compile(spec)
    requests = []
    for i, budget in enumerate(budgets):
        for j, temp in enumerate(temps):
            params = SamplingParams(max_tokens=budget, temperature=temp, seed=100 * i + j)
            requests.append(
                Request(f"r{i}-{j}", llm.tokenizer.encode("x"), params, constraint=grammar.constraint(budget))
            )
    finals = llm.engine.run(requests)
    return [llm.tokenizer.decode(finals[r.request_id].token_ids) for r in requests]


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_json_schema_outputs_validate_at_every_budget(llm: LLM, backend_cls: type) -> None:
    grammar = backend_cls(llm.tokenizer).compile(ConstraintSpec.json_schema(SCHEMA))
    lo = grammar.min_tokens
    texts = run(llm, backend_cls, ConstraintSpec.json_schema(SCHEMA), [lo, lo + 1, lo + 3, lo + 9, 100])
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_json_object_and_regex(llm: LLM, backend_cls: type) -> None:
    for text in run(llm, backend_cls, ConstraintSpec.json_object(), [3, 10, 60]):
        assert isinstance(json.loads(text), dict)
    pattern = r"(cat|dog)-[0-9]{2,5}"
    for text in run(llm, backend_cls, ConstraintSpec.regex(pattern), [6, 7, 30]):
        assert re.fullmatch(pattern, text), text


def test_backends_agree_on_the_real_model_path(tiny: LLM) -> None:
    spec = ConstraintSpec.json_schema(SCHEMA)
    lo = OutlinesBackend(tiny.tokenizer).compile(spec).min_tokens
    a = run(tiny, OutlinesBackend, spec, [lo, lo + 12])
    assert a == run(tiny, XGrammarBackend, spec, [lo, lo + 12])
    for text in a:
        jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("backend_cls", BACKENDS)
def test_invalid_specs_and_small_budgets_raise(backend_cls: type) -> None:
    backend = backend_cls(ByteTokenizer())
    with pytest.raises(GrammarError):
        backend.compile(ConstraintSpec.regex("(unclosed"))
    with pytest.raises(GrammarError):
        backend.compile(ConstraintSpec("json_schema", '{"type": "no-such-type"}'))
    grammar = backend.compile(ConstraintSpec.regex("abcdef"))
    assert grammar.min_tokens == 6
    with pytest.raises(GrammarError):
        grammar.constraint(5)


def test_masks_are_cached_per_state_and_length_guard_narrows() -> None:
    backend = OutlinesBackend(ByteTokenizer())
    guide = backend.guide(ConstraintSpec.regex("a+b"))
    s = guide.initial
    assert guide.mask(s, 100) is guide.mask(s, 50)  # same cached tensor off the budget edge
    after_a = guide.next_state(s, ord("a"))
    assert after_a is not None
    roomy, tight = guide.mask(after_a, 10), guide.mask(after_a, 1)
    assert roomy[ord("a")] and roomy[ord("b")]
    assert tight[ord("b")] and not tight[ord("a")]  # one token left: must finish
    assert guide.num_cached_masks == 3


def test_token_bytes_and_bitmask_unpack() -> None:
    tok = ByteTokenizer()
    tb = token_bytes(tok)
    assert tb[65] == b"A" and tb[256] is None and tb[257] is None and len(tb) == tok.vocab_size
    words = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)
    mask = unpack_bitmask(words, 64)
    assert mask.nonzero().flatten().tolist() == [0, 2, 63]
