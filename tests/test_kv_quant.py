"""engine.kv_cache_dtype=int8 / fp8: the row format's error bounds, attention over a quantized cache
(torch and forge's C kernel) against attention over its dequantized values, the engine's greedy
tokens, the pool's size in the cache's bytes, the simulated clock's KV bytes, and the config checks.
The CUDA kernels' quantized paths are in tests/test_cuda_kernels.py (on the CPU execution layer)."""

from __future__ import annotations

import pytest
import torch

from forge import LLM, SamplingParams
from forge.cli import serve_overrides
from forge.config import KV_CACHE_DTYPES as CONFIG_KV_CACHE_DTYPES
from forge.config import ConfigError, compose_config
from forge.engine.build import build_engine
from forge.kernels.base import KVSpec
from forge.kernels.cpu import native
from forge.kernels.cpu_backend import CpuBackend
from forge.kernels.kv_quant import FORMATS, KV_CACHE_DTYPES, dequantize, kv_cache_dtype, quantize
from forge.kernels.torch_backend import TorchBackend
from forge.sim.clock import SimulatedClock
from tests.attention_helpers import paged_batch

QUANTIZED = [f.storage for f in FORMATS]
IDS = [f.name for f in FORMATS]
# Round to nearest with m mantissa bits: relative error <= 2^-(m+1); below the smallest normal the
# step is fixed, so the absolute error there is half a subnormal step (in units of the row's scale).
FP8_BOUNDS = {torch.float8_e4m3fn: (2.0**-4, 2.0**-10), torch.float8_e5m2: (2.0**-3, 2.0**-17)}


def rows_with_spread(seed: int = 0) -> torch.Tensor:
    """[tokens, heads, head_dim] rows whose magnitudes span 8 decades, an all-zero row among them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, 64, generator=gen) * 10.0 ** torch.randint(-6, 3, (64, 3, 1), generator=gen)
    x[5, 1] = 0.0
    return x


@pytest.mark.parametrize("dtype", QUANTIZED, ids=IDS)
def test_quantize_dequantize_error_bounds(dtype: torch.dtype) -> None:
    x = rows_with_spread()
    packed = quantize(x, dtype)
    assert packed.dtype == dtype and packed.shape == (64, 3, 64 + 4)
    back = dequantize(packed)
    assert back.isfinite().all() and torch.equal(back[5, 1], torch.zeros(64))
    err = (back - x).abs()
    scale = x.abs().amax(dim=-1, keepdim=True) / next(f.max_value for f in FORMATS if f.storage == dtype)
    ulp = 2.0**-23 * x.abs()  # float32 rounding of x / scale and of value * scale
    if dtype == torch.int8:  # round(x / scale): at most half a step
        assert (err <= scale / 2 * (1 + 1e-6) + 4 * ulp).all()
    else:
        rel, sub = FP8_BOUNDS[dtype]
        assert (err <= rel * x.abs() + sub * scale + 4 * ulp).all()
    # the largest value of every row survives (it maps to the format's largest value)
    top = x.abs().argmax(dim=-1, keepdim=True)
    torch.testing.assert_close(back.gather(-1, top), x.gather(-1, top), rtol=1e-6, atol=0)


def test_fp8_alias_is_e4m3_as_in_vllm() -> None:
    assert kv_cache_dtype("fp8") == kv_cache_dtype("fp8_e4m3") == torch.float8_e4m3fn
    assert KV_CACHE_DTYPES["fp8"] == KV_CACHE_DTYPES["fp8_e4m3"] == "float8_e4m3fn"


def quantized_case(dtype: torch.dtype, shapes: list[tuple[int, int]], window: int | None = None):
    q, kv, meta, _ = paged_batch(shapes, 16, 6, 2, 64, torch.float32, window=window)
    packed = (quantize(kv[0], dtype), quantize(kv[1], dtype))
    return q, packed, (dequantize(packed[0]), dequantize(packed[1])), meta


@pytest.mark.parametrize("dtype", QUANTIZED, ids=IDS)
def test_torch_attention_over_quantized_cache_equals_dequantized(dtype: torch.dtype) -> None:
    """Decodes and prefill chunks over a cached prefix (both of TorchBackend's paths)."""
    q, packed, dense, meta = quantized_case(dtype, [(9, 1), (5, 6), (0, 7), (31, 1), (200, 1)])
    torch_backend = TorchBackend("cpu")
    got = torch_backend.attention(q, packed, meta, 0.3)
    torch.testing.assert_close(got, torch_backend.attention(q, dense, meta, 0.3), atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not native.available(), reason="C kernels unavailable (no C compiler)")
@pytest.mark.parametrize(("dtype", "window"), [(QUANTIZED[0], None), (QUANTIZED[1], 5), (QUANTIZED[2], None)], ids=IDS)
def test_cpu_kernel_reads_quantized_cache_in_place(dtype: torch.dtype, window: int | None) -> None:
    q, packed, dense, meta = quantized_case(dtype, [(9, 1), (3, 1), (15, 1), (0, 1), (200, 1)], window)
    got = CpuBackend().attention(q, packed, meta, 0.3, window=window)
    want = TorchBackend("cpu").attention(q, dense, meta, 0.3, window=window)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=2e-5)


