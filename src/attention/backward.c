/*
 * backward.c -- the backward attention run API: fg_attention_backward,
 * fg_kernel_launch_backward, and the reference's public entry.
 *
 * A backward launch is kernel.c's sequence with the backward's own parts:
 *   1. the checks every entry point shares (the forward's on bwd->fwd, then
 *      dout, dq, dk, dv and the gradient bindings), then the kernel's: its
 *      dtype and head dim, the grid's limits, alignment for cp.async (q, k,
 *      v, dout) and for the paired stores (dq, dk, dv);
 *   2. the CUDA context the kernel was loaded in;
 *   3. the argument block (fgi_attn_bwd_abi, abi_bwd.def), with both
 *      directions of the block mask checked against the kernels' tiles;
 *   4. the mod's parameters, and the gradient struct (fg_mod_grads) of the
 *      buffers whose gradients are wanted;
 *   5. for the Hopper kernel, tensor maps of q, k, v and dout (and of dk
 *      and dv when both are 16-byte aligned: the pass stores them by TMA);
 *   6. the workspace, the caller's or else from the library's pool on the
 *      stream: delta (and lse * log2(e) for the Hopper kernel), the fp32
 *      dQ accumulator (not in deterministic mode; the Hopper kernel's with
 *      an int flag per 64 x 64 tile) and the fixed-point
 *      accumulators of the buffer gradients;
 *   7. on the caller's stream, in order: the fixed-point accumulators
 *      zeroed, fg_attention_bwd_pre (delta; the dQ accumulator zeroed, or
 *      at the Hopper kernel's head dim 128 its tiles' flags), the tail
 *      split's accumulators zeroed (below),
 *      fg_attention_bwd_dkdv (dK, dV, buffer gradients; dQ through atomics),
 *      then either fg_attention_bwd_dq (dQ from the accumulator) or,
 *      deterministic, fg_attention_bwd_dq_tiles; fg_attention_bwd_fixed_to_float
 *      per buffer gradient; the workspace given back on the stream.
 * Nothing synchronises (except where the driver has no stream-ordered
 * allocator: then the workspace is freed after a stream synchronisation).
 *
 * Variants: the portable kernels (templates/attention/attention_bwd.cuh)
 * and the Hopper one (attention_bwd_sm90.cuh, whose dK/dV pass runs on
 * wgmma and TMA and takes the tensor maps as a fourth argument) share the
 * entry points and the argument block; fg_kernel_get chooses. A layout TMA
 * cannot describe, or a block mask with kv blocks under 128 rows (or, at
 * head dim 64, where the Hopper pass steps by 128 q rows, q blocks under
 * 128), sends fg_attention_backward back to the portable kernels.
 *
 * Tile order: under a block mask whose host arrays are at hand,
 * fg_attention_backward weighs the Hopper dK/dV pass's blocks
 * (bwd_order.c) and, where every head's first kv tiles are heavy enough
 * that grid order would leave them running alone at the end, takes the
 * -lead kernel (config.lead_first) and sets abi.lead_tiles; else, where
 * the heads' tiles grow lighter along the kv axis (causal, prefixes), the
 * -pairs kernel (config.head_pairs), launched on a grid of kv-head pairs.
 * Without a block mask, where the last wave of blocks fills under half the
 * SMs (tail_pieces_of), the -lead kernel splits those blocks into pieces
 * (abi.tail_from, tail_pieces) that add dK and dV into fp32 accumulators
 * in the workspace (abi.tail_acc, zeroed before the pass); the -lead
 * kernel's grid is one-dimensional.
 */
#include "attention/attention.h"

#include "attention/bwd_order.h"

#include "base/growable.h"
#include "blockmask/blockmask.h"
#include "reference/reference.h"

#include <string.h>

/* ---- checks -------------------------------------------------------------------- */

static fg_status check_alignment(fg_ctx *ctx, const fg_attention_bwd_args *b, const fgi_attn_strides *st,
                                 const fgi_attn_bwd_strides *bs) {
    const fg_attention_args *a = b->fwd;
    FGI_TRY(fgi_attn_check_aligned(ctx, "q", a->q, st->q, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "k", a->k, st->k, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "v", a->v, st->v, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dout", b->dout, bs->dout, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "out", a->out, st->o, 2));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dq", b->dq, bs->dq, 4));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dk", b->dk, bs->dk, 4));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dv", b->dv, bs->dv, 4));
    if ((uintptr_t)a->lse % 4 != 0) return fgi_error(ctx, FG_ERR_SHAPE, "lse: the pointer must be 4-byte aligned");
    return FG_OK;
}

