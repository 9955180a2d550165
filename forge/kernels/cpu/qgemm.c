/* Quantized matrix products for CPUs with AVX2 but without VNNI (forge/models/fast_weights.py).
 *
 * forge_int8_gemm: acc[m, n] = sum_k x[m, k] * w[n, k] for int8 x [M, K] and int8 w [N, K] (the
 *   weight stored [out, in]), every value in [-127, 127]. Exact int32 sums, so the result equals
 *   torch._int_mm(x, w.t()) bit for bit. AVX2 has no signed x signed byte product; the sign trick
 *   makes one: maddubs(|x|, sign(w, x)) multiplies unsigned |x| by w carrying x's sign, and a pair
 *   of such products is at most 2 * 127 * 127 < 2**15, so the int16 sums never saturate; madd with
 *   ones widens them to int32. With row_scale and col_scale given, it writes float32
 *   ((float)acc * row_scale[m]) * col_scale[n] instead (quant.c's forge_rescale_int_mm, fused).
 *
 * forge_int4_gemm: out[m, n] ~= sum_k x[m, k] * w[k, n] for float32 x and 4-bit weights in groups
 *   of 32 input channels, w = (q - 8) * s + z with q in 0..15 and s, z bfloat16 per group and
 *   output channel. Stored per output channel n: nib [N, K/2] (group g's bytes j = 0..15 hold
 *   q[32g + j] in the low nibble and q[32g + 16 + j] in the high one, llama.cpp's Q4_1 order) and
 *   sz [N, K/32, 2] (s, z as bfloat16 bits). The activations are quantized per row and group of 32
 *   to int16 (xq = round(x / d), d = max|x| / 32767: llama.cpp's Q8_1 with 16 bits, whose rounding
 *   error is below bfloat16's), so each group's dot product is d * (s * sum(xq * q) + (z - 8 s) *
 *   sum(xq)): the integer sums exact (madd_epi16 on int16 pairs), the rest float32.
 *
 * Both split the output columns evenly over OpenMP threads (torch's libgomp); the int8 product is
 * blocked so a block of weight rows stays in L2 while every activation row passes over it.
 * Without AVX2 (another -march) a scalar loop computes the same int8 sums and the same int4 terms.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#define INT4_GROUP 32
#define L2_BLOCK_BYTES 131072

/* The calling thread's share [begin, end) of n output columns, in multiples of align (inside a parallel
   region: split over its threads; outside, or without OpenMP: all of them). */
static void thread_columns(int64_t n, int64_t align, int64_t *begin, int64_t *end)
{
#ifdef _OPENMP
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
#else
    const int tid = 0, nth = 1;
#endif
    int64_t per = (n + nth - 1) / nth;
    per = (per + align - 1) / align * align;
    *begin = per * tid < n ? per * tid : n;
    *end = *begin + per < n ? *begin + per : n;
}

/* Threads for an m x n x k product: one below the size where a second thread pays for itself. */
static int gemm_threads(int64_t m, int64_t n, int64_t k, int num_threads)
{
    return m * n * k >= 65536 ? num_threads : 1;
}

/* ---------------------------------------------------------------- int8 x int8 -> int32 */

static inline void store_int8(int64_t m, int64_t n, int32_t s, int64_t ldo, void *out, const float *row_scale,
                              const float *col_scale)
{
    if (row_scale)
        ((float *)out)[m * ldo + n] = ((float)s * row_scale[m]) * col_scale[n];
    else
        ((int32_t *)out)[m * ldo + n] = s;
}

