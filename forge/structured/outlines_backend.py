"""``structured=outlines``: outlines-core's token index, one cached mask tensor per DFA state.

Per generated token the cost is a dict lookup for the next state and a cached tensor for the
mask; the index itself is built once per distinct spec (in a compile worker when serving) and
its tables kept in the backend's byte-bounded cache."""

from __future__ import annotations

from forge.structured.base import CompileLimits, Constraint, ConstraintSpec, Grammar, StructuredBackend
from forge.structured.dfa import DFABuilder, DFATables
from forge.structured.guide import DFAConstraint, DFAGuide
from forge.structured.vocab import grammar_vocab
from forge.tokenizers.base import Tokenizer


class DFAGrammar(Grammar):
    def __init__(self, guide: DFAGuide) -> None:
        self.guide = guide

    @property
    def min_tokens(self) -> int:
        return self.guide.min_tokens

    def constraint(self, budget: int) -> Constraint:
        return DFAConstraint(self.guide, budget)

    @property
    def nbytes(self) -> int:
        return self.guide.nbytes


class OutlinesBackend(StructuredBackend):
    """``max_recursion_depth``: nesting depth for recursive schemas and ``json_object``; the
    ``compile_*``, ``max_*`` and ``cache_mb`` options: the ``CompileLimits``."""

    name = "outlines"

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_recursion_depth: int = 3,
        compile_timeout_s: float = 5.0,
        max_states: int = 100_000,
        compile_memory_mb: int = 1024,
        compile_workers: int = 1,
        max_pending_compiles: int = 8,
        cache_mb: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_recursion_depth = max_recursion_depth
        self.vocab_size = tokenizer.vocab_size
        self.tokens, self.eos_token_ids = grammar_vocab(tokenizer)
        self.init_cache(
            CompileLimits(
                compile_timeout_s, max_states, compile_memory_mb, compile_workers, max_pending_compiles, cache_mb
            )
        )
        self._builder = DFABuilder(self.tokens, frozenset(self.eos_token_ids), max_recursion_depth)

    def builder(self) -> DFABuilder:
        return self._builder

    def load(self, artifact: object) -> DFAGrammar:
        assert isinstance(artifact, DFATables)
        return DFAGrammar(DFAGuide(artifact, self.eos_token_ids, self.vocab_size))

    def guide(self, spec: ConstraintSpec) -> DFAGuide:
        grammar = self.compile(spec)
        assert isinstance(grammar, DFAGrammar)
        return grammar.guide
