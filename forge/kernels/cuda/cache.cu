// KV cache write by slot mapping (vLLM's reshape_and_cache).
//
// k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim] contiguous, so the
// flat slot s = block * block_size + offset starts at element s * num_kv_heads * head_dim.
// key, value: [num_tokens, num_kv_heads, head_dim] whose rows may be strided (views into
// the fused QKV output) but whose inner [num_kv_heads, head_dim] is contiguous.
// Tokens with a negative slot are skipped: CUDA graph padding uses slot -1.
#include "common.cuh"

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
