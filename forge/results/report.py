"""``report.md`` and PNG plots for a run directory, made from its files alone.

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

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E latency"))
KV_PARTS = (
    ("kv_token_slots", "token states"),
    ("kv_reserved_slots", "reserved"),
    ("kv_internal_frag_slots", "internal fragmentation"),
    ("kv_external_frag_slots", "external fragmentation"),
)


def _cdf(ax: Any, values: np.ndarray, title: str) -> None:
    if values.size == 0:
        ax.set_title(f"{title} (no data)")
        return
    xs = np.sort(values) * 1e3
    ax.plot(xs, np.arange(1, xs.size + 1) / xs.size)
    ax.set_title(f"{title} CDF")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of samples")
    ax.grid(alpha=0.3)


def plot_latency_cdfs(requests: pd.DataFrame, path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, LATENCIES, strict=True):
        if key == "itl":
            vals = np.asarray([x for lst in requests["itl"] for x in lst], dtype=float)
        else:
            vals = requests[key].dropna().to_numpy(dtype=float)
        _cdf(ax, vals, title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_batch(steps: pd.DataFrame, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t = steps["end_time"]
    ax1.plot(t, steps["num_seqs"], label="requests in batch")
    ax1.plot(t, steps["num_waiting"], label="waiting", alpha=0.7)
    ax1.set_ylabel("requests")
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
    ax2.set_ylabel("tokens per step")
    ax2.set_xlabel("time (s)")
    ax2.set_title("Tokens per step")
    ax2.legend(loc="upper right")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def kv_axis_top(steps: pd.DataFrame) -> float:
    """The KV plot's y-axis top in % of the pool: the peak of the plotted parts plus 20%, rounded up
    to 1, 2 or 5 times a power of ten (at most 100), so a run that uses 0.5% of its pool shows its shape."""
    total = steps["kv_total_slots"].replace(0, np.nan)
    used = sum((100 * steps[col] / total for col, _ in KV_PARTS), pd.Series(0.0, index=steps.index))
    peak = float(used.max()) if used.notna().any() else 0.0
    if not peak > 0:
        return 100.0
    wanted = peak * 1.2
    scale = 10.0 ** np.floor(np.log10(wanted))
    top = next(m * scale for m in (1, 2, 5, 10) if m * scale >= wanted)
    return float(min(100.0, top))


def plot_kv(steps: pd.DataFrame, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    total = steps["kv_total_slots"].replace(0, np.nan)
    parts = [100 * steps[col] / total for col, _ in KV_PARTS]
    ax.stackplot(steps["end_time"], *parts, labels=[label for _, label in KV_PARTS])
    ax.set_ylim(0, kv_axis_top(steps))
    ax.set_xlabel("time (s)")
    ax.set_ylabel("% of KV slots")
    pool = int(steps["kv_total_slots"].max()) if len(steps) else 0
    ax.set_title(f"KV cache usage over time (pool: {pool:,} token slots; axis scaled to the used range)")
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_report(run_dir: Path | str) -> Path:
    run_dir = Path(run_dir)
    requests = pd.read_parquet(run_dir / "requests.parquet")
    steps = pd.read_parquet(run_dir / "steps.parquet")
    summary = json.loads((run_dir / "summary.json").read_text())
    plot_latency_cdfs(requests, run_dir / "latency_cdf.png")
    plot_batch(steps, run_dir / "batch.png")
    plot_kv(steps, run_dir / "kv_usage.png")
    lines = [
        f"# forge run report — `{run_dir.name}`",
        "",
        f"commit `{summary.get('commit', '?')}`, machine `{summary.get('machine', '?')}`, "
        f"clock: {summary.get('clock', '?')}. Config: `config.yaml` in this directory.",
        "",
        *[f"> **warning:** {w}\n" for w in summary.get("warnings", [])],
        "| metric | value |",
        "|---|---|",
        *[f"| {k} | {_fmt(v)} |" for k, v in sorted(summary.items()) if k not in ("commit", "machine", "warnings")],
        "",
        "## Latency CDFs",
        "![latency CDFs](latency_cdf.png)",
        "",
        "## Batch",
        "![batch size](batch.png)",
        "",
        "## KV cache",
        "![KV usage](kv_usage.png)",
        "",
    ]
    out = run_dir / "report.md"
    out.write_text("\n".join(lines))
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(write_report(arg))
