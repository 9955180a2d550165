"""The CPU layer's memory and race checks (``cuda_cpu_check.h``) and the intrinsics it offers.

Each check is shown failing a launch with a ``CudaLaunchError`` that names the kernel, the source
line and the variable or argument, and passing on the corrected kernel: shared-memory races
(write-after-read across a warp reduction, a shared ``+=`` without an atomic, lanes without
``__syncwarp``), accesses outside a tensor's storage, misaligned vector loads, one past a static
``__shared__`` array, reads of shared memory no thread wrote, barriers that are different call
sites on one line. Then the intrinsics: atomics, votes, ``__ldg``, fences, half2 arithmetic and
FMA contraction as NVRTC does it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge.kernels.cuda.cpu_emu import CpuCuda, CudaLaunchError
from forge.kernels.cuda.cpu_emu.build import has_fma

KERNELS = r"""
#include <cuda_fp16.h>

// A block sum done twice with one scratch array: the second round's writes must wait for
// every warp's reads of the first round (the leading barrier of block_sum).
extern "C" __global__ void twice_summed(float* out, int with_barrier) {
    __shared__ float scratch[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float v = 1.0f;
    for (int round = 0; round < 2; ++round) {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (with_barrier) __syncthreads();
        if (lane == 0) scratch[warp] = v;
        __syncthreads();
        v = lane < (int)blockDim.x / 32 ? scratch[lane] : 0.0f;
    }
    out[threadIdx.x] = v;
}

extern "C" __global__ void accumulate(float* out, int atomic) {
    __shared__ float total;
    if (threadIdx.x == 0) total = 0.0f;
    __syncthreads();
    if (atomic) atomicAdd(&total, 1.0f); else total += 1.0f;
    __syncthreads();
    out[threadIdx.x] = total;
}

// Lanes read their neighbour's (or the other warp's) slot after a __syncwarp, or without one.
extern "C" __global__ void warp_exchange(float* out, int sync, int other_warp) {
    __shared__ float p[64];
    p[threadIdx.x] = 0.0f;
    __syncthreads();
    p[threadIdx.x] = (float)threadIdx.x;
    if (sync) __syncwarp();
    out[threadIdx.x] = p[other_warp ? (threadIdx.x + 32) % 64 : threadIdx.x ^ 1];
}

extern "C" __global__ void copy_n(float* out, const float* in, long long n, long long shift) {
    for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i + shift] = in[i];
}

extern "C" __global__ void load4(float* out, const float* in, int offset) {
    const float4 v = *reinterpret_cast<const float4*>(in + offset);
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}

extern "C" __global__ void past_static(float* out, int index) {
    __shared__ float a[32];
    __shared__ float b[32];
    a[threadIdx.x] = 1.0f;
    b[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = a[index];
}

extern "C" __global__ void uninit_index(int* out, int write) {
    __shared__ int idx[32];
    if (write) idx[threadIdx.x] = threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = idx[threadIdx.x];
}

extern "C" __global__ void one_line_barriers(float* out) {
    if (threadIdx.x < 16) __syncthreads(); else __syncthreads();
    out[threadIdx.x] = 1.0f;
}

extern "C" __global__ void after_block0(int* flag, int* out) {
    if (blockIdx.x == 0) flag[0] = 1; else out[0] = flag[0];
}

extern "C" __global__ void votes(unsigned* out, int* counters) {
    const int lane = threadIdx.x % 32;
    const unsigned ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
    const bool any = __any_sync(0xffffffffu, lane == 7);
    const bool all = __all_sync(0xffffffffu, lane < 31);
    if (threadIdx.x < 32) {
        out[lane] = ballot;
        out[32 + lane] = any;
        out[64 + lane] = all;
    }
    if (threadIdx.x >= 40) return;
    const unsigned active = __activemask();
    if (threadIdx.x >= 32) out[96 + lane] = active;  // warp 1 has 8 lanes left
    atomicAdd(&counters[0], 1);
    atomicMax(&counters[1], (int)(blockIdx.x * 100 + threadIdx.x));
    atomicCAS(&counters[2], 0, 5);
    __threadfence();
    counters[3 + blockIdx.x * 40 + threadIdx.x] = __ldg(&counters[0]) > 0;
}

extern "C" __global__ void half2_ops(__half* out, const __half* a, const __half* b, const __half* c, int n) {
    for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const __half2 x = __halves2half2(a[2 * i], a[2 * i + 1]);
        const __half2 y = __halves2half2(b[2 * i], b[2 * i + 1]);
        const __half2 z = __halves2half2(c[2 * i], c[2 * i + 1]);
        const __half2 s = __hadd2(x, y), p = __hmul2(x, y), f = __hfma2(x, y, z);
        out[2 * i] = __low2half(s); out[2 * i + 1] = __high2half(s);
        out[n + 2 * i] = __low2half(p); out[n + 2 * i + 1] = __high2half(p);
        out[2 * n + 2 * i] = __low2half(f); out[2 * n + 2 * i + 1] = __high2half(f);
    }
}

