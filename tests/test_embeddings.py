"""Embedding requests (issue 18): pooled final hidden states through the engine's scheduler.

The tiny model's embeddings against a dense torch computation of the same weights; chunked prefill,
prefix caching and preemption give the embedding one whole chunk gives; an embedding request batched
with generation leaves the generated tokens unchanged; the simulated path is deterministic."""

from __future__ import annotations

import math

import pytest
import torch

from forge.config import ConfigError, compose_config
from forge.core.pooling import PoolingParams
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.llm import LLM
from forge.models.llama import random_state_dict, tiny_config

PROMPT = [(7 * i + 3) % 300 + 10 for i in range(40)]


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def dense_final_hidden(ids: list[int], seed: int = 0) -> torch.Tensor:
    """The tiny model's final hidden states (after the final norm) of every position, computed
    densely from its Hugging Face-named weights: no KV cache, no paging, no forge kernels."""
    cfg = tiny_config()
    w = random_state_dict(cfg, seed)
    nh, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    n = len(ids)
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    cos, sin = torch.cat((angles.cos(),) * 2, -1)[:, None], torch.cat((angles.sin(),) * 2, -1)[:, None]
    mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"])
        q = _rotate((h @ w[p + "self_attn.q_proj.weight"].T).view(n, nh, d), cos, sin)
        k = _rotate((h @ w[p + "self_attn.k_proj.weight"].T).view(n, nkv, d), cos, sin)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(n, nkv, d)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d) + mask
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, nh * d)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["model.norm.weight"])


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("model=tiny")


def test_tiny_embeddings_equal_a_dense_torch_computation(llm: LLM) -> None:
    hidden = dense_final_hidden(PROMPT)
    mean = hidden.mean(0)
    cases = {
        PoolingParams("mean", normalize=False): mean,
        PoolingParams("mean"): mean / mean.norm(),
        PoolingParams("last", normalize=False): hidden[-1],
        PoolingParams("last"): hidden[-1] / hidden[-1].norm(),
    }
    for params, want in cases.items():
        (got,) = llm.embed([PROMPT], params)
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, atol=1e-10, rtol=0), params
    (on_cpu_backend,) = LLM("model=tiny", "backend=cpu").embed([PROMPT], PoolingParams("mean", normalize=False))
    assert torch.allclose(torch.tensor(on_cpu_backend, dtype=torch.float64), mean, atol=1e-10, rtol=0)
    text = llm.embed("Hello, embeddings")  # the configured default: mean, L2-normalised
    ids = llm.tokenizer.encode("Hello, embeddings")
    want = dense_final_hidden(ids).mean(0)
    assert torch.allclose(torch.tensor(text[0], dtype=torch.float64), want / want.norm(), atol=1e-10, rtol=0)


def test_chunked_prefill_prefix_cache_and_preemption_give_the_one_chunk_embedding(llm: LLM) -> None:
    """8-token chunks (5 steps for 40 tokens), a prefix cache that already holds the prompt, and a pool
    so small that generation traffic preempts the embedding request: the same embedding each time."""
    (whole,) = llm.embed([PROMPT], PoolingParams("mean", normalize=False))
    chunked = LLM("model=tiny", "engine.max_num_batched_tokens=8", "kvcache.enable_prefix_caching=true")
    for _ in range(2):  # the second time every full block of the prompt is cached: no hit is taken
        (got,) = chunked.embed([PROMPT], PoolingParams("mean", normalize=False))
        assert torch.allclose(torch.tensor(got), torch.tensor(whole), atol=1e-12, rtol=0)
    tight = LLM("model=tiny", "kvcache.num_blocks=8", "kvcache.block_size=8", "engine.max_num_batched_tokens=16")
    engine = tight.engine
    gen = [Request(f"g{i}", PROMPT[i : i + 4], SamplingParams(max_tokens=24, temperature=0)) for i in range(3)]
    emb = Request("e", PROMPT, SamplingParams(max_tokens=1), pooling_params=PoolingParams("mean", normalize=False))
    finals = engine.run([*gen, emb])
    assert engine.scheduler.num_preemptions > 0
    assert finals["e"].embedding is not None and finals["e"].token_ids == []
    assert torch.allclose(torch.tensor(finals["e"].embedding), torch.tensor(whole), atol=1e-12, rtol=0)


