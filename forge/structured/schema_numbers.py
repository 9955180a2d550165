"""Regexes for JSON numbers within bounds (``minimum``, ``maximum``, ``exclusiveMinimum``,
``exclusiveMaximum``) and ``multipleOf``, exact or a subset of the valid numbers, never more.

Integers: an exact regex of the decimal range (split by digit count, then digit by digit).
Numbers with bounds: the integers in range, plus ``k.ddd`` (1 to 6 fraction digits) for every
integer part ``k`` whose whole unit interval lies inside the bounds (``-k.ddd`` likewise), with
``|k| < 10**9`` so that reading the text as a double cannot round it onto a bound; no exponent.
Numbers without bounds: any JSON number (exponent of at most two digits, so it stays finite).
``multipleOf`` (a positive integer): its multiples, listed when the bounds leave at most
``MAX_MULTIPLES`` of them, or (without bounds) written with a last-digits suffix when it divides a
power of ten up to 1000; other cases are refused (``SchemaRefused``) by the caller's message.
Bounds are read as exact ``Fraction``s of the JSON values, as a validator compares them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

MAX_MULTIPLES = 1024
FRACTION = r"\.[0-9]{1,6}"
_MAX_FRACTION_INT = 10**9 - 1
UNBOUNDED_NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,2})?"


@dataclass(frozen=True)
class Bounds:
    """The numeric bounds of one schema (None: unbounded on that side)."""

    lo: Fraction | None = None
    lo_exclusive: bool = False
    hi: Fraction | None = None
    hi_exclusive: bool = False

    @property
    def bounded(self) -> bool:
        return self.lo is not None or self.hi is not None

    def int_lo(self) -> int | None:
        """The smallest integer within the lower bound."""
        if self.lo is None:
            return None
        return math.floor(self.lo) + 1 if self.lo_exclusive else math.ceil(self.lo)

    def int_hi(self) -> int | None:
        """The largest integer within the upper bound."""
        if self.hi is None:
            return None
        return math.ceil(self.hi) - 1 if self.hi_exclusive else math.floor(self.hi)


def _cls(a: str, b: str) -> str:
    return a if a == b else f"[{a}-{b}]"


def _same_length(x: str, y: str) -> str:
    """Digit strings of ``len(x)`` from ``x`` to ``y`` (``x <= y``, leading zeros allowed)."""
    n = len(x) - 1
    if x == y:
        return x
    if n == 0:
        return _cls(x, y)
    if x[0] == y[0]:
        return x[0] + _same_length(x[1:], y[1:])
    if x[1:] == "0" * n and y[1:] == "9" * n:
        return f"{_cls(x[0], y[0])}[0-9]{{{n}}}"
    parts = [x[0] + _same_length(x[1:], "9" * n)]
    if int(y[0]) - int(x[0]) > 1:
        parts.append(f"{_cls(str(int(x[0]) + 1), str(int(y[0]) - 1))}[0-9]{{{n}}}")
    parts.append(y[0] + _same_length("0" * n, y[1:]))
    return "(?:" + "|".join(parts) + ")"


def _nonneg(a: int, b: int | None) -> list[str]:
    """Alternatives matching the integers in ``[a, b]`` (``a >= 0``; ``b`` None: no upper bound)."""
    parts = []
    top = b if b is not None else 10 ** len(str(a)) - 1
    for length in range(len(str(a)), len(str(top)) + 1):
        lo, hi = max(a, 10 ** (length - 1) if length > 1 else 0), min(top, 10**length - 1)
        if lo <= hi:
            parts.append(_same_length(str(lo), str(hi)))
    if b is None:
        parts.append(f"[1-9][0-9]{{{len(str(a))},}}")
    return parts


def _alt(parts: list[str]) -> str | None:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def int_range(lo: int | None, hi: int | None) -> str | None:
    """A regex of exactly the integers in ``[lo, hi]`` (None: unbounded); None if there are none."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts = []
    if lo is None or lo < 0:  # negative part: "-" and the magnitudes in [max(1, -hi), -lo]
        mag_lo = max(1, -hi) if hi is not None else 1
        neg = _alt(_nonneg(mag_lo, -lo if lo is not None else None))
        if neg is not None:
            parts.append("-" + neg)
    if hi is None or hi >= 0:
        parts.extend(_nonneg(max(lo, 0) if lo is not None else 0, hi))
    return _alt(parts)


def _fractions(k_lo: int, k_hi: int | None, sign: str) -> str | None:
    k_hi = _MAX_FRACTION_INT if k_hi is None else min(k_hi, _MAX_FRACTION_INT)
    if k_lo > k_hi:
        return None
    digits = _alt(_nonneg(k_lo, k_hi))
    return None if digits is None else f"{sign}{digits}{FRACTION}"


def number_range(bounds: Bounds) -> str | None:
    """Numbers within ``bounds`` (see the module doc); None if the regex would match none."""
    if not bounds.bounded:
        return UNBOUNDED_NUMBER
    int_lo, int_hi = bounds.int_lo(), bounds.int_hi()
    # k.ddd lies in [k, k+1): k within the lower bound and k + 1 <= hi
    pos_hi = None if bounds.hi is None else math.floor(bounds.hi) - 1
    pos = _fractions(max(0, int_lo if int_lo is not None else 0), pos_hi, "")
    # -k.ddd lies in (-(k+1), -k]: -k within the upper bound and -(k+1) >= lo
    neg_hi = None if bounds.lo is None else -math.ceil(bounds.lo) - 1
    neg = _fractions(max(0, -int_hi if int_hi is not None else 0), neg_hi, "-")
    return _alt([p for p in (int_range(int_lo, int_hi), pos, neg) if p is not None])


def _suffix_multiples(m: int) -> str | None:
    """Multiples of ``m`` without bounds, when ``m`` divides 10**k for some k <= 3."""
    k = next((k for k in range(4) if 10**k % m == 0), None)
    if k is None:
        return None
    small = [str(v) for v in range(m, 10**k, m)]
    tails = [str(v).zfill(k) for v in range(0, 10**k, m)]
    long = f"[1-9][0-9]*(?:{'|'.join(tails)})" if k else "[1-9][0-9]*"
    magnitude = "(?:" + "|".join([*small, long]) + ")"
    return f"(?:0|-?{magnitude})"


def multiples(m: int, lo: int | None, hi: int | None) -> str | None:
    """The multiples of ``m`` in ``[lo, hi]``; None if there are none. ``ValueError`` when forge
    cannot write them (too many, or one-sided bounds, or ``m`` not dividing 1000 unbounded)."""
    if lo is None and hi is None:
        regex = _suffix_multiples(m)
        if regex is None:
            raise ValueError("without minimum and maximum, multipleOf must divide 1000")
        return regex
    if lo is None or hi is None:
        raise ValueError("multipleOf needs both a lower and an upper bound, or neither")
    first = -((-lo) // m) * m
    if first > hi:
        return None
    if (hi - first) // m + 1 > MAX_MULTIPLES:
        raise ValueError(f"multipleOf with bounds may leave at most {MAX_MULTIPLES} values")
    return _alt([str(v) for v in range(first, hi + 1, m)])
