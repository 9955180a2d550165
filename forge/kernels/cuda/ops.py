"""One typed function per kernel: checks layouts, sizes the grid, launches on torch's stream.

Every op writes into output tensors the caller allocates (so tests can poison them), reads
torch tensors through raw device pointers, and never copies or synchronises. Inputs whose
layout a kernel cannot take raise ``ValueError`` instead of being copied silently; the
backend makes the few conversions the reference semantics allow.

``CudaOps`` holds the cache, norm, rope, activation, sampling and quantized-weight ops; its parts:
``ops_common`` (launch constants, ``DeviceAttentionMetadata``, the layout checks, ``KernelOps``) and
``ops_attention`` (``attention``, a base of ``CudaOps``). Their public names are imported from here.
"""

from __future__ import annotations

import torch

from forge.kernels.cuda.compiler import f32, i32, i64
from forge.kernels.cuda.ops_attention import AttentionOps
from forge.kernels.cuda.ops_common import (
    DECODE_THREADS,
    DECODE_WARPS,
    GEMV_MAX_M,
    GEMV_WARPS,
    MAX_GQA,
    MAX_HEAD_DIM,
    PARTITION_SIZE,
    PREFILL_BLOCK_N,
    PREFILL_ROWS,
    PREFILL_THREADS,
    DeviceAttentionMetadata,
    ceil_div,
    head_stride,
    norm_threads,
    require,
    round_up,
    row_stride,
    same_dtype,
)
from forge.kernels.cuda.quant import GGMLType, QuantizedWeight
from forge.kernels.kv_quant import SCALE_BYTES, head_dim_of, is_quantized, quant_format

__all__ = [
    "DECODE_THREADS",
    "DECODE_WARPS",
    "GEMV_MAX_M",
    "GEMV_WARPS",
    "MAX_GQA",
    "MAX_HEAD_DIM",
    "PARTITION_SIZE",
    "PREFILL_BLOCK_N",
    "PREFILL_ROWS",
    "PREFILL_THREADS",
    "CudaOps",
    "DeviceAttentionMetadata",
]


