"""The CPU layer is sensitive: seven kinds of GPU bug, planted in copies of forge's kernel sources and
launch code, are each caught (a wrong result, or a launch error naming the problem), while the
same check passes on the unmodified sources."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from forge.kernels.cuda import sources
from forge.kernels.cuda.cpu_emu import CpuCuda, CudaLaunchError
from forge.kernels.cuda_backend import CudaBackend
from forge.kernels.torch_backend import TorchBackend
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


def check_decode(dev: Device) -> None:
    case = attention_case(DTYPE, 16, 2, 4, 64, [1] * 3, [7, 300, 600], seed=1, device="cpu")
    check_attention(dev, DTYPE, *case)


def check_prefill(dev: Device) -> None:
    case = attention_case(DTYPE, 16, 2, 4, 64, [40, 9], [40, 100], seed=2, device="cpu")
    check_attention(dev, DTYPE, *case)


def check_decode_int8_cache(dev: Device) -> None:
    case = attention_case(DTYPE, 16, 2, 4, 64, [1] * 3, [7, 300, 600], seed=3, device="cpu")
    check_quantized_attention(dev, DTYPE, torch.int8, *case)


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # a kernel source (.cu/.cuh) or ops.py
    old: str
    new: str
    check: Callable[[Device], None]
    caught_by: str  # regex of the CudaLaunchError, or "" for a wrong result


MUTATIONS = [
    Mutation(
        "removed __syncthreads",
        "paged_attention.cu",
        "q_s[i] = to_float(q[i]) * scale;\n    __syncthreads();",
        "q_s[i] = to_float(q[i]) * scale;",
        check_decode,
        "",
    ),
    Mutation(
        "shared memory sized too small",
        "ops.py",
        "                + (PREFILL_THREADS // 32) * PREFILL_BLOCK_N\n",
        "",
        check_prefill,
        "dynamic shared memory at byte",
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
        "",
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
]


def _device() -> Device:
    runtime = CpuCuda()
    return Device("cpu", CudaBackend("cpu", cuda_graphs=False, runtime=runtime), TorchBackend("cpu"), runtime)


def _mutated_ops(tmp_path: Path, mutation: Mutation, monkeypatch: pytest.MonkeyPatch) -> type:
    """``CudaOps`` from a mutated copy of ops.py."""
    source = (sources.KERNEL_DIR / "ops.py").read_text()
    assert source.count(mutation.old) == 1, f"{mutation.name}: the text to mutate is not in ops.py once"
    path = tmp_path / "mutant_ops.py"
    path.write_text(source.replace(mutation.old, mutation.new))
    spec = importlib.util.spec_from_file_location("forge_mutant_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "forge_mutant_ops", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.CudaOps


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name.replace(" ", "-") for m in MUTATIONS])
def test_planted_bug_is_caught(mutation: Mutation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    mutation.check(_device())  # the unmodified sources pass the check

    dev = _device()
    if mutation.file == "ops.py":
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
