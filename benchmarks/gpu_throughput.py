"""GPU throughput: forge backend=cuda vs backend=torch vs Hugging Face transformers, one GPU.

    python -m benchmarks.gpu_throughput [--model smollm2|smollm2-shape|tiny] [--dtype bfloat16]
        [--batches 1 8 64 256] [--num-requests 256] [--only SECTION ...] [--out reports/gpu/results.json]

Sections (each runs alone with ``--only``; one that fails is recorded with its error and the
others still run; the JSON is rewritten after each, so a run cut short keeps what it measured):

* ``batch-forge-cuda``, ``batch-forge-torch``, ``batch-hf``: decode tok/s at fixed batch sizes
  (``--batches``; ``benchmarks/gpu/batches.py`` says how), forge ``backend=cuda`` (CUDA graphs as
  configured), forge ``backend=torch`` and transformers' static ``generate`` on the same weights;
* ``bandwidth``: device copy bandwidth (bytes read + written), the decode step's floor (weight
  bytes over it) and, with ``batch-forge-cuda`` at batch 1, that step's fraction of the floor;
* ``forge-cuda``, ``forge-torch``, ``hf-generate-batch``, ``hf-generate``: a continuous-batching
  workload (issue 7): ``--num-requests`` requests, prompt and output lengths uniform in
  [min-len, max-len] (seeded), random prompt tokens, greedy, EOS ignored. transformers' two take one
  ``max_new_tokens`` for all requests, the workload's mean output length (same total output
  tokens, flatter distribution).

``--model smollm2`` needs the SmolLM2 GGUF (fetched on first use); ``smollm2-shape`` is its shapes
with seeded random weights (``benchmarks/gpu/models.py``). ``--device cpu`` runs everything on the
CPU, forge's CUDA kernels on the CPU execution layer (``backend.runtime=cpu``): the device check's
dry run. Prints a table and writes JSON with the machine, versions and git commit.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu import batches
from benchmarks.gpu.models import MODELS, BenchModel

SECTIONS = (
    "batch-forge-cuda",
    "batch-forge-torch",
    "batch-hf",
    "bandwidth",
    "forge-cuda",
    "forge-torch",
    "hf-generate-batch",
    "hf-generate",
)


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def timed(fn: Callable[[], int], device: str) -> dict[str, float]:
    batches.synchronize(device)
    start = time.perf_counter()
    tokens = fn()
    batches.synchronize(device)
    seconds = time.perf_counter() - start
    return {"output_tokens": tokens, "seconds": seconds, "output_tok_per_s": tokens / seconds}


def backend_overrides(backend: str, args: argparse.Namespace) -> list[str]:
    """The backend's overrides on ``args.device``: on ``cpu``, CUDA kernels on the CPU layer."""
    overrides = [f"backend={backend}", f"backend.device={args.device}"]
    if backend == "cuda" and args.device == "cpu":
        overrides.append("backend.runtime=cpu")
    engine = [
        f"engine.kv_cache_memory_gib={args.kv_gib}",
        f"engine.max_num_batched_tokens={args.max_num_batched_tokens}",
    ]
    return [*overrides, *engine, *args.forge_override]


def forge_run(backend: str, work: list[tuple[list[int], int]], args: argparse.Namespace) -> dict[str, Any]:
    from forge.core.sampling_params import SamplingParams
    from forge.llm import LLM

    overrides = [*backend_overrides(backend, args), *args.model.overrides()]
    llm = LLM(
        *overrides,
        f"engine.max_num_seqs={args.max_num_seqs}",
        f"engine.max_model_len={2 * args.max_len + 16}",
        "progress=false",
        "report=false",
    )
    params = [SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True) for _, out in work]
    llm.generate([p for p, _ in work[:4]], params[:4])  # warm-up: kernel compilation, graph capture
    result = timed(lambda: sum(len(o.token_ids) for o in llm.generate([p for p, _ in work], params)), args.device)
    return {**result, "overrides": overrides}


