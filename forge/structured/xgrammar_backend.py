"""``structured=xgrammar``: xgrammar's grammar matcher computes each step's token bitmask.

The spec is compiled as the same regex the outlines backend uses (outlines-core turns a JSON
schema into it), so both backends accept exactly the same language and only the regex -> mask
engine differs. xgrammar's matcher is a pushdown automaton with its own mask cache; its state
cannot key a tensor cache, so the mask is recomputed (and its bit-packed form unpacked) each step.

Length safety (``length_guard: true``): a ``DFAGuide`` over the same regex tracks the DFA state
alongside and the mask is xgrammar's AND the guide's length-safe mask (see
``forge.structured.guide``). The two engines read a few regex corners differently (e.g.
``[^\x7f-\x9f]``: code points for outlines-core, bytes for xgrammar), so the AND is what keeps
every output inside both languages; should it ever be empty, the guide's mask alone is used
and xgrammar's matcher is dropped for that request. With ``length_guard: false`` only xgrammar
decides, and an output cut by ``max_tokens`` may be an unfinished document.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch
import xgrammar as xgr

from forge.structured.base import (
    Constraint,
    ConstraintSpec,
    Grammar,
    GrammarError,
    StructuredBackend,
    check_budget,
    fit_mask,
)
from forge.structured.guide import DFAConstraint, DFAGuide, build_index, spec_to_regex
from forge.structured.vocab import grammar_vocab
from forge.tokenizer import Tokenizer

_BITS = torch.arange(32, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """xgrammar's int32 bitmask (bit j of word i = token 32 i + j) as a bool tensor."""
    bits = (bitmask.reshape(-1, 1) >> _BITS) & 1
    return bits.reshape(-1)[:vocab_size].to(torch.bool)


class XGrammarConstraint(Constraint):
    """xgrammar's matcher, and (with the length guard) a ``DFAConstraint`` over the same regex."""

    def __init__(self, grammar: XGrammarGrammar, budget: int) -> None:
        check_budget(grammar.min_tokens, budget)
        self.grammar = grammar
        self.matcher: Any = xgr.GrammarMatcher(grammar.compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, grammar.vocab_size)
        self.dfa = DFAConstraint(grammar.guide, budget) if grammar.guide is not None else None

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        if self.matcher is None:
            assert self.dfa is not None
            return self.dfa.allowed_mask(vocab_size)
        self.matcher.fill_next_token_bitmask(self.bitmask)
        mask = unpack_bitmask(self.bitmask, self.grammar.vocab_size)
        if self.dfa is not None:
            mask = mask & self.dfa.mask()
            if not bool(mask.any()):  # the engines disagree here: follow the guide alone from now on
                self.matcher = None
                return self.dfa.allowed_mask(vocab_size)
        return fit_mask(mask, vocab_size)

    def accept(self, token: int) -> None:
        if self.matcher is not None and not self.matcher.accept_token(token):
            if self.dfa is None:
                raise ValueError(f"xgrammar rejected token {token}")
            self.matcher = None
        if self.dfa is not None:
            self.dfa.accept(token)

    @property
    def is_accepting(self) -> bool:
        if self.dfa is not None:
            return self.dfa.is_accepting
        return self.matcher is not None and bool(self.matcher.is_terminated())


class XGrammarGrammar(Grammar):
    def __init__(self, compiled: Any, guide: DFAGuide | None, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.compiled = compiled
        self.guide = guide
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids

    @property
    def min_tokens(self) -> int:
        return self.guide.min_tokens if self.guide is not None else 1

    def constraint(self, budget: int) -> Constraint:
        return XGrammarConstraint(self, budget)


class XGrammarBackend(StructuredBackend):
    """``length_guard``: keep outputs valid when ``max_tokens`` cuts them (see module doc);
    ``max_recursion_depth``: nesting depth of recursive schemas; ``cache_size``: specs kept."""

    name = "xgrammar"

    def __init__(
        self, tokenizer: Tokenizer, length_guard: bool = True, max_recursion_depth: int = 3, cache_size: int = 64
    ) -> None:
        self.tokenizer = tokenizer
        self.length_guard = length_guard
        self.max_recursion_depth = max_recursion_depth
        self.cache_size = cache_size
        self.vocab_size = tokenizer.vocab_size
        self.tokens, self.eos_token_ids = grammar_vocab(tokenizer)
        info = xgr.TokenizerInfo(
            [b if b is not None else b"" for b in self.tokens],
            xgr.VocabType.RAW,
            vocab_size=self.vocab_size,
            stop_token_ids=sorted(self.eos_token_ids),
        )
        self.compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._grammars = lru_cache(maxsize=cache_size)(self._build)

    def _build(self, spec: ConstraintSpec) -> XGrammarGrammar:
        regex = spec_to_regex(spec, self.max_recursion_depth)
        try:
            compiled = self.compiler.compile_regex(regex)
        except Exception as exc:
            raise GrammarError(f"cannot compile regex {regex[:200]!r}: {exc}") from exc
        guide = None
        if self.length_guard:
            index = build_index(regex, self.tokens, min(self.eos_token_ids))
            guide = DFAGuide(index, self.eos_token_ids, self.vocab_size)
        return XGrammarGrammar(compiled, guide, self.vocab_size, self.eos_token_ids)

    def compile(self, spec: ConstraintSpec) -> Grammar:
        return self._grammars(spec)
