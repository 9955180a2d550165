"""vLLM's ``allowed_token_ids``: sampling restricted to a list of token ids (the mask is applied after
``logit_bias``, so a bias still orders the allowed tokens), checked before the request runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from forge.core.request import TokenConstraint
from forge.server.checks import check_token_ids
from forge.server.protocol import APIError, SamplingFields

if TYPE_CHECKING:  # imported when a mask is made
    import torch


def allowed_token_ids(body: SamplingFields, vocab_size: int, ending: frozenset[int]) -> frozenset[int] | None:
    """The body's ``allowed_token_ids`` (None: not given); 400 when empty, outside the vocabulary, or
    (with ``min_tokens``) only tokens that would end the sequence, which ``min_tokens`` bans."""
    if body.allowed_token_ids is None:
        return None
    if not body.allowed_token_ids:
        raise APIError("allowed_token_ids must not be empty", param="allowed_token_ids")
    check_token_ids(body.allowed_token_ids, vocab_size, "allowed_token_ids")
    allowed = frozenset(body.allowed_token_ids)
    if body.min_tokens and allowed <= ending:
        raise APIError(
            "allowed_token_ids holds only tokens that end the sequence, which min_tokens bans",
            param="allowed_token_ids",
        )
    return allowed


class AllowedTokensConstraint:
    """A ``forge.core.request.TokenConstraint``: only ``allowed`` tokens, and of them only those
    ``inner`` (e.g. ``min_tokens``'s constraint) allows."""

    def __init__(self, allowed: frozenset[int], inner: TokenConstraint | None = None) -> None:
        self.allowed = sorted(allowed)
        self.inner = inner

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        import torch

        mask = torch.zeros(vocab_size, dtype=torch.bool)
        mask[torch.tensor([t for t in self.allowed if t < vocab_size], dtype=torch.long)] = True
        inner = self.inner.allowed_mask(vocab_size) if self.inner is not None else None
        return mask if inner is None else mask & inner.to(mask.device)

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self.inner.accept(token)
