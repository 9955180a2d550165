"""The scheduler's column-wise steps (a mixin of ``forge.sched.scheduler.Scheduler``): runs of plain
decode steps taken at once (``DecodeRun``), and a step that is every running request's plain decode
followed by the admissions of waiting requests (``schedule_joining``: an arrival joining a batch of
decodes), both over the rows of the running decodes kept between them (``RunningDecodes``). Fast
paths (``forge.core.fast_paths``): taken only where the policy and the KV cache declare them."""

from __future__ import annotations

from forge.core.decode_run import DecodeRun
from forge.core.outputs import DecodeRows, ModelOutput, SchedulerOutput
from forge.core.request import Request, RequestStatus
from forge.kvcache.base import BlockOps, DecodeRunCache, KVUsage
from forge.policies.base import Policy
from forge.sched.running_decodes import RunningDecodes
from forge.sched.step_outputs import StepOutputs
from forge.sched.step_rows import StepRows
from forge.sched.step_updates import StepUpdates


class DecodeRunSteps(StepUpdates):
    """Decode runs and joining steps, over the update of ``StepUpdates``; the state is the scheduler's
    (``Scheduler.__init__``)."""

    policy: Policy
    swapped: list[Request]
    _running_decodes: RunningDecodes | None
    _run_kv: DecodeRunCache | None
    _grouped: bool

    def _admit(self, budget: int, step: StepRows) -> int:
        raise NotImplementedError  # the scheduler's

    @property
    def takes_decode_runs(self) -> bool:
        """Whether ``plan_decode_run`` may plan runs (and ``schedule_joining`` join steps): fast paths on,
        a policy and a KV cache that declare them, the cache a ``DecodeRunCache``."""
        return self._run_kv is not None

    def _decode_rows(self, budget: int) -> RunningDecodes | None:
        """The rows of the running requests when each would be ``schedule``'s plain decode, in order,
        within ``budget``, with nothing swapped or to fork (None otherwise); kept for the next call
        (a cache, not a change of state)."""
        running = self.running
        if self.swapped or self._forks or len(running) > budget:
            return None
        order = self.policy.running_order(running)
        if order is not running and (len(order) != len(running) or any(map(_differ, order, running))):
            return None
        max_len, block_table = self.limits.max_model_len, self.kv.block_table
        known = self._running_decodes
        rows = (
            RunningDecodes.of(running, max_len, block_table)
            if known is None
            else known.extended(running, max_len, block_table)
        )
        self._running_decodes = rows
        return rows

    def plan_decode_run(self, max_steps: int) -> DecodeRun | None:
        """The next steps (at most ``max_steps``) as one ``DecodeRun``, when each would be ``schedule``'s
        plain decodes of every running request in order and only a length limit can end one: nothing
        waiting, swapped or to fork; every request plain greedy with no constraint, ignoring EOS, with
        no stop tokens; the budget holding the batch; the KV cache taking runs of these requests
        (``DecodeRunCache.decode_run_fits``). None otherwise: schedule step by step. It changes no
        request and no block: ``start_decode_run`` commits it or a truncation of it (if the free blocks
        hold it). None whenever the policy or the KV cache does not declare fast paths
        (``takes_decode_runs``). It keeps the rows' columns (``RunningDecodes``) until a step or an
        abort touches a running request, so the next plan reads only the requests admitted since."""
        kv = self._run_kv
        if not self.running or kv is None or len(self.waiting):
            return None
        rows = self._decode_rows(self.policy.token_budget(self.limits.max_num_batched_tokens))
        if rows is None:
            return None
        run = rows.run(max_steps)
        return run if kv.decode_run_fits(run) else None

    def start_decode_run(self, run: DecodeRun) -> list[KVUsage] | None:
        """Reserve the KV slots of ``run`` (``plan_decode_run``'s, or a truncation of it); returns each
        step's KV usage as ``kv.usage(running)`` reads after that step. None, nothing changed, when the
        free blocks do not hold the run: schedule step by step."""
        if self._run_kv is None:
            raise TypeError(f"{type(self.kv).__name__} takes no decode runs here (takes_decode_runs is False)")
        return self._run_kv.reserve_decode_run(run)

    def finish_decode_run(self, run: DecodeRun, tokens: list[list[int]]) -> list[Request]:
        """Append each row's sampled ``tokens`` (``num_steps[i]`` of them), finish the finishing rows and
        free their blocks, in the order they end; returns them in that order."""
        if list(map(len, tokens)) != run.num_steps:
            raise ValueError(f"a decode run of {run.num_steps} steps per row got {list(map(len, tokens))} tokens")
        for request, sampled, n in zip(run.requests, tokens, run.num_steps, strict=True):
            request.output_token_ids += sampled
            request.num_computed_tokens += n
        return self._finish_rows(run)

    def _finish_rows(self, run: DecodeRun) -> list[Request]:
        """The rows kept past ``run``; its finishing rows finished (``FINISHED_LENGTH``), their blocks
        freed, in the order they end, and out of ``running``: returned in that order."""
        rows = self._running_decodes
        self._running_decodes = rows.after(run) if rows is not None and rows.requests is run.requests else None
        finished = [run.requests[i] for i in run.finish_order]
        if finished:
            for request in finished:
                request.status = RequestStatus.FINISHED_LENGTH
                self.kv.free(request)
            self.running = _still_running(self.running)
        return finished

    # -- a step of the running decodes and admissions -------------------------------------
    def schedule_joining(self) -> tuple[SchedulerOutput, DecodeRun] | None:
        """``schedule``'s step, when it is every running request's plain decode (the rows ``plan_decode_run``
        reads, all within the budget) and then the admissions of waiting requests (none, or some):
        the decodes taken column-wise, as a one-step ``DecodeRun`` whose slots are reserved at once,
        and returned with the step for ``update_joining``. The rows stay kept (a plain step drops them),
        so the next plan reads only the requests admitted. None, no request or block changed, when the
        step is not that (a waiting-first policy, a swap-in or fork pending, a decode that does not fit
        or could end otherwise): ``schedule`` it."""
        kv, policy = self._run_kv, self.policy
        if not self.running or kv is None or policy.waiting_first or self._grouped:
            return None
        total = policy.token_budget(self.limits.max_num_batched_tokens)
        rows = self._decode_rows(total)
        if rows is None:
            return None
        run = rows.run(1)
        if not kv.decode_run_fits(run):
            return None
        if policy.rekey_each_step and len(self.waiting):
            self.waiting.rekey()
        if not kv.reserve_decode_slots(run):
            return None
        step = StepRows()
        budget = self._admit(total - len(run.requests), step) if len(self.waiting) else total - len(run.requests)
        ops = self.kv.take_block_ops()
        return _step_output(run, step, total - budget, len(self.waiting), ops), run

    def update_joining(
        self, sched: SchedulerOutput, run: DecodeRun, out: ModelOutput, eos_token_ids: frozenset[int]
    ) -> StepOutputs:
        """``update`` of a ``schedule_joining`` step (``run``: its first decodes; no request of it aborted
        since): each of the run's decodes gets its token (they end only at their length limits:
        ``run.finishing``), the finishing ones freed; then the decodes admitted (requests whose prompt was
        computed elsewhere, as on a disaggregated decode replica) and the admitted chunks, as ``update``."""
        decoded, tokens = sched.decodes.requests, out.decode_tokens(sched.decodes)
        for request, token in zip(run.requests, tokens, strict=False):  # the run's rows come first
            request.num_computed_tokens += 1
            request.output_token_ids.append(token)
        finished = self._finish_rows(run)
        k = len(run.requests)
        if len(decoded) > k:
            ended, _ = self._accept_decodes(decoded[k:], tokens[k:], eos_token_ids)
            finished += ended
        else:
            ended = []
        others, finished_others = self._update_chunks(sched, out, eos_token_ids)
        if ended or finished_others:
            for request in ended + finished_others:
                self.kv.free(request)
            self.running = _still_running(self.running)
        return StepOutputs(decoded, tokens, finished, others, out.logprobs)


