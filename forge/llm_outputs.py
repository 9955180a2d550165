"""What ``forge.llm.LLM`` returns: a completion (``CompletionOutput``), one step's delta of it
(``CompletionDelta``), a beam search's result (``BeamSearchOutput`` of ``BeamSequence``s), and the
prompt and message types it takes. Part of ``forge.llm``, which re-exports them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Prompts = str | Sequence[int] | Sequence[str | Sequence[int]]
Message = Mapping[str, Any]


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class CompletionDelta:
    """What one output gained in one engine step. ``index``: the output's position in what
    ``generate`` would return; ``finish_reason`` is set on the output's last delta only."""

    index: int
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass(frozen=True)
class BeamSequence:
    """One beam search result: its output tokens (a final EOS included), their text and the sum of
    their logprobs; ``finish_reason`` "stop" (it ended in EOS) or "length" (``max_tokens``)."""

    token_ids: list[int]
    text: str
    cumulative_logprob: float
    finish_reason: str


@dataclass(frozen=True)
class BeamSearchOutput:
    """The beam search of one prompt: ``sequences`` best first by score (``BeamSearchParams``)."""

    prompt_token_ids: list[int]
    sequences: list[BeamSequence]
