"""Beam search over plain engine requests, driven from above the engine (the library and the server
step the engine through ``BeamSearchFrontend``), as vLLM V1's frontend does it.

Each beam is an ordinary engine request (greedy, with the top ``2 * beam_width`` logprobs) whose
next token the search picks, not the sampler. When a step ends, the token the engine appended to a
beam is taken back off (it was never computed, so no KV holds it) and its logprobs become the beam's
candidates; a beam that has proposed waits with all its tokens computed, which the scheduler never
schedules. Once every live beam of a search has proposed, the round is decided
(``Search.decide``): the best ``beam_width`` candidates live on. A beam none of them continues is
stopped (``Engine.stop``: its blocks freed); a beam continued once gets its token appended and
decodes on; one continued more than once is forked (``Engine.fork``: the children share its
computed blocks, copy-on-write, ``KVCacheManager.fork``) — so beams share the prompt's and their
common prefix's blocks. A beam preempted by recompute just computes its tokens again; a proposal
repeated that way is ignored. When nothing can be scheduled, a beam that has proposed is parked
(aborted in the engine, its blocks freed) until its round is decided, then computes its tokens again."""

from __future__ import annotations

import dataclasses

from forge.core.outputs import RequestOutput, stopped_output
from forge.core.request import Request
from forge.engine.engine import Engine, LeakError
from forge.frontend.beams import Search, Survivor
from forge.sched.fork import output_ids
from forge.sched.step_outputs import StepOutputs


