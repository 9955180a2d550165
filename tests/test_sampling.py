from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import pytest
import torch

from forge.core.sampling_params import SamplingParams
from forge.sampling.sampler import (
    SampleRow,
    SamplingError,
    apply_penalties,
    processed_probs,
    request_seed,
    sample,
    sample_each,
)


def test_top_k_top_p_min_p_keep_the_right_tokens() -> None:
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert (processed_probs(logits, SamplingParams(temperature=1.0, top_k=2)) > 0).tolist() == [1, 1, 0, 0, 0]
    assert (processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.8)) > 0).tolist() == [1, 1, 1, 0, 0]
    assert (processed_probs(logits, SamplingParams(temperature=1.0, min_p=0.3)) > 0).tolist() == [1, 1, 1, 0, 0]
    tiny_top_p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=1e-300))  # 0 in float32
    assert tiny_top_p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    p = processed_probs(logits, SamplingParams(temperature=1.0))
    torch.testing.assert_close(p, torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))


def test_penalties() -> None:
    logits = torch.tensor([2.0, 2.0, -1.0, 0.5])
    row = SampleRow(SamplingParams(repetition_penalty=2.0), 0, 0, prompt_ids=[0], output_ids=[2])
    assert apply_penalties(logits, row).tolist() == [1.0, 2.0, -2.0, 0.5]
    row = SampleRow(SamplingParams(presence_penalty=1.0, frequency_penalty=0.5), 0, 0, output_ids=[1, 1, 3])
    assert apply_penalties(logits, row).tolist() == [2.0, 0.0, -1.0, -1.0]


def test_draws_depend_only_on_seed_and_position() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    p = SamplingParams(temperature=1.0)
    rows = [SampleRow(p, seed=11, position=5), SampleRow(p, seed=11, position=6), SampleRow(p, seed=12, position=5)]
    a = sample(logits, rows)
    b = sample(logits[[2, 0]], [rows[2], rows[0]])
    assert [a[2], a[0]] == b
    counts = torch.bincount(
        torch.tensor([sample(logits[:1], [SampleRow(p, s, 0)])[0] for s in range(3000)]), minlength=50
    )
    expected = torch.softmax(logits[0], 0) * 3000
    assert (counts - expected).abs().max() < 6 * expected.max().sqrt() + 5


def test_mask_restricts_choices() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    allowed = torch.tensor([False, True, True])
    assert sample(logits, [SampleRow(SamplingParams(temperature=0), 0, 0, allowed=allowed)]) == [1]


BAD_PARAMS: list[dict[str, Any]] = [
    {"temperature": 1e-300},
    {"temperature": 1e-45},
    {"temperature": 0.005},
    {"temperature": float("nan")},
    {"temperature": float("inf")},
    {"temperature": 101.0},
    {"temperature": -1.0},
    {"presence_penalty": float("nan")},
    {"frequency_penalty": float("-inf")},
    {"presence_penalty": 2.5},
    {"repetition_penalty": 1e-300},
    {"repetition_penalty": float("nan")},
    {"repetition_penalty": 0.0},
    {"top_p": float("nan")},
    {"top_p": 0.0},
    {"min_p": float("nan")},
    {"top_k": -1},
    {"seed": 1 << 64},
    {"logprobs": -1},
    {"max_tokens": 0},
    {"n": 0},
]


@pytest.mark.parametrize("kwargs", BAD_PARAMS, ids=[f"{k}={v}" for d in BAD_PARAMS for k, v in d.items()])
def test_sampling_params_refuse_values_outside_their_ranges(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


def test_the_range_edges_are_accepted_and_cannot_overflow_float32() -> None:
    logits = torch.tensor([30.0, -30.0, 0.0, 1e4]).float()
    edges = [
        SamplingParams(temperature=1e-2, repetition_penalty=1e-2, presence_penalty=-2.0, frequency_penalty=2.0),
        SamplingParams(temperature=100.0, repetition_penalty=10.0, presence_penalty=2.0, frequency_penalty=-2.0),
        SamplingParams(temperature=0.0, repetition_penalty=1e-2, seed=(1 << 64) - 1),
    ]
    for p in edges:
        row = SampleRow(p, 0, 3, prompt_ids=[0, 1], output_ids=[1, 2, 3])
        scores = apply_penalties(logits, row)
        assert torch.isfinite(scores).all()
        if not p.greedy:
            assert torch.isfinite(processed_probs(scores, p)).all()
        assert 0 <= sample(logits.unsqueeze(0), [row])[0] < 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_row_with_no_valid_choice_raises_sampling_error(temperature: float) -> None:
    params = SamplingParams(temperature=temperature, seed=0)
    nothing = torch.zeros(3, dtype=torch.bool)
    with pytest.raises(SamplingError):
        sample(torch.tensor([[1.0, 2.0, 3.0]]), [SampleRow(params, 0, 0, allowed=nothing)])
    with pytest.raises(SamplingError):
        sample(torch.tensor([[1.0, float("nan"), 3.0]]), [SampleRow(replace(params, repetition_penalty=1.5), 0, 0)])


def test_sample_each_fails_only_the_bad_row() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0], [4.0, 1.0, 0.0], [0.0, 0.0, 9.0]])
    good = SamplingParams(temperature=0.7, seed=3)
    rows = [
        SampleRow(good, 3, 0),
        SampleRow(good, 3, 0, allowed=torch.zeros(3, dtype=torch.bool)),
        SampleRow(SamplingParams(temperature=0.0), 0, 0),
    ]
    out = sample_each(logits, rows)
    assert isinstance(out[1], SamplingError)
    assert [out[0], out[2]] == [sample(logits[[0]], rows[:1])[0], 2]
    assert list(sample_each(logits[[0, 2]], [rows[0], rows[2]])) == [out[0], 2]


def test_request_seeds_are_stable_hashes() -> None:
    assert request_seed(5, 0, "a") == 5
    assert request_seed(None, 0, "a") == request_seed(None, 0, "a") != request_seed(None, 0, "b")
    assert request_seed(None, 0, "a") != request_seed(None, 1, "a")
    assert request_seed(None, 0, "req-1") == -6492465261225725540  # the same in every process


def test_sampling_params_are_immutable_all_the_way_down() -> None:
    params = SamplingParams(stop_token_ids=[3, 4])
    assert params.stop_token_ids == (3, 4)
    with pytest.raises(AttributeError):
        params.stop_token_ids.append(5)  # type: ignore[attr-defined]  # a tuple: no append
    with pytest.raises(TypeError):
        SamplingParams(logit_bias={1: 2.0}).logit_bias[1] = 3.0  # type: ignore[index]  # a read-only view
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5  # type: ignore[misc]  # frozen


def test_logit_bias_shifts_the_logits_greedy_and_sampled() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 2)
    greedy_row = SampleRow(SamplingParams(temperature=0.0, logit_bias={3: 4.0}), seed=0, position=0)
    sampled_row = SampleRow(SamplingParams(temperature=1.0, logit_bias={2: 100.0}), seed=0, position=0)
    assert not greedy_row.params.plain_greedy
    assert sample(logits, [greedy_row, sampled_row]) == [3, 2]
    with pytest.raises(ValueError):
        SamplingParams(logit_bias={1: 101.0})
