"""Running a model without the engine: one sequence, prefill then greedy decode, over a paged cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from forge.kernels.base import AttentionMetadata, KVLayer
from forge.kernels.batch import ForwardBatch
from forge.kernels.torch_backend import TorchBackend
from forge.models.base import Model

BLOCK_SIZE = 16


def _batch(ids: list[int], start: int, total: int, table: torch.Tensor, all_logits: bool) -> ForwardBatch:
    n = len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, n]),
        seq_lens=torch.tensor([total]),
        block_tables=table[None, :],
        slot_mapping=torch.arange(start, total),
        block_size=BLOCK_SIZE,
        query_lens_cpu=[n],
        seq_lens_cpu=[total],
    )
    rows = torch.arange(n) if all_logits else torch.tensor([n - 1])
    return ForwardBatch(torch.tensor(ids), torch.arange(start, total), meta, rows)


class SingleSequence:
    """One request's KV cache: blocks 0..n in order, so slot i holds position i."""

    def __init__(self, model: Model, max_len: int) -> None:
        self.model = model
        self.backend = TorchBackend("cpu")
        num_blocks = -(-max_len // BLOCK_SIZE)
        self.cache: list[KVLayer] = self.backend.allocate_kv_cache(model.kv_spec, num_blocks, BLOCK_SIZE)
        self.table = torch.arange(num_blocks)
        self.length = 0

    def step(self, ids: list[int], all_logits: bool = False) -> torch.Tensor:
        total = self.length + len(ids)
        batch = _batch(ids, self.length, total, self.table, all_logits)
        logits = self.model.forward(batch, self.cache, self.backend)
        self.length = total
        return logits


def prefill_logits(model: Model, ids: list[int]) -> torch.Tensor:
    """Float32 logits ``[len(ids), vocab]`` of every prompt position."""
    return SingleSequence(model, len(ids)).step(ids, all_logits=True)


def greedy(model: Model, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation of ``ids`` (no EOS stop)."""
    seq = SingleSequence(model, len(ids) + max_tokens)
    logits = seq.step(ids)
    out: list[int] = []
    for _ in range(max_tokens):
        out.append(int(logits[-1].argmax()))
        if len(out) < max_tokens:
            logits = seq.step([out[-1]])
    return out


def top1_agreement(exact: Model, approx: Model, prompts: Sequence[str]) -> tuple[int, int]:
    """Prompt positions (over all ``prompts``) where the two models' prefill argmax agree, and how many."""
    same = total = 0
    for prompt in prompts:
        ids = exact.tokenizer.encode(prompt)
        match = prefill_logits(exact, ids).argmax(-1) == prefill_logits(approx, ids).argmax(-1)
        same += int(match.sum())
        total += match.numel()
    return same, total
