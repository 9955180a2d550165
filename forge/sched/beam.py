"""Beam search on the scheduler: each beam is an ordinary request (computed / total tokens) whose
next token the search picks, not the sampler.

A beam request samples greedily with the top ``2 * beam_width`` logprobs. When its step ends the
token the engine appended is taken back off (it was never computed, so no KV holds it) and its
logprobs become the beam's candidates; a beam that has proposed waits with all its tokens computed,
which the scheduler never schedules. Once every live beam of a search has proposed, the round is
decided: the best ``beam_width`` candidates live on. A beam none of them continues is aborted (its
blocks freed); a beam continued once gets its token appended and decodes on; one continued more
than once is forked (``Scheduler.fork``: the children share its computed blocks, copy-on-write) —
so beams share the prompt's and their common prefix's blocks. A beam preempted by recompute just
computes its tokens again; a proposal repeated that way is ignored."""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from forge.core.beam_params import BeamSearchParams, beam_score
from forge.core.outputs import RequestOutput, stopped_output
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.sched.fork import output_ids
from forge.sched.scheduler import Scheduler
from forge.sched.step_outputs import StepOutputs


@dataclass(frozen=True)
class Hypothesis:
    """A finished (EOS) or surviving beam: its output tokens and their summed logprob."""

    token_ids: list[int]
    cumulative_logprob: float
    ends_with_eos: bool  # a finished hypothesis; else a beam still live when the search ran out of tokens

    def score(self, prompt_len: int, length_penalty: float) -> float:
        return beam_score(
            self.cumulative_logprob, prompt_len + len(self.token_ids) - self.ends_with_eos, length_penalty
        )


@dataclass
class _Beam:
    request: Request
    cumulative_logprob: float
    candidates: list[tuple[int, float]] | None = None  # this round's proposals, best first
    parked: bool = False  # out of the scheduler (no blocks) until its round is decided


@dataclass
class _Search:
    template: Request  # the caller's request: id, prompt, priority, ``beam_search``
    params: BeamSearchParams
    max_tokens: int
    eos: frozenset[int]
    beams: list[_Beam] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    rounds: int = 0
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def new_beam(self, output_token_ids: list[int], cumulative_logprob: float) -> _Beam:
        t = self.template
        request = Request(
            f"{t.request_id}@{next(self.ids)}",
            list(t.prompt_token_ids),
            SamplingParams(
                max_tokens=self.max_tokens + 1,  # never stopped by the engine: the search ends it
                temperature=0.0,
                ignore_eos=True,
                logprobs=self.params.num_candidates,
            ),
            arrival_time=t.arrival_time,
            priority=t.priority,
            output_token_ids=output_token_ids,
        )
        return _Beam(request, cumulative_logprob)

    def results(self) -> list[Hypothesis]:
        """The ``beam_width`` best of the finished hypotheses, best first."""
        n_prompt, penalty = len(self.template.prompt_token_ids), self.params.length_penalty
        ranked = sorted(self.finished, key=lambda h: h.score(n_prompt, penalty), reverse=True)
        return ranked[: self.params.beam_width]


@dataclass
class BeamRound:
    """What ``BeamSearches.advance`` did this step. ``delivered``: the step's outputs without the
    beams' (what the caller sees), plus each finished search's results; ``closed``: a final output
    per beam request that ended (pruned or the search over), for the metrics; ``started``: the beam
    requests forked this step (already in the scheduler)."""

    delivered: StepOutputs
    closed: list[RequestOutput]
    started: list[Request]


