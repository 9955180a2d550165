"""A sweep's runs per configuration: runs that differ only in ``seed`` are one configuration, each
metric its mean and 95% confidence interval over the seeds (``forge.results.stats``); and which
configurations' curves coincide (identical, or confidence intervals overlapping at every point)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from forge.results.stats import MeanCI, mean_ci95

SEED_KEY = "seed"
CI_SUFFIX = "_ci95"  # a metric's CI half-width column in the aggregated frame


def config_axes(axes: Sequence[str]) -> list[str]:
    """The swept keys that make a configuration: every swept key but the seed."""
    return [a for a in axes if a != SEED_KEY]


def _mean_ci(values: pd.Series) -> MeanCI:
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    if not numbers.notna().any():
        return MeanCI(math.nan, math.nan, 0)
    return mean_ci95(numbers.tolist())


def aggregate(df: pd.DataFrame, axes: Sequence[str], metrics: Sequence[str]) -> pd.DataFrame:
    """One row per configuration (sorted by ``config_axes(axes)``): those keys, ``seeds`` (its runs'
    seeds), ``runs`` (how many), and for every numeric metric its mean and ``<metric>_ci95``, the 95%
    CI half-width over the runs (nan for a single run)."""
    keys = config_axes(axes)
    groups = df.groupby(keys, sort=True, dropna=False) if keys else [((), df)]
    cols = [m for m in metrics if m in df and df[m].dtype != bool and pd.api.types.is_numeric_dtype(df[m])]
    rows = []
    for key, g in groups:
        row: dict[str, Any] = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        row["runs"] = len(g)
        row["seeds"] = ",".join(str(s) for s in sorted(g[SEED_KEY])) if SEED_KEY in g else ""
        for m in cols:
            ci = _mean_ci(g[m])
            row[m], row[m + CI_SUFFIX] = ci.mean, ci.half_width
        rows.append(row)
    return pd.DataFrame(rows)


def cell(row: pd.Series | Mapping[str, Any], metric: str) -> MeanCI:
    """The metric of an aggregated row as a ``MeanCI``."""
    return MeanCI(float(row[metric]), float(row.get(metric + CI_SUFFIX, math.nan)), int(row.get("runs", 1)))


def coincide(a: Mapping[Any, MeanCI], b: Mapping[Any, MeanCI]) -> bool:
    """Two curves coincide: the same points, each pair identical or with overlapping 95% CIs."""
    return set(a) == set(b) and all(a[k].overlaps(b[k]) for k in a)


def coinciding(curves: Mapping[str, Mapping[Any, MeanCI]]) -> list[list[str]]:
    """Groups (of two or more, in ``curves`` order) of curves that all coincide with each other."""
    groups: list[list[str]] = []
    for name, curve in curves.items():
        for group in groups:
            if all(coincide(curve, curves[other]) for other in group):
                group.append(name)
                break
        else:
            groups.append([name])
    return [g for g in groups if len(g) > 1]


def format_table(agg: pd.DataFrame, keys: Sequence[str], metrics: Sequence[str]) -> str:
    """A markdown table: the configuration keys, the runs, then every metric as ``mean ± half-width``."""
    metrics = [m for m in metrics if m in agg]
    head = [*keys, "runs", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in agg.iterrows():
        values = [str(r[k]) for k in keys] + [str(r["runs"])] + [str(cell(r, m)) for m in metrics]
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)
