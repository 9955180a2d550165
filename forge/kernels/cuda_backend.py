"""The CUDA backend: every op of ``KernelBackend`` on forge's own kernels (CuPy + NVRTC).

Semantics are TorchBackend's (the oracle); the kernels live in ``forge/kernels/cuda/*.cu``.
Importing this module needs neither CUDA nor CuPy; constructing ``CudaBackend`` checks both
and raises a ``RuntimeError`` naming what is missing (use ``backend=torch`` there).

CUDA graphs: every op only launches kernels on torch's current stream and reads device
tensors, except ``attention``, which reads the metadata's ``*_cpu`` lists for two things
only: which kernels to launch (any request with query_len 1, any with more) and upper
bounds on seq_len / query_len that size the grids. Exact lengths are read on the device,
so a metadata whose lists hold bounds rather than the true values is valid input; that is
what ``forge.kernels.cuda_graphs.GraphRunner`` captures with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from forge.kernels.base import AttentionMetadata, ForwardModel, KernelBackend, KVLayer, KVSpec, PackedLinear
from forge.kernels.cuda.quant import QuantizedWeight
from forge.kernels.kv_quant import is_quantized

if TYPE_CHECKING:
    from forge.kernels.batch import ForwardBatch


class CudaBackend(KernelBackend):
    """``device``: a CUDA device (``cuda`` or ``cuda:N``). ``cuda_graphs``: whether a
    ``GraphRunner`` over this backend replays decode steps from CUDA graphs.
    ``quantized_linear``: ``gemv`` runs quantized weights with the fused dequant-GEMV for up
    to ``gemv_max_rows`` rows and dequantizes into a scratch weight for larger batches;
    ``dequant`` always dequantizes (see also ``dequantize_weight`` for doing it at load)."""

    name = "cuda"
    supports_cuda_graphs = True

    def __init__(
        self,
        device: str = "cuda",
        cuda_graphs: bool = True,
        quantized_linear: str = "gemv",
        gemv_max_rows: int = 8,
        runtime: Any = None,
    ) -> None:
        """``runtime``: None runs on a CUDA GPU through CuPy; ``"cpu"`` (or a
        ``forge.kernels.cuda.cpu_emu.CpuCuda``) runs the same kernels, launch code and graphs on
        the CPU under CUDA's execution model, with ``device`` ``cpu``: a correctness tool for
        machines without a GPU (``backend=cuda backend.device=cpu backend.runtime=cpu``), slow."""
        from forge.kernels.cuda.compiler import (
            KernelLibrary,
            device_shared_memory,
            import_cupy,
            missing_requirements,
            torch_stream_handle,
        )
        from forge.kernels.cuda.ops import GEMV_MAX_M, CudaOps

        if runtime == "cpu":
            from forge.kernels.cuda.cpu_emu import CpuCuda

            runtime = CpuCuda()
        elif runtime is not None and not hasattr(runtime, "RawModule"):
            raise ValueError(f"runtime must be None, 'cpu' or a CpuCuda, got {runtime!r}")
        if runtime is None:
            missing = missing_requirements()
            if missing:
                raise RuntimeError(
                    "backend=cuda cannot run on this machine: it needs "
                    + "; and ".join(missing)
                    + ". Use backend=torch instead."
                )
        device_type = "cuda" if runtime is None else runtime.device_type
        if device == "auto":
            device = device_type
        super().__init__(device)
        if self.device.type != device_type:
            raise ValueError(f"CudaBackend needs a CUDA device, got {device!r} (use backend=torch for CPU)")
        if quantized_linear not in ("gemv", "dequant"):
            raise ValueError(f"quantized_linear must be 'gemv' or 'dequant', got {quantized_linear!r}")
        if not 0 <= gemv_max_rows <= GEMV_MAX_M:
            raise ValueError(f"gemv_max_rows must be in 0..{GEMV_MAX_M}")
        if runtime is None:
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", index)
            lib = KernelLibrary(import_cupy(), index, device_shared_memory(index), torch_stream_handle(index))
            # What GraphRunner captures and replays with: torch.cuda's graphs, or the CPU layer's.
            self.graph_api: Any = torch.cuda
        else:
            lib = KernelLibrary(runtime, 0, runtime.max_shared_memory, runtime.stream_handle)
            self.graph_api = runtime.graphs
        self.ops = CudaOps(lib)
        self.cuda_graphs = cuda_graphs
        self.quantized_linear = quantized_linear
        self.gemv_max_rows = gemv_max_rows
        self._meta_source: AttentionMetadata | None = None
        self._meta_device: Any = None

    def model_forward(
        self, model: ForwardModel, kv_caches: list[KVLayer], max_num_seqs: int, max_blocks_per_seq: int
    ) -> Callable[[ForwardBatch], torch.Tensor]:
        """Decode steps replay CUDA graphs (``forge.kernels.cuda_graphs``; eager when ``cuda_graphs``
        is off or the batch does not qualify)."""
        from forge.kernels.cuda_graphs import GraphRunner

        return GraphRunner(model, kv_caches, self, max_num_seqs, max_blocks_per_seq).run

    # -- KV cache ---------------------------------------------------------------------------
    def allocate_kv_cache(self, spec: KVSpec, num_blocks: int, block_size: int) -> list[KVLayer]:
        from forge.kernels.cuda.sources import dtype_code

        if not is_quantized(spec.dtype):
            dtype_code(spec.torch_dtype())  # fail early on float64
        return super().allocate_kv_cache(spec, num_blocks, block_size)

    def write_kv(self, kv: KVLayer, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        k_cache, v_cache = kv
        if slot_mapping.dtype != torch.int64:
            slot_mapping = slot_mapping.to(torch.int64)
        if not is_quantized(k_cache.dtype):  # int8/fp8: the kernel quantizes from the activations' dtype
            key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
        key, value = _kv_layout(key), _kv_layout(value)
        self.ops.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping)

    # -- attention --------------------------------------------------------------------------
    def attention(
        self, query: torch.Tensor, kv: KVLayer, meta: AttentionMetadata, scale: float, window: int | None = None
    ) -> torch.Tensor:
        k_cache, v_cache = kv
        q = _kv_layout(query if is_quantized(k_cache.dtype) else query.to(k_cache.dtype))
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self.ops.attention(out, q, k_cache, v_cache, self._device_meta(meta), scale, window)
        return out.to(query.dtype)

    def _device_meta(self, meta: AttentionMetadata) -> Any:
        """int32 views of the metadata for the kernels, built once per metadata object
        (the model calls attention once per layer with the same one)."""
        if meta is self._meta_source:
            return self._meta_device
        from forge.kernels.cuda.ops import DeviceAttentionMetadata

        decode_lens = [s for q, s in zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True) if q == 1]
        block_tables = meta.block_tables.to(torch.int32)
        if block_tables.dim() == 2 and block_tables.stride(-1) != 1:
            block_tables = block_tables.contiguous()
        device_meta = DeviceAttentionMetadata(
            query_start_loc=meta.query_start_loc.to(torch.int32),
            seq_lens=meta.seq_lens.to(torch.int32),
            block_tables=block_tables,
            slot_mapping=meta.slot_mapping.to(torch.int64),
            num_seqs=meta.num_seqs,
            has_decode=bool(decode_lens),
            has_prefill=any(q > 1 for q in meta.query_lens_cpu),
            decode_max_seq_len=max(decode_lens, default=0),
            max_query_len=meta.max_query_len,
        )
        self._meta_source, self._meta_device = meta, device_meta
        return device_meta

    # -- element-wise and row ops ------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x2 = _rows_view(x)
        out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
        self.ops.rms_norm(out, x2, weight.to(x.dtype).contiguous(), eps)
        return out.view(x.shape)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = torch.promote_types(x.dtype, residual.dtype)
        x2, r2 = _rows_view(x.to(dtype)), _rows_view(residual.to(dtype))
        out = torch.empty(x2.shape, dtype=dtype, device=x.device)
        residual_out = torch.empty_like(out)
        self.ops.add_rms_norm(out, residual_out, x2, r2, weight.to(dtype).contiguous(), eps)
        return out.view(x.shape), residual_out.view(x.shape)

    def rope(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        query, key = _kv_layout(query), _kv_layout(key.to(query.dtype))
        if positions.dtype != torch.int64:
            positions = positions.to(torch.int64)
        if cos_sin.dtype != torch.float32 or not cos_sin.is_contiguous():
            cos_sin = cos_sin.to(torch.float32).contiguous()
        q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
        self.ops.rope_neox(q_out, k_out, query, key, positions, cos_sin)
        return q_out, k_out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        g2 = _rows_view(gate_up)
        out = torch.empty((g2.shape[0], g2.shape[1] // 2), dtype=gate_up.dtype, device=gate_up.device)
        self.ops.silu_mul(out, g2)
        return out.view(*gate_up.shape[:-1], gate_up.shape[-1] // 2)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        l2 = _rows_view(logits if logits.dim() > 0 else logits.view(1))
        out = torch.empty(l2.shape[0], dtype=torch.int64, device=logits.device)
        self.ops.argmax(out, l2)
        return out.view(logits.shape[:-1])

    # -- linear -----------------------------------------------------------------------------
    def linear(self, x: torch.Tensor, weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
        if not isinstance(weight, QuantizedWeight):
            return x @ weight  # cuBLAS
        x2 = _rows_view(x)
        rows = x2.shape[0]
        if self.quantized_linear == "gemv" and rows <= self.gemv_max_rows:
            y = torch.empty((rows, weight.out_features), dtype=x.dtype, device=x.device)
            self.ops.gemv(y, x2, weight)
        else:
            y = x2 @ self.dequantize_weight(weight, x.dtype)
        return y.view(*x.shape[:-1], weight.out_features)

    def pack_quantized(self, weight: QuantizedWeight) -> QuantizedLinear:
        """A ``PackedLinear`` for a ``Llama`` layer field: the weight stays quantized on the GPU."""
        return QuantizedLinear(self, weight.to(self.device))

    def dequantize_weight(self, weight: QuantizedWeight, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """Dense ``[in_features, out_features]`` weight (a transposed view of a contiguous
        ``[out, in]`` buffer, which cuBLAS takes as is). Also the load-time fallback."""
        rows = torch.empty((weight.out_features, weight.in_features), dtype=dtype, device=weight.device)
        self.ops.dequantize(rows, weight)
        return rows.t()


class QuantizedLinear(PackedLinear):
    """A GGUF-quantized linear weight bound to a CudaBackend: ``packed(x) == x @ weight``
    through the fused dequant-GEMV (small batches) or dequantize + cuBLAS (large ones)."""

    def __init__(self, backend: CudaBackend, weight: QuantizedWeight) -> None:
        self.backend = backend
        self.weight = weight
        self.in_features, self.out_features = weight.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.linear(x, self.weight)


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, last]`` with a contiguous last dim (a view whenever possible)."""
    if x.dim() == 2 and (x.stride(1) == 1 or x.shape[1] <= 1):
        return x
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return x2 if x2.stride(1) == 1 or x2.shape[1] <= 1 else x2.contiguous()


def _kv_layout(t: torch.Tensor) -> torch.Tensor:
    """``[tokens, heads, head_dim]`` whose inner two dims are contiguous (rows may be strided)."""
    if (t.stride(2) == 1 or t.shape[2] <= 1) and (t.stride(1) == t.shape[2] or t.shape[1] <= 1):
        return t
    return t.contiguous()
