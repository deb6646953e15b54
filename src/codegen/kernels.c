/*
 * kernels.c -- the registry of generated kernels (see kernels.h): the rows,
 * the configs the Hopper kernel takes, and the launch geometry of each
 * attention kernel, which mirrors its template.
 *
 * A new kernel joins here with one row. The portable backward, for example,
 * is one row (op FGI_KOP_ATTENTION_BWD, variant portable) whose templates are
 * attention/mma_sm80.cuh and attention/attention_bwd.cuh, whose pieces add
 * the score_mod derivative (FGI_PIECE_GRAD) to the mod, whose entries are
 * its five functions in one module, and whose geometry answers per entry
 * point; attention/backward.c loads it as a fg_kernel and launches the
 * entry points in order.
 */
#include "codegen/kernels.h"

#include <stdio.h>
#include <string.h>

/* ---- which configs the Hopper kernel takes ---------------------------------- */

/* What both Hopper rows take, on a config with its defaults filled in:
 * wgmma tiles of 64 rows per warp group, the head dims `dims` lists (0
 * ends it), code for sm_90a only. `what` names the row in messages,
 * `portable` the row that takes the rest. A NULL ctx records nothing. */
static fg_status sm90_common_check(fg_ctx *ctx, const fg_kernel_config *c, const char *what,
                                   const char *portable, const int *dims) {
    int ok = 0, n = 0;
    for (const int *d = dims; *d; d++, n++) ok |= c->head_dim == *d;
    if (!ok) {
        char list[64] = "";
        for (int i = 0; i < n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d",
                     i == 0 ? "" : i == n - 1 ? " and " : ", ", dims[i]);
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: the Hopper %s supports %s (the portable %s, %s, takes every "
                         "multiple of 16 to 256)",
                         c->head_dim, what, list, what, portable);
    }
    if (c->arch && strcmp(c->arch, "sm_90a") != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "arch %s: the Hopper %s compiles only for sm_90a", c->arch,
                         what);
    return FG_OK;
}

/* The Hopper forward: head dims of whole 64-column swizzle regions (96
 * padded to two); q and kv blocks of 128 or more; K/V through tensor maps
 * of one length, so no ragged form. */
static fg_status sm90_check(fg_ctx *ctx, const fg_kernel_config *c) {
    static const int dims[] = {64, 96, 128, 192, 256, 0};
    FGI_TRY(sm90_common_check(ctx, c, "kernel", "FG_KERNEL_ATTENTION_FWD", dims));
    if (c->ragged)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "the Hopper kernel reads contiguous K/V of one length: its ragged form (kv_lens, "
                         "q_offsets, a block table) is the portable FG_KERNEL_ATTENTION_FWD's");
    if (c->q_block < 128 || c->kv_block < 128)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "blocks %d x %d: the Hopper kernel needs q and kv blocks of at least 128",
                         c->q_block, c->kv_block);
    return FG_OK;
}

/* The Hopper backward: its dK/dV pass covers 128 kv rows, so a block
 * mask's kv blocks must be multiples of 128; the launch checks that, since
 * the backward's config does not carry the blocks. */
static fg_status sm90_bwd_check(fg_ctx *ctx, const fg_kernel_config *c) {
    static const int dims[] = {64, 128, 0};
    return sm90_common_check(ctx, c, "backward", "FG_KERNEL_ATTENTION_BWD", dims);
}

/* The decode kernel: head dims 64, 128 and 256. Its shared rows swizzle
 * their 16-byte chunks by row & 7 (fgd_at), a permutation of a row's
 * chunks only where a row holds 8 or more (head dim 64 and up): at 16 and
 * 32 rows would overlap. A call of those head dims takes the forward
 * kernel (fgi_attn_forward_kernel_config). KV heads in pairs at head dim
 * 64 (the walk of head dim 128 over a pair's rows). */
static fg_status decode_check(fg_ctx *ctx, const fg_kernel_config *c) {
    if (c->head_pairs == 1 && c->head_dim != 64)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: the decode kernel walks KV heads in pairs (head_pairs) at head dim 64 only",
                         c->head_dim);
    if (c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: the decode kernel supports 64, 128 and 256 (a call of another head dim "
                         "takes the forward kernel)",
                         c->head_dim);
    return FG_OK;
}

/* ---- launch geometry ----------------------------------------------------------- */

