"""The scheduler's requests in and out (a mixin of ``forge.sched.scheduler.Scheduler``): a request
added to the waiting queue (with the children it forks, ``n > 1``) or refused when it can never run
under the limits, aborted from whichever queue holds it, and the count of those unfinished."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.core.request import Request, RequestStatus
from forge.kvcache.base import KVCacheManager
from forge.policies.base import Policy
from forge.sched.running_decodes import RunningDecodes
from forge.sched.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from forge.sched.scheduler import SchedulerLimits


class SchedulerRequests:
    """``add_request``, ``refusal``, ``abort`` and ``num_unfinished``; the state is the scheduler's
    (``Scheduler.__init__``)."""

    kv: KVCacheManager
    policy: Policy
    limits: SchedulerLimits
    waiting: WaitingQueue
    running: list[Request]
    swapped: list[Request]
    _forks: dict[str, list[Request]]
    _running_decodes: RunningDecodes | None

    def add_request(self, request: Request, forks: Sequence[Request] = ()) -> None:
        """``forks``: children sampling from the same prompt (``n > 1``); once ``request`` has
        computed its prompt each child shares its KV blocks (copy-on-write) and runs on its own."""
        refusal = self.refusal(request)
        if refusal is not None:
            raise ValueError(refusal)
        request.status = RequestStatus.WAITING
        self.waiting.push(request)
        if forks:
            self._forks[request.request_id] = list(forks)
            for child in forks:
                child.status = RequestStatus.WAITING

    def refuses_any(self, requests: Sequence[Request]) -> bool:
        """Whether ``refusal`` refuses some of ``requests``: it grows with the prompt and with the prompt plus
        ``max_tokens``, so the longest and the largest decide."""
        if not requests:
            return False
        longest = max(requests, key=lambda r: r.num_prompt_tokens)
        largest = max(requests, key=lambda r: r.num_prompt_tokens + r.sampling_params.max_tokens)
        return self.refusal(longest) is not None or self.refusal(largest) is not None

    def refusal(self, request: Request) -> str | None:
        """Why ``add_request`` would refuse ``request`` (it can never run under these limits), or None.
        An embedding request (``pooling_params``) generates nothing: its prompt may fill ``max_model_len``."""
        pooling = request.pooling_params is not None
        if pooling and request.num_tokens > self.limits.max_model_len:
            return (
                f"request {request.request_id}: prompt of {request.num_prompt_tokens} tokens is longer than "
                f"engine.max_model_len={self.limits.max_model_len}"
            )
        if not pooling and request.num_tokens + 1 > self.limits.max_model_len:
            return (
                f"request {request.request_id}: prompt of {request.num_prompt_tokens} tokens leaves no room "
                f"to generate within engine.max_model_len={self.limits.max_model_len}"
            )
        if pooling and (request.output_token_ids or request.sampling_params.n > 1):
            return f"request {request.request_id}: an embedding request has one prompt, no output and n = 1"
        generated = 0 if pooling else request.sampling_params.max_tokens
        need = self.kv.reserved_tokens(request, min(request.num_prompt_tokens + generated, self.limits.max_model_len))
        capacity = self.kv.token_capacity(self.limits.max_num_batched_tokens)
        if need > capacity:
            return (
                f"request {request.request_id} may need {need} tokens of KV but the whole cache holds "
                f"{capacity} (kvcache.num_blocks={self.kv.num_blocks} x block_size={self.kv.block_size})"
            )
        return self._watermark_refusal(request)

    def _watermark_refusal(self, request: Request) -> str | None:
        """Why ``request``'s admission could never leave the policy's ``admission_watermark`` of the blocks
        free, even in an empty cache (its first chunk: the whole prompt without chunked prefill), or None."""
        watermark = self.policy.admission_watermark * self.kv.num_blocks
        if not watermark:
            return None
        first = request.num_prompt_tokens
        if self.limits.enable_chunked_prefill:
            first = min(first, self.limits.max_num_batched_tokens)
        blocks = -(-self.kv.reserved_tokens(request, first) // self.kv.block_size)
        if self.kv.num_blocks - blocks >= watermark:
            return None
        return (
            f"request {request.request_id}: its first {first} tokens take {blocks} of the KV cache's "
            f"{self.kv.num_blocks} blocks, leaving less than the scheduler's admission watermark "
            f"({self.policy.admission_watermark:g} of them) free: raise kvcache.num_blocks"
        )

    def abort(self, request_id: str, step_failed: bool = False) -> Request | None:
        """Stop a request and free its blocks; None if it is unknown. ``step_failed``: the step that
        was to compute its scheduled tokens raised, so its unwritten blocks leave the prefix cache
        (``KVCacheManager.discard``)."""
        self._running_decodes = None
        request = self.waiting.remove(request_id)
        if request is None:
            request = self._remove_pending(request_id)
        if request is None:
            request = next((r for r in self.running if r.request_id == request_id), None)
            if request is None:
                return None
            self.running.remove(request)
        for child in self._forks.pop(request_id, []):  # the parent will not fork: run them alone
            self.waiting.push(child)
        if step_failed:
            self.kv.discard(request)
        else:
            self.kv.free(request)
        request.status = RequestStatus.FINISHED_ABORTED
        return request

    @property
    def num_unfinished(self) -> int:
        forked = sum(map(len, self._forks.values())) if self._forks else 0
        return len(self.waiting) + len(self.running) + len(self.swapped) + forked

    @property
    def has_unfinished(self) -> bool:
        """``num_unfinished > 0``, the running list read first (the common case: nothing else counted)."""
        return bool(self.running) or self.num_unfinished > 0

    def _remove_pending(self, request_id: str) -> Request | None:
        """Take a swapped-out request or a not-yet-forked child out of its queue."""
        for i, r in enumerate(self.swapped):
            if r.request_id == request_id:
                return self.swapped.pop(i)
        for children in self._forks.values():
            for i, r in enumerate(children):
                if r.request_id == request_id:
                    return children.pop(i)
        return None
