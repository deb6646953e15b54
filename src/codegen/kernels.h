/*
 * kernels.h -- the registry of generated kernels (kernels.c): one row per
 * operation x variant, and everything the library knows about a kernel is
 * in its row.
 *
 * An operation is what a kernel computes (forward attention, the block-mask
 * builder; later the backward's kernels, split-KV decode and its merge); a
 * variant is how (portable CUDA with mma.sync for sm_80 and newer, or
 * Hopper's wgmma and TMA for sm_90a). A row says:
 *   - its public fg_kernel_kind, if callers can name it, and its label (in
 *     file names, cache keys and the generated header);
 *   - the source: the templates after common.cuh, in order, the last one
 *     the kernel's own; which emitted pieces go between common.cuh and the
 *     templates; which config values the source reads (they make the key
 *     and the macros) and which name it;
 *   - its entry points, the one arch it is compiled for (or none), the
 *     oldest device it runs on, and which configs it takes beyond the
 *     general rules (the Hopper kernel's head dims and blocks);
 *   - its launch geometry for a config: tile sizes, threads, shared memory,
 *     mirroring the template.
 * Source assembly (source.c) and the attention launcher (attention/) read
 * all of it from the row, so a new kernel is a row here plus its template;
 * only its host-side arguments (its argument block, grid and launch order)
 * are written for it, beside the operation's public entry point.
 */
#ifndef FLEXGEN_KERNELS_H
#define FLEXGEN_KERNELS_H

#include "internal.h"

typedef enum fgi_kernel_op {
    FGI_KOP_ATTENTION_FWD = 1, /* out (and lse) from q, k, v and the mods  */
    FGI_KOP_BLOCK_MASK = 2,    /* the GPU block-mask builder               */
    FGI_KOP_ATTENTION_BWD = 3, /* dq, dk, dv (and buffer gradients) from
                                  dout, the forward's out and lse           */
    FGI_KOP_ATTENTION_DECODE = 4,/* the forward for few queries per
                                  sequence: split-KV, packed GQA, paged    */
    FGI_KOP_ATTENTION_MERGE = 5,/* partial (out, lse) results merged       */
    FGI_KOP_PARTIAL_SUM = 6   /* partial gradients summed in fp32         */
} fgi_kernel_op;

typedef enum fgi_kernel_variant {
    FGI_VARIANT_PORTABLE = 1, /* mma.sync and cp.async: sm_80 and newer   */
    FGI_VARIANT_SM90 = 2      /* wgmma, TMA, warp specialisation: sm_90a  */
} fgi_kernel_variant;

/* The emitted pieces a source takes after common.cuh; they are printed in
 * this order (source.c's table of emitters). */
enum {
    FGI_PIECE_MOD = 1u << 0,  /* the mod (fgi_emit_mod_named): fg_mod_params,
                                 fg_mask_mod, fg_score_mod, FG_HAS_*        */
    FGI_PIECE_SPLIT = 1u << 1,/* the mods split by dependency (fgi_emit_split):
                                 fg_mask_head/_row/_col, fg_mask_split, and
                                 the same for score_mod                     */
    FGI_PIECE_GRAD = 1u << 2  /* score_mod's derivatives (fgi_emit_grad):
                                 fg_mod_grads, fg_score_grad,
                                 fg_accumulate_grads                        */
};

