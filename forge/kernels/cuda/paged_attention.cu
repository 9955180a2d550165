// Decode attention over a paged KV cache (one query token per request), optionally over a
// sliding window of the last `window` keys, PagedAttention-V2 style: a request's context is
// cut into partitions of PARTITION_SIZE tokens, each handled
// by its own thread block; when there is more than one, paged_attention_reduce merges the
// partial results with the log-sum-exp rule.
//
// Grid of paged_attention_decode: (num_kv_heads, num_seqs, max_partitions), NUM_THREADS
// threads. One block serves the GQA query heads that share one KV head, so each K/V row is
// read once for all of them. Requests whose query_len is not 1 are left to the prefill
// kernel; partitions past a request's length exit at once. Grids are sized from a host
// upper bound on seq_len; exact lengths are read on the device (CUDA-graph safe).
//
// Per block:
//   1. q (pre-scaled) -> shared memory.
//   2. Each thread owns whole keys (t = tid, tid + NUM_THREADS, ...), loads the K row with
//      16-byte vector loads and writes GQA logits to shared memory.
//   3. Block max and sum of exp per query head; logits become exp(logit - max).
//   4. Each warp accumulates p * V over its share of the keys with lanes spanning head_dim;
//      the warps' partial sums are added through shared memory (reusing the logits space).
#include "attention_common.cuh"

#define PARTITION_SIZE 512
#define NUM_THREADS 128
#define NUM_WARPS (NUM_THREADS / FORGE_WARP)

// The decode query sits at position seq_len - 1; with a sliding window it sees the keys
// [seq_len - window, seq_len), and the partitions cover that range from its start.
__device__ __forceinline__ int context_start(int seq_len, int window) {
    return window > 0 && seq_len > window ? seq_len - window : 0;
}

static_assert(HEAD_DIM % FORGE_VEC == 0, "head_dim must be a multiple of 16 bytes / sizeof(dtype)");

// Dynamic shared memory (floats): q [GQA][HEAD_DIM], then a region used first for logits
// [GQA][PARTITION_SIZE] and then for warp partials [NUM_WARPS][GQA][HEAD_DIM].
// The host computes the same size: GQA * (HEAD_DIM + max(PARTITION_SIZE, NUM_WARPS * HEAD_DIM)).
#define SCORE_REGION \
    (PARTITION_SIZE > NUM_WARPS * HEAD_DIM ? PARTITION_SIZE : NUM_WARPS * HEAD_DIM)

extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_attention_decode(
    scalar_t* __restrict__ out,              // [tokens, num_heads, HEAD_DIM] contiguous
    float* __restrict__ exp_sums,            // [num_seqs, num_heads, max_partitions]
    float* __restrict__ max_logits,          // [num_seqs, num_heads, max_partitions]
    float* __restrict__ tmp_out,             // [num_seqs, num_heads, max_partitions, HEAD_DIM]
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
    int max_partitions,
    float scale,
    int window)                              // > 0: attend to the last `window` keys only
{
    const int kv_head = blockIdx.x;
    const int seq = blockIdx.y;
    const int part = blockIdx.z;
    const int q_row = query_start_loc[seq];
    if (query_start_loc[seq + 1] - q_row != 1) return;
    const int seq_len = seq_lens[seq];
    const int lo = context_start(seq_len, window);
    const int start = lo + part * PARTITION_SIZE;
    if (start >= seq_len) return;
    const int n = min(seq_len - start, PARTITION_SIZE);
    const int num_parts = (seq_len - lo + PARTITION_SIZE - 1) / PARTITION_SIZE;
    const int num_heads = num_kv_heads * GQA;
    const int tid = threadIdx.x;
    const int lane = tid % FORGE_WARP;
    const int warp = tid / FORGE_WARP;
    const int* table = block_tables + (long long)seq * bt_stride;

    extern __shared__ float smem[];
    float* q_s = smem;                 // [GQA][HEAD_DIM]
    float* logits = smem + GQA * HEAD_DIM;  // [GQA][PARTITION_SIZE]
    __shared__ float scratch[32];
    __shared__ float head_max[GQA];
    __shared__ float head_sum[GQA];

    // 1. Query heads kv_head * GQA .. kv_head * GQA + GQA - 1, pre-scaled.
    const scalar_t* q = query + q_row * q_stride + (long long)kv_head * GQA * HEAD_DIM;
    for (int i = tid; i < GQA * HEAD_DIM; i += NUM_THREADS) q_s[i] = to_float(q[i]) * scale;
    __syncthreads();

    // 2. Logits, one key per thread at a time.
    float thread_max[GQA];
#pragma unroll
    for (int g = 0; g < GQA; ++g) thread_max[g] = neg_inf();
    for (int t = tid; t < n; t += NUM_THREADS) {
        const cache_t* k = k_cache + cache_offset(table, start + t, block_size, num_kv_heads, kv_head);
        float dot[GQA];
#pragma unroll
        for (int g = 0; g < GQA; ++g) dot[g] = 0.0f;
#pragma unroll
        for (int d0 = 0; d0 < HEAD_DIM; d0 += FORGE_VEC) {
            float kv[FORGE_VEC];
#if FORGE_KV == 0
            load_vec(k + d0, kv);
#else  // byte rows are only 4-byte aligned (HEAD_DIM + 4 bytes long): plain loads
#pragma unroll
            for (int i = 0; i < FORGE_VEC; ++i) kv[i] = kv_at(k, d0 + i);
#endif
#pragma unroll
            for (int g = 0; g < GQA; ++g) {
#pragma unroll
                for (int i = 0; i < FORGE_VEC; ++i) dot[g] += q_s[g * HEAD_DIM + d0 + i] * kv[i];
            }
        }
#if FORGE_KV != 0
        const float k_scale = kv_scale(k);
#pragma unroll
        for (int g = 0; g < GQA; ++g) dot[g] *= k_scale;
#endif
#pragma unroll
        for (int g = 0; g < GQA; ++g) {
            logits[g * PARTITION_SIZE + t] = dot[g];
            thread_max[g] = fmaxf(thread_max[g], dot[g]);
        }
    }

    // 3. Softmax numerators. Each thread rewrites only the logits it wrote.
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
        const float m = block_max(thread_max[g], scratch);
        if (tid == 0) head_max[g] = m;
        float sum = 0.0f;
        for (int t = tid; t < n; t += NUM_THREADS) {
            const float e = expf(logits[g * PARTITION_SIZE + t] - m);
            logits[g * PARTITION_SIZE + t] = e;
            sum += e;
        }
        sum = block_sum(sum, scratch);
        if (tid == 0) head_sum[g] = sum;
    }
    __syncthreads();

    // 4. p * V: warp w takes keys w, w + NUM_WARPS, ...; lane owns dims lane + 32 * j.
    float acc[GQA][DIMS_PER_LANE];
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
#pragma unroll
        for (int j = 0; j < DIMS_PER_LANE; ++j) acc[g][j] = 0.0f;
    }
    for (int t = warp; t < n; t += NUM_WARPS) {
        const cache_t* v = v_cache + cache_offset(table, start + t, block_size, num_kv_heads, kv_head);
#if FORGE_KV != 0
        const float v_scale = kv_scale(v);
#endif
#pragma unroll
        for (int j = 0; j < DIMS_PER_LANE; ++j) {
            const int d = lane + FORGE_WARP * j;
            if (d < HEAD_DIM) {
#if FORGE_KV == 0
                const float vd = to_float(v[d]);
#else
                const float vd = kv_at(v, d) * v_scale;
#endif
#pragma unroll
                for (int g = 0; g < GQA; ++g) acc[g][j] += logits[g * PARTITION_SIZE + t] * vd;
            }
        }
    }
    __syncthreads();  // every warp is done reading logits; the region now holds partials
    float* partial = logits;  // [NUM_WARPS][GQA][HEAD_DIM]
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
#pragma unroll
        for (int j = 0; j < DIMS_PER_LANE; ++j) {
            const int d = lane + FORGE_WARP * j;
            if (d < HEAD_DIM) partial[(warp * GQA + g) * HEAD_DIM + d] = acc[g][j];
        }
    }
    __syncthreads();

    for (int i = tid; i < GQA * HEAD_DIM; i += NUM_THREADS) {
        const int g = i / HEAD_DIM;
        const int d = i % HEAD_DIM;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < NUM_WARPS; ++w) sum += partial[(w * GQA + g) * HEAD_DIM + d];
        const float value = sum / head_sum[g];
        const int head = kv_head * GQA + g;
        if (num_parts == 1) {
            out[((long long)q_row * num_heads + head) * HEAD_DIM + d] = from_float(value);
        } else {
            const long long idx = ((long long)seq * num_heads + head) * max_partitions + part;
            tmp_out[idx * HEAD_DIM + d] = value;
            if (d == 0) {
                max_logits[idx] = head_max[g];
                exp_sums[idx] = head_sum[g];
            }
        }
    }
}

// Merges the partitions of each (request, query head) with more than one partition.
// Grid (num_heads, num_seqs); dynamic shared memory: max_partitions floats.
// A request longer than max_partitions * PARTITION_SIZE (a host bound that was too small)
// gets NaN rather than a silently truncated context.
extern "C" __global__ void __launch_bounds__(NUM_THREADS) paged_attention_reduce(
    scalar_t* __restrict__ out,               // [tokens, num_heads, HEAD_DIM]
    const float* __restrict__ exp_sums,       // [num_seqs, num_heads, max_partitions]
    const float* __restrict__ max_logits,
    const float* __restrict__ tmp_out,        // [num_seqs, num_heads, max_partitions, HEAD_DIM]
    const int* __restrict__ seq_lens,
    const int* __restrict__ query_start_loc,
    int num_heads,
    int max_partitions,
    int window)
{
    const int head = blockIdx.x;
    const int seq = blockIdx.y;
    const int q_row = query_start_loc[seq];
    if (query_start_loc[seq + 1] - q_row != 1) return;
    const int seq_len = seq_lens[seq];
    const int num_parts = (seq_len - context_start(seq_len, window) + PARTITION_SIZE - 1) / PARTITION_SIZE;
    if (num_parts <= 1) return;  // paged_attention_decode wrote the output directly
    scalar_t* o = out + ((long long)q_row * num_heads + head) * HEAD_DIM;
    if (num_parts > max_partitions) {
        for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) o[d] = from_float(quiet_nan());
        return;
    }

    extern __shared__ float weights[];  // [max_partitions]
    __shared__ float scratch[32];
    const long long base = ((long long)seq * num_heads + head) * max_partitions;

    float m = neg_inf();
    for (int p = threadIdx.x; p < num_parts; p += blockDim.x) m = fmaxf(m, max_logits[base + p]);
    m = block_max(m, scratch);
    float total = 0.0f;
    for (int p = threadIdx.x; p < num_parts; p += blockDim.x) {
        const float w = exp_sums[base + p] * expf(max_logits[base + p] - m);
        weights[p] = w;
        total += w;
    }
    total = block_sum(total, scratch);
    __syncthreads();
    const float inv_total = 1.0f / total;
    for (int d = threadIdx.x; d < HEAD_DIM; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < num_parts; ++p) acc += weights[p] * tmp_out[(base + p) * HEAD_DIM + d];
        o[d] = from_float(acc * inv_total);
    }
}