extern "C" __global__ void contract(float* out, const float* x) {
    out[0] = x[0] * x[1] + x[2];               // contracted into an FMA, as NVRTC does by default
    out[1] = __fadd_rn(__fmul_rn(x[0], x[1]), x[2]);  // never contracted
}
"""


@pytest.fixture(scope="module")
def runtime() -> CpuCuda:
    return CpuCuda()


@pytest.fixture(scope="module")
def module(runtime: CpuCuda):
    return runtime.RawModule(code=KERNELS)


def raw(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


@pytest.mark.parametrize(
    "kernel,args,message",
    [
        ("twice_summed", (0,), r"write of __shared__ twice_summed::scratch, byte \d+ of 128 races with a read"),
        ("accumulate", (0,), r"__shared__ accumulate::total, byte 0 of 4 races with thread \d+'s write"),
        ("warp_exchange", (0, 0), r"of __shared__ warp_exchange::p, byte \d+ of 256 races with"),
        ("warp_exchange", (1, 1), r"read of __shared__ warp_exchange::p.* races"),  # __syncwarp orders one warp
    ],
)
def test_shared_memory_races_fail_naming_kernel_line_and_variable(module, kernel, args, message) -> None:
    out = torch.zeros(64)
    fn = module.get_function(kernel)
    with pytest.raises(CudaLaunchError, match=message) as err:
        fn((1,), (64,), (raw(out), *(np.int32(a) for a in args)))
    assert str(err.value).startswith(f"{kernel}: block (0,0,0): thread ")
    assert "at line " in str(err.value) and "\n  line " in str(err.value)  # the source line is shown


def test_the_same_kernels_pass_when_ordered(module) -> None:
    out = torch.zeros(64)
    module.get_function("twice_summed")((1,), (64,), (raw(out), np.int32(1)))
    lanes = torch.arange(64) % 32
    assert torch.equal(out, torch.where(lanes < 2, 64.0, 0.0))  # two warps of 32, twice
    module.get_function("accumulate")((1,), (64,), (raw(out), np.int32(1)))  # atomics do not race
    assert torch.equal(out, torch.full((64,), 64.0))
    module.get_function("warp_exchange")((1,), (64,), (raw(out), np.int32(1), np.int32(0)))
    assert torch.equal(out, (torch.arange(64) ^ 1).float())


@pytest.mark.parametrize("n", [5, 1_000_000])
def test_one_element_past_a_tensor_fails_reads_and_writes(runtime: CpuCuda, module, n: int) -> None:
    copy = module.get_function("copy_n")
    src, dst = torch.randn(n), torch.zeros(n)
    args = (runtime.kernel_pointer(dst), runtime.kernel_pointer(src))
    copy((1,), (256,), (*args, np.int64(n), np.int64(0)))
    assert torch.equal(dst, src)
    past_end = r"of 4 bytes .* starts 0 bytes past the end of the buffer of argument"
    with pytest.raises(CudaLaunchError, match=rf"read {past_end} 1 \(in\)"):
        copy((1,), (256,), (*args, np.int64(n + 1), np.int64(0)))
    with pytest.raises(CudaLaunchError, match=rf"write {past_end} 0 \(out\)"):
        copy((1,), (256,), (*args, np.int64(n), np.int64(1)))
    with pytest.raises(CudaLaunchError, match=r"write of 4 bytes .* bytes before the start of the buffer"):
        copy((1,), (256,), (*args, np.int64(n), np.int64(-(2**40))))  # refused before it happens: no crash
    dst.zero_()
    copy((1,), (256,), (*args, np.int64(n), np.int64(0)))  # the layer carries on
    assert torch.equal(dst, src)


def test_a_misaligned_vector_load_faults(runtime: CpuCuda, module) -> None:
    src, out = torch.arange(16, dtype=torch.float32), torch.zeros(1)
    load4 = module.get_function("load4")
    args = (runtime.kernel_pointer(out), runtime.kernel_pointer(src))
    load4((1,), (1,), (*args, np.int32(4)))
    assert out.item() == 4 + 5 + 6 + 7
    with pytest.raises(CudaLaunchError, match="misaligned read of 16 bytes"):
        load4((1,), (1,), (*args, np.int32(1)))


def test_one_past_a_static_shared_array_fails(module) -> None:
    out = torch.zeros(32)
    past = module.get_function("past_static")
    past((1,), (32,), (raw(out), np.int32(31)))
    with pytest.raises(CudaLaunchError, match=r"1 bytes past the end of __shared__ past_static::a \(128 bytes\)"):
        past((1,), (32,), (raw(out), np.int32(32)))


def test_uninitialised_shared_memory_reads_fail(module) -> None:
    out = torch.zeros(32, dtype=torch.int32)
    fn = module.get_function("uninit_index")
    fn((1,), (32,), (raw(out), np.int32(1)))
    assert torch.equal(out, torch.arange(32, dtype=torch.int32))
    with pytest.raises(CudaLaunchError, match=r"reads __shared__ uninit_index::idx, byte \d+ of 128, which no thread"):
        fn((1,), (32,), (raw(out), np.int32(0)))


def test_two_barriers_on_one_line_are_two_call_sites(module) -> None:
    with pytest.raises(CudaLaunchError, match="threads wait at different __syncthreads"):
        module.get_function("one_line_barriers")((1,), (32,), (raw(torch.zeros(32)),))


def test_block_order_differs_between_launches(module) -> None:
    """A block reading what another block writes, without a grid-wide sync: consecutive launches
    run the grid forwards and backwards, so the read sees both outcomes."""
    seen = set()
    for _ in range(2):
        flag, out = torch.zeros(1, dtype=torch.int32), torch.full((1,), -1, dtype=torch.int32)
        module.get_function("after_block0")((2,), (1,), (raw(flag), raw(out)))
        seen.add(int(out.item()))
    assert seen == {0, 1}


def test_votes_atomics_ldg_and_fences(runtime: CpuCuda, module) -> None:
    out = torch.zeros(128, dtype=torch.int32)
    counters = torch.zeros(3 + 2 * 40, dtype=torch.int32)
    module.get_function("votes")((2,), (64,), (runtime.kernel_pointer(out), runtime.kernel_pointer(counters)))
    lanes = torch.arange(32)
    ballot = int(sum(1 << int(lane) for lane in lanes if lane % 3 == 0))
    assert out[:32].view(torch.uint32).tolist() == [ballot] * 32
    assert out[32:64].tolist() == [1] * 32 and out[64:96].tolist() == [0] * 32
    assert out[96:104].view(torch.uint32).tolist() == [0xFF] * 8  # warp 1: lanes 0..7 (threads 32..39) remain
    assert counters[:3].tolist() == [80, 139, 5]
    assert counters[3:].tolist() == [1] * 80


def half_once(exact: torch.Tensor) -> torch.Tensor:
    """float64 values rounded once to float16 (numpy's conversion; torch's ``.half()`` of a float64 goes
    through float32 and so rounds twice, which differs near a tie in ~1 of 100k values)."""
    return torch.from_numpy(exact.numpy().astype(np.float16))


@pytest.mark.parametrize("seed", [0, 9])  # seed 9 draws a value where rounding twice would differ
def test_half2_arithmetic_rounds_once(module, seed: int) -> None:
    n = 4096
    gen = torch.Generator().manual_seed(seed)
    a, b, c = (torch.randn(n, generator=gen).half() for _ in range(3))
    out = torch.zeros(3 * n, dtype=torch.float16)
    module.get_function("half2_ops")((1,), (128,), (raw(out), raw(a), raw(b), raw(c), np.int32(n)))
    da, db, dc = a.double(), b.double(), c.double()  # sums and products of halves: exact in float64
    assert torch.equal(out[:n], half_once(da + db))
    assert torch.equal(out[n : 2 * n], half_once(da * db))
    assert torch.equal(out[2 * n :], half_once(da * db + dc))


def test_multiply_add_is_contracted_into_an_fma_as_nvrtc_does(module) -> None:
    eps = 2.0**-12
    x = torch.tensor([1 + eps, 1 + eps, -(1 + 2 * eps)], dtype=torch.float32)  # x0 * x1 = 1 + 2^-11 + 2^-24
    out = torch.full((2,), float("nan"))
    module.get_function("contract")((1,), (1,), (raw(out), raw(x)))
    assert out[1].item() == 0.0  # the product rounded first
    assert out[0].item() == (2.0**-24 if has_fma() else 0.0)
