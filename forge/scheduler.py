"""The one scheduling loop: each step, every request gets (part of) the gap between its computed
and known tokens, within a token budget. Chunked prefill, prefix-cache hits, decoding,
speculative drafts and preemption by recompute are all that one mechanism."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from forge.kvcache.base import KVCacheManager
from forge.outputs import ModelOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from forge.policies.base import Policy, PolicyContext
from forge.request import Request, RequestStatus
from forge.step_outputs import StepOutputs
from forge.step_rows import StepRows
from forge.waiting_queue import WaitingQueue


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


class Scheduler:
    """Owns the waiting queue and the running list; the policy only orders them."""

    def __init__(self, policy: Policy, kv: KVCacheManager, limits: SchedulerLimits) -> None:
        self.policy = policy
        self.kv = kv
        self.limits = limits
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.swapped: list[Request] = []  # preempted by swap, served before waiting requests
        self._forks: dict[str, list[Request]] = {}  # parent id -> children forked once its prompt is computed
        self.num_preemptions = 0
        # The last step scheduled and its decodes' and other rows' requests, so ``update`` needs no lookup by id.
        self._in_flight: tuple[SchedulerOutput, list[Request], list[Request]] | None = None
        policy.bind(PolicyContext(prefix_len=kv.cached_prefix_len, num_waiting=self.waiting.__len__))

    # -- requests in and out -------------------------------------------------------
    def add_request(self, request: Request, forks: Sequence[Request] = ()) -> None:
        """``forks``: children sampling from the same prompt (``n > 1``); once ``request`` has
        computed its prompt each child shares its KV blocks (copy-on-write) and runs on its own."""
        if request.num_tokens + 1 > self.limits.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {request.num_prompt_tokens} tokens leaves no room "
                f"to generate within engine.max_model_len={self.limits.max_model_len}"
            )
        need = min(request.num_prompt_tokens + request.sampling_params.max_tokens, self.limits.max_model_len)
        capacity = self.kv.num_blocks * self.kv.block_size
        if need > capacity:
            raise ValueError(
                f"request {request.request_id} may need {need} tokens of KV but the whole cache holds "
                f"{capacity} (kvcache.num_blocks={self.kv.num_blocks} x block_size={self.kv.block_size})"
            )
        request.status = RequestStatus.WAITING
        self.waiting.push(request)
        if forks:
            self._forks[request.request_id] = list(forks)
            for child in forks:
                child.status = RequestStatus.WAITING

    def abort(self, request_id: str) -> Request | None:
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
        self.kv.free(request)
        request.status = RequestStatus.FINISHED_ABORTED
        return request

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped) + sum(map(len, self._forks.values()))

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

    # -- one step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        total = budget = self.policy.token_budget(self.limits.max_num_batched_tokens)
        step = StepRows()
        preempted: list[Request] = []
        if self.policy.rekey_each_step and len(self.waiting):
            self.waiting.rekey()
        if self.policy.waiting_first:
            budget = self._swap_in(budget, step)
            if not self.swapped:
                budget = self._admit(budget, step)
        budget, decode_seq_lens = self._schedule_running(budget, step, preempted)
        if not preempted and not self.policy.waiting_first:
            budget = self._swap_in(budget, step)
            if not self.swapped:
                budget = self._admit(budget, step)
        ops = self.kv.take_block_ops()
        sched = SchedulerOutput(
            step.rows,
            num_batched_tokens=total - budget,
            preempted_ids=[r.request_id for r in preempted],
            num_waiting=len(self.waiting),
            swap_out=ops.swap_out,
            copy_blocks=ops.copy_blocks,
            swap_in=ops.swap_in,
            totals=step.totals(decode_seq_lens),
            decodes=step.decodes,
        )
        self._in_flight = (sched, step.decode_requests, step.requests)
        return sched

    def _swap_in(self, budget: int, step: StepRows) -> int:
        """Bring swapped-out requests back, oldest preemption first, each with its next chunk."""
        while self.swapped and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.swapped[0]
            n = min(request.num_tokens_with_spec - request.num_computed_tokens, budget)
            if not self.kv.swap_in(request, request.num_computed_tokens + n):
                break
            self.swapped.pop(0)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            ok = self._allocate(request, n, request.num_tokens)
            assert ok, "swap_in covered the chunk"
            step.add_chunk(self._scheduled(request, n, request.num_tokens), request)
            budget -= n
        return budget

    def _schedule_running(self, budget: int, step: StepRows, preempted: list[Request]) -> tuple[int, int]:
        """Returns the budget left and the summed context lengths (start + 1) of the plain decodes
        it scheduled (for the step's totals)."""
        swapped_in = {s.request_id for s in step.rows}  # already scheduled this step (waiting-first swap-ins)
        running = RequestStatus.RUNNING
        kv = self.kv
        rows, requests = step.rows, step.requests
        d = step.decodes  # plain decodes while no other row precedes them: appended column-wise
        ids, starts, tokens = d.request_ids.append, d.starts.append, d.token_ids.append
        decode_tables, decode_requests = d.block_tables.append, step.decode_requests.append
        decode_seq_lens = 0
        tables, bs = kv.decode_tables(), kv.block_size  # tables: where a decode inside a block needs no allocation
        for request in list(self.policy.running_order(self.running)):
            if budget == 0:
                break
            if request.status is not running or (swapped_in and request.request_id in swapped_in):
                continue
            spec = request.spec_token_ids
            out = request.output_token_ids
            computed = request.num_computed_tokens
            known = len(request.prompt_token_ids) + len(out)
            if computed == known - 1 and out and not spec:
                # A plain decode (its one new token is its last output token): the fast path.
                rid = request.request_id
                table = tables[rid] if computed % bs and tables is not None else kv.allocate_decode(request)
                if table is not None:
                    if rows:  # after another row: keep the order
                        rows.append(ScheduledRequest(rid, computed, 1, [out[-1]], table, True))
                        requests.append(request)
                    else:
                        ids(rid)
                        starts(computed)
                        tokens(out[-1])
                        decode_tables(table)
                        decode_requests(request)
                    decode_seq_lens += known
                    budget -= 1
                    continue
            n = known + len(spec) - computed
            if n > budget:
                n = budget
            if n <= 0:
                continue
            if spec:
                n = self._fit_drafts(request, n)
            if not self._allocate(request, n, known):
                n = self._make_room(request, n, known, step, preempted)
                if n == 0:  # the request itself was preempted
                    continue
            step.add_chunk(self._scheduled(request, n, known), request)
            budget -= n
        return budget, decode_seq_lens

    def _make_room(self, request: Request, n: int, known: int, step: StepRows, preempted: list[Request]) -> int:
        """Slots for ``n`` tokens of a running request did not fit: drop its drafts, then preempt
        unscheduled requests (the policy picks; possibly this one) until they do. Returns the
        tokens it gets (0: it was preempted)."""
        while True:
            if request.spec_token_ids:  # drafts never cause a preemption: drop them first
                n = self._fit_drafts(request, n - len(request.spec_token_ids))
            else:
                done = step.request_ids()
                victim = self.policy.pick_victim([r for r in self.running if r.request_id not in done])
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    return 0
            if self._allocate(request, n, known):
                return n

    def _admit(self, budget: int, step: StepRows) -> int:
        while budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting.peek()
            if request is None:
                break
            if request.num_computed_tokens == 0:
                request.num_computed_tokens = request.num_cached_tokens = self.kv.match_prefix(request)
            gap = request.num_tokens_with_spec - request.num_computed_tokens
            if gap > budget and not self.limits.enable_chunked_prefill:
                break
            n = min(gap, budget)
            if not self._allocate(request, n, request.num_tokens):
                if not self.running and not step.rows and not step.decodes:
                    raise RuntimeError(
                        f"request {request.request_id} ({request.num_tokens} tokens) does not fit in an empty "
                        f"KV cache of {self.kv.num_blocks} blocks x {self.kv.block_size}: raise kvcache.num_blocks"
                    )
                self.kv.free(request)
                request.num_computed_tokens = request.num_cached_tokens = 0
                break
            self.waiting.pop()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            step.add_chunk(self._scheduled(request, n, request.num_tokens), request)
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
        return ScheduledRequest(
            request.request_id,
            start,
            n,
            request.token_ids(start, end),
            self.kv.block_table(request.request_id),
            end == known + len(request.spec_token_ids),
            end - known if end > known else 0,
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

    # -- after the model ran ---------------------------------------------------------
    def update(self, sched: SchedulerOutput, out: ModelOutput, eos_token_ids: frozenset[int]) -> StepOutputs:
        """Advance computed tokens, append accepted tokens, finish and free requests. Rows of
        requests aborted since ``schedule`` are skipped (``out.failed``'s have no tokens)."""
        in_flight, self._in_flight = self._in_flight, None
        sampled, tokens = out.sampled_token_ids, out.decode_token_ids
        decoded: list[Request] = []  # plain decodes whose token came column-wise (``decode_tokens``)
        decode_tokens: list[int] = []
        if in_flight is None or in_flight[0] is not sched:
            by_id = {r.request_id: r for r in self.running}
            rows: Iterable[tuple[ScheduledRequest, Request]] = [
                (s, by_id[s.request_id]) for s in sched.scheduled if s.request_id in by_id
            ]
            if tokens is not None:
                sampled = {**sampled, **{rid: [t] for rid, t in zip(sched.decodes.request_ids, tokens, strict=True)}}
        elif tokens is not None or not out.logprobs:  # the decodes column-wise (their outputs carry no logprobs)
            decoded = in_flight[1]
            if out.failed:  # requests whose sampling failed have no token (the engine aborted them)
                decoded = [r for r in decoded if r.request_id not in out.failed]
            decode_tokens = tokens if tokens is not None else [sampled[r.request_id][0] for r in decoded]
            rows = zip(sched.chunks, in_flight[2], strict=True)
        else:
            rows = zip(sched.scheduled, in_flight[1] + in_flight[2], strict=True)
        finished: list[Request] = []  # the decodes' first, then the other rows', in row order
        running = RequestStatus.RUNNING
        plain = not self._forks
        check_stop = self._check_stop
        gone: list[Request] = []
        for request, token in zip(decoded, decode_tokens, strict=True):
            if request.status is not running:  # aborted since it was scheduled
                gone.append(request)
                continue
            request.num_computed_tokens += 1
            if plain and request.constraint is None:  # one plain new token: _accept without its general work
                request.output_token_ids.append(token)
                if check_stop(request, token, eos_token_ids):
                    finished.append(request)
            elif self._accept(request, 0, [token], eos_token_ids)[1]:
                finished.append(request)
        if gone:
            decoded = [r for r in decoded if r not in gone]
        finished_decodes = finished[:]
        outputs: list[RequestOutput] = []
        logprobs = out.logprobs
        for s, request in rows:
            if request.status is not running:
                continue
            request.num_computed_tokens += s.num_tokens
            if not s.sample:
                continue
            rid = s.request_id
            new, stopped = self._accept(request, s.num_draft_tokens, sampled[rid], eos_token_ids)
            if stopped:
                finished.append(request)
            status = request.status.value if stopped else None
            lps = logprobs[rid][: len(new)] if logprobs and rid in logprobs else None
            outputs.append(
                RequestOutput(
                    rid,
                    request.prompt_token_ids,
                    request.output_token_ids,
                    new,
                    stopped,
                    status,
                    "",
                    request.num_cached_tokens,
                    lps,
                )
            )
        if finished:
            for request in finished:
                self.kv.free(request)
            done = {r.request_id for r in finished}
            self.running = [r for r in self.running if r.request_id not in done]
        return StepOutputs(decoded, finished_decodes, outputs)

    def _accept(
        self, request: Request, num_draft_tokens: int, accepted: list[int], eos_token_ids: frozenset[int]
    ) -> tuple[list[int], bool]:
        """Append the step's accepted tokens (after verified drafts: rejected ones are uncomputed and
        their slots trimmed) until one stops the request; fork its children once its prompt is in.
        Returns the appended tokens and whether the request stopped."""
        rejected = num_draft_tokens - (len(accepted) - 1)
        request.num_computed_tokens -= rejected
        request.spec_token_ids = []
        new: list[int] = []
        stopped = False
        for token in accepted:
            request.output_token_ids.append(token)
            new.append(token)
            if request.constraint is not None:
                request.constraint.accept(token)
            if self._check_stop(request, token, eos_token_ids):
                stopped = True
                break
        if rejected:
            self.kv.trim(request, request.num_computed_tokens)
        if request.request_id in self._forks and request.num_computed_tokens >= request.num_prompt_tokens:
            self._fork(request)
        return new, stopped

    def _fork(self, parent: Request) -> None:
        """Each child shares the parent's blocks for all but the last prompt token, which it
        recomputes itself to get its own logits (writing it copies the shared block)."""
        for child in self._forks.pop(parent.request_id):
            if len(self.running) < self.limits.max_num_seqs and self.kv.fork(
                parent, child, parent.num_prompt_tokens - 1
            ):
                child.num_computed_tokens = parent.num_prompt_tokens - 1
                child.status = RequestStatus.RUNNING
                self.running.append(child)
            else:
                self.waiting.push(child)

    def _check_stop(self, request: Request, token: int, eos_token_ids: frozenset[int]) -> bool:
        """Set the request's finished status if ``token`` (just appended) ends it."""
        params = request.sampling_params
        if (not params.ignore_eos and token in eos_token_ids) or (
            params.stop_token_ids and token in params.stop_token_ids
        ):
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        n_out = len(request.output_token_ids)
        if n_out >= params.max_tokens or n_out + len(request.prompt_token_ids) >= self.limits.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH
            return True
        return False
