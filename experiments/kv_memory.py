"""What the KV memory levers buy at a fixed memory budget (issue 19): int8 / fp8 KV caches against
the model's own dtype (simulated Llama-3-8B on an H100; SmolLM2 computed for real on this CPU), the
sliding-window block freeing on and off (Gemma-3, ``experiments.window_memory.window_rows``) and the
accuracy each quantized cache costs (``experiments.kv_accuracy.measure``)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.common import section, table, write_readme, write_results
from experiments.kv_accuracy import SETUPS, KVAccuracy
from experiments.kv_accuracy import measure as measure_accuracy
from experiments.kv_accuracy_llama_cpp import llama_cpp_rows, llama_cpp_version
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


def simulated_rows(size: str) -> pd.DataFrame:
    """Llama-3-8B on an H100 (simulated) at ``SIM_BUDGET_GIB`` of KV memory in each dtype."""
    rows = []
    for name in SIM_DTYPES:
        row, _ = run_engine([*sim_overrides(size), f"engine.kv_cache_dtype={name}"])
        rows.append({"setup": "sim llama-3-8b h100", "kv_cache_dtype": name, **row})
    return pd.DataFrame(rows)


def real_rows(size: str) -> tuple[pd.DataFrame, str]:
    overrides, budget = real_overrides(size)
    rows, model = [], None
    for name in REAL_DTYPES:
        row, model = run_engine([*overrides, f"engine.kv_cache_dtype={name}"], model)
        rows.append({"setup": f"real {overrides[0].split('=')[1]} cpu", "kv_cache_dtype": name, **row})
    return pd.DataFrame(rows), budget


def window_table(size: str) -> tuple[pd.DataFrame, str]:
    if size == "tiny":  # the tiny model has no windows: a smoke test of the call (both rows alike)
        overrides, context = ["model=tiny", "engine.max_model_len=4096"], 256
    else:
        overrides, context = ["model=gemma3", "model.max_position=4096", "engine.max_model_len=4096"], 1024
    overrides += ["engine.max_num_batched_tokens=512", "kvcache.num_blocks=512"]
    rows = window_rows(overrides, context, 40 if size == "small" else 8)
    df = pd.DataFrame(rows).drop(columns=["tokens"])
    return df, f"{context} prompt tokens, `{' '.join(overrides)}`"


def accuracy_row(row: KVAccuracy) -> dict[str, Any]:
    return {
        "engine": row.engine,
        "kv_cache_dtype": row.kv_cache_dtype,
        "reference": row.reference,
        "greedy_agreement": f"{row.agreeing_tokens}/{row.total_tokens}" if row.agreeing_tokens >= 0 else "-",
        "agreement_pct": 100 * row.agreement,
        "mean_abs_dlogprob": row.mean_abs_dlogprob,
        "text_perplexity": row.perplexity,
        "text_mean_abs_dlogprob": row.text_mean_abs_dlogprob,
    }


def accuracy_table(size: str) -> tuple[pd.DataFrame, str, bool]:
    """forge's rows, and llama.cpp's on the same token ids when it can run (SmolLM2, llama-cpp-python
    installed; the tiny model has no GGUF); the table, its setup's description and whether llama.cpp ran."""
    setup = SETUPS[size]
    run = measure_accuracy(setup)
    rows = list(run.rows)
    with_llama = setup.model == "smollm2" and llama_cpp_version() is not None
    if with_llama:
        rows += llama_cpp_rows(setup, run.inputs, setup.num_prompts)
    described = (
        f"`experiments.kv_accuracy.SETUPS[{size!r}]`: model={setup.model}, {setup.num_prompts} prompts x "
        f"{setup.new_tokens} greedy tokens ({setup.prompt_tokens}-token prompts), perplexity text "
        f"{run.inputs.scored_tokens + len(run.inputs.windows)} tokens in {len(run.inputs.windows)} windows of "
        f"{setup.window} prefilled {setup.chunk} tokens per step"
    )
    return pd.DataFrame([accuracy_row(r) for r in rows]), described, with_llama


def accuracy_notes(acc: pd.DataFrame, with_llama: bool, cpu_s: float) -> list[str]:
    """The accuracy table's findings, from its rows."""
    forge = acc[acc["engine"] == "forge"]
    exact = forge.iloc[0]
    parts = [
        f"{r.kv_cache_dtype} {r.agreement_pct:.1f} % greedy agreement, text perplexity "
        f"{r.text_perplexity:.3f} (mean |Δlogprob| {r.text_mean_abs_dlogprob:.4f})"
        for r in forge.iloc[1:].itertuples()
    ]
    notes = [
        f"- Accuracy (forge, against its exact float32 cache, text perplexity {exact['text_perplexity']:.3f}): "
        + "; ".join(parts)
        + f". The accuracy section took {cpu_s:.0f} CPU s."
    ]
    if with_llama:
        f16, q8 = acc[acc["engine"] != "forge"].iloc[0], acc[acc["engine"] != "forge"].iloc[1]
        notes.append(
            f"- llama.cpp on the same GGUF and token ids: perplexity {f16['text_perplexity']:.3f} with its f16 "
            f"cache, {q8['text_perplexity']:.3f} with `-ctk q8_0 -ctv q8_0` (mean |Δlogprob| "
            f"{q8['text_mean_abs_dlogprob']:.4f}), greedy agreement {q8['agreement_pct']:.1f} % with its f16 "
            "cache; its continuations' logprobs are not read (nan). Each engine is compared with its own exact "
            "cache (llama.cpp computes with the Q4_1 weights in place, forge with them dequantized to float32)."
        )
    else:
        notes.append(
            "- llama.cpp's `-ctk q8_0 -ctv q8_0` is not run (tiny model: no GGUF; or llama-cpp-python missing)."
        )
    return notes


