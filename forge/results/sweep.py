"""Gather a sweep's runs into one DataFrame and write a sweep report.

``python -m forge.results.sweep MULTIRUN_DIR [--ttft-slo 2.0] [--tbt-slo 0.2]`` (also run automatically at the
end of ``python run.py -m ...`` by ``forge.results.sweep_callback``) reads every run directory below
MULTIRUN_DIR (one with ``summary.json``; its overrides from ``.hydra/overrides.yaml`` or
``overrides.yaml``), and writes ``sweep.parquet`` (one row per run: the overrides as columns, the
summary, goodput and the mean KV breakdown), ``sweep_report.md`` and PNG plots into MULTIRUN_DIR.

Runs that differ only in ``seed`` (``-m ... seed=1,2,3``) are one configuration: the report's table
and plots give each metric's mean ± 95% CI over its seeds (``forge.results.sweep_stats``), and name
configurations whose curves coincide. The report also says how the jobs ran (the launcher's
``launch.json``, checked against each run's ``timing.json``: whether a wall-clock run overlapped
another) and carries every warning the runs wrote (``forge.results.sweep_context``).

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

from forge.core.errors import CommandError, run_main
from forge.results.sweep_context import launch_lines, run_warnings, sweep_title
from forge.results.sweep_plots import cdf_figure, coincidence_note, curves, kv_figure, metric_figure
from forge.results.sweep_stats import SEED_KEY, aggregate, coinciding, config_axes, format_table

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
GOODPUT_METRICS = [("goodput", "goodput (req/s)"), ("slo_attainment", "fraction meeting SLO (0-1)")]
KV_SHARES = [(f"kv_share_{c.removeprefix('kv_').removesuffix('_slots')}", label) for c, label in KV_PARTS]
WALL_COLS = ("torch_threads", "load_avg_start", "load_avg_end")


def markdown_table(df: pd.DataFrame, cols: list[str]) -> str:
    cols = [c for c in cols if c in df]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def first(df: pd.DataFrame, col: str) -> str:
    return str(df[col].iloc[0]) if col in df else "?"


def write_sweep_report(sweep_dir: Path | str, ttft_slo: float = 2.0, tbt_slo: float = 0.2) -> Path:
    """``sweep.parquet``, ``sweep_report.md`` and the plots; runs that differ only in ``seed`` are
    one configuration, shown as mean ± 95% CI over its seeds (``forge.results.sweep_stats``)."""
    sweep_dir = Path(sweep_dir)
    df = gather(sweep_dir, ttft_slo, tbt_slo)
    df.to_parquet(sweep_dir / "sweep.parquet")
    axes = sweep_axes(df)
    if axes:
        df = df.sort_values(axes, kind="stable").reset_index(drop=True)
    keys = config_axes(axes)
    agg = aggregate(df, axes, [*TABLE_COLS, *(m for m, _ in LATENCY_METRICS), *(c for c, _ in KV_SHARES)])
    x = pick_x(agg, keys)
    hue = [k for k in keys if k != x]
    title = sweep_title(sweep_dir, df)
    seeds = int(agg["runs"].max())
    if seeds > 1:
        title += f" · mean ± 95% CI over {seeds} seeds"
    how, sweep_warnings = launch_lines(sweep_dir, df)
    figures = {
        "latency_vs_x.png": metric_figure(agg, x, hue, LATENCY_METRICS, f"Latency and throughput\n{title}"),
        "goodput_vs_x.png": metric_figure(
            agg, x, hue, GOODPUT_METRICS, f"Goodput (TTFT <= {ttft_slo:g} s, P99 TBT <= {tbt_slo * 1e3:g} ms)\n{title}"
        ),
        "cdfs.png": cdf_figure(sweep_dir, df, axes, title),
        "kv_breakdown.png": kv_figure(agg, keys, KV_SHARES, title),
    }
    for name, fig in figures.items():
        if fig is not None:
            fig.savefig(sweep_dir / name, dpi=100)
    lines = [
        f"# Sweep report — `{sweep_dir}`",
        "",
        f"**{title}**",
        "",
        f"{len(df)} runs; swept: {', '.join(f'`{a}`' for a in axes) or 'nothing'}. "
        f"Commit `{first(df, 'commit')}`, clock: {first(df, 'clock')}, machine: {first(df, 'machine')}.",
        f"Goodput SLO: TTFT <= {ttft_slo:g} s and per-request P99 time between tokens <= {tbt_slo * 1e3:g} ms.",
        "All runs: `sweep.parquet` (one row per run).",
        "",
        *section("How the jobs ran", how),
        *warning_section(sweep_warnings, run_warnings(sweep_dir, df)),
        *results_section(df, agg, axes, keys, x, hue),
        *(f"## {h}\n![{h}]({n})\n" for n, h in PLOT_HEADINGS if figures.get(n) is not None),
    ]
    out = sweep_dir / "sweep_report.md"
    out.write_text("\n".join(lines))
    return out


PLOT_HEADINGS = (
    ("latency_vs_x.png", "Latency and throughput"),
    ("goodput_vs_x.png", "Goodput"),
    ("cdfs.png", "CDFs"),
    ("kv_breakdown.png", "KV cache breakdown"),
)


def section(heading: str, body: list[str]) -> list[str]:
    return [f"## {heading}", "", *body, ""]


def warning_section(sweep_warnings: list[str], per_run: list[tuple[str, str, str]]) -> list[str]:
    """Every warning: the sweep's own, then each run's (from its ``summary.json``), with the run."""
    if not sweep_warnings and not per_run:
        return section("Warnings", ["None: no run wrote a warning."])
    body = [f"> **warning (sweep):** {w}\n" for w in sweep_warnings]
    body += [f"> **warning (run `{run}`, {overrides}):** {w}\n" for run, overrides, w in per_run]
    return section(f"Warnings ({len(sweep_warnings) + len(per_run)})", body)


def results_section(
    df: pd.DataFrame, agg: pd.DataFrame, axes: list[str], keys: list[str], x: str | None, hue: list[str]
) -> list[str]:
    """The table (per configuration, mean ± 95% CI, when seeds were swept; else per run) and which
    configurations coincide."""
    seeded = int(agg["runs"].max()) > 1
    body = []
    if seeded:
        body += [f"Mean ± 95% CI (Student's t) over each configuration's seeds ({SEED_KEY} swept).", ""]
        body += [format_table(agg, keys, list(TABLE_COLS)), ""]
    body += [markdown_table(df, [*axes, *TABLE_COLS, *WALL_COLS])]
    notes = [
        f"- {label}: {coincidence_note(groups)}"
        for metric, label in [*LATENCY_METRICS, *GOODPUT_METRICS]
        if metric in agg and (groups := coinciding(curves(agg, x, hue, metric)))
    ]
    if notes:
        body += ["", "Configurations whose curves coincide (the plots mark them):", *notes]
    return section("Results per configuration" if seeded else "Results", body)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m forge.results.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir")
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="seconds (default 2.0)")
    ap.add_argument("--tbt-slo", type=float, default=0.2, help="seconds (default 0.2)")
    args = ap.parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    if not sweep_dir.is_dir():
        raise CommandError(f"forge sweep: {sweep_dir} is not a directory")
    if next(sweep_dir.rglob("summary.json"), None) is None:
        raise CommandError(
            f"forge sweep: {sweep_dir} is not a sweep directory (no run with a summary.json below it; "
            "`forge run -m ...` writes one under multirun/)"
        )
    print(write_sweep_report(sweep_dir, args.ttft_slo, args.tbt_slo))


if __name__ == "__main__":
    run_main(main)
