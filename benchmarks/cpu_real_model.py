"""SmolLM2-135M on CPU: forge vs transformers vs llama.cpp, greedy, side by side in one run.

    python -m benchmarks.cpu_real_model [--requests 64 --prompt-len 128 --output-len 128 --repeats 3]

Throughput: ``requests`` prompts of ``prompt-len`` seeded random tokens, ``output-len`` tokens each
(EOS ignored); forge through ``forge.LLM`` (continuous batching), transformers with one batched
``generate``, llama.cpp (``llama-cpp-python``, 2 threads) decoding N sequences together in one
context (``benchmarks/llama_cpp_batched.py``) on the Q4_1 GGUF forge loads and on its Q8_0 / F16 / F32
copies, and, for continuity, one request after another ("serial"). Batch 1: one request alone. Every
figure is the median of ``--repeats`` runs (min-max shown); the machine's bandwidth and GEMM peaks are
measured in the same run (``benchmarks/roofline.py``). Writes ``reports/cpu/README.md`` (``--report``).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.cpu_report import Agreement, Figure, greedy_agreement
from benchmarks.cpu_report_writer import commit, machine, write_report
from benchmarks.roofline import Limits, WeightBytes, measure_limits
from forge.models.fetch import smollm2_path

Prompts = list[list[int]]
__all__ = ["commit", "machine", "main"]  # commit and machine: also for the other benchmark reports


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
# What a decode step of each variant reads per parameter (layers, LM head), its K/V element size,
# and the GEMM kind bounding it with many rows. int8: per-channel scales left out (< 1%); int4: 4 bits
# plus a bfloat16 scale and zero per group of 32 = 0.625 bytes, its LM head int8; int4 products of more
# than 8 rows run the int8 GEMM.
VARIANT_FORMATS: dict[str, tuple[WeightBytes, float, str]] = {
    "fp32": (WeightBytes(4.0, 4.0), 4.0, "fp32"),
    "fp32-cpu": (WeightBytes(4.0, 4.0), 4.0, "fp32"),
    "int8-torch": (WeightBytes(1.0, 1.0), 4.0, "int8"),
    "int8": (WeightBytes(1.0, 1.0), 4.0, "int8"),
    "int8-kvbf16": (WeightBytes(1.0, 1.0), 2.0, "int8"),
    "int4": (WeightBytes(0.625, 1.0), 4.0, "int8"),
}
LLAMA_FILES = ["Q4_1", "Q8_0", "F16", "F32"]  # Q4_1: the GGUF forge loads; the others llama.cpp's copies of it
DEFAULT_REPORT = Path("reports/cpu/README.md")
DEFAULT_VARIANTS = ["fp32", "fp32-cpu", "int8", "int4"]


@dataclass
class Results:
    """Everything one run measured; figures are output tok/s."""

    limits: Limits
    throughput: dict[str, Figure] = field(default_factory=dict)  # at --requests sequences
    batch1: dict[str, Figure] = field(default_factory=dict)  # one sequence, prefill included
    batch1_decode: dict[str, Figure] = field(default_factory=dict)  # one sequence, decode steps only
    grid: dict[tuple[str, int], Figure] = field(default_factory=dict)  # llama.cpp (file, N) batched
    outputs: dict[str, Prompts] = field(default_factory=dict)  # forge variant -> continuations of every prompt
    agreement: dict[str, Agreement] = field(default_factory=dict)  # forge variant vs forge-fp32
    sanity: Agreement | None = None  # llama.cpp batched vs serial


def forge_llm(overrides: list[str], max_seqs: int, context: int, threads: int) -> Any:
    from forge import LLM

    need_gib = max_seqs * context * 46080 / 2**30 * 1.2 + 0.1  # float32 K/V
    return LLM(
        "model=smollm2",
        "model.max_position=1024",
        *overrides,
        f"engine.max_num_seqs={max_seqs}",
        f"engine.kv_cache_memory_gib={need_gib:.2f}",
        f"backend.num_threads={threads}",
    )


def forge_generate(llm: Any, prompts: Prompts, output_len: int) -> tuple[float, float, Prompts]:
    """Wall seconds to first tokens, then to the end, and the continuations."""
    from forge import SamplingParams

    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    tokens: dict[int, list[int]] = {}
    start = time.perf_counter()
    first = None
    for delta in llm.stream(prompts, params):
        if first is None and delta.token_ids:
            first = time.perf_counter()
        tokens.setdefault(delta.index, []).extend(delta.token_ids)
    end = time.perf_counter()
    outs = [tokens[i] for i in range(len(prompts))]
    assert all(len(o) == output_len for o in outs)
    return (first or end) - start, end - start, outs


def run_forge(variant: str, prompts: Prompts, args: argparse.Namespace, res: Results, throughput: bool) -> None:
    from forge import SamplingParams

    label = f"forge-{variant}"
    llm = forge_llm(VARIANTS[variant], len(prompts), args.prompt_len + args.output_len, args.threads)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    for _ in range(args.repeats if throughput else 0):
        _, seconds, outs = forge_generate(llm, prompts, args.output_len)
        res.throughput.setdefault(label, Figure()).runs.append(len(prompts) * args.output_len / seconds)
        res.outputs.setdefault(variant, outs)
    for _ in range(args.repeats):
        ttft, seconds, outs = forge_generate(llm, prompts[:1], args.output_len)
        res.batch1.setdefault(label, Figure()).runs.append(args.output_len / seconds)
        res.batch1_decode.setdefault(label, Figure()).runs.append((args.output_len - 1) / (seconds - ttft))
        res.outputs.setdefault(f"{variant}@1", outs)
    print(f"{label}: {report_line(res, label)}", flush=True)


def run_transformers(prompts: Prompts, args: argparse.Namespace, res: Results) -> None:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    path = smollm2_path()
    lm = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    with torch.no_grad():
        lm.generate(ids[:1, :8], max_new_tokens=2, do_sample=False)  # warm-up
        for batch, table in ((ids, res.throughput), (ids[:1], res.batch1)):
            for _ in range(args.repeats):
                start = time.perf_counter()
                out = lm.generate(
                    batch,
                    attention_mask=torch.ones_like(batch),
                    max_new_tokens=args.output_len,
                    min_new_tokens=args.output_len,
                    do_sample=False,
                )
                seconds = time.perf_counter() - start
                assert out.shape[1] == batch.shape[1] + args.output_len
                table.setdefault("transformers", Figure()).runs.append(batch.shape[0] * args.output_len / seconds)
    print(f"transformers: {report_line(res, 'transformers')}", flush=True)


def llama_cpp_serial(path: Path, prompts: Prompts, output_len: int, threads: int) -> tuple[float, Prompts]:
    """llama.cpp's high-level ``Llama.generate``, one request after another: seconds and continuations."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(path), n_threads=threads, n_threads_batch=threads, n_ctx=len(prompts[0]) + output_len + 8, verbose=False
    )
    outs: Prompts = []
    start = time.perf_counter()
    for prompt in prompts:
        llm.reset()
        outs.append([])
        for token in llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            outs[-1].append(int(token))
            if len(outs[-1]) == output_len:
                break
    return time.perf_counter() - start, outs


