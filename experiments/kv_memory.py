"""What the KV memory levers buy at a fixed memory budget (issue 19): int8 / fp8 KV caches against
the model's own dtype (simulated Llama-3-8B on an H100; SmolLM2 computed for real on this CPU), the
sliding-window block freeing on and off (Gemma-3, ``experiments.window_memory.window_rows``) and the
accuracy each quantized cache costs (``experiments.kv_accuracy.measure``)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from experiments.common import section, table, write_readme, write_results
from experiments.kv_accuracy import PROMPTS
from experiments.kv_accuracy import measure as measure_accuracy
from experiments.window_memory import window_rows
from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.models.base import Model
from forge.models.fetch import smollm2_path
from forge.models.presets import model_dims
from forge.results.metrics import summarize

BLOCK_SIZE = 16
# simulated: the KV budget in GiB, turned into kvcache.num_blocks with the preset's bytes per token in each dtype
SIM_BUDGET_GIB = 2.0
SIM_DTYPES = (("auto", False), ("fp8", True), ("int8", True))  # (engine.kv_cache_dtype, quantized)
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
    for name, quantized in SIM_DTYPES:
        per_token = dataclasses.replace(model_dims("llama-3-8b"), kv_quantized=quantized).kv_bytes_per_token
        blocks = int(SIM_BUDGET_GIB * 2**30 // (per_token * BLOCK_SIZE))
        row, _ = run_engine([*sim_overrides(size), f"engine.kv_cache_dtype={name}", f"kvcache.num_blocks={blocks}"])
        rows.append({"setup": "sim llama-3-8b h100", "kv_cache_dtype": name, "kv_bytes_per_token": per_token, **row})
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


def accuracy_table(size: str) -> tuple[pd.DataFrame, str]:
    model, prompts, tokens = {"tiny": ("tiny", 2, 8), "small": ("smollm2", 8, 16)}[size]
    rows = [
        {
            "model": model,
            "kv_cache_dtype": r.kv_cache_dtype,
            "greedy_agreement": f"{r.agreeing_tokens}/{r.total_tokens}",
            "agreement_pct": 100 * r.agreement,
            "mean_abs_dlogprob": r.mean_abs_dlogprob,
        }
        for r in measure_accuracy(model, prompts, tokens)
    ]
    ref = llama_cpp_row(prompts, tokens) if model == "smollm2" else None  # the tiny model has no GGUF
    if ref is not None:
        rows.append(ref)
    return pd.DataFrame(rows), f"`kv_accuracy.measure({model!r}, {prompts}, {tokens})`"


def llama_cpp_greedy(kv_type: int, num_prompts: int, num_tokens: int) -> list[list[int]]:
    """llama.cpp's greedy continuations of ``kv_accuracy.PROMPTS`` on the same SmolLM2 GGUF forge loads,
    its K and V caches in ggml type ``kv_type`` (flash attention: llama.cpp's quantized V needs it)."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(smollm2_path()),
        n_threads=1,
        n_threads_batch=1,
        n_ctx=256,
        type_k=kv_type,
        type_v=kv_type,
        flash_attn=True,
        verbose=False,
    )
    outs = []
    for i in range(num_prompts):
        ids = llm.tokenize(PROMPTS[i % len(PROMPTS)].encode(), add_bos=True)
        toks: list[int] = []
        for t in llm.generate(ids, top_k=1, temp=0.0, reset=True):
            toks.append(t)
            if len(toks) == num_tokens:
                break
        outs.append(toks)
    return outs


def llama_cpp_row(num_prompts: int, num_tokens: int) -> dict[str, Any] | None:
    """llama.cpp's ``-ctk q8_0 -ctv q8_0`` against its f16 cache (greedy agreement as in
    ``kv_accuracy``); None when llama-cpp-python is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    exact = llama_cpp_greedy(llama_cpp.GGML_TYPE_F16, num_prompts, num_tokens)
    q8 = llama_cpp_greedy(llama_cpp.GGML_TYPE_Q8_0, num_prompts, num_tokens)
    agree = sum(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        for a, b in zip(exact, q8, strict=True)
    )
    total = num_prompts * num_tokens
    return {
        "model": f"llama.cpp {llama_cpp.__version__} smollm2 (vs its f16 cache)",
        "kv_cache_dtype": "q8_0 (-ctk q8_0 -ctv q8_0)",
        "greedy_agreement": f"{agree}/{total}",
        "agreement_pct": 100 * agree / total,
        "mean_abs_dlogprob": float("nan"),
    }


def fmt_load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.1f}" for x in load)


def run(out: Path, size: str) -> None:
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    sim = simulated_rows(size)
    real, budget = real_rows(size)
    window, window_setup = window_table(size)
    acc, acc_setup = accuracy_table(size)
    load1 = os.getloadavg()
    if acc["model"].str.startswith("llama.cpp").any():
        llama_note = (
            "- The llama.cpp row is llama.cpp's `-ctk q8_0 -ctv q8_0` against its own f16 cache on the same "
            "SmolLM2 GGUF and prompts (greedy agreement only: its logprobs are not read, hence nan); forge's rows "
            "compare each KV dtype with forge's exact (float32) cache."
        )
    else:
        llama_note = (
            "- llama.cpp's `-ctk q8_0 -ctv q8_0` is not run (tiny model: no GGUF; or llama-cpp-python missing)."
        )
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
    win_cols = ["free_outside_window", "layout", "pool_pages", "page_kib", "peak_pages_held", "peak_kv_mib"]
    win_cols += ["last_pages_held", "last_kv_mib", "token_capacity", "same_tokens_as_off"]
    body = [
        *section(
            "Setup",
            [
                f"- simulated: `{' '.join(sim_overrides(size))}`, `engine.kv_cache_dtype` auto (the preset's "
                f"16-bit values) / fp8 / int8, `kvcache.num_blocks` = {SIM_BUDGET_GIB} GiB of KV divided by the "
                "preset's KV bytes per token in that dtype (`ModelDims.kv_bytes_per_token`: one byte per value "
                "plus the per-token scale's share when quantized) times the block size. The preset's own "
                "sizing (0.9 x the H100's 80 GB less the weights: many times this budget) is not used, so that "
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
                llama_note,
                "- Perplexity on a fixed text (the issue's third accuracy figure) is not measured.",
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
                f"{acc_setup}: greedy agreement = tokens before each continuation's first divergence; "
                "mean |Δlogprob| of the exact continuation's tokens, teacher-forced.",
                "",
                table(acc, list(acc.columns), {"agreement_pct": ".1f", "mean_abs_dlogprob": ".4f"}),
            ],
        ),
    ]
    write_readme(out, "KV memory: int8 / fp8 caches and sliding-window freeing", __doc__.replace("\n", " "), body)
