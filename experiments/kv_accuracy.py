"""Accuracy of a real model under each KV cache dtype against the exact cache.

``python -m experiments.kv_accuracy [--prompts 16] [--tokens 64] [--model smollm2]`` prints, per
``engine.kv_cache_dtype``: greedy agreement (tokens before each continuation's first divergence from
the exact cache's, over all prompts) and the mean |Δlogprob| of the exact continuation's tokens
(teacher-forced: prompt + the exact cache's continuation run as a prompt with
``prompt_logprobs``, so every position sees the same context). Also what the ``kv_memory`` study's
accuracy rows use."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from dataclasses import dataclass

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.engine import Engine

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three laws of thermodynamics are",
    "To make a cup of tea, first",
    "Photosynthesis is the process by which",
    "import numpy as np\nx = np.arange(10)\n",
    "The quick brown fox",
    "In 1969, the first humans",
    "A good way to learn a new language is",
    "The difference between a list and a tuple in Python is",
    "Water boils at",
    "The best thing about summer is",
    "SELECT name FROM users WHERE",
    "The largest planet in the solar system is",
    "My favourite book is",
)
DTYPES = ("int8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class KVAccuracy:
    kv_cache_dtype: str
    agreeing_tokens: int  # before each continuation's first divergence, summed
    total_tokens: int
    mean_abs_dlogprob: float  # over the exact continuations' tokens, teacher-forced

    @property
    def agreement(self) -> float:
        return self.agreeing_tokens / self.total_tokens


def _engine(model: str, kv_dtype: str) -> Engine:
    return build_engine(
        compose_config([f"model={model}", f"engine.kv_cache_dtype={kv_dtype}", "engine.max_num_seqs=16"])
    )


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
    requests = [Request(f"r{i}", list(p), params) for i, p in enumerate(prompts)]
    for r in requests:
        engine.add_request(r)
    for _ in range(100_000):  # bounded: every request finishes within max_tokens steps
        if not engine.has_unfinished():
            break
        engine.step()
    return requests


def _continuation_logprobs(
    engine: Engine, prompts: list[list[int]], continuations: list[list[int]]
) -> list[list[float]]:
    """Each continuation token's logprob given the prompt and the continuation before it."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    full = [p + c for p, c in zip(prompts, continuations, strict=True)]
    done = _run(engine, full, params)
    out = []
    for r, p, c in zip(done, prompts, continuations, strict=True):
        lps = r.prompt_logprobs or []
        out.append([lps[len(p) + i][tok] for i, tok in enumerate(c)])  # type: ignore[index]
    return out


def measure(model: str = "smollm2", num_prompts: int = 16, num_tokens: int = 64) -> Iterator[KVAccuracy]:
    """One row per quantized dtype, each as soon as it is measured."""
    exact = _engine(model, "auto")
    tok = exact.tokenizer
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(num_prompts)]
    greedy = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
    reference = [r.output_token_ids for r in _run(exact, prompts, greedy)]
    ref_lp = _continuation_logprobs(exact, prompts, reference)
    for name in DTYPES:
        engine = _engine(model, name)
        outs = [r.output_token_ids for r in _run(engine, prompts, greedy)]
        agree = 0
        for a, b in zip(reference, outs, strict=True):
            agree += next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        lp = _continuation_logprobs(engine, prompts, reference)
        deltas = [abs(x - y) for xs, ys in zip(ref_lp, lp, strict=True) for x, y in zip(xs, ys, strict=True)]
        yield KVAccuracy(name, agree, num_prompts * num_tokens, sum(deltas) / len(deltas))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.kv_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for row in measure(args.model, args.prompts, args.tokens):
        print(
            f"{row.kv_cache_dtype:9s} greedy agreement {row.agreeing_tokens}/{row.total_tokens} "
            f"({100 * row.agreement:.1f} %), mean |dlogprob| {row.mean_abs_dlogprob:.4f}",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
