"""Decode attention's bandwidth efficiency on one GPU as a measured table (``decode_attn_profile`` in
``conf/hardware/<gpu>.yaml``): how much of the HBM bandwidth a decode step's attention kernel reaches
for a given number of (request, KV head) pairs and context length. Few pairs leave SMs idle or in a
half-empty last wave, short contexts give each thread block too little to stream; a bandwidth
model with a context term alone misses the first (decode of 8 requests at context 1,024 ran at 55%
of the bandwidth on Vidur's A100 profile, 128 requests at 97%)."""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DecodeAttentionProfile:
    """Median per-layer decode-attention times ``time_ms[i][j]`` measured for ``batch[j]`` requests
    at ``context[i]`` tokens each, on a model with ``kv_heads`` KV heads of ``head_dim`` elements of
    ``bytes_per_element`` bytes (its K and V are what a step reads). ``efficiency`` turns a row into
    a fraction of ``mem_bw`` and interpolates it for any model: the number of (request, KV head)
    pairs sets the occupancy, so a model with 8 KV heads (or a TP shard with fewer heads) at
    ``b`` requests reads as ``b · 8 / kv_heads`` requests of the profiled model. Between grid points
    the efficiency is bilinear in (log2 pairs, log2 context); outside it is held at the edge."""

    kv_heads: int
    head_dim: int
    bytes_per_element: int
    batch: tuple[float, ...]
    context: tuple[float, ...]
    time_ms: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        rows, cols = len(self.context), len(self.batch)
        if rows < 2 or cols < 2 or any(len(r) != cols for r in self.time_ms) or len(self.time_ms) != rows:
            raise ValueError(
                f"decode_attn_profile needs time_ms as {rows} rows (context) of {cols} values (batch), at least 2 x 2"
            )
        for axis, name in ((self.batch, "batch"), (self.context, "context")):
            if any(b <= a for a, b in itertools.pairwise(axis)) or axis[0] <= 0:
                raise ValueError(f"decode_attn_profile.{name} must be positive and increasing, got {list(axis)}")
        if any(t <= 0 for row in self.time_ms for t in row):
            raise ValueError("decode_attn_profile.time_ms must be > 0")

    @classmethod
    def from_yaml(cls, data: dict[str, Any]) -> DecodeAttentionProfile:
        names = {"kv_heads", "head_dim", "bytes_per_element", "batch", "context", "time_ms"}
        if set(data) != names:
            raise ValueError(
                f"decode_attn_profile: missing {sorted(names - set(data))}, unknown {sorted(set(data) - names)}"
            )
        return cls(
            kv_heads=int(data["kv_heads"]),
            head_dim=int(data["head_dim"]),
            bytes_per_element=int(data["bytes_per_element"]),
            batch=tuple(float(b) for b in data["batch"]),
            context=tuple(float(c) for c in data["context"]),
            time_ms=tuple(tuple(float(t) for t in row) for row in data["time_ms"]),
        )

    def efficiency(self, mem_bw: float, kv_head_requests: float, context: float) -> float:
        """The fraction of ``mem_bw`` decode attention reaches for ``kv_head_requests`` (requests
        times KV heads on this GPU) at a mean ``context``. ``mem_bw``: the bandwidth of the GPU the
        times were measured on (its preset's), so a profiled point costs exactly its measured time."""
        b = kv_head_requests / self.kv_heads
        i, fi = _bracket(self.context, context)
        j, fj = _bracket(self.batch, b)
        grid = [[self._measured(mem_bw, r, c) for c in (j, j + 1)] for r in (i, i + 1)]
        low = grid[0][0] + fj * (grid[0][1] - grid[0][0])
        high = grid[1][0] + fj * (grid[1][1] - grid[1][0])
        return low + fi * (high - low)

    def _measured(self, mem_bw: float, row: int, col: int) -> float:
        kv_bytes = 2 * self.kv_heads * self.head_dim * self.bytes_per_element
        moved = self.batch[col] * self.context[row] * kv_bytes
        return moved / (mem_bw * self.time_ms[row][col] * 1e-3)


def _bracket(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """The grid cell ``[axis[k], axis[k + 1]]`` holding ``x`` and its fraction along it in log2,
    clamped to the first or last cell's edge outside the grid."""
    if x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    k = bisect.bisect_right(axis, x) - 1
    return k, math.log2(x / axis[k]) / math.log2(axis[k + 1] / axis[k])
