"""Gemma-3-270M (Q4_K_M GGUF from the registry) against ``transformers`` on the same file.

Tolerance for logits: both sides run float32 on bit-identical dequantized weights (checked
below), so they differ only in reduction order inside GEMMs, norms and softmax, grown over 18
layers. Measured max |diff| is ~4e-5 on short prompts (logits of magnitude ~35) and ~1e-4 on the
last positions of a 600-token prompt, where the local layers' 512-token sliding window cuts in
(turning the window off there moves the logits by ~15). We allow 1e-3 absolute, still far below
the top-2 gaps that decide the greedy tokens (checked by the identical continuations).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from forge.kernels.base import AttentionMetadata
from forge.kernels.batch import ForwardBatch
from forge.models.fetch import gemma3_path
from forge.models.gemma3 import Gemma3
from forge.models.gguf_file import GGUFFile
from forge.models.gguf_loader import config_from_gguf, state_dict_from_gguf, tokenizer_of
from tests.forward_helpers import BLOCK_SIZE, SingleSequence, greedy, prefill_logits
from tests.hf_reference import load_hf_gguf

pytestmark = pytest.mark.realmodel

PROMPTS = [
    "The capital of France is",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "<start_of_turn>user\nWrite a haiku about autumn.<end_of_turn>\n<start_of_turn>model\n",
]
TEXTS = [
    *PROMPTS,
    "Héllo wörld — 你好，世界! Ünïcödé ñ 🚀🚀 emoji",
    'for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(f"{i=}")  # even\n',
    "   leading, trailing   \n\n\n   and\t\ttabs  ",
    "    four  two     five spaces",
    "x=1; y = 3.14159; z = 1e-5 <eos> after <end_of_turn>",
    "SELECT * FROM users WHERE name = 'O''Brien';",
    "<table><tr><td>a</td></tr></table> <h1>title</h1>",
    "ÿ\x00\x01 control \u200b zero-width ｆｕｌｌｗｉｄｔｈ ﬁ",
    "▁literal▁marks▁ 1234567890",
    "",
]
# Past the 512-token sliding window of the local layers.
LONG_TEXT = " ".join(f"item {i} is {i * 7 % 13}." for i in range(75))


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return str(gemma3_path())


@pytest.fixture(scope="module")
def gguf_state(gguf_path: str) -> tuple[GGUFFile, dict[str, torch.Tensor]]:
    """The file opened once (reading its metadata takes ~10 s) and its dequantized weights."""
    gguf = GGUFFile(gguf_path)
    return gguf, state_dict_from_gguf(gguf, config_from_gguf(gguf))


@pytest.fixture(scope="module")
def model(gguf_state: tuple[GGUFFile, dict[str, torch.Tensor]]) -> Gemma3:
    """What ``load_gemma3(max_position=1024)`` (conf/model/gemma3.yaml) builds, from the shared file."""
    gguf, state = gguf_state
    return Gemma3.from_state_dict(config_from_gguf(gguf, 1024), state, tokenizer_of(gguf))


@pytest.fixture(scope="module")
def hf(gguf_path: str) -> tuple[Any, Any]:
    return load_hf_gguf(gguf_path)


def test_config(model: Gemma3) -> None:
    c = model.config
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (18, 640, 4, 1, 256)
    assert (c.vocab_size, c.intermediate_size, c.sliding_window, c.query_pre_attn_scalar) == (262144, 2048, 512, 256)
    assert c.rope_theta == 1e6 and c.rope_local_theta == 1e4 and c.rope_scaling is None
    assert c.tie_word_embeddings and c.final_logit_softcapping is None
    assert [i for i, layer in enumerate(model.layers) if layer.window is None] == [5, 11, 17]


def test_config_matches_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    theirs, ours = hf[1].config, model.config
    assert theirs.layer_types == [
        "sliding_attention" if ours.is_sliding(i) else "full_attention" for i in range(ours.num_layers)
    ]
    assert (theirs.sliding_window, theirs.query_pre_attn_scalar, theirs.head_dim) == (
        ours.sliding_window,
        ours.query_pre_attn_scalar,
        ours.head_dim,
    )
    assert theirs.rope_parameters["sliding_attention"]["rope_theta"] == ours.rope_local_theta
    assert theirs.rope_parameters["full_attention"]["rope_theta"] == ours.rope_theta


def test_tokenizer_matches_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    theirs = hf[0]
    for text in TEXTS:
        ids = model.tokenizer.encode(text)
        assert ids == theirs.encode(text), text
        assert model.tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True), text
        assert model.tokenizer.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    assert model.tokenizer.encode(PROMPTS[2])[:3] == [2, 105, 2364]  # <bos> <start_of_turn> user


def test_end_of_turn_ends_generation(model: Gemma3) -> None:
    """As in llama.cpp: the file names only <eos>, but <end_of_turn> ends a turn too."""
    assert model.tokenizer.eos_token_ids == frozenset({1, 106})


def test_weights_identical_to_transformers(
    gguf_state: tuple[GGUFFile, dict[str, torch.Tensor]], hf: tuple[Any, Any]
) -> None:
    ours = gguf_state[1]
    theirs = hf[1].state_dict()
    assert set(ours) == set(theirs) - {"lm_head.weight"}  # tied
    for name in (
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.7.self_attn.k_proj.weight",
        "model.layers.3.self_attn.q_norm.weight",
        "model.layers.17.post_feedforward_layernorm.weight",
        "model.layers.11.mlp.down_proj.weight",
        "model.norm.weight",
        "model.embed_tokens.weight",
    ):
        assert torch.equal(ours[name], theirs[name].float()), name


def test_logits_match_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    for prompt in PROMPTS:
        ids = model.tokenizer.encode(prompt)
        with torch.no_grad():
            expected = hf[1](torch.tensor([ids])).logits[0].float()
        torch.testing.assert_close(prefill_logits(model, ids), expected, rtol=0, atol=1e-3)


def _last_logits(model: Gemma3, ids: list[int], n: int) -> torch.Tensor:
    """Prefill of ``ids`` returning only the last ``n`` positions' logits (all would be 262144 wide)."""
    seq = SingleSequence(model, len(ids))
    total = len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, total]),
        seq_lens=torch.tensor([total]),
        block_tables=seq.table[None, :],
        slot_mapping=torch.arange(total),
        block_size=BLOCK_SIZE,
        query_lens_cpu=[total],
        seq_lens_cpu=[total],
    )
    batch = ForwardBatch(torch.tensor(ids), torch.arange(total), meta, torch.arange(total - n, total))
    return model.forward(batch, seq.cache, seq.backend)


