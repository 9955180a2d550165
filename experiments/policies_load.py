"""Policies under load: TTFT / TPOT / goodput vs request rate for every scheduling policy, Poisson vs
bursty (gamma, burstiness 0.25) arrivals; ShareGPT-like, Llama-3-8B on a simulated H100."""

from __future__ import annotations

from pathlib import Path

from experiments.common import available_policies, header, provenance, run_grid, table
from experiments.plots import lines

POLICIES = ("fcfs", "priority", "sjf", "decode_first", "prefill_first", "sarathi", "lpm")
ARRIVALS = {
    "poisson": ["workload.arrivals._target_=forge.workload.Poisson"],
    "bursty": ["workload.arrivals._target_=forge.workload.Gamma", "+workload.arrivals.burstiness=0.25"],
}


def run(out: Path, size: str) -> None:
    n, rates = {"tiny": (20, (4, 16)), "small": (200, (2, 4, 8, 16, 32))}[size]
    policies = available_policies(POLICIES)
    base = [
        "model=synthetic",
        "model.dims=llama-3-8b",
        "clock=simulated",
        "clock.hardware=h100",
        "workload=sharegpt",
        f"workload.num_requests={n}",
        "workload.num_priorities=4",
        "engine.max_num_seqs=128",
        "engine.max_num_batched_tokens=1024",
    ]
    points, labels = [], []
    for p in policies:
        for arr, ov in ARRIVALS.items():
            for r in rates:
                points.append([f"scheduler={p}", *ov, f"workload.arrivals.rate={r}"])
                labels.append(arr)
    df = run_grid("policies_load", base, points)
    df = df.sort_values("run").reset_index(drop=True)
    df["arrivals"] = labels
    df = df.rename(columns={"workload.arrivals.rate": "rate"})
    out.mkdir(parents=True, exist_ok=True)
    cols = [
        "scheduler",
        "arrivals",
        "rate",
        "p50_ttft_ms",
        "p90_ttft_ms",
        "mean_tpot_ms",
        "p99_itl_ms",
        "goodput",
        "slo_attainment",
        "num_preemptions",
    ]
    df[cols].to_csv(out / "results.csv", index=False)
    metrics = [("p90_ttft_ms", "P90 TTFT (ms)"), ("mean_tpot_ms", "mean TPOT (ms)"), ("goodput", "goodput (req/s)")]
    for arr in ARRIVALS:
        lines(
            df[df["arrivals"] == arr],
            "rate",
            "request rate (req/s)",
            ["scheduler"],
            metrics,
            f"{arr} arrivals",
            out / f"{arr}.png",
            logx=True,
        )
    missing = sorted(set(POLICIES) - set(policies))
    md = header(
        "Policies under load: Poisson vs bursty arrivals",
        f"ShareGPT-like workload ({n} requests per point, 4 priority levels drawn uniformly), synthetic model "
        "charged as Llama-3-8B on a simulated H100, max_num_seqs 128, 1024 tokens per step. Bursty = gamma "
        "inter-arrivals with shape 0.25 (same mean rate). Goodput SLO: TTFT <= 2 s, per-request P99 TBT <= 200 ms. "
        f"Policies: {', '.join(policies)}"
        + (f" (not yet in conf/scheduler/: {', '.join(missing)})" if missing else "")
        + ".",
        provenance(),
    )
    md += ["## Poisson", "![poisson](poisson.png)", "", "## Bursty", "![bursty](bursty.png)", "", table(df, cols), ""]
    (out / "README.md").write_text("\n".join(md))
