// SiLU-and-mul: out = silu(gate) * up for gate_up = [gate | up] along the last dim.
// silu is rounded to scalar_t before the product, as torch computes F.silu(gate) * up.
#include "common.cuh"

extern "C" __global__ void silu_mul(
    scalar_t* __restrict__ out,            // [tokens, inter] contiguous
    const scalar_t* __restrict__ gate_up,  // [tokens, 2 * inter], row stride in_stride
    long long in_stride,
    int inter,
    long long total)                       // tokens * inter
{
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long token = idx / inter;
        const int i = (int)(idx % inter);
        const scalar_t* row = gate_up + token * in_stride;
        const float g = to_float(row[i]);
        const float u = to_float(row[inter + i]);
        const float silu = round_to_scalar(g / (1.0f + expf(-g)));
        out[idx] = from_float(silu * u);
    }
}