/* Both directions of the block mask against the tiles of the passes that
 * walk them: the dK/dV pass steps through a kv block's q blocks by its
 * q tile and covers 64 or 128 kv rows (kv_rows: 64 for 64-row kv blocks),
 * the dQ pass (deterministic) steps through a q block's kv blocks by its kv
 * tile and covers 64 q rows. */
static fg_status block_mask_args(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a,
                                 fgi_attn_bwd_abi *abi) {
    fg_block_mask *m = (fg_block_mask *)a->block_mask; /* uploading is a cache fill */
    const fg_block_mask_desc *d = &m->desc;
    const fgi_kernel_geom *kv = &k->geom[FGI_BWD_DKDV], *q = &k->geom[FGI_BWD_DQ_TILES];
    const int qmul = kv->block_m > q->block_m ? kv->block_m : q->block_m;
    const int kvmul = 64 > q->block_n ? 64 : q->block_n;
    if (d->q_block % qmul != 0 || d->kv_block % kvmul != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask blocks %d x %d: the backward kernels (head dim %d) need q blocks "
                         "that are multiples of %d and kv blocks multiples of %d",
                         d->q_block, d->kv_block, k->config.head_dim, qmul, kvmul);
    if (k->kernel->variant == FGI_VARIANT_SM90 && d->kv_block % kv->block_n != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask kv blocks of %d: the Hopper backward covers %d kv rows per thread "
                         "block and needs kv blocks that are multiples of it (the portable backward, "
                         "FG_OPT_HOPPER_KERNEL 0, takes multiples of 64)",
                         d->kv_block, kv->block_n);
    FGI_TRY(fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, d->q_block,
                                 d->kv_block));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_Q_NUM_BLOCKS, &abi->q_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_Q_INDICES, &abi->q_idx));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_Q_NUM_BLOCKS, &abi->full_q_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_Q_INDICES, &abi->full_q_idx));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_NUM_BLOCKS, &abi->kv_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_INDICES, &abi->kv_idx));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_NUM_BLOCKS, &abi->full_kv_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_INDICES, &abi->full_kv_idx));
    FGI_ATTN_ABI_FILL_BLOCK_MASK(abi, m);
    if (d->kv_block % abi->kv_rows != 0) {
        abi->kv_rows = 64;
        abi->kv_tiles = (a->kv_len + 63) / 64;
    }
    return FG_OK;
}

/* The Hopper dK/dV pass over call `a`'s block mask as bwd_order.c weighs
 * it, in blocks of `tile_rows` kv rows; false without a block mask,
 * without its counts on the host (a GPU-built mask whose copy of them has
 * not landed yet: the backward does not wait for it,
 * fgi_block_mask_counts) or with a mask the call does not take (the
 * launch reports that). */
static bool pass_tiles(fg_ctx *ctx, const fg_attention_args *a, int tile_rows, fgi_bwd_tiles *t) {
    const fg_block_mask *m = a->block_mask;
    const int32_t *q_num = NULL, *full_q_num = NULL;
    if (tile_rows <= 0 || !m || !fgi_block_mask_counts(m, &q_num, &full_q_num)) return false;
    int sms = 0;
    if (fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, m->desc.q_block,
                             m->desc.kv_block) != FG_OK ||
        fgi_cuda_sm_count(ctx, &sms) != FG_OK) {
        fgi_clear_error(ctx);
        return false;
    }
    *t = (fgi_bwd_tiles){
        .q_num = q_num,
        .full_q_num = full_q_num,
        .bm_batch = m->desc.batch,
        .bm_heads = m->desc.heads,
        .kv_blocks = m->kv_blocks,
        .kv_block = m->desc.kv_block,
        .batch = a->batch,
        .heads_q = a->heads_q,
        .heads_kv = a->heads_kv,
        .kv_tiles = (a->kv_len + tile_rows - 1) / tile_rows,
        .tile_rows = tile_rows,
        .slots = sms, /* one block per SM */
    };
    return true;
}

/* How many leading kv tiles of every head a Hopper dK/dV pass of
 * `tile_rows`-row blocks starts first for call `a`: the context's
 * FG_OPT_BWD_LEAD_TILES where set (at most all tiles but one), else
 * fgi_bwd_lead_tiles's choice over `w`, the pass as pass_tiles weighed it
 * (NULL, where it had no counts: 0). */
static int lead_tiles_of(fg_ctx *ctx, const fg_attention_args *a, int tile_rows, const fgi_bwd_tiles *w) {
    if (tile_rows <= 0) return 0;
    const int kv_tiles = (a->kv_len + tile_rows - 1) / tile_rows;
    if (ctx->bwd_lead_tiles >= 0) {
        /* the kernel's block index is 32-bit */
        if ((int64_t)kv_tiles * a->heads_kv * a->batch >= ((int64_t)1 << 32)) return 0;
        return ctx->bwd_lead_tiles < kv_tiles ? ctx->bwd_lead_tiles : kv_tiles - 1;
    }
    return w ? fgi_bwd_lead_tiles(w) : 0;
}

