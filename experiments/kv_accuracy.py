"""Accuracy of a real model under each KV cache dtype against the exact cache.

``python -m experiments.kv_accuracy [--size small|tiny] [--prompts N] [--tokens N]`` prints, per
``engine.kv_cache_dtype``: greedy agreement (tokens before each continuation's first divergence
from the exact cache's, over all prompts), the mean |Δlogprob| of the exact continuation's tokens
(teacher-forced: prompt + the exact cache's continuation run as a prompt with ``prompt_logprobs``,
so every position sees the same context), and the perplexity and mean |Δlogprob| of a fixed text,
teacher-forced in windows that are prefilled in chunks (every chunk attends to the earlier chunks'
K/V read back from the cache in its dtype). Also what the ``kv_memory`` study's accuracy rows use.

The text and the prompts come from ``data/opticks_book1.txt``: the opening of the first book of
Isaac Newton's *Opticks* (4th edition, 1730; Project Gutenberg's public-domain transcription, as
shipped in libbacktrace's test data). Its first ``text_tokens`` tokens are the perplexity text; the
prompts are ``num_prompts`` slices of ``prompt_tokens`` tokens from the rest, drawn with a fixed seed."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.engine import Engine
from forge.models.base import Model
from forge.tokenizers.base import Tokenizer

TEXT_PATH = Path(__file__).parent / "data" / "opticks_book1.txt"
DTYPES = ("bfloat16", "int8", "fp8_e4m3", "fp8_e5m2")  # bfloat16: a 16-bit reference row
PROMPT_SEED = 0


@dataclass(frozen=True)
class AccuracySetup:
    """How much is measured: prompts x new tokens for greedy agreement, and the perplexity text cut into
    ``window``-token requests prefilled ``chunk`` tokens per step."""

    model: str
    num_prompts: int
    prompt_tokens: int
    new_tokens: int
    text_tokens: int
    window: int
    chunk: int
    kv_gib: float  # engine.kv_cache_memory_gib: room for every prompt's continuation at once

    def overrides(self) -> list[str]:
        return [
            f"model={self.model}",
            f"engine.max_num_seqs={self.num_prompts}",
            f"engine.max_num_batched_tokens={self.chunk}",
            f"engine.max_model_len={max(self.window, self.prompt_tokens + self.new_tokens) + 1}",
            f"engine.kv_cache_memory_gib={self.kv_gib}",
        ]


SETUPS = {
    "small": AccuracySetup("smollm2", 64, 32, 128, 4096, 1024, 128, 1.0),
    "tiny": AccuracySetup("tiny", 2, 8, 8, 64, 32, 16, 0.001),
}


@dataclass(frozen=True)
class AccuracyInputs:
    """The token ids every engine (forge's and llama.cpp's) is given."""

    prompts: list[list[int]]
    windows: list[list[int]]  # the perplexity text, one request each

    @property
    def scored_tokens(self) -> int:
        """Tokens whose logprob the perplexity averages: all but each window's first."""
        return sum(len(w) - 1 for w in self.windows)


def accuracy_inputs(tokenizer: Tokenizer, setup: AccuracySetup) -> AccuracyInputs:
    ids = tokenizer.encode(TEXT_PATH.read_text(encoding="utf-8"))
    if setup.text_tokens % setup.window:
        raise ValueError(f"text_tokens {setup.text_tokens} is not a multiple of window {setup.window}")
    text, rest = ids[: setup.text_tokens], ids[setup.text_tokens :]
    slots = len(rest) // setup.prompt_tokens
    if slots < setup.num_prompts:
        raise ValueError(f"{TEXT_PATH.name} has {slots} prompt slices after the text, {setup.num_prompts} asked")
    picks = random.Random(PROMPT_SEED).sample(range(slots), setup.num_prompts)
    prompts = [rest[i * setup.prompt_tokens : (i + 1) * setup.prompt_tokens] for i in picks]
    windows = [text[i : i + setup.window] for i in range(0, len(text), setup.window)]
    return AccuracyInputs(prompts, windows)


@dataclass(frozen=True)
class KVAccuracy:
    """One KV dtype against its engine's exact cache (``reference``); the reference's own row has no
    agreement or Δ figures (nan). A figure an engine does not measure is nan."""

    engine: str
    kv_cache_dtype: str
    reference: str
    agreeing_tokens: int  # before each continuation's first divergence, summed; -1: the reference itself
    total_tokens: int
    mean_abs_dlogprob: float  # over the exact continuations' tokens, teacher-forced
    perplexity: float  # of the fixed text
    text_mean_abs_dlogprob: float  # over the fixed text's tokens

    @property
    def agreement(self) -> float:
        return self.agreeing_tokens / self.total_tokens if self.agreeing_tokens >= 0 else math.nan


def agreeing_prefix(reference: list[list[int]], other: list[list[int]]) -> int:
    """Tokens before each pair's first divergence, summed."""
    return sum(
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        for a, b in zip(reference, other, strict=True)
    )