class BeamSearchFrontend:
    """The engine as the library and the server drive it: a request with ``beam_search`` runs here as
    a search over plain engine requests; every other request passes through to the engine. A search's
    results are final outputs under ``output_ids(request)``, best first, each with its
    ``cumulative_logprob``; should there be fewer hypotheses than beams, the ids left over end with
    no tokens and ``finish_reason="abort"``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._searches: dict[str, Search] = {}
        self._owner: dict[str, Search] = {}  # beam request id -> its search

    def __len__(self) -> int:
        """The searches in flight."""
        return len(self._searches)

    def owns(self, request_id: str) -> bool:
        """``request_id`` is a search's (one of its result ids) or one of its beams'."""
        if request_id in self._owner:
            return True
        return bool(self._searches) and request_id.split("#", 1)[0] in self._searches

    def add_request(self, request: Request) -> None:
        """``Engine.add_request``, or the search ``request.beam_search`` describes (ValueError if it
        cannot run: a drafter, swap preemption, no room after the prompt, or a refused prompt)."""
        for rid in output_ids(request):
            if self.owns(rid) or (request.beam_search is not None and rid in self.engine.requests):
                raise ValueError(f"duplicate request id {rid!r}")
        if request.beam_search is None:
            self.engine.add_request(request)
            return
        if self.engine.drafter is not None:
            raise ValueError("beam search does not run with a drafter (speculative decoding)")
        limits = self.engine.scheduler.limits
        if limits.preemption_mode != "recompute":
            raise ValueError("beam search needs engine.preemption_mode=recompute")
        room = limits.max_model_len - request.num_prompt_tokens - 1
        if room < 1:
            raise ValueError(f"request {request.request_id}: the prompt leaves no room for a beam search")
        params = request.beam_search
        eos = frozenset() if params.ignore_eos else self.engine.tokenizer.eos_token_ids
        search = Search(request, params, min(params.max_tokens, room), eos)
        beam = search.new_beam([], 0.0)
        self.engine.add_request(beam.request)
        search.beams.append(beam)
        self._searches[request.request_id] = search
        self._owner[beam.request.request_id] = search

    def has_unfinished(self) -> bool:
        return self.engine.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One engine step's outputs, the beams' replaced by the results of the searches that ended.
        When nothing can be scheduled, beams waiting for their round give back their blocks first."""
        outputs, ran = self.engine.step_outputs()
        while not ran and self._searches and self._park_one():
            outputs, ran = self.engine.step_outputs()
        if not self._owner:
            return outputs.outputs
        return self._advance(outputs)

    # -- stopping ---------------------------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        """Stop a request (a beam search: all of it, by any of its ids) and free its blocks."""
        return bool(self.abort_requests(request_id))

    def abort_requests(self, request_id: str) -> list[str]:
        """``abort``, returning the ids of the engine requests it stopped (a beam search's beams)."""
        search = self._owner.get(request_id) or self._searches.get(request_id.split("#", 1)[0])
        if search is None:
            return self.engine.abort_requests(request_id)
        return [r.request_id for r in self._end(search, None)]

    def abort_all(self) -> list[RequestOutput]:
        """Stop every request; an ``abort`` output per id a caller waits on (``output_ids``)."""
        outputs = []
        for search in list(self._searches.values()):
            self._end(search, None)
            outputs += _each_result(stopped_output(search.template, "abort"), search)
        return outputs + self.engine.abort_all()

    def check_idle(self) -> None:
        """``Engine.check_idle``, and no search in flight (LeakError otherwise)."""
        if self._searches:
            raise LeakError(f"engine idle but {len(self._searches)} beam searches unfinished")
        self.engine.check_idle()

    def _end(self, search: Search, reason: str | None) -> list[Request]:
        """The search's beams stopped (``reason``: recorded as finished so; None: aborted), it gone."""
        del self._searches[search.template.request_id]
        ended = []
        for beam in search.beams:
            rid = beam.request.request_id
            del self._owner[rid]
            if reason is None:
                self.engine.abort(rid)
            else:
                self.engine.stop(rid, reason)
            ended.append(beam.request)
        search.beams = []
        return ended

    def _park_one(self) -> bool:
        """Park the newest running beam that has proposed and waits for its round: it leaves the
        engine (its blocks freed) until the round is decided, then computes its tokens again. Called
        when nothing can be scheduled: such beams hold the blocks a waiting beam needs. False if
        there is none."""
        for request in reversed(self.engine.scheduler.running):
            search = self._owner.get(request.request_id)
            if search is None:
                continue
            beam = search.beam_of(request.request_id)
            if beam.candidates is not None:
                self.engine.abort(request.request_id)
                beam.parked = True
                return True
        return False

    # -- one step ---------------------------------------------------------------------------------
    def _advance(self, outputs: StepOutputs) -> list[RequestOutput]:
        """Take the beams' outputs out of the step's, record their proposals, and decide every search
        whose live beams have all proposed: the step's other outputs and the searches' results."""
        beam_ids = {o.request_id for o in outputs if o.request_id in self._owner}
        if not beam_ids:
            return outputs.outputs
        finals: list[RequestOutput] = []
        touched: dict[str, Search] = {}
        for out in outputs:
            search = self._owner.get(out.request_id)
            if search is None:
                continue
            if search.cached_tokens is None:
                search.cached_tokens = out.prompt_cached_tokens
            if out.error is not None or out.finished:
                finals += self._fail(search, out)
                continue
            touched[search.template.request_id] = search
            beam = search.beam_of(out.request_id)
            beam.request.output_token_ids.pop()  # uncomputed: the search picks the token, not the sampler
            if beam.candidates is None and out.logprobs:
                ranked = sorted(out.logprobs[-1].items(), key=lambda kv: (-kv[1], kv[0]))
                beam.candidates = ranked[: search.params.num_candidates]
        for search in touched.values():
            if search.template.request_id in self._searches and search.proposed:
                finals += self._decide(search)
        return [o for o in outputs if o.request_id not in beam_ids] + finals

    def _fail(self, search: Search, out: RequestOutput) -> list[RequestOutput]:
        """A beam failed (its step raised): the whole search fails with its error."""
        if search.template.request_id not in self._searches:
            return []
        self._end(search, "abort")  # (the failed beam has already left the engine)
        reason = out.error or "a beam of the search stopped"
        return _each_result(stopped_output(search.template, "error", reason), search)

    def _decide(self, search: Search) -> list[RequestOutput]:
        """Decide the search's round: prune, extend and fork its beams, or (over) its results."""
        survivors = search.decide()
        if survivors is None:
            self._end(search, "stop")
            return _results(search)
        self._continue(search, survivors)
        return []

    def _continue(self, search: Search, survivors: list[Survivor]) -> None:
        """Apply a round: prune, extend and fork the beams."""
        live = []
        for beam in search.beams:
            picks = [(t, c) for b, t, c in survivors if b is beam]
            request = beam.request
            if not picks:
                del self._owner[request.request_id]
                self.engine.stop(request.request_id, "stop")
                continue
            for token, cumulative in picks[1:]:
                child = search.new_beam([*request.output_token_ids, token], cumulative)
                self._owner[child.request.request_id] = search
                self.engine.fork(request, child.request)
                live.append(child)
            request.output_token_ids.append(picks[0][0])
            beam.cumulative_logprob = picks[0][1]
            beam.candidates = None
            if beam.parked:  # back into the engine, to compute its tokens again
                beam.parked = False
                request.num_computed_tokens = request.num_cached_tokens = 0
                request.num_preemptions += 1
                self.engine.add_request(request)
            live.append(beam)
        search.beams = live


def _each_result(output: RequestOutput, search: Search) -> list[RequestOutput]:
    """``output`` under each of the search's result ids."""
    return [dataclasses.replace(output, request_id=rid) for rid in output_ids(search.template)]


def _results(search: Search) -> list[RequestOutput]:
    """The ended search's results as final outputs, best first; ids left over end empty, "abort"."""
    t = search.template
    results = search.results()
    ids = output_ids(t)
    missing = [dataclasses.replace(stopped_output(t, "abort"), request_id=rid) for rid in ids[len(results) :]]
    return [
        RequestOutput(
            rid,
            t.prompt_token_ids,
            h.token_ids,
            list(h.token_ids),
            True,
            "stop" if h.ends_with_eos else "length",
            num_cached_tokens=search.cached_tokens or 0,
            cumulative_logprob=h.cumulative_logprob,
            prompt_cached_tokens=search.cached_tokens or 0,
        )
        for rid, h in zip(ids, results, strict=False)
    ] + missing
