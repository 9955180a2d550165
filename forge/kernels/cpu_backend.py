"""The CPU backend: TorchBackend's ops, with decode attention on forge's own C kernel.

Decode rows (one query token per request) attend through ``forge.kernels.cpu.native``'s paged
kernel, which reads each request's K/V in place through its block table (from the first position a
sliding window lets it see); TorchBackend instead
gathers every context into a padded copy before ``scaled_dot_product_attention``, which at
large batches moves several times the KV bytes. Rows of more than one token (prefill chunks,
speculative verification) keep TorchBackend's path. The kernel reads float32 or bfloat16 K/V
(``engine.kv_cache_dtype=bfloat16`` halves the bytes it reads) and int8 / fp8 rows with their
scales in place (``int8``, ``fp8``, ``fp8_e5m2``: a quarter of float32's bytes plus the scales);
float16 caches, or queries that are not float32, fall back to TorchBackend's decode path.

Constructing it compiles the kernel on first use (``cc``, about a second, cached) and raises a
``RuntimeError`` naming what is missing when that fails (use ``backend=torch`` there).
"""

from __future__ import annotations

import torch

from forge.kernels.base import AttentionMetadata, KVLayer
from forge.kernels.cpu import native
from forge.kernels.torch_backend import TorchBackend


class CpuBackend(TorchBackend):
    name = "cpu"

    def __init__(self, device: str = "cpu", num_threads: int | None = None) -> None:
        if device == "auto":
            device = "cpu"
        if torch.device(device).type != "cpu":
            raise ValueError(f"CpuBackend runs on the CPU, got device={device!r} (backend=torch or cuda for GPUs)")
        super().__init__(device, num_threads)
        try:
            native.library()
        except native.NativeKernelsUnavailable as exc:
            raise RuntimeError(f"backend=cpu cannot build its C kernels here: {exc}. Use backend=torch.") from exc

    def decode_attention(
        self,
        q: torch.Tensor,
        kv: KVLayer,
        meta: AttentionMetadata,
        idx: torch.Tensor | None,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        k_cache, v_cache = kv
        if q.dtype != torch.float32 or k_cache.dtype not in native.KV_DTYPES:
            return super().decode_attention(q, kv, meta, idx, scale, window)
        tables = meta.block_tables if idx is None else meta.block_tables.index_select(0, idx)
        seq_lens = meta.seq_lens if idx is None else meta.seq_lens.index_select(0, idx)
        return native.paged_decode_attention(q, k_cache, v_cache, tables, seq_lens, scale, window)
