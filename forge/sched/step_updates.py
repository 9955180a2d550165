"""The scheduler's update after the model ran (a mixin of ``forge.sched.scheduler.Scheduler``): each
row's request advanced by the tokens computed for it, its accepted tokens appended (plain decodes
column-wise first), stop conditions checked, children forked once a parent's prompt is in, and the
finished requests' blocks freed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from forge.core.outputs import ModelOutput, RequestOutput, SchedulerOutput
from forge.core.pooling import PooledPrefix
from forge.core.request import Request, RequestStatus
from forge.kvcache.base import KVCacheManager
from forge.sched.step_outputs import StepOutputs
from forge.sched.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from forge.sched.scheduler import SchedulerLimits


class StepUpdates:
    """``update`` and what it calls; the state is the scheduler's (``Scheduler.__init__``)."""

    kv: KVCacheManager
    limits: SchedulerLimits
    waiting: WaitingQueue
    running: list[Request]
    _forks: dict[str, list[Request]]

    def update(self, sched: SchedulerOutput, out: ModelOutput, eos_token_ids: frozenset[int]) -> StepOutputs:
        """Advance each row's request by the tokens computed for it and append the tokens it
        accepted (``_accept``), the plain decodes' (column-wise) first; free those that finished.
        A row whose request stopped running since ``schedule`` (aborted) is skipped."""
        decoded, tokens = sched.decodes.requests, out.decode_tokens(sched.decodes)
        finished: list[Request] = []
        if decoded:
            finished, skipped = self._accept_decodes(decoded, tokens, eos_token_ids)
            if skipped:
                decoded, tokens = _without(skipped, decoded, tokens)
        others, finished_others = self._update_chunks(sched, out, eos_token_ids)
        stopped = finished + finished_others
        if stopped:
            for request in stopped:
                self.kv.free(request)
            done = {r.request_id for r in stopped}
            self.running = [r for r in self.running if r.request_id not in done]
        return StepOutputs(decoded, tokens, finished, others, out.logprobs)

    def _accept_decodes(
        self, decoded: list[Request], tokens: list[int], eos_token_ids: frozenset[int]
    ) -> tuple[list[Request], list[Request]]:
        """``_accept`` of one token for each plain decode, without what a plain decode never needs
        (drafts to verify or trim; a fork: its prompt is done): the hottest loop of a simulated run.
        Returns the requests that finished and those skipped (no longer running)."""
        finished: list[Request] = []
        skipped: list[Request] = []
        running, check_stop = RequestStatus.RUNNING, self._check_stop
        for request, token in zip(decoded, tokens, strict=True):
            if request.status is not running:
                skipped.append(request)
                continue
            request.num_computed_tokens += 1
            output = request.output_token_ids
            output.append(token)
            if request.constraint is not None:
                request.constraint.accept(token)
            if check_stop(request, token, eos_token_ids):
                finished.append(request)
        return finished, skipped

    def _update_chunks(
        self, sched: SchedulerOutput, out: ModelOutput, eos_token_ids: frozenset[int]
    ) -> tuple[list[RequestOutput], list[Request]]:
        """``update`` for the rows other than the column-wise decodes: returns their outputs (one per
        sampling row) and the requests that finished."""
        outputs: list[RequestOutput] = []
        finished: list[Request] = []
        sampled, logprobs = out.sampled_token_ids, out.logprobs
        for s, request in zip(sched.chunks, sched.chunk_requests, strict=True):
            if request.status is not RequestStatus.RUNNING:
                continue
            request.num_computed_tokens += s.num_tokens
            if s.num_prompt_logprob_rows and s.request_id in out.prompt_logprobs:
                _record_prompt_logprobs(
                    request, s.start, out.prompt_logprobs[s.request_id], out.prompt_ranks.get(s.request_id)
                )
            if request.pooling_params is not None:
                if _pool(request, out):
                    finished.append(request)
                    outputs.append(_embedding_output(request))
                continue
            if not s.sample:
                continue
            rid, num_before = s.request_id, len(request.output_token_ids)
            stopped = self._accept(request, sampled[rid], s.num_draft_tokens, eos_token_ids)
            if stopped:
                finished.append(request)
            new = request.output_token_ids[num_before:]
            lps = logprobs[rid][: len(new)] if logprobs and rid in logprobs else None
            status = request.status.value if stopped else None
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
                    prompt_logprobs=list(request.prompt_logprobs)
                    if num_before == 0 and request.prompt_logprobs is not None
                    else None,
                    prompt_ranks=list(request.prompt_ranks)
                    if num_before == 0 and request.prompt_ranks is not None
                    else None,
                    prompt_cached_tokens=request.prompt_cached_tokens or 0,
                )
            )
        return outputs, finished

    def _accept(
        self, request: Request, accepted: Sequence[int], num_draft_tokens: int, eos_token_ids: frozenset[int]
    ) -> bool:
        """Append the step's accepted tokens (after verified drafts: rejected ones are uncomputed and
        their slots trimmed) until one stops the request; fork its children once its prompt is in.
        Returns whether the request stopped."""
        rejected = num_draft_tokens - (len(accepted) - 1) if num_draft_tokens else 0
        request.num_computed_tokens -= rejected
        if request.spec_token_ids:
            request.spec_token_ids = []
        output, constraint = request.output_token_ids, request.constraint
        stopped = False
        for token in accepted:
            output.append(token)
            if constraint is not None:
                constraint.accept(token)
            if self._check_stop(request, token, eos_token_ids):
                stopped = True
                break
        if rejected:
            self.kv.trim(request, request.num_computed_tokens)
        forks = self._forks
        if forks and request.request_id in forks and request.num_computed_tokens >= request.num_prompt_tokens:
            self._fork(request)
        return stopped

    def _fork(self, parent: Request) -> None:
        """Each child shares the parent's blocks for all but the last prompt token, which it
        recomputes itself to get its own logits (writing it copies the shared block)."""
        for child in self._forks.pop(parent.request_id):
            self.fork(parent, child, parent.num_prompt_tokens - 1)

    def fork(self, parent: Request, child: Request, num_tokens: int) -> None:
        """Add ``child`` (a new request whose first ``num_tokens`` tokens are ``parent``'s, at most its
        computed ones) sharing the parent's KV blocks for them (copy-on-write): it runs at once when
        ``max_num_seqs`` and the cache allow, else it waits and computes them itself."""
        if len(self.running) < self.limits.max_num_seqs and self.kv.fork(parent, child, num_tokens):
            child.num_computed_tokens = num_tokens
            child.status = RequestStatus.RUNNING
            self.running.append(child)
        else:
            child.status = RequestStatus.WAITING
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


