"""The CPU layer is sensitive: GPU bugs of every class issue 36 names (races, overflow, precision, ties,
tails, offsets, out-of-bounds, misalignment, uninitialised shared memory, plus the original seven),
planted one at a time in copies of forge's kernel sources and launch code, are each caught by an
assertion or a ``CudaLaunchError`` naming the problem -- never by a crash of the test process --
while the same check passes on the unmodified sources. CI runs one or two mutants per class; the
rest are marked ``slow``."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from forge.kernels.cuda import sources
from forge.kernels.cuda.cpu_emu import CpuCuda, CudaLaunchError
from forge.kernels.cuda_backend import CudaBackend
from forge.kernels.torch_backend import TorchBackend
from tests.test_cuda_kernel_edges import (
    check_argmax_ties,
    check_cache_over_2_to_the_31,
    check_cache_write_tail,
    check_large_logits,
    check_quant_tail,
    check_rope_tail,
    check_silu_mul_tail,
)
from tests.test_cuda_kernels import (
    Device,
    assert_close,
    attention_case,
    check_attention,
    check_quantized_attention,
    poisoned,
)

DTYPE = torch.float32


def check_rms_norm(dev: Device) -> None:
    x = torch.randn(5, 576, dtype=DTYPE)
    w = 1 + 0.1 * torch.randn(576, dtype=DTYPE)
    out = poisoned((5, 576), DTYPE, "cpu")
    dev.cuda.ops.rms_norm(out, x, w, 1e-5)
    assert_close(out, dev.oracle.rms_norm(x, w, 1e-5), DTYPE)


def check_cache_write(dev: Device) -> None:
    key = torch.randn(20, 3 * 2 * 64, dtype=DTYPE)[:, : 2 * 64].view(20, 2, 64)  # strided rows
    value = torch.randn(20, 2, 64, dtype=DTYPE)
    slots = torch.randperm(8 * 16)[:20]
    caches = [poisoned((8, 16, 2, 64), DTYPE, "cpu") for _ in range(2)]
    dev.cuda.write_kv((caches[0], caches[1]), key, value, slots)
    assert torch.equal(caches[0].view(-1, 2, 64)[slots], key) and torch.equal(caches[1].view(-1, 2, 64)[slots], value)


def check_decode(dev: Device, dtype: torch.dtype = DTYPE) -> None:
    case = attention_case(dtype, 16, 2, 4, 64, [1] * 3, [7, 300, 600], seed=1, device="cpu")
    check_attention(dev, dtype, *case)


def check_prefill(dev: Device, dtype: torch.dtype = DTYPE) -> None:
    case = attention_case(dtype, 16, 2, 4, 64, [40, 9], [40, 100], seed=2, device="cpu")
    check_attention(dev, dtype, *case)


def bf16(check: Callable[[Device, torch.dtype], None]) -> Callable[[Device], None]:
    return lambda dev: check(dev, torch.bfloat16)


def fp32(check: Callable[[Device, torch.dtype], None]) -> Callable[[Device], None]:
    return lambda dev: check(dev, torch.float32)


def check_decode_int8_cache(dev: Device) -> None:
    case = attention_case(DTYPE, 16, 2, 4, 64, [1] * 3, [7, 300, 600], seed=3, device="cpu")
    check_quantized_attention(dev, DTYPE, torch.int8, *case)


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # a kernel source (.cu/.cuh), ops.py or one of its parts (ops_*.py)
    old: str
    new: str
    check: Callable[[Device], None]
    caught_by: str  # regex of the CudaLaunchError, or "" for a wrong result
    slow: bool = False  # another mutant of its class runs on every push


# The classes of issue 36, each planted anew.
NEW_MUTATIONS = [
    Mutation(
        "race: scratch reused after a warp reduction without the leading barrier (write-after-read)",
        "common.cuh",
        "    v = warp_sum(v);\n    __syncthreads();\n    if (lane == 0) scratch[warp] = v;",
        "    v = warp_sum(v);\n    if (lane == 0) scratch[warp] = v;",
        check_decode,
        r"write of __shared__ paged_attention_decode::scratch, byte \d+ of 128 races with a read",
    ),
    Mutation(
        "race: a shared accumulator updated with += by every thread",
        "norm.cu",
        "const float v = to_float(xr[i]);\n        sum_sq += v * v;\n    }\n    sum_sq = block_sum(sum_sq, scratch);",
        "const float v = to_float(xr[i]);\n        sum_sq += v * v;\n    }\n"
        "    if (threadIdx.x == 0) scratch[0] = 0.0f;\n    __syncthreads();\n"
        "    scratch[0] += sum_sq;\n    __syncthreads();\n    sum_sq = scratch[0];",
        check_rms_norm,
        r"__shared__ rms_norm::scratch, byte 0 of 128 races with thread \d+'s write",
    ),
    Mutation(
        "overflow: decode softmax without max subtraction",
        "paged_attention.cu",
        "if (tid == 0) head_max[g] = m;\n        float sum = 0.0f;\n"
        "        for (int t = tid; t < n; t += NUM_THREADS) {\n"
        "            const float e = expf(logits[g * PARTITION_SIZE + t] - m);",
        "if (tid == 0) head_max[g] = 0.0f;\n        float sum = 0.0f;\n"
        "        for (int t = tid; t < n; t += NUM_THREADS) {\n"
        "            const float e = expf(logits[g * PARTITION_SIZE + t]);",
        fp32(check_large_logits),
        "",
    ),
    Mutation(
        "overflow: the reduce rescales by partition 0's max",
        "paged_attention.cu",
        "    m = block_max(m, scratch);",
        "    m = max_logits[base];",
        fp32(check_large_logits),
        "",
    ),
    Mutation(
        "offsets: cache offsets computed in int32",
        "attention_common.cuh",
        "const long long block = block_table[pos / block_size];\n    const long long slot =",
        "const int block = block_table[pos / block_size];\n    const int slot =",
        check_cache_over_2_to_the_31,
        "outside every pointer argument's buffer",
    ),
    Mutation(
        "offsets: the cache write's slot offset in int32",
        "cache.cu",
        "scalar_t* k_dst = k_cache + slot * row;",
        "scalar_t* k_dst = k_cache + (int)slot * row;",
        check_cache_over_2_to_the_31,
        "",  # g++ lands the wrapped rows inside the cache: the keys read back are wrong
        slow=True,
    ),
    Mutation(
        "precision: decode p·V accumulated in bf16",
        "paged_attention.cu",
        "acc[g][j] += logits[g * PARTITION_SIZE + t] * vd;",
        "acc[g][j] = round_to_scalar(acc[g][j] + logits[g * PARTITION_SIZE + t] * vd);",
        bf16(check_decode),
        "",
    ),
    Mutation(
        "precision: prefill p·V accumulated in bf16",
        "prefill_attention.cu",
        "a += p_s[warp * BLOCK_N + n] * v_s[n * HEAD_DIM + d];",
        "a = round_to_scalar(a + p_s[warp * BLOCK_N + n] * v_s[n * HEAD_DIM + d]);",
        bf16(check_prefill),
        "",
        slow=True,
    ),
    Mutation(
        "ties: an argmax tie inside one thread resolves to the later index",
        "sampling.cu",
        "if (idx == vocab || beats(v, i, val, idx)) {",
        "if (idx == vocab || v >= val) {",
        fp32(check_argmax_ties),
        "",
    ),
    Mutation(
        "tails: silu_mul without its tail guard",
        "activation.cu",
        "idx < total;",
        "idx < (long long)gridDim.x * blockDim.x;",
        fp32(check_silu_mul_tail),
        r"silu_mul: .* 4 bytes .* past the end of the buffer of argument [01] \((out|gate_up)\)",
    ),
    Mutation(
        "tails: rope_neox without its tail guard",
        "rope.cu",
        "for (int p = threadIdx.x; p < pairs; p += blockDim.x) {",
        "for (int p = threadIdx.x; p < (int)blockDim.x; p += blockDim.x) {",
        fp32(check_rope_tail),
        r"rope_neox: .* past the end of the buffer of argument",
        slow=True,
    ),
    Mutation(
        "tails: dequant_q8_0 without its tail guard",
        "quant.cu",
        "idx < total;\n         idx += (long long)gridDim.x * blockDim.x) {\n"
        "        out[idx] = from_float(q8_0_weight(",
        "idx < (long long)gridDim.x * blockDim.x;\n         idx += (long long)gridDim.x * blockDim.x) {\n"
        "        out[idx] = from_float(q8_0_weight(",
        lambda dev: check_quant_tail(dev, "q8_0", torch.float32),
        r"dequant_q8_0: .* past the end of the buffer of argument",
        slow=True,
    ),
    Mutation(
        "out-of-bounds: the cache write does not skip slot -1",
        "cache.cu",
        "    if (slot < 0) return;\n    const scalar_t* k_src",
        "    const scalar_t* k_src",
        fp32(check_cache_write_tail),
        r"reshape_and_cache: .*write of 4 bytes .* before the start of the buffer of argument 2 \(k_cache\)",
    ),
    Mutation(
        "out-of-bounds: argmax reads one past each row",
        "ops.py",
        'i64(row_stride(logits, "logits")), i32(vocab))',
        'i64(row_stride(logits, "logits")), i32(vocab + 1))',
        fp32(check_argmax_ties),
        r"read of 4 bytes .* past the end of the buffer of argument 1 \(logits\)",
        slow=True,
    ),
    Mutation(
        "out-of-bounds: a static shared array too small for 32 warps",
        "sampling.cu",
        "__shared__ float best_val[32];",
        "__shared__ float best_val[16];",
        fp32(check_argmax_ties),
        r"bytes past the end of __shared__ argmax_rows::best_val \(64 bytes\)",
    ),
    Mutation(
        "misaligned: K rows loaded as 16-byte vectors 4 bytes off",
        "paged_attention.cu",
        "load_vec(k + d0, kv);",
        "load_vec(k + d0 + 1, kv);",
        check_decode,
        "misaligned read of 16 bytes",
    ),
    Mutation(
        "uninitialised: block_max reads scratch slots no warp wrote (fmaxf swallows the NaN)",
        "common.cuh",
        "v = lane < num_warps ? scratch[lane] : neg_inf();",
        "v = scratch[lane];",
        check_decode,
        r"reads __shared__ paged_attention_decode::scratch, byte \d+ of 128, which no thread of the block wrote",
    ),
]


MUTATIONS = [
    Mutation(
        "removed __syncthreads",
        "paged_attention.cu",
        "q_s[i] = to_float(q[i]) * scale;\n    __syncthreads();",
        "q_s[i] = to_float(q[i]) * scale;",
        check_decode,
        r"extern __shared__ smem\[\], byte \d+.*(races with|which no thread of the block wrote)",
    ),
    Mutation(
        "shared memory sized too small",
        "ops_attention.py",
        "                + (PREFILL_THREADS // 32) * PREFILL_BLOCK_N\n",
        "",
        check_prefill,
        r"extern __shared__ smem\[\], byte \d+; the launch has \d+ bytes",
    ),
    Mutation(
        "int32 passed for an int64 stride",
        "ops.py",
        "i64(k_stride),",
        "i32(k_stride),",
        check_cache_write,
        r"argument 5 \(key_stride\) is an integer of 8 bytes.*int32",
    ),
    Mutation(
        "warp reduction over 16 lanes",
        "common.cuh",
        "__device__ __forceinline__ float warp_sum(float v) {\n#pragma unroll\n    for (int offset = FORGE_WARP / 2;",
        "__device__ __forceinline__ float warp_sum(float v) {\n#pragma unroll\n    for (int offset = FORGE_WARP / 4;",
        check_rms_norm,
        "",
    ),
    Mutation(
        "missing __syncwarp",
        "prefill_attention.cu",
        "p_s[warp * BLOCK_N + lane] = p;\n            __syncwarp();",
        "p_s[warp * BLOCK_N + lane] = p;",
        check_prefill,
        r"extern __shared__ smem\[\], byte \d+.*(races with|which no thread of the block wrote)",
    ),
    Mutation(
        "int8 cache's V rows read without their scale",
        "paged_attention.cu",
        "const float vd = kv_at(v, d) * v_scale;",
        "const float vd = kv_at(v, d);",
        check_decode_int8_cache,
        "",
    ),
    Mutation(
        "divergent barrier",
        "common.cuh",
        "v = warp_sum(v);\n    __syncthreads();\n    if (lane == 0) scratch[warp] = v;",
        "v = warp_sum(v);\n    if (warp == 0) __syncthreads();\n    if (lane == 0) scratch[warp] = v;",
        check_rms_norm,
        "threads wait at different __syncthreads",
    ),
    *NEW_MUTATIONS,
]


def _device() -> Device:
    runtime = CpuCuda()
    return Device("cpu", CudaBackend("cpu", cuda_graphs=False, runtime=runtime), TorchBackend("cpu"), runtime)


def _load(path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module at ``path``, as ``sys.modules[name]`` for this test."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _mutated_ops(tmp_path: Path, mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> type:
    """``CudaOps`` from a mutated copy of ``mutation.file``: ops.py, or one of its parts (``ops_*.py``), put in
    ``sys.modules`` under its own name for this test, with ops.py loaded afresh over it."""
    source = (sources.KERNEL_DIR / mutation.file).read_text()
    assert source.count(mutation.old) == 1, f"{mutation.name}: the text to mutate is not in {mutation.file} once"
    path = tmp_path / f"mutant_{mutation.file}"
    path.write_text(source.replace(mutation.old, mutation.new))
    if mutation.file == "ops.py":
        return _load(path, "forge_mutant_ops", monkeypatch).CudaOps
    _load(path, f"forge.kernels.cuda.{mutation.file.removesuffix('.py')}", monkeypatch)
    return _load(sources.KERNEL_DIR / "ops.py", "forge_mutant_ops", monkeypatch).CudaOps


@pytest.mark.parametrize(
    "mutation",
    [pytest.param(m, marks=pytest.mark.slow) if m.slow else m for m in MUTATIONS],
    ids=[m.name.split(" (")[0].replace(" ", "-").replace(":", "") for m in MUTATIONS],
)
def test_planted_bug_is_caught(mutation: Mutation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    mutation.check(_device())  # the unmodified sources pass the check

    dev = _device()
    if mutation.file.endswith(".py"):
        dev.cuda.ops = _mutated_ops(tmp_path, mutation, monkeypatch)(dev.cuda.ops.lib)
    else:
        copy = tmp_path / "kernels"
        copy.mkdir()
        for f in [*sources.KERNEL_DIR.glob("*.cu"), *sources.KERNEL_DIR.glob("*.cuh")]:
            shutil.copy(f, copy / f.name)
        text = (copy / mutation.file).read_text()
        assert text.count(mutation.old) == 1, f"{mutation.name}: the text to mutate is not in {mutation.file} once"
        (copy / mutation.file).write_text(text.replace(mutation.old, mutation.new))
        monkeypatch.setattr(sources, "KERNEL_DIR", copy)
    if mutation.caught_by:
        with pytest.raises(CudaLaunchError, match=mutation.caught_by):
            mutation.check(dev)
    else:
        with pytest.raises(AssertionError):
            mutation.check(dev)
