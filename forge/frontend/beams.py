"""One beam search's state: its live beams (each a plain engine request), their proposals, the
finished hypotheses, and the rule that decides a round (the names follow vLLM's beam search)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from forge.core.beam_params import BeamSearchParams, beam_score
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams


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
class Beam:
    """A live beam: its engine request and the logprob of its output so far."""

    request: Request
    cumulative_logprob: float
    candidates: list[tuple[int, float]] | None = None  # this round's proposals, best first
    parked: bool = False  # out of the engine (no blocks) until its round is decided


Survivor = tuple[Beam, int, float]  # a beam, the token it goes on with, the new cumulative logprob


@dataclass
class Search:
    """One beam search: ``template`` is the caller's request (id, prompt, priority, ``beam_search``)."""

    template: Request
    params: BeamSearchParams
    max_tokens: int
    eos: frozenset[int]
    beams: list[Beam] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    rounds: int = 0
    ids: itertools.count[int] = field(default_factory=itertools.count)
    cached_tokens: int | None = None  # the prompt's prefix-cache hits, as its first beam's first output found them

    def new_beam(self, output_token_ids: list[int], cumulative_logprob: float) -> Beam:
        """A beam request: greedy, with the top ``num_candidates`` logprobs, never stopped by the
        engine (the search ends it)."""
        t = self.template
        request = Request(
            f"{t.request_id}@{next(self.ids)}",
            list(t.prompt_token_ids),
            SamplingParams(
                max_tokens=self.max_tokens + 1,
                temperature=0.0,
                ignore_eos=True,
                logprobs=self.params.num_candidates,
            ),
            arrival_time=t.arrival_time,
            priority=t.priority,
            output_token_ids=output_token_ids,
        )
        return Beam(request, cumulative_logprob)

    def beam_of(self, request_id: str) -> Beam:
        return next(b for b in self.beams if b.request.request_id == request_id)

    @property
    def proposed(self) -> bool:
        """Every live beam has proposed: the round can be decided."""
        return all(b.candidates is not None for b in self.beams)

    def decide(self) -> list[Survivor] | None:
        """One round: EOS candidates become finished hypotheses, the best ``beam_width`` others live
        on (returned); None when the search is over (its survivors then joined the finished ones,
        unless it stopped early)."""
        params = self.params
        pool: list[Survivor] = []
        for beam in self.beams:
            assert beam.candidates is not None
            for token, logprob in beam.candidates:
                cumulative = beam.cumulative_logprob + logprob
                if token in self.eos:
                    self.finished.append(Hypothesis([*beam.request.output_token_ids, token], cumulative, True))
                else:
                    pool.append((beam, token, cumulative))
        pool.sort(key=lambda c: c[2], reverse=True)  # stable: ties keep beam, then candidate order
        survivors = pool[: params.beam_width]
        self.rounds += 1
        early = params.early_stopping and len(self.finished) >= params.beam_width
        if not (self.rounds >= self.max_tokens or not survivors or early):
            return survivors
        if not early:  # out of tokens (or candidates): the survivors join the finished hypotheses
            for beam, token, cumulative in survivors:
                self.finished.append(Hypothesis([*beam.request.output_token_ids, token], cumulative, False))
        return None

    def results(self) -> list[Hypothesis]:
        """The ``beam_width`` best of the finished hypotheses, best first."""
        n_prompt, penalty = len(self.template.prompt_token_ids), self.params.length_penalty
        ranked = sorted(self.finished, key=lambda h: h.score(n_prompt, penalty), reverse=True)
        return ranked[: self.params.beam_width]
