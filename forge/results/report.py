"""``report.md`` and PNG plots for a run directory, made from its files alone; every plot has units on
its axes and the run's key config (``forge.results.run_label``) in its title.

``python -m forge.results.report RUN_DIR`` regenerates them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from forge.results.run_label import run_label

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))
KV_PARTS = (
    ("kv_token_slots", "token states"),
    ("kv_reserved_slots", "reserved"),
    ("kv_internal_frag_slots", "internal fragmentation"),
    ("kv_external_frag_slots", "external fragmentation"),
)


def _cdf(ax: Any, values: np.ndarray, title: str) -> None:
    ax.set_xlabel(f"{title} (ms)")
    ax.set_ylabel("fraction of samples (0-1)")
    if values.size == 0:
        ax.set_title(f"{title} (no data)")
        return
    xs = np.sort(values) * 1e3
    ax.plot(xs, np.arange(1, xs.size + 1) / xs.size)
    ax.set_title(f"{title} CDF")
    ax.grid(alpha=0.3)


def latency_cdf_figure(requests: pd.DataFrame, label: str) -> Figure:
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (key, title) in zip(axes.flat, LATENCIES, strict=True):
        if key == "itl":
            vals = np.asarray([x for lst in requests["itl"] for x in lst], dtype=float)
        else:
            vals = requests[key].dropna().to_numpy(dtype=float)
        _cdf(ax, vals, title)
    fig.suptitle(f"Latency CDFs ({len(requests)} requests)\n{label}", fontsize=10)
    fig.tight_layout()
    return fig


def batch_figure(steps: pd.DataFrame, label: str) -> Figure:
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    t = steps["end_time"]
    ax1.plot(t, steps["num_seqs"], label="requests in batch")
    ax1.plot(t, steps["num_waiting"], label="waiting", alpha=0.7)
    ax1.set_ylabel("requests (count)")
    ax1.set_title("Batch size over time")
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.stackplot(
        t,
        steps["num_prefill_tokens"],
        steps["num_decode_tokens"],
        steps["num_draft_tokens"],
        labels=["prefill tokens", "decode tokens", "draft tokens"],
    )
    ax2.set_ylabel("tokens per step (count)")
    ax2.set_xlabel("time (s)")
    ax2.set_title("Tokens per step")
    ax2.legend(loc="upper right")
    ax2.grid(alpha=0.3)
    fig.suptitle(f"Batch and tokens per step ({len(steps)} steps)\n{label}", fontsize=10)
    fig.tight_layout()
    return fig


def kv_axis_top(steps: pd.DataFrame) -> float:
    """The KV plot's y-axis top in % of the pool: the peak of the plotted parts plus 20%, rounded up
    to 1, 2 or 5 times a power of ten (at most 100), so a run that uses 0.5% of its pool shows its shape."""
    total = steps["kv_total_slots"].replace(0, np.nan)
    used = sum((100 * steps[col] / total for col, _ in KV_PARTS), pd.Series(0.0, index=steps.index))
    return axis_top(float(used.max()) if used.notna().any() else 0.0)


def axis_top(peak: float) -> float:
    """A %-axis top for data peaking at ``peak`` %: ``peak`` plus 20%, rounded up to 1, 2 or 5 times a
    power of ten, at most 100 (100 when nothing is above 0)."""
    if not peak > 0:
        return 100.0
    wanted = peak * 1.2
    scale = 10.0 ** np.floor(np.log10(wanted))
    top = next(m * scale for m in (1, 2, 5, 10) if m * scale >= wanted)
    return float(min(100.0, top))


def kv_figure(steps: pd.DataFrame, label: str) -> Figure:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    total = steps["kv_total_slots"].replace(0, np.nan)
    parts = [100 * steps[col] / total for col, _ in KV_PARTS]
    ax.stackplot(steps["end_time"], *parts, labels=[part for _, part in KV_PARTS])
    ax.set_ylim(0, kv_axis_top(steps))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("% of KV slots")
    pool = int(steps["kv_total_slots"].max()) if len(steps) else 0
    ax.set_title(f"KV cache usage over time (pool: {pool:,} token slots; axis scaled to the used range)")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.suptitle(label, fontsize=10)
    fig.tight_layout()
    return fig


def report_figures(run_dir: Path | str) -> dict[str, Figure]:
    """The report's plots of the run in ``run_dir``, by file name (not saved; ``write_report`` saves
    and closes them). Every axis names its unit; every figure's title names the run's key config
    (``forge.results.run_label``)."""
    run_dir = Path(run_dir)
    label = run_label(run_dir)
    steps = pd.read_parquet(run_dir / "steps.parquet")
    figures = {"latency_cdf.png": latency_cdf_figure(pd.read_parquet(run_dir / "requests.parquet"), label)}
    per_replica = json.loads((run_dir / "summary.json").read_text()).get("per_replica")
    if per_replica:  # several replicas: their steps interleave in time, so a figure per replica instead
        from forge.results.replica_report import replica_figure

        figures["replicas.png"] = replica_figure(steps, per_replica, label)
    else:
        figures["batch.png"] = batch_figure(steps, label)
        figures["kv_usage.png"] = kv_figure(steps, label)
    return figures


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_report(run_dir: Path | str) -> Path:
    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    figures = report_figures(run_dir)
    for name, fig in figures.items():
        fig.savefig(run_dir / name, dpi=100)
        plt.close(fig)
    lines = [
        f"# forge run report — `{run_dir.name}`",
        "",
        f"commit `{summary.get('commit', '?')}`, machine `{summary.get('machine', '?')}`, "
        f"clock: {summary.get('clock', '?')}. Config: `config.yaml` in this directory.",
        "",
        f"Run: {run_label(run_dir)}",
        "",
        *[f"> **warning:** {w}\n" for w in summary.get("warnings", [])],
        "| metric | value |",
        "|---|---|",
        *[
            f"| {k} | {_fmt(v)} |"
            for k, v in sorted(summary.items())
            if k not in ("commit", "machine", "warnings") and not isinstance(v, dict | list)
        ],
        "",
        "## Latency CDFs",
        "![latency CDFs](latency_cdf.png)",
        "",
        *_step_sections(summary, "replicas.png" in figures),
    ]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


def _step_sections(summary: dict[str, Any], per_replica: bool) -> list[str]:
    """The report's batch and KV sections: one figure each, or (several replicas) the per-replica table and figure."""
    if not per_replica:
        return ["## Batch", "![batch size](batch.png)", "", "## KV cache", "![KV usage](kv_usage.png)", ""]
    from forge.results.replica_report import replica_table

    return ["## Replicas", "", *replica_table(summary["per_replica"]), "", "![per replica](replicas.png)", ""]


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(write_report(arg))