/* Whether the Hopper dK/dV pass runs call `a` of `mod` in pairs of kv
 * heads (the -pairs kernel): with an even number of kv heads, the
 * context's FG_OPT_BWD_HEAD_PAIRS where set, else, at head dim 128 for a
 * mod without a score_mod, fgi_bwd_head_pairs's choice over `w`, the pass
 * as pass_tiles weighed it (NULL, where it had no counts: false). */
static bool head_pairs_of(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, const fgi_bwd_tiles *w) {
    if (a->heads_kv % 2 != 0) return false;
    if (ctx->bwd_head_pairs >= 0) return ctx->bwd_head_pairs;
    /* At head dim 64 the -pairs kernel spills in causal's and document's
     * steps (49 and 51 local loads and stores; the plain one none). With
     * a score_mod, what ptxas makes of the -pairs consumer (its block
     * coordinates are values, not blockIdx) decides more than the order:
     * alibi ran 1.4% slower in it over five alternated rounds, softcap
     * 2.3% faster over two (attention_notes v44); such mods keep the plain
     * kernel, which no measurement has seen lose to it. */
    if (a->head_dim != 128 || fgi_mod_runs_score(mod)) return false;
    return w && fgi_bwd_head_pairs(w);
}

/* The Hopper dK/dV pass's tail split for call `b` in blocks of
 * `tile_rows` kv rows and steps of `step_rows` q rows (templates'
 * "The last wave"): how many pieces each block of the last wave becomes
 * (0: no split), and in *from the first of those blocks
 * (fgi_bwd_tail_pieces). Only without a block mask (every block walks the
 * same q steps), not in deterministic mode (the pieces' fp32 sums are
 * added in any order), and with FG_OPT_BWD_TAIL_SPLIT on. */
static int tail_pieces_of(fg_ctx *ctx, const fg_attention_bwd_args *b, int tile_rows, int step_rows, int *from) {
    const fg_attention_args *a = b->fwd;
    *from = 0;
    int sms = 0;
    if (!ctx->bwd_tail_split || b->deterministic || a->block_mask || tile_rows <= 0 || step_rows <= 0) return 0;
    if (fgi_cuda_sm_count(ctx, &sms) != FG_OK || sms <= 0) {
        fgi_clear_error(ctx);
        return 0;
    }
    const int64_t kv_tiles = (a->kv_len + tile_rows - 1) / tile_rows;
    const int64_t steps = (int64_t)(a->q_len + step_rows - 1) / step_rows * (a->heads_q / a->heads_kv);
    int64_t first;
    const int pieces = fgi_bwd_tail_pieces(kv_tiles * a->heads_kv * a->batch, sms, steps, &first);
    *from = (int)first; /* under 2^31 where pieces > 0 */
    return pieces;
}

static void fill_abi(const fg_kernel *k, const fg_attention_bwd_args *b, const fgi_attn_strides *st,
                     const fgi_attn_bwd_strides *bs, fgi_attn_bwd_abi *abi) {
    const fg_attention_args *a = b->fwd;
    FGI_ATTN_ABI_FILL_COMMON(abi, a, st);
    abi->dout = (uint64_t)(uintptr_t)b->dout;
    abi->dq = (uint64_t)(uintptr_t)b->dq;
    abi->dk = (uint64_t)(uintptr_t)b->dk;
    abi->dv = (uint64_t)(uintptr_t)b->dv;
    abi->dlse = (uint64_t)(uintptr_t)b->dlse;
    memcpy(abi->do_stride, bs->dout, sizeof bs->dout);
    memcpy(abi->dq_stride, bs->dq, sizeof bs->dq);
    memcpy(abi->dk_stride, bs->dk, sizeof bs->dk);
    memcpy(abi->dv_stride, bs->dv, sizeof bs->dv);
    const int bn = k->geom[FGI_BWD_DKDV].block_n, bm = k->geom[FGI_BWD_DQ_TILES].block_m;
    abi->kv_rows = bn; /* block_mask_args may halve it */
    abi->kv_tiles = (a->kv_len + bn - 1) / bn;
    abi->q_tiles = (a->q_len + bm - 1) / bm;
    abi->dq_atomic = b->deterministic ? 0 : 1;
    /* rows of the workspace: whole 64-row tiles, whole steps of the dK/dV
     * pass (128 rows in the Hopper one at head dim 64) */
    const int pitch = k->geom[FGI_BWD_DKDV].block_m > 64 ? k->geom[FGI_BWD_DKDV].block_m : 64;
    abi->q_pitch = (a->q_len + pitch - 1) / pitch * pitch;
}

