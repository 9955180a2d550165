"""Studies over seeds: every configuration runs with each of ``SEEDS`` (the ``seed`` setting: the
workload's draws and the synthetic model's tokens) and is reported as the mean ± the half-width of
its 95% confidence interval over them (Student's t, ``forge.results.stats.mean_ci95``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from forge.results.stats import MeanCI, mean_ci95

SEEDS = (1, 2, 3)
CI_SUFFIX = "_ci95"
CI_NOTE = (
    "Each configuration ran with seeds {seeds} (workload draws and synthetic tokens); a cell is the mean "
    "± the half-width of its 95% confidence interval over the seeds (Student's t with n - 1 degrees of "
    "freedom), plots show it as error bars; per-seed rows: `results_per_seed.csv`."
)


def with_seeds(points: Sequence[Sequence[str]], seeds: Sequence[int] = SEEDS) -> list[list[str]]:
    """Each point's overrides once per seed (``seed=S`` appended)."""
    return [[*p, f"seed={s}"] for p in points for s in seeds]


def aggregate(df: pd.DataFrame, by: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per configuration ``by``: ``n_seeds``, each metric's mean (same name) and 95% CI
    half-width (``<metric>_ci95``; nan for one seed), in the order the configurations first appear.
    A boolean metric's mean is the share of seeds where it held."""
    rows = []
    for key, g in df.groupby(list(by), sort=False):
        row: dict[str, Any] = dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True))
        row["n_seeds"] = len(g)
        for m in metrics:
            ci = mean_ci95([float(v) for v in g[m]])
            row[m], row[m + CI_SUFFIX] = ci.mean, ci.half_width
        rows.append(row)
    return pd.DataFrame(rows)


def ci(row: Any, metric: str) -> MeanCI:
    """The ``MeanCI`` of ``metric`` in an ``aggregate`` row."""
    return MeanCI(float(row[metric]), float(row[metric + CI_SUFFIX]), int(row["n_seeds"]))


def share(row: Any, metric: str) -> str:
    """A boolean metric of an ``aggregate`` row as "k/n": the seeds where it held."""
    n = int(row["n_seeds"])
    return f"{round(float(row[metric]) * n)}/{n}"


def differs(a: Any, b: Any, metric: str) -> bool:
    """Whether two ``aggregate`` rows' 95% intervals of ``metric`` are disjoint."""
    return not ci(a, metric).overlaps(ci(b, metric))


def ci_table(df: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str], shares: Sequence[str] = ()) -> str:
    """A markdown table of ``aggregate`` rows: ``keys`` as they are, ``metrics`` as "mean ± half-width",
    ``shares`` (boolean metrics) as "k/n" seeds."""
    cols = [*keys, *metrics, *shares]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = [f"{r[k]:g}" if isinstance(r[k], float) else str(r[k]) for k in keys]
        cells += [str(ci(r, m)) for m in metrics]
        cells += [share(r, s) for s in shares]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
