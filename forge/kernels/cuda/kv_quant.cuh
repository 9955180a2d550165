// Quantized KV cache rows (forge/kernels/kv_quant.py), selected per build with -DFORGE_KV:
// 0 = the cache holds scalar_t (no quantization), 1 = int8, 2 = fp8 e4m3, 3 = fp8 e5m2.
//
// A quantized row (one token of one KV head) is head_dim one-byte values followed by the 4 bytes
// of its float32 scale (little-endian); a value reads as decode(byte) * scale. Writers quantize
// exactly as torch does in kv_quant.quantize: scale = amax|x| / KV_MAX, y = clamp(x / scale),
// int8 = rint(y), fp8 = y rounded to nearest-even (torch's float -> float8 conversion).
#pragma once

#include "common.cuh"

#ifndef FORGE_KV
#define FORGE_KV 0
#endif

#if FORGE_KV < 0 || FORGE_KV > 3
#error "FORGE_KV must be 0 (none), 1 (int8), 2 (fp8 e4m3) or 3 (fp8 e5m2)"
#endif

// The codec below: FORGE_KV's, and int8's in a FORGE_KV=0 build (where cache.cu's quantizing
// kernel is compiled but never launched: the CPU layer builds every kernel a source defines).
#define KV_CODEC (FORGE_KV == 0 ? 1 : FORGE_KV)

#if KV_CODEC == 1
#define KV_MAX 127.0f
#elif KV_CODEC == 2
#define KV_MAX 448.0f
#else
#define KV_MAX 57344.0f
#endif

#define KV_SCALE_BYTES 4

// One stored byte as the unscaled value it holds.
__device__ __forceinline__ float kv_decode(unsigned char b) {
#if KV_CODEC == 1
    return (float)(signed char)b;
#elif KV_CODEC == 2
    const unsigned int e = (b >> 3) & 0xfu, m = b & 7u;
    const float v = e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : (float)m * 0.001953125f;  // 2^-9
    return (b & 0x80u) ? -v : v;
#else
    const unsigned int e = (b >> 2) & 0x1fu, m = b & 3u;
    const float v = e ? __uint_as_float(((e + 112u) << 23) | (m << 21)) : (float)m * 1.52587890625e-05f;  // 2^-16
    return (b & 0x80u) ? -v : v;
#endif
}

// y (|y| <= KV_MAX) as the byte that stores it.
__device__ __forceinline__ unsigned char kv_encode(float y) {
#if KV_CODEC == 1
    return (unsigned char)(signed char)(int)rintf(y);
#else
    const unsigned int sign = (__float_as_uint(y) >> 24) & 0x80u;
    const float a = fabsf(y);
    unsigned int u = __float_as_uint(a);
    unsigned int out;
#if KV_CODEC == 2
    if (a < 0.015625f) {  // below e4m3's smallest normal 2^-6: multiples of 2^-9 (8 is 2^-6 itself)
        out = (unsigned int)rintf(a * 512.0f);
    } else {  // round the mantissa to 3 bits, nearest-even; a carry bumps the exponent
        u += 0x7ffffu + ((u >> 20) & 1u);
        out = (u >> 20) - (120u << 3);
    }
#else
    if (a < 6.103515625e-05f) {  // below e5m2's smallest normal 2^-14: multiples of 2^-16
        out = (unsigned int)rintf(a * 65536.0f);
    } else {
        u += 0xfffffu + ((u >> 21) & 1u);
        out = (u >> 21) - (112u << 2);
    }
#endif
    return (unsigned char)(sign | out);
#endif
}

// The float32 scale stored after a row's head_dim values.
__device__ __forceinline__ float kv_row_scale(const unsigned char* __restrict__ row, int head_dim) {
    const unsigned int bits = (unsigned int)row[head_dim] | ((unsigned int)row[head_dim + 1] << 8) |
                              ((unsigned int)row[head_dim + 2] << 16) | ((unsigned int)row[head_dim + 3] << 24);
    return __uint_as_float(bits);
}

__device__ __forceinline__ void kv_store_scale(unsigned char* __restrict__ row, int head_dim, float scale) {
    const unsigned int bits = __float_as_uint(scale);
#pragma unroll
    for (int i = 0; i < KV_SCALE_BYTES; ++i) row[head_dim + i] = (unsigned char)(bits >> (8 * i));
}
