"""SmolLM2-135M on CPU: forge vs transformers vs llama.cpp, greedy, side by side in one run.

    python -m benchmarks.cpu_real_model [--requests 64 --prompt-len 128 --output-len 128]

Throughput: ``requests`` prompts of ``prompt-len`` seeded random tokens, ``output-len``
tokens each (EOS ignored); forge through ``forge.LLM`` (continuous batching), transformers
with one batched ``generate``, llama.cpp (``llama-cpp-python``, if installed, 2 threads)
one request after another. Batch-1 decode: one request alone, tok/s of its output.
Writes ``reports/cpu/README.md`` (``--report``) from the measured numbers only.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from benchmarks.machine import cpu_model
from forge.models.fetch import smollm2_path

Prompts = list[list[int]]


def make_prompts(tokenizer: Any, n: int, length: int, seed: int = 0) -> Prompts:
    rng = random.Random(seed)
    return [tokenizer.random_token_ids(length, rng) for _ in range(n)]


# forge configurations measured: label -> overrides. backend=cpu: decode attention on forge's C kernel
# (reads K/V in place); backend=torch: the reference ops (K/V gathered, then SDPA).
VARIANTS = {
    "fp32": ["model.weights=same", "backend=torch"],
    "fp32-cpu": ["model.weights=same", "backend=cpu"],
    "int8-torch": ["model.weights=int8", "backend=torch"],
    "int8": ["model.weights=int8", "backend=cpu"],
    "int8-kvbf16": ["model.weights=int8", "backend=cpu", "engine.kv_cache_dtype=bfloat16"],
    "int4": ["model.weights=int4", "backend=cpu"],
}
DEFAULT_REPORT = Path("reports/cpu/README.md")
DEFAULT_VARIANTS = ["fp32", "fp32-cpu", "int8-torch", "int8", "int4"]


def run_forge(prompts: Prompts, output_len: int, overrides: list[str], threads: int) -> float:
    """Seconds for forge to generate ``output_len`` tokens for every prompt."""
    from forge import LLM, SamplingParams

    need_gib = len(prompts) * (len(prompts[0]) + output_len) * 46080 / 2**30 * 1.2 + 0.1  # float32 K/V
    llm = LLM(
        "model=smollm2",
        "model.max_position=1024",
        *overrides,
        f"engine.max_num_seqs={max(len(prompts), 1)}",
        f"engine.kv_cache_memory_gib={need_gib:.2f}",
        f"backend.num_threads={threads}",
    )
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == output_len for o in outs)
    return elapsed


def run_transformers(prompts: Prompts, output_len: int, threads: int) -> float:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    path = smollm2_path()
    lm = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    with torch.no_grad():
        lm.generate(ids[:1, :8], max_new_tokens=2, do_sample=False)  # warm-up
        start = time.perf_counter()
        out = lm.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            do_sample=False,
        )
        elapsed = time.perf_counter() - start
    assert out.shape[1] == ids.shape[1] + output_len
    return elapsed


def run_llama_cpp(prompts: Prompts, output_len: int, threads: int) -> float:
    import llama_cpp

    llm = llama_cpp.Llama(
        str(smollm2_path()),
        n_threads=threads,
        n_threads_batch=threads,
        n_ctx=len(prompts[0]) + output_len + 8,
        verbose=False,
    )
    start = time.perf_counter()
    for prompt in prompts:
        llm.reset()
        for produced, _ in enumerate(llm.generate(prompt, top_k=1, temp=0.0, reset=True), start=1):
            if produced == output_len:
                break
    return time.perf_counter() - start


def measure(name: str, fn: Callable[[], float], tokens: int, results: dict[str, float], repeats: int = 1) -> None:
    """tok/s of ``fn`` (which returns seconds for ``tokens`` tokens): the median over ``repeats`` runs."""
    try:
        runs = [fn() for _ in range(repeats)]
    except ImportError as exc:
        print(f"{name}: skipped ({exc})")
        return
    seconds = statistics.median(runs)
    results[name] = tokens / seconds
    spread = f" (runs: {', '.join(f'{tokens / t:.1f}' for t in runs)} tok/s)" if repeats > 1 else ""
    print(f"{name}: {tokens} tokens in {seconds:.1f}s = {results[name]:.1f} tok/s{spread}", flush=True)


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores, {platform.system()}, torch {torch.__version__}"


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "?"
    return f"working tree on top of {head}" if git("status", "--porcelain") else head


def report(path: Path, args: argparse.Namespace, thr: dict[str, float], b1: dict[str, float]) -> None:
    def ratio(a: str, b: str, table: dict[str, float]) -> str:
        return f"{table[a] / table[b]:.2f}x" if a in table and b in table else "n/a"

    rows = [f"| {k} | {v:.1f} |" for k, v in thr.items()]
    rows1 = [f"| {k} | {v:.1f} |" for k, v in b1.items()]
    lines = [
        "# SmolLM2-135M on CPU: forge vs transformers vs llama.cpp",
        "",
        f"Command: `python -m benchmarks.cpu_real_model --requests {args.requests} --prompt-len {args.prompt_len} "
        f"--output-len {args.output_len} --threads {args.threads} --batch1-repeats {args.batch1_repeats} "
        f"--variants {' '.join(args.variants)}"
        + (f" --skip {' '.join(args.skip)}" if args.skip else "")
        + (f" --report {args.report}" if args.report != DEFAULT_REPORT else "")
        + "`",
        f"Machine: {machine()}; load average at start {args.load_at_start}",
        f"Commit: {commit()}",
        "",
        f"Throughput: {args.requests} requests x {args.prompt_len} prompt x {args.output_len} output tokens, greedy, "
        "EOS ignored; output tokens / wall second. forge: continuous batching through `forge.LLM`; "
        "transformers: one batched `generate`; llama.cpp: requests one after another.",
        "",
        "| system | tok/s |",
        "|---|---|",
        *rows,
        "",
        "forge variants (config overrides):",
        "",
        *[f"- forge-{v}: `{' '.join(VARIANTS[v])}`" for v in args.variants],
        "",
        f"Batch-1 decode ({args.prompt_len} prompt, {args.output_len} output): tok/s, median of "
        f"{args.batch1_repeats} runs (each loads the model afresh)",
        "",
        "| system | tok/s |",
        "|---|---|",
        *rows1,
        "",
        "Ratios (same run):",
        "",
        *[
            f"- {name}: throughput {ratio(name, 'llama.cpp', thr)} llama.cpp, {ratio(name, 'transformers', thr)} "
            f"transformers; batch-1 {ratio(name, 'llama.cpp', b1)} llama.cpp"
            for name in thr
            if name.startswith("forge-")
        ],
        "",
        "`backend=cpu` runs decode attention on forge's C kernel, which reads K/V in place through the block "
        "table (forge/kernels/cpu/); `backend=torch` gathers each context into a padded copy for SDPA. "
        "int8 is the approximate `model.weights=int8` mode (forge/models/fast_weights.py: per-channel "
        "int8 weights x per-token int8 activations through `torch._int_mm`); fp32 (`weights=same`) is the exact "
        "path. int4 (`model.weights=int4`, approximate too): 4-bit weights in groups of 32 through "
        "`torch._weight_int4pack_mm_for_cpu` on bfloat16 activations for products of few rows, the int8 path "
        "for more rows and for the LM head (its top 16 logits recomputed in float32 for few rows).",
        "",
        "Where the time goes, and what the goals need: `analysis.md` (profiles: `profile*.md`, each with its command).",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--variants",
        nargs="*",
        default=DEFAULT_VARIANTS,
        choices=sorted(VARIANTS),
        help="forge configurations to measure (VARIANTS in this file)",
    )
    parser.add_argument("--skip", nargs="*", default=[], help="peers to leave out: transformers llama.cpp")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument("--batch1-repeats", type=int, default=3, help="batch-1 figure: median of this many runs")
    args = parser.parse_args()
    args.load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())

    from forge.models.gguf_loader import load_gguf

    tokenizer = load_gguf(str(smollm2_path()), max_position=64).tokenizer
    prompts = make_prompts(tokenizer, args.requests, args.prompt_len)
    tokens = args.requests * args.output_len
    thr: dict[str, float] = {}
    b1: dict[str, float] = {}
    reps = args.batch1_repeats
    for variant in args.variants:
        label, overrides = f"forge-{variant}", VARIANTS[variant]
        measure(label, partial(run_forge, prompts, args.output_len, overrides, args.threads), tokens, thr)
        measure(
            label, partial(run_forge, prompts[:1], args.output_len, overrides, args.threads), args.output_len, b1, reps
        )
    if "transformers" not in args.skip:
        measure("transformers", lambda: run_transformers(prompts, args.output_len, args.threads), tokens, thr)
        measure(
            "transformers",
            lambda: run_transformers(prompts[:1], args.output_len, args.threads),
            args.output_len,
            b1,
            reps,
        )
    if "llama.cpp" not in args.skip:
        measure("llama.cpp", lambda: run_llama_cpp(prompts, args.output_len, args.threads), tokens, thr)
        measure(
            "llama.cpp", lambda: run_llama_cpp(prompts[:1], args.output_len, args.threads), args.output_len, b1, reps
        )
    report(args.report, args, thr, b1)


if __name__ == "__main__":
    main()
