"""What an endpoint asks of a body (``ChoiceAsk``), the choices it becomes (``ChoiceSpec``, one per
returned sequence) and the engine requests behind them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from forge.core.beam_params import BeamSearchParams
from forge.core.request import Request, TokenConstraint
from forge.core.sampling_params import SamplingParams
from forge.sched.fork import output_ids
from forge.server.allowed_tokens import AllowedTokensConstraint
from forge.server.min_tokens import MinTokensConstraint
from forge.structured.base import ConstraintSpec, Grammar


@dataclass(frozen=True)
class ChoiceAsk:
    """What an endpoint asks beyond the body's sampling fields. ``prompt_logprobs``: the top-k the
    engine returns per prompt token (the body's, or more when the endpoint also needs them, e.g.
    completions' ``echo`` with ``logprobs``). ``num_sequences``: sequences sampled per prompt
    (``best_of``; default ``n``); ``beam``: each prompt's choices are the results of one beam search
    (its ``max_tokens`` is replaced by the request's)."""

    max_tokens: int | None
    default_max_tokens: int | None
    logprobs: int | None
    tool_spec: ConstraintSpec | None = None
    prompt_logprobs: int | None = None
    num_sequences: int | None = None
    beam: BeamSearchParams | None = None

    def per_prompt(self, n: int) -> int:
        """Sequences generated per prompt."""
        return self.beam.beam_width if self.beam is not None else (self.num_sequences or n)


@dataclass
class ChoiceSpec:
    index: int
    prompt_index: int
    prompt_ids: list[int]
    prompt_text: str | None
    params: SamplingParams
    stop_strings: list[str]
    priority: int
    grammar: Grammar | None
    min_tokens: int = 0
    ending_ids: frozenset[int] = frozenset()
    include_stop_str: bool = False
    allowed_ids: frozenset[int] | None = None  # allowed_token_ids (vLLM's)

    beam: BeamSearchParams | None = None  # one of a beam search's results (the search is one request)

    @property
    def forkable(self) -> bool:
        """Sampled with no per-sequence state beyond its seed (no constraint, no prompt logprobs):
        it may be a fork of a sibling over the same prompt (``SamplingParams.n``)."""
        return (
            self.grammar is None
            and not self.min_tokens
            and self.allowed_ids is None
            and self.params.prompt_logprobs is None
        )

    def to_request(self, request_id: str, n: int = 1) -> Request:
        """The engine request of this choice (``n > 1``: and its ``n - 1`` forked siblings, which
        sample with ``seed + i`` as the choices after it do)."""
        constraint: TokenConstraint | None = None
        if self.grammar is not None:
            # a max_tokens below the grammar's shortest output: the constraint steers to a shortest
            # output and the engine cuts it at max_tokens (finish_reason "length"), as OpenAI and vLLM
            constraint = self.grammar.constraint(max(self.params.max_tokens, self.grammar.min_tokens))
        elif self.min_tokens:
            constraint = MinTokensConstraint(self.min_tokens, self.ending_ids)
        if self.allowed_ids is not None:
            constraint = AllowedTokensConstraint(self.allowed_ids, constraint)
        return Request(
            request_id=request_id,
            prompt_token_ids=list(self.prompt_ids),
            sampling_params=dataclasses.replace(self.params, n=n) if n > 1 else self.params,
            priority=self.priority,
            constraint=constraint,
            beam_search=self.beam,
        )

    def joins(self, first: ChoiceSpec) -> bool:
        """This choice is one more output of ``first``'s engine request: the same prompt, and both
        results of one beam search or both forkable samples."""
        if self.prompt_index != first.prompt_index or (self.beam is None) != (first.beam is None):
            return False
        return first.beam is not None or self.forkable


def _group(choices: list[ChoiceSpec], start: int) -> list[ChoiceSpec]:
    """The choices from ``start`` on that one engine request makes."""
    first = choices[start]
    group = [first]
    if first.beam is not None or first.forkable:
        while start + len(group) < len(choices) and choices[start + len(group)].joins(first):
            group.append(choices[start + len(group)])
    return group


def engine_requests(choices: list[ChoiceSpec], prefix: str) -> tuple[list[Request], dict[str, ChoiceSpec]]:
    """The engine requests behind ``choices`` (in order, a prompt's consecutively) and the choice of
    each of their output ids (``output_ids``). A prompt's sampled choices are one request with
    ``n`` = their number when they can fork (one prefill, the prompt's KV blocks shared copy-on-write;
    choice j samples with ``seed + j`` either way, so the tokens are those of separate requests); a
    beam search's results are one request."""
    requests: list[Request] = []
    by_id: dict[str, ChoiceSpec] = {}
    i = 0
    while i < len(choices):
        group = _group(choices, i)
        first = group[0]
        request = first.to_request(f"{prefix}-{first.index}", 1 if first.beam is not None else len(group))
        requests.append(request)
        by_id.update(zip(output_ids(request), group, strict=True))
        i += len(group)
    return requests, by_id
