"""The int8 / int4 weight formats' matrix products alone, on SmolLM2-135M's shapes, against torch's.

    python -m benchmarks.qgemm_kernels [--rows 1 8 64] [--samples 5] [--report reports/cpu/kernels.md]

Each product is timed as the weight formats call it (``forge.models.fast_weights``): the activations'
quantization included, float32 in and out. Products:

- ``forge int8``: ``native.quantize_rows`` + ``qgemm.int8_gemm`` (AVX2, exact int32: ``torch._int_mm``'s bits);
- ``_int_mm``: ``native.quantize_rows`` + ``torch._int_mm`` + ``native.rescale_int_mm`` (oneDNN);
- ``fbgemm``: ``quantized::linear_dynamic`` (``weights=int8_fbgemm``: one activation scale per tensor);
- ``forge int4``: ``qgemm.int4_gemm`` (4-bit groups of 32, activations int16 per group);
- ``torch int4``: ``torch._weight_int4pack_mm_for_cpu`` on bfloat16 activations;
- ``fp32``: ``x @ w`` (float32 ``mm``).

Every figure is the median of ``--samples`` samples; a sample runs the product over enough copies of
the weight (cycled, at least 64 MiB of them where that fits 64 copies) for at least 30 ms, so a
batch-1 product reads its weight from memory rather than from the 32 MiB L3, as in a model's step.
GOP/s counts 2·M·N·K operations per wall second; ``cpu ms`` is the process's CPU time per call (both
threads, OpenMP's spin-waiting included: on a shared machine the steadier of the two).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from benchmarks.machine import cpu_model
from forge.kernels.cpu import native, qgemm
from forge.models.fast_weights import quantize_int4_groups

SHAPES = ((576, 576), (576, 1536), (1536, 576), (576, 49152))  # (K, N): q/o, gate|up halves, down, LM head
COPY_BYTES = 64 << 20
MAX_COPIES = 64
MIN_SAMPLE_S = 0.03


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float
    spread: tuple[float, float]  # min and max wall seconds per call over the samples


def time_calls(calls: list[Callable[[], object]], samples: int) -> Timing:
    """Median per-call wall and CPU seconds of cycling through ``calls``; bounded by ``samples`` x
    max(30 ms, one pass over the copies)."""
    calls[0]()  # warm-up
    walls, cpus = [], []
    for _ in range(samples):
        n, wall0, cpu0 = 0, time.perf_counter(), time.process_time()
        while n < len(calls) or time.perf_counter() - wall0 < MIN_SAMPLE_S:
            calls[n % len(calls)]()
            n += 1
        walls.append((time.perf_counter() - wall0) / n)
        cpus.append((time.process_time() - cpu0) / n)
    return Timing(statistics.median(walls), statistics.median(cpus), (min(walls), max(walls)))


def torch_int4(x_bf16: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """torch's int4 product as the int4 weight format calls it: bfloat16 in, float32 out."""
    return torch._weight_int4pack_mm_for_cpu(x_bf16, packed, 32, scale_zero).float()


