"""What the KV memory levers buy at a fixed memory budget (issue 19): int8 / fp8 KV caches against
the model's own dtype (simulated Llama-3-8B on an H100; SmolLM2 computed for real on this CPU), the
sliding-window block freeing on and off (Gemma-3, ``experiments.window_memory.window_rows``) and the
accuracy each quantized cache costs (``experiments.kv_accuracy.measure``). The fixed-budget runs repeat
with each of ``experiments.seeds.SEEDS`` (the workload's draws) and report the mean ± 95% CI; the
window and accuracy sections are deterministic (fixed prompts, greedy tokens) and run once."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.common import section, table, write_readme, write_results
from experiments.kv_memory_accuracy import accuracy_notes, accuracy_section, accuracy_table
from experiments.seeds import SEEDS, aggregate, ci
from experiments.window_memory import window_rows
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.models.base import Model
from forge.results.metrics import summarize

BLOCK_SIZE = 16
SIM_BUDGET_GIB = 2.0  # simulated: engine.kv_cache_memory_gib, sized in the preset's bytes per token of each dtype
SIM_DTYPES = ("auto", "fp8", "int8")
REAL_DTYPES = ("auto", "int8", "fp8")  # auto: SmolLM2's float32


def sim_overrides(size: str) -> list[str]:
    n, rate = {"tiny": (12, 8.0), "small": (200, 24.0)}[size]
    return [
        "model=synthetic",
        "clock=simulated",
        "clock.hardware=h100",
        "clock.model=llama-3-8b",
        "workload=sharegpt",
        f"workload.num_requests={n}",
        f"workload.arrivals.rate={rate}",
        f"kvcache.block_size={BLOCK_SIZE}",
        "engine.max_num_seqs=256",
        "engine.max_num_batched_tokens=2048",
        "kvcache.num_blocks=auto",
        f"engine.kv_cache_memory_gib={SIM_BUDGET_GIB}",
    ]


def real_overrides(size: str) -> tuple[list[str], str]:
    """The real model's runs and the budget's description: SmolLM2 (``tiny``: the tiny model) on this
    CPU, ShareGPT-like lengths scaled down (short outputs), all arriving within a second."""
    model, n, gib = {"tiny": ("tiny", 6, 0.0004), "small": ("smollm2", 24, 0.02)}[size]
    return [
        f"model={model}",
        "clock=wall",
        "backend.num_threads=1",
        "workload=sharegpt",
        f"workload.num_requests={n}",
        "workload.arrivals.rate=50.0",
        "workload.input_len.mean=96",
        "workload.input_len.high=256",
        "workload.output_len.mean=24",
        "workload.output_len.high=48",
        f"kvcache.block_size={BLOCK_SIZE}",
        "kvcache.num_blocks=auto",
        f"engine.kv_cache_memory_gib={gib}",
        "engine.max_num_seqs=32",
    ], f"engine.kv_cache_memory_gib={gib} ({gib * 1024:.1f} MiB)"


def run_engine(overrides: Sequence[str], model: Model | None = None) -> tuple[dict[str, Any], Model]:
    """One offline run: the pool's size, the most sequences one step ran, the summary's headline
    numbers and the CPU seconds the run took (the model reused when given)."""
    cfg = compose_config([*overrides, "progress=false", "report=false"])
    engine = build_engine(cfg, model=model)
    try:
        requests = workload_requests(cfg, engine)
        cpu0 = time.process_time()
        engine.run(requests, progress=False)
        cpu = time.process_time() - cpu0
        steps = engine.recorder.steps_frame()
        kv = engine.scheduler.kv
        summary = summarize(engine.recorder.requests_frame(), steps, dict(kv.stats()))
        row = {
            "pool_blocks": kv.num_blocks,
            "pool_tokens": kv.num_blocks * kv.block_size,
            "max_batch": int(steps["num_seqs"].max()),
            "cpu_s": cpu,
        }
        keys = ("mean_batch_size", "num_preemptions", "output_throughput", "mean_ttft_ms", "p90_ttft_ms")
        row |= {k: summary[k] for k in (*keys, "mean_tpot_ms", "duration_s")}
        return row, engine.runner.model
    finally:
        engine.close()


def seeded_rows(setup: str, overrides: Sequence[str], dtypes: Sequence[str], reuse_model: bool) -> pd.DataFrame:
    """Each dtype once per seed of ``SEEDS`` (``seed=S``: the workload's draws), the seeds outermost so
    that a wall clock's load drift reaches every dtype alike; the real model is loaded once when
    ``reuse_model`` (the synthetic one draws its tokens from the seed it was built with)."""
    rows, model = [], None
    for seed in SEEDS:
        for name in dtypes:
            row, built = run_engine([*overrides, f"seed={seed}", f"engine.kv_cache_dtype={name}"], model)
            model = built if reuse_model else None
            rows.append({"setup": setup, "kv_cache_dtype": name, "seed": seed, **row})
    return pd.DataFrame(rows)


def simulated_rows(size: str) -> pd.DataFrame:
    """Llama-3-8B on an H100 (simulated) at ``SIM_BUDGET_GIB`` of KV memory in each dtype."""
    return seeded_rows("sim llama-3-8b h100", sim_overrides(size), SIM_DTYPES, reuse_model=False)


def real_rows(size: str) -> tuple[pd.DataFrame, str]:
    overrides, budget = real_overrides(size)
    setup = f"real {overrides[0].split('=')[1]} cpu"
    return seeded_rows(setup, overrides, REAL_DTYPES, reuse_model=True), budget


def window_table(size: str) -> tuple[pd.DataFrame, str]:
    if size == "tiny":  # the tiny model has no windows: a smoke test of the call (both rows alike)
        overrides, context = ["model=tiny", "engine.max_model_len=4096"], 256
    else:
        overrides, context = ["model=gemma3", "model.max_position=4096", "engine.max_model_len=4096"], 1024
    overrides += ["engine.max_num_batched_tokens=512", "kvcache.num_blocks=512"]
    rows = window_rows(overrides, context, 40 if size == "small" else 8)
    df = pd.DataFrame(rows).drop(columns=["tokens"])
    return df, f"{context} prompt tokens, `{' '.join(overrides)}`"


KEYS = ["setup", "kv_cache_dtype"]
FMT = {"pool_blocks": ".0f", "pool_tokens": ".0f", "max_batch": ".1f", "mean_batch_size": ".1f"}
FMT |= {"num_preemptions": ".1f", "output_throughput": ".1f", "mean_ttft_ms": ".1f", "p90_ttft_ms": ".1f"}
FMT |= {"mean_tpot_ms": ".2f", "duration_s": ".2f"}
METRICS = [*FMT, "cpu_s"]
EQUAL_BY_CONSTRUCTION = "fp8 (= int8 by construction: same bytes per value)"


def cell(row: Any, metric: str) -> str:
    """An ``aggregate`` row's metric as "mean ± 95% half-width", or the value alone when every seed
    gave the same."""
    c = ci(row, metric)
    spec = FMT.get(metric, ".2f")
    return format(c.mean, spec) if not c.half_width > 0 else f"{c.mean:{spec}} ± {c.half_width:{spec}}"


def vs(a: Any, b: Any, metric: str) -> str:
    """Two rows' metric as "a vs b", marked when the two 95% intervals overlap (no difference shown)."""
    x, y = ci(a, metric), ci(b, metric)
    if x == y and not x.half_width > 0:
        return f"{cell(a, metric)} in both"
    text = f"{cell(a, metric)} vs {cell(b, metric)}"
    return text if not x.overlaps(y) else text + " (95% intervals overlap)"


def seeds_table(agg: pd.DataFrame) -> str:
    """The fixed-budget table: mean ± 95% CI per configuration, the simulated fp8 row marked as equal
    to int8 by construction."""
    lines = ["| " + " | ".join([*KEYS, *FMT]) + " |", "|" + "---|" * (len(KEYS) + len(FMT))]
    for _, r in agg.iterrows():
        dtype = str(r["kv_cache_dtype"])
        if str(r["setup"]).startswith("sim") and dtype == "fp8":
            dtype = EQUAL_BY_CONSTRUCTION
        lines.append("| " + " | ".join([str(r["setup"]), dtype, *(cell(r, m) for m in FMT)]) + " |")
    return "\n".join(lines)


def sim_fp8_equals_int8(per_seed: pd.DataFrame) -> bool:
    """Whether the simulated fp8 and int8 runs agree in every seed on everything but CPU seconds."""
    sim = per_seed[per_seed["setup"].str.startswith("sim")]
    fp8, int8 = (
        sim[sim["kv_cache_dtype"] == d].drop(columns=["kv_cache_dtype", "cpu_s"]).reset_index(drop=True)
        for d in ("fp8", "int8")
    )
    return len(fp8) > 0 and fp8.equals(int8)


def fmt_load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.1f}" for x in load)


