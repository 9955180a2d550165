"""The policy contract: which waiting request goes next, in what order running ones get budget,
and whom to preempt."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.core.request import Request


def _no_prefix(request: Request) -> int:
    return 0


def _zero() -> int:
    return 0


@dataclass(frozen=True)
class PolicyContext:
    """Read-only views of scheduler state a policy may consult (given once, via ``bind``).

    ``prefix_len(req)``: tokens of ``req``'s known tokens already held by the prefix cache
    (0 without prefix caching). A pure query: it takes no references and changes nothing.
    ``num_waiting()``: requests in the waiting queue now.
    """

    prefix_len: Callable[[Request], int] = _no_prefix
    num_waiting: Callable[[], int] = _zero


class Policy(ABC):
    """Ordering decisions only; the scheduler owns budgets, admission and the KV cache.

    - ``waiting_key(req)``: the waiting queue is served in ascending key order. Keys are
      computed when a request (re)joins the queue, and again for every waiting request at
      the start of each step when ``rekey_each_step`` is set (for keys that depend on
      state that changes while a request waits, such as the prefix cache).
    - ``running_order(running)``: the order in which running requests receive token budget
      (default: admission order). Returns a new list or ``running`` itself, never mutates it.
    - ``pick_victim(candidates)``: the request to preempt when the cache is full (default:
      the one the queue would serve last).
    - ``waiting_first``: give waiting requests the budget before running ones.
    - ``token_budget(engine_budget)``: tokens one step may schedule (default: the engine's
      ``max_num_batched_tokens``); a policy may cap it (Sarathi's chunk size).
    - ``prefill_only_steps``: a step that admits a waiting request (with ``waiting_first``) gives
      running requests no budget, so a step is prefill-only or decode-only (vLLM V0).
    - ``admission_watermark``: fraction of the KV cache's blocks an admission must leave free
      (a request is admitted only if, after its blocks are allocated, at least
      ``admission_watermark * num_blocks`` remain free); running requests may use them.
    - ``bind(ctx)``: called once by the scheduler with a ``PolicyContext``.

    Fast paths (``forge.core.fast_paths``): a class that sets ``fast_paths = True`` in its own body
    promises that ``token_budget`` and ``running_order`` are pure functions of their arguments (and
    of settings fixed when it was built), so the engine may call them once for many consecutive
    decode steps (a ``DecodeRun``). A class that does not (a subclass inherits no declaration) has
    them called every step: a stateful budget or order is honoured exactly.
    """

    waiting_first: bool = False
    rekey_each_step: bool = False
    prefill_only_steps: bool = False
    admission_watermark: float = 0.0
    ctx: PolicyContext = PolicyContext()

    def bind(self, ctx: PolicyContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def waiting_key(self, request: Request) -> Any: ...

    def running_order(self, running: list[Request]) -> list[Request]:
        return running

    def pick_victim(self, candidates: list[Request]) -> Request:
        return max(candidates, key=self.waiting_key)

    def token_budget(self, engine_budget: int) -> int:
        return engine_budget


def is_decoding(request: Request) -> bool:
    """The request has computed its whole prompt: what remains is output (or draft) tokens."""
    return request.num_computed_tokens >= request.num_prompt_tokens


def split_decoding(running: list[Request]) -> tuple[list[Request], list[Request]]:
    """``running`` as (decoding, still prefilling), each in its original order."""
    decodes: list[Request] = []
    prefills: list[Request] = []
    for r in running:
        (decodes if is_decoding(r) else prefills).append(r)
    return decodes, prefills
