"""Structured output: JSON schema / JSON object / regex constraints as per-step token masks,
compiled in bounded worker processes.

Backends are the ``structured`` conf group (``conf/structured/{outlines,xgrammar}.yaml``),
``_partial_`` options called with the engine's tokenizer. See ``forge.structured.base`` for the contract.
Imports only ``forge.core`` and ``forge.tokenizers``."""

from forge.structured.base import Constraint, ConstraintSpec, Grammar, GrammarError, StructuredBackend

__all__ = ["Constraint", "ConstraintSpec", "Grammar", "GrammarError", "StructuredBackend"]
