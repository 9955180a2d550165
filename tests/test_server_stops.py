"""Stop strings in streamed text: the matcher agrees with a brute-force scan however the text is
cut into pieces, and its work is linear in the text (long stop strings cannot stall the loop)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from forge.server.stops import StopMatcher

ALPHABET = "abé"


def first_completed(text: str, stops: list[str]) -> tuple[int, str] | None:
    """Brute force: the earliest end position at which a stop string completes; of those ending
    there, the longest. Returns (start, stop)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return end - len(stop), stop
    return None


def longest_held(text: str, stops: list[str]) -> int:
    """Brute force: the longest suffix of ``text`` that is a proper prefix of a stop string."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4),
    pieces=st.lists(st.text(ALPHABET, max_size=4), max_size=12),
)
def test_matcher_agrees_with_brute_force(stops: list[str], pieces: list[str]) -> None:
    matcher = StopMatcher(stops)
    text = ""
    expected = first_completed("".join(pieces), stops)
    for piece in pieces:
        hit = matcher.feed(piece)
        if hit is not None:
            assert (hit.start, hit.stop) == expected
            return
        text += piece
        assert matcher.fed == len(text)
        assert matcher.hold == longest_held(text, stops)
    assert expected is None


def test_long_stop_strings_cost_linear_time() -> None:
    """16 stop strings of 1024 characters (the default cap) against 200k characters fed a few at
    a time, text that keeps almost matching (a 1022-character hold-back) and text that never
    starts one: each character costs O(1), so this takes ~0.2 s unloaded."""
    stops = [("ab" * 511) + "a" + chr(ord("c") + i) for i in range(16)]
    matcher = StopMatcher(stops)
    t0 = time.perf_counter()
    for _ in range(25_000):
        assert matcher.feed("abab") is None
        assert matcher.hold == min(matcher.fed, 1022)
    for _ in range(25_000):
        assert matcher.feed("xyzw") is None and matcher.hold == 0
    hit = matcher.feed("ab" * 511 + "ad")
    assert hit is not None and hit.stop == stops[1] and hit.start == 200_000
    assert time.perf_counter() - t0 < 30  # generous: the machine is shared and loaded
