"""Gather a sweep's runs into one DataFrame and write a sweep report.

``python -m forge.results.sweep MULTIRUN_DIR [--ttft-slo 2.0] [--tbt-slo 0.2]`` (also run automatically at the
end of ``python run.py -m ...`` by ``forge.results.sweep_callback``) reads every run directory below
MULTIRUN_DIR (one with ``summary.json``; its overrides from ``.hydra/overrides.yaml`` or
``overrides.yaml``), and writes ``sweep.parquet`` (one row per run: the overrides as columns, the
summary, goodput and the mean KV breakdown), ``sweep_report.md`` and PNG plots into MULTIRUN_DIR.

Goodput follows ``vllm bench serve``: requests per second meeting every SLO. The default SLO is
Vidur's (TTFT P90 < 2 s, TBT P99 < 200 ms), applied per request: TTFT <= ``ttft_slo`` and the request's
own P99 time between tokens <= ``tbt_slo``. ``slo_met`` is the run-level check (P90 TTFT and P99 TBT
over all requests / tokens).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported on first use: the sweep callback is loaded by
    every ``python run.py``, and matplotlib would add ~0.4 s to each run's start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


KV_PARTS = (
    ("kv_token_slots", "token states"),
    ("kv_reserved_slots", "reserved"),
    ("kv_internal_frag_slots", "internal fragmentation"),
    ("kv_external_frag_slots", "external fragmentation"),
)


def run_overrides(run_dir: Path) -> list[str]:
    for path in (run_dir / ".hydra" / "overrides.yaml", run_dir / "overrides.yaml"):
        if path.is_file():
            return [str(o) for o in (yaml.safe_load(path.read_text()) or [])]
    return []


def parse_value(text: str) -> Any:
    value = yaml.safe_load(text)
    return value if isinstance(value, int | float | str | bool) or value is None else text


def goodput(requests: pd.DataFrame, duration: float, ttft_slo: float, tbt_slo: float) -> dict[str, float]:
    """Requests/s (and fraction) meeting TTFT <= ttft_slo and own P99 TBT <= tbt_slo."""
    ok = 0
    for ttft, itl in zip(requests["ttft"], requests["itl"], strict=True):
        if ttft is None or pd.isna(ttft) or ttft > ttft_slo:
            continue
        if len(itl) and float(np.percentile(np.asarray(itl, dtype=float), 99)) > tbt_slo:
            continue
        ok += 1
    n = max(len(requests), 1)
    return {"goodput": ok / max(duration, 1e-12), "slo_attainment": ok / n}


def kv_breakdown(steps: pd.DataFrame) -> dict[str, float]:
    """Mean share (over steps) of all KV slots in each use, plus free."""
    if not len(steps) or "kv_total_slots" not in steps:
        return {}
    total = steps["kv_total_slots"].replace(0, np.nan)
    out = {
        f"kv_share_{col.removeprefix('kv_').removesuffix('_slots')}": float((steps[col] / total).mean())
        for col, _ in KV_PARTS
        if col in steps
    }
    if "kv_free_slots" in steps and "kv_external_frag_slots" in steps:
        out["kv_share_free"] = float(((steps["kv_free_slots"] - steps["kv_external_frag_slots"]) / total).mean())
    return out


def gather(sweep_dir: Path | str, ttft_slo: float = 2.0, tbt_slo: float = 0.2) -> pd.DataFrame:
    """One row per run below ``sweep_dir``: ``run`` (its path), ``overrides``, one column per
    override key, then the summary, goodput and KV breakdown."""
    sweep_dir = Path(sweep_dir)
    rows = []
    for summary_path in sorted(sweep_dir.rglob("summary.json")):
        run_dir = summary_path.parent
        summary = json.loads(summary_path.read_text())
        overrides = run_overrides(run_dir)
        row: dict[str, Any] = {"run": str(run_dir.relative_to(sweep_dir)), "overrides": " ".join(overrides)}
        for o in overrides:
            key, _, value = o.partition("=")
            row[key.lstrip("+~")] = parse_value(value)
        row.update({k: v for k, v in summary.items() if not isinstance(v, dict | list)})
        requests_path = run_dir / "requests.parquet"
        if requests_path.is_file():
            row.update(goodput(pd.read_parquet(requests_path), summary["duration_s"], ttft_slo, tbt_slo))
        steps_path = run_dir / "steps.parquet"
        if steps_path.is_file():
            row.update(kv_breakdown(pd.read_parquet(steps_path)))
        row["slo_met"] = bool(
            summary.get("p90_ttft_ms", np.inf) <= ttft_slo * 1e3 and summary.get("p99_itl_ms", 0.0) <= tbt_slo * 1e3
        )
        rows.append(row)
    if not rows:
        raise FileNotFoundError(f"no run directories (with summary.json) below {sweep_dir}")
    return pd.DataFrame(rows)


def sweep_axes(df: pd.DataFrame) -> list[str]:
    """Override keys that take more than one value across the runs."""
    keys: list[str] = []
    for overrides in df["overrides"]:
        for o in str(overrides).split():
            k = o.partition("=")[0].lstrip("+~")
            if k not in keys and k in df and df[k].astype(str).nunique() > 1:
                keys.append(k)
    return keys


def pick_x(df: pd.DataFrame, axes: list[str]) -> str | None:
    numeric = [a for a in axes if pd.api.types.is_numeric_dtype(df[a])]
    rate = [a for a in numeric if "rate" in a]
    candidates = rate or numeric
    return candidates[0] if candidates else None


def series_label(row: pd.Series, keys: list[str]) -> str:
    return ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in keys) or "all runs"


def plot_vs_x(df: pd.DataFrame, x: str, hue: list[str], metrics: list[tuple[str, str]], path: Path, title: str) -> None:
    metrics = [(m, label) for m, label in metrics if m in df]
    if not metrics:
        return
    ncols = min(len(metrics), 3)
    nrows = -(-len(metrics) // ncols)
    plt = _pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.8 * nrows), squeeze=False)
    groups = df.groupby(hue, sort=True) if hue else [((), df)]
    for ax, (metric, label) in zip(axes.flat, metrics, strict=False):
        for key, g in groups:
            g = g.sort_values(x)
            name = series_label(g.iloc[0], hue)
            ax.plot(g[x], g[metric], marker="o", label=name)
            del key
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs {x.split('.')[-1]}")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_cdfs(sweep_dir: Path, df: pd.DataFrame, axes_keys: list[str], path: Path) -> None:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for _, row in df.iterrows():
        req_path = sweep_dir / row["run"] / "requests.parquet"
        if not req_path.is_file():
            continue
        req = pd.read_parquet(req_path)
        label = series_label(row, axes_keys)
        ttft = np.sort(req["ttft"].dropna().to_numpy(dtype=float)) * 1e3
        itl = np.sort(np.asarray([x for lst in req["itl"] for x in lst], dtype=float)) * 1e3
        for ax, vals in ((ax1, ttft), (ax2, itl)):
            if vals.size:
                ax.plot(vals, np.arange(1, vals.size + 1) / vals.size, label=label)
    for ax, name in ((ax1, "TTFT"), (ax2, "time between tokens")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction")
        ax.set_title(f"{name} CDF per run")
        ax.grid(alpha=0.3)
    if len(df) <= 16:
        ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_kv_bars(df: pd.DataFrame, axes_keys: list[str], path: Path) -> None:
    parts = [(f"kv_share_{c.removeprefix('kv_').removesuffix('_slots')}", label) for c, label in KV_PARTS]
    parts = [(c, label) for c, label in parts if c in df]
    if not parts:
        return
    labels = [series_label(r, axes_keys) for _, r in df.iterrows()]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(df) + 3), 4.5))
    bottom = np.zeros(len(df))
    for col, label in parts:
        vals = 100 * df[col].fillna(0).to_numpy(dtype=float)
        ax.bar(range(len(df)), vals, bottom=bottom, label=label)
        bottom += vals
    ax.set_xticks(range(len(df)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("% of KV slots (mean over steps)")
    ax.set_title("KV cache breakdown per run (rest: free)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


TABLE_COLS = (
    "request_throughput",
    "output_throughput",
    "goodput",
    "slo_attainment",
    "p90_ttft_ms",
    "mean_tpot_ms",
    "p99_itl_ms",
    "mean_e2e_ms",
    "num_preemptions",
    "mean_batch_size",
)
LATENCY_METRICS = [
    ("p50_ttft_ms", "TTFT p50 (ms)"),
    ("p90_ttft_ms", "TTFT p90 (ms)"),
    ("mean_tpot_ms", "TPOT mean (ms)"),
    ("p99_itl_ms", "time between tokens p99 (ms)"),
    ("mean_e2e_ms", "E2E latency mean (ms)"),
    ("request_throughput", "throughput (req/s)"),
]


def markdown_table(df: pd.DataFrame, cols: list[str]) -> str:
    cols = [c for c in cols if c in df]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def first(df: pd.DataFrame, col: str) -> str:
    return str(df[col].iloc[0]) if col in df else "?"


def write_sweep_report(sweep_dir: Path | str, ttft_slo: float = 2.0, tbt_slo: float = 0.2) -> Path:
    sweep_dir = Path(sweep_dir)
    df = gather(sweep_dir, ttft_slo, tbt_slo)
    df.to_parquet(sweep_dir / "sweep.parquet")
    axes = sweep_axes(df)
    x = pick_x(df, axes)
    hue = [a for a in axes if a != x]
    if axes:
        df = df.sort_values(axes, kind="stable").reset_index(drop=True)
    lines = [
        f"# Sweep report — `{sweep_dir}`",
        "",
        f"{len(df)} runs; swept: {', '.join(f'`{a}`' for a in axes) or 'nothing'}. "
        f"Commit `{first(df, 'commit')}`, clock: {first(df, 'clock')}, machine: {first(df, 'machine')}.",
        f"Goodput SLO: TTFT <= {ttft_slo:g} s and per-request P99 time between tokens <= {tbt_slo * 1e3:g} ms.",
        "All runs: `sweep.parquet` (one row per run).",
        "",
        markdown_table(df, [*axes, *TABLE_COLS]),
        "",
    ]
    if x is not None:
        plot_vs_x(df, x, hue, LATENCY_METRICS, sweep_dir / "latency_vs_x.png", "Latency and throughput")
        plot_vs_x(
            df,
            x,
            hue,
            [("goodput", "goodput (req/s)"), ("slo_attainment", "fraction meeting SLO")],
            sweep_dir / "goodput_vs_x.png",
            f"Goodput (TTFT <= {ttft_slo:g} s, P99 TBT <= {tbt_slo * 1e3:g} ms)",
        )
        lines += [
            "## Latency vs " + x,
            "![latency](latency_vs_x.png)",
            "",
            "## Goodput",
            "![goodput](goodput_vs_x.png)",
            "",
        ]
    plot_cdfs(sweep_dir, df, axes, sweep_dir / "cdfs.png")
    plot_kv_bars(df, axes, sweep_dir / "kv_breakdown.png")
    lines += ["## CDFs", "![cdfs](cdfs.png)", "", "## KV cache breakdown", "![kv](kv_breakdown.png)", ""]
    out = sweep_dir / "sweep_report.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m forge.results.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="seconds (default 2.0)")
    ap.add_argument("--tbt-slo", type=float, default=0.2, help="seconds (default 0.2)")
    args = ap.parse_args(argv)
    print(write_sweep_report(args.sweep_dir, args.ttft_slo, args.tbt_slo))


if __name__ == "__main__":
    main()