@pytest.mark.parametrize("dtype", QUANTIZED, ids=IDS)
def test_write_and_copy_blocks_keep_values_and_scales(dtype: torch.dtype) -> None:
    """write_kv stores quantize(key) at the slots (nothing else); copy_blocks moves the scales too."""
    backend = TorchBackend("cpu")
    spec = KVSpec(num_layers=1, num_kv_heads=3, head_dim=64, dtype=dtype)
    ((k_cache, v_cache),) = backend.allocate_kv_cache(spec, num_blocks=6, block_size=4)
    key, value = rows_with_spread(1)[:10], rows_with_spread(2)[:10]
    slots = torch.tensor([4, 5, 6, 7, 8, 9, 10, 11, 12, 13])  # blocks 1, 2 and half of 3
    backend.write_kv((k_cache, v_cache), key, value, slots)
    flat_k = k_cache.view(torch.uint8).view(-1, 3, 68)
    assert torch.equal(flat_k[slots], quantize(key, dtype).view(torch.uint8))
    assert not flat_k[:4].any() and not flat_k[14:].any()
    backend.copy_blocks([(k_cache, v_cache)], [(k_cache, v_cache)], [(2, 5)])
    assert torch.equal(dequantize(v_cache[5]), dequantize(v_cache[2]))
    torch.testing.assert_close(dequantize(v_cache[2]), value[4:8], atol=0.2 * value[4:8].abs().amax().item(), rtol=0)


def greedy(kv_dtype: str) -> list[list[int]]:
    """tiny in float32 on backend=cpu: decode attention on the C kernel, prefill on torch's."""
    prompts = [[(7 * i + j) % 300 + 10 for j in range(5 + 3 * i)] for i in range(8)]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm = LLM("model=tiny", "model.dtype=float32", "backend=cpu", f"engine.kv_cache_dtype={kv_dtype}")
    return [o.token_ids for o in llm.generate(prompts, params)]


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.skipif(not native.available(), reason="C kernels unavailable (no C compiler)")
def test_tiny_model_greedy_tokens_with_int8_kv() -> None:
    """8 prompts x 32 greedy tokens, int8 KV against the exact (float32) cache. Agreement: tokens
    before the first divergence, 245 of 256 (95.7 %) at this commit (fp8 e4m3: 171, e5m2: 143).
    tiny's weights are random, so its top-2 logit margins are often tiny and a 0.4 % (amax / 254)
    perturbation of K/V can flip one; the bound (85 %) leaves room for that but fails if K/V were
    read back wrong (a wrong scale, row or block diverges within a token or two)."""
    exact, int8 = greedy("auto"), greedy("int8")
    agree = sum(common_prefix(a, b) for a, b in zip(exact, int8, strict=True))
    assert agree >= 0.85 * 8 * 32, f"{agree} of 256 greedy tokens agree"


def test_pool_holds_tokens_in_the_cache_dtypes_bytes() -> None:
    """Same memory: int8/fp8 hold 4 x float32's tokens less the scales' share (4 bytes per head_dim)."""
    base = ["model=tiny", "model.dtype=float32", "engine.kv_cache_memory_gib=0.01", "engine.max_num_seqs=4096"]
    blocks = {
        name: build_engine(compose_config([*base, f"engine.kv_cache_dtype={name}"])).scheduler.kv.num_blocks
        for name in ("float32", "int8", "fp8")
    }
    head_dim = 16  # tiny's
    quant_per_value = 1 + 4 / head_dim
    for name in ("int8", "fp8"):
        assert abs(blocks[name] / blocks["float32"] - 4 / quant_per_value) < 0.01


