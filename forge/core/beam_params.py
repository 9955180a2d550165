"""How one beam search runs (the names follow vLLM's ``BeamSearchParams``)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BeamSearchParams:
    """A deterministic beam search of ``beam_width`` beams for up to ``max_tokens`` tokens.

    Each round every live beam proposes its ``2 * beam_width`` most likely next tokens (the raw model
    distribution, as vLLM's beam search); a candidate ending in EOS (unless ``ignore_eos``) is a
    finished hypothesis, the ``beam_width`` best of the others by cumulative logprob live on. A
    hypothesis scores ``cumulative_logprob / length ** length_penalty`` where ``length`` counts the
    prompt and the output, less a final EOS (vLLM's ``get_beam_search_score``). The result is the
    ``beam_width`` best-scoring hypotheses, finished or still live when the search stopped.

    ``early_stopping``: False (vLLM's current behaviour) runs until ``max_tokens`` or until no beam
    is live; True stops as soon as ``beam_width`` hypotheses have finished (Hugging Face's and vLLM
    V0's ``early_stopping=True``)."""

    beam_width: int
    max_tokens: int = 16
    length_penalty: float = 1.0
    early_stopping: bool = False
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.beam_width < 1:
            raise ValueError(f"beam_width must be >= 1, got {self.beam_width}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be finite, got {self.length_penalty}")

    @property
    def num_candidates(self) -> int:
        """Next tokens each live beam proposes per round."""
        return 2 * self.beam_width


def beam_score(cumulative_logprob: float, length: int, length_penalty: float) -> float:
    """vLLM's beam score: the cumulative logprob over ``length ** length_penalty`` (``length``: prompt
    plus output tokens, a final EOS not counted)."""
    return cumulative_logprob / (length**length_penalty)
