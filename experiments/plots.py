"""Line plots for studies: one panel per metric, one line per group."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd


def lines(
    df: pd.DataFrame,
    x: str,
    xlabel: str,
    group: Sequence[str],
    metrics: Sequence[tuple[str, str]],
    title: str,
    path: Path,
    logx: bool = False,
) -> None:
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, (metric, label) in zip(axes[0], metrics, strict=True):
        for key, g in df.groupby(list(group), sort=True):
            name = ", ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
            g = g.sort_values(x)
            ax.plot(g[x], g[metric], marker="o", label=name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_title(label)
        if logx:
            ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
