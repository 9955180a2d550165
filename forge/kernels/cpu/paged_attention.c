/* Paged decode attention on the CPU: one query token per request, K/V read in place
 * through the block table (no gathered copy of the context).
 *
 * Layouts (all contiguous):
 *   q, out        [num_seqs, num_heads, head_dim]                 float32
 *   k_cache/v_cache [num_blocks, block_size, num_kv_heads, row]    float32 or bfloat16 (row = head_dim),
 *                   or int8 / fp8 e4m3 / fp8 e5m2 bytes (row = head_dim + 4: the values, then the row's
 *                   float32 scale; forge/kernels/kv_quant.py): a value reads as decode(byte) * scale
 *   block_tables  [num_seqs, table_stride]                         int64
 *   seq_lens      [num_seqs]                                       int64 (>= 1)
 * Query head j attends with KV head j / (num_heads / num_kv_heads) (GQA). With window > 0 (sliding-
 * window attention) a request attends to its last min(window, seq_len) tokens only; 0 means all.
 *
 * Each K and V row a task needs is read once, for all the query heads that share it, block by
 * block in table order. Scores, softmax and the weighted sum are computed in float32 in a fixed
 * order, so a request's result does not depend on the other requests in the batch.
 * Block ids are trusted (the caller's tables index the cache).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float load_f32(const float *p, int64_t i) { return p[i]; }

static inline float load_i8(const int8_t *p, int64_t i) { return (float)p[i]; }

static inline float bits_to_float(uint32_t u)
{
    union { uint32_t u; float f; } c;
    c.u = u;
    return c.f;
}

/* fp8 e4m3 (bias 7, 3 mantissa bits, no infinities; forge never stores its NaN): exponent 0 is
 * subnormal, m * 2^-9. */
static inline float load_e4m3(const uint8_t *p, int64_t i)
{
    const uint32_t b = p[i], e = (b >> 3) & 0xf, m = b & 7;
    const float v = e ? bits_to_float(((e + 120) << 23) | (m << 20)) : (float)m * 0x1p-9f;
    return b & 0x80 ? -v : v;
}

/* fp8 e5m2 (bias 15, 2 mantissa bits; forge never stores inf/NaN): exponent 0 is m * 2^-16. */
static inline float load_e5m2(const uint8_t *p, int64_t i)
{
    const uint32_t b = p[i], e = (b >> 2) & 0x1f, m = b & 3;
    const float v = e ? bits_to_float(((e + 112) << 23) | (m << 21)) : (float)m * 0x1p-16f;
    return b & 0x80 ? -v : v;
}

/* The scale of a row: 1 for float rows (ROW_EXTRA 0), the float32 after the values otherwise. */
#define NO_SCALE(row, head_dim) 1.f
static inline float row_scale(const void *row, int64_t head_dim)
{
    float s;
    memcpy(&s, (const uint8_t *)row + head_dim, sizeof s);
    return s;
}
#define BYTE_SCALE(row, head_dim) row_scale(row, head_dim)

static inline float load_bf16(const uint16_t *p, int64_t i)
{
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)p[i] << 16;
    return c.f;
}

/* Attention of the query heads [h0, h1) of request s (a multiple of the group size) over its positions
 * [first, len) (all of them unless a window cuts the front off), reading each block's rows of those
 * heads in order. */
