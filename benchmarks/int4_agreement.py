"""Greedy agreement of SmolLM2-135M's int4 weights with float32 at batch 1, on torch's int4 kernel and forge's.

    python -m benchmarks.int4_agreement [--prompts 64 --prompt-len 128 --tokens 128] [--report PATH]

Each of ``--prompts`` seeded random prompts (``benchmarks.cpu_real_model.make_prompts``) is continued
alone, greedily, by float32 (the exact path), by ``weights=int4`` on forge's AVX2 kernels (``after``:
``qgemm.int4_gemm`` for the 1-row decode steps, forge's int8 kernel for the prefill), and by int4 on
torch's kernel (``before``: ``torch._weight_int4pack_mm_for_cpu`` on bfloat16 activations up to 8 rows,
the int8 product beyond, as before issue 22's kernels; its int8 product runs on forge's kernel, whose
results are ``torch._int_mm``'s bits, because ``_int_mm`` takes minutes per prompt without VNNI).
Every model runs on ``CpuBackend`` through the model's own forward (one sequence, paged cache).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.cpu_real_model import make_prompts
from benchmarks.cpu_report import Agreement, greedy_agreement
from forge.kernels.base import AttentionMetadata, LinearWeight
from forge.kernels.batch import ForwardBatch
from forge.kernels.cpu_backend import CpuBackend
from forge.models.fast_weights import (
    INT4_MAX_ROWS,
    Int4GroupLinear,
    Int8RowwiseLinear,
    apply_weight_format,
    torch_int4_available,
)
from forge.models.fetch import smollm2_path
from forge.models.gguf_loader import load_gguf

BLOCK_SIZE = 16


def greedy(model: Any, backend: CpuBackend, ids: list[int], tokens: int) -> list[int]:
    """``tokens`` greedy tokens after ``ids``: one prefill, then one decode step per token."""
    blocks = -(-(len(ids) + tokens) // BLOCK_SIZE)
    cache = backend.allocate_kv_cache(model.kv_spec, blocks, BLOCK_SIZE)
    table = torch.arange(blocks)[None, :]
    out: list[int] = []
    step, start = ids, 0
    while len(out) < tokens:
        end = start + len(step)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, len(step)]),
            seq_lens=torch.tensor([end]),
            block_tables=table,
            slot_mapping=torch.arange(start, end),
            block_size=BLOCK_SIZE,
            query_lens_cpu=[len(step)],
            seq_lens_cpu=[end],
        )
        batch = ForwardBatch(torch.tensor(step), torch.arange(start, end), meta, torch.tensor([len(step) - 1]))
        out.append(int(model.forward(batch, cache, backend)[-1].argmax()))
        step, start = [out[-1]], end
    return out


def torch_int4(name: str, weight: LinearWeight) -> LinearWeight:
    """The int4 layer as before forge's kernels: torch's int4 kernel up to 8 rows, int8 beyond."""
    if not isinstance(weight, torch.Tensor) or weight.shape[0] % 32 or weight.shape[1] % 16:
        return weight if not isinstance(weight, torch.Tensor) else Int8RowwiseLinear(weight)
    layer = Int4GroupLinear(weight, max_rows=INT4_MAX_ROWS, forge_kernels=False)
    layer.fallback = Int8RowwiseLinear(weight, forge_kernels=True)  # the same bits as _int_mm, in seconds
    return layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--report", type=Path, default=Path("reports/cpu/int4-agreement.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before, started = os.getloadavg(), time.time()
    exact = load_gguf(str(smollm2_path()), max_position=args.prompt_len + args.tokens + 16)
    prompts = make_prompts(exact.tokenizer, args.prompts, args.prompt_len)
    after = apply_weight_format(exact, "int4")
    models = {"float32": exact, "int4 on forge's kernels (after)": after}
    if torch_int4_available():
        models["int4 on torch's kernel (before)"] = exact.with_linears(torch_int4, after.lm_head)
    backend = CpuBackend(num_threads=args.threads)
    outputs: dict[str, list[list[int]]] = {}
    seconds: dict[str, float] = {}
    for label, model in models.items():
        t0 = time.process_time()
        outputs[label] = [greedy(model, backend, p, args.tokens) for p in prompts]
        seconds[label] = time.process_time() - t0
        print(f"{label}: {seconds[label]:.0f} CPU s", flush=True)
    rows: dict[str, Agreement] = {
        k: greedy_agreement(outputs["float32"], v) for k, v in outputs.items() if k != "float32"
    }
    lines = [
        "# SmolLM2-135M int4 vs float32, greedy at batch 1 (generated)",
        "",
        f"Command: `python -m benchmarks.int4_agreement --prompts {args.prompts} --prompt-len {args.prompt_len} "
        f"--tokens {args.tokens} --threads {args.threads}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
        f"load average before {tuple(round(v, 2) for v in load_before)}, after "
        f"{tuple(round(v, 2) for v in os.getloadavg())}; {time.time() - started:.0f} s wall.",
        "",
        "| int4 variant | continuations identical to float32 | mean agreeing prefix | CPU s for all prompts |",
        "|---|---|---|---|",
        *(f"| {k} | {a.identical}/{a.prompts} | {a.mean_prefix:.1%} | {seconds[k]:.0f} |" for k, a in rows.items()),
        "",
        f"float32: {seconds['float32']:.0f} CPU s. See the module docstring of benchmarks/int4_agreement.py.",
    ]
    args.report.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
