"""The simulated clock's decode fast path: ``CostModel.decode_step_time(rows, context_sum)`` equals
``step_time`` of the same step as a ``BatchShape`` exactly (==, bit for bit) for every cost model, the
precomputed decode-attention efficiencies equal the bilinear interpolation computed from scratch, and
``DecodeRun.step_shapes`` equals the steps counted row by row."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from forge.core.decode_run import DecodeRun
from forge.models.presets import model_dims
from forge.sim.cost_model import HARDWARE, BatchShape, CostModel, FastCostModel
from forge.sim.decode_attention import DecodeAttentionProfile
from forge.sim.operators import OperatorConstants, OperatorCostModel
from forge.sim.profiled import ProfiledCostModel
from forge.sim.roofline import RooflineCostModel
from forge.sim.vidur_profile import VidurProfileCostModel

LLAMA = model_dims("llama-2-7b")


def random_decode_steps(seed: int, count: int = 400) -> list[list[int]]:
    """Per step, each row's context after it: batch sizes 1..300 (past the profiled 128), contexts
    1..9,000 (below, inside and past the profiled 32..2,048), some on grid points exactly."""
    rng = random.Random(seed)
    steps = []
    for _ in range(count):
        rows = rng.choice((1, 2, 3, 8, 16, 31, 128, rng.randint(1, 300)))
        if rng.random() < 0.2:
            context = rng.choice((1, 32, 128, 512, 1024, 2048, 9000))
            steps.append([context] * rows)
        else:
            steps.append([rng.randint(1, 9000) for _ in range(rows)])
    return steps


def assert_decode_fast_path_is_step_time(model: CostModel, seed: int) -> None:
    assert isinstance(model, FastCostModel)
    for contexts in random_decode_steps(seed):
        n = len(contexts)
        assert model.decode_step_time(n, sum(contexts)) == model.step_time(BatchShape([1] * n, contexts, n)), contexts


@pytest.mark.parametrize(
    ("hardware", "preset", "tensor_parallel"),
    [
        ("a100", "llama-2-7b", 1),  # decode_attn_profile
        ("a100", "llama-3-8b", 1),  # the profile at 8 KV heads
        ("a100", "llama-2-13b", 2),  # the profile, with all-reduces
        ("h100", "llama-2-7b", 1),  # the context curve
        ("h100", "llama-3-8b", 4),
    ],
)
def test_operator_decode_step_time_equals_step_time(hardware: str, preset: str, tensor_parallel: int) -> None:
    model = OperatorCostModel(model_dims(preset), OperatorConstants.load(hardware), tensor_parallel)
    assert (model.c.decode_attn_profile is not None) == (hardware == "a100")
    assert_decode_fast_path_is_step_time(model, seed=tensor_parallel)
    # the cached per-count terms are reused, not changed, by general steps in between
    mixed = BatchShape([1, 1, 300, 7], [40, 2000, 300, 507], 3)
    before = model.step_time(mixed)
    assert_decode_fast_path_is_step_time(model, seed=99)
    assert model.step_time(mixed) == before


def test_roofline_decode_step_time_equals_step_time() -> None:
    assert_decode_fast_path_is_step_time(RooflineCostModel(LLAMA, HARDWARE["a100"]), seed=5)


def test_profiled_decode_step_time_equals_step_time() -> None:
    rng = random.Random(6)
    coefficients = {
        "num_seqs": rng.uniform(0, 1e-4),
        "num_tokens": rng.uniform(0, 1e-4),
        "num_prefill_seqs": rng.uniform(0, 1e-3),
        "decode_context_tokens": rng.uniform(0, 1e-7),
        "prefill_attn_pairs": rng.uniform(0, 1e-9),
        "num_sampled": rng.uniform(0, 1e-5),
    }
    assert_decode_fast_path_is_step_time(ProfiledCostModel(coefficients, 3.7e-4), seed=6)


def test_vidur_profile_decode_step_time_equals_step_time(tmp_path: Path) -> None:
    from tests.test_clock_vidur_profile import write_profile

    model = VidurProfileCostModel.load(str(write_profile(tmp_path)), "a100", "llama-2-7b", LLAMA)
    assert_decode_fast_path_is_step_time(model, seed=7)


def reference_efficiency(table: DecodeAttentionProfile, mem_bw: float, kv_head_requests: float, ctx: float) -> float:
    """The bilinear interpolation in (log2 batch, log2 context) of the measured efficiencies, from scratch."""

    def bracket(axis: tuple[float, ...], x: float) -> tuple[int, float]:
        if x <= axis[0]:
            return 0, 0.0
        if x >= axis[-1]:
            return len(axis) - 2, 1.0
        k = max(i for i in range(len(axis) - 1) if axis[i] <= x)
        return k, math.log2(x / axis[k]) / math.log2(axis[k + 1] / axis[k])

    def measured(row: int, col: int) -> float:
        kv_bytes = 2 * table.kv_heads * table.head_dim * table.bytes_per_element
        return table.batch[col] * table.context[row] * kv_bytes / (mem_bw * table.time_ms[row][col] * 1e-3)

    i, fi = bracket(table.context, ctx)
    j, fj = bracket(table.batch, kv_head_requests / table.kv_heads)
    low = measured(i, j) + fj * (measured(i, j + 1) - measured(i, j))
    high = measured(i + 1, j) + fj * (measured(i + 1, j + 1) - measured(i + 1, j))
    return low + fi * (high - low)


def test_precomputed_efficiencies_equal_the_interpolation_from_scratch() -> None:
    a100 = OperatorConstants.load("a100")
    table = a100.decode_attn_profile
    assert table is not None
    rng = random.Random(8)
    grid = table.at(a100.mem_bw)
    pairs = [32 * b for b in table.batch] + [rng.randint(1, 300) * rng.choice((8, 32)) for _ in range(60)]
    contexts = [*table.context, 1.0, 5000.0] + [rng.uniform(1, 4000) for _ in range(60)]
    for kv_head_requests, ctx in itertools.product(pairs, contexts):
        expected = reference_efficiency(table, a100.mem_bw, kv_head_requests, ctx)
        assert table.efficiency(a100.mem_bw, kv_head_requests, ctx) == expected
        assert grid.column(kv_head_requests).efficiency(ctx) == expected


def random_run(rng: random.Random) -> DecodeRun:
    rows = rng.randint(1, 40)
    steps = rng.randint(1, 30)
    num_steps = [rng.choice((steps, rng.randint(1, steps))) for _ in range(rows)]
    num_steps[rng.randrange(rows)] = steps
    starts = [rng.randint(0, 5000) for _ in range(rows)]
    finishing = [n < steps or rng.random() < 0.3 for n in num_steps]
    return DecodeRun([], starts, [0] * rows, [[] for _ in range(rows)], num_steps, finishing)


def test_step_shapes_count_each_steps_rows_and_contexts() -> None:
    rng = random.Random(9)
    for _ in range(200):
        run = random_run(rng)
        expected = [
            (
                sum(n > j for n in run.num_steps),
                sum(s + j + 1 for s, n in zip(run.starts, run.num_steps, strict=True) if n > j),
            )
            for j in range(run.steps)
        ]
        assert list(run.step_shapes()) == expected
        taken = rng.randint(1, run.steps)  # a consumer that stops early sees the same first steps
        assert list(itertools.islice(run.step_shapes(), taken)) == expected[:taken]
        assert list(run.truncated(taken).step_shapes()) == expected[:taken]