/* The Hopper dK/dV pass's fourth argument: q, k, v and dout as tensor maps,
 * boxes of its q step (64 rows) for q and dout, of its 128 kv rows for k
 * and v; dk and dv, boxes of a consumer's half of them, when both are
 * 16-byte aligned (abi->dkdv_tma; else left zero and not read). */
typedef struct hopper_maps {
    CUtensorMap q, k, v, dout, dk, dv;
} hopper_maps;

static fg_status encode_maps(fg_ctx *ctx, const fg_kernel *k, const fg_attention_bwd_args *b,
                             const fgi_attn_strides *st, const fgi_attn_bwd_strides *bs, hopper_maps *m,
                             fgi_attn_bwd_abi *abi) {
    const fg_attention_args *a = b->fwd;
    const fgi_kernel_geom *g = &k->geom[FGI_BWD_DKDV];
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->q, a->dtype, a->q, a->head_dim, a->q_len, a->heads_q, a->batch, st->q,
                                g->block_m, "q"));
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->k, a->dtype, a->k, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->k,
                                g->block_n, "k"));
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->v, a->dtype, a->v, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->v,
                                g->block_n, "v"));
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->dout, a->dtype, b->dout, a->head_dim, a->q_len, a->heads_q, a->batch,
                                bs->dout, g->block_m, "dout"));
    abi->dkdv_tma = fgi_attn_aligned(b->dk, bs->dk, 16) && fgi_attn_aligned(b->dv, bs->dv, 16);
    if (abi->dkdv_tma) {
        FGI_TRY(fgi_attn_tensor_map(ctx, &m->dk, a->dtype, b->dk, a->head_dim, a->kv_len, a->heads_kv, a->batch,
                                    bs->dk, g->block_n / 2, "dk"));
        FGI_TRY(fgi_attn_tensor_map(ctx, &m->dv, a->dtype, b->dv, a->head_dim, a->kv_len, a->heads_kv, a->batch,
                                    bs->dv, g->block_n / 2, "dv"));
    } else {
        memset(&m->dk, 0, sizeof m->dk);
        memset(&m->dv, 0, sizeof m->dv);
    }
    return FG_OK;
}

/* ---- launch -------------------------------------------------------------------- */

/* The kernels after the workspace is in place: every launch queued on the
 * stream, in order. `grads` are the gradient outputs (fp32) per layout
 * entry, `fixed` their fixed-point accumulators. */
static fg_status run_passes(fg_ctx *ctx, const fg_kernel *k, const fg_attention_bwd_args *b,
                            fgi_attn_bwd_abi *abi, fgi_param_blob *blob, unsigned char *gblob, hopper_maps *maps,
                            const void *const grads[], const int64_t glen[],
                            const CUdeviceptr fixed[], bool caller_sums, size_t tail_bytes) {
    const fg_attention_args *a = b->fwd;
    void *stream = a->stream;
    const fgi_grad_layout *L = &k->grads;
    for (int i = 0; i < L->n; i++)
        if (grads[i] && !caller_sums)
            FGI_CU_TRY(ctx,
                       fgi_cu()->cuMemsetD8Async(fixed[i], 0, (size_t)glen[i] * FGI_BWD_SUM_BYTES, (CUstream)stream),
                       "cuMemsetD8Async");
    /* the preprocess zeroes the dQ accumulator's flags (Hopper) or the
     * accumulator (all q_pitch rows) */
    const int row_block = k->geom[FGI_BWD_PRE].block_m, bands = k->geom[FGI_BWD_DKDV].bands;
    const unsigned pre_grid[3] = {(unsigned)((abi->q_pitch + row_block - 1) / row_block), (unsigned)a->heads_q,
                                  (unsigned)a->batch};
    void *pre_args[1] = {abi};
    FGI_TRY(fgi_kernel_run(ctx, k, FGI_BWD_PRE, pre_grid, pre_args, stream));
    /* the -pairs kernel: pair y's block x is tile x / 2 of head 2 y + x % 2;
     * the Hopper -lead kernel: one dimension, the tail's pieces last */
    const int pairs = k->config.head_pairs;
    unsigned kv_grid[3] = {(unsigned)(abi->kv_tiles * bands) << pairs, (unsigned)a->heads_kv >> pairs,
                           (unsigned)a->batch};
    if (k->config.lead_first && k->kernel->variant == FGI_VARIANT_SM90) {
        const unsigned blocks = (unsigned)abi->kv_tiles * (unsigned)a->heads_kv * (unsigned)a->batch;
        const unsigned from = (unsigned)abi->tail_from;
        kv_grid[0] = abi->tail_pieces ? from + (blocks - from) * (unsigned)abi->tail_pieces : blocks;
        kv_grid[1] = kv_grid[2] = 1;
    }
    if (abi->tail_acc)
        FGI_CU_TRY(ctx, fgi_cu()->cuMemsetD32Async(abi->tail_acc, 0, tail_bytes / 4, (CUstream)stream),
                   "cuMemsetD32Async");
    void *dkdv_args[4] = {abi, blob->bytes, gblob, maps};
    FGI_TRY(fgi_kernel_run(ctx, k, FGI_BWD_DKDV, kv_grid, dkdv_args, stream));
    if (abi->dq_atomic) {
        const unsigned dq_grid[3] = {(unsigned)((a->q_len + row_block - 1) / row_block), (unsigned)a->heads_q,
                                     (unsigned)a->batch};
        void *dq_args[1] = {abi};
        FGI_TRY(fgi_kernel_run(ctx, k, FGI_BWD_DQ, dq_grid, dq_args, stream));
    } else {
        const unsigned q_grid[3] = {(unsigned)(abi->q_tiles * bands), (unsigned)a->heads_q, (unsigned)a->batch};
        void *dqt_args[2] = {abi, blob->bytes};
        FGI_TRY(fgi_kernel_run(ctx, k, FGI_BWD_DQ_TILES, q_grid, dqt_args, stream));
    }
    for (int i = 0; i < L->n && !caller_sums; i++) {
        if (!grads[i]) continue;
        CUdeviceptr acc = fixed[i], out = (CUdeviceptr)(uintptr_t)grads[i];
        long long n = glen[i];
        void *fx_args[3] = {&acc, &out, &n};
        const unsigned g[3] = {(unsigned)((n + 127) / 128), 1, 1};
        FGI_TRY(fgi_kernel_run(ctx, k, FGI_BWD_FIXED, g, fx_args, stream));
    }
    return FG_OK;
}