def run_llama_cpp(prompts: Prompts, args: argparse.Namespace, res: Results) -> None:
    from benchmarks.llama_cpp_batched import LlamaCppBatched, llama_cpp_copy

    source = smollm2_path()
    serial = prompts[: args.serial_requests]
    for _ in range(args.repeats):
        seconds, _ = llama_cpp_serial(source, serial, args.output_len, args.threads)
        res.throughput.setdefault("llama.cpp Q4_1 serial", Figure()).runs.append(
            len(serial) * args.output_len / seconds
        )
    print(f"llama.cpp serial: {report_line(res, 'llama.cpp Q4_1 serial')}", flush=True)
    for kind in args.llama_files:
        path = source if kind == "Q4_1" else llama_cpp_copy(source, kind, args.threads)
        if kind == "Q4_1":  # sanity: batched greedy == serial greedy, both without flash attention
            few = prompts[:4]
            with LlamaCppBatched(path, args.threads, kv_unified=False, flash_attn=False) as check:
                batched = check.generate(few, 32).tokens
            res.sanity = greedy_agreement(llama_cpp_serial(source, few, 32, args.threads)[1], batched)
            print(f"llama.cpp batched vs serial: {res.sanity.describe()}", flush=True)
        with LlamaCppBatched(path, args.threads, kv_unified=not args.llama_kv_split) as llm:
            for n in args.llama_batches:
                for _ in range(args.repeats):
                    gen = llm.generate(prompts[:n], args.output_len)
                    res.grid.setdefault((kind, n), Figure()).runs.append(n * args.output_len / gen.seconds)
                    if n == 1:
                        decode = (args.output_len - 1) / gen.decode_s
                        res.batch1_decode.setdefault(f"llama.cpp {kind}", Figure()).runs.append(decode)
                print(f"llama.cpp {kind} x{n}: {res.grid[(kind, n)].cell()} tok/s", flush=True)


def report_line(res: Results, label: str) -> str:
    thr, b1 = res.throughput.get(label), res.batch1.get(label)
    return f"throughput {thr.cell() if thr else '-'} tok/s, batch-1 {b1.cell() if b1 else '-'} tok/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="every figure: median of this many runs")
    parser.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS, choices=sorted(VARIANTS))
    parser.add_argument(
        "--batch1-only", nargs="*", default=[], choices=sorted(VARIANTS), help="variants measured at batch 1 only"
    )
    parser.add_argument("--skip", nargs="*", default=[], help="peers to leave out: transformers llama.cpp")
    parser.add_argument("--llama-files", nargs="*", default=LLAMA_FILES, choices=LLAMA_FILES)
    parser.add_argument("--llama-batches", nargs="*", type=int, default=[1, 8, 32, 64])
    parser.add_argument("--llama-kv-split", action="store_true", help="one KV buffer per sequence (kv_unified off)")
    parser.add_argument("--serial-requests", type=int, default=16, help="requests in the serial llama.cpp row")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    args = parser.parse_args()
    args.load_at_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
    args.started = time.time()

    from forge.models.gguf_loader import load_gguf

    tokenizer = load_gguf(str(smollm2_path()), max_position=64).tokenizer
    prompts = make_prompts(tokenizer, args.requests, args.prompt_len)
    res = Results(measure_limits(args.threads))
    print(f"limits: {res.limits.describe()}", flush=True)
    for variant in args.variants:
        run_forge(variant, prompts, args, res, throughput=variant not in args.batch1_only)
    exact = next((v for v in ("fp32", "fp32-cpu") if v in args.variants), None)
    for variant in args.variants:
        for key in (variant, f"{variant}@1"):
            ref = res.outputs.get(key.replace(variant, exact, 1)) if exact else None
            if variant != exact and ref is not None and key in res.outputs:
                res.agreement[key] = greedy_agreement(ref, res.outputs[key])
    if "transformers" not in args.skip:
        run_transformers(prompts, args, res)
    if "llama.cpp" not in args.skip:
        run_llama_cpp(prompts, args, res)
    args.load_at_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    write_report(args, res, VARIANTS, VARIANT_FORMATS)


if __name__ == "__main__":
    main()