#if defined(__AVX2__)
static inline int32_t hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* MR activation rows x NR weight rows, over all of K. */
#define INT8_TILE(MR, NR)                                                                                         \
    static inline void int8_tile_##MR##x##NR(const int8_t *x, const int8_t *w, int64_t k, int64_t m0, int64_t n0, \
                                             int64_t ldo, void *out, const float *rs, const float *cs)           \
    {                                                                                                             \
        const __m256i ones = _mm256_set1_epi16(1);                                                                \
        __m256i acc[MR][NR];                                                                                      \
        for (int i = 0; i < MR; ++i)                                                                              \
            for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();                                      \
        int64_t kk = 0;                                                                                           \
        for (; kk + 32 <= k; kk += 32) {                                                                          \
            __m256i sx[MR], ax[MR];                                                                               \
            for (int i = 0; i < MR; ++i) {                                                                        \
                sx[i] = _mm256_loadu_si256((const __m256i *)(x + (m0 + i) * k + kk));                             \
                ax[i] = _mm256_abs_epi8(sx[i]);                                                                   \
            }                                                                                                     \
            for (int j = 0; j < NR; ++j) {                                                                        \
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + (n0 + j) * k + kk));                  \
                for (int i = 0; i < MR; ++i) {                                                                    \
                    const __m256i p = _mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(wv, sx[i]));                   \
                    acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(p, ones));                          \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int i = 0; i < MR; ++i)                                                                              \
            for (int j = 0; j < NR; ++j) {                                                                        \
                int32_t s = hsum_epi32(acc[i][j]);                                                                \
                const int8_t *xr = x + (m0 + i) * k, *wr = w + (n0 + j) * k;                                      \
                for (int64_t t = kk; t < k; ++t) s += (int32_t)xr[t] * (int32_t)wr[t];                            \
                store_int8(m0 + i, n0 + j, s, ldo, out, rs, cs);                                                  \
            }                                                                                                     \
    }
INT8_TILE(2, 4)
INT8_TILE(1, 4)
INT8_TILE(2, 1)
INT8_TILE(1, 1)
#endif

static void int8_columns(const int8_t *x, const int8_t *w, int64_t m, int64_t n_begin, int64_t n_end, int64_t k,
                         int64_t ldo, void *out, const float *rs, const float *cs)
{
#if defined(__AVX2__)
    int64_t block = L2_BLOCK_BYTES / (k > 0 ? k : 1);
    block = block < 4 ? 4 : block / 4 * 4;
    for (int64_t b0 = n_begin; b0 < n_end; b0 += block) {
        const int64_t b1 = b0 + block < n_end ? b0 + block : n_end;
        int64_t r = 0;
        for (; r + 2 <= m; r += 2) {
            int64_t c = b0;
            for (; c + 4 <= b1; c += 4) int8_tile_2x4(x, w, k, r, c, ldo, out, rs, cs);
            for (; c < b1; ++c) int8_tile_2x1(x, w, k, r, c, ldo, out, rs, cs);
        }
        for (; r < m; ++r) {
            int64_t c = b0;
            for (; c + 4 <= b1; c += 4) int8_tile_1x4(x, w, k, r, c, ldo, out, rs, cs);
            for (; c < b1; ++c) int8_tile_1x1(x, w, k, r, c, ldo, out, rs, cs);
        }
    }
#else
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = n_begin; c < n_end; ++c) {
            int32_t s = 0;
            for (int64_t t = 0; t < k; ++t) s += (int32_t)x[r * k + t] * (int32_t)w[c * k + t];
            store_int8(r, c, s, ldo, out, rs, cs);
        }
#endif
}

void forge_int8_gemm(const int8_t *x, const int8_t *w, const float *row_scale, const float *col_scale, void *out,
                     int64_t m, int64_t n, int64_t k, int num_threads)
{
    const int threads = gemm_threads(m, n, k, num_threads);
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        thread_columns(n, 4, &begin, &end);
        int8_columns(x, w, m, begin, end, k, n, out, row_scale, col_scale);
    }
}

/* ---------------------------------------------------------------- int4 groups x float32 */