def _step_output(
    run: DecodeRun, step: StepRows, num_batched_tokens: int, num_waiting: int, ops: BlockOps
) -> SchedulerOutput:
    """The ``SchedulerOutput`` of a joining step: ``run``'s decodes, then those ``step`` admitted (a request
    whose prompt is computed decodes at once), then its chunks."""
    requests, starts, tokens, tables = run.requests, run.starts, run.token_ids, run.block_tables
    if step.decode_requests:
        admitted = step.decodes()
        requests, starts = requests + admitted.requests, starts + admitted.starts
        tokens, tables = tokens + admitted.token_ids, tables + admitted.block_tables
    return SchedulerOutput(
        step.rows,
        num_batched_tokens=num_batched_tokens,
        num_waiting=num_waiting,
        swap_out=ops.swap_out,
        copy_blocks=ops.copy_blocks,
        swap_in=ops.swap_in,
        decodes=DecodeRows([r.request_id for r in requests], starts, tokens, tables, requests),
        chunk_requests=step.requests,
    )


def _still_running(requests: list[Request]) -> list[Request]:
    running = RequestStatus.RUNNING  # (a local: an enum member read in the loop costs several times more)
    return [r for r in requests if r.status is running]


def _differ(a: Request, b: Request) -> bool:
    return a is not b
