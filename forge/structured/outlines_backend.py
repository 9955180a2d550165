"""``structured=outlines``: outlines-core's token index, one cached mask tensor per DFA state.

Per generated token the cost is a dict lookup for the next state and a cached tensor for the
mask; the index itself is built once per distinct spec (LRU-cached)."""

from __future__ import annotations

from collections import OrderedDict

import torch

from forge.structured.base import (
    Constraint,
    ConstraintSpec,
    Grammar,
    GrammarError,
    StructuredBackend,
    check_budget,
    fit_mask,
)
from forge.structured.guide import DFAGuide, build_index, spec_to_regex
from forge.structured.vocab import token_bytes
from forge.tokenizer import Tokenizer


class DFAConstraint(Constraint):
    """A request's DFA state and remaining token budget."""

    def __init__(self, guide: DFAGuide, budget: int) -> None:
        check_budget(guide.min_tokens, budget)
        self.guide = guide
        self.state = guide.initial
        self.remaining = budget

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        return fit_mask(self.guide.mask(self.state, self.remaining), vocab_size)

    def accept(self, token: int) -> None:
        nxt = self.guide.next_state(self.state, token)
        if nxt is None:
            raise ValueError(f"token {token} is not allowed in state {self.state}")
        self.state = nxt
        self.remaining -= 1

    @property
    def is_accepting(self) -> bool:
        return self.state in self.guide.finals


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
    ``cache_size``: compiled specs kept."""

    name = "outlines"

    def __init__(self, tokenizer: Tokenizer, max_recursion_depth: int = 3, cache_size: int = 64) -> None:
        self.tokenizer = tokenizer
        self.max_recursion_depth = max_recursion_depth
        self.cache_size = cache_size
        self.vocab_size = tokenizer.vocab_size
        self.tokens = token_bytes(tokenizer, self.vocab_size)
        if not tokenizer.eos_token_ids:
            raise GrammarError("structured output needs a tokenizer with an EOS token")
        self.eos = min(tokenizer.eos_token_ids)
        self._cache: OrderedDict[ConstraintSpec, DFAGuide] = OrderedDict()

    def guide(self, spec: ConstraintSpec) -> DFAGuide:
        guide = self._cache.get(spec)
        if guide is not None:
            self._cache.move_to_end(spec)
            return guide
        regex = spec_to_regex(spec, self.max_recursion_depth)
        index = build_index(regex, self.tokens, self.eos)
        guide = DFAGuide(index, self.tokenizer.eos_token_ids, self.vocab_size)
        self._cache[spec] = guide
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return guide

    def compile(self, spec: ConstraintSpec) -> Grammar:
        return DFAGrammar(self.guide(spec))
