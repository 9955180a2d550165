"""The attention op (a base of ``forge.kernels.cuda.ops.CudaOps``): decode rows through the
partitioned paged kernel and its reduce, the other rows through the prefill kernel."""

from __future__ import annotations

from typing import Any

import torch

from forge.kernels.cuda.compiler import f32, i32, i64
from forge.kernels.cuda.ops_common import (
    DECODE_THREADS,
    DECODE_WARPS,
    MAX_GQA,
    MAX_HEAD_DIM,
    PARTITION_SIZE,
    PREFILL_BLOCK_N,
    PREFILL_ROWS,
    PREFILL_THREADS,
    DeviceAttentionMetadata,
    KernelOps,
    ceil_div,
    head_stride,
    require,
    same_dtype,
)
from forge.kernels.kv_quant import head_dim_of, is_quantized, quant_format


class AttentionOps(KernelOps):
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
            dtype = same_dtype(out, query)
            same_dtype(k_cache, v_cache)
        else:
            dtype = same_dtype(out, query, k_cache, v_cache)
        kv = {"kv": quant_format(k_cache.dtype).code} if quantized else {}
        tokens, heads, head_dim = query.shape
        _, block_size, kv_heads, _ = k_cache.shape
        require(head_dim_of(k_cache) == head_dim and heads % kv_heads == 0, "query does not match the KV cache")
        require(k_cache.is_contiguous() and v_cache.is_contiguous(), "KV caches must be contiguous")
        require(out.is_contiguous() and out.shape == query.shape, "out must be contiguous like query")
        require(
            head_dim <= MAX_HEAD_DIM and heads // kv_heads <= MAX_GQA,
            f"head_dim <= {MAX_HEAD_DIM} and <= {MAX_GQA} query heads per KV head are supported",
        )
        require(
            meta.block_tables.dtype == torch.int32 and meta.block_tables.stride(-1) == 1,
            "block_tables must be int32 with a contiguous last dim",
        )
        require(
            meta.seq_lens.dtype == torch.int32 and meta.query_start_loc.dtype == torch.int32,
            "seq_lens and query_start_loc must be int32",
        )
        require(window is None or window > 0, f"window must be positive, got {window}")
        gqa = heads // kv_heads
        q_stride = head_stride(query, "query")
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
            require(head_dim % vec == 0, f"decode attention needs head_dim divisible by {vec} for {dtype}")
            require(k_cache.data_ptr() % 16 == 0 and v_cache.data_ptr() % 16 == 0, "KV caches must be 16-byte aligned")
            context = meta.decode_max_seq_len if window is None else min(meta.decode_max_seq_len, window)
            parts = max(1, ceil_div(context, PARTITION_SIZE))
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
            grid = (ceil_div(meta.max_query_len, tokens_per_block), meta.num_seqs, kv_heads)
            fn = self.lib.function("prefill_attention.cu", "prefill_attention", dtype, head_dim=head_dim, gqa=gqa, **kv)
            smem = 4 * (
                PREFILL_ROWS * head_dim
                + PREFILL_BLOCK_N * (2 * head_dim + 1)
                + (PREFILL_THREADS // 32) * PREFILL_BLOCK_N
            )
            prefill_args = (self.ptr(out), self.ptr(query), *common, f32(scale), i32(window or 0))
            self.lib.launch(fn, grid, (PREFILL_THREADS,), prefill_args, shared_mem=smem)
