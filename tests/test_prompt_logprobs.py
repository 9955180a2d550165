"""Prompt logprobs (``SamplingParams.prompt_logprobs``) against the model's own full-prompt forward."""

from __future__ import annotations

import math

import pytest
import torch

from forge.config import compose_config
from forge.core.outputs import RequestOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.engine import Engine
from forge.engine.sim_runner import SimulationRunner
from tests.forward_helpers import prefill_logits

PROMPT = [(7 * i + 3) % 200 + 1 for i in range(37)]  # 37 tokens: several chunks of 8, a partial block


def _engine(*overrides: str) -> Engine:
    return build_engine(compose_config(["model=tiny", "kvcache.enable_prefix_caching=true", *overrides]))


def _run(engine: Engine, requests: list[Request], max_steps: int = 200) -> dict[str, list[RequestOutput]]:
    """Every output of each request, in order (bounded by ``max_steps``)."""
    for r in requests:
        engine.add_request(r)
    outs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            outs[o.request_id].append(o)
    assert not engine.has_unfinished()
    return outs


def _expected(engine: Engine, prompt: list[int], k: int) -> list[dict[int, float] | None]:
    lp = torch.log_softmax(prefill_logits(engine.runner.model, prompt).float(), dim=-1)
    expected: list[dict[int, float] | None] = [None]
    for pos in range(1, len(prompt)):
        row = lp[pos - 1]
        entry = {prompt[pos]: float(row[prompt[pos]])}
        vals, ids = row.topk(k)
        entry.update(zip(ids.tolist(), vals.tolist(), strict=True))
        expected.append(entry)
    return expected


def _assert_close(got: list[dict[int, float] | None] | None, expected: list[dict[int, float] | None]) -> None:
    assert got is not None and len(got) == len(expected)
    assert got[0] is None
    for g, e in zip(got[1:], expected[1:], strict=True):
        assert g is not None and e is not None
        assert set(g) == set(e)
        for token, value in e.items():
            assert math.isclose(g[token], value, rel_tol=1e-4, abs_tol=1e-4)


@pytest.mark.parametrize("budget", [8, 512])
def test_prompt_logprobs_match_the_full_prompt_forward(budget: int) -> None:
    """Chunked (8 tokens a step) or not, with prefix caching on and the prompt already cached by
    an earlier request: every prompt token's logprob and the top-3, on the first output only."""
    engine = _engine(f"engine.max_num_batched_tokens={budget}")
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    warm = _run(engine, [Request("warm", PROMPT, plain)])["warm"]
    asks = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=3)
    outs = _run(engine, [Request("asks", PROMPT, asks), Request("other", PROMPT[:20], plain)])
    first, *rest = outs["asks"]
    _assert_close(first.prompt_logprobs, _expected(engine, PROMPT, 3))
    assert first.num_cached_tokens == 0  # the cached prefix was not used
    assert all(o.prompt_logprobs is None for o in rest)
    assert all(o.prompt_logprobs is None for o in outs["other"])
    assert outs["other"][0].num_cached_tokens == 16  # the other request still hits the cache
    # asking changes nothing else: the same greedy tokens as the request that did not ask
    assert outs["asks"][-1].token_ids == warm[-1].token_ids


def test_prompt_logprobs_zero_gives_only_the_prompt_tokens() -> None:
    engine = _engine("engine.max_num_batched_tokens=8")
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    out = _run(engine, [Request("r", PROMPT[:10], params)])["r"][0]
    assert out.prompt_logprobs is not None
    assert [None if e is None else list(e) for e in out.prompt_logprobs] == [None] + [[t] for t in PROMPT[1:10]]


def test_prompt_logprobs_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)


@pytest.mark.parametrize("prompt_len", [37, 60])
def test_prompt_logprobs_survive_preemption_by_recompute(prompt_len: int) -> None:
    """A cache too small for both requests: the later one (asking) is preempted and recomputed,
    after its first output (37) or in the middle of its prompt (60), and still gets each prompt
    token's logprob once, on its first output only."""
    prompt = [(11 * i + 5) % 200 + 1 for i in range(prompt_len)]
    engine = _engine("engine.max_num_batched_tokens=4", "kvcache.num_blocks=6")
    asks = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    plain = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)
    asking = Request("asks", prompt, asks, arrival_time=1.0)  # the later arrival: the one preempted
    outs = _run(engine, [Request("other", PROMPT[:20], plain), asking], max_steps=2000)
    assert asking.num_preemptions > 0
    first, *rest = outs["asks"]
    _assert_close(first.prompt_logprobs, _expected(engine, prompt, 1))
    assert all(o.prompt_logprobs is None for o in rest)


def test_the_simulation_runner_computes_prompt_logprobs_too() -> None:
    """model=synthetic runs on the SimulationRunner's host fast path; a step with prompt-logprob rows
    takes the tensor path, so the request still gets its prompt logprobs (equal to the tensor path's)."""
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=1)
    got = []
    for host in (True, False):
        engine = build_engine(compose_config(["model=synthetic", "engine.max_num_batched_tokens=8"]))
        assert isinstance(engine.runner, SimulationRunner)
        engine.runner.host = host  # False: the general tensor path
        first = _run(engine, [Request("r", PROMPT, params)])["r"][0]
        assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(PROMPT)
        got.append(first.prompt_logprobs)
    assert got[0] == got[1]
