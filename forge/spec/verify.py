"""Verification of draft tokens against the target model: the one rule, and its per-request glue.

``verify`` is exact: greedy verification emits what greedy decoding without drafts emits, and
rejection sampling (Leviathan et al. 2023; Chen et al. 2023) emits tokens distributed exactly as
the target's sampler would, whatever the drafter proposed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.core.request import Request
from forge.sampling.sampler import (
    SampleRow,
    apply_logit_bias,
    apply_penalties,
    draw,
    processed_probs,
    row_generator,
    top_logprobs,
)


def verify(
    draft_ids: torch.Tensor,
    target: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify ``k`` drafts for each of ``B`` sequences; returns ``(tokens [B, k+1], num_accepted [B])``.

    The emitted tokens of sequence b are ``tokens[b, : num_accepted[b] + 1]``: the accepted drafts,
    then one correction (on a rejection) or bonus (all accepted) token.

    - ``draft_ids [B, k]``: the proposals.
    - ``target [B, k+1, V]``: at each draft position and the bonus position, the target's
      scores (greedy: any monotone scores, e.g. logits) or probabilities ``p`` (sampling).
    - ``draft_probs [B, k, V]``: the drafter's ``q``; None means one-hot on the drafts
      (drafters without a distribution, e.g. n-gram).
    - ``uniforms [B, k+1, 2]``: U[0, 1) draws per position (acceptance test, resampling);
      None selects greedy verification: the longest prefix of drafts equal to the target's
      argmax, then the target's argmax after it.

    Sampling: accept draft x with probability min(1, p(x)/q(x)); at the first rejection draw
    from normalize(max(0, p - q)); when all k are accepted draw the bonus token from p.
    Draws are inverse-CDF with the given uniforms, so a result is a pure function of its inputs.
    """
    k = draft_ids.shape[1]
    if uniforms is None:
        best = target.argmax(-1)
        num_accepted = (draft_ids == best[:, :k]).long().cumprod(-1).sum(-1)
        return best, num_accepted
    p = target.double()
    idx = draft_ids.unsqueeze(-1)
    q = torch.zeros_like(p[:, :k]).scatter_(-1, idx, 1.0) if draft_probs is None else draft_probs.double()
    p_x = p[:, :k].gather(-1, idx).squeeze(-1)
    q_x = q.gather(-1, idx).squeeze(-1)
    num_accepted = (uniforms[:, :k, 0] * q_x < p_x).long().cumprod(-1).sum(-1)
    residual = (p[:, :k] - q).clamp(min=0.0)
    # An empty residual means p == q there, where rejection has probability 0: any distribution will do.
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[:, :k])
    cdf = torch.cat([residual, p[:, k:]], dim=1).cumsum(-1)
    x = uniforms[..., 1:2].double() * cdf[..., -1:]
    recovered = torch.searchsorted(cdf, x, right=True).squeeze(-1).clamp(max=p.shape[-1] - 1)
    padded = torch.cat([draft_ids, draft_ids.new_zeros(draft_ids.shape[0], 1)], dim=1)
    position = torch.arange(k + 1, device=draft_ids.device)
    tokens = torch.where(position < num_accepted.unsqueeze(-1), padded, recovered)
    return tokens, num_accepted


def _row_scores(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """The logits the sampler would act on for this row (bias, constraint mask, then penalties)."""
    if row.params.logit_bias:
        logits = apply_logit_bias(logits, row.params)
    if row.allowed is not None:
        logits = logits.masked_fill(~row.allowed, float("-inf"))
    if row.params.needs_penalties:
        logits = apply_penalties(logits, row)
    return logits


def _coupled(scores: torch.Tensor, rows: Sequence[SampleRow], draft_ids: Sequence[int], seed: int) -> list[int]:
    """Sampled verification by coupling: draw each position's token exactly as ``sample_row``
    would (same probabilities, same ``row_generator(seed, position)``), accept the drafts while
    they equal the draws, and emit the first draw that differs (or the bonus draw). Every emitted
    token is the target's own draw, so the output is distributed exactly as the target's sampler
    and a seeded request's tokens are the ones it samples without drafts, whatever was drafted
    (they cannot depend on the pool size, preemption or the drafter's state). For one-hot drafts
    (n-gram) this is rejection sampling itself: x is accepted with probability p(x) and a rejection
    emits p conditioned on "not x". A draft model that draws with the same generator (see
    ``DraftModelDrafter``) agrees with the draw wherever its ``q`` is close to ``p``."""
    emitted: list[int] = []
    for j, (s, row) in enumerate(zip(scores, rows, strict=True)):
        token = draw(processed_probs(s, row.params), row_generator(seed, row.position, s.device))
        emitted.append(token)
        if j == len(draft_ids) or token != draft_ids[j]:
            break
    return emitted


def verify_request(
    logits: torch.Tensor,
    request: Request,
    seed: int,
    draft_ids: Sequence[int],
) -> tuple[list[int], list[dict[int, float]] | None]:
    """Verify one request's drafts given the target's ``logits [k+1, V]`` at its draft positions.

    Row j is processed as the sampler would process the token at position ``num_tokens + j``
    with the drafts before it already in the output (penalties see them), and its random
    draws come from ``row_generator(seed, num_tokens + j)``: the result never depends on the
    batch. A sampled request's tokens equal what it samples without drafts (``_coupled``).
    Returns the emitted tokens and, if the request asks for them, their logprobs.
    """
    k = len(draft_ids)
    if logits.shape[0] != k + 1:
        raise ValueError(f"request {request.request_id}: {logits.shape[0]} logits rows for {k} drafts")
    if request.constraint is not None:
        raise ValueError(f"request {request.request_id}: constrained requests cannot verify drafts")
    params = request.sampling_params
    output = list(request.output_token_ids)
    rows = [
        SampleRow(params, seed, request.num_tokens + j, request.prompt_token_ids, output + list(draft_ids[:j]))
        for j in range(k + 1)
    ]
    scores = torch.stack([_row_scores(logits[j], row) for j, row in enumerate(rows)])
    ids = torch.tensor([list(draft_ids)], dtype=torch.long, device=logits.device)
    if params.greedy:
        tokens, accepted = verify(ids, scores.unsqueeze(0))
        emitted = tokens[0, : int(accepted[0]) + 1].tolist()
    else:
        emitted = _coupled(scores, rows, draft_ids, seed)
    if params.logprobs is None:
        return emitted, None
    return emitted, [top_logprobs(logits[j], tok, params.logprobs) for j, tok in enumerate(emitted)]
