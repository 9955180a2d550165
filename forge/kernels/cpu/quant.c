/* Per-row int8 quantization of activations and the rescaling of an int8 GEMM's int32 result,
 * each in one pass. Bit-identical to the torch expressions they replace (forge/models/fast_weights.py):
 *   scale = max(max|x_row|, 1e-12) / 127;  q = round_half_even(x / scale)
 *   out = ((float)acc * row_scale) * col_scale
 * so this file is compiled without -ffast-math (true division, no reassociation).
 */
#include <math.h>
#include <stdint.h>

void forge_quantize_rows(const float *x, int8_t *q, float *scale, int64_t rows, int64_t cols, int num_threads)
{
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        int8_t *qr = q + r * cols;
        float top = 0.f;
        for (int64_t c = 0; c < cols; ++c) {
            const float a = fabsf(xr[c]);
            top = a > top ? a : top;
        }
        const float s = (top > 1e-12f ? top : 1e-12f) / 127.f;
        for (int64_t c = 0; c < cols; ++c) qr[c] = (int8_t)nearbyintf(xr[c] / s);
        scale[r] = s;
    }
}

void forge_rescale_int_mm(const int32_t *acc, const float *row_scale, const float *col_scale, float *out,
                          int64_t rows, int64_t cols, int num_threads)
{
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows * cols > 32768)
    for (int64_t r = 0; r < rows; ++r) {
        const int32_t *ar = acc + r * cols;
        float *outr = out + r * cols;
        const float rs = row_scale[r];
        for (int64_t c = 0; c < cols; ++c) outr[c] = ((float)ar[c] * rs) * col_scale[c];
    }
}
