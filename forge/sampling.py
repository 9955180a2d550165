"""Logits processors and seeded sampling. A row's result depends only on its own logits,
its request's parameters and history, and the (seed, position) pair — never on the batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from forge.sampling_params import SamplingParams

_MASK64 = (1 << 63) - 1


@dataclass(frozen=True)
class SampleRow:
    """One row of logits to sample: its parameters, the request's tokens so far, and the
    seed + position that make the draw reproducible."""

    params: SamplingParams
    seed: int
    position: int
    prompt_ids: Sequence[int] = ()
    output_ids: Sequence[int] = ()
    allowed: torch.Tensor | None = None


def row_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(hash((seed, position)) & _MASK64)
    return g


def apply_penalties(logits: torch.Tensor, row: SampleRow) -> torch.Tensor:
    """OpenAI presence/frequency penalties over output tokens; repetition penalty (CTRL) over
    prompt + output."""
    p = row.params
    logits = logits.clone()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)), dtype=torch.long, device=logits.device)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and row.output_ids:
        counts = torch.bincount(
            torch.tensor(list(row.output_ids), dtype=torch.long, device=logits.device),
            minlength=logits.shape[-1],
        )[: logits.shape[-1]].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p (a 1-D row, temperature > 0)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def sample_row(logits: torch.Tensor, row: SampleRow) -> int:
    if row.allowed is not None:
        logits = logits.masked_fill(~row.allowed, float("-inf"))
    if row.params.needs_penalties:
        logits = apply_penalties(logits, row)
    if row.params.greedy:
        return int(logits.argmax())
    probs = processed_probs(logits, row.params)
    g = row_generator(row.seed, row.position, logits.device)
    return int(torch.multinomial(probs, 1, generator=g))


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[int]:
    """One token per row of ``logits [len(rows), vocab]``."""
    plain_greedy = [
        i for i, r in enumerate(rows) if r.params.greedy and not r.params.needs_penalties and r.allowed is None
    ]
    out = [0] * len(rows)
    if plain_greedy:
        idx = torch.tensor(plain_greedy, device=logits.device)
        for i, tok in zip(plain_greedy, logits[idx].argmax(-1).tolist(), strict=True):
            out[i] = tok
    done = set(plain_greedy)
    for i, row in enumerate(rows):
        if i not in done:
            out[i] = sample_row(logits[i], row)
    return out


def top_logprobs(logits: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """The chosen token's logprob plus the ``k`` most likely tokens' (raw model distribution)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = {token: float(lp[token])}
    if k:
        vals, ids = lp.topk(k)
        out.update({int(i): float(v) for i, v in zip(ids.tolist(), vals.tolist(), strict=True)})
    return out