def _without(skipped: list[Request], requests: list[Request], tokens: list[int]) -> tuple[list[Request], list[int]]:
    """The decodes' requests and tokens but those of ``skipped``."""
    kept = [(r, t) for r, t in zip(requests, tokens, strict=True) if all(r is not x for x in skipped)]
    return [r for r, _ in kept], [t for _, t in kept]


def _record_prompt_logprobs(
    request: Request, start: int, rows: list[dict[int, float]], ranks: list[int] | None
) -> None:
    """Append the prompt logprobs (and ranks) a chunk from position ``start`` computed (row i: prompt
    token start + i + 1's) to the request's, skipping those it already has (a recomputed prompt)."""
    if request.prompt_logprobs is None:
        request.prompt_logprobs = [None]  # the first prompt token has no logprob
    have = len(request.prompt_logprobs)
    request.prompt_logprobs.extend(rows[max(have - (start + 1), 0) :])
    if ranks is not None:
        if request.prompt_ranks is None:
            request.prompt_ranks = [None]
        request.prompt_ranks.extend(ranks[max(len(request.prompt_ranks) - (start + 1), 0) :])


def _pool(request: Request, out: ModelOutput) -> bool:
    """Add the step's pooled chunk to an embedding request's pool; True when its whole prompt is in
    (it then finishes: ``FINISHED_STOPPED``)."""
    request.pooled = PooledPrefix.extend(request.pooled, out.pooled[request.request_id])
    if request.num_computed_tokens < request.num_prompt_tokens:
        return False
    request.status = RequestStatus.FINISHED_STOPPED
    return True


def _embedding_output(request: Request) -> RequestOutput:
    """The final output of an embedding request whose whole prompt is pooled."""
    assert request.pooled is not None and request.pooling_params is not None
    return RequestOutput(
        request.request_id,
        request.prompt_token_ids,
        [],
        [],
        True,
        request.status.value,
        num_cached_tokens=request.num_cached_tokens,
        embedding=request.pooled.embedding(request.pooling_params),
    )
