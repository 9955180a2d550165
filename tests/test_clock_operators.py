"""The per-operator cost model (clock.cost=operators), tensor parallelism in the clock, and the
clock's settings checked when the engine is built."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from forge.config import ConfigError, compose_config
from forge.engine.build import build_engine, workload_requests
from forge.models.presets import model_dims
from forge.results.metrics import summarize
from forge.sim.clock import SimulatedClock
from forge.sim.cost_model import BatchShape
from forge.sim.operators import HARDWARE_DIR, OperatorConstants, OperatorCostModel, all_reduce_time
from forge.sim.step_sums import StepSums

LLAMA = model_dims("llama-2-7b")
A100 = OperatorConstants.load("a100")


def decode(batch: int, context: int) -> BatchShape:
    return BatchShape([1] * batch, [context] * batch, batch)


def prefill(*lens: int) -> BatchShape:
    return BatchShape(list(lens), list(lens), len(lens))


def test_gemms_have_a_knee_from_memory_to_compute_bound() -> None:
    m = OperatorCostModel(LLAMA, A100)
    one, few, many = (m.step_time(prefill(n)) for n in (2, 16, 4096))
    assert few < 1.1 * one  # weight reads dominate: 8x the tokens cost almost nothing
    weights = LLAMA.num_params * LLAMA.bytes_per_param / (A100.mem_bw * A100.gemm_bw_efficiency)
    assert weights < one < 1.2 * weights
    flops = 2 * LLAMA.num_params * 4096 / (A100.peak_flops * A100.gemm_flops_efficiency)
    assert flops < many  # compute bound (plus attention) at 4096 tokens


def test_decode_attention_reads_long_contexts_more_efficiently() -> None:
    m = OperatorCostModel(LLAMA, A100)
    per_token = [m.decode_attention_time(128, c) / c for c in (128, 512, 2048)]
    assert per_token[0] > 1.5 * per_token[2] and per_token[0] > per_token[1] > per_token[2]
    at_peak = 128 * 2048 * 2 * 4096 * 2 / A100.mem_bw
    assert at_peak < m.decode_attention_time(128, 2048) < at_peak / 0.9


def test_decode_attention_at_a_profiled_point_costs_the_profiled_time() -> None:
    m, table = OperatorCostModel(LLAMA, A100), A100.decode_attn_profile
    assert table is not None and table.kv_heads == LLAMA.num_kv_heads
    for i, context in enumerate(table.context):
        for j, batch in enumerate(table.batch):
            assert m.decode_attention_time(int(batch), context) == pytest.approx(table.time_ms[i][j] * 1e-3)


def test_few_decodes_read_the_kv_cache_less_efficiently_than_many() -> None:
    m = OperatorCostModel(LLAMA, A100)
    per_request = [m.decode_attention_time(b, 1024) / b for b in (1, 8, 32, 128)]
    assert per_request == sorted(per_request, reverse=True) and per_request[1] > 1.5 * per_request[3]


def test_decode_attention_efficiency_between_and_beyond_the_profiled_points() -> None:
    table, bw = A100.decode_attn_profile, A100.mem_bw
    assert table is not None
    eff = table.efficiency
    # halfway between batch 8 and 16 in log2, at a profiled context: the mean of the two
    assert eff(bw, 32 * (8 * 16) ** 0.5, 1024) == pytest.approx((eff(bw, 32 * 8, 1024) + eff(bw, 32 * 16, 1024)) / 2)
    assert eff(bw, 32 * 128, 8192) == eff(bw, 32 * 128, 2048) and eff(bw, 32 * 512, 512) == eff(bw, 32 * 128, 512)
    assert eff(bw, 32 * 1, 16) == eff(bw, 32 * 1, 32)
    # occupancy counts (request, KV head) pairs: 4 requests of an 8-KV-head model fill the GPU as 1 of 32
    gqa = OperatorCostModel(model_dims("llama-3-8b"), A100)
    assert gqa.kv_heads == 8
    assert gqa.decode_attention_time(4, 1024) == pytest.approx(4 * 1024 * gqa.kv_bytes / (bw * eff(bw, 32, 1024)))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["decode_attn_profile"]["time_ms"].pop(), r"time_ms as 5 rows"),
        (lambda d: d["decode_attn_profile"].pop("kv_heads"), r"missing \['kv_heads'\]"),
        (lambda d: d.update(decode_attn_bw_efficiency=0.9, decode_attn_half_context=128), "either"),
        (lambda d: d.pop("decode_attn_profile"), "either"),
        (lambda d: d["decode_attn_profile"]["batch"].reverse(), r"batch must be positive and increasing"),
    ],
)
def test_bad_decode_attention_constants_name_the_file(tmp_path: Path, edit: Any, message: str) -> None:
    data = yaml.safe_load((HARDWARE_DIR / "a100.yaml").read_text())
    edit(data)
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match=message) as info:
        OperatorConstants.load("gpu", tmp_path)
    assert "gpu.yaml" in str(info.value)


def test_prefill_attention_at_one_efficiency_grows_with_the_square_of_the_prompt() -> None:
    m = OperatorCostModel(LLAMA, dataclasses.replace(A100, prefill_attn_profile=None))  # the measured one: its own file
    sums = [StepSums.of_batch(prefill(n)) for n in (1024, 2048)]
    attention = [m.time_of(s) - m.time_of(dataclasses.replace(s, prefill_pairs=0.0)) for s in sums]
    assert attention[1] / attention[0] == pytest.approx(4.0, rel=0.01)


def test_tensor_parallel_divides_the_work_and_adds_all_reduces() -> None:
    one, two = OperatorCostModel(LLAMA, A100), OperatorCostModel(LLAMA, A100, tensor_parallel=2)
    s = prefill(2048)
    assert 0.5 * one.step_time(s) < two.step_time(s) < 0.6 * one.step_time(s)
    no_link = OperatorCostModel(LLAMA, dataclasses.replace(A100, link_bw=float("inf"), link_latency_s=0.0), 2)
    reduce = all_reduce_time(2048 * 4096 * 2, 2, A100.link_bw, A100.link_latency_s)
    assert reduce == A100.link_latency_s + 2048 * 4096 * 2 / A100.link_bw
    assert two.step_time(s) - no_link.step_time(s) == pytest.approx(2 * LLAMA.num_layers * reduce)
    assert all_reduce_time(1e9, 1, A100.link_bw, A100.link_latency_s) == 0.0


@pytest.mark.parametrize(
    ("overrides", "setting"),
    [
        (["clock.tensor_parallel=-1"], "clock.tensor_parallel"),
        (["clock.cost=roofline", "clock.tensor_parallel=2"], "clock.tensor_parallel"),  # one GPU
        (["clock.cost=bogus"], "clock.cost"),
        (["clock.cost=operators", "clock.hardware=cpu"], "clock.hardware='cpu'"),
        (["clock.hardware=b200"], "clock.hardware 'b200'"),
    ],
)
def test_bad_clock_settings_are_named_at_compose_time(overrides: list[str], setting: str) -> None:
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.").replace("(", r"\(")):
        compose_config(["model=synthetic", "clock=simulated", "clock.model=llama-2-7b", *overrides])


def test_a_tensor_parallel_degree_that_does_not_divide_the_heads_is_named() -> None:
    cfg = compose_config(["model=synthetic", "clock=simulated", "clock.model=llama-2-7b", "clock.tensor_parallel=3"])
    with pytest.raises(ValueError, match=r"clock\.tensor_parallel=3"):
        build_engine(cfg)  # the heads are known once the clock is bound to its model


def run(overrides: list[str]) -> dict[str, float]:
    cfg = compose_config(
        [
            "model=synthetic",
            "clock=simulated",
            "clock.hardware=a100",
            "clock.model=llama-2-7b",
            "clock.cost=operators",
            "scheduler=vllm_v0",
            "engine.enable_chunked_prefill=false",
            "engine.max_model_len=512",
            "workload.num_requests=40",
            "workload.arrivals.rate=20",
            "progress=false",
            *overrides,
        ]
    )
    engine = build_engine(cfg)
    engine.run(workload_requests(cfg, engine))
    return summarize(engine.recorder.requests_frame(), engine.recorder.steps_frame(), dict(engine.scheduler.kv.stats()))


def test_same_config_and_seed_give_identical_simulated_metrics() -> None:
    first, again, other = run([]), run([]), run(["seed=1"])
    assert first == again
    assert first != other
    assert first["mean_tpot_ms"] > 0


def test_operator_clock_charges_its_model() -> None:
    clock = SimulatedClock("a100", "llama-2-7b", cost="operators", tensor_parallel=2)
    clock.bind(model_dims("tinyllama-1.1b"))
    assert isinstance(clock.cost_model, OperatorCostModel) and clock.cost_model.tp == 2
    assert clock.model_dims == LLAMA
