"""The kv_memory study's llama.cpp rows (``experiments.kv_accuracy_llama_cpp``) on forge's token ids:
a few short windows and prompts of the study's text, SmolLM2's GGUF (marker ``realmodel``)."""

from __future__ import annotations

import dataclasses

import pytest

from experiments.kv_accuracy import SETUPS, measure
from experiments.kv_accuracy_llama_cpp import llama_cpp_rows

pytestmark = pytest.mark.realmodel


def test_llama_cpp_reads_forges_token_ids_and_its_q8_0_cache() -> None:
    pytest.importorskip("llama_cpp")
    setup = dataclasses.replace(
        SETUPS["small"], num_prompts=2, new_tokens=8, text_tokens=128, window=64, chunk=16, kv_gib=0.05
    )
    forge = measure(setup, dtypes=())  # forge's exact cache only
    f16, q8 = llama_cpp_rows(setup, forge.inputs, 2)
    exact = forge.rows[0].perplexity
    # the same ids, the same weights: llama.cpp (Q4_1 x Q8_1 activations) within 10 % of forge's float32 (4 % measured)
    assert abs(f16.perplexity / exact - 1) < 0.1, (f16.perplexity, exact, q8)
    assert f16.agreeing_tokens == -1 and q8.total_tokens == 16
    # the q8_0 cache is read back: the text's logprobs move, a little
    assert 0 < q8.text_mean_abs_dlogprob < 0.2, q8
    assert abs(q8.perplexity / f16.perplexity - 1) < 0.05