/* Config values a source can read. In the key and the macros (source_config):
 * FG_DTYPE_BF16 / FG_DTYPE_FP16, FG_HEAD_DIM, FG_Q_BLOCK and FG_KV_BLOCK; in
 * the name and the header comment (name_config): "bf16" / "bf16 inputs",
 * "d128" / "head dim 128", "q128-kv128" / "blocks of 128 x 128". A value
 * a kernel does not read is in neither.
 * Two flags make a second kernel of a row: FGI_CFG_RAGGED (FG_RAGGED 0 / 1,
 * "ragged N" in the key, named "-ragged") and FGI_CFG_APPROX, the rows that
 * run score_mod: approximate math (fgi_math) adds FG_APPROX_MATH 1,
 * templates/approx_math.cuh, an "approx_math 1" key line and "-approx" to
 * the name, and the accurate kernel has none of them, so its source and key
 * are what they were before the flag existed. FGI_CFG_ORDER, the Hopper
 * backward's block order: lead_first adds FG_LEAD_FIRST 1 (its dK/dV pass
 * maps its blocks through fgs_block_of), a "lead_first 1" key line and
 * "-lead" to the name. FGI_CFG_PAIRS, KV heads in pairs (the Hopper
 * backward's other order, with FGI_CFG_ORDER one of the two at most; the
 * decode kernel's walk over two heads' rows at once): head_pairs adds
 * FG_HEAD_PAIRS 1, "head_pairs 1" and "-pairs". The plain kernel has none
 * of them either. FGI_CFG_L2_PREFETCH, the decode kernel's L2 prefetch on
 * its K/V copies, is not a config field but the context's choice for its
 * device (fgi_dec_l2_prefetch_at): FG_L2_PREFETCH 1 and an "l2_prefetch 1"
 * key line where chosen, in neither the name nor the header. FGI_CFG_DENSE,
 * the Hopper forward for calls without a block mask (fgi_fwd_dense_applies):
 * FG_DENSE 1, "dense 1" and "-dense" where it applies, nothing elsewhere. */
enum {
    FGI_CFG_DTYPE = 1u << 0,
    FGI_CFG_HEAD_DIM = 1u << 1,
    FGI_CFG_BLOCKS = 1u << 2,
    FGI_CFG_RAGGED = 1u << 3,
    FGI_CFG_APPROX = 1u << 4,
    FGI_CFG_ORDER = 1u << 5,
    FGI_CFG_PAIRS = 1u << 6,
    FGI_CFG_L2_PREFETCH = 1u << 7,
    FGI_CFG_DENSE = 1u << 8
};

/* The Hopper forward for calls without a block mask (config.dense): 176-row
 * K/V tiles where they apply, at head dim 128 for a mod without a mask_mod
 * (attention_notes f5: dense D=128 +2.8%); elsewhere the config makes the
 * plain kernel. The config's fill-in (source.c) and the launch geometry
 * (kernels.c) both ask this. */
#define FGI_FWD_DENSE_BLOCK_N 176
bool fgi_fwd_dense_applies(const fg_kernel_config *c, const fg_mod *mod);

#define FGI_KERNEL_MAX_TEMPLATES 4
#define FGI_KERNEL_MAX_ENTRIES 8
#define FGI_CLUSTER_MAX 8 /* the portable thread block cluster size */
#define FGI_KERNEL_SLOTS 16 /* rows the registry may have (per-row memos) */

/* The Hopper forward's merged walk (FGH_MERGE_MAX_KB): the kv blocks of a
 * block mask it keeps states for, and the tiles of its list, less the slot
 * that holds the list's length. */
#define FGI_FWD_SM90_MERGE_MAX_KB 4096

/* How one entry point is launched: the tile a thread block covers (q rows x
 * kv rows, where that means something), threads per block (one dimension),
 * dynamic shared memory in bytes, and the thread blocks per tile (bands of
 * output columns; 1 for the forward). */
typedef struct fgi_kernel_geom {
    int block_m, block_n, threads;
    size_t smem;
    int bands;
    /* The Hopper forward at head dim 64 (192-row q tiles): the rows of a
     * tile that must lie in one block-mask row (its tiles merge two rows),
     * and the rows of one TMA box of q. 0: block_m for both. */
    int q_align, q_box;
    /* 1: the kernel is persistent, a one-dimensional grid of at most one
     * block per SM that walks every tile (the Hopper forward). */
    int persistent;
    /* 1: the kernel stores O through a tensor map of out (the Hopper
     * forward where attention_fwd_sm90.cuh's FGH_O_SMEM or FGH_O_BUF
     * holds), so forward.c encodes one and an out TMA cannot describe
     * sends the call to the portable kernel. */
    int o_map;
} fgi_kernel_geom;