def test_sliding_window_matches_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    ids = model.tokenizer.encode(LONG_TEXT)
    assert 550 < len(ids) < 700
    with torch.no_grad():
        expected = hf[1](torch.tensor([ids]), logits_to_keep=4).logits[0].float()
    torch.testing.assert_close(_last_logits(model, ids, 4), expected, rtol=0, atol=1e-3)


def _hf_greedy(lm: Any, ids: list[int], n: int) -> list[int]:
    """Plain argmax decoding (``generate`` would apply logits processors such as min-length)."""
    out: list[int] = []
    past, x = None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            result = lm(x, past_key_values=past, use_cache=True, logits_to_keep=1)
            past = result.past_key_values
            out.append(int(result.logits[0, -1].argmax()))
            x = torch.tensor([[out[-1]]])
    return out


def test_greedy_matches_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    ids = model.tokenizer.encode(PROMPTS[0])
    ours = greedy(model, ids, 40)
    assert ours == _hf_greedy(hf[1], ids, 40)
    assert model.tokenizer.decode(ours).startswith(" the capital of the country of France.")


def test_greedy_across_the_window_matches_transformers(model: Gemma3, hf: tuple[Any, Any]) -> None:
    """A 500-token prompt decoded past position 512: the decode path's window cuts in mid-run."""
    ids = model.tokenizer.encode(LONG_TEXT)[:500]
    assert greedy(model, ids, 20) == _hf_greedy(hf[1], ids, 20)


def test_conf_model_gemma3_loads_it() -> None:
    import inspect

    from forge.config import compose_config
    from forge.models.gguf_loader import load_gemma3

    cfg = compose_config(["model=gemma3"]).model
    assert cfg._target_ == "forge.models.gguf_loader.load_gemma3"
    assert set(cfg) - {"_target_"} <= set(inspect.signature(load_gemma3).parameters)


