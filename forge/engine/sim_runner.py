"""The model runner of simulated runs: a model with no arithmetic computed on the host, with no
batch tensors and no torch. The fast path lives here and in the models that offer it (``HostModel``),
not in the ``Model`` contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from forge.core.decode_run import DecodeRun
from forge.core.fast_paths import declares_fast_paths
from forge.core.kv_groups import KVCacheGroups
from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.engine.runner_base import Runner
from forge.kernels.base import HostKVLayer, KernelBackend, KVLayer, KVSpec
from forge.models.base import HiddenStateModel, Model, OneHotLogits

if TYPE_CHECKING:
    from forge.engine.runner import ModelRunner


@runtime_checkable
class HostModel(Protocol):
    """A model that can compute a step from the scheduled rows directly (e.g. the synthetic model).

    ``forward_host(sched, block_size, kv_caches)`` writes the same KV to the same slots as
    ``forward`` would for ``build_forward_batch(sched, block_size)``, reads its context back from
    ``kv_caches`` (host memory: numpy arrays, ``KernelBackend.allocate_host_kv_cache``, or CPU tensors)
    and returns ``OneHotLogits`` whose ``dense()`` equals what ``forward`` returns: per sampling row of
    ``sched.scheduled`` in order, one row per draft token and one for its last token. It needs no torch."""

    def forward_host(
        self, sched: SchedulerOutput, block_size: int, kv_caches: list[HostKVLayer] | list[KVLayer]
    ) -> OneHotLogits: ...


@runtime_checkable
class DecodeRunModel(Protocol):
    """A ``HostModel`` that computes a ``DecodeRun`` at once: ``forward_host_run(run, block_size,
    kv_caches)`` writes each row's tokens' KV where ``forward_host`` would over the run's steps and
    returns each row's ``num_steps`` greedy tokens (its logits' argmax), the same as those steps'."""

    def forward_host_run(
        self, run: DecodeRun, block_size: int, kv_caches: list[HostKVLayer] | list[KVLayer]
    ) -> list[list[int]]: ...


