"""Stop strings matched in streamed text in linear time (an Aho-Corasick automaton).

Text is fed as it arrives; each character costs amortised O(1) however many and however long
the stop strings are, so a request cannot stall the event loop with long or many stop strings."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StopHit:
    """A stop string was completed: it starts at ``start`` in the fed text."""

    start: int
    stop: str


class StopMatcher:
    """``feed`` the text of one choice piece by piece. A match is reported at the first
    character that completes any stop string (the longest one ending there wins, so the cut is
    as early as possible); ``hold`` is the length of the longest suffix of the text fed so far
    that is a proper prefix of some stop string (text that must not be sent yet)."""

    def __init__(self, stops: list[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._fail = [0]
        self._match: list[str | None] = [None]  # longest stop string ending at each state
        for stop in stops:
            self._insert(stop)
        self._link()
        self._state = 0
        self._fed = 0

    @property
    def hold(self) -> int:
        return self._depth[self._state]

    @property
    def fed(self) -> int:
        """Characters fed so far."""
        return self._fed

    def feed(self, text: str) -> StopHit | None:
        """Advance over ``text``; on the first completed stop string, stop there and report it
        (``fed`` counts the characters up to it; feeding the rest finds the next one)."""
        goto, fail = self._goto, self._fail
        state = self._state
        for ch in text:
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            self._fed += 1
            stop = self._match[state]
            if stop is not None:
                self._state = state
                return StopHit(self._fed - len(stop), stop)
        self._state = state
        return None

    def _insert(self, stop: str) -> None:
        state = 0
        for ch in stop:
            nxt = self._goto[state].get(ch)
            if nxt is None:
                nxt = len(self._goto)
                self._goto[state][ch] = nxt
                self._goto.append({})
                self._depth.append(self._depth[state] + 1)
                self._fail.append(0)
                self._match.append(None)
            state = nxt
        self._match[state] = stop

    def _link(self) -> None:
        """Failure links breadth-first; a state whose own path is no stop string inherits the
        longest stop string ending at its failure state."""
        queue = deque(self._goto[0].values())
        while queue:
            state = queue.popleft()
            for ch, child in self._goto[state].items():
                f = self._fail[state]
                while f and ch not in self._goto[f]:
                    f = self._fail[f]
                target = self._goto[f].get(ch, 0)
                self._fail[child] = target if target != child else 0
                if self._match[child] is None:
                    self._match[child] = self._match[self._fail[child]]
                queue.append(child)