def mean_abs_delta(reference: list[list[float]], other: list[list[float]]) -> float:
    deltas = [abs(x - y) for xs, ys in zip(reference, other, strict=True) for x, y in zip(xs, ys, strict=True)]
    return sum(deltas) / len(deltas)


def perplexity(logprobs: list[list[float]]) -> float:
    flat = [x for xs in logprobs for x in xs]
    return math.exp(-sum(flat) / len(flat))


def _run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
    requests = [Request(f"r{i}", list(p), params) for i, p in enumerate(prompts)]
    engine.run(requests)
    return requests


def _token_logprobs(engine: Engine, sequences: list[list[int]]) -> list[list[float]]:
    """Each sequence's tokens but the first: their logprob given the tokens before them (the sequence
    run as a chunked prompt with ``prompt_logprobs``)."""
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    out = []
    for r, seq in zip(_run(engine, sequences, params), sequences, strict=True):
        lps = r.prompt_logprobs or []
        out.append([lps[i][seq[i]] for i in range(1, len(seq))])  # type: ignore[index]
    return out


def _continuation_logprobs(
    engine: Engine, prompts: list[list[int]], continuations: list[list[int]]
) -> list[list[float]]:
    """Each continuation token's logprob given the prompt and the continuation before it."""
    lps = _token_logprobs(engine, [p + c for p, c in zip(prompts, continuations, strict=True)])
    return [lp[len(p) - 1 :] for lp, p in zip(lps, prompts, strict=True)]


@dataclass(frozen=True)
class _Measured:
    greedy: list[list[int]]
    continuation_logprobs: list[list[float]]  # of the reference's continuations
    text_logprobs: list[list[float]]


def _measure(engine: Engine, inputs: AccuracyInputs, new_tokens: int, reference: list[list[int]] | None) -> _Measured:
    greedy = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    outs = [list(r.output_token_ids) for r in _run(engine, inputs.prompts, greedy)]
    continuation = _continuation_logprobs(engine, inputs.prompts, reference if reference is not None else outs)
    return _Measured(outs, continuation, _token_logprobs(engine, inputs.windows))


@dataclass(frozen=True)
class AccuracyRun:
    inputs: AccuracyInputs  # the token ids, for other engines to be given the same
    rows: list[KVAccuracy]  # forge's exact cache (the model's float32) first, then one per dtype


def measure(setup: AccuracySetup, dtypes: tuple[str, ...] = DTYPES) -> AccuracyRun:
    exact_engine = build_engine(compose_config([*setup.overrides(), "engine.kv_cache_dtype=auto"]))
    model: Model = exact_engine.runner.model
    try:
        inputs = accuracy_inputs(exact_engine.tokenizer, setup)
        exact = _measure(exact_engine, inputs, setup.new_tokens, None)
    finally:
        exact_engine.close()
    total = setup.num_prompts * setup.new_tokens
    nan = math.nan
    rows = [KVAccuracy("forge", "float32", "exact", -1, total, nan, perplexity(exact.text_logprobs), nan)]
    for name in dtypes:
        engine = build_engine(compose_config([*setup.overrides(), f"engine.kv_cache_dtype={name}"]), model=model)
        try:
            got = _measure(engine, inputs, setup.new_tokens, exact.greedy)
        finally:
            engine.close()
        row = KVAccuracy(
            "forge",
            name,
            "forge float32",
            agreeing_prefix(exact.greedy, got.greedy),
            total,
            mean_abs_delta(exact.continuation_logprobs, got.continuation_logprobs),
            perplexity(got.text_logprobs),
            mean_abs_delta(exact.text_logprobs, got.text_logprobs),
        )
        rows.append(row)
    return AccuracyRun(inputs, rows)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.kv_accuracy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SETUPS), default="small")
    ap.add_argument("--prompts", type=int, default=None, help="instead of the size's number of prompts")
    ap.add_argument("--tokens", type=int, default=None, help="instead of the size's greedy tokens per prompt")
    args = ap.parse_args()
    for flag, value in (("--prompts", args.prompts), ("--tokens", args.tokens)):
        if value is not None and value < 1:
            ap.error(f"{flag} must be >= 1, got {value}")
    setup = SETUPS[args.size]
    setup = dataclasses.replace(
        setup,
        num_prompts=setup.num_prompts if args.prompts is None else args.prompts,
        new_tokens=setup.new_tokens if args.tokens is None else args.tokens,
    )
    print(f"load average at start: {os.getloadavg()}; {setup}", flush=True)
    for row in measure(setup).rows:
        print(
            f"{row.kv_cache_dtype:9s} greedy agreement {row.agreeing_tokens}/{row.total_tokens} "
            f"({100 * row.agreement:.1f} %), continuation mean |dlogprob| {row.mean_abs_dlogprob:.4f}, "
            f"text perplexity {row.perplexity:.3f}, text mean |dlogprob| {row.text_mean_abs_dlogprob:.4f}",
            flush=True,
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
