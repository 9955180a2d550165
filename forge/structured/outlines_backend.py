"""``structured=outlines``: outlines-core's token index, one cached mask tensor per DFA state.

Per generated token the cost is a dict lookup for the next state and a cached tensor for the
mask; the index itself is built once per distinct spec (LRU-cached)."""

from __future__ import annotations

from functools import lru_cache

from forge.structured.base import Constraint, ConstraintSpec, Grammar, StructuredBackend
from forge.structured.guide import DFAConstraint, DFAGuide, build_index, spec_to_regex
from forge.structured.vocab import grammar_vocab
from forge.tokenizer import Tokenizer


class DFAGrammar(Grammar):
    def __init__(self, guide: DFAGuide) -> None:
        self.guide = guide

    @property
    def min_tokens(self) -> int:
        return self.guide.min_tokens

    def constraint(self, budget: int) -> Constraint:
        return DFAConstraint(self.guide, budget)


class OutlinesBackend(StructuredBackend):
    """``max_recursion_depth``: nesting depth for recursive schemas and ``json_object``;
    ``cache_size``: compiled specs kept (least recently used dropped)."""

    name = "outlines"

    def __init__(self, tokenizer: Tokenizer, max_recursion_depth: int = 3, cache_size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.max_recursion_depth = max_recursion_depth
        self.cache_size = cache_size
        self.vocab_size = tokenizer.vocab_size
        self.tokens, self.eos_token_ids = grammar_vocab(tokenizer)
        self._guides = lru_cache(maxsize=cache_size)(self._build_guide)

    def _build_guide(self, spec: ConstraintSpec) -> DFAGuide:
        index = build_index(spec_to_regex(spec, self.max_recursion_depth), self.tokens, min(self.eos_token_ids))
        return DFAGuide(index, self.eos_token_ids, self.vocab_size)

    def guide(self, spec: ConstraintSpec) -> DFAGuide:
        return self._guides(spec)

    def compile(self, spec: ConstraintSpec) -> Grammar:
        return DFAGrammar(self.guide(spec))
