// GGUF (ggml) block-quantized weights on the GPU: dequantization to scalar_t and fused
// dequant-GEMV for small batches (decode), so Q8_0 / Q4_K weights stay quantized in memory.
//
// A weight of logical shape [K = in_features, N = out_features] is stored as ggml does:
// N rows, each the K / block_len blocks of one output feature's K weights.
//   Q8_0 block (32 weights, 34 bytes):  fp16 d; int8 qs[32];            w = d * qs[i]
//   Q4_K super-block (256 weights, 144 bytes): fp16 d; fp16 dmin; u8 scales[12]; u8 qs[128]
//     eight sub-blocks of 32 with 6-bit scale sc and min m packed in scales[]; for chunk
//     c = 0..3 and l = 0..31, with q = qs[32 c + l]:
//       w[64 c + l]      = d * sc[2c]     * (q & 0xF) - dmin * m[2c]
//       w[64 c + 32 + l] = d * sc[2c + 1] * (q >> 4)  - dmin * m[2c + 1]
// Byte-wise loads throughout: Q8_0 blocks are only 2-byte aligned.
#include "common.cuh"

#define QK8_0 32
#define Q8_0_BYTES 34
#define QK_K 256
#define Q4_K_BYTES 144
#define GEMV_MAX_M 8
#define GEMV_WARPS 4

__device__ __forceinline__ float load_fp16(const unsigned char* p) {
    const unsigned short bits = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(bits));
}

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..7).
__device__ __forceinline__ void q4k_scale_min(const unsigned char* scales, int j, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(scales[j] & 63);
        *m = (float)(scales[j + 4] & 63);
    } else {
        *sc = (float)((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
        *m = (float)((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

__device__ __forceinline__ float q8_0_weight(const unsigned char* block, int i) {
    return load_fp16(block) * (float)(signed char)block[2 + i];
}

__device__ __forceinline__ float q4_k_weight(const unsigned char* block, int e) {
    const int chunk = e / 64;
    const int within = e % 64;
    const int high = within >= 32;
    const unsigned char q = block[16 + 32 * chunk + within % 32];
    float sc, m;
    q4k_scale_min(block + 4, 2 * chunk + high, &sc, &m);
    const float d = load_fp16(block) * sc;
    const float mn = load_fp16(block + 2) * m;
    return d * (float)(high ? q >> 4 : q & 0xF) - mn;
}

// out [N, K] (row-major, i.e. the transpose of the logical [K, N]) from total = N * K weights.
extern "C" __global__ void dequant_q8_0(scalar_t* __restrict__ out, const unsigned char* __restrict__ w,
                                        long long total)
{
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        out[idx] = from_float(q8_0_weight(w + (idx / QK8_0) * Q8_0_BYTES, (int)(idx % QK8_0)));
    }
}

extern "C" __global__ void dequant_q4_k(scalar_t* __restrict__ out, const unsigned char* __restrict__ w,
                                        long long total)
{
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        out[idx] = from_float(q4_k_weight(w + (idx / QK_K) * Q4_K_BYTES, (int)(idx % QK_K)));
    }
}

// y [M, N] = x [M, K] @ W for M <= GEMV_MAX_M. One warp per output feature n: it walks row n
// of W once and reuses every dequantized weight for all M rows of x; float32 accumulation.
// Grid: ceil(N / GEMV_WARPS) blocks of GEMV_WARPS * 32 threads.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * FORGE_WARP) gemv_q8_0(
    scalar_t* __restrict__ y,               // [M, N] contiguous
    const scalar_t* __restrict__ x,         // [M, K], row stride x_stride
    const unsigned char* __restrict__ w,    // [N, K / 32 blocks]
    int M, int N, int K, long long x_stride)
{
    const int lane = threadIdx.x % FORGE_WARP;
    const int n = blockIdx.x * GEMV_WARPS + threadIdx.x / FORGE_WARP;
    if (n >= N) return;  // whole warp
    const int blocks = K / QK8_0;
    const unsigned char* row = w + (long long)n * blocks * Q8_0_BYTES;
    // A half-warp per block: lane covers weights 2 * (lane % 16) and the next one.
    const int pair = 2 * (lane % 16);
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; ++m) acc[m] = 0.0f;
    for (int b = lane / 16; b < blocks; b += 2) {
        const unsigned char* block = row + (long long)b * Q8_0_BYTES;
        const float d = load_fp16(block);
        const float w0 = d * (float)(signed char)block[2 + pair];
        const float w1 = d * (float)(signed char)block[3 + pair];
        const int k = b * QK8_0 + pair;
#pragma unroll
        for (int m = 0; m < GEMV_MAX_M; ++m) {
            if (m < M) {
                const scalar_t* xr = x + m * x_stride;
                acc[m] += w0 * to_float(xr[k]) + w1 * to_float(xr[k + 1]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; ++m) {
        const float total = warp_sum(acc[m]);
        if (lane == 0 && m < M) y[(long long)m * N + n] = from_float(total);
    }
}

extern "C" __global__ void __launch_bounds__(GEMV_WARPS * FORGE_WARP) gemv_q4_k(
    scalar_t* __restrict__ y,               // [M, N] contiguous
    const scalar_t* __restrict__ x,         // [M, K], row stride x_stride
    const unsigned char* __restrict__ w,    // [N, K / 256 super-blocks]
    int M, int N, int K, long long x_stride)
{
    const int lane = threadIdx.x % FORGE_WARP;
    const int n = blockIdx.x * GEMV_WARPS + threadIdx.x / FORGE_WARP;
    if (n >= N) return;  // whole warp
    const int blocks = K / QK_K;
    const unsigned char* row = w + (long long)n * blocks * Q4_K_BYTES;
    float acc[GEMV_MAX_M];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; ++m) acc[m] = 0.0f;
    // The whole warp takes one super-block at a time; lane l covers weights
    // 64 c + l and 64 c + 32 + l of each chunk c (one byte of qs each).
    for (int b = 0; b < blocks; ++b) {
        const unsigned char* block = row + (long long)b * Q4_K_BYTES;
        const float d = load_fp16(block);
        const float dmin = load_fp16(block + 2);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            float sc_lo, m_lo, sc_hi, m_hi;
            q4k_scale_min(block + 4, 2 * c, &sc_lo, &m_lo);
            q4k_scale_min(block + 4, 2 * c + 1, &sc_hi, &m_hi);
            const unsigned char q = block[16 + 32 * c + lane];
            const float w_lo = d * sc_lo * (float)(q & 0xF) - dmin * m_lo;
            const float w_hi = d * sc_hi * (float)(q >> 4) - dmin * m_hi;
            const int k = b * QK_K + 64 * c + lane;
#pragma unroll
            for (int m = 0; m < GEMV_MAX_M; ++m) {
                if (m < M) {
                    const scalar_t* xr = x + m * x_stride;
                    acc[m] += w_lo * to_float(xr[k]) + w_hi * to_float(xr[k + 32]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_M; ++m) {
        const float total = warp_sum(acc[m]);
        if (lane == 0 && m < M) y[(long long)m * N + n] = from_float(total);
    }
}
