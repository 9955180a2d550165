"""A GPU's measured prefill attention (``prefill_attn_profile``, forge/sim/prefill_attention.py) in the
per-operator cost model: a prompt of a measured length costs the measured time, other work is
interpolated, several prompts are one kernel's work, and a malformed table is refused naming the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from forge.models.presets import model_dims
from forge.sim.cost_model import BatchShape
from forge.sim.operators import HARDWARE_DIR, OperatorConstants, OperatorCostModel
from forge.sim.step_sums import StepSums

LLAMA = model_dims("llama-2-7b")
A100 = OperatorConstants.load("a100")


def attention_ms(model: OperatorCostModel, *lens: int) -> float:
    """One layer's prefill attention (ms) of a step of prompts of ``lens`` tokens, nothing cached."""
    s = StepSums.of_batch(BatchShape(list(lens), list(lens), len(lens)))
    bare = dataclasses.replace(s, prefill_pairs=0.0)
    return (model.time_of(s) - model.time_of(bare)) / LLAMA.num_layers * 1e3


def test_a_measured_prompt_length_costs_its_measured_time() -> None:
    m, table = OperatorCostModel(LLAMA, A100), A100.prefill_attn_profile
    assert table is not None and (table.heads, table.head_dim) == (LLAMA.num_heads, LLAMA.head_dim)
    for chunk, ms in zip(table.chunk, table.time_ms, strict=True):
        assert attention_ms(m, chunk) == pytest.approx(ms, rel=1e-9), chunk
    # the flat 14% of peak it replaces charged about half the measured time at 512 tokens
    flat = OperatorCostModel(LLAMA, dataclasses.replace(A100, prefill_attn_profile=None))
    assert attention_ms(flat, 512) < 0.55 * attention_ms(m, 512)


def test_between_below_and_above_the_measured_lengths() -> None:
    m = OperatorCostModel(LLAMA, A100)
    work = [c * (c + 1) / 2 for c in (512, 520, 544)]  # causal pairs: 520 lies between 512 and 544
    share = (work[1] - work[0]) / (work[2] - work[0])
    assert attention_ms(m, 520) == pytest.approx(0.103 + share * (0.125 - 0.103), rel=1e-9)
    floor = attention_ms(m, 64)  # below the first length: the kernel's floor
    assert attention_ms(m, 8) == floor == pytest.approx(0.015, rel=1e-9)
    big = 8192 * 8193 / (4096 * 4097)
    assert attention_ms(m, 8192) == pytest.approx(2.7335 * big, rel=1e-9)  # above the last: its rate


def test_several_prompts_are_one_kernel_over_their_pairs_and_tensor_parallel_halves_the_work() -> None:
    m = OperatorCostModel(LLAMA, A100)
    curve = A100.prefill_attn_profile.curve() if A100.prefill_attn_profile else None
    assert curve is not None
    pair_work = LLAMA.num_heads * LLAMA.head_dim
    two = 2 * 512 * 513 / 2 * pair_work
    assert attention_ms(m, 512, 512) == pytest.approx(curve.time(two) * 1e3, rel=1e-9)
    assert attention_ms(m, 512, 512) < 2 * attention_ms(m, 512)  # one bigger kernel runs more efficiently
    tp2 = OperatorCostModel(LLAMA, A100, tensor_parallel=2)
    s = StepSums.of_batch(BatchShape([2048], [2048], 1))
    layer = (tp2.layer_time(s) - tp2.layer_time(dataclasses.replace(s, prefill_pairs=0.0))) * 1e3
    assert layer == pytest.approx(curve.time(2048 * 2049 / 2 * pair_work / 2) * 1e3, rel=1e-9)


def test_cached_keys_keep_their_own_efficiency() -> None:
    m = OperatorCostModel(LLAMA, A100)
    chunk = StepSums.of_batch(BatchShape([256], [1280], 1))  # 256 new tokens after 1,024 cached
    causal_only = StepSums.of_batch(BatchShape([256], [256], 1))
    extra = (m.layer_time(chunk) - m.layer_time(causal_only)) * 1e3
    cached_eff = A100.prefill_cached_attn_flops_efficiency
    assert cached_eff is not None
    pair_ms = 4 * LLAMA.num_heads * LLAMA.head_dim / (A100.peak_flops * cached_eff) * 1e3
    assert extra == pytest.approx(256 * 1024 * pair_ms, rel=1e-9)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.update(chunk=[64]), "the same length, at least 2"),
        (lambda p: p.update(chunk=[128, 64, *p["chunk"][2:]]), "chunk must rise"),
        (lambda p: p.update(time_ms=[0.0, *p["time_ms"][1:]]), "every time_ms must be > 0"),
        (lambda p: p.pop("heads"), "needs heads, head_dim, chunk and time_ms"),
    ],
    ids=["one-point", "not-rising", "zero-time", "no-heads"],
)
def test_a_malformed_profile_is_refused_naming_the_file(tmp_path: Path, edit: Any, message: str) -> None:
    data = yaml.safe_load((HARDWARE_DIR / "a100.yaml").read_text())
    edit(data["prefill_attn_profile"])
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message) as info:
        OperatorConstants.load("gpu", tmp_path)
    assert "gpu.yaml" in str(info.value)
