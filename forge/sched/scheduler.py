"""The one scheduling loop: each step, every request gets (part of) the gap between its computed
and known tokens, within a token budget. Chunked prefill, prefix-cache hits, decoding,
speculative drafts and preemption by recompute are all that one mechanism. Its mixins: requests in and
out (``scheduler_requests``), the update after the model ran (``step_updates``) and the column-wise
steps (``decode_steps``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from forge.core.fast_paths import declares_fast_paths
from forge.core.outputs import ScheduledRequest, SchedulerOutput
from forge.core.request import Request, RequestStatus
from forge.kvcache.base import DecodeRunCache, KVCacheManager
from forge.policies.base import Policy, PolicyContext
from forge.sched.decode_steps import DecodeRunSteps
from forge.sched.running_decodes import RunningDecodes
from forge.sched.scheduler_requests import SchedulerRequests
from forge.sched.step_rows import StepRows
from forge.sched.waiting_queue import WaitingQueue


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # recompute | swap (falls back to recompute when the KV can't swap)

    def __post_init__(self) -> None:
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"engine.preemption_mode must be recompute or swap, got {self.preemption_mode!r}")


class Scheduler(SchedulerRequests, DecodeRunSteps):
    """Owns the waiting queue and the running list; the policy only orders them.

    ``fast_paths``: take the policy's and the KV cache's fast paths (``decode_slot``, decode runs)
    where their classes declare them (``forge.core.fast_paths``); False: the plain path for both."""

    def __init__(self, policy: Policy, kv: KVCacheManager, limits: SchedulerLimits, fast_paths: bool = True) -> None:
        self.policy = policy
        self.kv = kv
        self.limits = limits
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.swapped: list[Request] = []  # preempted by swap, served before waiting requests
        self._forks: dict[str, list[Request]] = {}  # parent id -> children forked once its prompt is computed
        self.num_preemptions = 0
        # the running requests' decode rows since the last run; None once a step schedules one, a swap-in or an abort
        self._running_decodes: RunningDecodes | None = None
        self._grouped = kv.kv_groups is not None and kv.kv_groups.num_groups > 1  # rows carry several tables
        kv_fast = fast_paths and declares_fast_paths(kv)
        # a decode's slot: the cache's own fast ``decode_slot``, or through ``allocate_slots`` + ``block_table``
        self._decode_slot = kv.decode_slot if kv_fast else partial(KVCacheManager.decode_slot, kv)
        # the cache's decode runs (``plan_decode_run``): a declaring cache with that interface, a declaring policy
        self._run_kv = kv if kv_fast and isinstance(kv, DecodeRunCache) and declares_fast_paths(policy) else None
        policy.bind(PolicyContext(prefix_len=kv.cached_prefix_len, num_waiting=self.waiting.__len__))

    # -- one step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        total = budget = self.policy.token_budget(self.limits.max_num_batched_tokens)
        step = StepRows()
        if self.policy.rekey_each_step and len(self.waiting):
            self.waiting.rekey()
        admitted = False
        if self.policy.waiting_first:
            budget = self._swap_in(budget, step)
            if not self.swapped:
                before = budget
                budget = self._admit(budget, step)
                admitted = budget != before
        if admitted and self.policy.prefill_only_steps:
            preempted: list[Request] = []
        else:
            self._running_decodes = None
            budget, preempted = self._schedule_running(budget, step)
        if not preempted and not self.policy.waiting_first:
            budget = self._swap_in(budget, step)
            if not self.swapped:
                budget = self._admit(budget, step)
        ops = self.kv.take_block_ops()
        return SchedulerOutput(
            step.rows,
            num_batched_tokens=total - budget,
            preempted_ids=[r.request_id for r in preempted],
            num_waiting=len(self.waiting),
            swap_out=ops.swap_out,
            copy_blocks=ops.copy_blocks,
            swap_in=ops.swap_in,
            decodes=step.decodes(),
            chunk_requests=step.requests,
        )

    def _swap_in(self, budget: int, step: StepRows) -> int:
        """Bring swapped-out requests back, oldest preemption first, each with its next chunk."""
        while self.swapped and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.swapped[0]
            n = min(request.num_tokens_with_spec - request.num_computed_tokens, budget)
            if not self.kv.swap_in(request, request.num_computed_tokens + n):
                break
            self._running_decodes = None
            self.swapped.pop(0)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            ok = self._allocate(request, n, request.num_tokens)
            assert ok, "swap_in covered the chunk"
            step.add_chunk(self._scheduled(request, n, request.num_tokens), request)
            budget -= n
        return budget

    def _schedule_running(self, budget: int, step: StepRows) -> tuple[int, list[Request]]:
        """Schedule the running requests in the policy's order (each its gap, within ``budget``);
        returns the budget left and the requests preempted to make room."""
        preempted: list[Request] = []
        swapped_in = () if step.is_empty else step.request_ids()  # already scheduled (waiting-first swap-ins)
        running = RequestStatus.RUNNING
        decode_slot, grouped = self._decode_slot, self._grouped
        add_request, add_table = step.decode_requests.append, step.decode_tables.append
        for request in list(self.policy.running_order(self.running)):
            if budget == 0:
                break
            if request.status is not running or (swapped_in and request.request_id in swapped_in):
                continue
            if request.is_decoding:
                table = decode_slot(request)
                if table is not None:
                    if grouped:  # the hybrid allocator: the other KV cache groups' tables too
                        step.add_decode(request, table, self.kv.group_tables(request.request_id))
                    else:  # column-wise (``StepRows.add_decode``)
                        add_request(request)
                        add_table(table)
                    budget -= 1
                    continue
            known = request.num_tokens
            n = min(known + len(request.spec_token_ids) - request.num_computed_tokens, budget)
            if n <= 0:
                continue
            if request.spec_token_ids:
                n = self._fit_drafts(request, n)
            if not self._allocate(request, n, known):
                n, victims = self._make_room(request, n, known, step.request_ids())
                preempted += victims
                if n == 0:  # the request itself was preempted
                    continue
            step.add_chunk(self._scheduled(request, n, known), request)
            budget -= n
        return budget, preempted

    def _make_room(self, request: Request, n: int, known: int, scheduled: set[str]) -> tuple[int, list[Request]]:
        """Slots for ``n`` tokens of a running request did not fit: drop its drafts, then preempt
        requests not ``scheduled`` this step (the policy picks; possibly this one) until they do.
        Returns the tokens it gets (0: it was preempted) and the requests preempted."""
        preempted: list[Request] = []
        while True:
            if request.spec_token_ids:  # drafts never cause a preemption: drop them first
                n = self._fit_drafts(request, n - len(request.spec_token_ids))
            else:
                victim = self.policy.pick_victim([r for r in self.running if r.request_id not in scheduled])
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    return 0, preempted
            if self._allocate(request, n, known):
                return n, preempted

    def _admit(self, budget: int, step: StepRows) -> int:
        """Admit waiting requests in queue order while budget, ``max_num_seqs`` and the KV cache (less
        the policy's ``admission_watermark`` of free blocks) allow; returns the budget left."""
        reserve = self.policy.admission_watermark * self.kv.num_blocks
        while budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting.peek()
            if request is None:
                break
            if request.num_computed_tokens == 0 and not _computes_whole_prompt(request):
                # a request asking for prompt logprobs or an embedding computes its whole prompt: no
                # prefix-cache hit (the cached positions' logits or hidden states would be missing)
                request.num_computed_tokens = request.num_cached_tokens = self.kv.match_prefix(request)
            known = request.num_tokens
            gap = request.num_tokens_with_spec - request.num_computed_tokens
            if gap > budget and not self.limits.enable_chunked_prefill:
                break
            n = min(gap, budget)
            if not self._allocate(request, n, known) or (reserve and self.kv.num_free_blocks() < reserve):
                if not self.running and step.is_empty:
                    raise RuntimeError(
                        f"request {request.request_id} ({request.num_tokens} tokens) does not fit in an empty "
                        f"KV cache of {self.kv.num_blocks} blocks x {self.kv.block_size}: raise kvcache.num_blocks"
                    )
                self.kv.free(request)
                request.num_computed_tokens = request.num_cached_tokens = 0
                break
            self.waiting.pop()
            if request.prompt_cached_tokens is None:
                request.prompt_cached_tokens = request.num_cached_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            step.add_chunk(self._scheduled(request, n, known), request)
            budget -= n
        return budget

    def _allocate(self, request: Request, n: int, known: int) -> bool:
        """Slots for the next ``n`` tokens (``known``: prompt + output length; only those are cacheable)."""
        end = request.num_computed_tokens + n
        return self.kv.allocate_slots(request, end, end if end < known else known)

    def _scheduled(self, request: Request, n: int, known: int) -> ScheduledRequest:
        """The chunk of ``n`` tokens from the request's first uncomputed one (``known``: its prompt + output length)."""
        start = request.num_computed_tokens
        end = start + n
        prompt_rows = 0
        if request.sampling_params.prompt_logprobs is not None and not request.output_token_ids:
            # (a request recomputed after its first output has already returned them)
            prompt_rows = max(0, min(end, request.num_prompt_tokens - 1) - start)
        return ScheduledRequest(
            request.request_id,
            start,
            n,
            request.token_ids(start, end),
            self.kv.block_table(request.request_id),
            end == known + len(request.spec_token_ids) and request.pooling_params is None,
            end - known if end > known else 0,
            prompt_rows,
            self.kv.group_tables(request.request_id) if self._grouped else (),
        )

    @staticmethod
    def _fit_drafts(request: Request, n: int) -> int:
        """Drafts are verified in one step or not at all: drop those beyond the ``n`` tokens this
        step gives the request; returns the tokens to schedule."""
        keep = request.num_computed_tokens + n - request.num_tokens
        if keep < len(request.spec_token_ids):
            request.spec_token_ids = request.spec_token_ids[: max(keep, 0)]
        return min(n, request.num_tokens_with_spec - request.num_computed_tokens)

    def _preempt(self, request: Request) -> None:
        """Preemption by swap (KV copied to the CPU pool; computed tokens kept) when configured and
        possible, else by recompute: drop the request's KV and requeue it."""
        self.running.remove(request)
        if self.limits.preemption_mode == "swap" and self.kv.swap_out(request):
            request.spec_token_ids = []
            request.num_preemptions += 1
            request.status = RequestStatus.WAITING
            self.num_preemptions += 1
            self.swapped.append(request)
            return
        self.kv.free(request)
        request.num_computed_tokens = request.num_cached_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.num_preemptions += 1
        self.waiting.push(request)


def _computes_whole_prompt(request: Request) -> bool:
    """Whether ``request`` needs every prompt position computed (so takes no prefix-cache hit)."""
    return request.sampling_params.prompt_logprobs is not None or request.pooling_params is not None
