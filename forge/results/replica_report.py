"""The report's per-replica part for a run of several replicas (``forge.cluster``): a table of each
replica's load and a figure of requests, busy fraction, batch size and KV usage per replica."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure


def replica_figure(steps: pd.DataFrame, per_replica: list[dict[str, Any]], label: str) -> Figure:
    """Four panels: requests and busy fraction per replica (bars), batch size and KV usage over time
    (a line per replica)."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    names = [_name(row) for row in per_replica]
    (ax_req, ax_busy), (ax_batch, ax_kv) = axes
    ax_req.bar(names, [row["requests"] for row in per_replica])
    ax_req.set_ylabel("requests (count)")
    ax_req.set_title("Requests per replica")
    ax_busy.bar(names, [100 * row["busy_fraction"] for row in per_replica])
    ax_busy.set_ylabel("busy (% of the run)")
    ax_busy.set_title("Busy time per replica")
    for row in per_replica:
        own = steps[steps["replica"] == row["replica"]]
        if len(own):
            ax_batch.plot(own["end_time"], own["num_seqs"], label=_name(row), lw=0.8)
            ax_kv.plot(own["end_time"], 100 * own["kv_usage"], label=_name(row), lw=0.8)
    for ax, what, unit in ((ax_batch, "Batch size", "requests (count)"), (ax_kv, "KV usage", "% of KV blocks")):
        ax.set_xlabel("time (s)")
        ax.set_ylabel(unit)
        ax.set_title(f"{what} over time, per replica")
        ax.grid(alpha=0.3)
        if len(per_replica) <= 16:
            ax.legend(fontsize=7, loc="upper right")
    for ax in (ax_req, ax_busy):
        ax.tick_params(axis="x", labelrotation=45 if len(per_replica) > 6 else 0, labelsize=8)
    fig.suptitle(f"Load per replica ({len(per_replica)} replicas)\n{label}", fontsize=10)
    fig.tight_layout()
    return fig


def _name(row: dict[str, Any]) -> str:
    pool = row.get("pool", "replicas")
    prefix = "" if pool == "replicas" else f"{pool} "
    hw = f" ({row['hardware']})" if row.get("hardware") else ""
    return f"{prefix}{row['replica']}{hw}"


def replica_table(per_replica: list[dict[str, Any]]) -> list[str]:
    """The per-replica load as Markdown table lines."""
    lines = ["| replica | hardware | requests | tokens | busy (s) | busy fraction |", "|---|---|---|---|---|---|"]
    for row in per_replica:
        lines.append(
            f"| {_name(row)} | {row.get('hardware') or '-'} | {row['requests']} | {row['tokens']} "
            f"| {row['busy_s']:.4g} | {row['busy_fraction']:.1%} |"
        )
    return lines