/* The portable forward (templates/attention/attention_fwd.cuh): four warps
 * of `mt` 16-row slabs; two slabs for head dims up to 128 unless the kernel
 * is configured for q blocks under 128 rows; K/V tiles of 32 rows over head
 * dim 128, else 64; shared memory is the Q tile plus two stages of K and V,
 * rows padded by 8 elements, then two buffers of 16-byte mask column parts
 * per K/V row. */
static fgi_kernel_geom fwd_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)mod, (void)entry;
    const int mt = c->head_dim <= 128 && c->q_block >= 128 ? 2 : 1;
    /* the fields not named are 0 (no q_align, not persistent, no o_map) */
    fgi_kernel_geom g = {.block_m = 64 * mt, .block_n = c->head_dim > 128 ? 32 : 64, .threads = 128, .bands = 1};
    size_t row = (size_t)(c->head_dim + 8) * 2;
    g.smem = (size_t)g.block_m * row + 4 * (size_t)g.block_n * row + 2 * (size_t)g.block_n * 16;
    return g;
}

bool fgi_fwd_dense_applies(const fg_kernel_config *c, const fg_mod *mod) {
    return c->dense && c->head_dim == 128 && mod && !mod->mask;
}

/* The Hopper forward (templates/attention/attention_fwd_sm90.cuh): a
 * producer warp group and consumer warp groups of 64 rows, three at head
 * dim 64 (a 192-row q tile, whose walk merges two block-mask rows) unless
 * score_mod does costly work per score (FGH_CONSUMERS), else two; K/V
 * tiles of 128 rows, 64 past head dim 128, 176 in the -dense form where
 * fgi_fwd_dense_applies (FGH_BLOCK_N); shared memory
 * holds Q, two stages of K and three of V (three and four at head dim 64,
 * two and two at 256 and in the -dense form) in 128-byte-swizzled rows of whole 64-column
 * regions (FGH_DS: 96 is stored as 128), 256 bytes of mbarriers, two
 * buffers of mask column parts per consumer, the merged walk's block
 * states and two lists, and 1 KB so the kernel can align the base to the
 * swizzle pattern. Persistent: a block per SM walks the tiles. */

static fgi_kernel_geom fwd_sm90_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)entry;
    const int consumers = c->head_dim == 64 && !fgi_split_score_elem_costly(mod) ? 3 : 2;
    /* (three V stages of 44 KB would not fit beside Q and two K stages) */
    const bool wide = fgi_fwd_dense_applies(c, mod);
    fgi_kernel_geom g = {.block_m = 64 * consumers,
                         .block_n = c->head_dim > 128 ? 64 : wide ? FGI_FWD_DENSE_BLOCK_N : 128,
                         .threads = 128 * (1 + consumers), .bands = 1, .persistent = 1};
    if (g.block_m % 128) g.q_align = g.q_box = 64; /* FGH_MERGE, FGH_Q_BOX */
    const size_t stored = (size_t)(c->head_dim + 63) / 64 * 64;
    const size_t tile = (size_t)g.block_n * stored * 2, q = (size_t)g.block_m * stored * 2;
    const size_t stages = c->head_dim == 64 ? 3 + 4 : c->head_dim == 256 || wide ? 2 + 2 : 2 + 3;
    const size_t merge = g.q_align ? 10 * (size_t)FGI_FWD_SM90_MERGE_MAX_KB : 0;
    /* O leaves by TMA at two consumers (over Q's rows) and, at three, for
     * mods with a mask_mod (through a buffer laid out as Q: FGH_O_BUF) */
    g.o_map = consumers == 2 || (mod && mod->mask);
    const size_t o_buf = consumers == 3 && g.o_map ? q : 0;
    g.smem = q + tile * stages + o_buf + 256 + 2 * (size_t)consumers * 128 * 16 + merge + 1024;
    return g;
}

/* ALiBi's distance (float)(kv_idx - q_idx) as a column part less a row
 * part at head dim 128 only: the forward there +3.1%; at 64 the per-score
 * work it leaves no longer counts as costly, the kernel takes three
 * consumers and lost 1.5% (attention_notes v42). */
