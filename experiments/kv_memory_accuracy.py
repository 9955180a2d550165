"""The ``kv_memory`` study's accuracy section: forge's quantized KV caches against its exact cache
(``experiments.kv_accuracy.measure``) and llama.cpp's ``q8_0`` cache on the same token ids. Fixed
prompts and text, greedy tokens and teacher-forced logprobs: deterministic, so it runs once (not per
seed)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from experiments.common import section, table
from experiments.kv_accuracy import SETUPS, KVAccuracy
from experiments.kv_accuracy import measure as measure_accuracy
from experiments.kv_accuracy_llama_cpp import llama_cpp_rows, llama_cpp_version

ACC_FMT = {"agreement_pct": ".1f", "mean_abs_dlogprob": ".4f", "text_perplexity": ".3f"}
ACC_FMT["text_mean_abs_dlogprob"] = ".4f"


def accuracy_row(row: KVAccuracy) -> dict[str, Any]:
    return {
        "engine": row.engine,
        "kv_cache_dtype": row.kv_cache_dtype,
        "reference": row.reference,
        "greedy_agreement": f"{row.agreeing_tokens}/{row.total_tokens}" if row.agreeing_tokens >= 0 else "-",
        "agreement_pct": 100 * row.agreement,
        "mean_abs_dlogprob": row.mean_abs_dlogprob,
        "text_perplexity": row.perplexity,
        "text_mean_abs_dlogprob": row.text_mean_abs_dlogprob,
    }


def accuracy_table(size: str) -> tuple[pd.DataFrame, str, bool]:
    """forge's rows, and llama.cpp's on the same token ids when it can run (SmolLM2, llama-cpp-python
    installed; the tiny model has no GGUF); the table, its setup's description and whether llama.cpp ran."""
    setup = SETUPS[size]
    run = measure_accuracy(setup)
    rows = list(run.rows)
    with_llama = setup.model == "smollm2" and llama_cpp_version() is not None
    if with_llama:
        rows += llama_cpp_rows(setup, run.inputs, setup.num_prompts)
    described = (
        f"`experiments.kv_accuracy.SETUPS[{size!r}]`: model={setup.model}, {setup.num_prompts} prompts x "
        f"{setup.new_tokens} greedy tokens ({setup.prompt_tokens}-token prompts), perplexity text "
        f"{run.inputs.scored_tokens + len(run.inputs.windows)} tokens in {len(run.inputs.windows)} windows of "
        f"{setup.window} prefilled {setup.chunk} tokens per step"
    )
    return pd.DataFrame([accuracy_row(r) for r in rows]), described, with_llama


def accuracy_notes(acc: pd.DataFrame, with_llama: bool, cpu_s: float) -> list[str]:
    """The accuracy table's findings, from its rows."""
    forge = acc[acc["engine"] == "forge"]
    exact = forge.iloc[0]
    parts = [
        f"{r.kv_cache_dtype} {r.agreement_pct:.1f} % greedy agreement, text perplexity "
        f"{r.text_perplexity:.3f} (mean |Δlogprob| {r.text_mean_abs_dlogprob:.4f})"
        for r in forge.iloc[1:].itertuples()
    ]
    notes = [
        f"- Accuracy (forge, against its exact float32 cache, text perplexity {exact['text_perplexity']:.3f}; "
        "one deterministic run, no seeds: fixed prompts and text, greedy tokens): "
        + "; ".join(parts)
        + f". The accuracy section took {cpu_s:.0f} CPU s."
    ]
    if with_llama:
        f16, q8 = acc[acc["engine"] != "forge"].iloc[0], acc[acc["engine"] != "forge"].iloc[1]
        notes.append(
            f"- llama.cpp on the same GGUF and token ids: perplexity {f16['text_perplexity']:.3f} with its f16 "
            f"cache, {q8['text_perplexity']:.3f} with `-ctk q8_0 -ctv q8_0` (mean |Δlogprob| "
            f"{q8['text_mean_abs_dlogprob']:.4f}), greedy agreement {q8['agreement_pct']:.1f} % with its f16 "
            "cache; its continuations' logprobs are not read (nan). Each engine is compared with its own exact "
            "cache (llama.cpp computes with the Q4_1 weights in place, forge with them dequantized to float32)."
        )
    else:
        notes.append(
            "- llama.cpp's `-ctk q8_0 -ctv q8_0` is not run (tiny model: no GGUF; or llama-cpp-python missing)."
        )
    return notes


def accuracy_section(acc: pd.DataFrame, described: str) -> list[str]:
    """The report's ``Accuracy against the exact cache`` section."""
    return section(
        "Accuracy against the exact cache",
        [
            f"{described}. One run, not repeated over seeds: the prompts and the text are fixed and every "
            "token is greedy or teacher-forced, so a rerun gives the same rows. Text and prompts: "
            "`experiments/data/opticks_book1.txt` (the opening of Newton's *Opticks*, book I, Project "
            "Gutenberg's public-domain text): its first tokens are the perplexity text, the prompts seeded "
            "slices of the rest; llama.cpp is given forge's token ids. "
            "greedy_agreement: tokens before each continuation's first divergence from the reference's; "
            "mean_abs_dlogprob: of the reference's continuation tokens, teacher-forced; text_perplexity and "
            "text_mean_abs_dlogprob: every text token but each window's first, teacher-forced (each later "
            "chunk reads the earlier chunks' K/V back from the cache in its dtype). "
            "nan / -: not measured, or the reference itself.",
            "",
            table(acc, list(acc.columns), ACC_FMT),
        ],
    )
