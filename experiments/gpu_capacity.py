"""GPUs needed for a production trace under an SLO (issue 33, study 3): Llama-2-7B and Llama-3-8B on
simulated A100 and H100, tensor parallel 1 and 2, for the Azure conversation trace replayed at 16x its
rate. Per-replica capacity from ``forge capacity`` (three 5-minute windows of the trace); the replicas
needed = ceil(target rate / capacity), checked by running the window at the target rate on that many
replicas (must meet the SLO) and on one fewer (must miss it)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from experiments.capacity_search import WINDOWS, Job, run_searches, window_overrides
from experiments.common import interpretation_and_results, table, write_readme, write_results
from experiments.seeds import aggregate, ci, ci_table

SPEEDUP = 16  # the trace replayed at 16x its rate (workload.time_scale = 1/16): a service 16x the sample
TTFT_S, TPOT_S = 1.0, 0.05
BASE = ["model=synthetic", "clock=simulated", "engine.max_model_len=4096", "workload=azure_conv"]
CONFIGS = [(m, hw, tp) for m in ("llama-2-7b", "llama-3-8b") for hw in ("a100", "h100") for tp in (1, 2)]
KEYS = ["model", "hardware", "tp"]


def config_overrides(model: str, hardware: str, tp: int) -> list[str]:
    return [*BASE, f"clock.model={model}", f"clock.hardware={hardware}", f"clock.tensor_parallel={tp}"]


def jobs(size: str) -> list[Job]:
    tiny = size == "tiny"  # a smoke test: one model and GPU, one window, 200 requests
    configs = CONFIGS[2:4] if tiny else CONFIGS
    cap = ["workload.max_requests=200"] if tiny else []
    return [
        (
            [*config_overrides(m, hw, tp), *window_overrides(w), *cap],
            TTFT_S,
            TPOT_S,
            0.05,
            {"model": m, "hardware": hw, "tp": tp, "window": f"{w[0]}-{w[1]}"},
        )
        for m, hw, tp in configs
        for w in (WINDOWS[:1] if tiny else WINDOWS)
    ]


def target_rate(row: Any, cap: list[str]) -> float:
    """The window's own request rate times ``SPEEDUP``."""
    from forge.capacity.search import RateKnob
    from forge.config import compose_config

    lo, hi = (int(x) for x in str(row["window"]).split("-"))
    knob = RateKnob(compose_config([*BASE, *window_overrides((lo, hi)), *cap]))
    assert knob.trace_rate is not None
    return knob.trace_rate * SPEEDUP


def check(row: Any, replicas: int, cap: list[str]) -> float:
    """SLO attainment of the window at the target rate on ``replicas`` replicas (least outstanding)."""
    from forge.capacity.search import SLO, RateKnob, probe
    from forge.config import compose_config

    lo, hi = (int(x) for x in str(row["window"]).split("-"))
    overrides = [
        *config_overrides(row["model"], row["hardware"], int(row["tp"])),
        *window_overrides((lo, hi)),
        *cap,
        f"cluster.replicas={replicas}",
        "router=least_outstanding",
    ]
    knob = RateKnob(compose_config(overrides))
    return probe(overrides, knob, float(row["target_rate"]), SLO(TTFT_S, TPOT_S)).attainment


def fewest(row: Any, estimate: int, cap: list[str]) -> tuple[int, float, float]:
    """(the fewest replicas that meet the SLO at the target rate, counting down from ``estimate``; the
    attainment there; the attainment with one fewer, nan for one replica)."""
    n, met = estimate, check(row, estimate, cap)
    while met >= 0.9 and n > 1:
        below = check(row, n - 1, cap)
        if below < 0.9:
            return n, met, below
        n, met = n - 1, below
    return n, met, float("nan")


def needed(df: pd.DataFrame, size: str) -> pd.DataFrame:
    cap = ["workload.max_requests=200"] if size == "tiny" else []
    df = df.copy()
    df["target_rate"] = [target_rate(r, cap) for _, r in df.iterrows()]
    df["estimate"] = [max(1, math.ceil(t / r)) for t, r in zip(df["target_rate"], df["rate"], strict=True)]
    found = [fewest(r, int(r["estimate"]), cap) for _, r in df.iterrows()]
    df["replicas"] = [f[0] for f in found]
    df["attainment_at_n"] = [f[1] for f in found]
    df["attainment_at_n_minus_1"] = [f[2] for f in found]
    df["gpus_estimate"] = df["estimate"] * df["tp"]
    df["gpus_needed"] = df["replicas"] * df["tp"]
    return df