def test_engine_greedy_matches_single_sequence_on_both_backends(model: Gemma3) -> None:
    """Through the engine (chunked prefill of a prompt longer than the window, batched decode):
    the same greedy tokens as one sequence alone, on backend=torch and on backend=cpu."""
    from forge.config import compose_config
    from forge.core.request import Request
    from forge.core.sampling_params import SamplingParams
    from forge.engine.build import build_engine
    from forge.kernels.cpu import native

    long_ids = model.tokenizer.encode(LONG_TEXT)[:505]
    prompts = [model.tokenizer.encode(p) for p in PROMPTS[:2]] + [long_ids]
    expected = [greedy(model, ids, 24) for ids in prompts]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    backends = ["torch", "cpu"] if native.available() else ["torch"]
    for backend in backends:
        cfg = compose_config(
            ["model=gemma3", "model.max_position=1024", f"backend={backend}", "engine.max_num_batched_tokens=256"]
        )
        engine = build_engine(cfg, model=model)
        requests = [Request(f"r{i}", ids, params, arrival_time=0.0) for i, ids in enumerate(prompts)]
        finals = engine.run(requests)
        for i, want in enumerate(expected):
            assert list(finals[f"r{i}"].token_ids) == want, (backend, i)


def _engine_greedy(model: Gemma3, prompts: list[list[int]], free: bool, *overrides: str) -> tuple[list[list[int]], int]:
    """Greedy 40-token continuations through the engine (``kvcache.free_outside_window=free``) and the
    most KV memory held (in classic blocks' bytes: pages x layers per page / layers)."""
    from forge.config import compose_config
    from forge.core.request import Request
    from forge.core.sampling_params import SamplingParams
    from forge.engine.build import build_engine

    cfg = compose_config(
        ["model=gemma3", "model.max_position=1024", f"kvcache.free_outside_window={str(free).lower()}", *overrides]
    )
    engine = build_engine(cfg, model=model)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(Request(f"r{i}", ids, params, arrival_time=0.0))
    kv, finals, peak = engine.scheduler.kv, {}, 0
    for _ in range(2000):
        finals.update({o.request_id: list(o.token_ids) for o in engine.step() if o.finished})
        peak = max(peak, kv.num_blocks - kv.num_free_blocks())
        if not engine.has_unfinished():
            break
    engine.check_idle()
    per_page = kv.kv_groups.layers_per_page if kv.kv_groups is not None else model.config.num_layers
    return [finals[f"r{i}"] for i in range(len(prompts))], peak * per_page


def test_window_freeing_keeps_the_greedy_tokens_past_the_window(model: Gemma3) -> None:
    """A 560-token prompt (past the local layers' 512-token window) and 40 greedy tokens: freeing the
    blocks outside the window gives the tokens of keeping them, holding less KV."""
    ids = model.tokenizer.encode(LONG_TEXT * 2)[:560]
    kept, kept_held = _engine_greedy(model, [ids], False, "engine.max_num_batched_tokens=256")
    freed, freed_held = _engine_greedy(model, [ids], True, "engine.max_num_batched_tokens=256")
    assert freed == kept
    assert freed_held < kept_held


@pytest.mark.slow
def test_window_freeing_keeps_the_greedy_tokens_with_batches_and_prefix_caching(model: Gemma3) -> None:
    """Three prompts of 560 to 940 tokens sharing a 520-token prefix, batched, chunked, prefix-cached,
    on backend=torch and backend=cpu: the same tokens with and without window freeing."""
    from forge.kernels.cpu import native

    base = model.tokenizer.encode(LONG_TEXT * 3)
    prompts = [base[:520] + base[1000 : 1000 + n] for n in (40, 200, 420)]
    backends = ["torch", "cpu"] if native.available() else ["torch"]
    for backend in backends:
        common = (f"backend={backend}", "engine.max_num_batched_tokens=192", "kvcache.enable_prefix_caching=true")
        kept, _ = _engine_greedy(model, prompts, False, *common)
        freed, _ = _engine_greedy(model, prompts, True, *common)
        assert freed == kept, backend
