"""The CPU execution layer itself (forge.kernels.cuda.cpu_emu): CUDA semantics it must get right,
errors it must raise instead of computing something, and the graph capture/replay semantics.

These kernels read shared memory nobody wrote and race on purpose, to show what the execution model
does with such reads (NaN fill, schedules); the module runs them with the memory and race checks
off (``CpuCuda(checks=False)``). tests/test_cuda_cpu_checks.py tests the checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge.kernels.cuda.cpu_emu import CpuCuda, CudaLaunchError
from forge.kernels.cuda.cpu_emu.graphs import HostReadDuringCapture

KERNELS = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void convert(const float* in, unsigned short* half_bits, unsigned short* bf16_bits,
                                   float* half_back, long long n) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const __half h = __float2half_rn(in[i]);
        const __nv_bfloat16 b = __float2bfloat16_rn(in[i]);
        half_bits[i] = __half_as_ushort(h);
        bf16_bits[i] = b.__x;
        half_back[i] = __half2float(__ushort_as_half((unsigned short)(i & 0xffff)));
    }
}

// Warp 0 sums its lanes with shuffles while warp 1 exits at once: shuffles wait for their
// own warp only. Then every lane reads lane 31 of its warp, and a 16-wide xor stays in its half.
extern "C" __global__ void warps(float* out, int* ids) {
    const int lane = threadIdx.x % 32;
    if (threadIdx.x >= 32) return;
    float v = (float)lane;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    out[lane] = v;
    ids[lane] = __shfl_sync(0xffffffffu, lane * 10, 31);
    ids[32 + lane] = __shfl_xor_sync(0xffffffffu, lane, 8, 16);
    ids[64 + lane] = __shfl_down_sync(0xffffffffu, lane, 1);
}

extern "C" __global__ void divergent_barrier(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = 1.0f;
    if (threadIdx.x < 32) __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
    __syncthreads();
}

extern "C" __global__ void barrier_after_exit(float* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void shuffle_with_exited_lane(float* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

// Reads dynamic shared memory it never wrote (NaN fill), or past its end.
extern "C" __global__ void shared_reader(float* out, int index) {
    extern __shared__ float dyn[];
    out[threadIdx.x] = dyn[index];
}

// Reads the value the previous (or next) thread wrote: correct only with the barrier.
extern "C" __global__ void neighbours(float* out, int offset, int with_barrier) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    if (with_barrier) __syncthreads();
    const int j = (int)threadIdx.x + offset;
    out[blockIdx.x * 64 + threadIdx.x] = s[j >= 0 && j < 64 ? j : threadIdx.x];
}

// Each thread reads the other warp's slot, then shuffles, then writes its own slot: no barrier.
extern "C" __global__ void other_warp_early(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = 0.0f;
    __syncthreads();
    const float early = s[(threadIdx.x + 32) % 64];
    const float v = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
    s[threadIdx.x] = v;
    out[threadIdx.x] = early;
}

extern "C" __global__ void __launch_bounds__(64) bounded(float* out, double scale, int n) {
    if (threadIdx.x < n) out[threadIdx.x] = (float)scale;
}

extern "C" __global__ void wild_pointer(float* out) { out[threadIdx.x] = *(const float*)(16 + threadIdx.x); }
"""


@pytest.fixture(scope="module")
def runtime() -> CpuCuda:
    return CpuCuda(checks=False)


@pytest.fixture(scope="module")
def module(runtime: CpuCuda):
    return runtime.RawModule(code=KERNELS, options=("--std=c++17",))


def ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def test_half_and_bfloat16_round_to_nearest_even_bit_for_bit(module) -> None:
    gen = torch.Generator().manual_seed(0)
    specials = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e-8, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 1e30])
    patterns = torch.randint(-(2**31), 2**31, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    x = torch.cat([specials, -specials, patterns.view(torch.float32), torch.randn(100_000, generator=gen)])
    x = torch.cat([x, torch.arange(65536, dtype=torch.float32)])  # at least 65536 elements for half_back
    n = x.numel()
    half_bits = torch.zeros(n, dtype=torch.int16)
    bf16_bits = torch.zeros(n, dtype=torch.int16)
    half_back = torch.zeros(n, dtype=torch.float32)
    module.get_function("convert")((64,), (256,), (ptr(x), ptr(half_bits), ptr(bf16_bits), ptr(half_back), np.int64(n)))
    nan = x.isnan()
    assert torch.equal(half_bits[~nan], x[~nan].to(torch.float16).view(torch.int16))
    assert torch.equal(bf16_bits[~nan], x[~nan].to(torch.bfloat16).view(torch.int16))
    assert half_bits[nan].view(torch.float16).isnan().all() and bf16_bits[nan].view(torch.bfloat16).isnan().all()
    every_half = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    got = half_back[:65536]
    assert torch.equal(got.isnan(), every_half.isnan())
    assert torch.equal(got[~got.isnan()], every_half[~every_half.isnan()])


def test_shuffles_exchange_within_one_warp_of_32_lanes(module) -> None:
    out = torch.full((32,), float("nan"))
    ids = torch.full((96,), -1, dtype=torch.int32)
    module.get_function("warps")((1,), (64,), (ptr(out), ptr(ids)))
    assert torch.equal(out, torch.full((32,), float(sum(range(32)))))
    assert torch.equal(ids[:32], torch.full((32,), 310, dtype=torch.int32))
    lanes = torch.arange(32, dtype=torch.int32)
    assert torch.equal(ids[32:64], lanes ^ 8)  # within each group of 16
    assert torch.equal(ids[64:], torch.where(lanes < 31, lanes + 1, lanes))


@pytest.mark.parametrize(
    "kernel,message",
    [
        ("divergent_barrier", "different __syncthreads"),
        ("barrier_after_exit", "after 32 threads of the block exited"),
        ("shuffle_with_exited_lane", "lane 5 is exited"),
    ],
)
def test_divergent_synchronisation_aborts_with_the_line(module, kernel: str, message: str) -> None:
    out = torch.zeros(64)
    with pytest.raises(CudaLaunchError, match=message) as err:
        module.get_function(kernel)((1,), (64,), (ptr(out),))
    assert "line " in str(err.value) and ("__syncthreads" in str(err.value) or "__shfl" in str(err.value))


@pytest.mark.parametrize("offset", [1, -1])
def test_a_missing_barrier_is_exposed_whichever_neighbour_is_read(module, offset: int) -> None:
    out = torch.zeros(2 * 64)
    neighbours = module.get_function("neighbours")
    j = torch.arange(64) + offset
    want = torch.where((j >= 0) & (j < 64), j, torch.arange(64)).float().repeat(2)
    neighbours((2,), (64,), (ptr(out), np.int32(offset), np.int32(1)))
    assert torch.equal(out, want)
    # Without the barrier some thread reads the poison under one of the schedules (forward, reverse,
    # warps ahead), which consecutive launches cycle through.
    seen_nan = []
    for _ in range(3):
        neighbours((2,), (64,), (ptr(out), np.int32(offset), np.int32(0)))
        seen_nan.append(bool(out.isnan().any()))
    assert any(seen_nan)


def test_warps_run_ahead_to_their_next_barrier_under_one_schedule(module) -> None:
    """In thread-order rounds every warp stops at the shuffle before any writes, so warp 1 reads 0;
    when warp 0 runs ahead through its shuffle to the end first, warp 1 reads its 1. Consecutive
    launches cycle through the schedules, so both outcomes appear."""
    seen = set()
    for _ in range(3):
        out = torch.full((64,), float("nan"))
        module.get_function("other_warp_early")((1,), (64,), (ptr(out),))
        seen.add(out[32:].tolist() == [1.0] * 32)
    assert seen == {True, False}
    with pytest.raises(CudaLaunchError, match=r"__shared__ other_warp_early::s.* races with"):
        CpuCuda().RawModule(code=KERNELS).get_function("other_warp_early")((1,), (64,), (ptr(out),))


def test_dynamic_shared_memory_is_nan_and_ends_at_a_guard_page(module) -> None:
    out = torch.zeros(32)
    reader = module.get_function("shared_reader")
    reader((1,), (32,), (ptr(out), np.int32(63)), shared_mem=256)
    assert out.isnan().all()  # never written: the fill, as garbage would be on a GPU
    with pytest.raises(CudaLaunchError, match="guard page"):
        reader((1,), (32,), (ptr(out), np.int32(64)), shared_mem=256)  # one past the end
    with pytest.raises(CudaLaunchError, match="illegal memory access"):
        module.get_function("wild_pointer")((1,), (32,), (ptr(out),))
    reader((1,), (32,), (ptr(out), np.int32(0)), shared_mem=256)  # the process and the layer carry on


def test_launches_a_gpu_would_reject_raise(module) -> None:
    out = torch.zeros(1024)
    reader = module.get_function("shared_reader")
    args = (ptr(out), np.int32(0))
    with pytest.raises(CudaLaunchError, match="1024 threads"):
        reader((1,), (1025,), args)
    with pytest.raises(CudaLaunchError, match="grid"):
        reader((1, 70000), (32,), args)
    with pytest.raises(CudaLaunchError, match="opt-in above 48 KiB"):
        reader((1,), (32,), args, shared_mem=64 * 1024)
    reader.max_dynamic_shared_size_bytes = 64 * 1024
    reader((1,), (32,), args, shared_mem=64 * 1024)
    with pytest.raises(CudaLaunchError, match="exceed the device"):
        reader((1,), (32,), args, shared_mem=228 * 1024)
    with pytest.raises(CudaLaunchError, match="takes 2 arguments"):
        reader((1,), (32,), (ptr(out),))
    with pytest.raises(CudaLaunchError, match=r"argument 1 \(index\) is an integer of 4 bytes.*int64"):
        reader((1,), (32,), (ptr(out), np.int64(0)))
    bounded = module.get_function("bounded")
    with pytest.raises(CudaLaunchError, match="__launch_bounds__"):
        bounded((1,), (128,), (ptr(out), np.float64(2.0), np.int32(4)))
    with pytest.raises(CudaLaunchError, match=r"argument 1 \(scale\) is a floating-point value of 8 bytes.*float32"):
        bounded((1,), (64,), (ptr(out), np.float32(2.0), np.int32(4)))
    fresh = torch.zeros(64)
    bounded((1,), (64,), (ptr(fresh), np.float64(2.0), np.int32(4)))
    assert fresh[:4].tolist() == [2.0] * 4 and not fresh[4:].any()


def test_ucontext_fibers_give_the_same_results() -> None:
    module = CpuCuda(extra_flags=("-DFORGE_EMU_UCONTEXT",), checks=False).RawModule(code=KERNELS)
    out = torch.full((32,), float("nan"))
    ids = torch.full((96,), -1, dtype=torch.int32)
    module.get_function("warps")((1,), (64,), (ptr(out), ptr(ids)))
    assert torch.equal(out, torch.full((32,), float(sum(range(32)))))
    with pytest.raises(CudaLaunchError, match="different __syncthreads"):
        module.get_function("divergent_barrier")((1,), (64,), (ptr(torch.zeros(64)),))


def test_graph_replays_recorded_ops_without_python(runtime: CpuCuda, module) -> None:
    graphs = runtime.graphs
    x = torch.ones(32)
    calls = []

    def step() -> torch.Tensor:
        calls.append(1)
        scale = 2.0 if len(calls) == 1 else 100.0  # a host decision: frozen at capture
        y = x * scale
        out = torch.empty(32)
        module.get_function("bounded")((1,), (64,), (ptr(out), np.float64(3.0), np.int32(32)))
        return y + out

    graph = graphs.CUDAGraph()
    with graphs.graph(graph):
        result = step()
    assert result.isnan().all()  # nothing is computed by a capture, as far as anyone may look
    x.fill_(5.0)
    graph.replay()
    assert torch.equal(result, torch.full((32,), 13.0)) and len(calls) == 1
    with pytest.raises(HostReadDuringCapture, match="item"), graphs.graph(graphs.CUDAGraph()):
        (x * 2).sum().item()
    with pytest.raises(HostReadDuringCapture, match="tolist"), graphs.graph(graphs.CUDAGraph()):
        x.tolist()
