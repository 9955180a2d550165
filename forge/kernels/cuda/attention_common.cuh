// Compile-time shape of the attention kernels and the paged-cache addressing they share.
//
// FORGE_HEAD_DIM (head_dim) and FORGE_GQA (query heads per KV head) are fixed per build, so
// per-thread accumulators live in registers; CuPy compiles one module per (dtype, head_dim,
// gqa) a model uses. The defaults below are for CI's compile check.
//
// Paged cache: k_cache, v_cache are [num_blocks, block_size, num_kv_heads, KV_ROW]
// contiguous (KV_ROW = HEAD_DIM, or HEAD_DIM + 4 for a quantized cache). Token `pos` of a request lives in block block_table[pos / block_size] at
// offset pos % block_size.
#pragma once

#include "kv_quant.cuh"

#ifndef FORGE_HEAD_DIM
#define FORGE_HEAD_DIM 128
#endif
#ifndef FORGE_GQA
#define FORGE_GQA 4
#endif

#define HEAD_DIM FORGE_HEAD_DIM
#define GQA FORGE_GQA
// Output dims each lane owns when a warp spans head_dim (lane, lane + 32, ...).
#define DIMS_PER_LANE ((HEAD_DIM + FORGE_WARP - 1) / FORGE_WARP)

static_assert(HEAD_DIM > 0 && HEAD_DIM <= 256, "head_dim must be in 1..256");
static_assert(GQA >= 1 && GQA <= 32, "query heads per KV head must be in 1..32");

// The cache's element type and row length: scalar_t rows of HEAD_DIM, or (FORGE_KV != 0)
// quantized rows of HEAD_DIM bytes and a float32 scale (kv_quant.cuh). kv_at is a row's value d
// before scaling, kv_scale the row's scale (1 for scalar_t rows, where callers skip it).
#if FORGE_KV == 0
typedef scalar_t cache_t;
#define KV_ROW HEAD_DIM
__device__ __forceinline__ float kv_at(const cache_t* __restrict__ row, int d) { return to_float(row[d]); }
#else
typedef unsigned char cache_t;
#define KV_ROW (HEAD_DIM + KV_SCALE_BYTES)
__device__ __forceinline__ float kv_at(const cache_t* __restrict__ row, int d) { return kv_decode(row[d]); }
__device__ __forceinline__ float kv_scale(const cache_t* __restrict__ row) { return kv_row_scale(row, HEAD_DIM); }
#endif

// Element offset of (token pos, kv_head, dim 0) in a cache layer.
__device__ __forceinline__ long long cache_offset(
    const int* __restrict__ block_table, int pos, int block_size, int num_kv_heads, int kv_head)
{
    const long long block = block_table[pos / block_size];
    const long long slot = block * block_size + pos % block_size;
    return (slot * num_kv_heads + kv_head) * KV_ROW;
}