typedef struct fgi_kernel_entry {
    fg_kernel_kind kind;   /* the public kind, or 0 for an internal kernel  */
    fgi_kernel_op op;
    fgi_kernel_variant variant;
    const char *label;     /* "attention_fwd": names and keys               */
    const char *macro;     /* defined to 1 in the source                    */
    const char *what;      /* the header's "Kernel: ..." and messages       */
    /* templates/ files after common.cuh, in order, NULL-terminated; the
     * last is the kernel's own (named in the key and the header). */
    const char *templates[FGI_KERNEL_MAX_TEMPLATES + 1];
    unsigned pieces;        /* FGI_PIECE_*                                  */
    unsigned source_config; /* FGI_CFG_*: in the key and the macros         */
    unsigned name_config;   /* FGI_CFG_*: in the name and the header        */
    /* Entry points, NULL-terminated; [0] is the one a spec loads unless
     * told otherwise. */
    const char *entries[FGI_KERNEL_MAX_ENTRIES + 1];
    const char *arch;       /* the only arch it compiles for, or NULL       */
    int min_cc;             /* oldest compute capability it runs on (80)    */
    /* Whether the kernel takes config `c` (defaults filled in, general
     * rules checked): FG_ERR_NOT_SUPPORTED with the reason recorded on ctx
     * (which may be NULL) when not. NULL: every config. */
    fg_status (*check)(fg_ctx *ctx, const fg_kernel_config *c);
    /* The launch geometry of entry point `entry` under config `c` (defaults
     * filled in) for `mod` (NULL: a kernel that reads no mod). NULL: the
     * kernel is launched by its own module with its own geometry (the
     * block-mask builder). */
    fgi_kernel_geom (*geometry)(const fg_kernel_config *c, const fg_mod *mod, int entry);
    /* The rewrites its split takes under config `c` (FGI_SPLIT_*, given
     * to fgi_emit_split_math); NULL: none. A kernel whose split takes
     * FGI_SPLIT_INDEX_FLOATS for a mod with such a cast refuses launches
     * whose indices it would not compute exactly (fg_kernel's
     * index_floats). */
    unsigned (*split_flags)(const fg_kernel_config *c);
} fgi_kernel_entry;

/* The block-mask builder's entry points, in its row's order. */
enum { FGI_BM_CLASSIFY = 0, FGI_BM_COMPACT = 1 };
/* The backward's entry points, in its row's order. */
enum {
    FGI_BWD_PRE = 0,        /* delta, dq_accum zeroed                      */
    FGI_BWD_DKDV = 1,       /* dK, dV (dQ with atomics), buffer gradients  */
    FGI_BWD_DQ = 2,         /* dq = scale * dq_accum                       */
    FGI_BWD_DQ_TILES = 3,   /* dq on its own (deterministic)               */
    FGI_BWD_FIXED = 4       /* fixed-point buffer gradients to fp32        */
};

/* The decode kernel's entry points, in its row's order: the walk for
 * tiles of 16, 32 and 64 packed rows over contiguous K/V, the merge of
 * its splits, then the three walks over paged K/V (FGI_DEC_PAGED + the
 * contiguous one's index). */
enum { FGI_DEC_R16 = 0, FGI_DEC_R32 = 1, FGI_DEC_R64 = 2, FGI_DEC_MERGE = 3, FGI_DEC_PAGED = 4 };
/* The K/V rows of the smallest decode tile (block masks the decode kernel
 * walks have kv blocks of a multiple of it), and the most splits of a
 * walk (the parts of a row its merge sums). */