class SimulationRunner(Runner):
    """The model runner for a ``HostModel`` on a CPU backend, with ``ModelRunner``'s interface
    (``model``, ``hidden_model``, ``execute``, ``close``) and arguments.

    Its KV store is numpy arrays the backend allocates (``allocate_host_kv_cache``). Each step calls
    ``forward_host`` (no ForwardBatch tensors) and, when every row is plain greedy, takes each row's
    token from the one-hot logits: such a run never imports torch. What the host path cannot do
    (prompt logprobs and embeddings, which need logits or hidden states at prompt positions; sampling
    other than plain greedy; verifying drafts) goes to ``tensor_runner()``, a ``ModelRunner`` over
    tensors viewing the same memory, built (and torch imported) the first time it is needed.
    ``host = False`` sends every step there: the reference the host path is tested against.
    ``decode_runs``: whether ``execute_decode_run`` can compute a ``DecodeRun`` (a ``DecodeRunModel``
    on the host path); the engine asks the scheduler for runs only then.

    The host path and decode runs are fast paths (``forge.core.fast_paths``): taken only when
    ``fast_paths`` is set and the model's own class sets ``fast_paths = True``, promising that
    ``forward_host`` (and ``forward_host_run``) compute what ``forward`` does. Otherwise ``host`` is
    False: every step goes through ``forward``."""

    def __init__(
        self,
        model: Model,
        backend: KernelBackend,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        num_cpu_blocks: int = 0,
        max_num_seqs: int = 256,
        max_model_len: int = 4096,
        kv_spec: KVSpec | None = None,
        kv_groups: KVCacheGroups | None = None,
        fast_paths: bool = True,
    ) -> None:
        """``ModelRunner``'s arguments and ``fast_paths``; ``model`` must be a ``HostModel``, the backend's
        device the CPU and the cache one group of layers."""
        if not isinstance(model, HostModel):
            raise TypeError(f"{type(model).__name__} has no forward_host: run it with ModelRunner")
        if backend.device_type != "cpu":
            raise ValueError(
                f"SimulationRunner needs the KV cache in host memory, the backend is on {backend.device_name}"
            )
        if kv_groups is not None and kv_groups.is_hybrid:
            raise ValueError("SimulationRunner runs a cache of one layer group (no hybrid KV cache groups)")
        self.model = model
        self.backend = backend
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.seed = seed
        self.host_model: HostModel = model
        self.hidden_model: HiddenStateModel | None = model if isinstance(model, HiddenStateModel) else None
        spec = kv_spec or model.kv_spec
        self.kv_caches: list[HostKVLayer] = backend.allocate_host_kv_cache(spec, num_blocks, block_size)
        # the swap space: the same layout in host memory
        self.cpu_kv_caches: list[HostKVLayer] = (
            backend.allocate_host_kv_cache(spec, num_cpu_blocks, block_size) if num_cpu_blocks else []
        )
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.host = fast_paths and declares_fast_paths(model)
        self._run_model: DecodeRunModel | None = model if isinstance(model, DecodeRunModel) else None
        self._tensor_runner: ModelRunner | None = None

    def tensor_runner(self) -> ModelRunner:
        """The general tensor path: a ``ModelRunner`` whose KV tensors view this runner's host store
        (``torch.from_numpy``: what one path writes, the other reads). Built on first use."""
        if self._tensor_runner is None:
            import torch

            from forge.engine.runner import ModelRunner

            def tensors(layers: list[HostKVLayer]) -> list[KVLayer]:
                return [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in layers]

            self._tensor_runner = ModelRunner(
                self.model,
                self.backend,
                self.num_blocks,
                self.block_size,
                seed=self.seed,
                max_num_seqs=self.max_num_seqs,
                max_model_len=self.max_model_len,
                kv_pages=tensors(self.kv_caches),
                cpu_kv_caches=tensors(self.cpu_kv_caches),
            )
        return self._tensor_runner

    @property
    def decode_runs(self) -> bool:
        return self.host and self._run_model is not None

    def fast_path_components(self) -> dict[str, object]:
        return {"model": self.model}  # its host path and decode runs rely on the model's declaration

    def execute_decode_run(self, run: DecodeRun) -> list[list[int]]:
        """Each row's greedy tokens over the run (``DecodeRunModel.forward_host_run``)."""
        if not self.host or self._run_model is None:
            raise TypeError(f"{type(self.model).__name__} computes no decode runs on this runner")
        return self._run_model.forward_host_run(run, self.block_size, self.kv_caches)

    def apply_block_ops(self, sched: SchedulerOutput) -> None:
        """The step's KV copies, before its forward: swap-out, copy-on-write, swap-in."""
        copy = self.backend.copy_host_blocks
        copy(self.kv_caches, self.cpu_kv_caches, sched.swap_out)
        copy(self.kv_caches, self.kv_caches, sched.copy_blocks)
        copy(self.cpu_kv_caches, self.kv_caches, sched.swap_in)

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        """``ModelRunner.execute``'s result for the step."""
        if not self.host or (
            sched.chunks
            and (
                any(s.num_prompt_logprob_rows for s in sched.chunks)
                or any(r.pooling_params is not None for r in sched.chunk_requests)
            )
        ):  # prompt logprobs and embeddings need logits or hidden states at prompt positions: the tensor path
            return self.tensor_runner().execute(sched)
        if sched.swap_out or sched.copy_blocks or sched.swap_in:
            self.apply_block_ops(sched)
        logits = self.host_model.forward_host(sched, self.block_size, self.kv_caches)
        greedy = _greedy(sched, logits)
        if greedy is not None:  # the host path proper: no tensor, no torch
            return greedy
        runner = self.tensor_runner()
        import torch

        with torch.inference_mode():
            return runner.sample(sched, logits.dense())

    def close(self) -> None:
        """Release what outlives the runner's memory: nothing of its own."""
        if self._tensor_runner is not None:
            self._tensor_runner.close()


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
