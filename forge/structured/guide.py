"""Per-state token masks with a length guard over a token-level DFA (``forge.structured.dfa``).

``DFAGuide.mask(state, remaining)`` is the allowed-token mask when ``remaining`` tokens may still
be generated, this one included. A token t is allowed iff it is EOS in an accepting state, or
``dist[next(state, t)] <= remaining - 1``, where ``dist[s]`` is the fewest tokens from ``s`` to an
accepting state (reverse BFS over the token transitions, computed once per grammar when the
tables are built). Starting
from ``dist[initial] <= budget`` (checked when the request is admitted) the invariant
``dist[state] <= remaining`` holds after every token, so when the budget is spent the state is
accepting: output cut by ``max_tokens`` still parses. Masks are cached: one bool tensor per
state for the unconstrained case (``remaining`` larger than every successor's distance), and per
``(state, remaining)`` only near the end of the budget.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from forge.structured.base import Constraint, check_budget, fit_mask
from forge.structured.dfa import INF, DFATables

if TYPE_CHECKING:  # torch is imported when a mask is built: the config names this backend without loading it
    import torch

_BYTES_PER_MASK = 200  # a cached mask's tensor overhead besides its vocab_size bools


class DFAGuide:
    """Token transitions of one regex over one vocabulary (``DFATables``, built by
    ``forge.structured.dfa.build_tables``), with masks cached per state."""

    def __init__(self, tables: DFATables, eos_token_ids: Iterable[int], vocab_size: int) -> None:
        self.tables = tables
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(set(eos_token_ids))
        self.initial = tables.initial
        self.finals = tables.finals
        self.transitions = tables.transitions
        self.dist = tables.dist
        self._tables_nbytes = tables.nbytes
        self._succ_max: dict[int, int] = {}
        self._full: dict[int, torch.Tensor] = {}
        self._tight: dict[tuple[int, int], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        """Tables plus the masks cached so far."""
        return self._tables_nbytes + self.num_cached_masks * (self.vocab_size + _BYTES_PER_MASK)

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
        import torch

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