static unsigned fwd_sm90_split_flags(const fg_kernel_config *c) {
    if (c->head_dim == 128) return FGI_SPLIT_INDEX_FLOATS;
    /* The float distance where it paid, ALiBi's forward time: -4.2% at head
     * dim 64, -1.3% at 192; +2.4% at 128, +1.6% at 96, +2.4% at 256
     * (attention_notes f12). Not in the ragged form, whose positions the
     * host does not see to check (forward.c's launch checks the distances). */
    return c->ragged || (c->head_dim != 64 && c->head_dim != 192) ? 0 : FGI_SPLIT_DIST_FLOATS;
}

/* The portable backward (templates/attention/attention_bwd.cuh), four warps
 * per block for every entry point. Its rows are padded by 8 elements.
 *   pre, dq: a warp per query row, no shared memory;
 *   dkdv: eight warps and 128 kv rows to head dim 128, four and 64 over
 *     it (K, V kept), dR^T ([kv][q], rows of FGB_BLOCK_M + 8), then two
 *     stages of the q steps' Q and dO (FGB_BLOCK_M rows: 64 to head dim 64,
 *     else 32) and of their lse and delta;
 *   dq_tiles: 64 q rows (Q, dO kept) against kv steps of 64 rows (32 over
 *     head dim 128) of K and V;
 *   fixed_to_float: a thread per gradient element. */
static fgi_kernel_geom bwd_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)mod;
    /* bands: head dims past 128 split dK, dV and dQ's columns over two
     * thread blocks (FGB_DSPLIT). */
    fgi_kernel_geom g = {.threads = 128, .bands = c->head_dim > 128 ? 2 : 1};
    const size_t row = (size_t)(c->head_dim + 8) * 2;
    if (entry == FGI_BWD_DKDV) {
        g.threads = c->head_dim > 128 ? 128 : 256;
        g.block_n = g.threads / 2; /* 16 kv rows a warp */
        g.block_m = c->head_dim > 64 ? 32 : 64;
        g.smem = (size_t)(2 * g.block_n + 2 * 2 * g.block_m) * row + (size_t)g.block_n * (g.block_m + 8) * 2 +
                 2 * 2 * (size_t)g.block_m * 4;
    } else if (entry == FGI_BWD_PRE || entry == FGI_BWD_DQ) {
        g.block_m = 64; /* query rows per thread block: FGB_ROW_BLOCK */
    } else if (entry == FGI_BWD_DQ_TILES) {
        g.block_m = 64;
        g.block_n = c->head_dim > 128 ? 32 : 64;
        g.smem = (size_t)(2 * g.block_m + 2 * g.block_n) * row;
    }
    return g;
}

/* The Hopper backward (templates/attention/attention_bwd_sm90.cuh): its
 * dK/dV pass is a producer warp group and two consumer warp groups over 128
 * kv rows, q steps of 64 rows (128 at head dim 64); shared memory holds K
 * and V (128 rows), two stages of Q and dO (a q step's rows), two dR^T
 * buffers (128 kv rows by a q step's columns, bf16), two 16 KB dQ tiles,
 * two stages of lse2 and delta, two buffers of a q step's mask row parts
 * (16 bytes each) per consumer, 128 bytes of mbarriers and the posted dQ
 * tile numbers, and 1 KB to align the base to the swizzle's period.
 * The other entry points are the portable backward's. */
static fgi_kernel_geom bwd_sm90_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    if (entry != FGI_BWD_DKDV) return bwd_geometry(c, mod, entry);
    /* q steps of 128 rows at head dim 64 (FGS_WIDE_Q), else 64 */
    const size_t bm = c->head_dim == 64 ? 128 : 64;
    const size_t kv_tile = (size_t)128 * (size_t)c->head_dim * 2, q_tile = bm * (size_t)c->head_dim * 2;
    fgi_kernel_geom g = {.block_m = (int)bm, .block_n = 128, .threads = 384, .bands = 1};
    g.smem = 2 * kv_tile + 2 * 2 * q_tile + 2 * 128 * bm * 2 + 2 * 64 * 64 * 4 + 2 * 2 * bm * 4 + 2 * 2 * bm * 16 + 128 +
             1024;
    return g;
}

/* Shared memory that lets two blocks onto an SM and never three: SMs of
 * 164 KB (sm_80) and 228 KB (sm_90, sm_100); 100 KB SMs hold one. */
#define FGI_DEC_TWO_A_SM_SMEM (80 * 1024)