/* Everything one backward launch of `b` (already in this library's
 * layout) on kernel `k` needs before its workspace: the checks, the
 * argument block, the parameters, the gradient layout, the tensor maps,
 * and where each part of the workspace goes. */
typedef struct bwd_plan {
    fgi_attn_bwd_abi abi;
    fgi_param_blob blob;
    hopper_maps maps; /* 64-byte aligned, as CUtensorMap is */
    const void *grads[FGI_MAX_GRAD_BUFFERS];
    int64_t glen[FGI_MAX_GRAD_BUFFERS];
    size_t off_lse2, off_accum, off_flags, off_tail, off_fixed[FGI_MAX_GRAD_BUFFERS], dq_accum_bytes, flag_bytes,
        tail_bytes, core, total;
} bwd_plan;

/* `lead`: the leading tiles a -lead kernel starts first, as
 * on_chosen_kernel weighed them, or -1 to weigh them here (a kernel the
 * caller launches itself); the plain kernels ignore it. */
static fg_status plan_launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_bwd_args *b, int lead, bwd_plan *p) {
    if (k->kernel->op != FGI_KOP_ATTENTION_BWD)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "fg_kernel_launch_backward runs backward kernels (kind FG_KERNEL_ATTENTION_BWD); "
                         "this one is the %s",
                         k->kernel->what);
    const fg_attention_args *a = b->fwd;
    fgi_attn_strides st;
    fgi_attn_bwd_strides bs;
    FGI_TRY(fgi_attn_check_bwd_args(ctx, &k->params, b, &st, &bs));
    if (a->dtype != k->config.dtype || a->head_dim != k->config.head_dim)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the kernel was compiled for %s, head dim %d; the call has %s, head dim %d",
                         k->config.dtype == FG_FP16 ? "fp16" : "bf16", k->config.head_dim,
                         a->dtype == FG_FP16 ? "fp16" : "bf16", a->head_dim);
    FGI_CHECK_ARG(ctx, a->lse, "the backward needs the forward's lse (fg_attention_args.lse is NULL)");
    if (k->config.head_pairs && a->heads_kv % 2 != 0)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the -pairs kernel runs the kv heads in pairs; this call has %d kv heads", a->heads_kv);
    if (a->heads_q > 65535 || a->batch > 65535)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "heads_q %d and batch %d must be <= 65535", a->heads_q,
                         a->batch);
    FGI_TRY(check_alignment(ctx, b, &st, &bs));
    FGI_TRY(fgi_kernel_check_context(ctx, k));

    fgi_attn_bwd_abi *abi = &p->abi;
    memset(abi, 0, sizeof *abi);
    fill_abi(k, b, &st, &bs, abi);
    if (a->block_mask) FGI_TRY(block_mask_args(ctx, k, a, abi));
    const bool hopper = k->kernel->variant == FGI_VARIANT_SM90;
    if (k->config.lead_first && hopper) {
        const int rows = k->geom[FGI_BWD_DKDV].block_n;
        fgi_bwd_tiles t;
        abi->lead_tiles = lead >= 0 ? lead : lead_tiles_of(ctx, a, rows, pass_tiles(ctx, a, rows, &t) ? &t : NULL);
        if (abi->lead_tiles == 0)
            abi->tail_pieces = tail_pieces_of(ctx, b, rows, k->geom[FGI_BWD_DKDV].block_m, &abi->tail_from);
        if ((int64_t)abi->kv_tiles * a->heads_kv * a->batch >= ((int64_t)1 << 31))
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "the -lead kernel's grid is one-dimensional: %d kv tiles x %d kv heads x batch %d "
                             "blocks are too many",
                             abi->kv_tiles, a->heads_kv, a->batch);
    }

    fgi_value bound[FGI_MAX_PARAMS];
    FGI_TRY(fgi_kernel_pack_params(ctx, k, a->binds, a->nbinds, &p->blob, bound));
    const fgi_grad_layout *L = &k->grads;
    FGI_TRY(fgi_attn_grad_binds(ctx, &k->params, L, b->grad_binds, b->ngrad_binds, bound, p->grads, p->glen));

    if (hopper) FGI_TRY(encode_maps(ctx, k, b, &st, &bs, &p->maps, abi));

    /* Workspace: delta, lse2 (Hopper), the dQ accumulator, its tiles'
     * flags (Hopper), the fixed-point accumulators; every part 256-byte
     * aligned. `core` ends the parts every launch has. */
    const size_t rows = (size_t)a->batch * (size_t)a->heads_q * (size_t)abi->q_pitch;
    p->off_lse2 = fgi_attn_ws_round(rows * 4);
    p->off_accum = hopper ? p->off_lse2 + fgi_attn_ws_round(rows * 4) : p->off_lse2;
    p->dq_accum_bytes = abi->dq_atomic ? rows * (size_t)a->head_dim * 4 : 0;
    p->off_flags = p->off_accum + fgi_attn_ws_round(p->dq_accum_bytes);
    /* one int32 per 64 x 64 tile of the accumulator (the Hopper kernel's
     * templates use them at head dim 128) */
    p->flag_bytes = hopper ? p->dq_accum_bytes / (64 * 64) : 0;
    /* the tail split's accumulators (dK and dV of a block, fp32) and a
     * counter per tail block */
    p->off_tail = p->off_flags + fgi_attn_ws_round(p->flag_bytes);
    const int64_t n_tail = abi->tail_pieces ? ((int64_t)abi->kv_tiles * a->heads_kv * a->batch - abi->tail_from) : 0;
    p->tail_bytes = (size_t)n_tail * (2 * (size_t)k->geom[FGI_BWD_DKDV].block_n * a->head_dim + 1) * 4;
    p->core = p->total = p->off_tail + fgi_attn_ws_round(p->tail_bytes);
    for (int i = 0; i < L->n; i++) {
        p->off_fixed[i] = 0;
        if (p->grads[i]) {
            p->off_fixed[i] = p->total;
            p->total += fgi_attn_ws_round((size_t)p->glen[i] * FGI_BWD_SUM_BYTES);
        }
    }
    return FG_OK;
}