def test_an_embedding_request_batched_with_generation_leaves_its_tokens_unchanged() -> None:
    cfg = compose_config(["model=tiny", "engine.max_num_batched_tokens=16"])

    def run(with_embedding: bool) -> tuple[dict[str, list[int]], list[int]]:
        engine = build_engine(cfg)
        requests = [Request(f"g{i}", PROMPT[i : i + 6], SamplingParams(max_tokens=12, temperature=0)) for i in range(3)]
        if with_embedding:
            requests.append(Request("x", PROMPT, SamplingParams(max_tokens=1), pooling_params=PoolingParams()))
        finals = engine.run(requests)
        steps = engine.recorder.steps_frame()
        frame = engine.recorder.requests_frame()
        assert set(frame["request_id"]) == {r.request_id for r in requests}  # every request is in the metrics
        return {rid: out.token_ids for rid, out in finals.items() if rid != "x"}, steps["num_seqs"].tolist()

    alone, _ = run(False)
    mixed, seqs = run(True)
    assert mixed == alone
    assert max(seqs) == 4  # the embedding request (queued last) ran in steps with the three generating ones


def test_embedding_requests_fill_max_model_len_and_no_more() -> None:
    engine = build_engine(compose_config(["model=tiny", "engine.max_model_len=40"]))
    fits = Request("fits", PROMPT, SamplingParams(max_tokens=1), pooling_params=PoolingParams())
    assert engine.run([fits])["fits"].embedding is not None  # a generation request of 40 tokens would not fit
    with pytest.raises(ValueError, match="longer than engine.max_model_len=40"):
        engine.add_request(Request("long", [*PROMPT, 5], SamplingParams(max_tokens=1), pooling_params=PoolingParams()))


def test_simulated_embeddings_are_deterministic_functions_of_the_tokens() -> None:
    """model=synthetic: hidden state of token t is cos((t + 1) k phi), k = 1..hidden (documented)."""
    a = LLM("model=synthetic", "clock=simulated")
    b = LLM("model=synthetic", "clock=simulated", "seed=5")
    got = a.embed([PROMPT, PROMPT[::-1]], PoolingParams("mean", normalize=False))
    assert got == b.embed([PROMPT, PROMPT[::-1]], PoolingParams("mean", normalize=False))
    k = torch.arange(1, a.engine.runner.model.dims.hidden_size + 1, dtype=torch.float64)
    rows = torch.cos(torch.outer(torch.tensor(PROMPT, dtype=torch.float64) + 1, k * (math.sqrt(5) - 1) / 2)).float()
    want = rows.double().mean(0)
    assert torch.allclose(torch.tensor(got[0], dtype=torch.float64), want, atol=1e-12, rtol=0)
    assert got[1] == pytest.approx(got[0], abs=1e-12)  # mean pooling: a bag of tokens


def test_a_bad_pooling_setting_fails_before_the_model_loads() -> None:
    with pytest.raises(ConfigError, match="embedding.pooling must be one of mean, last"):
        build_engine(compose_config(["model=smollm2", "embedding.pooling=max"]))


@pytest.mark.slow
def test_backend_cuda_embeddings_equal_backend_torch() -> None:
    """backend=cuda on the CUDA CPU execution layer (no GPU here): a step with embedding requests runs
    the model eagerly (no graph replay), in 16-token chunks; float32, so within 1e-5 of torch's."""
    prompts: list[str | list[int]] = ["Hello, forge", [256, 72, 105], "a somewhat longer prompt about kernels"]
    model = ["model=tiny", "model.dtype=float32", "engine.max_num_batched_tokens=16"]
    params = PoolingParams("mean", normalize=False)
    want = LLM(*model, "backend=torch").embed(prompts, params)
    got = LLM(*model, "backend=cuda", "backend.device=cpu", "backend.runtime=cpu").embed(prompts, params)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(torch.tensor(g), torch.tensor(w), atol=1e-5, rtol=0)
