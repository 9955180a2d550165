"""backend=cpu: the C paged decode-attention kernel against dense attention, its batch
independence, the engine on it, and engine.kv_cache_dtype."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from forge import LLM, SamplingParams
from forge.config import ConfigError, compose_config
from forge.engine.build import build_engine
from forge.engine.runner import ModelRunner
from forge.kernels.cpu import native
from forge.kernels.cpu_backend import CpuBackend
from forge.models.fast_weights import quantize_rows
from tests.attention_helpers import paged_batch

try:
    native.library()
    NATIVE_ERROR = ""
except native.NativeKernelsUnavailable as exc:  # no C compiler here
    NATIVE_ERROR = str(exc)
needs_native = pytest.mark.skipif(bool(NATIVE_ERROR), reason=f"C kernels unavailable: {NATIVE_ERROR}")


# (context before, new tokens): decodes at and across block edges, a long one, a prefill chunk
# beside decodes (only the decode rows go to the C kernel), and a lone decode.
BATCHES = {
    "decodes": [(9, 1), (3, 1), (15, 1), (0, 1), (200, 1)],
    "mixed": [(9, 1), (5, 6), (0, 7), (31, 1)],
    "one-decode": [(13, 1)],
}


@needs_native
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize(("bs", "h", "kvh", "d"), [(4, 6, 2, 8), (16, 9, 3, 64), (1, 4, 4, 24), (8, 8, 1, 16)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cpu_attention_matches_dense(batch: str, bs: int, h: int, kvh: int, d: int, kv_dtype: torch.dtype) -> None:
    q, kv, meta, ref = paged_batch(BATCHES[batch], bs, h, kvh, d, kv_dtype)
    out = CpuBackend().attention(q, kv, meta, 0.3)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=2e-5)


@needs_native
@pytest.mark.parametrize("batch", sorted(BATCHES))
@pytest.mark.parametrize("window", [1, 5, 16, 300])
@pytest.mark.parametrize(("bs", "h", "kvh", "d"), [(4, 6, 2, 8), (16, 4, 1, 64)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cpu_windowed_attention_matches_dense(
    batch: str, window: int, bs: int, h: int, kvh: int, d: int, kv_dtype: torch.dtype
) -> None:
    """Sliding windows of one token, cutting inside a block, a block wide, wider than every context."""
    q, kv, meta, ref = paged_batch(BATCHES[batch], bs, h, kvh, d, kv_dtype, window=window)
    out = CpuBackend().attention(q, kv, meta, 0.3, window=window)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=2e-5)


@needs_native
def test_decode_row_does_not_depend_on_the_batch() -> None:
    """A request's decode output is bit-identical alone and among others (fixed reduction order),
    whether the kernel splits the batch by request (many) or by KV head (few)."""
    shapes = [(40 + 13 * i, 1) for i in range(12)]
    q, kv, meta, _ = paged_batch(shapes, 16, 9, 3, 64, torch.float32, seed=3)
    together = native.paged_decode_attention(q, *kv, meta.block_tables, meta.seq_lens, 0.125)
    for i in range(len(shapes)):
        one = slice(i, i + 1)
        alone = native.paged_decode_attention(q[one], *kv, meta.block_tables[one], meta.seq_lens[one], 0.125)
        assert torch.equal(alone[0], together[i])
    windowed = native.paged_decode_attention(q, *kv, meta.block_tables, meta.seq_lens, 0.125, 37)
    for i in range(len(shapes)):
        one = slice(i, i + 1)
        alone = native.paged_decode_attention(q[one], *kv, meta.block_tables[one], meta.seq_lens[one], 0.125, 37)
        assert torch.equal(alone[0], windowed[i])


@needs_native
def test_kernel_rejects_what_it_cannot_read() -> None:
    q, kv, meta, _ = paged_batch([(5, 1)], 4, 2, 1, 8, torch.float32)
    with pytest.raises(TypeError, match="float32"):
        native.paged_decode_attention(q.double(), *kv, meta.block_tables, meta.seq_lens, 1.0)
    with pytest.raises(ValueError, match="shapes"):
        native.paged_decode_attention(q[:, :, :4], *kv, meta.block_tables, meta.seq_lens, 1.0)
    with pytest.raises(ValueError, match="window"):
        native.paged_decode_attention(q, *kv, meta.block_tables, meta.seq_lens, 1.0, 0)


@needs_native
@pytest.mark.parametrize("kv_dtype", ["auto", "bfloat16"])
def test_engine_on_cpu_backend_matches_torch_backend(kv_dtype: str) -> None:
    """The real Llama code (tiny, float32) through the engine: same greedy tokens on both backends,
    with more requests than one step's decode batch and a mid-run prefill."""
    base = [
        "model=tiny",
        "model.dtype=float32",
        f"engine.kv_cache_dtype={kv_dtype}",
        "engine.max_num_batched_tokens=32",
    ]
    prompts = [[(7 * i + j) % 300 + 10 for j in range(5 + 3 * i)] for i in range(6)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    outs = {
        backend: [o.token_ids for o in LLM(*base, f"backend={backend}").generate(prompts, params)]
        for backend in ("torch", "cpu")
    }
    assert outs["cpu"] == outs["torch"]


def test_kv_cache_dtype_sizes_and_types_the_pool() -> None:
    base = ["model=tiny", "model.dtype=float32", "engine.kv_cache_memory_gib=0.01"]
    full = build_engine(compose_config(base))
    half = build_engine(compose_config([*base, "engine.kv_cache_dtype=bfloat16"]))
    assert isinstance(full.runner, ModelRunner) and isinstance(half.runner, ModelRunner)
    assert full.runner.kv_caches[0][0].dtype == torch.float32
    assert half.runner.kv_caches[0][0].dtype == torch.bfloat16
    assert half.scheduler.kv.num_blocks // 2 == full.scheduler.kv.num_blocks  # same bytes, twice the blocks


def test_kv_cache_dtype_is_checked() -> None:
    with pytest.raises(ConfigError, match="kv_cache_dtype"):
        compose_config(["engine.kv_cache_dtype=int4"])
    with pytest.raises(ConfigError, match="keep auto"):  # the synthetic model's cache holds token ids
        build_engine(compose_config(["model=synthetic", "engine.kv_cache_dtype=bfloat16"]))


def test_cpu_backend_without_a_compiler_says_so(tmp_path: os.PathLike[str]) -> None:
    env = {**os.environ, "CC": "no-such-cc", "FORGE_CACHE_DIR": str(tmp_path)}
    code = "from forge.kernels.cpu_backend import CpuBackend\nCpuBackend()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode != 0
    assert "backend=cpu cannot build its C kernels here" in done.stderr and "no-such-cc" in done.stderr


@needs_native
@pytest.mark.parametrize(("rows", "cols"), [(1, 576), (5, 64), (64, 1536)])
def test_int8_quantize_and_rescale_are_bit_identical_to_torch(rows: int, cols: int) -> None:
    """The int8 weight format's one-pass C helpers give exactly the torch expressions' bits."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 30
    x[0, :3] = 0.0
    q, scale = native.quantize_rows(x)
    q_ref, scale_ref = quantize_rows(x)
    assert torch.equal(q, q_ref) and torch.equal(scale, scale_ref)
    acc = torch.randint(-(2**30), 2**30, (rows, 300), dtype=torch.int32, generator=gen)
    col_scale = torch.rand(300, generator=gen)
    assert torch.equal(native.rescale_int_mm(acc, scale, col_scale), (acc * scale_ref).mul_(col_scale))
    zeros, zero_scale = native.quantize_rows(torch.zeros(2, 8))
    assert not zeros.any() and torch.all(zero_scale > 0)
