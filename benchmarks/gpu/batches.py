"""Decode throughput at fixed batch sizes: B requests of one prompt length decoding together.

Each engine generates the batch twice, with 1 and with ``tokens`` output tokens per request; the
difference is ``B * (tokens - 1)`` decode tokens in the difference of the two wall times, so the
prefill (the same in both) drops out. A warm-up generation first keeps kernel compilation and CUDA
graph capture out of both. forge runs one ``LLM`` per backend with ``max_num_seqs`` = the largest
batch, so B requests decode as one batch of B; transformers' static ``generate`` gets B prompts of
equal length (no padding).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from benchmarks.gpu.models import BenchModel

Generate = Callable[[list[list[int]], int], int]  # (prompts, output tokens each) -> output tokens made


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompts_of(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]


def wall(generate: Generate, prompts: list[list[int]], tokens: int, device: str) -> tuple[int, float]:
    synchronize(device)
    start = time.perf_counter()
    made = generate(prompts, tokens)
    synchronize(device)
    return made, time.perf_counter() - start


def decode_rate(generate: Generate, prompts: list[list[int]], tokens: int, device: str) -> dict[str, Any]:
    """Decode tok/s and step time of one batch (see the module's docstring)."""
    generate(prompts, 2)  # warm-up
    made_1, seconds_1 = wall(generate, prompts, 1, device)
    made_n, seconds_n = wall(generate, prompts, tokens, device)
    if made_n != len(prompts) * tokens or made_1 != len(prompts):
        raise RuntimeError(f"expected {len(prompts)} x {tokens} output tokens, got {made_n} (and {made_1} for 1)")
    decode_seconds = seconds_n - seconds_1
    measurable = decode_seconds > 0  # else noise swamped the decode steps (tiny models, few tokens)
    return {
        "batch": len(prompts),
        "prompt_len": len(prompts[0]),
        "output_tokens_each": tokens,
        "seconds": seconds_n,
        "seconds_one_token": seconds_1,
        "decode_tok_per_s": (made_n - made_1) / decode_seconds if measurable else None,
        "decode_step_ms": 1000 * decode_seconds / (tokens - 1) if measurable else None,
    }


def forge_generate(overrides: Sequence[str], model: BenchModel, max_batch: int, max_len: int) -> Generate:
    """``overrides``: the backend's, and engine limits (KV memory, tokens per step)."""
    from forge.core.sampling_params import SamplingParams
    from forge.llm import LLM

    llm = LLM(
        *overrides,
        *model.overrides(),
        f"engine.max_num_seqs={max_batch}",
        f"engine.max_model_len={max_len}",
        "progress=false",
        "report=false",
    )

    def generate(prompts: list[list[int]], tokens: int) -> int:
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        return sum(len(out.token_ids) for out in llm.generate(prompts, params))

    return generate


def hf_generate(model: BenchModel, device: str) -> Generate:
    hf = model.hf_model(device)

    def generate(prompts: list[list[int]], tokens: int) -> int:
        ids = torch.tensor(prompts, device=device)
        out = hf.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            pad_token_id=0,
        )
        return (out.shape[1] - ids.shape[1]) * ids.shape[0]

    return generate


def sweep(generate: Generate, batches: Sequence[int], prompt_len: int, tokens: int, vocab: int, device: str) -> dict:
    """``decode_rate`` at each batch size, keyed by it."""
    rows = {}
    for batch in batches:
        rows[str(batch)] = decode_rate(generate, prompts_of(batch, prompt_len, vocab, seed=batch), tokens, device)
    return rows