class CudaOps(AttentionOps):
    """Every kernel as a typed method (``attention`` from ``AttentionOps``)."""

    # -- cache -----------------------------------------------------------------------------
    def reshape_and_cache(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        if is_quantized(k_cache.dtype):
            self._reshape_and_cache_quant(key, value, k_cache, v_cache, slot_mapping)
            return
        dtype = same_dtype(key, value, k_cache, v_cache)
        require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        require(slot_mapping.dtype == torch.int64, "slot_mapping must be int64")
        tokens = key.shape[0]
        row = k_cache.shape[2] * k_cache.shape[3]
        k_stride, v_stride = head_stride(key, "key"), head_stride(value, "value")
        require(key.shape[1] * key.shape[2] == row and value.shape == key.shape, "key/value do not match the cache")
        if tokens == 0:
            return
        fn = self.lib.function("cache.cu", "reshape_and_cache", dtype)
        args = (
            self.ptr(key),
            self.ptr(value),
            self.ptr(k_cache),
            self.ptr(v_cache),
            self.ptr(slot_mapping),
            i64(k_stride),
            i64(v_stride),
            i32(row),
        )
        self.lib.launch(fn, (tokens,), (min(1024, round_up(row, 32)),), args)

    def _reshape_and_cache_quant(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """``key``/``value`` (float32/16, bfloat16) quantized into int8/fp8 caches (``kv_quant``)."""
        dtype = same_dtype(key, value)
        same_dtype(k_cache, v_cache)
        require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        require(slot_mapping.dtype == torch.int64, "slot_mapping must be int64")
        tokens, kv_heads, head_dim = key.shape
        key_stride, value_stride = head_stride(key, "key"), head_stride(value, "value")
        require(
            k_cache.shape[2:] == (kv_heads, head_dim_of(k_cache) + SCALE_BYTES)
            and head_dim_of(k_cache) == head_dim
            and value.shape == key.shape
            and v_cache.shape == k_cache.shape,
            "key/value do not match the cache",
        )
        if tokens == 0:
            return
        fn = self.lib.function("cache.cu", "reshape_and_cache_quant", dtype, kv=quant_format(k_cache.dtype).code)
        args = (
            self.ptr(key),
            self.ptr(value),
            self.ptr(k_cache),
            self.ptr(v_cache),
            self.ptr(slot_mapping),
            i64(key_stride),
            i64(value_stride),
            i32(kv_heads),
            i32(head_dim),
        )
        self.lib.launch(fn, (tokens, kv_heads), (32,), args)

    # -- norms -----------------------------------------------------------------------------
    def rms_norm(self, out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        dtype = same_dtype(out, x, weight)
        rows, hidden = x.shape
        require(out.is_contiguous() and out.shape == x.shape and weight.shape == (hidden,), "bad rms_norm shapes")
        require(weight.is_contiguous(), "weight must be contiguous")
        if rows == 0:
            return
        fn = self.lib.function("norm.cu", "rms_norm", dtype)
        args = (self.ptr(out), self.ptr(x), self.ptr(weight), i64(row_stride(x, "x")), i32(hidden), f32(eps))
        self.lib.launch(fn, (rows,), (norm_threads(hidden),), args)

    def add_rms_norm(
        self,
        out: torch.Tensor,
        residual_out: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
    ) -> None:
        dtype = same_dtype(out, residual_out, x, residual, weight)
        rows, hidden = x.shape
        require(residual.shape == x.shape and weight.shape == (hidden,), "bad add_rms_norm shapes")
        require(
            out.is_contiguous() and residual_out.is_contiguous() and weight.is_contiguous(),
            "outputs and weight must be contiguous",
        )
        require(out.shape == x.shape and residual_out.shape == x.shape, "bad output shapes")
        if rows == 0:
            return
        fn = self.lib.function("norm.cu", "add_rms_norm", dtype)
        args = (
            self.ptr(out),
            self.ptr(residual_out),
            self.ptr(x),
            self.ptr(residual),
            self.ptr(weight),
            i64(row_stride(x, "x")),
            i64(row_stride(residual, "residual")),
            i32(hidden),
            f32(eps),
        )
        self.lib.launch(fn, (rows,), (norm_threads(hidden),), args)

    # -- rope ------------------------------------------------------------------------------
    def rope_neox(
        self,
        q_out: torch.Tensor,
        k_out: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
    ) -> None:
        dtype = same_dtype(q_out, k_out, query, key)
        tokens, heads, head_dim = query.shape
        kv_heads = key.shape[1]
        require(key.shape == (tokens, kv_heads, head_dim) and head_dim % 2 == 0, "bad rope shapes")
        require(q_out.is_contiguous() and k_out.is_contiguous(), "rope outputs must be contiguous")
        require(q_out.shape == query.shape and k_out.shape == key.shape, "bad rope output shapes")
        require(positions.dtype == torch.int64 and positions.shape == (tokens,), "positions must be int64 [tokens]")
        require(
            cos_sin.dtype == torch.float32 and cos_sin.is_contiguous() and cos_sin.shape[1] == head_dim,
            "cos_sin must be contiguous float32 [max_pos, head_dim]",
        )
        if tokens == 0:
            return
        fn = self.lib.function("rope.cu", "rope_neox", dtype)
        pairs = (heads + kv_heads) * head_dim // 2
        args = (
            self.ptr(q_out),
            self.ptr(k_out),
            self.ptr(query),
            self.ptr(key),
            self.ptr(positions),
            self.ptr(cos_sin),
            i64(head_stride(query, "query")),
            i64(head_stride(key, "key")),
            i32(heads),
            i32(kv_heads),
            i32(head_dim),
            i64(cos_sin.shape[0]),
        )
        self.lib.launch(fn, (tokens,), (min(512, round_up(pairs, 32)),), args)

    # -- activation / sampling ---------------------------------------------------------------
    def silu_mul(self, out: torch.Tensor, gate_up: torch.Tensor) -> None:
        dtype = same_dtype(out, gate_up)
        tokens, width = gate_up.shape
        inter = width // 2
        require(width % 2 == 0 and out.shape == (tokens, inter) and out.is_contiguous(), "bad silu_mul shapes")
        total = tokens * inter
        if total == 0:
            return
        fn = self.lib.function("activation.cu", "silu_mul", dtype)
        threads = 256
        blocks = min(ceil_div(total, threads), 65535 * 8)
        args = (self.ptr(out), self.ptr(gate_up), i64(row_stride(gate_up, "gate_up")), i32(inter), i64(total))
        self.lib.launch(fn, (blocks,), (threads,), args)

    def argmax(self, out: torch.Tensor, logits: torch.Tensor) -> None:
        rows, vocab = logits.shape
        require(out.dtype == torch.int64 and out.shape == (rows,) and out.is_contiguous(), "out must be int64 [rows]")
        if rows == 0:
            return
        require(vocab > 0, "argmax of an empty row")
        fn = self.lib.function("sampling.cu", "argmax_rows", logits.dtype)
        args = (self.ptr(out), self.ptr(logits), i64(row_stride(logits, "logits")), i32(vocab))
        self.lib.launch(fn, (rows,), (min(1024, round_up(vocab, 32)),), args)

    # -- quantized weights -------------------------------------------------------------------
    def dequantize(self, out: torch.Tensor, weight: QuantizedWeight) -> None:
        """``out [out_features, in_features]`` (contiguous) from the raw blocks."""
        require(out.is_contiguous() and out.shape == (weight.out_features, weight.in_features), "bad dequant output")
        total = out.numel()
        if total == 0:
            return
        name = "dequant_q8_0" if weight.qtype == GGMLType.Q8_0 else "dequant_q4_k"
        fn = self.lib.function("quant.cu", name, out.dtype)
        threads = 256
        grid = (min(ceil_div(total, threads), 65535 * 8),)
        self.lib.launch(fn, grid, (threads,), (self.ptr(out), self.ptr(weight.data), i64(total)))

    def gemv(self, y: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight) -> None:
        """``y [M, N] = x [M, K] @ weight`` for ``M <= GEMV_MAX_M``."""
        dtype = same_dtype(y, x)
        m, k = x.shape
        require(
            k == weight.in_features and y.shape == (m, weight.out_features) and y.is_contiguous(), "bad gemv shapes"
        )
        require(m <= GEMV_MAX_M, f"gemv takes at most {GEMV_MAX_M} rows")
        if m == 0:
            return
        name = "gemv_q8_0" if weight.qtype == GGMLType.Q8_0 else "gemv_q4_k"
        fn = self.lib.function("quant.cu", name, dtype)
        n = weight.out_features
        args = (self.ptr(y), self.ptr(x), self.ptr(weight.data), i32(m), i32(n), i32(k), i64(row_stride(x, "x")))
        self.lib.launch(fn, (ceil_div(n, GEMV_WARPS),), (GEMV_WARPS * 32,), args)