#define DEFINE_ATTEND(NAME, T, LOAD, ROW_EXTRA, SCALE)                                            \
    static int NAME(const float *q, const T *k_cache, const T *v_cache, const int64_t *table,      \
                    int64_t len, int64_t window, float *out, int64_t h0, int64_t h1,               \
                    int64_t num_kv_heads, int64_t group, int64_t head_dim, int64_t block_size,     \
                    float scale)                                                                   \
    {                                                                                              \
        const int64_t row_width = head_dim + (ROW_EXTRA);                                          \
        const int64_t token_stride = num_kv_heads * row_width;                                     \
        const int64_t block_stride = block_size * token_stride;                                    \
        const int64_t heads = h1 - h0;                                                             \
        if (len <= 0) {                                                                            \
            memset(out + h0 * head_dim, 0, sizeof(float) * (size_t)(heads * head_dim));            \
            return 0;                                                                              \
        }                                                                                          \
        const int64_t first = window > 0 && len > window ? len - window : 0;                       \
        const int64_t count = len - first;                                                         \
        float *scores = malloc(sizeof(float) * (size_t)(heads * count));                           \
        if (scores == NULL) return 1;                                                              \
        for (int64_t start = first - first % block_size; start < len; start += block_size) {       \
            const T *kb = k_cache + table[start / block_size] * block_stride;                      \
            if (start + block_size < len)                                                          \
                __builtin_prefetch(k_cache + table[start / block_size + 1] * block_stride);        \
            const int64_t n = len - start < block_size ? len - start : block_size;                 \
            for (int64_t i = start < first ? first - start : 0; i < n; ++i) {                      \
                for (int64_t hq = h0; hq < h1; ++hq) {                                             \
                    const T *k = kb + i * token_stride + (hq / group) * row_width;                 \
                    const float *qh = q + hq * head_dim;                                           \
                    float acc = 0.f;                                                               \
                    _Pragma("omp simd reduction(+ : acc)")                                         \
                    for (int64_t d = 0; d < head_dim; ++d) acc += qh[d] * LOAD(k, d);              \
                    scores[(hq - h0) * count + start + i - first] = acc * SCALE(k, head_dim) * scale; \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        for (int64_t hq = h0; hq < h1; ++hq) {                                                     \
            float *sh = scores + (hq - h0) * count;                                                \
            float top = sh[0];                                                                     \
            for (int64_t i = 1; i < count; ++i) top = sh[i] > top ? sh[i] : top;                   \
            float sum = 0.f;                                                                       \
            _Pragma("omp simd reduction(+ : sum)")                                                 \
            for (int64_t i = 0; i < count; ++i) {                                                  \
                sh[i] = expf(sh[i] - top);                                                         \
                sum += sh[i];                                                                      \
            }                                                                                      \
            const float inv = 1.f / sum;                                                           \
            for (int64_t i = 0; i < count; ++i) sh[i] *= inv;                                      \
            memset(out + hq * head_dim, 0, sizeof(float) * (size_t)head_dim);                      \
        }                                                                                          \
        for (int64_t start = first - first % block_size; start < len; start += block_size) {       \
            const T *vb = v_cache + table[start / block_size] * block_stride;                      \
            if (start + block_size < len)                                                          \
                __builtin_prefetch(v_cache + table[start / block_size + 1] * block_stride);        \
            const int64_t n = len - start < block_size ? len - start : block_size;                 \
            for (int64_t i = start < first ? first - start : 0; i < n; ++i) {                      \
                for (int64_t hq = h0; hq < h1; ++hq) {                                             \
                    const T *v = vb + i * token_stride + (hq / group) * row_width;                 \
                    const float p = scores[(hq - h0) * count + start + i - first] * SCALE(v, head_dim); \
                    float *oh = out + hq * head_dim;                                               \
                    _Pragma("omp simd")                                                            \
                    for (int64_t d = 0; d < head_dim; ++d) oh[d] += p * LOAD(v, d);                \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        free(scores);                                                                              \
        return 0;                                                                                  \
    }

/* Few requests: one task per (request, KV head) so every thread has work; many: one task per
 * request, which reads each block's rows whole and in order. Either way every query head's
 * result is computed by the same loop, so it does not depend on the batch. */
#define DEFINE_PAGED_DECODE_ATTENTION(NAME, ATTEND, T)                                             \
    int NAME(const float *q, const T *k_cache, const T *v_cache, const int64_t *block_tables,      \
             int64_t table_stride, const int64_t *seq_lens, float *out, int64_t num_seqs,          \
             int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t block_size,        \
             float scale, int64_t window, int num_threads)                                         \
    {                                                                                              \
        const int64_t group = num_heads / num_kv_heads;                                            \
        const int64_t split = num_seqs < 4 * (int64_t)num_threads ? num_kv_heads : 1;              \
        const int64_t per_task = num_heads / split;                                                \
        int failed = 0;                                                                            \
        _Pragma("omp parallel for schedule(dynamic, 1) num_threads(num_threads) reduction(| : failed)") \
        for (int64_t task = 0; task < num_seqs * split; ++task) {                                  \
            const int64_t s = task / split, h0 = (task % split) * per_task;                        \
            failed |= ATTEND(q + s * num_heads * head_dim, k_cache, v_cache,                       \
                             block_tables + s * table_stride, seq_lens[s], window,                 \
                             out + s * num_heads * head_dim, h0, h0 + per_task, num_kv_heads, group, \
                             head_dim, block_size, scale);                                         \
        }                                                                                          \
        return failed;                                                                             \
    }

DEFINE_ATTEND(attend_f32, float, load_f32, 0, NO_SCALE)
DEFINE_ATTEND(attend_bf16, uint16_t, load_bf16, 0, NO_SCALE)
DEFINE_ATTEND(attend_i8, int8_t, load_i8, 4, BYTE_SCALE)
DEFINE_ATTEND(attend_e4m3, uint8_t, load_e4m3, 4, BYTE_SCALE)
DEFINE_ATTEND(attend_e5m2, uint8_t, load_e5m2, 4, BYTE_SCALE)

DEFINE_PAGED_DECODE_ATTENTION(forge_paged_decode_attention_f32, attend_f32, float)
DEFINE_PAGED_DECODE_ATTENTION(forge_paged_decode_attention_bf16, attend_bf16, uint16_t)
DEFINE_PAGED_DECODE_ATTENTION(forge_paged_decode_attention_i8, attend_i8, int8_t)
DEFINE_PAGED_DECODE_ATTENTION(forge_paged_decode_attention_e4m3, attend_e4m3, uint8_t)
DEFINE_PAGED_DECODE_ATTENTION(forge_paged_decode_attention_e5m2, attend_e5m2, uint8_t)
