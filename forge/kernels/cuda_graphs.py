"""CUDA graphs for decode steps: capture once per batch-size bucket, replay with padding.

Contract for the model runner
-----------------------------
``GraphRunner(model, kv_caches, backend, max_num_seqs, max_blocks_per_seq).run(batch)``
returns what ``model.forward(batch, kv_caches, backend)`` returns (float32 logits
``[len(batch.logits_indices), vocab]``, a fresh tensor) and decides by itself how:

* **replay** when graphs are enabled and the batch is a pure decode step: every request has
  ``query_len == 1`` (one token each, request i's token at row i, so
  ``query_start_loc == arange(num_seqs + 1)``), ``num_seqs <= max(buckets)``,
  ``len(logits_indices) <= num_seqs`` and every ``seq_len <= max_blocks_per_seq * block_size``
  (checked on the ``*_cpu`` lists, no device sync). The batch is copied into static buffers
  of the smallest bucket ``>= num_seqs`` and that bucket's graph is replayed;
* **eager** ``model.forward`` otherwise (prefill, chunked prefill, mixed steps, oversize
  batches) or when disabled.

Padding rows of a replayed bucket get ``slot_mapping = -1`` (the CUDA cache write skips them,
so they never touch the KV cache), ``seq_len = 1`` (they attend to one key of whatever block
their block-table row names: valid, finite, discarded), ``input_id = 0``, ``position = 0``.
``logits_indices`` is padded with 0; only the first ``len(logits_indices)`` logits rows are
returned.

What the model and backend must guarantee for capture: ``forward`` only enqueues work on
torch's current stream and never reads device values on the host. CudaBackend does (its
attention reads the ``*_cpu`` lists only for kernel choice and grid bounds, see
``forge.kernels.cuda_backend``); graphs capture with ``seq_lens_cpu`` set to the bound
``max_blocks_per_seq * block_size``, so the decode grid covers any context up to it.
TorchBackend does not qualify (its attention calls ``.tolist()``), hence graphs are only
enabled for backends with ``supports_cuda_graphs`` and ``cuda_graphs`` true.

The KV cache tensors are baked into the graphs: reallocating them requires a new runner.
"""

from __future__ import annotations

import torch

from forge.kernels.base import AttentionMetadata, ForwardModel, KernelBackend, KVLayer
from forge.kernels.batch import ForwardBatch


