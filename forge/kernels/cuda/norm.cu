// RMSNorm and fused residual-add + RMSNorm, one thread block per row.
//
// Matches TorchBackend: out = x * rsqrt(mean(x^2) + eps) * weight, and for the fused op
// residual_out = x + residual (rounded to scalar_t, as torch's add is) and
// out = rms_norm(residual_out). Sums are accumulated in float32.
// Rows of the inputs may be strided; their last dim is contiguous. Outputs are contiguous.
#include "common.cuh"

extern "C" __global__ void rms_norm(
    scalar_t* __restrict__ out,           // [rows, hidden]
    const scalar_t* __restrict__ x,       // [rows, hidden], row stride x_stride
    const scalar_t* __restrict__ weight,  // [hidden]
    long long x_stride,
    int hidden,
    float eps)
{
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const scalar_t* xr = x + row * x_stride;
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = to_float(xr[i]);
        sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float inv_rms = rsqrtf(sum_sq / (float)hidden + eps);
    scalar_t* o = out + row * (long long)hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        o[i] = from_float(to_float(xr[i]) * inv_rms * to_float(weight[i]));
    }
}

extern "C" __global__ void add_rms_norm(
    scalar_t* __restrict__ out,             // [rows, hidden]
    scalar_t* __restrict__ residual_out,    // [rows, hidden]
    const scalar_t* __restrict__ x,         // [rows, hidden], row stride x_stride
    const scalar_t* __restrict__ residual,  // [rows, hidden], row stride residual_stride
    const scalar_t* __restrict__ weight,    // [hidden]
    long long x_stride,
    long long residual_stride,
    int hidden,
    float eps)
{
    __shared__ float scratch[32];
    const long long row = blockIdx.x;
    const scalar_t* xr = x + row * x_stride;
    const scalar_t* rr = residual + row * residual_stride;
    scalar_t* ro = residual_out + row * (long long)hidden;
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float v = round_to_scalar(to_float(xr[i]) + to_float(rr[i]));
        ro[i] = from_float(v);
        sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float inv_rms = rsqrtf(sum_sq / (float)hidden + eps);
    scalar_t* o = out + row * (long long)hidden;
    // Each thread rereads only the residual_out elements it wrote itself: no barrier needed.
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        o[i] = from_float(to_float(ro[i]) * inv_rms * to_float(weight[i]));
    }
}
