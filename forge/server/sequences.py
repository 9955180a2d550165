"""How many sequences a completions call generates per prompt and which it returns: ``n`` samples,
the ``n`` best of ``best_of`` samples (OpenAI's), or the results of a beam search (vLLM's
``use_beam_search`` extension). Every combination a field cannot honour is refused here (400)."""

from __future__ import annotations

from dataclasses import dataclass

from forge.core.beam_params import BeamSearchParams
from forge.core.sampling_params import SEED_MAX
from forge.server.choices import ChoiceSpec
from forge.server.generation import Delta
from forge.server.guided import guided_specs
from forge.server.protocol import APIError, CompletionRequest


@dataclass(frozen=True)
class SequencePlan:
    """``num_sequences`` sampled per prompt (``best_of``), of which ``n`` are returned; or a beam search
    (``beam``, its ``max_tokens`` set per prompt later) whose ``beam_width`` results are returned."""

    n: int
    num_sequences: int
    beam: BeamSearchParams | None = None

    @property
    def picks_best(self) -> bool:
        return self.beam is None and self.num_sequences > self.n


def sequence_plan(body: CompletionRequest, max_n: int) -> SequencePlan:
    """The body's plan, or a 400 naming the field that cannot be honoured."""
    if body.use_beam_search:
        return SequencePlan(body.n, body.n, _beam(body, max_n))
    for name, value, default in (
        ("beam_width", body.beam_width, None),
        ("length_penalty", body.length_penalty, 1.0),
        ("early_stopping", body.early_stopping, False),
    ):
        if value != default:
            raise APIError(f"{name} needs use_beam_search=true", param=name)
    best_of = body.n if body.best_of is None else body.best_of
    if best_of < body.n:
        raise APIError(f"best_of={best_of} must be >= n={body.n}", param="best_of")
    if best_of > max_n:
        raise APIError(f"best_of={best_of} must be in [1, {max_n}]", param="best_of")
    if best_of > body.n and body.stream:
        raise APIError("best_of > n cannot be streamed (the best are known only at the end)", param="best_of")
    if body.seed is not None and body.seed + best_of - 1 > SEED_MAX:
        raise APIError(f"seed + best_of - 1 must be at most {SEED_MAX} (sequence j: seed + j)", param="seed")
    return SequencePlan(body.n, best_of)


def _beam(body: CompletionRequest, max_n: int) -> BeamSearchParams:
    """The beam search asked for; beam search is deterministic, so a field that shapes sampling, a
    streamed or echoed response and logprobs are refused (vLLM V0's rules)."""
    width = body.n if body.beam_width is None else body.beam_width
    if body.beam_width is not None and body.n not in (1, body.beam_width):
        raise APIError(f"n={body.n} and beam_width={body.beam_width} differ", param="beam_width")
    if not 1 <= width <= max_n:
        raise APIError(f"the beam width must be in [1, {max_n}]", param="beam_width")
    if body.best_of is not None and body.best_of != width:
        raise APIError("best_of other than the beam width does not combine with use_beam_search", param="best_of")
    refused = {
        "stream": body.stream,
        "temperature": body.temperature not in (None, 0.0),
        "top_p": body.top_p not in (None, 1.0),
        "top_k": body.top_k not in (None, 0, -1),
        "min_p": body.min_p not in (None, 0.0),
        "presence_penalty": body.presence_penalty != 0.0,
        "frequency_penalty": body.frequency_penalty != 0.0,
        "repetition_penalty": body.repetition_penalty != 1.0,
        "logit_bias": bool(body.logit_bias),
        "allowed_token_ids": body.allowed_token_ids is not None,
        "logprobs": body.logprobs is not None,
        "prompt_logprobs": body.prompt_logprobs is not None,
        "echo": body.echo,
        "stop": bool(body.stop_strings()),
        "stop_token_ids": bool(body.stop_token_ids),
        "min_tokens": body.min_tokens > 0,
        "response_format": body.response_format is not None,
        "json_schema": body.json_schema is not None,
        "regex": body.regex is not None,
        "guided_json": bool(guided_specs(body)),
    }
    for name, bad in refused.items():
        if bad:
            raise APIError(f"{name} does not combine with use_beam_search (a deterministic search)", param=name)
    return BeamSearchParams(width, 1, body.length_penalty, body.early_stopping, body.ignore_eos)


def cumulative_logprob(delta: Delta) -> float:
    """The sum of the logprobs of a choice's tokens (the raw model distribution)."""
    return sum(lp[t] for lp, t in zip(delta.logprobs, delta.token_ids, strict=True))


def best_choices(choices: list[ChoiceSpec], merged: dict[int, Delta], n: int) -> list[tuple[int, ChoiceSpec]]:
    """Per prompt, the ``n`` choices with the highest cumulative logprob, best first, each with its
    index in the response (``prompt_index * n + rank``)."""
    by_prompt: dict[int, list[ChoiceSpec]] = {}
    for c in choices:
        by_prompt.setdefault(c.prompt_index, []).append(c)
    out: list[tuple[int, ChoiceSpec]] = []
    for pi, group in sorted(by_prompt.items()):
        ranked = sorted(group, key=lambda c: cumulative_logprob(merged[c.index]), reverse=True)
        out += [(pi * n + rank, c) for rank, c in enumerate(ranked[:n])]
    return out
