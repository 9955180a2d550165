"""Line plots for studies: one panel per metric, one line per group."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import LogFormatter, NullFormatter, ScalarFormatter

from forge.results.stats import mean_ci95


def mean_and_ci(g: pd.DataFrame, x: str, metric: str) -> tuple[list[float], list[float], list[float]]:
    """Per x value of ``g``: the mean of ``metric`` and its 95% CI half-width (0 for a single value)."""
    xs, means, half = [], [], []
    for xv, rows in g.groupby(x, sort=True):
        ci = mean_ci95([float(v) for v in rows[metric]])
        xs.append(float(xv))  # type: ignore[arg-type]
        means.append(ci.mean)
        half.append(0.0 if math.isnan(ci.half_width) else ci.half_width)
    return xs, means, half


def lines(
    df: pd.DataFrame,
    x: str,
    xlabel: str,
    group: Sequence[str],
    metrics: Sequence[tuple[str, str]],
    title: str,
    path: Path,
    logx: bool = False,
    logy: Sequence[str] = (),
    hlines: dict[str, tuple[float, str]] | None = None,
) -> None:
    """``logy``: metrics drawn on a log y axis; ``hlines``: metric -> (y, label) reference line (an SLO).
    Lines get distinct markers and dash styles so that policies with identical results stay visible.
    Several rows at one x in a group (seeds) are drawn as their mean with a 95% CI error bar."""
    markers = ("o", "s", "^", "v", "D", "x", "+", "*")
    styles = ("-", "--", "-.", ":")
    hlines = hlines or {}
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.2), squeeze=False)
    for ax, (metric, label) in zip(axes[0], metrics, strict=True):
        for i, (key, g) in enumerate(df.groupby(list(group), sort=True)):
            name = ", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            xs, means, half = mean_and_ci(g, x, metric)
            ax.errorbar(
                xs,
                means,
                yerr=half,
                marker=markers[i % len(markers)],
                ls=styles[i % len(styles)],
                label=name,
                alpha=0.85,
                capsize=3,
            )
        if metric in hlines:
            y, text = hlines[metric]
            ax.axhline(y, color="red", lw=1, ls=":", label=text)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_title(label)
        if logx:
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(df[x].unique()))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
        if metric in logy:
            ax.set_yscale("log")
            # plain numbers, minor ticks labelled when the axis spans few decades (log ticks otherwise read 3x10^1)
            ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
        ax.grid(alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:  # SLO lines drawn on other panels join the one legend
        for h, n in zip(*ax.get_legend_handles_labels(), strict=True):
            if n not in names:
                handles.append(h)
                names.append(n)
    axes[0][0].legend(handles, names, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