def fmt_load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.1f}" for x in load)


def run(out: Path, size: str) -> None:
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    sim = simulated_rows(size)
    real, budget = real_rows(size)
    window, window_setup = window_table(size)
    acc_cpu0 = time.process_time()
    acc, acc_setup, with_llama = accuracy_table(size)
    acc_cpu = time.process_time() - acc_cpu0
    load1 = os.getloadavg()
    df = pd.concat([sim, real], ignore_index=True)
    write_results(out, df)
    window.to_csv(out / "window.csv", index=False)
    acc.to_csv(out / "accuracy.csv", index=False)
    cols = ["setup", "kv_cache_dtype", "pool_blocks", "pool_tokens", "max_batch", "mean_batch_size"]
    cols += ["num_preemptions", "output_throughput", "mean_ttft_ms", "p90_ttft_ms", "mean_tpot_ms", "duration_s"]
    fmt = {"mean_batch_size": ".1f", "output_throughput": ".1f", "mean_ttft_ms": ".1f", "p90_ttft_ms": ".1f"}
    fmt |= {"mean_tpot_ms": ".2f", "duration_s": ".2f"}
    f16, q8 = sim.iloc[0], sim.iloc[-1]
    r32, r8 = real.iloc[0], real.iloc[1]
    acc_fmt = {"agreement_pct": ".1f", "mean_abs_dlogprob": ".4f", "text_perplexity": ".3f"}
    acc_fmt["text_mean_abs_dlogprob"] = ".4f"
    win_cols = ["free_outside_window", "layout", "pool_pages", "page_kib", "peak_pages_held", "peak_kv_mib"]
    win_cols += ["last_pages_held", "last_kv_mib", "token_capacity", "same_tokens_as_off"]
    body = [
        *section(
            "Setup",
            [
                f"- simulated: `{' '.join(sim_overrides(size))}`, `engine.kv_cache_dtype` auto (the preset's "
                f"16-bit values) / fp8 / int8: `kvcache.num_blocks=auto` sizes the pool from "
                f"`engine.kv_cache_memory_gib={SIM_BUDGET_GIB}` in the preset's KV bytes per token in that dtype "
                "(`ModelDims.kv_bytes_per_token`: one byte per value plus the per-token scale's share when "
                "quantized), not from the H100's 80 GB less the weights (many times this budget), so that "
                "memory binds at this rate. "
                "The simulated clock charges fp8 and int8 alike (one byte per value), so their rows are equal.",
                f"- real: `{' '.join(real_overrides(size)[0])}` at {budget}, `kvcache.num_blocks=auto` sizing "
                "the pool in each dtype's bytes (auto = the model's float32). Wall clock on a shared machine: "
                "TTFT, TPOT and throughput are noisy single runs (load average below); the block counts, "
                "batch sizes and preemptions are what the budget decides.",
                f"- load average (1, 5, 15 min) before / after: {fmt_load(load0)} / {fmt_load(load1)}",
            ],
        ),
        *section(
            "Interpretation",
            [
                f"- Simulated Llama-3-8B at {SIM_BUDGET_GIB} GiB: int8/fp8 hold {q8['pool_tokens']} tokens against "
                f"{f16['pool_tokens']} in 16-bit ({q8['pool_tokens'] / f16['pool_tokens']:.2f}x), max batch "
                f"{q8['max_batch']} vs {f16['max_batch']} (mean {q8['mean_batch_size']:.1f} vs "
                f"{f16['mean_batch_size']:.1f}), {q8['num_preemptions']} vs {f16['num_preemptions']} preemptions, "
                f"output throughput {q8['output_throughput']:.0f} vs {f16['output_throughput']:.0f} tok/s, "
                f"mean TTFT {q8['mean_ttft_ms']:.0f} vs {f16['mean_ttft_ms']:.0f} ms.",
                f"- {r32['setup']}: int8 holds {r8['pool_tokens']} tokens against {r32['pool_tokens']} in "
                f"float32 ({r8['pool_tokens'] / r32['pool_tokens']:.2f}x), max batch {r8['max_batch']} vs "
                f"{r32['max_batch']}, preemptions {r8['num_preemptions']} vs {r32['num_preemptions']}.",
                *accuracy_notes(acc, with_llama, acc_cpu),
            ],
        ),
        *section("Quantized KV at a fixed budget", [table(df, cols, fmt)]),
        *section(
            "Sliding-window freeing (window_rows)",
            [
                f"One greedy request, {window_setup}; pages are counts (one run each).",
                "",
                table(window, win_cols, {"page_kib": ".1f", "peak_kv_mib": ".1f", "last_kv_mib": ".1f"}),
            ],
        ),
        *section(
            "Accuracy against the exact cache",
            [
                f"{acc_setup}. Text and prompts: `experiments/data/opticks_book1.txt` (the opening of Newton's "
                "*Opticks*, book I, Project Gutenberg's public-domain text): its first tokens are the perplexity "
                "text, the prompts seeded slices of the rest; llama.cpp is given forge's token ids. "
                "greedy_agreement: tokens before each continuation's first divergence from the reference's; "
                "mean_abs_dlogprob: of the reference's continuation tokens, teacher-forced; text_perplexity and "
                "text_mean_abs_dlogprob: every text token but each window's first, teacher-forced (each later "
                "chunk reads the earlier chunks' K/V back from the cache in its dtype). "
                "nan / -: not measured, or the reference itself.",
                "",
                table(acc, list(acc.columns), acc_fmt),
            ],
        ),
    ]
    write_readme(out, "KV memory: int8 / fp8 caches and sliding-window freeing", __doc__.replace("\n", " "), body)