/* The decode kernel (templates/attention/attention_decode.cuh): four
 * warps; tiles of 16, 32 or 64 packed rows (entry points r16, r32, r64)
 * against K/V tiles of fgi_dec_block_n rows in FGD_STAGES stages (walk
 * rows of up to 64 columns: five of 64 rows or two of 128; up to 128:
 * three of 64 rows, or with 128-row tiles three slots of K or V, the
 * ring; else 2) of K and V rows (unpadded, swizzled; fgi_dec_walk_dim wide);
 * walk rows over 128 keep Q in a shared region of 64 rows; then the warps'
 * row maxima and sums and the rows' LSEs for their merge. The merge entry
 * has static shared memory only. */
static fgi_kernel_geom decode_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)mod;
    fgi_kernel_geom g = {.block_m = 16, .block_n = fgi_dec_block_n(c), .threads = 128, .bands = 1};
    if (entry == FGI_DEC_MERGE) return g;
    g.block_m = fgi_dec_tile_rows(entry);
    const int w = fgi_dec_walk_dim(c);
    const size_t row = (size_t)w * 2;
    const int stages = w <= 64 ? (g.block_n == 64 ? 5 : 2) : w <= 128 ? 3 : 2;
    const bool ring = w > 64 && w <= 128 && g.block_n == 128; /* FGD_KV_RING */
    /* The -pairs walk of 32 rows over 128-row tiles: eight warps, so that a
     * warp takes the one-head walk's share of a tile (16 rows x 32 keys of
     * one head's 64 columns); four elsewhere (the template reads it). */
    if (c->head_pairs && g.block_n == 128 && g.block_m == 32) g.threads = 256;
    const size_t merge = (size_t)(g.threads / 32) * 256; /* the warps' m and l, the rows' LSEs: FGD_SMEM_BYTES */
    /* Q's region past the stages: 64 rows over 128 columns; the tile's
     * rows for eight warps (FGD_Q_REGS) */
    const size_t q = w > 128 ? 64 * row : g.threads > 128 ? (size_t)g.block_m * row : 0;
    g.smem = (size_t)(ring ? 3 : stages * 2) * (size_t)g.block_n * row + q + merge;
    /* The two stages of 128-row tiles at walk rows of 64 (64 KB) leave
     * room for a third block on an SM, where choose_split counts two;
     * with it softcap B=8 lost 13% (decode d40), most likely its split
     * walks' clusters packed onto fewer SMs. Asking for over a third of
     * an SM's shared memory keeps it at two. */
    if (w <= 64 && g.block_n == 128 && g.smem < FGI_DEC_TWO_A_SM_SMEM) g.smem = FGI_DEC_TWO_A_SM_SMEM;
    return g;
}

/* The merge (templates/attention/attention_merge.cuh): a thread per output
 * element, no shared memory. */
static fgi_kernel_geom merge_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)c, (void)mod, (void)entry;
    return (fgi_kernel_geom){.block_m = 1, .block_n = 1, .threads = 128, .smem = 0, .bands = 1};
}

/* The partial sums (templates/parallel/partial_sum.cuh, FGS_THREADS): a
 * thread per two adjacent elements, no shared memory. */
static fgi_kernel_geom sum_geometry(const fg_kernel_config *c, const fg_mod *mod, int entry) {
    (void)c, (void)mod, (void)entry;
    return (fgi_kernel_geom){.block_m = 1, .block_n = 1, .threads = 256, .smem = 0, .bands = 1};
}

/* ---- the rows ------------------------------------------------------------------- */

#define ATTENTION_CONFIG (FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_BLOCKS)