def interpretation(agg: pd.DataFrame, per_seed: pd.DataFrame) -> list[str]:
    """The fixed-budget findings, each as mean ± 95% CI over the seeds."""
    rows = {(str(r["setup"]).split()[0], str(r["kv_cache_dtype"])): r for _, r in agg.iterrows()}
    f16, q8 = rows["sim", "auto"], rows["sim", "int8"]
    r32, r8, rf8 = rows["real", "auto"], rows["real", "int8"], rows["real", "fp8"]
    real = str(r32["setup"])
    same = "identical in every seed, as checked in this run" if sim_fp8_equals_int8(per_seed) else "NOT identical"
    return [
        f"- Simulated Llama-3-8B at {SIM_BUDGET_GIB} GiB, int8/fp8 vs 16-bit: pool {vs(q8, f16, 'pool_tokens')} "
        f"tokens ({q8['pool_tokens'] / f16['pool_tokens']:.2f}x); max batch {vs(q8, f16, 'max_batch')}; mean "
        f"batch {vs(q8, f16, 'mean_batch_size')}; preemptions {vs(q8, f16, 'num_preemptions')}; output throughput "
        f"{vs(q8, f16, 'output_throughput')} tok/s; mean TTFT {vs(q8, f16, 'mean_ttft_ms')} ms.",
        "- The simulated fp8 and int8 rows are equal by construction, not two measurements that agree: both "
        "store one byte per value plus the same per-token scale, so the budget buys the same blocks and the "
        f"simulated clock charges the same bytes ({same}). Only the real model tells the two formats apart.",
        f"- {real}, int8 vs float32: pool {vs(r8, r32, 'pool_tokens')} tokens "
        f"({r8['pool_tokens'] / r32['pool_tokens']:.2f}x), max batch {vs(r8, r32, 'max_batch')}, preemptions "
        f"{vs(r8, r32, 'num_preemptions')}; on the wall clock output throughput "
        f"{vs(r8, r32, 'output_throughput')} tok/s, mean TPOT {vs(r8, r32, 'mean_tpot_ms')} ms. fp8 holds the "
        f"same pool as int8 (same bytes per value); on the wall clock, mean TPOT "
        f"{vs(rf8, r8, 'mean_tpot_ms')} ms, output throughput {vs(rf8, r8, 'output_throughput')} tok/s (fp8 vs "
        "int8).",
    ]