def products(k: int, n: int, x: torch.Tensor, copies: int) -> dict[str, list[Callable[[], object]]]:
    """Each product's calls, one per copy of the same weight."""
    gen = torch.Generator().manual_seed(k * n)
    w = torch.randn(k, n, generator=gen) / k**0.5
    col_scale = (w.abs().amax(dim=0) / 127.0).clamp_min(1e-12)
    w8 = torch.round(w / col_scale).to(torch.int8).t().contiguous()  # [N, K]
    q4, s4, z4 = quantize_int4_groups(w)
    nib, sz = qgemm.pack_int4(q4, s4, z4)
    out: dict[str, list[Callable[[], object]]] = {}

    def forge_int8(wc: torch.Tensor) -> Callable[[], object]:
        def call() -> object:
            q, rs = native.quantize_rows(x)
            return qgemm.int8_gemm(q, wc, rs, col_scale)

        return call

    def int_mm(wc: torch.Tensor) -> Callable[[], object]:
        def call() -> object:
            q, rs = native.quantize_rows(x)
            return native.rescale_int_mm(torch._int_mm(q, wc.t()), rs, col_scale)

        return call

    out["forge int8"] = [forge_int8(w8.clone()) for _ in range(copies)]
    out["_int_mm"] = [int_mm(w8.clone()) for _ in range(copies)]
    if "fbgemm" in torch.backends.quantized.supported_engines:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            qw = torch.quantize_per_channel(
                w.t().contiguous(), col_scale.double(), torch.zeros(n, dtype=torch.long), 0, torch.qint8
            )
            packs = [torch.ops.quantized.linear_prepack(qw, None) for _ in range(copies)]
        out["fbgemm"] = [partial(torch.ops.quantized.linear_dynamic, x, p, False) for p in packs]
    nibs = [(nib.clone(), sz.clone()) for _ in range(copies)]
    out["forge int4"] = [partial(qgemm.int4_gemm, x, a, b) for a, b in nibs]
    if hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        packed = torch._convert_weight_to_int4pack_for_cpu(q4.t().contiguous(), 1)
        scale_zero = torch.stack((s4, z4), dim=-1).contiguous()
        xb = x.bfloat16()
        packs4 = [packed.clone() for _ in range(copies)]
        out["torch int4"] = [partial(torch_int4, xb, p, scale_zero) for p in packs4]
    floats = [w.clone() for _ in range(max(1, copies // 4))]
    out["fp32"] = [partial(torch.mm, x, wc) for wc in floats]
    return out


def run(rows: list[int], samples: int) -> list[tuple[int, int, int, dict[str, Timing]]]:
    results = []
    for k, n in SHAPES:
        copies = max(1, min(MAX_COPIES, COPY_BYTES // (k * n)))  # counted in int8 bytes; fp32 gets a quarter
        for m in rows:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
            timings = {name: time_calls(calls, samples) for name, calls in products(k, n, x, copies).items()}
            results.append((k, n, m, timings))
            print(k, n, m, {name: f"{2 * m * n * k / t.wall_s / 1e9:.2f} GOP/s" for name, t in timings.items()})
    return results


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_report(path: Path, results: list[tuple[int, int, int, dict[str, Timing]]], header: list[str]) -> None:
    names = list(results[0][3])
    lines = [
        "# int8 / int4 matrix products on this CPU (generated)",
        "",
        *header,
        "",
        "Each cell: GOP/s per CPU second = 2·M·N·K / median process CPU seconds per call (all threads; the "
        "figure to read on a loaded machine), then per wall second (median, min–max over the samples). "
        "Activation quantization included.",
        "",
        "| K × N | M | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for k, n, m, timings in results:
        ops = 2 * m * n * k
        cells = [
            f"**{ops / t.cpu_s / 1e9:.1f}**; wall {ops / t.wall_s / 1e9:.1f} "
            f"({ops / t.spread[1] / 1e9:.1f}–{ops / t.spread[0] / 1e9:.1f})"
            for t in timings.values()
        ]
        lines.append(f"| {k} × {n} | {m} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Weight bytes read per CPU second at M = 1 (GB/s; int8 1 byte a weight, int4 0.625 with its scales, fp32 4):",
        "",
    ]
    width = {"forge int8": 1.0, "_int_mm": 1.0, "fbgemm": 1.0, "forge int4": 0.625, "torch int4": 0.625, "fp32": 4.0}
    lines += ["| K × N | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k, n, m, timings in results:
        if m == 1:
            cells = [f"{width[name] * k * n / t.cpu_s / 1e9:.2f}" for name, t in timings.items()]
            lines.append(f"| {k} × {n} | " + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--report", type=Path, default=Path("reports/cpu/kernels.md"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    results = run(args.rows, args.samples)
    header = [
        f"Command: `python -m benchmarks.qgemm_kernels --rows {' '.join(map(str, args.rows))} "
        f"--samples {args.samples}{f' --threads {args.threads}' if args.threads else ''}` at commit {commit()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"Machine: {cpu_model()} ({platform.machine()}), {torch.get_num_threads()} threads, shared; forge's "
        f"kernels preferred here: {qgemm.forge_qgemm_preferred()} (AVX2 without VNNI); torch {torch.__version__}.",
        f"Load average (1, 5, 15 min) before: {tuple(round(v, 2) for v in load_before)}, "
        f"after: {tuple(round(v, 2) for v in os.getloadavg())}.",
    ]
    write_report(args.report, results, header)
    print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
