"""Simulator fidelity (issue 16): forge's default simulated clock with the ``vllm_v0`` policy against
Vidur's figures for the same configurations (Llama-2-7B, A100-80GB, TP1, max 128 seqs, 4,096-token
budget, block 16, 7,424 KV blocks, no chunked prefill; Vidur's ``vllm`` scheduler), the per-shape
step times against Vidur's predictions, the same workloads on the H100 preset and with ShareGPT-like
lengths (forge only: no Vidur figure), and the CPU time of the 10,000-request trace."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.common import section, table, write_readme, write_results

LIMITS = [
    "model=synthetic",
    "clock=simulated",
    "clock.model=llama-2-7b",
    "scheduler=vllm_v0",
    "engine.max_num_seqs=128",
    "engine.max_num_batched_tokens=4096",
    "engine.enable_chunked_prefill=false",
    "engine.max_model_len=4096",
    "kvcache.num_blocks=7424",
    "kvcache.block_size=16",
]
POISSON = "workload.arrivals._target_=forge.workloads.synthetic.Poisson"


def fixed(n: int, prompt: int, output: int, rate: float | None = None) -> list[str]:
    ov = ["workload=fixed", f"workload.num_requests={n}", f"workload.input_len.value={prompt}"]
    ov.append(f"workload.output_len.value={output}")
    return ov if rate is None else [*ov, POISSON, f"+workload.arrivals.rate={rate}"]


# issue 16's Vidur figures: duration s, TTFT mean/p90, TPOT mean/p90, E2E mean/p90 (ms), req/s
METRICS: tuple[str, ...] = ("duration_s", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "p90_tpot_ms")
METRICS += ("mean_e2e_ms", "p90_e2e_ms", "request_throughput")
WORKLOADS: dict[str, tuple[list[str], tuple[float, ...]]] = {
    "200 x 512/128 at t=0": (fixed(200, 512, 128), (14.28, 5137, 10670, 44.1, 62.4, 10740, 14280, 14.01)),
    "Poisson 6/s, 300 x 512/128": (fixed(300, 512, 128, 6.0), (49.0, 49.8, 73.4, 16.0, 18.0, 2081, 2346, 6.12)),
    "200 x 2048/32 at t=0": (fixed(200, 2048, 32), (35.75, 17280, 31930, 168.9, 287.4, 22510, 35750, 5.60)),
    "Poisson 3/s, 300 x 2048/32": (fixed(300, 2048, 32, 3.0), (95.5, 262.5, 440.8, 29.5, 54.0, 1178, 2117, 3.14)),
    "Poisson 10/s, 10,000 x 512/128": (
        fixed(10000, 512, 128, 10.0),
        (949.8, 60.9, 96.0, 29.1, 35.8, 3758, 4620, 10.53),
    ),
}
# Vidur's single-step predictions (ms), issue 16: (kind, requests, tokens or context) -> ms
STEPS = {
    ("decode", 1, 512): 9.46,
    ("decode", 8, 1024): 13.23,
    ("decode", 128, 128): 21.08,
    ("decode", 128, 576): 32.85,
    ("decode", 128, 2048): 81.01,
    ("prefill", 1, 128): 13.29,
    ("prefill", 1, 512): 36.87,
    ("prefill", 1, 2048): 159.0,
    ("prefill", 8, 512): 274.7,
    ("prefill", 1, 4096): None,
}
SHAREGPT = ["workload=sharegpt", "workload.num_requests=1000", "workload.arrivals.rate=4.0"]


NOTES = (
    "Both cost models charge GPU time only, as Vidur does by default (`skip_cpu_overhead_modeling`); the"
    " operator model's constants (conf/hardware/a100.yaml) come from the A100 datasheet, Vidur's published MLP"
    " and NCCL profiles and the shape of its attention profiles, not from the step times or results above.",
    "forge draws its own Poisson arrivals (seed 0), Vidur drew its own: under these loads duration and"
    " throughput follow the arrivals, and tail latencies of a 300-request run move by several percent with"
    " the sample alone.",
    "Fixed batches at t=0 (long prefill queues, decode batches at the 128 cap) match within 3%. The Poisson"
    " workloads fall short on TTFT p90 (0.80-0.93) and, for the 10,000-request trace, TPOT/E2E (0.82-0.85):"
    " they decode in batches of ~10-40 requests, where Vidur's decode attention (a random forest over its"
    " measured points) is slower than a bandwidth model gives (decode 8 @ctx 1024: 0.88). The operator model"
    " has no batch-size (occupancy) term for decode attention; one fitted to these rows would close the gap"
    " but would be a fit, which issue 16 rules out.",
    "H100 rows have no Vidur reference; the H100 attention fractions are assumed equal to the A100's.",
)


def simulate(overrides: list[str]) -> dict[str, Any]:
    """One run in this process: its summary metrics and the CPU seconds of build + run + summary."""
    from forge.config import compose_config
    from forge.engine.build import build_engine, workload_requests
    from forge.results.metrics import summarize

    cpu = time.process_time()
    cfg = compose_config([*overrides, "progress=false", "report=false"])
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    rec = engine.recorder
    summary = summarize(rec.requests_frame(), rec.steps_frame(), dict(engine.scheduler.kv.stats()))
    return {**summary, "cpu_s": time.process_time() - cpu}


def step_times(hardware: str) -> pd.DataFrame:
    from forge.models.presets import model_dims
    from forge.sim.clock import BatchShape, SimulatedClock

    dims = model_dims("llama-2-7b")
    clocks = {}
    for cost in ("operators", "roofline"):
        clock = SimulatedClock(hardware, "llama-2-7b", cost=cost)
        clock.bind(dims)
        clocks[cost] = clock.cost_model
    rows = []
    for (kind, n, size), vidur in STEPS.items():
        shape = BatchShape([1] * n, [size] * n, n) if kind == "decode" else BatchShape([size] * n, [size] * n, n)
        label = f"decode {n} @ctx {size}" if kind == "decode" else f"prefill {n} x {size}"
        vidur = vidur if hardware == "a100" else None  # Vidur's figures are for the A100
        row: dict[str, Any] = {"hardware": hardware, "step": label, "vidur_ms": vidur}
        for cost, model in clocks.items():
            row[f"{cost}_ms"] = 1e3 * model.step_time(shape)
            row[f"{cost}_ratio"] = row[f"{cost}_ms"] / vidur if vidur else None
        rows.append(row)
    return pd.DataFrame(rows)


def run(out: Path, size: str) -> None:
    tiny = size == "tiny"
    workloads = dict(list(WORKLOADS.items())[:2]) if tiny else WORKLOADS
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for name, (overrides, vidur) in workloads.items():
        if tiny:
            overrides = [
                o.replace("num_requests=200", "num_requests=20").replace("num_requests=300", "num_requests=30")
                for o in overrides
            ]
        for hardware, cost in (("a100", "operators"), ("a100", "roofline"), ("h100", "operators")):
            if tiny and (hardware, cost) != ("a100", "operators"):
                continue
            res = simulate([*LIMITS, f"clock.hardware={hardware}", f"clock.cost={cost}", *overrides])
            row = {"workload": name, "hardware": hardware, "cost": cost, "cpu_s": res["cpu_s"]}
            for m, v in zip(METRICS, vidur, strict=True):
                row[m] = res[m]
                row[f"vidur_{m}"] = v if hardware == "a100" else None
                row[f"ratio_{m}"] = res[m] / v if hardware == "a100" else None
            rows.append(row)
            print(f"{name} {hardware} {cost}: cpu {res['cpu_s']:.1f} s", flush=True)
    if not tiny:
        for hardware in ("a100", "h100"):
            res = simulate([*LIMITS, f"clock.hardware={hardware}", *SHAREGPT])
            rows.append(
                {
                    "workload": "ShareGPT-like, Poisson 4/s, 1,000",
                    "hardware": hardware,
                    "cost": "operators",
                    "cpu_s": res["cpu_s"],
                    **{m: res[m] for m in METRICS},
                }
            )
    load_after = os.getloadavg()
    df = pd.DataFrame(rows)
    steps = pd.concat([step_times("a100"), step_times("h100")], ignore_index=True)
    write_results(out, df)
    steps.to_csv(out / "step_times.csv", index=False)
    write_readme(
        out, "Simulator fidelity against Vidur", __doc__.split("\n\n")[0], body(df, steps, load_before, load_after)
    )


def body(df: pd.DataFrame, steps: pd.DataFrame, load_before: Any, load_after: Any) -> list[str]:
    fmt = {m: ".1f" for m in METRICS} | {"duration_s": ".2f", "request_throughput": ".2f"}
    a100 = df[(df["hardware"] == "a100") & df["vidur_duration_s"].notna()]
    lines: list[str] = []
    for cost in ("operators", "roofline"):
        sub = a100[a100["cost"] == cost]
        if sub.empty:
            continue
        ratios = sub[[f"ratio_{m}" for m in METRICS]]
        worst = float((ratios - 1).abs().max().max())
        within = int(((ratios - 1).abs() <= 0.10).sum().sum())
        label = "default" if cost == "operators" else "the previous default"
        lines += section(
            f"forge ÷ Vidur, A100, clock.cost={cost} ({label})",
            [
                f"{within} of {ratios.size} metrics within 10% of Vidur's; the furthest is {worst:.0%} off.",
                "",
                table(
                    sub.rename(
                        columns={f"ratio_{m}": m.replace("_ms", "").replace("request_", "") + " ÷" for m in METRICS}
                    ),
                    ["workload", *(m.replace("_ms", "").replace("request_", "") + " ÷" for m in METRICS)],
                    {m.replace("_ms", "").replace("request_", "") + " ÷": ".2f" for m in METRICS},
                ),
            ],
        )
    lines += section(
        "Absolute figures (forge, every preset; Vidur's in results.csv)",
        [table(df, ["workload", "hardware", "cost", *METRICS, "cpu_s"], fmt | {"cpu_s": ".1f"})],
    )
    lines += section(
        "Per-shape step time (ms): forge's cost models vs Vidur's predictions",
        [
            "Llama-2-7B. Vidur's figures are the A100 ones quoted in issue 16 (none for H100 or a 4,096-token prompt).",
            "",
            table(
                steps,
                ["hardware", "step", "vidur_ms", "operators_ms", "operators_ratio", "roofline_ms", "roofline_ratio"],
                {
                    "vidur_ms": ".2f",
                    "operators_ms": ".2f",
                    "operators_ratio": ".2f",
                    "roofline_ms": ".2f",
                    "roofline_ratio": ".2f",
                },
            ),
        ],
    )
    lines += section("Interpretation", [f"- {x}" for x in NOTES])
    big = df[df["workload"].str.startswith("Poisson 10/s") & (df["hardware"] == "a100") & (df["cost"] == "operators")]
    if not big.empty:
        lines += section(
            "Speed",
            [
                f"The 10,000-request Poisson 512/128 trace (A100, operators, vllm_v0): **{big['cpu_s'].iloc[0]:.1f} s"
                " of CPU** (build + simulate + summary, `time.process_time`, one process), load average before "
                f"{', '.join(f'{x:.2f}' for x in load_before)}, after {', '.join(f'{x:.2f}' for x in load_after)}"
                " (2 cores shared with other sessions). Issue 16's goal is <= 3 s (Vidur: 36 s CPU on this machine).",
            ],
        )
    return lines
