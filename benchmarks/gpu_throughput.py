"""GPU throughput of SmolLM2-135M: forge backend=cuda vs backend=torch vs Hugging Face transformers.

    python -m benchmarks.gpu_throughput [--num-requests 256] [--dtype bfloat16] [--out reports/gpu/results.json]

Workload (issue 7): 256 requests, prompt and output lengths uniform in [128, 1024] (seeded),
random prompt tokens, greedy, EOS ignored. In one process, one after another:

* forge ``backend=cuda`` and forge ``backend=torch`` through ``forge.LLM`` (same engine,
  scheduler and model; only the kernels differ); output tokens / wall seconds;
* transformers continuous batching (``generate_batch``) and static batched ``generate`` on
  the same weights (the forge GGUF loader's Hugging Face-named state dict). Both take one
  ``max_new_tokens`` for all requests, so they get the workload's mean output length (same
  total output tokens, flatter distribution); that is stated in the results;
* batch-1 decode tok/s with forge ``backend=cuda`` (graphs as configured), and the
  memory-bandwidth floor of a decode step: weight bytes / measured device copy bandwidth.

Prints a table and writes JSON with the machine, torch/CUDA versions and git commit. Needs a
CUDA GPU; every section also runs alone (``--only``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SECTIONS = ("forge-cuda", "forge-torch", "hf-generate-batch", "hf-generate", "batch1", "bandwidth")


def workload(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def timed(fn: Callable[[], int]) -> dict[str, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"output_tokens": tokens, "seconds": seconds, "output_tok_per_s": tokens / seconds}


def forge_run(backend: str, dtype: str, work: list[tuple[list[int], int]], args: argparse.Namespace) -> dict[str, Any]:
    from forge.core.sampling_params import SamplingParams
    from forge.llm import LLM

    llm = LLM(
        f"backend={backend}",
        "model=smollm2",
        f"model.dtype={dtype}",
        f"engine.max_num_seqs={args.max_num_seqs}",
        f"engine.max_num_batched_tokens={args.max_num_batched_tokens}",
        f"engine.max_model_len={2 * args.max_len + 16}",
        f"engine.kv_cache_memory_gib={args.kv_gib}",
        "progress=false",
        "report=false",
        *args.forge_override,
    )
    params = [SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True) for _, out in work]
    llm.generate([p for p, _ in work[:4]], params[:4])  # warm-up: kernel compilation, graph capture
    result = timed(lambda: sum(len(o.token_ids) for o in llm.generate([p for p, _ in work], params)))
    return {**result, "overrides": [f"backend={backend}", f"model.dtype={dtype}", *args.forge_override]}


def forge_batch1(dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    from forge.core.sampling_params import SamplingParams
    from forge.llm import LLM

    llm = LLM(
        "backend=cuda", "model=smollm2", f"model.dtype={dtype}", "progress=false", "report=false", *args.forge_override
    )
    prompt = list(range(100, 228))
    llm.generate(prompt, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True))
    steps = args.batch1_tokens
    result = timed(
        lambda: len(
            llm.generate(prompt, SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True))[0].token_ids
        )
    )
    result["step_ms"] = 1000 * result["seconds"] / result["output_tokens"]  # includes the one prefill
    return result


def bandwidth(dtype: str) -> dict[str, Any]:
    """Device copy bandwidth (bytes read + written per second) and the decode-step floor."""
    from forge.models.gguf_loader import load_smollm2

    model = load_smollm2(dtype=dtype, device="cuda")
    weight_bytes = model.dims.num_params * model.dims.bytes_per_param
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    runs = []
    for _ in range(10):
        start = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        runs.append(time.perf_counter() - start)
    bw = 2 * src.numel() / statistics.median(runs)
    return {
        "copy_bandwidth_gb_per_s": bw / 1e9,
        "weight_bytes": weight_bytes,
        "decode_step_floor_ms": 1000 * weight_bytes / bw,
        "batch1_ceiling_tok_per_s": bw / weight_bytes,
    }


def hf_model(dtype: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from forge.models.fetch import smollm2_path
    from forge.models.gguf_file import GGUFFile
    from forge.models.gguf_loader import config_from_gguf, state_dict_from_gguf

    gguf = GGUFFile(str(smollm2_path()))
    cfg = config_from_gguf(gguf)
    hf_cfg = LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )
    model = LlamaForCausalLM(hf_cfg)
    state = state_dict_from_gguf(gguf, cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # lm_head.weight may be absent: tied to the embedding by the config; nothing else may be.
    if set(missing) - {"lm_head.weight"} or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model.generation_config.eos_token_id = None
    return torch.nn.Module.to(model, device="cuda", dtype=getattr(torch, dtype)).eval()


def hf_generate_batch(model: Any, work: list[tuple[list[int], int]]) -> dict[str, Any]:
    from transformers import GenerationConfig

    mean_out = round(statistics.mean(out for _, out in work))
    cfg = GenerationConfig(max_new_tokens=mean_out, min_new_tokens=mean_out, do_sample=False, eos_token_id=None)
    prompts = [p for p, _ in work]
    model.generate_batch(prompts[:4], generation_config=cfg)  # warm-up
    result = timed(
        lambda: sum(len(o.generated_tokens) for o in model.generate_batch(prompts, generation_config=cfg).values())
    )
    return {**result, "max_new_tokens_for_all": mean_out}


def hf_generate(model: Any, work: list[tuple[list[int], int]], batch_size: int) -> dict[str, Any]:
    mean_out = round(statistics.mean(out for _, out in work))

    def run() -> int:
        total = 0
        for i in range(0, len(work), batch_size):
            chunk = [p for p, _ in work[i : i + batch_size]]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device="cuda")
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device="cuda")
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=mean_out,
                min_new_tokens=mean_out,
                do_sample=False,
                pad_token_id=0,
            )
            total += (out.shape[1] - width) * len(chunk)
        return total

    return {**timed(run), "max_new_tokens_for_all": mean_out, "batch_size": batch_size}


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "commit": commit,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--min-len", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--kv-gib", type=float, default=20.0)
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--batch1-tokens", type=int, default=512)
    ap.add_argument("--only", nargs="*", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--forge-override", nargs="*", default=[], help="extra forge config overrides")
    ap.add_argument("--out", type=Path, default=Path("reports/gpu/results.json"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_throughput needs a CUDA GPU")

    from forge.models.gguf_loader import load_smollm2

    vocab = load_smollm2(dtype="float32", device="cpu").vocab_size
    work = workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    results: dict[str, Any] = {
        "machine": machine(),
        "workload": {
            "requests": args.num_requests,
            "lengths": [args.min_len, args.max_len],
            "seed": args.seed,
            "dtype": args.dtype,
            "output_tokens": sum(out for _, out in work),
        },
    }
    if "forge-cuda" in args.only:
        results["forge-cuda"] = forge_run("cuda", args.dtype, work, args)
    if "forge-torch" in args.only:
        results["forge-torch"] = forge_run("torch", args.dtype, work, args)
    if {"hf-generate-batch", "hf-generate"} & set(args.only):
        model = hf_model(args.dtype)
        if "hf-generate-batch" in args.only:
            results["hf-generate-batch"] = hf_generate_batch(model, work)
        if "hf-generate" in args.only:
            results["hf-generate"] = hf_generate(model, work, args.hf_batch_size)
        del model
    if "batch1" in args.only:
        results["batch1"] = forge_batch1(args.dtype, args)
    if "bandwidth" in args.only:
        results["bandwidth"] = bandwidth(args.dtype)

    for name in SECTIONS:
        if name in results and "output_tok_per_s" in results[name]:
            print(f"{name:>18}: {results[name]['output_tok_per_s']:>10.0f} output tok/s")
    if "bandwidth" in results:
        bw = results["bandwidth"]
        print(
            f"{'bandwidth':>18}: {bw['copy_bandwidth_gb_per_s']:.0f} GB/s,"
            f" decode floor {bw['decode_step_floor_ms']:.3f} ms"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
