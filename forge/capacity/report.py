"""``forge capacity``'s output: the answer per configuration, every probe, a plot and a report."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pandas as pd

from forge.capacity.search import Capacity
from forge.config import CONF_DIR
from forge.results.provenance import git_commit
from forge.results.sweep import markdown_table


def capacity_frame(results: Sequence[Capacity]) -> pd.DataFrame:
    """One row per configuration: its capacity, the bracketing probes and goodput per GPU."""
    return pd.DataFrame(
        [
            {
                "config": " ".join(r.overrides) or "(defaults)",
                "rate": r.rate,
                "attainment_at_rate": r.below.attainment if r.below else float("nan"),
                "missed_at": r.above.rate if r.above else float("nan"),
                "attainment_above": r.above.attainment if r.above else float("nan"),
                "gpus": r.gpus,
                "goodput_per_gpu": r.goodput_per_gpu,
                "probes": len(r.probes),
                "monotone": r.monotone,
            }
            for r in results
        ]
    )


def probes_frame(results: Sequence[Capacity]) -> pd.DataFrame:
    rows = []
    for r in results:
        for p in r.probes:
            rows.append({"config": " ".join(r.overrides) or "(defaults)", **p.__dict__, "meets": p.meets(r.slo)})
    return pd.DataFrame(rows)


def plot_attainment(results: Sequence[Capacity], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        probes = sorted(r.probes, key=lambda p: p.rate)
        label = " ".join(r.overrides) or "(defaults)"
        ax.plot([p.rate for p in probes], [100 * p.attainment for p in probes], marker="o", ms=3, label=label)
    slo = results[0].slo
    ax.axhline(100 * slo.attainment, color="grey", ls="--", lw=1, label=f"target {100 * slo.attainment:g}%")
    ax.set_xscale("log")
    ax.set_xlabel("offered load (requests/s, log scale)")
    ax.set_ylabel("SLO attainment (% of requests)")
    ax.set_title(f"SLO attainment vs rate (TTFT <= {slo.ttft_s:g} s, TPOT <= {slo.tpot_s:g} s)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_capacity(results: Sequence[Capacity], out: Path, command: str) -> Path:
    """capacity.csv, probes.csv, attainment.png and report.md in ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    table = capacity_frame(results)
    table.to_csv(out / "capacity.csv", index=False)
    probes_frame(results).to_csv(out / "probes.csv", index=False)
    plot_attainment(results, out / "attainment.png")
    slo = results[0].slo
    best = table.iloc[int(table["goodput_per_gpu"].to_numpy().argmax())]
    lines = [
        "# Capacity under an SLO",
        "",
        f"- command: `{command}`",
        f"- commit: `{git_commit(CONF_DIR.parent)}`; machine: {platform.node()} {platform.machine()}; "
        f"written {datetime.now():%Y-%m-%d %H:%M}",
        f"- SLO: TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s:g} s for >= {100 * slo.attainment:g}% of requests "
        "(DistServe's goodput); rate: the highest offered load found that meets it, `missed_at` the rate just above "
        "that missed it (the check).",
        f"- best goodput per GPU: **{best['goodput_per_gpu']:.4g} req/s/GPU** with `{best['config']}` "
        f"({best['rate']:.4g} req/s on {best['gpus']} GPU(s))",
        "",
        markdown_table(table, list(table.columns)),
        "",
        "![attainment](attainment.png)",
        "",
    ]
    if not table["monotone"].all():
        lines.append(
            "Warning: a configuration's attainment rose with the rate somewhere (`monotone` False): "
            "bisection may have stopped at a local boundary; see probes.csv."
        )
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
