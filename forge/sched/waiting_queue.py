"""The scheduler's waiting queue, ordered by the policy's key."""

from __future__ import annotations

import heapq
import itertools
from typing import Any

from forge.core.request import Request
from forge.policies.base import Policy


class WaitingQueue:
    """Policy-ordered queue with O(log n) push/pop and lazy removal."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._heap: list[tuple[Any, int, Request]] = []
        self._counter = itertools.count()
        self._live: dict[str, Request] = {}

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (self._policy.waiting_key(request), next(self._counter), request))
        self._live[request.request_id] = request

    def _drop_dead(self) -> None:
        while self._heap and self._heap[0][2].request_id not in self._live:
            heapq.heappop(self._heap)

    def peek(self) -> Request | None:
        self._drop_dead()
        return self._heap[0][2] if self._heap else None

    def pop(self) -> Request:
        self._drop_dead()
        request = heapq.heappop(self._heap)[2]
        del self._live[request.request_id]
        return request

    def remove(self, request_id: str) -> Request | None:
        return self._live.pop(request_id, None)

    def rekey(self) -> None:
        """Recompute every live request's key (for policies with ``rekey_each_step``)."""
        self._heap = [(self._policy.waiting_key(r), next(self._counter), r) for r in self._live.values()]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Any:
        return iter(self._live.values())