def run(out: Path, size: str) -> None:
    write_report(needed(run_searches(jobs(size)), size), out)


def interpretation(agg: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    out = []
    best = agg.iloc[int(agg["gpus_needed"].to_numpy().argmin())]
    out.append(
        f"Fewest GPUs: {best['model']} on {best['hardware'].upper()} at TP{int(best['tp'])}, "
        f"{ci(best, 'gpus_needed')} GPUs for the trace at {SPEEDUP}x its rate "
        f"(per-replica capacity {ci(best, 'rate')} req/s)."
    )
    for model, g in agg.groupby("model", sort=False):
        rows = {(r["hardware"], int(r["tp"])): r for _, r in g.iterrows()}
        if ("a100", 1) in rows and ("h100", 1) in rows:
            ratio = rows[("h100", 1)]["rate"] / rows[("a100", 1)]["rate"]
            out.append(f"{model}: one H100 carries {ratio:.2f}x an A100's load within the SLO (TP1).")
        if ("h100", 1) in rows and ("h100", 2) in rows:
            per_gpu = rows[("h100", 2)]["rate"] / 2 / rows[("h100", 1)]["rate"]
            out.append(
                f"{model} on H100: a TP2 replica carries {per_gpu:.2f}x a TP1 replica's load per GPU "
                "(TP halves each GPU's weight reads and FLOPs but adds all-reduces; above 1 it needs fewer GPUs)."
            )
    fewer = int((df["replicas"] < df["estimate"]).sum())
    out.append(
        f"The replica count is checked by running each window at the target rate: counting down from "
        f"ceil(target / one replica's capacity), the fewest replicas that still meet the SLO; in {fewer} of {len(df)} "
        "windows that is fewer than the estimate: requests spread over several replicas queue less than the same "
        "load per replica on one (statistical multiplexing), so the estimate from one replica is an upper bound. "
        "`attainment_at_n_minus_1` is the miss with one replica fewer (nan: one replica suffices)."
    )
    return out


def write_report(df: pd.DataFrame, out: Path) -> None:
    metrics = ["rate", "gpus_estimate", "gpus_needed", "attainment_at_n"]
    agg = aggregate(df, KEYS, metrics)
    write_results(out, agg)
    df.to_csv(out / "results_per_window.csv", index=False)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = [f"{r['model']}\n{r['hardware'].upper()} TP{int(r['tp'])}" for _, r in agg.iterrows()]
    ax.bar(labels, agg["gpus_needed"], yerr=agg["gpus_needed_ci95"].fillna(0))
    ax.set_ylabel("GPUs needed")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(
        f"GPUs for Azure conv at {SPEEDUP}x, TTFT <= {TTFT_S:g} s and TPOT <= {TPOT_S * 1e3:g} ms for 90%", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(out / "gpus.png", dpi=110)
    plt.close(fig)
    cols = [
        "model",
        "hardware",
        "tp",
        "window",
        "rate",
        "target_rate",
        "replicas",
        "gpus_needed",
        "attainment_at_n",
        "attainment_at_n_minus_1",
    ]
    write_readme(
        out,
        "GPUs needed for a production trace under an SLO",
        f"Azure LLM inference trace 2023 (conversation), replayed at {SPEEDUP}x its rate "
        f"(`workload.time_scale={1 / SPEEDUP:g}`), must see >= 90% of requests with TTFT <= {TTFT_S:g} s and TPOT <= "
        f"{TPOT_S * 1e3:g} ms. Per configuration (`model=synthetic clock=simulated clock.model=M clock.hardware=H "
        "clock.tensor_parallel=TP`, operators cost model, 4,096-token context: longer prompts skipped): one replica's "
        "capacity by `forge.capacity.search` (bisection to 5%), the estimate ceil(target rate / capacity) replicas, "
        "then the check: the window at the target rate on that many replicas behind least_outstanding, and on one "
        "fewer while that still meets the SLO; GPUs = the fewest replicas that meet it x TP. Three 5-minute windows "
        "of the trace (0-300, 1,200-1,500, 2,400-2,700 s) are the "
        "replicates; a cell is the mean ± the half-width of the 95% confidence interval over them (Student's t).",
        [
            "![gpus](gpus.png)",
            "",
            *interpretation_and_results(interpretation(agg, df), ci_table(agg, KEYS, metrics)),
            "## Per window",
            "",
            table(df, cols),
            "",
        ],
    )
