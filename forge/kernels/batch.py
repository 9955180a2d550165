"""The flat batch the kernels consume, built from the scheduler's plain-data step."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from forge.core.kv_groups import KVCacheGroups
from forge.core.outputs import SchedulerOutput
from forge.kernels.base import AttentionMetadata


@dataclass(frozen=True)
class ForwardBatch:
    """Flat batch of the tokens scheduled this step.

    ``logits_indices`` are the rows of the flat batch whose next-token logits the caller
    needs (one per sampling request, several for requests verifying drafts), followed by the
    prompt-logprob rows of the chunks that have them (``ScheduledRequest.num_prompt_logprob_rows``,
    in row order).

    With several KV cache groups (``forge.core.kv_groups``), ``group_attn[g]`` is group g's metadata
    (its block tables and slot mapping; ``attn`` is group 0's) and ``layer_group[l]`` layer l's group:
    layer l reads and writes its KV through ``attn_for(l)``.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor
    group_attn: tuple[AttentionMetadata, ...] = ()
    layer_group: tuple[int, ...] = ()

    def attn_for(self, layer: int) -> AttentionMetadata:
        """The attention metadata of layer ``layer``'s KV cache group."""
        return self.group_attn[self.layer_group[layer]] if self.group_attn else self.attn


def build_forward_batch(
    sched: SchedulerOutput, block_size: int, device: torch.device, groups: KVCacheGroups | None = None
) -> ForwardBatch:
    """Flat input ids, positions, slot mapping and padded block tables for the scheduled chunks
    (per KV cache group when ``groups`` has several).

    Sampling rows: the last scheduled token of each sampling request, preceded by one row per
    draft token (the target's prediction at each draft position); then the prompt-logprob rows."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    logits_rows: list[int] = []
    prompt_rows: list[int] = []
    for s in sched.scheduled:
        end = s.start + s.num_tokens
        table = s.block_table
        input_ids.extend(s.token_ids)
        if s.num_tokens == 1:
            positions.append(s.start)
            slots.append(table[s.start // block_size] * block_size + s.start % block_size)
        else:
            pos = range(s.start, end)
            positions.extend(pos)
            slots.extend(table[p // block_size] * block_size + p % block_size for p in pos)
        query_start.append(query_start[-1] + s.num_tokens)
        seq_lens.append(end)
        tables.append(table[: -(-end // block_size)])
        if s.sample:
            logits_rows.extend(range(query_start[-1] - 1 - s.num_draft_tokens, query_start[-1]))
        if s.num_prompt_logprob_rows:
            prompt_rows.extend(range(query_start[-2], query_start[-2] + s.num_prompt_logprob_rows))
    width = max((len(t) for t in tables), default=0)
    flat: list[int] = []  # the padded tables, row-major: one flat list converts far faster than nested ones
    for t in tables:
        flat.extend(t)
        flat.extend([0] * (width - len(t)))

    def tensor(x: list[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(x, dtype=dtype, device=device)

    attn = AttentionMetadata(
        query_start_loc=tensor(query_start),
        seq_lens=tensor(seq_lens),
        block_tables=tensor(flat).view(len(tables), width),
        slot_mapping=tensor(slots),
        block_size=block_size,
        query_lens_cpu=[s.num_tokens for s in sched.scheduled],
        seq_lens_cpu=seq_lens,
    )
    logits = tensor(logits_rows + prompt_rows)
    if groups is None or groups.num_groups == 1:
        return ForwardBatch(tensor(input_ids), tensor(positions), attn, logits)
    group_attn = [attn]
    for g in range(1, groups.num_groups):
        g_tables = [s.group_tables[g - 1] for s in sched.scheduled]
        g_slots: list[int] = []
        g_flat: list[int] = []
        for s, table, used in zip(sched.scheduled, g_tables, tables, strict=True):
            g_slots.extend(_slots(table, s.start, s.num_tokens, block_size))
            g_flat.extend(table[: len(used)])
            g_flat.extend([0] * (width - len(used)))
        group_attn.append(
            dataclasses.replace(
                attn, block_tables=tensor(g_flat).view(len(tables), width), slot_mapping=tensor(g_slots)
            )
        )
    return ForwardBatch(tensor(input_ids), tensor(positions), attn, logits, tuple(group_attn), groups.layer_group)


def _slots(table: list[int], start: int, num_tokens: int, block_size: int) -> list[int]:
    """The flat cache slots of positions ``start .. start + num_tokens - 1`` through ``table``."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, start + num_tokens)]
