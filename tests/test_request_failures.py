"""A per-request failure stays per-request: a request whose constraint or sampling fails, or the
requests of a model step that raised, finish with ``finish_reason="error"`` and free their KV
blocks; the other requests' greedy tokens are unchanged and the engine goes on."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.engine import Engine
from forge.llm import LLM

PROMPTS = ["hello there", "the cat sat on the mat", "abcabcabc", "x"]
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


class RaisingConstraint:
    """Allows every token until its ``fail_at``-th mask, which raises."""

    def __init__(self, fail_at: int) -> None:
        self.calls = itertools.count()
        self.fail_at = fail_at

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        if next(self.calls) == self.fail_at:
            raise RuntimeError("injected constraint failure")
        return None

    def accept(self, token: int) -> None:
        pass


class NothingAllowed:
    """A constraint that masks every token (no valid distribution)."""

    def allowed_mask(self, vocab_size: int) -> torch.Tensor | None:
        return torch.zeros(vocab_size, dtype=torch.bool)

    def accept(self, token: int) -> None:
        pass


def fail_forward(engine: Engine, monkeypatch: pytest.MonkeyPatch, at_call: int) -> None:
    """The model's forward raises on its ``at_call``-th call (counting from 0), and only then."""
    model = engine.runner.model
    forward = model.forward
    calls = itertools.count()

    def flaky(*args: Any) -> torch.Tensor:
        if next(calls) == at_call:
            raise RuntimeError("injected forward failure")
        return forward(*args)

    monkeypatch.setattr(model, "forward", flaky)


def _requests(llm: LLM, prefix: str) -> list[Request]:
    return [Request(f"{prefix}{i}", llm.tokenizer.encode(p), GREEDY) for i, p in enumerate(PROMPTS)]


def _tokens(engine: Engine, requests: list[Request]) -> list[list[int]]:
    finals = engine.run(requests)  # checks the engine idle: no KV block, request or draft left
    return [finals[r.request_id].token_ids for r in requests]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    llm = LLM("model=tiny")
    return _tokens(llm.engine, _requests(llm, "ref"))


FAULTY: dict[str, Callable[[], Any]] = {
    "constraint-raises": lambda: RaisingConstraint(fail_at=3),
    "nothing-allowed": NothingAllowed,
}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("faulty", sorted(FAULTY))
def test_a_failing_request_fails_alone(reference: list[list[int]], faulty: str, temperature: float) -> None:
    llm = LLM("model=tiny")
    engine = llm.engine
    bad = Request(
        "bad",
        llm.tokenizer.encode("a faulty request"),
        SamplingParams(max_tokens=12, temperature=temperature, seed=1),
        constraint=FAULTY[faulty](),
    )
    good = _requests(llm, "good")
    finals = engine.run([good[0], bad, *good[1:]])
    assert finals["bad"].finished and finals["bad"].finish_reason == "error"
    assert finals["bad"].error is not None and finals["bad"].error.startswith("request bad: ")
    assert [finals[r.request_id].token_ids for r in good] == reference
    assert all(finals[r.request_id].error is None for r in good)
    assert _tokens(engine, _requests(llm, "after")) == reference  # the engine goes on


def test_a_failing_model_step_fails_its_requests_and_the_engine_recovers(
    reference: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests run at a time; the 4th forward raises: the two in it fail, the others run."""
    llm = LLM("model=tiny", "engine.max_num_seqs=2")
    engine = llm.engine
    fail_forward(engine, monkeypatch, at_call=3)
    requests = _requests(llm, "r")
    finals = engine.run(requests)
    failed = [r.request_id for r in requests if finals[r.request_id].finish_reason == "error"]
    assert failed == ["r0", "r1"]
    assert all(finals[rid].error == "the model step failed (RuntimeError)" for rid in failed)
    assert [finals[r.request_id].token_ids for r in requests[2:]] == reference[2:]
    assert _tokens(engine, _requests(llm, "after")) == reference


def test_step_reports_the_failed_request() -> None:
    llm = LLM("model=tiny")
    engine = llm.engine
    engine.add_request(Request("bad", [1, 2, 3], GREEDY, constraint=NothingAllowed()))
    engine.add_request(Request("good", [1, 2, 3], GREEDY))
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["bad"].finish_reason == "error" and outputs["bad"].finished
    assert outputs["good"].error is None and len(outputs["good"].new_token_ids) == 1
    assert engine.scheduler.kv.num_held() == 1
    while engine.has_unfinished():
        engine.step()
    engine.check_idle()


def test_a_failed_model_step_leaves_no_unwritten_block_in_the_prefix_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """With prefix caching, a prompt's full blocks are offered to the cache when allocated; if the
    forward that was to write them raises, a later request with the same prompt must not hit them
    (it would read KV that was never written) and gets the tokens of a run without the failure."""
    prompt = list(range(40, 40 + 70))  # 4 full blocks of 16 and a partial one
    llm = LLM("model=tiny", "kvcache.enable_prefix_caching=true")
    expected = LLM("model=tiny").generate([prompt], GREEDY)[0].token_ids
    engine = llm.engine
    fail_forward(engine, monkeypatch, at_call=0)
    first = engine.run([Request("first", prompt, GREEDY)])["first"]
    assert first.finish_reason == "error"
    again = engine.run([Request("again", prompt, GREEDY)])["again"]
    assert again.num_cached_tokens == 0 and again.token_ids == expected
    third = engine.run([Request("third", prompt, GREEDY)])["third"]  # written now: a real hit
    assert third.num_cached_tokens == 64 and third.token_ids == expected