/* The caller's fixed-point sum of layout entry i: the one given for the
 * gradient binding of the same name (fgi_attention_backward_into_sums). */
static CUdeviceptr caller_sum(const fg_kernel *k, const fg_attention_bwd_args *b, const CUdeviceptr *sums, int i) {
    const char *name = k->params.params[k->grads.param[i]].name;
    for (size_t j = 0; j < b->ngrad_binds; j++)
        if (strcmp(b->grad_binds[j].name, name) == 0) return sums[j];
    return 0;
}

/* One backward launch of `b`, already in this library's layout; with
 * `sums`, the buffer gradients go into the caller's fixed-point sums. */
static fg_status launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_bwd_args *b, int lead,
                        const CUdeviceptr *sums) {
    bwd_plan p;
    FGI_TRY(plan_launch(ctx, k, b, lead, &p));
    if (sums) p.total = p.core; /* no sums of its own */
    const fg_attention_args *a = b->fwd;
    const bool hopper = k->kernel->variant == FGI_VARIANT_SM90;
    fgi_attn_ws w;
    CUdeviceptr base;
    FGI_TRY(fgi_attn_ws_take(ctx, &w, b->workspace, b->workspace_size, p.total, a->stream, &base));
    fgi_attn_bwd_abi *abi = &p.abi;
    abi->delta = base;
    abi->lse2 = hopper ? base + p.off_lse2 : 0;
    abi->dq_accum = abi->dq_atomic ? base + p.off_accum : 0;
    abi->dq_flags = p.flag_bytes ? base + p.off_flags : 0;
    abi->tail_acc = p.tail_bytes ? base + p.off_tail : 0;
    const fgi_grad_layout *L = &k->grads;
    CUdeviceptr fixed[FGI_MAX_GRAD_BUFFERS] = {0};
    _Alignas(16) unsigned char gblob[FGI_MAX_GRAD_BUFFERS * 16 + 16];
    memset(gblob, 0, sizeof gblob);
    for (int i = 0; i < L->n; i++) {
        if (!p.grads[i]) continue;
        fixed[i] = sums ? caller_sum(k, b, sums, i) : base + p.off_fixed[i];
        uint64_t ptr = (uint64_t)fixed[i];
        int64_t len = p.glen[i];
        memcpy(gblob + L->offset[i], &ptr, 8);
        memcpy(gblob + L->offset[i] + 8, &len, 8);
    }

    fg_status s =
        run_passes(ctx, k, b, abi, &p.blob, gblob, &p.maps, p.grads, p.glen, fixed, sums != NULL, p.tail_bytes);
    fg_status f = fgi_attn_ws_free(ctx, &w, a->stream);
    return s != FG_OK ? s : f;
}