static const fgi_kernel_entry registry[] = {
    {
        .kind = FG_KERNEL_ATTENTION_FWD,
        .op = FGI_KOP_ATTENTION_FWD,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "attention_fwd",
        .macro = "FG_KERNEL_ATTENTION_FWD",
        .what = "forward attention (portable, mma.sync)",
        .templates = {"attention/attention_common.cuh", "attention/mma_sm80.cuh", "attention/attention_fwd.cuh"},
        .pieces = FGI_PIECE_MOD | FGI_PIECE_SPLIT,
        /* the template sizes its q tile from FG_Q_BLOCK */
        .source_config = ATTENTION_CONFIG | FGI_CFG_RAGGED | FGI_CFG_APPROX,
        .name_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_RAGGED | FGI_CFG_APPROX,
        .entries = {"fg_attention_fwd"},
        .min_cc = 80,
        .geometry = fwd_geometry,
    },
    {
        .kind = FG_KERNEL_BLOCK_MASK,
        .op = FGI_KOP_BLOCK_MASK,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "blockmask",
        .macro = "FG_KERNEL_BLOCK_MASK",
        .what = "block-mask builder (fg_block_mask_classify, fg_block_mask_compact)",
        .templates = {"blockmask/blockmask.cuh"},
        .pieces = FGI_PIECE_MOD,
        .source_config = FGI_CFG_BLOCKS,
        .name_config = FGI_CFG_BLOCKS,
        .entries = {"fg_block_mask_classify", "fg_block_mask_compact"},
        .min_cc = 80,
    },
    {
        .kind = FG_KERNEL_ATTENTION_FWD_SM90,
        .op = FGI_KOP_ATTENTION_FWD,
        .variant = FGI_VARIANT_SM90,
        .label = "attention_fwd_sm90",
        .macro = "FG_KERNEL_ATTENTION_FWD_SM90",
        .what = "forward attention (Hopper, wgmma)",
        .templates = {"attention/attention_common.cuh", "attention/wgmma_sm90.cuh", "attention/attention_fwd_sm90.cuh"},
        .pieces = FGI_PIECE_MOD | FGI_PIECE_SPLIT,
        .source_config = ATTENTION_CONFIG | FGI_CFG_APPROX | FGI_CFG_DENSE,
        .name_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX | FGI_CFG_DENSE,
        .entries = {"fg_attention_fwd"},
        .arch = "sm_90a",
        .min_cc = 90,
        .check = sm90_check,
        .geometry = fwd_sm90_geometry,
        .split_flags = fwd_sm90_split_flags,
    },
    {
        .kind = FG_KERNEL_ATTENTION_BWD,
        .op = FGI_KOP_ATTENTION_BWD,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "attention_bwd",
        .macro = "FG_KERNEL_ATTENTION_BWD",
        .what = "backward attention (portable, mma.sync)",
        .templates = {"attention/mma_sm80.cuh", "attention/attention_bwd.cuh"},
        .pieces = FGI_PIECE_MOD | FGI_PIECE_GRAD,
        /* the tiles follow the head dim; block sizes are read at run time */
        .source_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX,
        .name_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX,
        .entries = {"fg_attention_bwd_pre", "fg_attention_bwd_dkdv", "fg_attention_bwd_dq",
                    "fg_attention_bwd_dq_tiles", "fg_attention_bwd_fixed_to_float"},
        .min_cc = 80,
        .geometry = bwd_geometry,
    },
    {
        .kind = FG_KERNEL_ATTENTION_BWD_SM90,
        .op = FGI_KOP_ATTENTION_BWD,
        .variant = FGI_VARIANT_SM90,
        .label = "attention_bwd_sm90",
        .macro = "FG_KERNEL_ATTENTION_BWD_SM90",
        .what = "backward attention (Hopper, wgmma)",
        /* attention_bwd.cuh's entry points, its dK/dV pass replaced */
        .templates = {"attention/mma_sm80.cuh", "attention/attention_bwd.cuh", "attention/wgmma_sm90.cuh",
                      "attention/attention_bwd_sm90.cuh"},
        .pieces = FGI_PIECE_MOD | FGI_PIECE_GRAD | FGI_PIECE_SPLIT,
        .source_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX | FGI_CFG_ORDER | FGI_CFG_PAIRS,
        .name_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX | FGI_CFG_ORDER | FGI_CFG_PAIRS,
        .entries = {"fg_attention_bwd_pre", "fg_attention_bwd_dkdv", "fg_attention_bwd_dq",
                    "fg_attention_bwd_dq_tiles", "fg_attention_bwd_fixed_to_float"},
        .arch = "sm_90a",
        .min_cc = 90,
        .check = sm90_bwd_check,
        .geometry = bwd_sm90_geometry,
    },
    {
        .kind = FG_KERNEL_ATTENTION_DECODE,
        .op = FGI_KOP_ATTENTION_DECODE,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "attention_decode",
        .macro = "FG_KERNEL_ATTENTION_DECODE",
        .what = "decode attention (split-KV, paged, portable mma.sync)",
        .templates = {"attention/attention_common.cuh", "attention/mma_sm80.cuh", "attention/attention_decode.cuh"},
        .pieces = FGI_PIECE_MOD | FGI_PIECE_SPLIT,
        /* the block mask's sizes are read at run time; kv_block picks
         * the tile (fgi_dec_block_n) */
        .source_config =
            FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_BLOCKS | FGI_CFG_APPROX | FGI_CFG_PAIRS | FGI_CFG_L2_PREFETCH,
        .name_config = FGI_CFG_DTYPE | FGI_CFG_HEAD_DIM | FGI_CFG_APPROX | FGI_CFG_PAIRS,
        .entries = {"fg_attention_decode_r16", "fg_attention_decode_r32", "fg_attention_decode_r64",
                    "fg_attention_decode_merge", "fg_attention_decode_r16_paged", "fg_attention_decode_r32_paged",
                    "fg_attention_decode_r64_paged"},
        .min_cc = 80,
        .check = decode_check,
        .geometry = decode_geometry,
    },
    {
        /* internal: fg_attention_merge makes it for an identity mod, which
         * it does not read (no emitted pieces) */
        .op = FGI_KOP_ATTENTION_MERGE,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "attention_merge",
        .macro = "FG_KERNEL_ATTENTION_MERGE",
        .what = "merge of partial attention results",
        .templates = {"attention/attention_merge.cuh"},
        .pieces = 0,
        .source_config = FGI_CFG_DTYPE,
        .name_config = FGI_CFG_DTYPE,
        .entries = {"fg_attention_merge"},
        .min_cc = 80,
        .geometry = merge_geometry,
    },
    {
        /* internal: context parallelism's backward sums its gradient
         * contributions with it, made like the merge */
        .op = FGI_KOP_PARTIAL_SUM,
        .variant = FGI_VARIANT_PORTABLE,
        .label = "partial_sum",
        .macro = "FG_KERNEL_PARTIAL_SUM",
        .what = "fp32 sum of partial results",
        .templates = {"parallel/partial_sum.cuh"},
        .pieces = 0,
        .source_config = FGI_CFG_DTYPE,
        .name_config = FGI_CFG_DTYPE,
        .entries = {"fg_partial_sum"},
        .min_cc = 80,
        .geometry = sum_geometry,
    },
};