#define FGI_DEC_BLOCK_N 64
#define FGI_DEC_MAX_SPLIT 128
/* The width of the decode walk's K/V rows (the template's FGD_D): the head
 * dim, or with KV heads in pairs (config.head_pairs, head dim 64 only) a
 * pair's two rows side by side. */
static inline int fgi_dec_walk_dim(const fg_kernel_config *c) { return c->head_dim * (c->head_pairs ? 2 : 1); }
/* K/V rows per decode tile (the template's FGD_BLOCK_N, from the walks'
 * FG_LAUNCH_BLOCK_N): 128 for walk rows of 128 and under and kv blocks of a
 * multiple of 128 (at 64 a 64-row tile is 8 KB of K, and the per-tile
 * barrier and softmax cost as much as reading it; at 128 the tiles' K and V
 * take turns in a ring of three slots: decode d15, d26), else 64. */
static inline int fgi_dec_block_n(const fg_kernel_config *c) {
    return fgi_dec_walk_dim(c) <= 128 && c->kv_block % 128 == 0 ? 2 * FGI_DEC_BLOCK_N : FGI_DEC_BLOCK_N;
}
/* Whether the decode kernel's K/V copies ask the L2 for 256 bytes around
 * each (FG_L2_PREFETCH), for a device whose DRAM delivers `dram` bytes per
 * SM clock (fgi_cuda_dram_per_sm_clock; 0: unknown) under
 * FG_OPT_DECODE_L2_PREFETCH `option` (-1: chosen here). The prefetch
 * measured 1-2% faster on the H100 (12.8 bytes a clock) and 2.7-5.2%
 * slower on the H200 (18.8), whose DRAM outruns the L2's extra work
 * (bench/attention_notes.md, decode d25); the cut lies between them, and
 * an unknown device keeps the H100's choice. */
#define FGI_DEC_L2_PREFETCH_BELOW 16.0
static inline bool fgi_dec_l2_prefetch_at(int option, double dram) {
    if (option >= 0) return option == 1;
    return dram <= 0 || dram < FGI_DEC_L2_PREFETCH_BELOW;
}
/* Packed rows per tile of decode walk entry `entry` (R16..R64 or their
 * paged twins): 16, 32 or 64. */
static inline int fgi_dec_tile_rows(int entry) {
    if (entry >= FGI_DEC_PAGED) entry -= FGI_DEC_PAGED - FGI_DEC_R16;
    return 16 << (entry - FGI_DEC_R16);
}

/* The row of public kind `kind`, or NULL. */
const fgi_kernel_entry *fgi_kernel_find(fg_kernel_kind kind);
/* The row of (op, variant), or NULL. */
const fgi_kernel_entry *fgi_kernel_lookup(fgi_kernel_op op, fgi_kernel_variant variant);
/* A row's index, in [0, FGI_KERNEL_SLOTS). */
size_t fgi_kernel_index(const fgi_kernel_entry *e);
/* The public kinds of operation `op` (0: of every operation) as a phrase
 * for messages: "FG_KERNEL_ATTENTION_FWD, FG_KERNEL_BLOCK_MASK or
 * FG_KERNEL_ATTENTION_FWD_SM90". */
void fgi_kernel_kinds_text(fgi_kernel_op op, char *out, size_t cap);
/* "portable" or "Hopper", for messages. */
const char *fgi_variant_name(fgi_kernel_variant v);

/* Whether `e` takes `config` with the defaults fgi_codegen_init fills in
 * (head dim and blocks 128, arch "" as none). */
bool fgi_kernel_applies(const fgi_kernel_entry *e, const fg_kernel_config *config);

/* The rewrites `e`'s split takes under `config` (its split_flags; 0 where
 * it has none): what the source generator asks of fgi_emit_split_math
 * and what a made kernel checks its launches against. */
unsigned fgi_kernel_split_flags(const fgi_kernel_entry *e, const fg_kernel_config *config);

#endif
