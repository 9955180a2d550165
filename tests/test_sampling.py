from __future__ import annotations

import torch

from forge.sampling import SampleRow, apply_penalties, processed_probs, sample
from forge.sampling_params import SamplingParams


def test_top_k_top_p_min_p_keep_the_right_tokens() -> None:
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert (processed_probs(logits, SamplingParams(temperature=1.0, top_k=2)) > 0).tolist() == [1, 1, 0, 0, 0]
    assert (processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.8)) > 0).tolist() == [1, 1, 1, 0, 0]
    assert (processed_probs(logits, SamplingParams(temperature=1.0, min_p=0.3)) > 0).tolist() == [1, 1, 1, 0, 0]
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
