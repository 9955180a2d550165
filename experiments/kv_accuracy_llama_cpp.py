"""llama.cpp's ``-ctk q8_0 -ctv q8_0`` KV cache against its f16 cache, on the token ids forge's
``kv_accuracy`` measures (the same SmolLM2 GGUF forge loads, forge's tokenization): greedy agreement
of the q8_0 cache's continuations with the f16 cache's, and the perplexity and mean |Δlogprob| of
the fixed text, each window evaluated in ``chunk``-token batches so that later batches read the
earlier ones' K/V back from the cache in its type. Needs ``llama-cpp-python`` (flash attention on:
llama.cpp's quantized V cache requires it)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from experiments.kv_accuracy import (
    AccuracyInputs,
    AccuracySetup,
    KVAccuracy,
    agreeing_prefix,
    mean_abs_delta,
    perplexity,
)
from forge.models.fetch import smollm2_path

F16, Q8_0 = "f16", "q8_0"


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, None when it is not installed."""
    try:
        import llama_cpp
    except ImportError:
        return None
    return str(llama_cpp.__version__)


def _llama(kv_type: str, setup: AccuracySetup) -> Any:
    import llama_cpp

    ggml_type = {F16: llama_cpp.GGML_TYPE_F16, Q8_0: llama_cpp.GGML_TYPE_Q8_0}[kv_type]
    return llama_cpp.Llama(
        str(smollm2_path()),
        n_threads=1,
        n_threads_batch=1,
        n_ctx=max(setup.window, setup.prompt_tokens + setup.new_tokens),
        n_batch=setup.chunk,
        n_ubatch=setup.chunk,
        type_k=ggml_type,
        type_v=ggml_type,
        flash_attn=True,
        logits_all=True,
        verbose=False,
    )


def _greedy(llm: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    outs = []
    for prompt in prompts:
        llm.reset()
        toks: list[int] = []
        for _, t in zip(range(new_tokens), llm.generate(prompt, top_k=1, temp=0.0, reset=True), strict=False):
            toks.append(int(t))
        outs.append(toks)
    return outs


def _text_logprobs(llm: Any, windows: list[list[int]]) -> list[list[float]]:
    """Each window's tokens but the first: their logprob given the window before them."""
    out = []
    for window in windows:
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[: len(window) - 1], dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
        picked = logits[np.arange(len(window) - 1), window[1:]]
        out.append((picked - log_z).tolist())
    return out


def llama_cpp_rows(setup: AccuracySetup, inputs: AccuracyInputs, greedy_prompts: int) -> Iterator[KVAccuracy]:
    """llama.cpp's f16 cache (the reference) and its q8_0 cache; greedy agreement over the first
    ``greedy_prompts`` of the prompts (all of them: ``setup.num_prompts``)."""
    engine = f"llama.cpp {llama_cpp_version()}"
    prompts = inputs.prompts[:greedy_prompts]
    measured = {}
    for kv_type in (F16, Q8_0):
        llm = _llama(kv_type, setup)
        try:
            measured[kv_type] = (_greedy(llm, prompts, setup.new_tokens), _text_logprobs(llm, inputs.windows))
        finally:
            llm.close()
    (ref_greedy, ref_text), (q8_greedy, q8_text) = measured[F16], measured[Q8_0]
    total = len(prompts) * setup.new_tokens
    yield KVAccuracy(engine, F16, "exact", -1, total, math.nan, perplexity(ref_text), math.nan)
    yield KVAccuracy(
        engine,
        f"{Q8_0} (-ctk q8_0 -ctv q8_0)",
        f"llama.cpp {F16}",
        agreeing_prefix(ref_greedy, q8_greedy),
        total,
        math.nan,  # its continuations' logprobs are not read
        perplexity(q8_text),
        mean_abs_delta(ref_text, q8_text),
    )