#define NROWS (sizeof registry / sizeof registry[0])
_Static_assert(NROWS <= FGI_KERNEL_SLOTS, "raise FGI_KERNEL_SLOTS");

const fgi_kernel_entry *fgi_kernel_find(fg_kernel_kind kind) {
    if (kind == 0) return NULL;
    for (size_t i = 0; i < NROWS; i++)
        if (registry[i].kind == kind) return &registry[i];
    return NULL;
}

const fgi_kernel_entry *fgi_kernel_lookup(fgi_kernel_op op, fgi_kernel_variant variant) {
    for (size_t i = 0; i < NROWS; i++)
        if (registry[i].op == op && registry[i].variant == variant) return &registry[i];
    return NULL;
}

size_t fgi_kernel_index(const fgi_kernel_entry *e) { return (size_t)(e - registry); }

void fgi_kernel_kinds_text(fgi_kernel_op op, char *out, size_t cap) {
    const fgi_kernel_entry *pick[NROWS];
    size_t n = 0;
    for (size_t i = 0; i < NROWS; i++)
        if (registry[i].kind != 0 && (op == 0 || registry[i].op == op)) pick[n++] = &registry[i];
    size_t len = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && len < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(out + len, cap - len, "%s%s", sep, pick[i]->macro);
        if (w < 0) break;
        len += (size_t)w;
    }
}

const char *fgi_variant_name(fgi_kernel_variant v) { return v == FGI_VARIANT_SM90 ? "Hopper" : "portable"; }

bool fgi_kernel_applies(const fgi_kernel_entry *e, const fg_kernel_config *config) {
    if (!e->check) return true;
    fg_kernel_config c = *config;
    if (c.head_dim == 0) c.head_dim = 128;
    if (c.q_block == 0) c.q_block = 128;
    if (c.kv_block == 0) c.kv_block = 128;
    if (c.arch && !*c.arch) c.arch = NULL;
    return e->check(NULL, &c) == FG_OK;
}

unsigned fgi_kernel_split_flags(const fgi_kernel_entry *e, const fg_kernel_config *config) {
    return e->split_flags ? e->split_flags(config) : 0;
}
