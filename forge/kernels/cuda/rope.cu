// Rotary position embedding, rotate-half (NeoX) layout, as TorchBackend.rope:
//   out[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   out[i + half] = x[i + half] * cos[i] + x[i] * sin[i]      for i < half = head_dim / 2
// with cos = cos_sin[pos, :half], sin = cos_sin[pos, half:] (float32, rounded to scalar_t
// first because the reference casts them to the activation dtype).
// One thread block per token rotates all query and key heads into contiguous outputs.
// A position outside [0, max_pos) yields NaN rather than an out-of-bounds read.
#include "common.cuh"

extern "C" __global__ void rope_neox(
    scalar_t* __restrict__ q_out,           // [tokens, num_heads, head_dim]
    scalar_t* __restrict__ k_out,           // [tokens, num_kv_heads, head_dim]
    const scalar_t* __restrict__ query,     // [tokens, num_heads, head_dim], strides (q_stride, head_dim, 1)
    const scalar_t* __restrict__ key,       // [tokens, num_kv_heads, head_dim], strides (k_stride, head_dim, 1)
    const long long* __restrict__ positions,  // [tokens]
    const float* __restrict__ cos_sin,      // [max_pos, head_dim]
    long long q_stride,
    long long k_stride,
    int num_heads,
    int num_kv_heads,
    int head_dim,
    long long max_pos)
{
    const long long token = blockIdx.x;
    const long long pos = positions[token];
    const bool valid = pos >= 0 && pos < max_pos;
    const int half = head_dim / 2;
    const float* cs = cos_sin + (valid ? pos : 0) * head_dim;
    const int pairs = (num_heads + num_kv_heads) * half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        const int head = p / half;
        const int i = p % half;
        const scalar_t* src;
        scalar_t* dst;
        if (head < num_heads) {
            src = query + token * q_stride + head * head_dim;
            dst = q_out + (token * num_heads + head) * head_dim;
        } else {
            const int kh = head - num_heads;
            src = key + token * k_stride + kh * head_dim;
            dst = k_out + (token * num_kv_heads + kh) * head_dim;
        }
        const float c = round_to_scalar(cs[i]);
        const float s = round_to_scalar(cs[half + i]);
        const float x1 = to_float(src[i]);
        const float x2 = to_float(src[i + half]);
        dst[i] = from_float(valid ? x1 * c - x2 * s : quiet_nan());
        dst[i + half] = from_float(valid ? x2 * c + x1 * s : quiet_nan());
    }
}
