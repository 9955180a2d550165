"""One typed function per kernel: checks layouts, sizes the grid, launches on torch's stream.

Every op writes into output tensors the caller allocates (so tests can poison them), reads
torch tensors through raw device pointers, and never copies or synchronises. Inputs whose
layout a kernel cannot take raise ``ValueError`` instead of being copied silently; the
backend makes the few conversions the reference semantics allow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forge.kernels.cuda.compiler import KernelLibrary, f32, i32, i64
from forge.kernels.cuda.quant import GGMLType, QuantizedWeight
from forge.kernels.kv_quant import SCALE_BYTES, head_dim_of, is_quantized, quant_format

# Must match the #defines in the .cu files.
PARTITION_SIZE = 512  # paged_attention.cu
DECODE_THREADS = 128
DECODE_WARPS = DECODE_THREADS // 32
PREFILL_THREADS = 128
PREFILL_ROWS = 32  # prefill_attention.cu: NUM_WARPS * ROWS_PER_WARP
PREFILL_BLOCK_N = 32
GEMV_MAX_M = 8  # quant.cu
GEMV_WARPS = 4
MAX_HEAD_DIM = 256
MAX_GQA = 32


@dataclass(frozen=True)
class DeviceAttentionMetadata:
    """The attention metadata as the kernels read it, plus host-side launch bounds.

    ``decode_max_seq_len`` and ``max_query_len`` only size grids (upper bounds are fine:
    surplus blocks exit at once); exact lengths come from the device tensors.
    """

    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], last dim contiguous
    slot_mapping: torch.Tensor  # int64 [num_tokens]
    num_seqs: int
    has_decode: bool  # some request has query_len == 1
    has_prefill: bool  # some request has query_len > 1
    decode_max_seq_len: int  # bound on seq_len over the query_len == 1 requests
    max_query_len: int  # bound on query_len over all requests


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _rows(t: torch.Tensor, name: str) -> int:
    """Row stride of a 2-D tensor whose last dim is contiguous."""
    _require(t.dim() == 2 and (t.stride(1) == 1 or t.shape[1] <= 1), f"{name} must be 2-D with a contiguous last dim")
    return t.stride(0)


def _heads(t: torch.Tensor, name: str) -> int:
    """Token stride of ``[tokens, heads, head_dim]`` whose inner two dims are contiguous."""
    _require(t.dim() == 3, f"{name} must be [tokens, heads, head_dim]")
    _require(
        (t.stride(2) == 1 or t.shape[2] <= 1) and (t.stride(1) == t.shape[2] or t.shape[1] <= 1),
        f"{name} must have contiguous [heads, head_dim] rows",
    )
    return t.stride(0)


def _same_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    _require(all(t.dtype == dtype for t in tensors), f"dtype mismatch: {[t.dtype for t in tensors]}")
    return dtype


class CudaOps:
    def __init__(self, lib: KernelLibrary) -> None:
        self.lib = lib

    def ptr(self, t: torch.Tensor) -> Any:
        """``t`` as a pointer argument (``KernelLibrary.pointer``)."""
        return self.lib.pointer(t)

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
        dtype = _same_dtype(key, value, k_cache, v_cache)
        _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        _require(slot_mapping.dtype == torch.int64, "slot_mapping must be int64")
        tokens = key.shape[0]
        row = k_cache.shape[2] * k_cache.shape[3]
        k_stride, v_stride = _heads(key, "key"), _heads(value, "value")
        _require(key.shape[1] * key.shape[2] == row and value.shape == key.shape, "key/value do not match the cache")
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
        self.lib.launch(fn, (tokens,), (min(1024, _round_up(row, 32)),), args)

    def _reshape_and_cache_quant(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """``key``/``value`` (float32/16, bfloat16) quantized into int8/fp8 caches (``kv_quant``)."""
        dtype = _same_dtype(key, value)
        _same_dtype(k_cache, v_cache)
        _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        _require(slot_mapping.dtype == torch.int64, "slot_mapping must be int64")
        tokens, kv_heads, head_dim = key.shape
        key_stride, value_stride = _heads(key, "key"), _heads(value, "value")
        _require(
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
        dtype = _same_dtype(out, x, weight)
        rows, hidden = x.shape
        _require(out.is_contiguous() and out.shape == x.shape and weight.shape == (hidden,), "bad rms_norm shapes")
        _require(weight.is_contiguous(), "weight must be contiguous")
        if rows == 0:
            return
        fn = self.lib.function("norm.cu", "rms_norm", dtype)
        args = (self.ptr(out), self.ptr(x), self.ptr(weight), i64(_rows(x, "x")), i32(hidden), f32(eps))
        self.lib.launch(fn, (rows,), (_norm_threads(hidden),), args)

    def add_rms_norm(
        self,
        out: torch.Tensor,
        residual_out: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
    ) -> None:
        dtype = _same_dtype(out, residual_out, x, residual, weight)
        rows, hidden = x.shape
        _require(residual.shape == x.shape and weight.shape == (hidden,), "bad add_rms_norm shapes")
        _require(
            out.is_contiguous() and residual_out.is_contiguous() and weight.is_contiguous(),
            "outputs and weight must be contiguous",
        )
        _require(out.shape == x.shape and residual_out.shape == x.shape, "bad output shapes")
        if rows == 0:
            return
        fn = self.lib.function("norm.cu", "add_rms_norm", dtype)
        args = (
            self.ptr(out),
            self.ptr(residual_out),
            self.ptr(x),
            self.ptr(residual),
            self.ptr(weight),
            i64(_rows(x, "x")),
            i64(_rows(residual, "residual")),
            i32(hidden),
            f32(eps),
        )
        self.lib.launch(fn, (rows,), (_norm_threads(hidden),), args)

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
        dtype = _same_dtype(q_out, k_out, query, key)
        tokens, heads, head_dim = query.shape
        kv_heads = key.shape[1]
        _require(key.shape == (tokens, kv_heads, head_dim) and head_dim % 2 == 0, "bad rope shapes")
        _require(q_out.is_contiguous() and k_out.is_contiguous(), "rope outputs must be contiguous")
        _require(q_out.shape == query.shape and k_out.shape == key.shape, "bad rope output shapes")
        _require(positions.dtype == torch.int64 and positions.shape == (tokens,), "positions must be int64 [tokens]")
        _require(
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
            i64(_heads(query, "query")),
            i64(_heads(key, "key")),
            i32(heads),
            i32(kv_heads),
            i32(head_dim),
            i64(cos_sin.shape[0]),
        )
        self.lib.launch(fn, (tokens,), (min(512, _round_up(pairs, 32)),), args)

    # -- activation / sampling ---------------------------------------------------------------
    def silu_mul(self, out: torch.Tensor, gate_up: torch.Tensor) -> None:
        dtype = _same_dtype(out, gate_up)
        tokens, width = gate_up.shape
        inter = width // 2
        _require(width % 2 == 0 and out.shape == (tokens, inter) and out.is_contiguous(), "bad silu_mul shapes")
        total = tokens * inter
        if total == 0:
            return
        fn = self.lib.function("activation.cu", "silu_mul", dtype)
        threads = 256
        blocks = min(_ceil_div(total, threads), 65535 * 8)
        args = (self.ptr(out), self.ptr(gate_up), i64(_rows(gate_up, "gate_up")), i32(inter), i64(total))
        self.lib.launch(fn, (blocks,), (threads,), args)

    def argmax(self, out: torch.Tensor, logits: torch.Tensor) -> None:
        rows, vocab = logits.shape
        _require(out.dtype == torch.int64 and out.shape == (rows,) and out.is_contiguous(), "out must be int64 [rows]")
        if rows == 0:
            return
        _require(vocab > 0, "argmax of an empty row")
        fn = self.lib.function("sampling.cu", "argmax_rows", logits.dtype)
        args = (self.ptr(out), self.ptr(logits), i64(_rows(logits, "logits")), i32(vocab))
        self.lib.launch(fn, (rows,), (min(1024, _round_up(vocab, 32)),), args)

    # -- attention -------------------------------------------------------------------------
    def attention(
        self,
        out: torch.Tensor,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: DeviceAttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> None:
        """Decode requests (query_len 1) through the partitioned paged kernel (+ reduce),
        the others through the prefill kernel; together they write every row of ``out``.
        ``window``: sliding-window attention over the last ``window`` positions (None: all)."""
        quantized = is_quantized(k_cache.dtype)
        if quantized:  # int8/fp8 rows with their scales (kv_quant); the kernels compute in query's dtype
            dtype = _same_dtype(out, query)
            _same_dtype(k_cache, v_cache)
        else:
            dtype = _same_dtype(out, query, k_cache, v_cache)
        kv = {"kv": quant_format(k_cache.dtype).code} if quantized else {}
        tokens, heads, head_dim = query.shape
        _, block_size, kv_heads, _ = k_cache.shape
        _require(head_dim_of(k_cache) == head_dim and heads % kv_heads == 0, "query does not match the KV cache")
        _require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        _require(out.is_contiguous() and out.shape == query.shape, "out must be contiguous like query")
        _require(
            head_dim <= MAX_HEAD_DIM and heads // kv_heads <= MAX_GQA,
            f"head_dim <= {MAX_HEAD_DIM} and <= {MAX_GQA} query heads per KV head are supported",
        )
        _require(
            meta.block_tables.dtype == torch.int32 and meta.block_tables.stride(-1) == 1,
            "block_tables must be int32 with a contiguous last dim",
        )
        _require(
            meta.seq_lens.dtype == torch.int32 and meta.query_start_loc.dtype == torch.int32,
            "seq_lens and query_start_loc must be int32",
        )
        _require(window is None or window > 0, f"window must be positive, got {window}")
        gqa = heads // kv_heads
        q_stride = _heads(query, "query")
        bt_stride = meta.block_tables.stride(0)
        if tokens == 0 or meta.num_seqs == 0:
            return
        common = (
            self.ptr(k_cache),
            self.ptr(v_cache),
            self.ptr(meta.block_tables),
            self.ptr(meta.seq_lens),
            self.ptr(meta.query_start_loc),
            i64(q_stride),
            i32(kv_heads),
            i32(block_size),
            i32(bt_stride),
        )
        if meta.has_decode:
            vec = 16 // query.element_size()
            _require(head_dim % vec == 0, f"decode attention needs head_dim divisible by {vec} for {dtype}")
            _require(k_cache.data_ptr() % 16 == 0 and v_cache.data_ptr() % 16 == 0, "KV caches must be 16-byte aligned")
            context = meta.decode_max_seq_len if window is None else min(meta.decode_max_seq_len, window)
            parts = max(1, _ceil_div(context, PARTITION_SIZE))
            rows = meta.num_seqs * heads * parts
            exp_sums = torch.empty(rows, dtype=torch.float32, device=out.device)
            max_logits = torch.empty(rows, dtype=torch.float32, device=out.device)
            tmp_out = torch.empty(rows * head_dim, dtype=torch.float32, device=out.device)
            fn = self.lib.function(
                "paged_attention.cu", "paged_attention_decode", dtype, head_dim=head_dim, gqa=gqa, **kv
            )
            smem = 4 * gqa * (head_dim + max(PARTITION_SIZE, DECODE_WARPS * head_dim))
            args: tuple[Any, ...] = (
                self.ptr(out),
                self.ptr(exp_sums),
                self.ptr(max_logits),
                self.ptr(tmp_out),
                self.ptr(query),
                *common,
                i32(parts),
                f32(scale),
                i32(window or 0),
            )
            self.lib.launch(fn, (kv_heads, meta.num_seqs, parts), (DECODE_THREADS,), args, shared_mem=smem)
            # Launched even when parts == 1: it is what turns a too-small host bound into NaN
            # rows instead of rows nobody wrote.
            fn = self.lib.function(
                "paged_attention.cu", "paged_attention_reduce", dtype, head_dim=head_dim, gqa=gqa, **kv
            )
            args = (
                self.ptr(out),
                self.ptr(exp_sums),
                self.ptr(max_logits),
                self.ptr(tmp_out),
                self.ptr(meta.seq_lens),
                self.ptr(meta.query_start_loc),
                i32(heads),
                i32(parts),
                i32(window or 0),
            )
            self.lib.launch(fn, (heads, meta.num_seqs), (DECODE_THREADS,), args, shared_mem=4 * parts)
        if meta.has_prefill:
            tokens_per_block = PREFILL_ROWS // gqa
            grid = (_ceil_div(meta.max_query_len, tokens_per_block), meta.num_seqs, kv_heads)
            fn = self.lib.function("prefill_attention.cu", "prefill_attention", dtype, head_dim=head_dim, gqa=gqa, **kv)
            smem = 4 * (
                PREFILL_ROWS * head_dim
                + PREFILL_BLOCK_N * (2 * head_dim + 1)
                + (PREFILL_THREADS // 32) * PREFILL_BLOCK_N
            )
            prefill_args = (self.ptr(out), self.ptr(query), *common, f32(scale), i32(window or 0))
            self.lib.launch(fn, grid, (PREFILL_THREADS,), prefill_args, shared_mem=smem)

    # -- quantized weights -------------------------------------------------------------------
    def dequantize(self, out: torch.Tensor, weight: QuantizedWeight) -> None:
        """``out [out_features, in_features]`` (contiguous) from the raw blocks."""
        _require(out.is_contiguous() and out.shape == (weight.out_features, weight.in_features), "bad dequant output")
        total = out.numel()
        if total == 0:
            return
        name = "dequant_q8_0" if weight.qtype == GGMLType.Q8_0 else "dequant_q4_k"
        fn = self.lib.function("quant.cu", name, out.dtype)
        threads = 256
        grid = (min(_ceil_div(total, threads), 65535 * 8),)
        self.lib.launch(fn, grid, (threads,), (self.ptr(out), self.ptr(weight.data), i64(total)))

    def gemv(self, y: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight) -> None:
        """``y [M, N] = x [M, K] @ weight`` for ``M <= GEMV_MAX_M``."""
        dtype = _same_dtype(y, x)
        m, k = x.shape
        _require(
            k == weight.in_features and y.shape == (m, weight.out_features) and y.is_contiguous(), "bad gemv shapes"
        )
        _require(m <= GEMV_MAX_M, f"gemv takes at most {GEMV_MAX_M} rows")
        if m == 0:
            return
        name = "gemv_q8_0" if weight.qtype == GGMLType.Q8_0 else "gemv_q4_k"
        fn = self.lib.function("quant.cu", name, dtype)
        n = weight.out_features
        args = (self.ptr(y), self.ptr(x), self.ptr(weight.data), i32(m), i32(n), i32(k), i64(_rows(x, "x")))
        self.lib.launch(fn, (_ceil_div(n, GEMV_WARPS),), (GEMV_WARPS * 32,), args)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _norm_threads(hidden: int) -> int:
    return min(1024, max(32, _round_up(_ceil_div(hidden, 4), 32)))
