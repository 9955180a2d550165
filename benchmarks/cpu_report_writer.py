"""``reports/cpu/README.md`` from one run of ``benchmarks.cpu_real_model``: its figures, the roofline
fractions, the llama.cpp grid, and the issue-22 goals marked met or not, from the measured numbers only."""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from benchmarks.cpu_report import Figure, Goal, table
from benchmarks.machine import cpu_model
from benchmarks.roofline import (
    ModelShape,
    WeightBytes,
    decode_bytes_per_token,
    gguf_weight_bytes,
    mean_context,
    sequence_flops,
)
from forge.models.fetch import smollm2_path

if TYPE_CHECKING:
    from benchmarks.cpu_real_model import Results

LLAMA_KV_BYTES = 2.0  # llama.cpp's default K/V cache type is F16
LLAMA_COMPUTE = {"Q4_1": "int8", "Q8_0": "int8", "F16": "fp32", "F32": "fp32"}


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return f"working tree on top of {head}" if git("status", "--porcelain") else head


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}"


def command(args: argparse.Namespace) -> str:
    parts = [
        f"--requests {args.requests} --prompt-len {args.prompt_len} --output-len {args.output_len}",
        f"--threads {args.threads} --repeats {args.repeats} --variants {' '.join(args.variants)}",
    ]
    if args.batch1_only:
        parts.append(f"--batch1-only {' '.join(args.batch1_only)}")
    if args.skip:
        parts.append(f"--skip {' '.join(args.skip)}")
    parts.append(f"--llama-files {' '.join(args.llama_files)} --llama-batches {' '.join(map(str, args.llama_batches))}")
    if args.llama_kv_split:
        parts.append("--llama-kv-split")
    parts.append(f"--serial-requests {args.serial_requests}")
    return "python -m benchmarks.cpu_real_model " + " ".join(parts)


