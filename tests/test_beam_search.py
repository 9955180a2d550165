"""Beam search over plain engine requests (``LLM.beam_search``, ``forge.frontend.BeamSearchFrontend``)
against a brute-force search that runs the tiny model on every whole hypothesis, and parallel
sampling (``n > 1``) on the copy-on-write fork."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from forge import LLM, SamplingParams
from forge.core.beam_params import BeamSearchParams
from forge.core.request import Request
from forge.frontend import BeamSearchFrontend
from forge.kvcache.sharing import Sharing, block_sharing
from forge.models.base import Model
from tests.forward_helpers import prefill_logits

PROMPTS = ["Hello", "q?", "OK"]  # "q?" and "OK" meet EOS candidates


@dataclasses.dataclass(frozen=True)
class Hyp:
    tokens: tuple[int, ...]
    cumulative: float
    eos: bool


def brute_force(
    model: Model, prompt: list[int], params: BeamSearchParams, eos: frozenset[int]
) -> tuple[list[Hyp], int]:
    """Beam search by running the model over prompt + each hypothesis from scratch (no KV cache, no
    engine); vLLM's rules (see BeamSearchParams). Returns the results and how many hypotheses
    ended in EOS along the way."""
    width = params.beam_width
    beams = [Hyp((), 0.0, False)]
    finished: list[Hyp] = []
    ended_by_eos = 0
    for step in range(params.max_tokens):
        pool = []
        for beam in beams:
            logits = prefill_logits(model, prompt + list(beam.tokens))[-1]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            values, ids = logprobs.topk(2 * width)
            for v, i in sorted(zip(values.tolist(), ids.tolist(), strict=True), key=lambda x: (-x[0], x[1])):
                hyp = Hyp((*beam.tokens, i), beam.cumulative + v, i in eos)
                if hyp.eos:
                    finished.append(hyp)
                    ended_by_eos += 1
                else:
                    pool.append(hyp)
        pool.sort(key=lambda h: h.cumulative, reverse=True)
        beams = pool[:width]
        stop_early = params.early_stopping and len(finished) >= width
        if stop_early or not beams or step == params.max_tokens - 1:
            if not stop_early:
                finished += beams
            break

    def score(h: Hyp) -> float:
        return h.cumulative / (len(prompt) + len(h.tokens) - h.eos) ** params.length_penalty

    return sorted(finished, key=score, reverse=True)[:width], ended_by_eos


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("model=tiny", "kvcache.block_size=4")


def check_against_brute_force(llm: LLM, prompts: list[str], params: BeamSearchParams) -> int:
    """``LLM.beam_search`` equals the brute-force search on each prompt; returns the EOS hypotheses met."""
    model, eos = llm.engine.runner.model, llm.tokenizer.eos_token_ids
    p = params
    outs = llm.beam_search(prompts, p.beam_width, p.max_tokens, p.length_penalty, p.early_stopping)
    met = 0
    for prompt, out in zip(prompts, outs, strict=True):
        expected, ended = brute_force(model, llm.tokenizer.encode(prompt), params, eos)
        met += ended
        assert [tuple(s.token_ids) for s in out.sequences] == [h.tokens for h in expected]
        got = [s.cumulative_logprob for s in out.sequences]
        assert got == pytest.approx([h.cumulative for h in expected], abs=1e-5)
        assert [s.finish_reason for s in out.sequences] == ["stop" if h.eos else "length" for h in expected]
    return met


@pytest.mark.parametrize(
    ("width", "penalty", "early"), [(1, 1.0, False), (2, 0.5, False), (3, 1.0, True), (4, 2.0, False)]
)
def test_beam_search_equals_brute_force(llm: LLM, width: int, penalty: float, early: bool) -> None:
    met = check_against_brute_force(llm, ["q?", "OK"], BeamSearchParams(width, 5, penalty, early))
    if width >= 3:
        assert met > 0  # these prompts meet EOS candidates: the EOS rules are exercised


@pytest.mark.slow
@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize(("penalty", "early"), [(1.0, False), (0.5, True), (-1.0, False)])
def test_beam_search_equals_brute_force_matrix(llm: LLM, width: int, penalty: float, early: bool) -> None:
    check_against_brute_force(llm, PROMPTS, BeamSearchParams(width, 8, penalty, early))


def test_beam_search_under_preemption_frees_every_block() -> None:
    """A pool too small for every beam at once: beams are preempted and recomputed, the results do not
    change, and ``beam_search`` ends with every block free (it checks, raising LeakError)."""
    roomy = LLM("model=tiny", "kvcache.block_size=4")
    small = LLM("model=tiny", "kvcache.block_size=4", "kvcache.num_blocks=10")
    want = roomy.beam_search(PROMPTS, 4, 10)
    got = small.beam_search(PROMPTS, 4, 10)
    assert small.engine.scheduler.num_preemptions > 0
    assert [[s.token_ids for s in o.sequences] for o in got] == [[s.token_ids for s in o.sequences] for o in want]
    kv = small.engine.scheduler.kv
    assert kv.num_free_blocks() == kv.num_blocks


def test_beams_share_blocks_and_pruned_beams_free_theirs(llm: LLM) -> None:
    """While a search runs its beams hold fewer physical blocks than their tables list (the prompt
    and common prefixes are shared); afterwards nothing is held."""
    engine = BeamSearchFrontend(llm.engine)
    ids = llm.tokenizer.encode("A prompt of some length to share")
    params = BeamSearchParams(4, 12)
    engine.add_request(Request("share", ids, SamplingParams(max_tokens=12), beam_search=params))
    kv = llm.engine.scheduler.kv
    total = Sharing(0, 0)
    finals = []
    for _ in range(200):
        if not engine.has_unfinished():
            break
        finals += [o for o in engine.step() if o.finished]
        total = total + block_sharing(kv, [r.request_id for r in llm.engine.scheduler.running])
    engine.check_idle()
    assert sorted(o.request_id for o in finals) == ["share", "share#1", "share#2", "share#3"]
    assert total.saved_fraction > 0.3
    assert kv.stats()["kv_cow_copies"] > 0


def test_n_through_the_fork_matches_separate_seeds_and_shares_blocks() -> None:
    """``n = 4`` forks one prefill into 4 sequences: the tokens are those of 4 separate requests
    seeded ``seed + i``, and the pool's peak use is well under 4x that of one sequence."""
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=11, ignore_eos=True)
    prompt = list(range(40, 100))  # 60 tokens: the prompt's blocks dominate

    def peak_blocks(llm: LLM, sampling: SamplingParams | list[SamplingParams], prompts: list[list[int]]) -> int:
        kv = llm.engine.scheduler.kv
        peak = 0
        for _ in llm.stream(prompts, sampling):
            peak = max(peak, kv.num_blocks - kv.num_free_blocks())
        return peak

    llm = LLM("model=tiny", "kvcache.block_size=4")
    forked = llm.generate(prompt, dataclasses.replace(params, n=4))
    separate = llm.generate([prompt] * 4, [dataclasses.replace(params, seed=11 + i) for i in range(4)])
    assert [o.token_ids for o in forked] == [o.token_ids for o in separate]
    one = peak_blocks(llm, params, [prompt])
    four = peak_blocks(llm, dataclasses.replace(params, n=4), [prompt])
    assert four < 2 * one


