"""JSON schema -> regex (outlines-core), regex -> token-level DFA (``outlines_core.Index``), and
per-state token masks with a length guard.

``DFAGuide.mask(state, remaining)`` is the allowed-token mask when ``remaining`` tokens may still
be generated, this one included. A token t is allowed iff it is EOS in an accepting state, or
``dist[next(state, t)] <= remaining - 1``, where ``dist[s]`` is the fewest tokens from ``s`` to an
accepting state (reverse BFS over the token transitions, computed once per grammar). Starting
from ``dist[initial] <= budget`` (checked when the request is admitted) the invariant
``dist[state] <= remaining`` holds after every token, so when the budget is spent the state is
accepting: output cut by ``max_tokens`` still parses. Masks are cached: one bool tensor per
state for the unconstrained case (``remaining`` larger than every successor's distance), and per
``(state, remaining)`` only near the end of the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch
from outlines_core import Index, Vocabulary
from outlines_core.json_schema import BOOLEAN, NULL, NUMBER, STRING, build_regex_from_schema

from forge.structured.base import Constraint, ConstraintSpec, GrammarError, check_budget, fit_mask

INF = 1 << 30


def json_object_regex(depth: int = 2) -> str:
    """Any JSON object whose values nest objects up to ``depth`` levels (arrays hold scalars).

    Written out here because outlines-core's regex for ``{"type": "object"}`` takes ~14 s to
    index over a byte vocabulary; this one takes ~1 s at depth 2."""
    ws = "[ ]?"
    scalar = f"({STRING}|{NUMBER}|{BOOLEAN}|{NULL})"
    array = rf"\[{ws}({scalar}({ws},{ws}{scalar})*)?{ws}\]"
    value = f"({scalar}|{array})"
    obj = ""
    for _ in range(max(depth, 1)):
        member = f"{STRING}{ws}:{ws}{value}"
        obj = rf"\{{{ws}({member}({ws},{ws}{member})*)?{ws}\}}"
        value = f"({scalar}|{array}|{obj})"
    return obj


def spec_to_regex(spec: ConstraintSpec, max_recursion_depth: int = 3) -> str:
    """The regex a spec compiles to (``json_object``: see ``json_object_regex``)."""
    if spec.kind == "regex":
        return spec.value
    if spec.kind == "json_object":
        return json_object_regex(min(max_recursion_depth, 2))
    try:
        return str(build_regex_from_schema(spec.value, None, max_recursion_depth))
    except Exception as exc:  # outlines-core raises its own error types
        raise GrammarError(f"invalid JSON schema: {exc}") from exc


def build_index(regex: str, tokens: list[bytes | None], eos_token_id: int) -> Index:
    vocab: dict[bytes, list[int]] = {}
    for i, b in enumerate(tokens):
        if b is not None and i != eos_token_id:
            vocab.setdefault(b, []).append(i)
    try:
        return Index(regex, Vocabulary(eos_token_id, vocab))
    except Exception as exc:
        raise GrammarError(f"cannot compile regex {regex[:200]!r}: {exc}") from exc


class DFAGuide:
    """Token transitions of one regex over one vocabulary, with distances to acceptance."""

    def __init__(self, index: Index, eos_token_ids: Iterable[int], vocab_size: int) -> None:
        self.index = index
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(set(eos_token_ids))
        eos = set(self.eos_token_ids)
        self.initial: int = index.get_initial_state()
        self.finals: frozenset[int] = frozenset(index.get_final_states())
        self.transitions: dict[int, dict[int, int]] = {
            s: {t: n for t, n in edges.items() if t not in eos} for s, edges in index.get_transitions().items()
        }
        self.dist = self._distances()
        if self.dist.get(self.initial, INF) >= INF:
            raise GrammarError("the pattern accepts no string this vocabulary can spell")
        self._succ_max: dict[int, int] = {}
        self._full: dict[int, torch.Tensor] = {}
        self._tight: dict[tuple[int, int], torch.Tensor] = {}

    def _distances(self) -> dict[int, int]:
        reverse: dict[int, set[int]] = {}
        for s, edges in self.transitions.items():
            for n in edges.values():
                reverse.setdefault(n, set()).add(s)
        dist = dict.fromkeys(self.finals, 0)
        queue = deque(self.finals)
        while queue:
            s = queue.popleft()
            for p in reverse.get(s, ()):
                if p not in dist:
                    dist[p] = dist[s] + 1
                    queue.append(p)
        return dist

    @property
    def min_tokens(self) -> int:
        return self.dist[self.initial]

    def distance(self, state: int) -> int:
        return self.dist.get(state, INF)

    def next_state(self, state: int, token: int) -> int | None:
        """None: the token is not allowed here (EOS keeps the state)."""
        if token in self.eos_token_ids:
            return state if state in self.finals else None
        return self.transitions.get(state, {}).get(token)

    def _build(self, state: int, limit: int) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        edges = self.transitions.get(state, {})
        ids = [t for t, n in edges.items() if self.dist.get(n, INF) <= limit and t < len(mask)]
        if state in self.finals:
            ids.extend(t for t in self.eos_token_ids if t < len(mask))
        if ids:
            mask[torch.tensor(ids, dtype=torch.long)] = True
        return mask

    def is_tight(self, state: int, remaining: int) -> bool:
        """Whether the budget rules out some successor (the mask is then narrower than the state's)."""
        succ_max = self._succ_max.get(state)
        if succ_max is None:
            finite = (d for n in self.transitions.get(state, {}).values() if (d := self.dist.get(n, INF)) < INF)
            succ_max = self._succ_max[state] = max(finite, default=0)
        return remaining - 1 < succ_max

    def mask(self, state: int, remaining: int) -> torch.Tensor:
        if not self.is_tight(state, remaining):
            full = self._full.get(state)
            if full is None:
                full = self._full[state] = self._build(state, INF - 1)
            return full
        key = (state, remaining - 1)
        tight = self._tight.get(key)
        if tight is None:
            tight = self._tight[key] = self._build(state, remaining - 1)
        return tight

    @property
    def num_cached_masks(self) -> int:
        return len(self._full) + len(self._tight)


class DFAConstraint(Constraint):
    """A request's state in a ``DFAGuide`` and its remaining token budget."""

    def __init__(self, guide: DFAGuide, budget: int) -> None:
        check_budget(guide.min_tokens, budget)
        self.guide = guide
        self.state = guide.initial
        self.remaining = budget

    def mask(self) -> torch.Tensor:
        """The guide's length-safe mask for the current state, over the guide's vocabulary."""
        return self.guide.mask(self.state, self.remaining)

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        return fit_mask(self.mask(), vocab_size)

    def accept(self, token: int) -> None:
        nxt = self.guide.next_state(self.state, token)
        if nxt is None:
            raise ValueError(f"token {token} is not allowed in DFA state {self.state}")
        self.state = nxt
        self.remaining -= 1

    @property
    def is_accepting(self) -> bool:
        return self.state in self.guide.finals
