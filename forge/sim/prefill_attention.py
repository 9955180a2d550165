"""A GPU's measured prefill (causal) attention time by the size of the work, for ``clock.cost=operators``.

FlashAttention's prefill kernel does not run at one efficiency: a prompt of 512 tokens keeps an A100 at
~7% of its dense peak, one of 4,096 at ~16% (Vidur's measured profile, ``conf/hardware/a100.yaml``).
``PrefillAttentionProfile`` holds one layer's measured time for single prompts of a few lengths with
nothing cached, and charges a step's causal (query, key) pairs by the work they are: pairs x query heads
x head size, so the same table serves any head count and tensor-parallel split. Between two measured
points the time is linear in the work; below the first it is the first point's time (the kernel's
floor); above the last it grows at the last point's rate. A step's prompts are charged together, as
one kernel over their summed pairs: for several prompts of lengths q_i that is Vidur's lookup of one
prompt of sqrt(Σ q_i²) tokens."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PrefillAttentionProfile:
    """One layer's measured prefill attention: a prompt of ``chunk[i]`` tokens, nothing cached, takes
    ``time_ms[i]`` on a GPU computing ``heads`` query heads of ``head_dim`` elements."""

    heads: int
    head_dim: int
    chunk: tuple[int, ...]
    time_ms: tuple[float, ...]

    @classmethod
    def from_yaml(cls, data: dict[str, Any]) -> PrefillAttentionProfile:
        """The preset's ``prefill_attn_profile`` mapping; a malformed one is a ``ValueError``."""
        try:
            profile = cls(
                int(data["heads"]),
                int(data["head_dim"]),
                tuple(map(int, data["chunk"])),
                tuple(map(float, data["time_ms"])),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"prefill_attn_profile needs heads, head_dim, chunk and time_ms lists ({err})") from None
        profile.check()
        return profile

    def check(self) -> None:
        if self.heads < 1 or self.head_dim < 1:
            raise ValueError("prefill_attn_profile: heads and head_dim must be >= 1")
        if len(self.chunk) < 2 or len(self.chunk) != len(self.time_ms):
            raise ValueError("prefill_attn_profile: chunk and time_ms need the same length, at least 2")
        if any(b <= a for a, b in zip(self.chunk, self.chunk[1:], strict=False)) or self.chunk[0] < 1:
            raise ValueError("prefill_attn_profile: chunk must rise from >= 1")
        if any(t <= 0 for t in self.time_ms):
            raise ValueError("prefill_attn_profile: every time_ms must be > 0")

    def curve(self) -> PrefillAttentionCurve:
        """The table as (work, seconds) points: work = causal pairs x heads x head_dim."""
        work = tuple(c * (c + 1) / 2 * self.heads * self.head_dim for c in self.chunk)
        return PrefillAttentionCurve(work, tuple(t * 1e-3 for t in self.time_ms))


@dataclass(frozen=True)
class PrefillAttentionCurve:
    """Seconds of prefill attention for an amount of work (causal pairs x heads x head_dim)."""

    work: tuple[float, ...]
    seconds: tuple[float, ...]

    def time(self, work: float) -> float:
        """One layer's time for ``work`` (> 0): linear between measured points, the first point's time
        below them, the last point's rate above them."""
        w, s = self.work, self.seconds
        if work <= w[0]:
            return s[0]
        if work >= w[-1]:
            return s[-1] * work / w[-1]
        i = bisect.bisect_right(w, work)
        return s[i - 1] + (s[i] - s[i - 1]) * (work - w[i - 1]) / (w[i] - w[i - 1])