def write_report(
    args: argparse.Namespace,
    res: Results,
    variants: dict[str, list[str]],
    formats: dict[str, tuple[WeightBytes, float, str]],
) -> None:
    """Write ``args.report``; ``variants``: forge label -> overrides; ``formats``: label -> (bytes per
    parameter, K/V element bytes, GEMM kind) as in ``benchmarks.cpu_real_model``."""
    shape = ModelShape.from_gguf(smollm2_path())
    lim = res.limits
    peak = {"fp32": lim.fp32_flops, "int8": lim.int8_ops}
    ctx = mean_context(args.prompt_len, args.output_len)
    flops_per_seq = sequence_flops(shape, args.prompt_len, args.output_len)
    llama_bytes = {}
    for kind in args.llama_files:
        from benchmarks.llama_cpp_batched import llama_cpp_copy

        path = smollm2_path() if kind == "Q4_1" else llama_cpp_copy(smollm2_path(), kind, args.threads)
        llama_bytes[kind] = gguf_weight_bytes(path, shape)

    def compute_cell(fig: Figure | None, kind: str) -> str:
        if fig is None or not peak[kind]:
            return "-"
        rate = fig.median / args.output_len * flops_per_seq
        return f"{rate / 1e9:.0f} G/s = {rate / peak[kind]:.0%} of {kind} peak"

    thr_rows = []
    for label, fig in res.throughput.items():
        kind = formats[label.removeprefix("forge-")][2] if label.startswith("forge-") else "fp32"
        if "serial" in label:
            thr_rows.append([f"{label} ({args.serial_requests} requests)", fig.cell(), "-"])
        else:
            thr_rows.append([label, fig.cell(), compute_cell(fig, kind)])
    for kind in args.llama_files:
        batched = res.grid.get((kind, args.requests))
        if batched:
            thr_rows.append([f"llama.cpp {kind} batched", batched.cell(), compute_cell(batched, LLAMA_COMPUTE[kind])])

    def b1_row(label: str, end_to_end: Figure | None, wb: WeightBytes, kv: float) -> list[str]:
        decode = res.batch1_decode.get(label)
        nbytes = decode_bytes_per_token(shape, wb, kv, ctx)
        limit = lim.bandwidth / nbytes
        frac = f"{decode.median / limit:.0%}" if decode else "-"
        return [
            label,
            end_to_end.cell() if end_to_end else "-",
            decode.cell() if decode else "-",
            f"{nbytes / 1e6:.0f}",
            f"{limit:.1f}",
            frac,
        ]

    b1_rows = [b1_row(f"forge-{v}", res.batch1.get(f"forge-{v}"), *formats[v][:2]) for v in args.variants]
    if "transformers" in res.batch1:
        b1_rows.append(["transformers", res.batch1["transformers"].cell(), "-", "-", "-", "-"])
    for kind in args.llama_files:
        b1_rows.append(b1_row(f"llama.cpp {kind}", res.grid.get((kind, 1)), llama_bytes[kind], LLAMA_KV_BYTES))

    grid_rows = [
        [kind, *[res.grid[(kind, n)].cell() if (kind, n) in res.grid else "-" for n in args.llama_batches]]
        for kind in args.llama_files
    ]

    def med(figures: Mapping[Any, Figure], key: object) -> float | None:
        fig = figures.get(key)
        return fig.median if fig else None

    exact = [v for v in ("fp32", "fp32-cpu") if f"forge-{v}" in res.throughput]
    best = max(exact, key=lambda v: res.throughput[f"forge-{v}"].median) if exact else "fp32"
    exact1 = [v for v in ("fp32", "fp32-cpu") if f"forge-{v}" in res.batch1]
    best1 = max(exact1, key=lambda v: res.batch1[f"forge-{v}"].median) if exact1 else "fp32"
    n = args.requests
    int4_decode = res.batch1_decode.get("forge-int4")
    int4_limit = lim.bandwidth / decode_bytes_per_token(shape, *formats["int4"][:2], ctx)
    goals = [
        Goal(
            f"int4 at {n} sequences >= 1.5x llama.cpp Q4_1 batched at {n}",
            med(res.throughput, "forge-int4"),
            med(res.grid, ("Q4_1", n)),
            1.5,
        ),
        Goal(
            f"int8 at {n} sequences >= 1.5x llama.cpp Q8_0 batched at {n}",
            med(res.throughput, "forge-int8"),
            med(res.grid, ("Q8_0", n)),
            1.5,
        ),
        Goal(
            "batch-1 int4 >= 1.3x llama.cpp Q4_1 batch-1",
            med(res.batch1, "forge-int4"),
            med(res.grid, ("Q4_1", 1)),
            1.3,
        ),
        Goal(
            "batch-1 int4 decode >= 60% of the bandwidth limit",
            int4_decode.median if int4_decode else None,
            int4_limit,
            0.6,
        ),
        Goal(
            f"exact float32 (forge-{best}) at {n} sequences >= 1.5x transformers batched",
            med(res.throughput, f"forge-{best}"),
            med(res.throughput, "transformers"),
            1.5,
        ),
        Goal(
            f"exact float32 (forge-{best}) at {n} sequences >= llama.cpp F16 batched at {n}",
            med(res.throughput, f"forge-{best}"),
            med(res.grid, ("F16", n)),
            1.0,
        ),
        Goal(
            f"exact float32 (forge-{best}) at {n} sequences >= llama.cpp F32 batched at {n}",
            med(res.throughput, f"forge-{best}"),
            med(res.grid, ("F32", n)),
            1.0,
        ),
        Goal(
            f"batch-1 exact float32 (forge-{best1}) >= 1.2x llama.cpp F32 batch-1",
            med(res.batch1, f"forge-{best1}"),
            med(res.grid, ("F32", 1)),
            1.2,
        ),
    ]
    agreement = [
        f"- forge-{key.replace('@1', ' (batch-1 prompt only)')}: {a.describe()}" for key, a in res.agreement.items()
    ]

    lines = [
        "# SmolLM2-135M on CPU: forge vs transformers vs llama.cpp (batched and serial)",
        "",
        f"Command: `{command(args)}`",
        f"Machine: {machine()}; load average at start {args.load_at_start}, "
        f"at end {args.load_at_end}; the run took {(time.time() - args.started) / 60:.0f} min",
        f"Commit: {commit()}",
        f"Limits measured in this run: {lim.describe()}. The batch-1 limit uses {lim.bandwidth / 1e9:.1f} GB/s "
        "(the higher of copy and read).",
        "",
        f"Every figure: output tokens per wall second, median of {args.repeats} runs (min-max); greedy, EOS ignored, "
        f"{args.prompt_len}-token prompts of seeded random tokens, {args.output_len} output tokens each, "
        f"{args.threads} threads. forge: continuous batching through `forge.LLM`; transformers: one batched "
        "`generate`; llama.cpp batched: all sequences in one context, one `llama_batch` per step "
        f"(`benchmarks/llama_cpp_batched.py`, n_batch 2048, n_ubatch 512, "
        f"{'one KV buffer per sequence' if args.llama_kv_split else 'unified KV cache'}); llama.cpp serial: "
        "`Llama.generate` one request after another (continuity with earlier reports).",
        "",
        f"## Throughput, {n} sequences",
        "",
        "Compute column: FLOPs of prefill + decode (2 x params per token + attention) per second, against this "
        "run's GEMM peak of the arithmetic the format runs.",
        "",
        *table(["system", "tok/s", "compute"], thr_rows),
        "",
        "## Batch 1",
        "",
        f"tok/s with the {args.prompt_len}-token prefill included, and over the decode steps alone; bytes a decode "
        f"step reads (weights + K/V at the mean context {ctx:.0f}); the bandwidth limit they imply, and the decode "
        "rate as a fraction of it.",
        "",
        *table(["system", "tok/s", "decode tok/s", "MB/token", "limit tok/s", "of limit"], b1_rows),
        "",
        "## llama.cpp batched, by number of sequences",
        "",
        *table(["file", *[f"N={n_}" for n_ in args.llama_batches]], grid_rows),
        "",
        "## Goals (issue 22), ratios from this run",
        "",
        *[g.line() for g in goals],
        "",
        f"## Greedy agreement with the exact float32 variant ({n} prompts x {args.output_len} tokens where measured)",
        "",
        *(agreement or ["- not measured in this run"]),
        f"- llama.cpp batched vs its serial path (Q4_1, 4 prompts x 32 tokens, both without flash attention): "
        f"{res.sanity.describe() if res.sanity else 'not measured'}",
        "",
        "forge variants (config overrides):",
        "",
        *[f"- forge-{v}: `{' '.join(variants[v])}`" for v in args.variants],
        "",
        "Where the time goes, and what the goals need: `analysis.md` (profiles: `profile*.md`, each with its command).",
    ]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.report}")
