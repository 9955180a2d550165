"""Structured output: a request's spec (JSON schema, any JSON object, or a regex) compiled once
into a grammar, and a per-request ``TokenConstraint`` (see ``forge.request``) built from it.

Contract of a backend (one file + one ``conf/structured/<name>.yaml``):

- ``compile(spec)`` returns a ``Grammar`` or raises ``GrammarError`` (bad schema / regex: the
  server answers 400). Compiled grammars are cached per spec by the backend.
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
from typing import Literal

import torch

SpecKind = Literal["json_schema", "json_object", "regex"]


class GrammarError(ValueError):
    """The schema or regex cannot be compiled; the message says why."""


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


def check_budget(min_tokens: int, budget: int) -> None:
    """Reject a request whose ``max_tokens`` cannot hold the shortest valid output."""
    if min_tokens > budget:
        raise GrammarError(f"the shortest output matching the format needs {min_tokens} tokens; max_tokens={budget}")


def fit_mask(mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``mask`` padded with False (or cut) to the model's ``vocab_size``."""
    if vocab_size == mask.numel():
        return mask
    out = torch.zeros(vocab_size, dtype=torch.bool)
    n = min(vocab_size, mask.numel())
    out[:n] = mask[:n]
    return out


class Constraint(ABC):
    """One request's automaton state (implements ``forge.request.TokenConstraint``)."""

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


class StructuredBackend(ABC):
    name: str

    @abstractmethod
    def compile(self, spec: ConstraintSpec) -> Grammar: ...