static inline float bf16_to_float(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Row x's groups quantized: xq, the step d of each group and d * sum(xq). */
static void quantize_groups(const float *x, int64_t k, int16_t *xq, float *d, float *dsum)
{
    for (int64_t g = 0; g < k / INT4_GROUP; ++g) {
        const float *xg = x + g * INT4_GROUP;
        float top = 0.f;
        for (int t = 0; t < INT4_GROUP; ++t) top = fmaxf(top, fabsf(xg[t]));
        const float step = top / 32767.f, inv = top > 0.f ? 32767.f / top : 0.f;
        int sum = 0;
        for (int t = 0; t < INT4_GROUP; ++t) {
            const int v = (int)nearbyintf(xg[t] * inv);
            xq[g * INT4_GROUP + t] = (int16_t)(v > 32767 ? 32767 : v < -32767 ? -32767 : v);
            sum += xq[g * INT4_GROUP + t];
        }
        d[g] = step;
        dsum[g] = step * (float)sum;
    }
}

/* (z - 8 s) . dsum over the groups of one output channel: the zero points' share of its dot product. */
static inline float int4_zero_term(const uint16_t *sz, const float *dsum, int64_t groups)
{
    float t = 0.f;
    for (int64_t g = 0; g < groups; ++g) t += (bf16_to_float(sz[2 * g + 1]) - 8.f * bf16_to_float(sz[2 * g])) * dsum[g];
    return t;
}

#if defined(__AVX2__)
static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* MR activation rows x NR output channels. */
#define INT4_TILE(MR, NR)                                                                                         \
    static inline void int4_tile_##MR##x##NR(const int16_t *xq, const float *d, const float *dsum,                 \
                                             const uint8_t *nib, const uint16_t *sz, int64_t k, int64_t m0,       \
                                             int64_t n0, int64_t ldo, float *out)                                 \
    {                                                                                                             \
        const int64_t groups = k / INT4_GROUP;                                                                    \
        const __m128i low = _mm_set1_epi8(0x0f);                                                                  \
        __m256 acc[MR][NR];                                                                                       \
        for (int i = 0; i < MR; ++i)                                                                              \
            for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();                                         \
        for (int64_t g = 0; g < groups; ++g) {                                                                    \
            __m256i xlo[MR], xhi[MR];                                                                             \
            for (int i = 0; i < MR; ++i) {                                                                        \
                xlo[i] = _mm256_loadu_si256((const __m256i *)(xq + (m0 + i) * k + g * INT4_GROUP));               \
                xhi[i] = _mm256_loadu_si256((const __m256i *)(xq + (m0 + i) * k + g * INT4_GROUP + 16));          \
            }                                                                                                     \
            for (int j = 0; j < NR; ++j) {                                                                        \
                const int64_t c = n0 + j;                                                                         \
                const __m128i b = _mm_loadu_si128((const __m128i *)(nib + c * (k / 2) + g * 16));                 \
                const __m256i qlo = _mm256_cvtepu8_epi16(_mm_and_si128(b, low));                                  \
                const __m256i qhi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), low));               \
                const float s = bf16_to_float(sz[(c * groups + g) * 2]);                                          \
                for (int i = 0; i < MR; ++i) {                                                                    \
                    const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(qlo, xlo[i]), _mm256_madd_epi16(qhi, xhi[i])); \
                    const __m256 f = _mm256_set1_ps(s * d[(m0 + i) * groups + g]);                                \
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), f, acc[i][j]);                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        for (int i = 0; i < MR; ++i)                                                                              \
            for (int j = 0; j < NR; ++j)                                                                          \
                out[(m0 + i) * ldo + n0 + j] =                                                                    \
                    hsum_ps(acc[i][j]) +                                                                          \
                    int4_zero_term(sz + (n0 + j) * groups * 2, dsum + (m0 + i) * groups, groups);                 \
    }
INT4_TILE(4, 2)
INT4_TILE(4, 1)

/* The 8 int32 partial sums of one group's 32 products q * xq. */
static inline __m256i int4_group_dot(const uint8_t *nib, const int16_t *xq)
{
    const __m128i low = _mm_set1_epi8(0x0f), b = _mm_loadu_si128((const __m128i *)nib);
    const __m256i qlo = _mm256_cvtepu8_epi16(_mm_and_si128(b, low));
    const __m256i qhi = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(b, 4), low));
    return _mm256_add_epi32(_mm256_madd_epi16(qlo, _mm256_loadu_si256((const __m256i *)xq)),
                            _mm256_madd_epi16(qhi, _mm256_loadu_si256((const __m256i *)(xq + 16))));
}

/* One row by one output channel, eight groups at a time: their eight integer sums reduced into one
 * vector (lane g = group g), then scaled by eight (s, z) pairs read as one vector (bfloat16 s in the
 * low half of each 32-bit lane, z in the high half: both become float32 by masking). */