def test_the_engine_refuses_a_beam_search_the_frontend_runs_it(llm: LLM) -> None:
    """Beam search runs above the engine: the engine refuses a ``beam_search`` request (never
    accepting and ignoring it); the frontend runs it over plain engine requests, each beam a
    request of its own that ends recorded as finished (the pruned ones ``stop``)."""
    ids = llm.tokenizer.encode("q?")
    request = Request("refused", ids, SamplingParams(max_tokens=4), beam_search=BeamSearchParams(2, 4))
    with pytest.raises(ValueError, match="forge.frontend"):
        llm.engine.add_request(request)
    front = BeamSearchFrontend(llm.engine)
    front.add_request(request)
    with pytest.raises(ValueError, match="duplicate"):
        front.add_request(Request("refused#1", ids, SamplingParams(max_tokens=4)))
    beam_ids = set()
    finals = []
    while front.has_unfinished():
        beam_ids |= set(llm.engine.requests)
        finals += [o for o in front.step() if o.finished]
    front.check_idle()
    assert [o.request_id for o in finals] == ["refused", "refused#1"]
    assert len(beam_ids) > 2 and all("@" in rid for rid in beam_ids)
    timelines = llm.engine.recorder.requests
    assert {timelines[rid].finish_reason for rid in beam_ids} == {"stop"}
    assert all(timelines[rid].finish_time is not None for rid in beam_ids)
