"""The policy contract: which waiting request goes next, in what order running ones get budget,
and whom to preempt."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from forge.request import Request


class Policy(ABC):
    """Ordering decisions only; the scheduler owns budgets, admission and the KV cache.

    - ``waiting_key(req)``: the waiting queue is served in ascending key order. Keys are
      computed once, when a request (re)joins the queue.
    - ``running_order(running)``: the order in which running requests receive token budget
      (default: admission order).
    - ``pick_victim(candidates)``: the request to preempt when the cache is full (default:
      the one the queue would serve last).
    - ``waiting_first``: give waiting requests the budget before running ones.
    """

    waiting_first: bool = False

    @abstractmethod
    def waiting_key(self, request: Request) -> Any: ...

    def running_order(self, running: list[Request]) -> list[Request]:
        return running

    def pick_victim(self, candidates: list[Request]) -> Request:
        return max(candidates, key=self.waiting_key)
