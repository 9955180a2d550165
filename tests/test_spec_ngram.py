"""Prompt-lookup drafting and its adaptive draft length."""

from __future__ import annotations

import pytest

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.spec.base import SpecDecodeStats, draft_limit
from forge.spec.ngram import NgramDrafter, ngram_lookup


def test_lookup_prefers_longest_then_most_recent_match() -> None:
    assert ngram_lookup([1, 2, 3, 4, 1, 2], 1, 3, 3) == [3, 4, 1]
    # [9, 2] occurs once (longest match) even though [2] occurs more recently after a 5.
    assert ngram_lookup([9, 2, 7, 8, 2, 5, 9, 2], 1, 2, 2) == [7, 8]
    # The most recent occurrence of the suffix wins.
    assert ngram_lookup([1, 5, 1, 6, 1], 1, 1, 1) == [6]
    assert ngram_lookup([1, 2, 3], 1, 3, 4) == []
    assert ngram_lookup([1, 2, 3, 1], 2, 3, 4) == []  # only a 1-gram matches, min is 2
    assert ngram_lookup([7, 7, 7], 1, 4, 5) == [7]  # continuation may run into the suffix
    assert ngram_lookup([1, 2, 1, 2], 1, 2, 0) == []


def _request(rid: str, prompt: list[int], output: list[int] | None = None, max_tokens: int = 100) -> Request:
    r = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0))
    r.output_token_ids = list(output or [])
    r.num_computed_tokens = r.num_tokens - 1
    return r


def test_propose_respects_limits_and_skips_requests_without_match() -> None:
    d = NgramDrafter(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3)
    a = _request("a", [1, 2, 3, 4, 5, 6, 1, 2])
    b = _request("b", [10, 11, 12])
    drafts = d.propose([a, b], {"a": 2, "b": 4})
    assert drafts["a"].token_ids == [3, 4]
    assert "b" not in drafts
    assert a.spec_token_ids == [] and d.num_tracked() == 0


def test_adaptive_length_grows_on_full_acceptance_and_shrinks_on_rejection() -> None:
    d = NgramDrafter(num_speculative_tokens=8, min_speculative_tokens=1)
    assert d.draft_length("r") == 8
    d.observe("r", 8, 1)
    assert d.draft_length("r") == 2
    d.observe("r", 2, 0)
    assert d.draft_length("r") == 1
    d.observe("r", 1, 1)
    d.observe("r", 2, 2)
    assert d.draft_length("r") == 4
    for _ in range(5):
        d.observe("r", 4, 4)
    assert d.draft_length("r") == 8
    r = _request("r", list(range(20)) + list(range(20)))
    assert len(d.propose([r], {"r": 100})["r"].token_ids) == 8
    d.observe("r", 8, 3)
    assert len(d.propose([r], {"r": 100})["r"].token_ids) == 4
    assert d.num_tracked() == 1
    d.remove("r")
    d.remove("r")
    assert d.num_tracked() == 0
    fixed = NgramDrafter(num_speculative_tokens=3, adaptive=False)
    fixed.observe("r", 3, 0)
    assert fixed.draft_length("r") == 3 and fixed.num_tracked() == 0


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(num_speculative_tokens=0)
    with pytest.raises(ValueError):
        NgramDrafter(prompt_lookup_min=3, prompt_lookup_max=2)


def test_draft_limit() -> None:
    r = _request("r", [1, 2, 3], [4, 5], max_tokens=6)
    assert draft_limit(r, 100) == 3  # 2 out + 3 drafts + 1 bonus = 6
    assert draft_limit(r, 7) == 2  # draft positions 5, 6 < 7
    r.num_computed_tokens = 2
    assert draft_limit(r, 100) == 0  # not decoding
    r.num_computed_tokens = 4
    r.spec_token_ids = [1]
    assert draft_limit(r, 100) == 0  # already carries drafts


def test_stats() -> None:
    s = SpecDecodeStats()
    s.record(3, 3)
    s.record(2, 0)
    s.record(0, 0)
    assert s.num_drafts == 2 and s.num_draft_tokens == 5 and s.num_accepted_tokens == 3
    assert s.acceptance_rate == pytest.approx(0.6)
    assert s.mean_acceptance_length == pytest.approx(2.5)
    assert s.acceptance_per_position == [0.5, 0.5, 1.0]
    assert s.counters()["spec_decode_num_accepted_tokens_total"] == 3
    with pytest.raises(ValueError):
        s.record(1, 2)


def test_periodic_tail_still_gets_a_full_draft() -> None:
    from forge.spec.ngram import ngram_lookup

    # "a b a b a b": the latest occurrences of the suffix overlap it; an earlier one has room.
    assert ngram_lookup([7, 1, 2, 1, 2, 1, 2], 1, 2, 4) == [1, 2, 1, 2]
    # A single repeated token: the earliest occurrence gives the longest continuation.
    assert ngram_lookup([5, 5, 5, 5], 1, 1, 3) == [5, 5, 5]