def batch_sweep(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    max_len = args.batch_prompt_len + args.batch_tokens + 16
    if engine == "hf":
        generate = batches.hf_generate(args.model, args.device)
    else:
        generate = batches.forge_generate(backend_overrides(engine, args), args.model, max(args.batches), max_len)
    vocab = args.model.config().vocab_size
    return batches.sweep(generate, args.batches, args.batch_prompt_len, args.batch_tokens, vocab, args.device)


def bandwidth(args: argparse.Namespace) -> dict[str, Any]:
    """Device copy bandwidth (bytes read + written per second) and the decode-step floor."""
    weight_bytes = args.model.weight_bytes()
    src = torch.empty(args.copy_mib << 20, dtype=torch.uint8, device=args.device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    runs = []
    for _ in range(10):
        batches.synchronize(args.device)
        start = time.perf_counter()
        dst.copy_(src)
        batches.synchronize(args.device)
        runs.append(time.perf_counter() - start)
    bw = 2 * src.numel() / statistics.median(runs)
    return {
        "copy_bandwidth_gb_per_s": bw / 1e9,
        "weight_bytes_per_decode_step": weight_bytes,
        "decode_step_floor_ms": 1000 * weight_bytes / bw,
        "batch1_ceiling_tok_per_s": bw / weight_bytes,
    }


def hf_workload(kind: str, work: list[tuple[list[int], int]], args: argparse.Namespace) -> dict[str, Any]:
    from transformers import GenerationConfig

    model = args.model.hf_model(args.device)
    mean_out = round(statistics.mean(out for _, out in work))
    prompts = [p for p, _ in work]
    if kind == "hf-generate-batch":
        cfg = GenerationConfig(max_new_tokens=mean_out, min_new_tokens=mean_out, do_sample=False, eos_token_id=None)
        model.generate_batch(prompts[:4], generation_config=cfg)  # warm-up
        outputs = lambda: model.generate_batch(prompts, generation_config=cfg).values()  # noqa: E731
        result = timed(lambda: sum(len(o.generated_tokens) for o in outputs()), args.device)
        return {**result, "max_new_tokens_for_all": mean_out}
    result = timed(lambda: hf_static(model, prompts, mean_out, args), args.device)
    return {**result, "max_new_tokens_for_all": mean_out, "batch_size": args.hf_batch_size}


def hf_static(model: Any, prompts: list[list[int]], new_tokens: int, args: argparse.Namespace) -> int:
    total = 0
    for i in range(0, len(prompts), args.hf_batch_size):
        chunk = prompts[i : i + args.hf_batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device=args.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=args.device)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        total += (out.shape[1] - width) * len(chunk)
    return total


def machine(device: str) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": commit or "unknown",
    }


def section(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name.startswith("batch-"):
        return batch_sweep(name.removeprefix("batch-forge-").removeprefix("batch-"), args)
    if name == "bandwidth":
        return bandwidth(args)
    vocab = args.model.config().vocab_size
    work = workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    if name.startswith("forge-"):
        return forge_run(name.removeprefix("forge-"), work, args)
    return hf_workload(name, work, args)


def batch1_fraction(results: dict[str, Any]) -> float | None:
    """The floor's step time over forge backend=cuda's measured batch-1 decode step."""
    row = results.get("batch-forge-cuda", {}).get("1")
    floor = results.get("bandwidth", {}).get("decode_step_floor_ms")
    return floor / row["decode_step_ms"] if row and row["decode_step_ms"] and floor else None


def rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def summary_lines(results: dict[str, Any]) -> list[str]:
    lines = []
    for name in SECTIONS:
        got = results.get(name)
        if got is None:
            continue
        if "error" in got:
            lines.append(f"{name:>18}: FAILED {got['error'].splitlines()[-1]}")
        elif name.startswith("batch-"):
            rates = ", ".join(f"B={b}: {rate(row['decode_tok_per_s'])}" for b, row in got.items())
            lines.append(f"{name:>18}: decode tok/s {rates}")
        elif name == "bandwidth":
            lines.append(
                f"{name:>18}: {got['copy_bandwidth_gb_per_s']:.0f} GB/s, floor {got['decode_step_floor_ms']:.3f} ms"
            )
        else:
            lines.append(f"{name:>18}: {got['output_tok_per_s']:.0f} output tok/s")
    if results.get("batch1_fraction_of_bandwidth_floor") is not None:
        lines.append(f"{'batch-1 decode':>18}: {100 * results['batch1_fraction_of_bandwidth_floor']:.1f}% of the floor")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, default="smollm2")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--batch-prompt-len", type=int, default=128)
    ap.add_argument("--batch-tokens", type=int, default=128)
    ap.add_argument("--copy-mib", type=int, default=1024)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--kv-gib", type=float, default=20.0)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--forge-override", nargs="*", default=[], help="extra forge config overrides")
    ap.add_argument("--out", type=Path, default=Path("reports/gpu/results.json"))
    args = ap.parse_args(argv)
    args.model = BenchModel(args.model, args.dtype, args.seed)
    if args.batch_tokens < 2:
        ap.error("--batch-tokens must be at least 2 (decode rate = difference of 1 and N tokens)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_throughput --device cuda needs a CUDA GPU (--device cpu: the CPU execution layer)")
    results: dict[str, Any] = {"machine": machine(args.device), "args": {**vars(args), "model": args.model.name}}
    results["args"]["out"] = str(args.out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in [s for s in SECTIONS if s in args.only]:
        print(f"-- {name}", flush=True)
        try:
            results[name] = section(name, args)
        except Exception:  # recorded, and the other sections still run
            results[name] = {"error": traceback.format_exc()}
            print(results[name]["error"], flush=True)
        results["batch1_fraction_of_bandwidth_floor"] = batch1_fraction(results)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("summary:", *summary_lines(results), sep="\n")
    print(f"wrote {args.out}")
    return 1 if any("error" in results[name] for name in SECTIONS if name in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
