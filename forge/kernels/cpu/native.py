"""Build the package's C kernels with the machine's compiler and call them through ``ctypes``.

The shared library is compiled on first use (``cc -O3 -march=native -fopenmp``; about a second) by
``forge.kernels.cpu.build`` into the cache (keyed by sources, flags, compiler and CPU).

The library's OpenMP runtime is the ``libgomp.so.1`` torch already loaded (same soname), so its
threads are torch's threads; each call asks for ``torch.get_num_threads()`` of them. ``ctypes``
releases the GIL for the call.
"""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import torch

from forge.kernels.cpu.build import NativeKernelsUnavailable, shared_library
from forge.kernels.kv_quant import head_dim_of

HERE = Path(__file__).parent
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-std=c11")
# Per source: -ffast-math lets the softmax's expf vectorize (glibc's libmvec). quant.c must match
# torch's float arithmetic bit for bit, so it gets none. Fast-math is given to compile steps only,
# so the link step does not add crtfastmath.o (which would set flush-to-zero process-wide).
SOURCES = {"paged_attention.c": ("-ffast-math",), "quant.c": (), "qgemm.c": ()}
LINK = ("-shared", "-fopenmp", "-lmvec", "-lm")
__all__ = ["NativeKernelsUnavailable", "available", "library"]


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels, built on first call; raises ``NativeKernelsUnavailable``."""
    torch.get_num_threads()  # torch (and with it its libgomp.so.1) is loaded before the library
    target = shared_library("forge_cpu", {HERE / name: f for name, f in SOURCES.items()}, COMPILE_FLAGS, LINK)
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as exc:
        raise NativeKernelsUnavailable(f"loading {target} failed: {exc}") from exc
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in KV_DTYPES.values():
        fn = getattr(lib, f"forge_paged_decode_attention_{suffix}")
        fn.argtypes = [ptr, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_float, i64, ctypes.c_int]
        fn.restype = ctypes.c_int
    lib.forge_quantize_rows.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_int]
    lib.forge_rescale_int_mm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, ctypes.c_int]
    lib.forge_int8_gemm.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.forge_int4_gemm.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.forge_int4_gemm.restype = ctypes.c_int
    return lib


@cache
def available() -> bool:
    """Whether the C kernels build and load here (``library()`` without raising)."""
    try:
        library()
    except NativeKernelsUnavailable:
        return False
    return True


# The cache dtypes the decode kernel reads; the last three are quantized rows with their scale
# (forge.kernels.kv_quant).
KV_DTYPES = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of one query row per request, ``q [B, heads, head_dim]`` float32, over each
    request's first ``seq_lens[b]`` cached tokens (only the last ``window`` of them when given),
    read in place from ``k_cache``/``v_cache`` ``[num_blocks, block_size, kv_heads, row]``
    (float32 or bfloat16 with row = head_dim; int8 or fp8 rows of head_dim values and their scale,
    row = head_dim + 4, ``forge.kernels.kv_quant``) through ``block_tables [B, >= blocks needed]``.
    Returns ``[B, heads, head_dim]`` float32."""
    suffix = KV_DTYPES.get(k_cache.dtype)
    if suffix is None or q.dtype != torch.float32 or v_cache.dtype != k_cache.dtype:
        raise TypeError(
            "paged_decode_attention: float32 queries over float32/bfloat16/int8/fp8 K/V, got "
            f"{q.dtype} over {k_cache.dtype}/{v_cache.dtype}"
        )
    if q.device.type != "cpu" or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("paged_decode_attention: CPU tensors and contiguous K/V caches only")
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    if heads % kv_heads or head_dim_of(k_cache) != head_dim or seq_lens.shape[0] != b:
        raise ValueError(
            f"paged_decode_attention: shapes q {tuple(q.shape)}, cache {tuple(k_cache.shape)}, "
            f"seq_lens {tuple(seq_lens.shape)} do not fit"
        )
    if window is not None and window < 1:
        raise ValueError(f"paged_decode_attention: window must be >= 1, got {window}")
    q = q.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lens = seq_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    fn = getattr(library(), f"forge_paged_decode_attention_{suffix}")
    failed = fn(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.stride(0),
        lens.data_ptr(),
        out.data_ptr(),
        b,
        heads,
        kv_heads,
        head_dim,
        k_cache.shape[1],
        scale,
        window or 0,
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("paged_decode_attention: out of memory for the score buffers")
    return out


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each row of a contiguous float32 ``x [M, K]`` in one pass:
    ``(q [M, K] int8, scale [M, 1])``, bit-identical (for finite ``x``) to
    ``scale = max(|x|.amax(row), 1e-12) / 127`` and ``q = round(x / scale)`` in torch."""
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous():
        raise TypeError(f"quantize_rows: a contiguous float32 matrix, got {x.dtype} {tuple(x.shape)}")
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.int8)
    scale = torch.empty((rows, 1), dtype=torch.float32)
    library().forge_quantize_rows(x.data_ptr(), q.data_ptr(), scale.data_ptr(), rows, cols, torch.get_num_threads())
    return q, scale


def rescale_int_mm(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor) -> torch.Tensor:
    """``(acc * row_scale) * col_scale`` in float32 for an int32 ``acc [M, N]``, ``row_scale [M, 1]``
    and ``col_scale [N]`` (all contiguous), in one pass; bit-identical to the torch expression."""
    rows, cols = acc.shape
    if (
        acc.dtype != torch.int32
        or row_scale.numel() != rows
        or col_scale.numel() != cols
        or not (acc.is_contiguous() and row_scale.is_contiguous() and col_scale.is_contiguous())
    ):
        raise TypeError("rescale_int_mm: contiguous int32 [M, N], float32 [M, 1] and float32 [N]")
    out = torch.empty((rows, cols), dtype=torch.float32)
    library().forge_rescale_int_mm(
        acc.data_ptr(), row_scale.data_ptr(), col_scale.data_ptr(), out.data_ptr(), rows, cols, torch.get_num_threads()
    )
    return out
