"""Power of two choices (Mitzenmacher, 2001): two replicas drawn at random, fewer outstanding tokens wins."""

from __future__ import annotations

import random as _random
from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router


class PowerOfTwo(Router):
    """Two distinct replicas drawn by ``random.Random(seed)``; the one with fewer ``outstanding_tokens``
    takes the request (ties: the lower index). One replica: that one."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        if len(replicas) == 1:
            return 0
        a, b = self._rng.sample(range(len(replicas)), 2)
        ra, rb = replicas[a], replicas[b]
        return min((ra.outstanding_tokens, a), (rb.outstanding_tokens, b))[1]
