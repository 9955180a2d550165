"""Structured output: a request's spec (JSON schema, any JSON object, or a regex) compiled once
into a grammar, and a per-request ``TokenConstraint`` (see ``forge.core.request``) built from it.

Contract of a backend (one file + one ``conf/structured/<name>.yaml``):

- ``builder()`` returns a picklable ``GrammarBuilder``: ``build(spec, max_states)`` compiles a
  spec into a picklable artefact (or raises ``GrammarError``; ``GrammarTooLarge`` past
  ``max_states``). It runs in a compile worker process (``forge.structured.compile_pool``), so
  it must not need torch or the tokenizer object, only plain data (token bytes, EOS ids).
- ``load(artifact)`` turns the artefact into a ``Grammar`` in the server process, cheaply.
- ``compile(spec)`` (given here) does both in the calling process, with no time or memory
  limit (library use); the server compiles through a ``CompilePool`` instead, which bounds each
  compile by ``limits`` (time, DFA states, memory). Either way only successful compiles are
  kept, in ``cache``, bounded in bytes (``Grammar.nbytes``).
- ``Grammar.constraint(budget)`` returns a fresh per-request constraint. ``budget`` is the most
  tokens the request may generate (``min(max_tokens, max_model_len - prompt_len)``).

Length safety: every constraint must end in a string of the language even when the budget runs
out (finish_reason ``length``). Each backend documents how; the DFA ones use
``forge.structured.guide.DFAGuide.mask(state, remaining)``: a token is allowed only if the
shortest completion from the state it leads to fits in the tokens left after it, so the text at
the last budgeted token is always accepted.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from forge.structured.cache import ByteBoundedCache

if TYPE_CHECKING:  # torch is imported lazily: compile workers import this module without it
    import torch

SpecKind = Literal["json_schema", "json_object", "regex"]


class GrammarError(ValueError):
    """The schema or regex cannot be compiled; the message says why."""


class GrammarTooLarge(GrammarError):
    """The grammar exceeds the compile budget (time, DFA states or memory); the message names the
    limit and the ``structured.*`` option that raises it."""


@dataclass(frozen=True)
class CompileLimits:
    """The budget of one compile and of the compiled-grammar cache (``conf/structured/*.yaml``).

    ``timeout_s``: wall time of one compile; ``max_states``: DFA states of one grammar;
    ``memory_mb``: address space a compile may add to its worker; ``workers``: worker processes
    (compiles running at once); ``max_pending``: compiles that may wait for a worker (more get
    503); ``cache_mb``: memory of the compiled grammars kept."""

    timeout_s: float = 5.0
    max_states: int = 100_000
    memory_mb: int = 1024
    workers: int = 1
    max_pending: int = 8
    cache_mb: int = 256

    def __post_init__(self) -> None:
        if not (self.timeout_s > 0 and self.max_states > 0 and self.memory_mb > 0 and self.workers > 0):
            raise ValueError(f"structured compile limits must be positive: {self}")
        if self.max_pending < 0 or self.cache_mb < 0:
            raise ValueError(f"structured max_pending and cache_mb must be >= 0: {self}")


@dataclass(frozen=True)
class ConstraintSpec:
    """What the output must match. ``value``: the schema as JSON text, or the regex."""

    kind: SpecKind
    value: str = ""

    @classmethod
    def json_schema(cls, schema: Mapping[str, object] | bool) -> ConstraintSpec:
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> ConstraintSpec:
        return cls("json_object", "")

    @classmethod
    def regex(cls, pattern: str) -> ConstraintSpec:
        return cls("regex", pattern)

    @property
    def description(self) -> str:
        """How error messages name it."""
        return {"json_schema": "the JSON schema", "json_object": "json_object", "regex": "the regex"}[self.kind]


def check_budget(min_tokens: int, budget: int) -> None:
    """Reject a request whose ``max_tokens`` cannot hold the shortest valid output."""
    if min_tokens > budget:
        raise GrammarError(f"the shortest output matching the format needs {min_tokens} tokens; max_tokens={budget}")


def fit_mask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``mask`` padded with False (or cut) to the model's ``vocab_size``."""
    import torch

    if vocab_size == mask.numel():
        return mask
    out = torch.zeros(vocab_size, dtype=torch.bool)
    n = min(vocab_size, mask.numel())
    out[:n] = mask[:n]
    return out


class Constraint(ABC):
    """One request's automaton state (implements ``forge.core.request.TokenConstraint``)."""

    @abstractmethod
    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None: ...

    @abstractmethod
    def accept(self, token: int) -> None: ...

    @property
    @abstractmethod
    def is_accepting(self) -> bool:
        """The output so far is a complete string of the language."""


class Grammar(ABC):
    @property
    @abstractmethod
    def min_tokens(self) -> int:
        """The fewest tokens any accepted output needs (a budget below it is rejected)."""

    @abstractmethod
    def constraint(self, budget: int) -> Constraint: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """An estimate of the memory the grammar holds now (masks cached while in use included)."""


class GrammarBuilder(ABC):
    """Compiles specs into picklable artefacts; pickled itself into the compile workers."""

    @abstractmethod
    def build(self, spec: ConstraintSpec, max_states: int) -> object: ...


class StructuredBackend(ABC):
    """Subclasses set ``name``, ``limits`` and ``cache`` (see ``init_cache``)."""

    name: str
    limits: CompileLimits
    cache: ByteBoundedCache[ConstraintSpec, Grammar]

    def init_cache(self, limits: CompileLimits) -> None:
        self.limits = limits
        self.cache = ByteBoundedCache(limits.cache_mb << 20)

    @abstractmethod
    def builder(self) -> GrammarBuilder: ...

    @abstractmethod
    def load(self, artifact: object) -> Grammar:
        """The grammar of an artefact returned by ``builder().build``."""

    def compile(self, spec: ConstraintSpec) -> Grammar:
        """Compile in this process (cached; no time or memory limit: see ``CompilePool``)."""
        grammar = self.cache.get(spec)
        if grammar is None:
            grammar = self.load(self.builder().build(spec, self.limits.max_states))
            self.cache.put(spec, grammar)
        return grammar
