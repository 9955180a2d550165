// Shared definitions for forge's CUDA kernels.
//
// Every .cu file is compiled once per element type (NVRTC through CuPy at run time, nvcc in
// CI), selected with -DFORGE_DTYPE=0|1|2 (float, __half, __nv_bfloat16). Kernels are
// extern "C" so their names are the same for every build. Only headers that NVRTC ships
// are included: no host or C++ standard library headers.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef FORGE_DTYPE
#define FORGE_DTYPE 0
#endif

#if FORGE_DTYPE == 0
typedef float scalar_t;
#elif FORGE_DTYPE == 1
typedef __half scalar_t;
#elif FORGE_DTYPE == 2
typedef __nv_bfloat16 scalar_t;
#else
#error "FORGE_DTYPE must be 0 (float32), 1 (float16) or 2 (bfloat16)"
#endif

#define FORGE_WARP 32
#define FORGE_FULL_MASK 0xffffffffu

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ scalar_t from_float(float x);
#if FORGE_DTYPE == 0
__device__ __forceinline__ scalar_t from_float(float x) { return x; }
#elif FORGE_DTYPE == 1
__device__ __forceinline__ scalar_t from_float(float x) { return __float2half_rn(x); }
#else
__device__ __forceinline__ scalar_t from_float(float x) { return __float2bfloat16_rn(x); }
#endif

// Round a float through scalar_t, as torch does when it computes an op in the tensor's dtype.
__device__ __forceinline__ float round_to_scalar(float x) { return to_float(from_float(x)); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fffffff); }

// Butterfly reductions over all 32 lanes: every lane ends with the result. All lanes of
// the warp must call them (full mask).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = FORGE_WARP / 2; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(FORGE_FULL_MASK, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = FORGE_WARP / 2; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(FORGE_FULL_MASK, v, offset));
    }
    return v;
}

// Block-wide reductions; every thread of the block must call them and every thread gets
// the result. blockDim.x must be a multiple of 32 and at most 1024. `scratch` is shared
// memory of at least 32 floats, reused across calls (hence the leading barrier).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % FORGE_WARP;
    const int warp = threadIdx.x / FORGE_WARP;
    const int num_warps = blockDim.x / FORGE_WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < num_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % FORGE_WARP;
    const int warp = threadIdx.x / FORGE_WARP;
    const int num_warps = blockDim.x / FORGE_WARP;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < num_warps ? scratch[lane] : neg_inf();
    return warp_max(v);
}

// Loads of VEC consecutive scalar_t (16 bytes) from a 16-byte aligned address, as floats.
#define FORGE_VEC (16 / (int)sizeof(scalar_t))

__device__ __forceinline__ void load_vec(const scalar_t* __restrict__ src, float* dst) {
    union {
        uint4 raw;
        scalar_t v[FORGE_VEC];
    } u;
    u.raw = *reinterpret_cast<const uint4*>(src);
#pragma unroll
    for (int i = 0; i < FORGE_VEC; ++i) dst[i] = to_float(u.v[i]);
}
