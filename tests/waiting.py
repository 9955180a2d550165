"""Waiting in tests for a condition to hold, instead of asserting it holds within a fixed few seconds
of wall clock (which a loaded machine misses): poll until it holds, failing only past a generous
bound that a working server never comes near."""

from __future__ import annotations

import time
from collections.abc import Callable

BOUND_S = 180.0


def wait_until(
    condition: Callable[[], bool],
    describe: Callable[[], str] | str,
    bound_s: float = BOUND_S,
    period_s: float = 0.02,
) -> None:
    """Return once ``condition()`` is true; after ``bound_s`` seconds (or as many polls as that many
    seconds hold at ``period_s``, whichever comes first) fail with ``describe`` (a callable is called
    then, to show the state that never changed). Polls back off to ten times ``period_s``."""
    end = time.monotonic() + bound_s
    period = period_s
    for _ in range(int(bound_s / period_s) + 1):
        if condition():
            return
        if time.monotonic() >= end:
            break
        time.sleep(period)
        period = min(period * 1.5, 10 * period_s)
    raise AssertionError(f"still not so after {bound_s:.0f} s: {describe() if callable(describe) else describe}")
