"""``structured=xgrammar``: xgrammar's grammar matcher computes each step's token bitmask.

The spec is compiled as the same regex the outlines backend uses (``forge.structured.schema_regex``
turns a JSON schema into it), so both backends accept exactly the same language and only the regex -> mask
engine differs. xgrammar's matcher is a pushdown automaton with its own mask cache; its state
cannot key a tensor cache, so the mask is recomputed (and its bit-packed form unpacked) each step.

Length safety (``length_guard: true``): a ``DFAGuide`` over the same regex tracks the DFA state
alongside and the mask is xgrammar's AND the guide's length-safe mask (see
``forge.structured.guide``). The two engines read a few regex corners differently (e.g.
``[^\x7f-\x9f]``: code points for outlines-core, bytes for xgrammar), so the AND is what keeps
every output inside both languages; should it ever be empty, the guide's mask alone is used
and xgrammar's matcher is dropped for that request. With ``length_guard: false`` only xgrammar
decides, and an output cut by ``max_tokens`` may be an unfinished document.

Compiles run in a worker process when serving: the compiled grammar crosses back as xgrammar's
``serialize_json`` text (re-attached to this process's ``TokenizerInfo``) and the guide as its
``DFATables``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import xgrammar as xgr

from forge.structured.base import (
    CompileLimits,
    Constraint,
    ConstraintSpec,
    Grammar,
    GrammarBuilder,
    GrammarError,
    StructuredBackend,
    check_budget,
    fit_mask,
)
from forge.structured.dfa import DFATables, build_tables, spec_to_regex
from forge.structured.guide import DFAConstraint, DFAGuide
from forge.structured.vocab import grammar_vocab
from forge.tokenizers.base import Tokenizer

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

    @property
    def nbytes(self) -> int:
        return int(self.compiled.memory_size_bytes) + (self.guide.nbytes if self.guide is not None else 0)


def tokenizer_info(tokens: list[bytes | None], vocab_size: int, eos_token_ids: frozenset[int]) -> Any:
    return xgr.TokenizerInfo(
        [b if b is not None else b"" for b in tokens],
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=sorted(eos_token_ids),
    )


@dataclass(frozen=True)
class XGrammarArtifact:
    """What a compile sends back: xgrammar's serialized grammar, and the guide's tables."""

    compiled_json: str
    tables: DFATables | None


class XGrammarBuilder(GrammarBuilder):
    """Spec -> ``XGrammarArtifact``. The xgrammar compiler is made on first use in the process
    that builds (it cannot be pickled) and dropped when the builder is pickled."""

    def __init__(
        self, tokens: list[bytes | None], eos_token_ids: frozenset[int], vocab_size: int, depth: int, guard: bool
    ) -> None:
        self.tokens = tokens
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size
        self.max_recursion_depth = depth
        self.length_guard = guard
        self._compiler: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_compiler": None}

    def build(self, spec: ConstraintSpec, max_states: int) -> XGrammarArtifact:
        regex = spec_to_regex(spec, self.max_recursion_depth)
        if self._compiler is None:
            info = tokenizer_info(self.tokens, self.vocab_size, self.eos_token_ids)
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        try:
            compiled = self._compiler.compile_regex(regex)
        except Exception as exc:
            raise GrammarError(f"the regex {regex[:64]!r} is invalid or uses an unsupported feature") from exc
        tables = None
        if self.length_guard:
            tables = build_tables(regex, self.tokens, self.eos_token_ids, max_states, spec.description)
        return XGrammarArtifact(compiled.serialize_json(), tables)


class XGrammarBackend(StructuredBackend):
    """``length_guard``: keep outputs valid when ``max_tokens`` cuts them (see module doc);
    ``max_recursion_depth``: nesting depth of recursive schemas; the ``compile_*``, ``max_*`` and
    ``cache_mb`` options: the ``CompileLimits``."""

    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Tokenizer,
        length_guard: bool = True,
        max_recursion_depth: int = 3,
        compile_timeout_s: float = 5.0,
        max_states: int = 100_000,
        compile_memory_mb: int = 1024,
        compile_workers: int = 1,
        max_pending_compiles: int = 8,
        cache_mb: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.length_guard = length_guard
        self.max_recursion_depth = max_recursion_depth
        self.vocab_size = tokenizer.vocab_size
        self.tokens, self.eos_token_ids = grammar_vocab(tokenizer)
        self.info = tokenizer_info(self.tokens, self.vocab_size, self.eos_token_ids)
        self.init_cache(
            CompileLimits(
                compile_timeout_s, max_states, compile_memory_mb, compile_workers, max_pending_compiles, cache_mb
            )
        )
        self._builder = XGrammarBuilder(
            self.tokens, self.eos_token_ids, self.vocab_size, max_recursion_depth, length_guard
        )

    def builder(self) -> XGrammarBuilder:
        return self._builder

    def load(self, artifact: object) -> XGrammarGrammar:
        assert isinstance(artifact, XGrammarArtifact)
        compiled = xgr.CompiledGrammar.deserialize_json(artifact.compiled_json, self.info)
        guide = None
        if artifact.tables is not None:
            guide = DFAGuide(artifact.tables, self.eos_token_ids, self.vocab_size)
        return XGrammarGrammar(compiled, guide, self.vocab_size, self.eos_token_ids)
