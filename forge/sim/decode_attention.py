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
        return self.at(mem_bw).efficiency(kv_head_requests, context)

    def at(self, mem_bw: float) -> EfficiencyGrid:
        """The measured efficiencies at ``mem_bw``, for computing many ``efficiency`` values."""
        kv_bytes = 2 * self.kv_heads * self.head_dim * self.bytes_per_element
        measured = tuple(
            tuple(b * c * kv_bytes / (mem_bw * t * 1e-3) for b, t in zip(self.batch, row, strict=True))
            for c, row in zip(self.context, self.time_ms, strict=True)
        )
        return EfficiencyGrid(self, measured)


class EfficiencyGrid:
    """``DecodeAttentionProfile.efficiency`` at one bandwidth, with what a context does not change
    computed once: ``measured[i][j]`` (the efficiency of ``batch[j]`` requests at ``context[i]``), the
    cells' log2 widths, and (``column``) the efficiencies at one number of (request, KV head) pairs
    interpolated along the batch axis at every profiled context. Each value is the same float
    expression, evaluated in the same order, as computing it from scratch: the same bits."""

    def __init__(self, profile: DecodeAttentionProfile, measured: tuple[tuple[float, ...], ...]) -> None:
        self.profile = profile
        self.measured = measured
        self.context_widths = _log2_widths(profile.context)
        self.batch_widths = _log2_widths(profile.batch)

    def column(self, kv_head_requests: float) -> EfficiencyColumn:
        """The efficiencies at ``kv_head_requests`` for each profiled context (log2-linear in the batch)."""
        j, fj = _bracket(self.profile.batch, self.batch_widths, kv_head_requests / self.profile.kv_heads)
        at = [row[j] + fj * (row[j + 1] - row[j]) for row in self.measured]
        return EfficiencyColumn(self.profile.context, self.context_widths, at)

    def efficiency(self, kv_head_requests: float, context: float) -> float:
        """``DecodeAttentionProfile.efficiency`` at this grid's bandwidth."""
        return self.column(kv_head_requests).efficiency(context)


class EfficiencyColumn:
    """The efficiency at one number of (request, KV head) pairs as a function of the mean context:
    log2-linear between the profiled contexts' values ``at``, held at the edge outside them."""

    def __init__(self, context: tuple[float, ...], widths: tuple[float, ...], at: list[float]) -> None:
        self.context, self.widths = context, widths
        self.at = tuple(at)
        self.steps = tuple(high - low for low, high in itertools.pairwise(at))

    def efficiency(self, context: float) -> float:
        axis = self.context  # _bracket inlined: this is the simulated clock's hot path
        if context <= axis[0]:
            return self.at[0] + 0.0 * self.steps[0]
        if context >= axis[-1]:
            return self.at[-2] + 1.0 * self.steps[-1]
        i = bisect.bisect_right(axis, context) - 1
        return self.at[i] + math.log2(context / axis[i]) / self.widths[i] * self.steps[i]


def _log2_widths(axis: tuple[float, ...]) -> tuple[float, ...]:
    """Per grid cell ``[axis[k], axis[k + 1]]``: its width in log2."""
    return tuple(math.log2(high / low) for low, high in itertools.pairwise(axis))


def _bracket(axis: tuple[float, ...], widths: tuple[float, ...], x: float) -> tuple[int, float]:
    """The grid cell ``[axis[k], axis[k + 1]]`` holding ``x`` and its fraction along it in log2,
    clamped to the first or last cell's edge outside the grid."""
    if x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    k = bisect.bisect_right(axis, x) - 1
    return k, math.log2(x / axis[k]) / widths[k]
