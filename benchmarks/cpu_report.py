"""The pieces of ``reports/cpu/README.md`` that are arithmetic, kept apart from the runs that feed them:
figures over repeated runs, greedy agreement between two weight formats, and goals met or not."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Figure:
    """One measured rate (tok/s) over repeated runs."""

    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def cell(self) -> str:
        """``median (min-max)``, or the value alone for a single run."""
        if len(self.runs) == 1:
            return f"{self.runs[0]:.1f}"
        return f"{self.median:.1f} ({min(self.runs):.1f}-{max(self.runs):.1f})"


@dataclass(frozen=True)
class Agreement:
    """How far greedy continuations of the same prompts coincide with a reference's."""

    prompts: int
    identical: int  # continuations equal to the reference token for token
    mean_prefix: float  # mean fraction of tokens before the first difference

    def describe(self) -> str:
        return (
            f"{self.identical}/{self.prompts} continuations identical; "
            f"on average the first {self.mean_prefix:.0%} of tokens agree"
        )


def greedy_agreement(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]]) -> Agreement:
    """``other``'s continuations against ``reference``'s, prompt by prompt (equal counts and lengths)."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"need the same non-zero number of continuations, got {len(reference)} and {len(other)}")
    prefixes = []
    for ref, out in zip(reference, other, strict=True):
        if len(ref) != len(out) or not ref:
            raise ValueError(f"continuations of different or zero length: {len(ref)} and {len(out)}")
        same = next((i for i, (a, b) in enumerate(zip(ref, out, strict=True)) if a != b), len(ref))
        prefixes.append(same / len(ref))
    return Agreement(len(reference), sum(p == 1.0 for p in prefixes), statistics.fmean(prefixes))


@dataclass(frozen=True)
class Goal:
    """``ours / theirs >= target``; ``None`` where one side was not measured."""

    text: str
    ours: float | None
    theirs: float | None
    target: float

    @property
    def ratio(self) -> float | None:
        return None if self.ours is None or self.theirs is None else self.ours / self.theirs

    def line(self) -> str:
        ratio = self.ratio
        if ratio is None:
            return f"- {self.text}: **not measured** in this run"
        verdict = "met" if ratio >= self.target else "not met"
        return f"- {self.text}: **{verdict}**, {ratio:.2f}x (need {self.target:g}x)"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *["| " + " | ".join(row) + " |" for row in rows],
    ]
