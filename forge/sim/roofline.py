"""The roofline cost model: a step takes max(compute, memory) on the hardware, plus a fixed overhead."""

from __future__ import annotations

from operator import mul

from forge.core.outputs import SchedulerOutput
from forge.models.base import ModelDims
from forge.sim.cost_model import BatchShape, CostModel, FastCostModel, Hardware


class RooflineCostModel(CostModel, FastCostModel):
    """max(compute time, memory time) + a fixed per-step overhead.

    Compute: 2 FLOPs per parameter per token for the linear layers (the LM head only for
    sampled rows) plus 4·layers·heads·head_dim FLOPs per (query, key) pair of attention.
    Memory: every weight read once per step, every request's K/V context read, new K/V written.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(self, dims: ModelDims, hw: Hardware) -> None:
        self.dims = dims
        self.hw = hw
        d = dims
        head = d.vocab_size * d.hidden_size
        self.linear_params = d.active_params - 2 * head  # a mixture of experts computes with its active ones
        self.head_params = head
        self.attn_flops_per_pair = 4 * d.num_layers * d.num_heads * d.head_dim
        self.kv_bytes_per_token = d.kv_bytes_per_token  # in the KV cache's dtype
        self.weight_bytes = d.num_params * d.bytes_per_param

    def step_time(self, batch: BatchShape) -> float:
        q, s = batch.query_lens, batch.seq_lens  # C-level sums
        return self._time(sum(q), sum(map(mul, q, s)), sum(map(mul, q, q)), sum(s), batch.num_sampled)

    def step_time_of(self, sched: SchedulerOutput) -> float:
        """``step_time`` from sums over the step's rows: the column-wise decodes summed as columns
        (one token each, context start + 1), no ``BatchShape`` built."""
        d = sched.decodes
        num_decodes = len(d)
        decode_seq = sum(d.starts) + num_decodes
        seq = query_seq = query_sq = sampled = 0
        for c in sched.chunks:
            q, end = c.num_tokens, c.start + c.num_tokens
            seq += end
            query_seq += q * end
            query_sq += q * q
            sampled += c.sample + c.num_draft_tokens
        return self._time(
            sched.num_batched_tokens,
            query_seq + decode_seq,
            query_sq + num_decodes,
            seq + decode_seq,
            sampled + num_decodes,
        )

    def decode_step_time(self, num_decodes: int, context_sum: int) -> float | None:
        return self._time(num_decodes, context_sum, num_decodes, context_sum, num_decodes)

    def _time(self, tokens: int, query_seq: int, query_sq: int, seq_lens: int, num_sampled: int) -> float:
        """From the sums over requests of q, q * s, q * q and s (q new tokens, s context after the step)."""
        if tokens == 0:
            return 0.0
        # sum over requests of q * (s - (q - 1) / 2): each query attends to its own prefix
        pairs = (2 * query_seq - query_sq + tokens) / 2
        flops: float = 2 * self.linear_params * tokens + 2 * self.head_params * num_sampled
        flops += self.attn_flops_per_pair * pairs
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * (seq_lens + tokens)
        compute = flops / (self.hw.flops * self.hw.flops_efficiency)
        memory = bytes_moved / (self.hw.mem_bw * self.hw.bw_efficiency)
        return max(compute, memory) + self.hw.step_overhead
