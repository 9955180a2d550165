"""``ReplicaView`` (``forge.routers.base``) over an engine: the queries a router may make of a replica."""

from __future__ import annotations

from forge.core.request import Request
from forge.engine.engine import Engine


class EngineView:
    """A read-only view of one replica's engine, read live at each call (so one view serves a whole run)."""

    __slots__ = ("_engine", "_index")

    def __init__(self, index: int, engine: Engine) -> None:
        self._index = index
        self._engine = engine

    @property
    def index(self) -> int:
        return self._index

    @property
    def num_waiting(self) -> int:
        scheduler = self._engine.scheduler
        return len(scheduler.waiting) + len(scheduler.swapped)

    @property
    def num_running(self) -> int:
        return len(self._engine.scheduler.running)

    @property
    def num_outstanding(self) -> int:
        return self._engine.scheduler.num_unfinished

    @property
    def outstanding_tokens(self) -> int:
        total = 0
        for r in self._engine.requests.values():
            total += max(r.num_prompt_tokens - r.num_computed_tokens, 0)
            total += max(r.sampling_params.max_tokens - r.num_output_tokens, 0)
        return total

    @property
    def kv_usage(self) -> float:
        return self._engine.scheduler.kv.usage_fraction

    def prefix_match(self, request: Request) -> int:
        return self._engine.scheduler.kv.cached_prefix_len(request)
