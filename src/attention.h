/*
 * attention.h -- what the forward launcher (attention.c), the CPU reference
 * (reference.c) and the kernel template (templates/attention_fwd.cuh) agree
 * on: the kernel's argument block, its tile sizes and shared-memory size, and
 * the argument checks both entry points share.
 *
 * The template cannot include this header (NVRTC sees no files), so the
 * layout is written twice; the static assertions on both sides pin the size
 * and the field order is the same line for line.
 */
#ifndef FLEXGEN_ATTENTION_H
#define FLEXGEN_ATTENTION_H

#include "internal.h"

/* The first kernel argument (fga_args in the template). Strides in
 * elements for (b, h, s); the d stride is 1. */
typedef struct fgi_attn_abi {
    uint64_t q, k, v, out, lse;
    int64_t q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    uint64_t kv_num, kv_idx, full_num, full_idx;
    int32_t batch, heads_q, heads_kv, q_len, kv_len;
    int32_t q_offset, kv_offset;
    float scale, scale_log2;
    int32_t has_block_mask, bm_batch, bm_heads, bm_q_blocks, bm_kv_blocks, bm_q_block, bm_kv_block;
    int32_t q_tiles, pad_;
} fgi_attn_abi;
_Static_assert(sizeof(fgi_attn_abi) == 240, "fgi_attn_abi must match fga_args");

/* Tile sizes of the portable forward kernel, mirroring the template's
 * FGA_MT / FGA_BLOCK_M / FGA_BLOCK_N / FGA_THREADS: four warps of FGA_MT
 * 16-row slabs; two slabs for head dims up to 128 unless the kernel is
 * configured for q blocks under 128 rows; K/V tiles of 32 rows when the
 * accumulators are large, else 64. `q_block` is the kernel configuration's. */
#define FGI_ATTN_THREADS 128
static inline int fgi_attn_mt(int head_dim, int q_block) {
    return head_dim <= 128 && q_block >= 128 ? 2 : 1;
}
static inline int fgi_attn_block_m(int head_dim, int q_block) { return 64 * fgi_attn_mt(head_dim, q_block); }
static inline int fgi_attn_block_n(int head_dim, int q_block) {
    return head_dim > 128 || (fgi_attn_mt(head_dim, q_block) == 2 && head_dim > 64) ? 32 : 64;
}
/* Dynamic shared memory: the Q tile plus two stages of K and V, rows padded
 * by 8 elements. */
static inline size_t fgi_attn_smem_bytes(int head_dim, int q_block) {
    size_t row = (size_t)(head_dim + 8) * 2;
    return (size_t)fgi_attn_block_m(head_dim, q_block) * row +
           4 * (size_t)fgi_attn_block_n(head_dim, q_block) * row;
}

/* The effective scale: args->scale, or 1/sqrt(head_dim) when it is 0. */
float fgi_attn_scale(const fg_attention_args *args);

/* The checks that do not depend on where the tensors live: dtype, head
 * dim, sizes, GQA ratio, strides (last 1, none negative), offsets that keep
 * every index the mods see inside int, the scale. `strides` receives the
 * effective (b, h, s) strides of q, k, v, out (contiguous BHSD when all four
 * of a tensor's strides are zero). */
typedef struct fgi_attn_strides {
    int64_t q[3], k[3], v[3], o[3];
} fgi_attn_strides;
fg_status fgi_attn_check_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                              fgi_attn_strides *strides);

#endif
