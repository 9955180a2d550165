"""Logits processors and seeded sampling. A row's result depends only on its own logits,
its request's parameters and history, and the (seed, position) pair — never on the batch."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from forge.core.sampling_params import SamplingParams

_MASK64 = (1 << 63) - 1


class SamplingError(RuntimeError):
    """One row could not be sampled: its scores leave no valid distribution (every token masked,
    or the model's logits are not finite). The request fails; the rest of the batch does not."""


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


def request_seed(seed: int | None, base_seed: int, request_id: str) -> int:
    """A request's sampling seed: its own ``seed``, else one derived from the engine's ``base_seed``
    and its id with a stable hash (the same in every process, unlike ``hash`` of a string)."""
    if seed is not None:
        return seed
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return hash((base_seed, int.from_bytes(digest, "little")))


def row_generator(seed: int, position: int, device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(hash((seed, position)) & _MASK64)
    return g


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``params.logit_bias`` added to its tokens' logits (ids past the vocabulary are skipped)."""
    vocab = logits.shape[-1]
    items = [(t, b) for t, b in params.logit_bias.items() if t < vocab]
    if not items:
        return logits
    ids = torch.tensor([t for t, _ in items], dtype=torch.long, device=logits.device)
    bias = torch.tensor([b for _, b in items], dtype=logits.dtype, device=logits.device)
    return logits.index_add(-1, ids, bias)


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
        drop[0] = False  # the most likely token always stays (a top_p below float32's resolution)
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` (a 1-D row); SamplingError if it is not a distribution."""
    if not bool(torch.isfinite(probs).all()):
        raise SamplingError("no valid token distribution: every token is masked or the logits are not finite")
    return int(torch.multinomial(probs, 1, generator=generator))


def greedy_token(scores: torch.Tensor) -> int:
    """The argmax of ``scores``; SamplingError if it is NaN or -inf (every token masked)."""
    token = int(scores.argmax())
    best = float(scores[token])
    if best != best or best == float("-inf"):
        raise SamplingError("no valid greedy token: every token is masked or the logits are NaN")
    return token


def sample_row(logits: torch.Tensor, row: SampleRow) -> int:
    """One row's token (raises SamplingError when its scores leave no valid choice)."""
    if row.params.logit_bias:
        logits = apply_logit_bias(logits, row.params)
    if row.allowed is not None:
        logits = logits.masked_fill(~row.allowed, float("-inf"))
    if row.params.needs_penalties:
        logits = apply_penalties(logits, row)
    if row.params.greedy:
        return greedy_token(logits)
    probs = processed_probs(logits, row.params)
    return draw(probs, row_generator(row.seed, row.position, logits.device))


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> list[int]:
    """One token per row of ``logits [len(rows), vocab]``; SamplingError if a row (other than a
    plain greedy one, which takes the argmax) has no valid choice."""
    plain_greedy = [
        i
        for i, r in enumerate(rows)
        if r.params.greedy and not r.params.needs_penalties and not r.params.logit_bias and r.allowed is None
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


def sample_each(logits: torch.Tensor, rows: list[SampleRow]) -> Sequence[int | Exception]:
    """``sample``, but a row that cannot be sampled fails alone: per row, its token (the one
    ``sample`` gives: a row's token never depends on the batch) or the exception it raised."""
    try:
        return sample(logits, rows)
    except Exception:  # find the failing rows one by one
        return [_sample_one(logits[i : i + 1], row) for i, row in enumerate(rows)]


def _sample_one(logits: torch.Tensor, row: SampleRow) -> int | Exception:
    try:
        return sample(logits, [row])[0]
    except Exception as exc:
        return exc


def top_logprobs(logits: torch.Tensor, token: int, k: int) -> dict[int, float]:
    """The chosen token's logprob plus the ``k`` most likely tokens' (raw model distribution)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = {token: float(lp[token])}
    if k:
        vals, ids = lp.topk(k)
        out.update({int(i): float(v) for i, v in zip(ids.tolist(), vals.tolist(), strict=True)})
    return out
