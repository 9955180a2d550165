// KV cache write by slot mapping (vLLM's reshape_and_cache).
//
// k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] contiguous, so the
// flat slot s = block * block_size + offset starts at element s * num_kv_heads * head_dim.
// key, value: [num_tokens, num_kv_heads, head_dim] whose rows may be strided (views into
// the fused QKV output) but whose inner [num_kv_heads, head_dim] is contiguous.
// Tokens with a negative slot are skipped: CUDA graph padding uses slot -1.
#include "kv_quant.cuh"

extern "C" __global__ void reshape_and_cache(
    const scalar_t* __restrict__ key,     // [num_tokens, row] with row stride key_stride
    const scalar_t* __restrict__ value,   // [num_tokens, row] with row stride value_stride
    scalar_t* __restrict__ k_cache,
    scalar_t* __restrict__ v_cache,
    const long long* __restrict__ slot_mapping,  // [num_tokens]
    long long key_stride,
    long long value_stride,
    int row)                              // num_kv_heads * head_dim
{
    const long long token = blockIdx.x;
    const long long slot = slot_mapping[token];
    if (slot < 0) return;
    const scalar_t* k_src = key + token * key_stride;
    const scalar_t* v_src = value + token * value_stride;
    scalar_t* k_dst = k_cache + slot * row;
    scalar_t* v_dst = v_cache + slot * row;
    for (int i = threadIdx.x; i < row; i += blockDim.x) {
        k_dst[i] = k_src[i];
        v_dst[i] = v_src[i];
    }
}

// The same write into a quantized cache (kv_quant.cuh): k_cache, v_cache are
// [num_blocks, block_size, num_kv_heads, head_dim + 4] bytes; slot s's row for KV head h starts at
// byte (s * num_kv_heads + h) * (head_dim + 4). Grid (num_tokens, num_kv_heads), one warp: lanes
// span head_dim, the row's amax is a warp max, lane 0 stores the scale.
extern "C" __global__ void reshape_and_cache_quant(
    const scalar_t* __restrict__ key,     // [num_tokens, num_kv_heads, head_dim], row stride key_stride
    const scalar_t* __restrict__ value,
    unsigned char* __restrict__ k_cache,
    unsigned char* __restrict__ v_cache,
    const long long* __restrict__ slot_mapping,
    long long key_stride,
    long long value_stride,
    int num_kv_heads,
    int head_dim)
{
    const long long token = blockIdx.x;
    const int head = blockIdx.y;
    const long long slot = slot_mapping[token];
    if (slot < 0) return;
    const long long row = head_dim + KV_SCALE_BYTES;
    const scalar_t* srcs[2] = {key + token * key_stride + (long long)head * head_dim,
                               value + token * value_stride + (long long)head * head_dim};
    unsigned char* dsts[2] = {k_cache + (slot * num_kv_heads + head) * row, v_cache + (slot * num_kv_heads + head) * row};
    for (int which = 0; which < 2; ++which) {
        const scalar_t* src = srcs[which];
        unsigned char* dst = dsts[which];
        float amax = 0.0f;
        for (int d = threadIdx.x; d < head_dim; d += FORGE_WARP) amax = fmaxf(amax, fabsf(to_float(src[d])));
        amax = warp_max(amax);
        const float scale = amax / KV_MAX;
        for (int d = threadIdx.x; d < head_dim; d += FORGE_WARP) {
            const float y = scale > 0.0f ? to_float(src[d]) / scale : 0.0f;
            dst[d] = kv_encode(fminf(fmaxf(y, -KV_MAX), KV_MAX));
        }
        if (threadIdx.x == 0) kv_store_scale(dst, head_dim, scale);
    }
}