static inline float int4_dot(const int16_t *xq, const float *d, const float *dsum, const uint8_t *nib,
                             const uint16_t *sz, int64_t groups)
{
    __m256 acc = _mm256_setzero_ps();
    const __m256i high = _mm256_set1_epi32((int)0xffff0000u);
    const __m256 eight = _mm256_set1_ps(8.f);
    int64_t g = 0;
    for (; g + 8 <= groups; g += 8) {
        __m256i p[8];
        for (int t = 0; t < 8; ++t) p[t] = int4_group_dot(nib + (g + t) * 16, xq + (g + t) * INT4_GROUP);
        const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                                              _mm256_permute2x128_si256(u0, u1, 0x31));
        const __m256i v = _mm256_loadu_si256((const __m256i *)(sz + 2 * g));
        const __m256 s = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        const __m256 z = _mm256_castsi256_ps(_mm256_and_si256(v, high));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(s, _mm256_loadu_ps(d + g)), acc);
        acc = _mm256_fmadd_ps(_mm256_fnmadd_ps(eight, s, z), _mm256_loadu_ps(dsum + g), acc);
    }
    float tail = 0.f;
    for (; g < groups; ++g) {
        const float s = bf16_to_float(sz[2 * g]), z = bf16_to_float(sz[2 * g + 1]);
        tail += (float)hsum_epi32(int4_group_dot(nib + g * 16, xq + g * INT4_GROUP)) * (s * d[g]) + (z - 8.f * s) * dsum[g];
    }
    return hsum_ps(acc) + tail;
}
#endif

static void int4_columns(const int16_t *xq, const float *d, const float *dsum, const uint8_t *nib, const uint16_t *sz,
                         int64_t m, int64_t n_begin, int64_t n_end, int64_t k, int64_t ldo, float *out)
{
#if defined(__AVX2__)
    int64_t block = L2_BLOCK_BYTES / (k / 2 > 0 ? k / 2 : 1);
    block = block < 2 ? 2 : block / 2 * 2;
    for (int64_t b0 = n_begin; b0 < n_end; b0 += block) {
        const int64_t b1 = b0 + block < n_end ? b0 + block : n_end;
        int64_t r = 0;
        for (; r + 4 <= m; r += 4) {
            int64_t c = b0;
            for (; c + 2 <= b1; c += 2) int4_tile_4x2(xq, d, dsum, nib, sz, k, r, c, ldo, out);
            for (; c < b1; ++c) int4_tile_4x1(xq, d, dsum, nib, sz, k, r, c, ldo, out);
        }
        const int64_t groups = k / INT4_GROUP;
        for (int64_t c = b0; c < b1; ++c)
            for (int64_t i = r; i < m; ++i)
                out[i * ldo + c] = int4_dot(xq + i * k, d + i * groups, dsum + i * groups, nib + c * (k / 2),
                                            sz + c * groups * 2, groups);
    }
#else
    const int64_t groups = k / INT4_GROUP;
    for (int64_t r = 0; r < m; ++r)
        for (int64_t c = n_begin; c < n_end; ++c) {
            float total = int4_zero_term(sz + c * groups * 2, dsum + r * groups, groups);
            for (int64_t g = 0; g < groups; ++g) {
                int32_t s = 0;
                for (int t = 0; t < 16; ++t) {
                    const uint8_t b = nib[c * (k / 2) + g * 16 + t];
                    s += (b & 0x0f) * xq[r * k + g * INT4_GROUP + t] + (b >> 4) * xq[r * k + g * INT4_GROUP + 16 + t];
                }
                total += (float)s * (bf16_to_float(sz[(c * groups + g) * 2]) * d[r * groups + g]);
            }
            out[r * ldo + c] = total;
        }
#endif
}

/* Returns 0, or 1 when the activation buffers cannot be allocated. k must be a multiple of 32. */
int forge_int4_gemm(const float *x, const uint8_t *nib, const uint16_t *sz, float *out, int64_t m, int64_t n,
                    int64_t k, int num_threads)
{
    const int64_t groups = k / INT4_GROUP;
    int16_t *xq = malloc(sizeof(int16_t) * (size_t)(m * k));
    float *d = malloc(sizeof(float) * (size_t)(m * groups * 2 + 1));
    if (!xq || !d) {
        free(xq);
        free(d);
        return 1;
    }
    float *dsum = d + m * groups;
    for (int64_t r = 0; r < m; ++r) quantize_groups(x + r * k, k, xq + r * k, d + r * groups, dsum + r * groups);
    const int threads = gemm_threads(m, n, k, num_threads);
#pragma omp parallel num_threads(threads)
    {
        int64_t begin, end;
        thread_columns(n, 2, &begin, &end);
        int4_columns(xq, d, dsum, nib, sz, m, begin, end, k, n, out);
    }
    free(xq);
    free(d);
    return 0;
}
