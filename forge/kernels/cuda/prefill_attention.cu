// Causal attention (optionally over a sliding window) for requests with more than one new
// token (prefill and chunked prefill) over a paged KV cache that already holds the request's whole context, new
// tokens included. A request's query_len new tokens are the last positions of its
// seq_len context: query token i sits at position seq_len - query_len + i and attends to
// positions 0 ..= that position (a cached prefix is simply the part before the first one).
//
// Grid: (ceil(max_query_len / TOKENS_PER_BLOCK), num_seqs, num_kv_heads); 128 threads.
// A block owns ROWS = 32 query rows: TOKENS_PER_BLOCK consecutive new tokens times the GQA
// query heads of one KV head (row r = token (r / GQA), head (r % GQA)); each warp owns 8
// rows. Keys stream through shared memory in tiles of 32, one key per lane for the scores,
// with an online (flash-attention) softmax; for p * V the lanes span head_dim.
// Requests with query_len <= 1 are left to paged_attention_decode.
#include "attention_common.cuh"

#define NUM_THREADS 128
#define NUM_WARPS (NUM_THREADS / FORGE_WARP)
#define ROWS_PER_WARP 8
#define ROWS (NUM_WARPS * ROWS_PER_WARP)
#define TOKENS_PER_BLOCK (ROWS / GQA)
#define BLOCK_N FORGE_WARP
#define K_STRIDE (HEAD_DIM + 1)  // odd row stride: lanes reading a column hit distinct banks

// Dynamic shared memory (floats), as the host computes it:
//   q [ROWS][HEAD_DIM] + k [BLOCK_N][HEAD_DIM + 1] + v [BLOCK_N][HEAD_DIM] + p [NUM_WARPS][BLOCK_N]