fg_status fg_kernel_launch_backward(fg_ctx *ctx, fg_kernel *k, const fg_attention_bwd_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, k, "NULL kernel");
    fg_attention_bwd_args b;
    fg_attention_args fwd;
    FGI_TRY(fgi_attn_bwd_args_in(ctx, args, &b, &fwd));
    return launch(ctx, k, &b, -1, NULL);
}

/* The workspace launch(k, b, lead) would use. */
static fg_status workspace_of(fg_ctx *ctx, fg_kernel *k, const fg_attention_bwd_args *b, int lead, size_t *bytes) {
    bwd_plan p;
    FGI_TRY(plan_launch(ctx, k, b, lead, &p));
    *bytes = p.total;
    return FG_OK;
}

fg_kernel_config fgi_attn_bwd_config(fg_dtype dtype, int head_dim) {
    fg_kernel_config cfg = fg_kernel_config_init();
    cfg.kind = FG_KERNEL_ATTENTION_BWD;
    cfg.dtype = dtype;
    cfg.head_dim = head_dim;
    return cfg;
}

/* fg_attention_backward's config for `fwd`: the -lead kernel where its
 * order pays, with the leading tiles it starts first in *lead, else the
 * -pairs kernel where that order pays (the portable row has neither form
 * and ignores the flags). */
static fg_kernel_config chosen_config(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *b, int *lead) {
    const fg_attention_args *fwd = b->fwd;
    fg_kernel_config cfg = fgi_attn_bwd_config(fwd->dtype, fwd->head_dim);
    const fgi_kernel_entry *h = fgi_kernel_find(FG_KERNEL_ATTENTION_BWD_SM90);
    const fgi_kernel_geom g = h->geometry(&cfg, mod, FGI_BWD_DKDV);
    /* the pass weighed once, for both orders */
    fgi_bwd_tiles t;
    const fgi_bwd_tiles *w = pass_tiles(ctx, fwd, g.block_n, &t) ? &t : NULL;
    *lead = lead_tiles_of(ctx, fwd, g.block_n, w);
    int from;
    /* the tail split runs on the -lead kernel (its one-dimensional grid) */
    cfg.lead_first = *lead > 0 || tail_pieces_of(ctx, b, g.block_n, g.block_m, &from) > 0;
    cfg.head_pairs = !cfg.lead_first && head_pairs_of(ctx, mod, fwd, w);
    return cfg;
}

/* fg_attention_backward's kernel choice, shared by the call, its
 * workspace size and fg_attention_backward_kernel_for: the kernel
 * fg_kernel_get picks, and the portable one where the Hopper kernel refuses
 * the call. With `bytes` the chosen kernel's workspace is reported instead
 * of launching; with `out` the kernel is handed over instead (its
 * workspace planned, not launched). */
