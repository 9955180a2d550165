"""Bad configuration fails early with a message naming the setting."""

from __future__ import annotations

import pytest

from forge import SamplingParams
from forge.build import build_engine
from forge.config import ConfigError, compose_config
from forge.request import Request


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("engine.max_num_seqs=0", "engine.max_num_seqs"),
        ("engine.max_num_batched_tokens=-5", "engine.max_num_batched_tokens"),
        ("engine.max_model_len=0", "engine.max_model_len"),
        ("engine.kv_cache_memory_gib=-1", "engine.kv_cache_memory_gib"),
    ],
)
def test_negative_engine_sizes(override: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        compose_config([override])


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["kvcache.num_blocks=-3"], "kvcache.num_blocks"),
        (["kvcache.block_size=0"], "kvcache.block_size"),
        (["kvcache=naive", "kvcache.reservation=maybe"], "kvcache.reservation"),
        (["workload.num_requests=0"], "workload.num_requests"),
        (["workload.arrivals.rate=-1"], "rate"),
        (["workload.input_len.low=0"], "workload uniform lengths"),
    ],
)
def test_bad_component_settings(overrides: list[str], names: str) -> None:
    from forge.build import workload_requests

    with pytest.raises(ValueError, match=names):
        cfg = compose_config(overrides)
        engine = build_engine(cfg)
        workload_requests(cfg, engine)


def test_prompt_longer_than_max_model_len() -> None:
    engine = build_engine(compose_config(["model=synthetic", "engine.max_model_len=64"]))
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.add_request(Request("long", [65] * 100, SamplingParams(max_tokens=4)))


def test_pool_too_small_for_one_request() -> None:
    engine = build_engine(compose_config(["model=synthetic", "kvcache.num_blocks=2", "kvcache.block_size=16"]))
    with pytest.raises(ValueError, match="kvcache.num_blocks=2"):
        engine.add_request(Request("big", [65] * 40, SamplingParams(max_tokens=4)))


def test_naive_max_reservation_larger_than_pool() -> None:
    engine = build_engine(
        compose_config(["model=synthetic", "kvcache=naive", "kvcache.num_blocks=8", "kvcache.block_size=16"])
    )
    engine.add_request(Request("r", [65] * 20, SamplingParams(max_tokens=4)))
    with pytest.raises(RuntimeError, match="kvcache.num_blocks"):
        engine.step()


def test_missing_required_setting_is_named() -> None:
    with pytest.raises(ConfigError, match="must be set"):
        compose_config(["workload.arrivals.rate=???"])


def test_bad_sampling_params() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