class BeamSearches:
    """The beam searches in flight over one scheduler. A search's results are final outputs under
    ``output_ids(template)``, best first, each with its ``cumulative_logprob``; should there be fewer
    hypotheses than beams, the ids left over end with no tokens and ``finish_reason="abort"``."""

    def __init__(self, scheduler: Scheduler, eos_token_ids: frozenset[int]) -> None:
        self.scheduler = scheduler
        self.eos_token_ids = eos_token_ids
        self._searches: dict[str, _Search] = {}
        self._owner: dict[str, _Search] = {}  # beam request id -> its search

    def __len__(self) -> int:
        return len(self._searches)

    def owns(self, request_id: str) -> bool:
        """``request_id`` is a search's (one of its result ids) or one of its beams'."""
        if request_id in self._owner:
            return True
        return bool(self._searches) and request_id.split("#", 1)[0] in self._searches

    def start(self, template: Request) -> Request:
        """Start the search ``template.beam_search`` describes; returns its first beam, added to the
        scheduler (ValueError if the scheduler refuses it)."""
        params = template.beam_search
        assert params is not None
        room = self.scheduler.limits.max_model_len - template.num_prompt_tokens - 1
        if room < 1:
            raise ValueError(f"request {template.request_id}: the prompt leaves no room for a beam search")
        eos = frozenset() if params.ignore_eos else self.eos_token_ids
        search = _Search(template, params, min(params.max_tokens, room), eos)
        beam = search.new_beam([], 0.0)
        self.scheduler.add_request(beam.request)
        search.beams.append(beam)
        self._searches[template.request_id] = search
        self._owner[beam.request.request_id] = search
        return beam.request

    def abort(self, request_id: str) -> list[Request]:
        """Abort the search ``request_id`` names (a result id or a beam id); its beam requests, freed."""
        search = self._owner.get(request_id) or self._searches.get(request_id.split("#", 1)[0])
        if search is None:
            return []
        return self._end(search)

    def abort_all(self) -> tuple[list[Request], list[RequestOutput]]:
        """Abort every search: the beam requests freed, and an ``abort`` output per result id."""
        beams: list[Request] = []
        outputs: list[RequestOutput] = []
        for search in list(self._searches.values()):
            beams += self._end(search)
            outputs += [
                dataclasses.replace(stopped_output(search.template, "abort"), request_id=rid)
                for rid in output_ids(search.template)
            ]
        return beams, outputs

    def _end(self, search: _Search) -> list[Request]:
        del self._searches[search.template.request_id]
        ended = []
        for beam in search.beams:
            del self._owner[beam.request.request_id]
            self.scheduler.abort(beam.request.request_id)
            ended.append(beam.request)
        search.beams = []
        return ended

    def release_idle(self) -> bool:
        """Park the newest running beam that has proposed and waits for its round: it leaves the
        scheduler (its blocks freed) until the round is decided, then computes its tokens again.
        Called when nothing can be scheduled: such beams hold the blocks a waiting beam needs. False
        if there is none."""
        for request in reversed(self.scheduler.running):
            search = self._owner.get(request.request_id)
            if search is None:
                continue
            beam = next(b for b in search.beams if b.request is request)
            if beam.candidates is not None:
                self.scheduler.abort(request.request_id)
                beam.parked = True
                return True
        return False

    # -- one step -----------------------------------------------------------------------
    def advance(self, outputs: StepOutputs) -> BeamRound:
        """Take the beams' outputs out of the step's, record their proposals, and decide every search
        whose live beams have all proposed."""
        owner = self._owner
        if not any(r.request_id in owner for r in outputs.decoded) and not any(
            o.request_id in owner for o in outputs.others
        ):
            return BeamRound(outputs, [], [])
        closed: list[RequestOutput] = []
        started: list[Request] = []
        finals: list[RequestOutput] = []
        touched: dict[str, _Search] = {}
        for out in outputs:
            search = owner.get(out.request_id)
            if search is None:
                continue
            if out.error is not None or out.finished:
                finals += self._fail(search, out, closed)
                continue
            touched[search.template.request_id] = search
            beam = next(b for b in search.beams if b.request.request_id == out.request_id)
            beam.request.output_token_ids.pop()  # uncomputed: the search picks the token, not the sampler
            if beam.candidates is None and out.logprobs:
                ranked = sorted(out.logprobs[-1].items(), key=lambda kv: (-kv[1], kv[0]))
                beam.candidates = ranked[: search.params.num_candidates]
        for search in touched.values():
            if search.template.request_id in self._searches and all(b.candidates is not None for b in search.beams):
                finals += self._decide(search, closed, started)
        decoded = [
            (r, t) for r, t in zip(outputs.decoded, outputs.decode_tokens, strict=True) if r.request_id not in owner
        ]
        delivered = StepOutputs(
            [r for r, _ in decoded],
            [t for _, t in decoded],
            [r for r in outputs.finished_decodes if r.request_id not in owner],
            [o for o in outputs.others if o.request_id not in owner] + finals,
            outputs.logprobs,
        )
        return BeamRound(delivered, closed, started)

    def _fail(self, search: _Search, out: RequestOutput, closed: list[RequestOutput]) -> list[RequestOutput]:
        """A beam failed (its step raised): the whole search fails with its error."""
        if search.template.request_id not in self._searches:
            return []
        for request in self._end(search):
            if request.request_id != out.request_id:
                closed.append(stopped_output(request, "abort"))
        reason = out.error or "a beam of the search stopped"
        failed = stopped_output(search.template, "error", reason)
        return [dataclasses.replace(failed, request_id=rid) for rid in output_ids(search.template)]

    def _decide(self, search: _Search, closed: list[RequestOutput], started: list[Request]) -> list[RequestOutput]:
        """One round: the best ``beam_width`` non-EOS candidates live on; returns the search's results
        when it is over."""
        params = search.params
        pool: list[tuple[_Beam, int, float]] = []
        for beam in search.beams:
            assert beam.candidates is not None
            for token, logprob in beam.candidates:
                cumulative = beam.cumulative_logprob + logprob
                if token in search.eos:
                    search.finished.append(Hypothesis([*beam.request.output_token_ids, token], cumulative, True))
                else:
                    pool.append((beam, token, cumulative))
        pool.sort(key=lambda c: c[2], reverse=True)  # stable: ties keep beam, then candidate order
        survivors = pool[: params.beam_width]
        search.rounds += 1
        over = (
            search.rounds >= search.max_tokens
            or not survivors
            or (params.early_stopping and len(search.finished) >= params.beam_width)
        )
        if over:
            if not (params.early_stopping and len(search.finished) >= params.beam_width):
                # out of tokens (or candidates): the survivors join the finished hypotheses
                for beam, token, cumulative in survivors:
                    search.finished.append(Hypothesis([*beam.request.output_token_ids, token], cumulative, False))
            return self._results(search, closed)
        self._continue(search, survivors, closed, started)
        return []

    def _continue(
        self,
        search: _Search,
        survivors: list[tuple[_Beam, int, float]],
        closed: list[RequestOutput],
        started: list[Request],
    ) -> None:
        """Apply a round: prune, extend and fork the beams."""
        live: list[_Beam] = []
        for beam in search.beams:
            picks = [(t, c) for b, t, c in survivors if b is beam]
            request = beam.request
            if not picks:
                del self._owner[request.request_id]
                self.scheduler.abort(request.request_id)
                closed.append(stopped_output(request, "stop"))
                continue
            for token, cumulative in picks[1:]:
                child = search.new_beam([*request.output_token_ids, token], cumulative)
                self.scheduler.fork(request, child.request, request.num_computed_tokens)
                self._owner[child.request.request_id] = search
                started.append(child.request)
                live.append(child)
            request.output_token_ids.append(picks[0][0])
            beam.cumulative_logprob = picks[0][1]
            beam.candidates = None
            if beam.parked:  # back into the scheduler, to compute its tokens again
                beam.parked = False
                request.num_computed_tokens = request.num_cached_tokens = 0
                request.num_preemptions += 1
                self.scheduler.add_request(request)
            live.append(beam)
        search.beams = live

    def _results(self, search: _Search, closed: list[RequestOutput]) -> list[RequestOutput]:
        """The search is over: its beam requests closed, its results as final outputs."""
        closed += [stopped_output(r, "stop") for r in self._end(search)]
        t = search.template
        results = search.results()
        ids = output_ids(t)
        # fewer hypotheses than beams (every candidate was EOS): the rest end empty, as "abort"
        missing = [dataclasses.replace(stopped_output(t, "abort"), request_id=rid) for rid in ids[len(results) :]]
        return [
            RequestOutput(
                rid,
                t.prompt_token_ids,
                h.token_ids,
                list(h.token_ids),
                True,
                "stop" if h.ends_with_eos else "length",
                cumulative_logprob=h.cumulative_logprob,
            )
            for rid, h in zip(ids, results, strict=False)
        ] + missing
