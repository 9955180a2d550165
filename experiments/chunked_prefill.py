"""Chunked prefill (Sarathi-Serve, Agrawal et al. OSDI'24): TTFT vs P99 time between tokens across
chunk sizes (engine.max_num_batched_tokens) and policies; Llama-3-8B on a simulated H100."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.common import available_policies, header, provenance, run_grid, table
from experiments.plots import lines

POLICIES = ("fcfs", "sarathi", "decode_first", "prefill_first")
CHUNKS = (256, 512, 1024, 2048, 4096)


def run(out: Path, size: str) -> None:
    n, rate = {"tiny": (20, 20.0), "small": (300, 20.0)}[size]
    chunks = CHUNKS if size == "small" else (256, 2048)
    policies = available_policies(POLICIES)
    base = [
        "model=synthetic",
        "model.dims=llama-3-8b",
        "clock=simulated",
        "clock.hardware=h100",
        "workload=sharegpt",
        f"workload.num_requests={n}",
        f"workload.arrivals.rate={rate}",
        "engine.max_num_seqs=256",
        "engine.enable_chunked_prefill=true",
    ]
    points = [[f"scheduler={p}", f"engine.max_num_batched_tokens={c}"] for p in policies for c in chunks]
    df = run_grid("chunked_prefill", base, points)
    df = df.rename(columns={"engine.max_num_batched_tokens": "chunk"}).sort_values(["scheduler", "chunk"])
    out.mkdir(parents=True, exist_ok=True)
    cols = [
        "scheduler",
        "chunk",
        "p50_ttft_ms",
        "p90_ttft_ms",
        "p99_itl_ms",
        "mean_tpot_ms",
        "goodput",
        "request_throughput",
        "num_preemptions",
    ]
    df[cols].to_csv(out / "results.csv", index=False)
    fig, ax = plt.subplots(figsize=(7, 5))
    for pol, g in df.groupby("scheduler"):
        ax.plot(g["p99_itl_ms"], g["p90_ttft_ms"], marker="o", label=pol)
        for _, r in g.iterrows():
            ax.annotate(str(r["chunk"]), (r["p99_itl_ms"], r["p90_ttft_ms"]), fontsize=7)
    ax.set_xlabel("P99 time between tokens (ms)")
    ax.set_ylabel("P90 TTFT (ms)")
    ax.set_title("TTFT vs TBT tail, labels = chunk size (tokens per step)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "ttft_vs_tbt.png", dpi=100)
    plt.close(fig)
    lines(
        df,
        "chunk",
        "chunk size = max_num_batched_tokens",
        ["scheduler"],
        [("p90_ttft_ms", "P90 TTFT (ms)"), ("p99_itl_ms", "P99 TBT (ms)"), ("goodput", "goodput (req/s)")],
        "Chunk size sweep",
        out / "vs_chunk.png",
        logx=True,
    )
    missing = sorted(set(POLICIES) - set(policies))
    lines_md = header(
        "Chunked prefill: TTFT vs P99 time between tokens",
        f"ShareGPT-like workload ({n} requests, Poisson {rate:g} req/s), synthetic model charged as Llama-3-8B "
        "on a simulated H100 (roofline), max_num_seqs 256; chunk size = engine.max_num_batched_tokens. "
        f"Policies: {', '.join(policies)}"
        + (f" (not yet in conf/scheduler/: {', '.join(missing)})" if missing else "")
        + ". Goodput SLO: TTFT <= 2 s, per-request P99 TBT <= 200 ms.",
        prov := provenance(),
    )
    del prov
    lines_md += ["![ttft vs tbt](ttft_vs_tbt.png)", "", "![vs chunk](vs_chunk.png)", "", table(df, cols), ""]
    (out / "README.md").write_text("\n".join(lines_md))
