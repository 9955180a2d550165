"""SmolLM2-135M-Instruct (Q4_1 GGUF from the registry) against ``transformers`` on the same file.

Tolerance for logits: both sides run float32 on bit-identical dequantized weights (checked
below), so they differ only in reduction order inside GEMMs and softmax: ~1e-7 relative
per op, grown over 30 layers. Measured max |diff| is ~6e-5 on logits of magnitude ~30;
we allow 1e-3 absolute, still two orders below the smallest top-2 logit gap that would
flip a greedy choice in these prompts (checked by the identical continuations).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from forge.config import compose_config
from forge.core.pooling import PoolingParams
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.models.fetch import smollm2_path
from forge.models.gguf_file import GGUFFile
from forge.models.gguf_loader import config_from_gguf, load_gguf, state_dict_from_gguf
from forge.models.llama import Llama
from tests.forward_helpers import greedy, prefill_logits
from tests.hf_reference import load_hf_gguf

pytestmark = pytest.mark.realmodel

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
]
TEXTS = [
    *PROMPTS,
    "Héllo wörld — 你好，世界! Ünïcödé ñ 🚀🚀 emoji",
    'for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(f"{i=}")  # even\n',
    "   leading, trailing   \n\n\n   and\t\ttabs  ",
    "x=1; y = 3.14159; z = 1e-5 <|endoftext|> after <|im_end|>",
    "SELECT * FROM users WHERE name = 'O''Brien';",
    "",
]


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return str(smollm2_path())


@pytest.fixture(scope="module")
def model(gguf_path: str) -> Llama:
    loaded = load_gguf(gguf_path, max_position=512)
    assert isinstance(loaded, Llama)
    return loaded


@pytest.fixture(scope="module")
def hf(gguf_path: str) -> tuple[Any, Any]:
    return load_hf_gguf(gguf_path)


def test_config(model: Llama) -> None:
    c = model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size) == (30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0


def test_tokenizer_matches_transformers(model: Llama, hf: tuple[Any, Any]) -> None:
    theirs = hf[0]
    for text in TEXTS:
        ids = model.tokenizer.encode(text)
        assert ids == theirs.encode(text), text
        assert model.tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        assert model.tokenizer.decode(ids, skip_special_tokens=False) == text


def test_digit_runs_follow_llama_cpp(model: Llama) -> None:
    """``pre = smollm`` isolates digits (llama.cpp, and SmolLM2's own tokenizer.json); transformers'
    GGUF converter ignores that pre-tokenizer and differs after whitespace runs. Ids from llama.cpp."""
    text = "  spaces   1234567 3.14159"
    assert model.tokenizer.encode(text) == [216, 5600, 333, 33, 34, 35, 36, 37, 38, 39, 216, 35, 30, 33, 36, 33, 37, 41]


def test_chat_template_matches_transformers(model: Llama, hf: tuple[Any, Any]) -> None:
    messages = [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a color."},
    ]
    for gen in (True, False):
        ours = model.tokenizer.apply_chat_template(messages, add_generation_prompt=gen)
        assert ours == hf[0].apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)


def test_weights_identical_to_transformers(gguf_path: str, hf: tuple[Any, Any]) -> None:
    gguf = GGUFFile(gguf_path)
    ours = state_dict_from_gguf(gguf, config_from_gguf(gguf))
    theirs = hf[1].state_dict()
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.7.self_attn.k_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
        "model.embed_tokens.weight",
    ):
        assert torch.equal(ours[name], theirs[name].float()), name


def test_logits_match_transformers(model: Llama, hf: tuple[Any, Any]) -> None:
    for prompt in PROMPTS:
        ids = model.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = hf[1](torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(prefill_logits(model, ids), expected, rtol=0, atol=1e-3)


def _hf_greedy(lm: Any, ids: list[int], n: int) -> list[int]:
    """Plain argmax decoding (``generate`` would apply logits processors such as min-length)."""
    out: list[int] = []
    past, x = None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            result = lm(x, past_key_values=past, use_cache=True)
            past = result.past_key_values
            out.append(int(result.logits[0, -1].argmax()))
            x = torch.tensor([[out[-1]]])
    return out


def test_greedy_matches_transformers(model: Llama, hf: tuple[Any, Any]) -> None:
    """40 tokens, through an end of turn: this prompt's continuation crosses <|im_end|> at step 30."""
    ids = model.tokenizer.encode(PROMPTS[0])
    assert greedy(model, ids, 40) == _hf_greedy(hf[1], ids, 40)


def test_engine_greedy_matches_single_sequence(model: Llama) -> None:
    forge = pytest.importorskip("forge")
    llm = forge.LLM("model=smollm2", "model.max_position=512")
    outs = llm.generate(PROMPTS, forge.SamplingParams(max_tokens=32, temperature=0))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = model.tokenizer.encode(prompt)
        expected = greedy(model, ids, 32)
        assert out.token_ids == expected[: len(out.token_ids)], prompt
        assert out.text == model.tokenizer.decode(out.token_ids)


def test_int8_weights_stay_close(gguf_path: str, model: Llama) -> None:
    fast = load_gguf(gguf_path, max_position=512, weights="int8")
    ids = model.tokenizer.encode(PROMPTS[1])
    exact, approx = prefill_logits(model, ids), prefill_logits(fast, ids)
    agreement = (exact.argmax(-1) == approx.argmax(-1)).float().mean().item()
    assert agreement >= 0.8  # measured 0.89: approximate by design (fast_weights docstring)


def test_embeddings_match_transformers_hidden_state_pooling(model: Llama, hf: tuple[Any, Any]) -> None:
    """Issue 18: the engine's mean- and last-token-pooled, L2-normalised embeddings (in 16-token chunks,
    beside each other in one batch) against transformers' final hidden states of the same GGUF."""
    engine = build_engine(
        compose_config(["model=smollm2", "engine.max_num_batched_tokens=16", "kvcache.num_blocks=64"]), model=model
    )
    prompts = [model.tokenizer.encode(p) for p in PROMPTS]
    kinds = ("mean", "last")
    requests = [
        Request(f"{kind}-{i}", ids, SamplingParams(max_tokens=1), pooling_params=PoolingParams(kind))
        for kind in kinds
        for i, ids in enumerate(prompts)
    ]
    finals = engine.run(requests)
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            hidden = hf[1].model(torch.tensor([ids])).last_hidden_state[0].double()
        for kind, vector in (("mean", hidden.mean(0)), ("last", hidden[-1])):
            ours = torch.tensor(finals[f"{kind}-{i}"].embedding, dtype=torch.float64)
            torch.testing.assert_close(ours, vector / vector.norm(), rtol=0, atol=1e-4)
