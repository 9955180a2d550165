"""Means with 95% confidence intervals over repeated runs (seeds), for sweep reports and studies."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom 1..30; the normal's beyond
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """The two-sided 95% critical value of Student's t with ``dof`` degrees of freedom (>= 1)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


@dataclass(frozen=True)
class MeanCI:
    """The mean of ``n`` values and the half-width of its 95% confidence interval (Student's t;
    nan for a single value, where no interval exists)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def overlaps(self, other: MeanCI) -> bool:
        """Whether the two intervals overlap (a single value's interval is the value itself)."""
        a = 0.0 if math.isnan(self.half_width) else self.half_width
        b = 0.0 if math.isnan(other.half_width) else other.half_width
        return abs(self.mean - other.mean) <= a + b

    def __str__(self) -> str:
        if self.n < 2 or math.isnan(self.half_width):
            return f"{self.mean:.4g}"
        return f"{self.mean:.4g} ± {self.half_width:.2g}"


def mean_ci95(values: Sequence[float]) -> MeanCI:
    """The mean and 95% CI half-width of ``values`` (nan values are ignored); ValueError if empty."""
    xs = [float(v) for v in values if not math.isnan(float(v))]
    if not xs:
        raise ValueError("no values to average")
    n = len(xs)
    if n > 1 and max(xs) - min(xs) <= 1e-12 * max(map(abs, xs)):  # equal but for float rounding (sums taken
        return MeanCI(math.fsum(xs) / n, 0.0, n)  # in another order): no spread, not a 1e-16 one
    mean = math.fsum(xs) / n
    if n == 1:
        return MeanCI(mean, math.nan, 1)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return MeanCI(mean, t975(n - 1) * math.sqrt(var / n), n)