static fg_status on_chosen_kernel(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                  size_t *bytes, const CUdeviceptr *sums, fg_kernel **out) {
    fg_attention_bwd_args b;
    fg_attention_args fwd;
    FGI_TRY(fgi_attn_bwd_args_in(ctx, args, &b, &fwd));
    fgi_attn_strides st;
    fgi_attn_bwd_strides bs;
    FGI_TRY(fgi_attn_check_bwd_args(ctx, mod, &b, &st, &bs));
    /* before a compile that could not be used */
    FGI_CHECK_ARG(ctx, fwd.lse, "the backward needs the forward's lse (fg_attention_args.lse is NULL)");
    int lead = 0;
    const fg_kernel_config cfg = chosen_config(ctx, mod, &b, &lead);
    size_t unused = 0;
    if (out) bytes = &unused;
    fg_kernel *k;
    FGI_TRY(fg_kernel_get(ctx, mod, &cfg, &k));
    fg_status s = bytes ? workspace_of(ctx, k, &b, lead, bytes) : launch(ctx, k, &b, lead, sums);
    const bool retry = s == FG_ERR_NOT_SUPPORTED && k->kernel->variant == FGI_VARIANT_SM90;
    if (retry || !out || s != FG_OK) fg_kernel_release(k);
    if (retry) {
        /* A layout TMA cannot describe, or blocks under its steps: the
         * portable backward takes them (it refuses nothing the Hopper one
         * accepts, so its error, if any, is the one to report). */
        FGI_TRY(fgi_attn_kernel_get(ctx, mod, &cfg, false, &k));
        s = bytes ? workspace_of(ctx, k, &b, lead, bytes) : launch(ctx, k, &b, lead, sums);
        if (!out || s != FG_OK) fg_kernel_release(k);
    }
    if (out && s == FG_OK) *out = k;
    return s;
}

fg_status fg_attention_backward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    return on_chosen_kernel(ctx, mod, args, NULL, NULL, NULL);
}

fg_status fg_attention_backward_kernel_for(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                           fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output pointer");
    *out = NULL;
    return on_chosen_kernel(ctx, mod, args, NULL, NULL, out);
}

fg_status fg_attention_backward_workspace_size(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                               size_t *bytes) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && bytes, "NULL mod or output pointer");
    *bytes = 0;
    FGI_TRY(on_chosen_kernel(ctx, mod, args, bytes, NULL, NULL));
    fgi_clear_error(ctx);
    return FG_OK;
}

fg_status fgi_attention_backward_into_sums(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                           const CUdeviceptr *sums) {
    FGI_CHECK_ARG(ctx, mod && sums, "NULL mod or sums");
    return on_chosen_kernel(ctx, mod, args, NULL, sums, NULL);
}

fg_status fgi_attention_backward_sums_to_float(fg_ctx *ctx, const fg_mod *mod, fg_dtype dtype, int head_dim,
                                               CUdeviceptr sums, float *out, int64_t n, void *stream) {
    if (n <= 0) return FG_OK;
    const fg_kernel_config cfg = fgi_attn_bwd_config(dtype, head_dim);
    fg_kernel *k;
    FGI_TRY(fg_kernel_get(ctx, mod, &cfg, &k));
    CUdeviceptr acc = sums, dst = (CUdeviceptr)(uintptr_t)out;
    long long len = n;
    void *fx_args[3] = {&acc, &dst, &len};
    const unsigned g[3] = {(unsigned)((n + 127) / 128), 1, 1};
    fg_status s = fgi_kernel_check_context(ctx, k);
    if (s == FG_OK) s = fgi_kernel_run(ctx, k, FGI_BWD_FIXED, g, fx_args, stream);
    fg_kernel_release(k);
    return s;
}

fg_status fgi_attn_resolve_grads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *b, fgi_grad_layout *L,
                                 const void *out[FGI_MAX_GRAD_BUFFERS], int64_t len[FGI_MAX_GRAD_BUFFERS]) {
    fgi_value bound[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bind(ctx, mod, b->fwd->binds, b->fwd->nbinds, bound));
    fgi_mod_grad g;
    FGI_TRY(fgi_mod_derive(ctx, mod, &g));
    fgi_grad_layout_compute(&g, L);
    fgi_mod_grad_free(&g);
    return fgi_attn_grad_binds(ctx, mod, L, b->grad_binds, b->ngrad_binds, bound, out, len);
}

/* ---- the reference ----------------------------------------------------------------- */

fg_status fg_attention_reference_backward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    fg_attention_bwd_args b;
    fg_attention_args fwd;
    FGI_TRY(fgi_attn_bwd_args_in(ctx, args, &b, &fwd));
    fgi_attn_strides st;
    fgi_attn_bwd_strides bs;
    FGI_TRY(fgi_attn_check_bwd_args(ctx, mod, &b, &st, &bs));
    fgi_grad_layout L;
    const void *grads[FGI_MAX_GRAD_BUFFERS];
    int64_t glen[FGI_MAX_GRAD_BUFFERS];
    FGI_TRY(fgi_attn_resolve_grads(ctx, mod, &b, &L, grads, glen));
    double *per_param[FGI_MAX_PARAMS] = {0};
    for (int i = 0; i < L.n; i++) per_param[L.param[i]] = (double *)grads[i];
    fgi_ref_bwd_out out = {.dout = b.dout, .dlse = b.dlse, .dq = b.dq, .dk = b.dk, .dv = b.dv, .buf_grads = per_param};
    memcpy(out.dout_stride, b.dout_stride, sizeof out.dout_stride);
    return fgi_attention_reference_backward(ctx, mod, &fwd, &out);
}
