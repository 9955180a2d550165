// Greedy argmax per row, one thread block per row. Ties resolve to the lowest index and a
// NaN counts as larger than any number (the first NaN wins), as torch.argmax does.
#include "common.cuh"

__device__ __forceinline__ bool beats(float a, long long ia, float b, long long ib) {
    const bool a_nan = a != a;
    const bool b_nan = b != b;
    if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
    return a > b || (a == b && ia < ib);
}

extern "C" __global__ void argmax_rows(
    long long* __restrict__ out,          // [rows]
    const scalar_t* __restrict__ logits,  // [rows, vocab], row stride row_stride
    long long row_stride,
    int vocab)
{
    __shared__ float best_val[32];
    __shared__ long long best_idx[32];
    const long long row = blockIdx.x;
    const scalar_t* x = logits + row * row_stride;
    float val = neg_inf();
    long long idx = vocab;  // sentinel: loses every comparison against a real index
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = to_float(x[i]);
        if (idx == vocab || beats(v, i, val, idx)) {
            val = v;
            idx = i;
        }
    }
#pragma unroll
    for (int offset = FORGE_WARP / 2; offset > 0; offset >>= 1) {
        const float ov = __shfl_xor_sync(FORGE_FULL_MASK, val, offset);
        const long long oi = __shfl_xor_sync(FORGE_FULL_MASK, idx, offset);
        if (oi != vocab && (idx == vocab || beats(ov, oi, val, idx))) {
            val = ov;
            idx = oi;
        }
    }
    const int lane = threadIdx.x % FORGE_WARP;
    const int warp = threadIdx.x / FORGE_WARP;
    if (lane == 0) {
        best_val[warp] = val;
        best_idx[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int num_warps = blockDim.x / FORGE_WARP;
        for (int w = 1; w < num_warps; ++w) {
            if (best_idx[w] != vocab && (idx == vocab || beats(best_val[w], best_idx[w], val, idx))) {
                val = best_val[w];
                idx = best_idx[w];
            }
        }
        out[row] = idx;
    }
}
