/*
 * attention.h -- what the forward launcher (attention.c), the CPU reference
 * (reference.c) and the kernel template (templates/attention/attention_fwd.cuh) agree
 * on: the kernel's argument block, its tile sizes and shared-memory size, and
 * the argument checks both entry points share.
 *
 * The argument block is defined once, in abi.def, for this header and for
 * the template (see there how); both sides assert its size.
 */
#ifndef FLEXGEN_ATTENTION_H
#define FLEXGEN_ATTENTION_H

#include "internal.h"

/* The first kernel argument (fga_args in the template), row by row from
 * abi.def, which the template's copy is printed from as well. */
typedef uint64_t fgi_abi_u64;
typedef int64_t fgi_abi_i64;
typedef int32_t fgi_abi_i32;
typedef float fgi_abi_f32;
typedef struct fgi_attn_abi {
#define FGI_ABI_ROW(T, ...) fgi_abi_##T __VA_ARGS__;
#include "attention/abi.def"
} fgi_attn_abi;
_Static_assert(sizeof(fgi_attn_abi) == 240, "fgi_attn_abi must match fga_args");

/* The launch geometry of a forward kernel, mirroring its template.
 *
 * Portable (templates/attention/attention_fwd.cuh): four warps of `mt` 16-row slabs;
 * two slabs for head dims up to 128 unless the kernel is configured for q
 * blocks under 128 rows; K/V tiles of 32 rows over head dim 128, else 64;
 * shared memory is the Q tile plus two stages of K and V, rows padded by 8
 * elements, then two buffers of 16-byte mask column parts per K/V row.
 *
 * Hopper (templates/attention/attention_fwd_sm90.cuh): a producer warp group and two
 * consumer warp groups of 64 rows (a 128-row q tile), 128-row K/V tiles,
 * head dim 64 or 128; shared memory holds Q, two stages of K and three of V
 * in 128-byte-swizzled rows, 128 bytes of mbarriers, 8 KB of mask column
 * parts, and 1 KB so the kernel can align the base to the swizzle pattern. */
typedef struct fgi_attn_geom {
    int block_m, block_n, threads;
    size_t smem;
} fgi_attn_geom;

static inline fgi_attn_geom fgi_attn_geometry(fg_kernel_kind kind, int head_dim, int q_block) {
    fgi_attn_geom g;
    if (kind == FG_KERNEL_ATTENTION_FWD_SM90) {
        g.block_m = 128;
        g.block_n = 128;
        g.threads = 384;
        size_t tile = (size_t)128 * (size_t)head_dim * 2;
        g.smem = tile * (1 + 2 + 3) + 128 + 4 * 128 * 16 + 1024;
        return g;
    }
    int mt = head_dim <= 128 && q_block >= 128 ? 2 : 1;
    g.block_m = 64 * mt;
    g.block_n = head_dim > 128 ? 32 : 64;
    g.threads = 128;
    size_t row = (size_t)(head_dim + 8) * 2;
    g.smem = (size_t)g.block_m * row + 4 * (size_t)g.block_n * row + 2 * (size_t)g.block_n * 16;
    return g;
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
