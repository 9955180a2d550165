"""Prefill attention over keys cached before the step (issue 35): a chunk after earlier chunks or a
prefix hit pays its cached (query, key) pairs at the preset's ``prefill_cached_attn_flops_efficiency``
(Vidur's A100 profile: about 3x the causal part's), and steps with nothing cached cost what they did."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.models.presets import model_dims
from forge.sim.cost_model import BatchShape
from forge.sim.operators import HARDWARE_DIR, OperatorConstants, OperatorCostModel
from forge.sim.step_sums import StepSums

LLAMA = model_dims("llama-2-7b")
A100 = OperatorConstants.load("a100")
PAIR_FLOPS = 4 * LLAMA.num_heads * LLAMA.head_dim  # per (query, key) pair, all heads of a layer


def chunk(q: int, cached: int) -> BatchShape:
    return BatchShape([q], [cached + q], 1)


def attention(model: OperatorCostModel, batch: BatchShape) -> float:
    """One layer's prefill attention: the layer's time less the same step with no pairs."""
    s = StepSums.of_batch(batch)
    none = dataclasses.replace(s, prefill_pairs=0.0, prefill_cached_pairs=0)
    return model.layer_time(s) - model.layer_time(none)


def test_cached_keys_cost_their_pairs_at_the_cached_efficiency() -> None:
    m = OperatorCostModel(LLAMA, A100)
    extra = attention(m, chunk(992, 1024)) - attention(m, chunk(992, 0))
    assert A100.prefill_cached_attn_flops_efficiency == 0.45
    assert extra == pytest.approx(992 * 1024 * PAIR_FLOPS / (A100.peak_flops * 0.45), rel=1e-9)
    # issue 35: Vidur's profile charges +0.116 ms per layer for these 1,024 cached tokens (forge had +0.381)
    assert extra * 1e3 == pytest.approx(0.116, rel=0.05)


def test_a_step_with_nothing_cached_costs_what_one_efficiency_charges() -> None:
    flat = dataclasses.replace(A100, prefill_attn_profile=None)  # one causal efficiency (a preset without a profile)
    with_term = OperatorCostModel(LLAMA, flat)
    without = OperatorCostModel(LLAMA, dataclasses.replace(flat, prefill_cached_attn_flops_efficiency=None))
    for batch in (chunk(2048, 0), BatchShape([512, 700, 1], [512, 700, 300], 3)):
        assert with_term.step_time(batch) == without.step_time(batch)  # bit for bit
    cached = chunk(512, 2048)
    assert without.step_time(cached) > with_term.step_time(cached)  # the old charge: all pairs at 14%
    pairs = StepSums.of_batch(cached).prefill_pairs
    assert attention(without, cached) == pytest.approx(pairs * PAIR_FLOPS / (A100.peak_flops * 0.14), rel=1e-9)


def test_step_sums_count_the_cached_pairs_of_every_prefill_row() -> None:
    s = StepSums.of_batch(BatchShape([100, 1, 50], [300, 40, 50], 3))
    assert s.prefill_cached_pairs == 100 * 200 + 50 * 0  # a decode's context is not a prefill's cache
    assert s.prefill_pairs == 100 * (300 - 99 / 2) + 50 * (50 - 49 / 2)


@pytest.mark.parametrize("value", [0, -0.2, 1.5])
def test_a_cached_efficiency_outside_0_1_is_refused(tmp_path: Path, value: float) -> None:
    data = yaml.safe_load((HARDWARE_DIR / "a100.yaml").read_text())
    data["prefill_cached_attn_flops_efficiency"] = value
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=r"gpu.yaml: prefill_cached_attn_flops_efficiency must be in \(0, 1\]"):
        OperatorConstants.load("gpu", tmp_path)


def run(fast_paths: bool) -> dict[str, float]:
    cfg = compose_config(
        [
            "model=synthetic",
            "clock=simulated",
            "clock.hardware=a100",
            "clock.model=llama-2-7b",
            "scheduler=sarathi",
            "engine.enable_chunked_prefill=true",
            f"engine.fast_paths={str(fast_paths).lower()}",
            "engine.max_num_batched_tokens=512",
            "engine.max_model_len=4096",
            "workload=fixed",
            "workload.num_requests=1",
            "workload.input_len.value=2048",
            "workload.output_len.value=2",
            "progress=false",
            "report=false",
        ]
    )
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    return engine.recorder.summary(dict(engine.scheduler.kv.stats()))


def test_a_chunked_prompt_pays_each_chunk_its_cached_pairs_on_either_path() -> None:
    fast, plain = run(True), run(False)
    assert fast == plain == run(True)  # the fast path's sums equal the plain loop's; reruns identical
    # 2,048 tokens in 512-token chunks: chunks 2-4 attend to 512, 1,024 and 1,536 cached keys
    m = OperatorCostModel(LLAMA, A100)
    chunks = [BatchShape([512], [cached + 512], int(cached == 1536)) for cached in (0, 512, 1024, 1536)]
    ttft = sum(m.step_time(c) for c in chunks)  # the last chunk samples the first token
    assert fast["mean_ttft_ms"] == pytest.approx(ttft * 1e3, rel=1e-9)
