"""Quantized KV caches (``engine.kv_cache_dtype=int8`` / ``fp8`` / ``fp8_e4m3`` / ``fp8_e5m2``).

Layout: a quantized cache layer is one tensor per K and V shaped
``[num_blocks, block_size, num_kv_heads, head_dim + 4]`` in the storage dtype (``torch.int8``,
``torch.float8_e4m3fn`` or ``torch.float8_e5m2``, one byte per element). Each row — one token of one
KV head — holds its ``head_dim`` quantized values followed by the 4 bytes of its float32 scale, so
the scales live with the values: copying, swapping or copy-on-write of a block moves both, and the
kernels (torch, forge's C kernel, forge's CUDA kernels) read a row's scale next to its values.

Scale granularity: one scale per (layer, token, KV head), computed when the token is written, as
``amax(|row|) / max_value`` (``max_value``: 127 for int8, 448 for e4m3, 57344 for e5m2). Why per token
and not per block: decode writes one token at a time into a partly filled block, so a per-block
scale would either be frozen by the block's first token (clipping later, larger values) or have to
re-quantize the block's earlier rows on every write (and blocks shared by prefix caching or a fork
would change under their other readers). Why not per tensor (vLLM's fp8 default): that needs scales
calibrated offline, which forge has no step for; a per-row scale needs none. The cost is 4 bytes per
``head_dim`` values (6.25 % at head_dim 64, 3.1 % at 128), counted in ``KVSpec.bytes_per_token``;
llama.cpp's q8_0 spends 2 bytes per 32 values.

A row's values dequantize to ``float32(value) * scale``: int8 ``round(x / scale)`` clamped to
±127 (error ≤ scale / 2 = amax / 254), fp8 ``x / scale`` rounded to the nearest fp8 value (relative
error ≤ 2^-4 for e4m3, 2^-3 for e5m2, plus the subnormal range near 0), never NaN or inf: values
are clamped to ±max_value before the conversion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor is computed: naming the dtypes needs none
    import torch

SCALE_BYTES = 4  # one float32 scale per row, after the row's values


@dataclass(frozen=True)
class KVQuantFormat:
    """One quantized KV dtype: its config name, storage dtype, the largest value it stores, and the
    code forge's C and CUDA kernels know it by. ``storage_name``: the torch dtype's name."""

    name: str
    storage_name: str
    max_value: float
    code: int

    @property
    def storage(self) -> torch.dtype:
        """The storage dtype (imports torch)."""
        import torch

        dtype: torch.dtype = getattr(torch, self.storage_name)
        return dtype


FORMATS: tuple[KVQuantFormat, ...] = (
    KVQuantFormat("int8", "int8", 127.0, 1),
    KVQuantFormat("fp8_e4m3", "float8_e4m3fn", 448.0, 2),
    KVQuantFormat("fp8_e5m2", "float8_e5m2", 57344.0, 3),
)
# str() of each storage dtype ("torch.int8"): a dtype is recognised without importing torch
_BY_STORAGE = {f"torch.{f.storage_name}": f for f in FORMATS}

# engine.kv_cache_dtype's names (besides auto) and the torch dtype each stores: "fp8" is e4m3, as in vLLM.
KV_CACHE_DTYPES: dict[str, str] = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int8": "int8",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def kv_cache_dtype(name: str) -> torch.dtype:
    """The torch dtype ``engine.kv_cache_dtype=name`` stores (imports torch)."""
    import torch

    dtype: torch.dtype = getattr(torch, KV_CACHE_DTYPES[name])
    return dtype


def is_quantized_name(name: str) -> bool:
    """Whether ``engine.kv_cache_dtype=name`` is a quantized cache (int8, fp8); no torch needed."""
    return f"torch.{KV_CACHE_DTYPES.get(name)}" in _BY_STORAGE


def is_quantized(dtype: torch.dtype | str) -> bool:
    """Whether a cache of this dtype holds quantized rows with scales (a numpy dtype name, the
    dtype of a host store, never does)."""
    return str(dtype) in _BY_STORAGE


def quant_format(dtype: torch.dtype) -> KVQuantFormat:
    try:
        return _BY_STORAGE[str(dtype)]
    except KeyError:
        raise ValueError(f"{dtype} is not a quantized KV dtype (known: {sorted(_BY_STORAGE)})") from None


def row_width(dtype: torch.dtype | str, head_dim: int) -> int:
    """Elements per (token, KV head) row of a cache in ``dtype``: ``head_dim``, plus the scale's
    bytes when quantized."""
    return head_dim + SCALE_BYTES if is_quantized(dtype) else head_dim


def head_dim_of(cache: torch.Tensor) -> int:
    """The head dim of a cache layer ``[num_blocks, block_size, kv_heads, row]``."""
    return cache.shape[-1] - SCALE_BYTES if is_quantized(cache.dtype) else cache.shape[-1]


def quantize(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``x [..., head_dim]`` as packed quantized rows ``[..., head_dim + 4]`` in ``dtype``
    (values, then the float32 scale's bytes). An all-zero row gets scale 0 and zero values."""
    import torch

    fmt = quant_format(dtype)
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1, keepdim=True) / fmt.max_value
    scaled = torch.where(scale > 0, xf / torch.where(scale > 0, scale, 1.0), 0.0)
    scaled = scaled.clamp(-fmt.max_value, fmt.max_value)
    values = scaled.round().to(torch.int8) if dtype == torch.int8 else scaled.to(dtype)
    packed = torch.empty((*x.shape[:-1], x.shape[-1] + SCALE_BYTES), dtype=torch.uint8, device=x.device)
    packed[..., : x.shape[-1]] = values.view(torch.uint8)
    packed[..., x.shape[-1] :] = scale.view(torch.uint8)
    return packed.view(dtype)


def dequantize(packed: torch.Tensor) -> torch.Tensor:
    """Packed quantized rows ``[..., head_dim + 4]`` as float32 ``[..., head_dim]``:
    ``float32(value) * scale``."""
    import torch

    head_dim = packed.shape[-1] - SCALE_BYTES
    raw = packed.view(torch.uint8)
    values = raw[..., :head_dim].view(packed.dtype).to(torch.float32)
    scale = raw[..., head_dim:].contiguous().view(torch.float32)
    return values * scale


def write_rows(cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Quantize ``rows [T, kv_heads, head_dim]`` into ``cache``'s flat slots ``slot_mapping [T]``
    (byte copies: torch has no index_copy for fp8 on the CPU)."""
    import torch

    packed = quantize(rows, cache.dtype).view(torch.uint8)
    cache.view(torch.uint8).view(-1, *cache.shape[2:]).index_copy_(0, slot_mapping, packed)