def setup_lines(size: str, budget: str, loads: tuple[tuple[float, float, float], ...]) -> list[str]:
    return [
        f"- simulated: `{' '.join(sim_overrides(size))}`, `engine.kv_cache_dtype` auto (the preset's "
        f"16-bit values) / fp8 / int8: `kvcache.num_blocks=auto` sizes the pool from "
        f"`engine.kv_cache_memory_gib={SIM_BUDGET_GIB}` in the preset's KV bytes per token in that dtype "
        "(`ModelDims.kv_bytes_per_token`: one byte per value plus the per-token scale's share when "
        "quantized), not from the H100's 80 GB less the weights (many times this budget), so that "
        "memory binds at this rate. fp8 and int8 have the same bytes per value, so their simulated rows "
        "are equal by construction (marked in the table).",
        f"- real: `{' '.join(real_overrides(size)[0])}` at {budget}, `kvcache.num_blocks=auto` sizing "
        "the pool in each dtype's bytes (auto = the model's float32). Wall clock on a shared machine: "
        "TTFT, TPOT and throughput move with the load (below); each seed's three dtypes ran back to back. "
        "The block counts are what the budget decides (the same in every seed).",
        f"- Each fixed-budget configuration ran with seeds {', '.join(map(str, SEEDS))} (`seed=`: the workload's "
        "draws); a cell is the mean ± the half-width of its 95% confidence interval over the seeds (Student's t "
        "with n - 1 degrees of freedom); per-seed rows: `results_per_seed.csv`. A cell without ± was the same "
        "in every seed. The window and accuracy sections are deterministic "
        "(fixed prompts, greedy tokens) and ran once.",
        "- load average (1, 5, 15 min) before / after the fixed-budget runs / after the window and accuracy runs: "
        + " / ".join(fmt_load(x) for x in loads),
    ]


def run(out: Path, size: str) -> None:
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    real, budget = real_rows(size)
    per_seed = pd.concat([simulated_rows(size), real], ignore_index=True)
    load1 = os.getloadavg()
    window, window_setup = window_table(size)
    acc_cpu0 = time.process_time()
    acc, acc_setup, with_llama = accuracy_table(size)
    acc_cpu = time.process_time() - acc_cpu0
    load2 = os.getloadavg()
    agg = aggregate(per_seed, KEYS, METRICS)
    write_results(out, agg)
    per_seed.to_csv(out / "results_per_seed.csv", index=False)
    window.to_csv(out / "window.csv", index=False)
    acc.to_csv(out / "accuracy.csv", index=False)
    win_cols = ["free_outside_window", "layout", "pool_pages", "page_kib", "peak_pages_held", "peak_kv_mib"]
    win_cols += ["last_pages_held", "last_kv_mib", "token_capacity", "same_tokens_as_off"]
    body = [
        *section("Setup", setup_lines(size, budget, (load0, load1, load2))),
        *section("Interpretation", [*interpretation(agg, per_seed), *accuracy_notes(acc, with_llama, acc_cpu)]),
        *section("Quantized KV at a fixed budget (mean ± 95% CI over seeds)", [seeds_table(agg)]),
        *section(
            "Sliding-window freeing (window_rows)",
            [
                f"One greedy request, {window_setup}; pages are counts. One run each: a fixed prompt and "
                "greedy tokens, deterministic (no seeds).",
                "",
                table(window, win_cols, {"page_kib": ".1f", "peak_kv_mib": ".1f", "last_kv_mib": ".1f"}),
            ],
        ),
        *accuracy_section(acc, acc_setup),
    ]
    write_readme(out, "KV memory: int8 / fp8 caches and sliding-window freeing", __doc__.replace("\n", " "), body)
