"""Structured output: JSON schema / JSON object / regex constraints as per-step token masks.

Backends are the ``structured`` conf group (``conf/structured/{outlines,xgrammar}.yaml``),
``_partial_`` options called with the engine's tokenizer. See ``forge.structured.base`` for the contract."""

from forge.structured.base import Constraint, ConstraintSpec, Grammar, GrammarError, StructuredBackend

__all__ = ["Constraint", "ConstraintSpec", "Grammar", "GrammarError", "StructuredBackend"]
