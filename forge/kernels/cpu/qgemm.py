"""forge's quantized matrix products for CPUs with AVX2 but no VNNI (``qgemm.c``), and the one place
that decides whether the int8 / int4 weight formats use them (``forge_qgemm_preferred``).

Without VNNI, ``torch._int_mm`` (oneDNN) falls to a slow reference path (about 0.5 GOP/s on an AMD
EPYC Zen 3), and torch's int4 kernel wants bfloat16 activations; ``int8_gemm`` (exact int32 sums,
the same bits as ``torch._int_mm``) and ``int4_gemm`` (llama.cpp's Q4_1 x Q8_1 scheme with 16-bit
activations) run on AVX2. Where the CPU has VNNI (``avx512_vnni`` or ``avx_vnni``), oneDNN's int8 GEMM is the faster
one and the torch kernels stay.
"""

from __future__ import annotations

from functools import cache

import torch

from forge.kernels.cpu import native
from forge.kernels.cpu.build import cpu_flags_line

INT4_GROUP_SIZE = 32  # input channels per 4-bit group (Q4_1's block); fast_weights uses this one
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni"})


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as ``/proc/cpuinfo`` names them (empty where it cannot be read)."""
    return frozenset(cpu_flags_line().replace(":", " ").split())


@cache
def forge_qgemm_preferred() -> bool:
    """Whether the int8 / int4 weight formats multiply with forge's kernels rather than torch's: the
    CPU has AVX2 and no VNNI, and the C kernels build here."""
    flags = cpu_flags()
    return "avx2" in flags and not (flags & VNNI_FLAGS) and native.available()


def int8_gemm(
    x: torch.Tensor,
    w_out_in: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    col_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ w_out_in [N, K].t()`` for int8 operands with every value in [-127, 127]: the
    int32 ``[M, N]`` that ``torch._int_mm(x, w_out_in.t())`` gives, bit for bit; with float32
    ``row_scale [M, 1]`` and ``col_scale [N]``, the float32 ``((float)acc * row_scale) * col_scale``
    (``native.rescale_int_mm``'s bits) in the same pass."""
    if x.dtype != torch.int8 or w_out_in.dtype != torch.int8 or x.dim() != 2 or w_out_in.dim() != 2:
        raise TypeError(f"int8_gemm: int8 matrices, got {x.dtype} {tuple(x.shape)} and {w_out_in.dtype}")
    (m, k), n = x.shape, w_out_in.shape[0]
    if w_out_in.shape[1] != k or not (x.is_contiguous() and w_out_in.is_contiguous()):
        raise ValueError(f"int8_gemm: contiguous [M, K] and [N, K], got {tuple(x.shape)} and {tuple(w_out_in.shape)}")
    scales: tuple[int, int] | tuple[None, None] = (None, None)
    if row_scale is not None and col_scale is not None:
        if not (
            row_scale.dtype == col_scale.dtype == torch.float32
            and row_scale.is_contiguous()
            and col_scale.is_contiguous()
            and (row_scale.numel(), col_scale.numel()) == (m, n)
        ):
            raise ValueError("int8_gemm: contiguous float32 row_scale [M, 1] and col_scale [N]")
        scales = (row_scale.data_ptr(), col_scale.data_ptr())
    out = torch.empty((m, n), dtype=torch.int32 if scales[0] is None else torch.float32)
    native.library().forge_int8_gemm(
        x.data_ptr(),
        w_out_in.data_ptr(),
        *scales,
        out.data_ptr(),
        m,
        n,
        k,
        torch.get_num_threads(),
    )
    return out


def pack_int4(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``int4_gemm``'s layout of ``quantize_int4_groups``' output (``q [K, N]`` in 0..15, bfloat16
    ``scale``/``zero [K/32, N]``): ``(nibbles [N, K/2] uint8, scale_zero [N, K/32, 2] int16)``, the
    nibbles of each group of 32 input channels ordered as llama.cpp's Q4_1 (byte j: channel j low,
    channel 16 + j high)."""
    k, n = q.shape
    if k % INT4_GROUP_SIZE or scale.shape != (k // INT4_GROUP_SIZE, n) or zero.shape != scale.shape:
        raise ValueError(f"pack_int4: q [K, N] with K a multiple of 32 and scale/zero [K/32, N], got {tuple(q.shape)}")
    halves = q.t().to(torch.uint8).reshape(n, k // INT4_GROUP_SIZE, 2, INT4_GROUP_SIZE // 2)
    nibbles = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    scale_zero = torch.stack((scale.t(), zero.t()), dim=-1).to(torch.bfloat16).contiguous().view(torch.int16)
    return nibbles, scale_zero


def int4_gemm(x: torch.Tensor, nibbles: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """``x [M, K]`` float32 times the 4-bit weight ``pack_int4`` packed, ``[M, N]`` float32; the
    activations are quantized per row and group of 32 to int8 on the way (approximate)."""
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
        raise TypeError(f"int4_gemm: a contiguous float32 matrix, got {x.dtype} {tuple(x.shape)}")
    (m, k), n = x.shape, nibbles.shape[0]
    if nibbles.shape != (n, k // 2) or scale_zero.shape != (n, k // INT4_GROUP_SIZE, 2) or k % INT4_GROUP_SIZE:
        raise ValueError(f"int4_gemm: x {tuple(x.shape)} does not fit the packed weight {tuple(nibbles.shape)}")
    out = torch.empty((m, n), dtype=torch.float32)
    failed = native.library().forge_int4_gemm(
        x.data_ptr(), nibbles.data_ptr(), scale_zero.data_ptr(), out.data_ptr(), m, n, k, torch.get_num_threads()
    )
    if failed:
        raise MemoryError("int4_gemm: out of memory for the quantized activations")
    return out
