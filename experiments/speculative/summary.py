"""The study's per-seed rows as one row per (workload, drafter, batch): each metric's mean ± 95% CI over
the seeds (``experiments.seeds``), the seeds whose outputs were identical to no speculation ("k/n"), the
mean acceptance per draft position; and the findings the report states from them."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from experiments.seeds import CI_SUFFIX, aggregate, ci, share
from forge.results.stats import mean_ci95

KEYS = ["workload", "drafter", "batch"]
METRICS = [
    "output_tokens",
    "preemptions",
    "seconds",
    "speedup",
    "decode_speedup",
    "prefill_step_seconds",
    "decode_step_seconds",
    "tokens_per_target_forward",
    "mean_acceptance_length",
    "acceptance_rate",
    "copied_fraction",
]
SHARES = ["identical_to_no_spec"]


def positions_mean(values: pd.Series) -> str:
    """The mean acceptance of each draft position over the seeds' "a b c ..." strings ("" for none)."""
    lists = [[float(x) for x in v.split()] for v in values if isinstance(v, str) and v.strip()]
    return " ".join(f"{sum(c) / len(c):.2f}" for c in zip(*lists, strict=False)) if lists else ""


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration, in the order the configurations first appear (see module doc)."""
    keys = [*KEYS, *(["requests"] if "requests" in df else [])]
    # a metric no seed of a case has (copied_fraction of chat) stays nan rather than averaging nothing
    metrics = [m for m in METRICS if m in df and df.groupby(keys, sort=False)[m].count().all()]
    agg = aggregate(df, keys, [*metrics, *SHARES])
    groups = df.groupby(keys, sort=False)
    for m in [m for m in METRICS if m in df and m not in metrics]:
        agg[m] = list(groups[m].mean())
        agg[m + CI_SUFFIX] = list(groups[m].agg(lambda v: mean_ci95(list(v)).half_width if v.count() else math.nan))
    agg["acceptance_per_position"] = list(groups["acceptance_per_position"].agg(positions_mean))
    if "loadavg" in df:
        agg["loadavg"] = list(groups["loadavg"].agg(lambda v: "; ".join(map(str, v))))
    return agg


def table(agg: pd.DataFrame) -> str:
    """Markdown: keys as they are, metrics as "mean ± half-width", the identical check as "k/n" seeds."""
    keys = [*KEYS, *(["requests"] if "requests" in agg else [])]
    metrics = [m for m in METRICS if m in agg]
    text = [c for c in ("acceptance_per_position", "loadavg") if c in agg]
    cols = [*keys, "n_seeds", *metrics, *SHARES, *text]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in agg.iterrows():
        cells = [str(r[k]) for k in [*keys, "n_seeds"]]
        cells += [str(ci(r, m)) for m in metrics]
        cells += [share(r, s) for s in SHARES] + [str(r[c]) for c in text]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def finding(workload: str, drafter: str, g: pd.DataFrame, goals: bool) -> str:
    """Batch 1, the best batch and where speculation stops paying (mean speedup below 1), with CIs."""
    g = g.sort_values("batch")
    b1 = g.iloc[0]
    losing = g[g.speedup < 1.0]
    stop = "never slower (mean speedup >= 1 at every batch)"
    if len(losing):
        first = losing.iloc[0]
        sure = "its whole 95% interval below 1" if ci(first, "speedup").high < 1 else "its 95% interval reaches 1"
        sure = sure if int(first.n_seeds) > 1 else "one seed: no interval"
        stop = f"slower than no speculation from batch {int(first.batch)} ({ci(first, 'speedup')}x, {sure})"
    best = g.iloc[int(g.speedup.to_numpy().argmax())]
    decode = f" ({ci(b1, 'decode_speedup')}x on the decode steps)" if "decode_speedup" in g else ""
    line = (
        f"- {workload} / {drafter}: batch {int(b1.batch)}: {ci(b1, 'tokens_per_target_forward')} tokens per "
        f"target forward, {ci(b1, 'speedup')}x speedup{decode}, acceptance rate {ci(b1, 'acceptance_rate')}; "
        f"best {ci(best, 'speedup')}x at batch {int(best.batch)}; {stop} "
        f"(batches run: {', '.join(str(int(b)) for b in g.batch)}; {int(b1.n_seeds)} seed(s) each)."
    )
    if goals and workload == "grounded" and int(b1.batch) == 1:
        ok_t = "met" if b1.tokens_per_target_forward >= 2.0 else "NOT met"
        ok_s = "met" if b1.speedup >= 1.5 else "NOT met"
        line += f" Goals at batch 1 (means): >= 2.0 tokens per forward {ok_t}, >= 1.5x speedup {ok_s}."
    return line


def findings(agg: pd.DataFrame, goals: bool) -> list[str]:
    spec = agg[agg.drafter != "none"]
    out = [finding(str(w), str(d), g, goals) for (w, d), g in spec.groupby(["workload", "drafter"], sort=False)]
    identical: Any = agg["identical_to_no_spec"]
    checked = "every" if bool((identical == 1.0).all()) else "NOT every"
    out.append(
        f"- Outputs identical to no speculation in {checked} seed of every configuration "
        "(`identical_to_no_spec`: the seeds where they were)."
    )
    return out