extern "C" __global__ void __launch_bounds__(NUM_THREADS) prefill_attention(
    scalar_t* __restrict__ out,              // [tokens, num_heads, HEAD_DIM] contiguous
    const scalar_t* __restrict__ query,      // [tokens, num_heads, HEAD_DIM], token stride q_stride
    const cache_t* __restrict__ k_cache,
    const cache_t* __restrict__ v_cache,
    const int* __restrict__ block_tables,    // [num_seqs, bt_stride]
    const int* __restrict__ seq_lens,        // [num_seqs]
    const int* __restrict__ query_start_loc, // [num_seqs + 1]
    long long q_stride,
    int num_kv_heads,
    int block_size,
    int bt_stride,
    float scale,
    int window)                              // > 0: query at p sees keys p - window + 1 ..= p
{
    const int seq = blockIdx.y;
    const int kv_head = blockIdx.z;
    const int q_begin = query_start_loc[seq];
    const int query_len = query_start_loc[seq + 1] - q_begin;
    if (query_len <= 1) return;
    const int tok0 = blockIdx.x * TOKENS_PER_BLOCK;
    if (tok0 >= query_len) return;
    const int ctx0 = seq_lens[seq] - query_len;  // position of new token 0
    const int num_heads = num_kv_heads * GQA;
    const int tid = threadIdx.x;
    const int lane = tid % FORGE_WARP;
    const int warp = tid / FORGE_WARP;
    const int* table = block_tables + (long long)seq * bt_stride;
    const int tokens_here = min(TOKENS_PER_BLOCK, query_len - tok0);
    const int num_rows = tokens_here * GQA;
    // Keys any row of this block needs: positions [kv_begin, kv_end), kv_begin tile-aligned.
    const int kv_end = ctx0 + tok0 + tokens_here;
    const int first_visible = window > 0 ? max(0, ctx0 + tok0 - window + 1) : 0;
    const int kv_begin = first_visible / BLOCK_N * BLOCK_N;

    extern __shared__ float smem[];
    float* q_s = smem;                         // [ROWS][HEAD_DIM]
    float* k_s = q_s + ROWS * HEAD_DIM;        // [BLOCK_N][K_STRIDE]
    float* v_s = k_s + BLOCK_N * K_STRIDE;     // [BLOCK_N][HEAD_DIM]
    float* p_s = v_s + BLOCK_N * HEAD_DIM;     // [NUM_WARPS][BLOCK_N]

    for (int i = tid; i < ROWS * HEAD_DIM; i += NUM_THREADS) {
        const int r = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        float v = 0.0f;
        if (r < num_rows) {
            const long long token = q_begin + tok0 + r / GQA;
            const int head = kv_head * GQA + r % GQA;
            v = to_float(query[token * q_stride + (long long)head * HEAD_DIM + d]) * scale;
        }
        q_s[i] = v;
    }

    // Running softmax state of this warp's rows; lane owns dims lane + 32 * j.
    float row_max[ROWS_PER_WARP];
    float row_sum[ROWS_PER_WARP];
    float acc[ROWS_PER_WARP][DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) {
        row_max[i] = neg_inf();
        row_sum[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < DIMS_PER_LANE; ++j) acc[i][j] = 0.0f;
    }

    for (int kt = kv_begin; kt < kv_end; kt += BLOCK_N) {
        __syncthreads();  // q_s is written (first tile) / the previous tile is consumed
        for (int i = tid; i < BLOCK_N * HEAD_DIM; i += NUM_THREADS) {
            const int j = i / HEAD_DIM;
            const int d = i % HEAD_DIM;
            const int pos = kt + j;
            float kv = 0.0f, vv = 0.0f;
            if (pos < kv_end) {
                const long long row = cache_offset(table, pos, block_size, num_kv_heads, kv_head);
#if FORGE_KV == 0
                kv = to_float(k_cache[row + d]);
                vv = to_float(v_cache[row + d]);
#else
                kv = kv_at(k_cache + row, d) * kv_scale(k_cache + row);
                vv = kv_at(v_cache + row, d) * kv_scale(v_cache + row);
#endif
            }
            k_s[j * K_STRIDE + d] = kv;
            v_s[j * HEAD_DIM + d] = vv;
        }
        __syncthreads();

#pragma unroll
        for (int i = 0; i < ROWS_PER_WARP; ++i) {
            const int r = warp * ROWS_PER_WARP + i;
            // Both conditions are uniform across the warp, so the shuffles below see all lanes.
            if (r >= num_rows) continue;
            const int q_pos = ctx0 + tok0 + r / GQA;
            if (kt > q_pos) continue;  // the whole tile is in this row's future
            const int q_lo = window > 0 ? q_pos - window + 1 : 0;  // first key this row sees
            if (kt + BLOCK_N <= q_lo) continue;  // the whole tile is before this row's window

            float s = 0.0f;
#pragma unroll 8
            for (int d = 0; d < HEAD_DIM; ++d) s += q_s[r * HEAD_DIM + d] * k_s[lane * K_STRIDE + d];
            if (kt + lane > q_pos || kt + lane < q_lo) s = neg_inf();
            // Key max(kt, q_lo) <= q_pos is visible, so the tile max and new_max are finite.
            const float new_max = fmaxf(row_max[i], warp_max(s));
            const float p = expf(s - new_max);
            const float alpha = expf(row_max[i] - new_max);  // 0 on the first tile
            row_sum[i] = row_sum[i] * alpha + warp_sum(p);
            row_max[i] = new_max;

            p_s[warp * BLOCK_N + lane] = p;
            __syncwarp();
#pragma unroll
            for (int j = 0; j < DIMS_PER_LANE; ++j) {
                const int d = lane + FORGE_WARP * j;
                if (d < HEAD_DIM) {
                    float a = acc[i][j] * alpha;
#pragma unroll 8
                    for (int n = 0; n < BLOCK_N; ++n) a += p_s[warp * BLOCK_N + n] * v_s[n * HEAD_DIM + d];
                    acc[i][j] = a;
                }
            }
            __syncwarp();  // p_s is rewritten for the next row
        }
    }

#pragma unroll
    for (int i = 0; i < ROWS_PER_WARP; ++i) {
        const int r = warp * ROWS_PER_WARP + i;
        if (r >= num_rows) continue;
        const long long token = q_begin + tok0 + r / GQA;
        const int head = kv_head * GQA + r % GQA;
        const float inv_sum = 1.0f / row_sum[i];
#pragma unroll
        for (int j = 0; j < DIMS_PER_LANE; ++j) {
            const int d = lane + FORGE_WARP * j;
            if (d < HEAD_DIM) out[(token * num_heads + head) * HEAD_DIM + d] = from_float(acc[i][j] * inv_sum);
        }
    }
}
