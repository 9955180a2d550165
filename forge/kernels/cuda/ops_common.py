"""What every op of ``forge.kernels.cuda.ops`` shares: the launch constants the ``.cu`` files
``#define`` too, the attention metadata as the kernels read it, the layout checks (a layout a kernel
cannot take raises ``ValueError``), grid arithmetic, and ``KernelOps``, the base holding the
``KernelLibrary``. Part of ``forge.kernels.cuda.ops``, which re-exports its public names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from forge.kernels.cuda.compiler import KernelLibrary

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


def require(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def row_stride(t: torch.Tensor, name: str) -> int:
    """Row stride of a 2-D tensor whose last dim is contiguous."""
    require(t.dim() == 2 and (t.stride(1) == 1 or t.shape[1] <= 1), f"{name} must be 2-D with a contiguous last dim")
    return t.stride(0)


def head_stride(t: torch.Tensor, name: str) -> int:
    """Token stride of ``[tokens, heads, head_dim]`` whose inner two dims are contiguous."""
    require(t.dim() == 3, f"{name} must be [tokens, heads, head_dim]")
    require(
        (t.stride(2) == 1 or t.shape[2] <= 1) and (t.stride(1) == t.shape[2] or t.shape[1] <= 1),
        f"{name} must have contiguous [heads, head_dim] rows",
    )
    return t.stride(0)


def same_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    require(all(t.dtype == dtype for t in tensors), f"dtype mismatch: {[t.dtype for t in tensors]}")
    return dtype


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def norm_threads(hidden: int) -> int:
    return min(1024, max(32, round_up(ceil_div(hidden, 4), 32)))


class KernelOps:
    """The ``KernelLibrary`` the ops launch through."""

    def __init__(self, lib: KernelLibrary) -> None:
        self.lib = lib

    def ptr(self, t: torch.Tensor) -> Any:
        """``t`` as a pointer argument (``KernelLibrary.pointer``)."""
        return self.lib.pointer(t)
