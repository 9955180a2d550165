"""``min_tokens``: the tokens that would end a request (EOS unless ``ignore_eos``, its stop token
ids) are masked out until it has generated ``min_tokens`` tokens."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a mask is made: LLM.generate on a simulated run needs no torch
    import torch


class MinTokensConstraint:
    """A ``forge.core.request.TokenConstraint`` that bans ``ending`` tokens for the first
    ``min_tokens`` outputs; each accepted token counts (it never constrains anything else)."""

    def __init__(self, min_tokens: int, ending: Iterable[int]) -> None:
        self.min_tokens = min_tokens
        self.ending = sorted(set(ending))
        self.generated = 0

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        banned = [t for t in self.ending if t < vocab_size]
        if self.generated >= self.min_tokens or not banned:
            return None
        import torch

        mask = torch.ones(vocab_size, dtype=torch.bool)
        mask[torch.tensor(banned, dtype=torch.long)] = False
        return mask

    def accept(self, token: int) -> None:
        self.generated += 1
