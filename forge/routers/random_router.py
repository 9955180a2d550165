"""Random: each request to a replica drawn uniformly by a generator seeded from the config."""

from __future__ import annotations

import random as _random
from collections.abc import Sequence

from forge.core.request import Request
from forge.routers.base import ReplicaView, Router


class RandomRouter(Router):
    """A uniform draw per request from ``random.Random(seed)``: the same seed, the same routing."""

    reads_replicas = False  # only their number

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def route(self, request: Request, replicas: Sequence[ReplicaView]) -> int:
        return self._rng.randrange(len(replicas))