def sim_engine(kv_dtype: str, cost: str, *extra: str):
    return build_engine(
        compose_config(
            [
                "model=synthetic",
                "clock=simulated",
                f"clock.cost={cost}",
                "clock.hardware=h100",
                "engine.max_num_seqs=2048",
                f"engine.kv_cache_dtype={kv_dtype}",
                *extra,
            ]
        )
    )


def test_simulated_clock_charges_kv_bytes_in_the_cache_dtype() -> None:
    """Llama-3-8B (bf16, head_dim 128) on a simulated H100: int8 KV costs 1 + 4/128 bytes a value
    in the roofline's and the operator model's decode attention, and the pool holds ~2x the tokens."""
    exact, int8 = sim_engine("auto", "roofline"), sim_engine("int8", "roofline")
    dims = exact.clock.model_dims
    bf16_bytes = 2 * dims.num_layers * dims.num_kv_heads * dims.head_dim * dims.bytes_per_param
    assert exact.clock.cost_model.kv_bytes_per_token == bf16_bytes  # the existing dtypes: unchanged
    assert int8.clock.cost_model.kv_bytes_per_token == bf16_bytes * (1 + 4 / 128) / 2
    ratio = int8.scheduler.kv.num_blocks / exact.scheduler.kv.num_blocks
    assert abs(ratio - 2 / (1 + 4 / 128)) < 0.01
    ops = {name: sim_engine(name, "operators").clock.cost_model for name in ("auto", "fp8")}
    t_exact, t_fp8 = (ops[n].decode_attention_time(64, 4096.0) for n in ("auto", "fp8"))
    assert t_fp8 == pytest.approx(t_exact * (1 + 4 / 128) / 2)


def test_simulated_pool_honours_kv_cache_memory_gib_when_set() -> None:
    """Under clock=simulated, num_blocks=auto sizes the pool from engine.kv_cache_memory_gib when it is
    set (the preset's bytes per token in the cache dtype), and from the simulated GPU when it is null."""
    dims = sim_engine("auto", "roofline").clock.model_dims
    for name in ("auto", "int8"):
        engine = sim_engine(name, "roofline", "engine.kv_cache_memory_gib=2", "kvcache.block_size=16")
        per_token = engine.clock.model_dims.kv_bytes_per_token
        assert engine.scheduler.kv.num_blocks == int(2 * 2**30 // (per_token * 16))
    by_gpu = 0.9 * 80e9 - dims.num_params * dims.bytes_per_param  # the H100 preset: 80 GB, less the weights
    assert sim_engine("auto", "roofline").scheduler.kv.num_blocks == int(by_gpu // (dims.kv_bytes_per_token * 16))


def test_a_preset_clock_model_keeps_the_kv_dtype() -> None:
    engine = build_engine(
        compose_config(["model=tiny", "clock=simulated", "clock.model=llama-3-8b", "engine.kv_cache_dtype=int8"])
    )
    assert isinstance(engine.clock, SimulatedClock)
    assert engine.clock.model_dims.kv_quantized and engine.clock.model_dims.num_layers == 32


def test_kv_cache_dtype_names_are_checked_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match="engine.kv_cache_dtype must be one of .*int8.*fp8"):
        compose_config(["engine.kv_cache_dtype=int4"])
    for name in ("int8", "fp8", "fp8_e4m3", "fp8_e5m2"):
        compose_config([f"engine.kv_cache_dtype={name}"])


class FloatKVOnlyBackend(TorchBackend):
    """A backend that stores only float caches: what the config check is for."""

    kv_cache_dtypes = frozenset({"float32", "bfloat16", "float16"})


def test_a_backend_that_cannot_store_the_dtype_is_a_config_error() -> None:
    target = f"backend._target_={__name__}.FloatKVOnlyBackend"
    compose_config([target, "engine.kv_cache_dtype=bfloat16"])
    with pytest.raises(ConfigError, match=r"engine.kv_cache_dtype=fp8: backend .*FloatKVOnlyBackend cannot store it"):
        compose_config([target, "engine.kv_cache_dtype=fp8"])


def test_config_names_are_the_kernels_names() -> None:
    assert ("auto", *KV_CACHE_DTYPES) == CONFIG_KV_CACHE_DTYPES


def test_serve_takes_vllms_kv_cache_dtype_flag() -> None:
    overrides, _ = serve_overrides(["smollm2", "--kv-cache-dtype", "fp8"])
    assert "engine.kv_cache_dtype=fp8" in overrides
