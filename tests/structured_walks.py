"""Random walks through a compiled grammar: every text a walk ends on is one the grammar allows, so
checking many seeded walks against the schema checks the grammar, not a model's preferences.

``guarded_walk``: through a backend's own constraint (length guard on: the walk always ends on an
accepted text within the budget). ``steered_walk``: through xgrammar's matcher alone
(``length_guard: false``), picking, more often than not, a token that the outlines DFA of the same
spec says brings the end closer, so that walks end; the matcher alone decides what is allowed."""

from __future__ import annotations

import random

from forge.structured.base import Grammar
from forge.structured.guide import DFAGuide
from forge.tokenizers.base import ByteTokenizer

TOKENIZER = ByteTokenizer()
EOS = frozenset(TOKENIZER.eos_token_ids)


def _allowed(constraint: object) -> list[int]:
    mask = constraint.allowed_mask(TOKENIZER.vocab_size)  # type: ignore[attr-defined]
    assert mask is not None
    return [int(i) for i in mask.nonzero().flatten().tolist()]


def guarded_walk(grammar: Grammar, seed: int, budget: int = 160) -> str:
    """A seeded walk through a grammar's constraint (length guard on); the text at EOS."""
    constraint = grammar.constraint(max(budget, grammar.min_tokens))
    rng, out = random.Random(seed), bytearray()
    while True:
        ids = _allowed(constraint)
        assert ids, f"no token allowed after {bytes(out)!r}"
        ends = [i for i in ids if i in EOS]
        token = ends[0] if ends and rng.random() < 0.3 else rng.choice(ids)
        if token in EOS:
            assert constraint.is_accepting
            return out.decode("utf-8")
        constraint.accept(token)
        out.append(token)


def steered_walk(free: Grammar, guide: DFAGuide, seed: int) -> str | None:
    """A seeded walk through ``free`` (an xgrammar grammar without the guard), steered by ``guide``;
    None if it has not ended after 2,000 tokens."""
    constraint = free.constraint(4096)
    rng, out = random.Random(seed), bytearray()
    state: int | None = guide.initial
    for _ in range(2000):
        ids = _allowed(constraint)
        if any(i in EOS for i in ids) and rng.random() < 0.5:
            return out.decode("utf-8")
        closer = []
        if state is not None and rng.random() < 0.7:
            here = guide.distance(state)
            closer = [t for t in ids if (n := guide.next_state(state, t)) is not None and guide.distance(n) < here]
        token = rng.choice(closer or ids)
        if token in EOS:
            return out.decode("utf-8")
        constraint.accept(token)
        out.append(token)
        state = guide.next_state(state, token) if state is not None else None
    return None
