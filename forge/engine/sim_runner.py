"""The model runner of simulated runs: a model with no arithmetic computed on the host, with no
batch tensors. The fast path lives here and in the models that offer it (``HostModel``), not in
the ``Model`` contract."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.engine.runner import ModelRunner
from forge.kernels.base import KVLayer
from forge.models.base import Model, OneHotLogits


@runtime_checkable
class HostModel(Protocol):
    """A model that can compute a step from the scheduled rows directly (e.g. the synthetic model).

    ``forward_host(sched, block_size, kv_caches)`` writes the same KV to the same slots as
    ``forward`` would for ``build_forward_batch(sched, block_size)``, reads its context back from
    ``kv_caches`` (host tensors) and returns ``OneHotLogits`` whose ``dense()`` equals what
    ``forward`` returns: per sampling row of ``sched.scheduled`` in order, one row per draft token
    and one for its last token."""

    def forward_host(self, sched: SchedulerOutput, block_size: int, kv_caches: list[KVLayer]) -> OneHotLogits: ...


class SimulationRunner(ModelRunner):
    """A ``ModelRunner`` for a ``HostModel`` whose KV cache is in host memory: each step calls
    ``forward_host`` (no ForwardBatch tensors) and, when every row is plain greedy, takes each
    row's token from the one-hot logits (no logits tensor, no sampler). ``host = False`` falls back
    to the general tensor path (the reference the fast path is tested against)."""

    def __init__(self, model: Model, *args: Any, **kwargs: Any) -> None:
        """``ModelRunner``'s arguments; ``model`` must be a ``HostModel``."""
        if not isinstance(model, HostModel):
            raise TypeError(f"{type(model).__name__} has no forward_host: run it with ModelRunner")
        super().__init__(model, *args, **kwargs)
        if any(k.device.type != "cpu" for k, _ in self.kv_caches):
            raise ValueError("SimulationRunner needs the KV cache in host memory")
        self.host_model: HostModel = model
        self.host = True

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        if not self.host or (
            sched.chunks
            and (
                any(s.num_prompt_logprob_rows for s in sched.chunks)
                or any(r.pooling_params is not None for r in sched.chunk_requests)
            )
        ):  # prompt logprobs and embeddings need logits or hidden states at prompt positions: the tensor path
            return super().execute(sched)
        if sched.swap_out or sched.copy_blocks or sched.swap_in:
            with torch.inference_mode():
                self.apply_block_ops(sched)
        logits = self.host_model.forward_host(sched, self.block_size, self.kv_caches)
        greedy = _greedy(sched, logits)
        if greedy is not None:  # the host path proper: no tensor, so no inference mode to enter
            return greedy
        with torch.inference_mode():
            return self.sample(sched, logits.dense())


def _greedy(sched: SchedulerOutput, logits: OneHotLogits) -> ModelOutput | None:
    """When every row is plain greedy (no penalties, constraint, logprobs or drafts), each token is
    its row's argmax: the one-hot column. None: sample the dense logits instead."""
    if logits.value <= 0.0:
        return None
    for r in sched.decodes.requests:
        if not r.sampling_params.plain_greedy or r.constraint is not None:
            return None
    sampled: dict[str, list[int]] = {}
    tokens = logits.tokens
    i = n = len(sched.decodes)
    for s, r in zip(sched.chunks, sched.chunk_requests, strict=True):
        if not s.sample:
            continue
        if s.num_draft_tokens or not r.sampling_params.plain_greedy or r.constraint is not None:
            return None
        sampled[s.request_id] = [tokens[i]]
        i += 1
    return ModelOutput(sampled, decode_token_ids=tokens[:n] if i > n else tokens)