def default_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, and ``max_num_seqs`` itself."""
    sizes = {b for b in (1, 2, 4, 8) if b <= max_num_seqs}
    sizes.update(range(16, max_num_seqs + 1, 16))
    sizes.add(max_num_seqs)
    return sorted(sizes)


class GraphRunner:
    def __init__(
        self,
        model: ForwardModel,
        kv_caches: list[KVLayer],
        backend: KernelBackend,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        buckets: list[int] | None = None,
        enabled: bool | None = None,
        warmup_runs: int = 2,
    ) -> None:
        if max_num_seqs < 1 or max_blocks_per_seq < 1:
            raise ValueError("max_num_seqs and max_blocks_per_seq must be positive")
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.block_size = kv_caches[0][0].shape[1]
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_seq_len = max_blocks_per_seq * self.block_size
        self.buckets = sorted(set(buckets or default_buckets(max_num_seqs)))
        if self.buckets[0] < 1:
            raise ValueError("bucket sizes must be positive")
        self.warmup_runs = warmup_runs
        if enabled is None:
            enabled = bool(getattr(backend, "cuda_graphs", False))
        # torch.cuda, or the graph API of the backend's device (the CPU layer's in tests).
        self.cuda = getattr(backend, "graph_api", torch.cuda)
        self.enabled = (
            enabled
            and bool(getattr(backend, "supports_cuda_graphs", False))
            and self.cuda.is_available()
            and kv_caches[0][0].device == backend.device
        )
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if self.enabled:
            self._allocate_static_inputs(kv_caches[0][0].device)

    def _allocate_static_inputs(self, device: torch.device) -> None:
        n = self.buckets[-1]
        self._input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self._positions = torch.zeros(n, dtype=torch.int64, device=device)
        self._slot_mapping = torch.full((n,), -1, dtype=torch.int64, device=device)
        self._seq_lens = torch.ones(n, dtype=torch.int32, device=device)
        self._query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self._block_tables = torch.zeros(n, self.max_blocks_per_seq, dtype=torch.int32, device=device)
        self._logits_indices = torch.zeros(n, dtype=torch.int64, device=device)

    # -- public -----------------------------------------------------------------------------
    def run(self, batch: ForwardBatch) -> torch.Tensor:
        bucket = self.bucket_for(batch)
        if bucket is None:
            return self.model.forward(batch, self.kv_caches, self.backend)
        if not self._graphs:
            self.capture()
        graph, logits = self._graphs[bucket]
        self._load(batch, bucket)
        graph.replay()
        return logits[: batch.logits_indices.shape[0]].clone()

    def bucket_for(self, batch: ForwardBatch) -> int | None:
        """The bucket a batch replays in, or None for an eager step."""
        meta = batch.attn
        n = meta.num_seqs
        if not self.enabled or n == 0 or n > self.buckets[-1]:
            return None
        if batch.input_ids.shape[0] != n or any(q != 1 for q in meta.query_lens_cpu):
            return None
        if batch.logits_indices.shape[0] > n or meta.max_seq_len > self.max_seq_len:
            return None
        if meta.block_size != self.block_size:
            return None
        return next(b for b in self.buckets if b >= n)

    def capture(self) -> None:
        """Capture every bucket, largest first so smaller graphs reuse its memory pool."""
        if not self.enabled:
            return
        cuda = self.cuda
        pool = cuda.graph_pool_handle()
        for bucket in reversed(self.buckets):
            batch = self._static_batch(bucket)
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                for _ in range(self.warmup_runs):  # compiles kernels, settles the allocator
                    self.model.forward(batch, self.kv_caches, self.backend)
            cuda.current_stream().wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                logits = self.model.forward(batch, self.kv_caches, self.backend)
            self._graphs[bucket] = (graph, logits)
        cuda.synchronize()

    # -- internals --------------------------------------------------------------------------
    def _static_batch(self, bucket: int) -> ForwardBatch:
        meta = AttentionMetadata(
            query_start_loc=self._query_start_loc[: bucket + 1],
            seq_lens=self._seq_lens[:bucket],
            block_tables=self._block_tables[:bucket],
            slot_mapping=self._slot_mapping[:bucket],
            block_size=self.block_size,
            query_lens_cpu=[1] * bucket,
            seq_lens_cpu=[self.max_seq_len] * bucket,  # grid bound; true lengths are on the device
        )
        return ForwardBatch(
            input_ids=self._input_ids[:bucket],
            positions=self._positions[:bucket],
            attn=meta,
            logits_indices=self._logits_indices[:bucket],
        )

    def _load(self, batch: ForwardBatch, bucket: int) -> None:
        meta = batch.attn
        n = meta.num_seqs
        k = batch.logits_indices.shape[0]
        cols = min(-(-meta.max_seq_len // self.block_size), meta.block_tables.shape[1])
        self._input_ids[:n].copy_(batch.input_ids)
        self._positions[:n].copy_(batch.positions)
        self._slot_mapping[:n].copy_(meta.slot_mapping)
        self._seq_lens[:n].copy_(meta.seq_lens)
        self._block_tables[:n, :cols].copy_(meta.block_tables[:, :cols])
        self._logits_indices[:k].copy_(batch.logits_indices)
        if bucket > n:
            self._slot_mapping[n:bucket].fill_(-1)
            self._seq_lens[n:bucket].fill_(1)
        if bucket > k:
            self._logits_indices[k:bucket].zero_()
