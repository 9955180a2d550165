"""The sweep report's figures. Every title names the model, the clock (the simulated GPU, or the
machine and threads of a wall clock) and the workload; each point is a configuration's mean over its
seeds with its 95% CI as an error bar; curves that coincide (identical, or CIs overlapping at every
point) are named in the legend and in a note on the plot, and drawn with their own markers and line
styles so neither hides the other; the KV breakdown's axis is scaled to its data."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from forge.results.report import axis_top
from forge.results.stats import MeanCI
from forge.results.sweep_stats import cell, coinciding

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
STYLES = ("-", "--", ":", "-.")
Curves = dict[str, dict[Any, MeanCI]]


def config_label(row: pd.Series | Mapping[str, Any], keys: Sequence[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in keys) or "all runs"


def curves(agg: pd.DataFrame, x: str | None, hue: Sequence[str], metric: str) -> Curves:
    """A metric's curves: one per ``hue`` configuration over ``x``; without ``x``, one single-point
    curve per configuration (so that coinciding configurations are found the same way)."""
    if x is None:
        return {config_label(r, hue): {"": cell(r, metric)} for _, r in agg.iterrows()}
    out: Curves = {}
    for _, r in agg.sort_values([*hue, x], kind="stable").iterrows():
        out.setdefault(config_label(r, hue), {})[r[x]] = cell(r, metric)
    return out


def suptitle(fig: Figure, title: str) -> None:
    """``title`` over the figure, each line wrapped to its width."""
    width = int(fig.get_figwidth() * 15)
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()), fontsize=9)


def coincidence_note(groups: list[list[str]]) -> str:
    return "coincide (identical or CIs overlap everywhere): " + "; ".join(" = ".join(g) for g in groups)


def _draw(ax: Axes, cs: Curves, x: str | None) -> None:
    groups = coinciding(cs)
    with_others = {name: [o for o in g if o != name] for g in groups for name in g}
    numeric_xs = [float(k) for c in cs.values() for k in c] if x is not None else [0.0]
    dodge = 0.012 * ((max(numeric_xs) - min(numeric_xs)) or 1.0)  # curves drawn side by side, not on top
    for i, (name, curve) in enumerate(cs.items()):
        keys = list(curve) if x is None else sorted(curve)
        xs = [i] if x is None else [float(k) + (i - (len(cs) - 1) / 2) * dodge for k in keys]
        ys = [curve[k].mean for k in keys]
        errs = [0.0 if math.isnan(curve[k].half_width) else curve[k].half_width for k in keys]
        label = name + (f" (= {', '.join(with_others[name])})" if name in with_others else "")
        ax.errorbar(
            xs, ys, yerr=errs, marker=MARKERS[i % len(MARKERS)], linestyle="none" if x is None else STYLES[i % 4],
            markersize=max(4.0, 9.0 - 1.5 * i), capsize=3, label=label, zorder=2 + i, alpha=0.85,
            markerfacecolor="none" if i and name in with_others else None,
        )  # fmt: skip
    if x is None:
        ax.set_xticks(range(len(cs)), list(cs), rotation=30, ha="right", fontsize=7)
        ax.set_xlim(-0.5, len(cs) - 0.5)
    if groups:
        ax.text(0.01, 0.99, coincidence_note(groups), transform=ax.transAxes, va="top", fontsize=6, wrap=True)
    ax.legend(fontsize=6, loc="lower right")


def metric_figure(
    agg: pd.DataFrame, x: str | None, hue: Sequence[str], metrics: Sequence[tuple[str, str]], title: str
) -> Figure | None:
    """One panel per metric: mean ± 95% CI per configuration, against ``x`` when there is one."""
    metrics = [(m, label) for m, label in metrics if m in agg]
    if not metrics:
        return None
    ncols = min(len(metrics), 3)
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(5.5 * ncols, 4.2 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for ax, (metric, label) in zip(axes.flat, metrics, strict=False):
        _draw(ax, curves(agg, x, hue, metric), x)
        ax.set_xlabel(x if x is not None else "configuration")
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs {x.split('.')[-1]}" if x else f"{label} per configuration", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    suptitle(fig, title)
    fig.tight_layout()
    return fig


def cdf_figure(sweep_dir: Path, df: pd.DataFrame, keys: Sequence[str], title: str) -> Figure:
    """TTFT and time-between-tokens CDFs, one curve per run."""
    fig = Figure(figsize=(12, 4.8))
    ax1, ax2 = fig.subplots(1, 2)
    for _, row in df.iterrows():
        req_path = sweep_dir / row["run"] / "requests.parquet"
        if not req_path.is_file():
            continue
        req = pd.read_parquet(req_path)
        ttft = np.sort(req["ttft"].dropna().to_numpy(dtype=float)) * 1e3
        itl = np.sort(np.asarray([x for lst in req["itl"] for x in lst], dtype=float)) * 1e3
        for ax, vals in ((ax1, ttft), (ax2, itl)):
            if vals.size:
                ax.plot(vals, np.arange(1, vals.size + 1) / vals.size, label=config_label(row, keys))
    for ax, name in ((ax1, "TTFT"), (ax2, "time between tokens")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction (0-1)")
        ax.set_title(f"{name} CDF per run", fontsize=9)
        ax.grid(alpha=0.3)
    if len(df) <= 16:
        ax1.legend(fontsize=7)
    suptitle(fig, title)
    fig.tight_layout()
    return fig


def kv_figure(agg: pd.DataFrame, keys: Sequence[str], parts: Sequence[tuple[str, str]], title: str) -> Figure | None:
    """The mean share of the KV slots in each use per configuration, stacked; the axis tops just
    above the tallest stack (``forge.results.report.axis_top``)."""
    parts = [(c, label) for c, label in parts if c in agg]
    if not parts:
        return None
    fig = Figure(figsize=(max(6.0, 0.6 * len(agg) + 3), 4.8))
    ax = fig.subplots()
    bottom = np.zeros(len(agg))
    for col, label in parts:
        vals = 100 * agg[col].fillna(0).to_numpy(dtype=float)
        ax.bar(range(len(agg)), vals, bottom=bottom, label=label)
        bottom += vals
    labels = [config_label(r, keys) for _, r in agg.iterrows()]
    ax.set_xticks(range(len(agg)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("% of KV slots (mean over steps and seeds)")
    ax.set_title("KV cache breakdown per configuration (rest: free)", fontsize=9)
    ax.set_ylim(0, axis_top(float(bottom.max()) if len(bottom) else 0.0))
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    suptitle(fig, title)
    fig.tight_layout()
    return fig
