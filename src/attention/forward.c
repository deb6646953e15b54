/*
 * forward.c -- the forward attention run API: fg_kernel_get,
 * fg_kernel_launch, fg_attention_forward.
 *
 * A forward launch is kernel.c's sequence with the forward's own parts:
 *   1. the checks every entry point shares (fgi_attn_check_args), then the
 *      kernel's: its dtype and head dim, the grid's limits, the alignment
 *      cp.async and the output stores need;
 *   2. the CUDA context the kernel was loaded in;
 *   3. the argument block (fgi_attn_abi, abi.def, mirrored in the
 *      template), with the block mask's device arrays checked against the
 *      kernel's tiles;
 *   4. the mod's parameters, bound and packed;
 *   5. for the Hopper kernel, tensor maps of q, k and v; then one launch of
 *      (q tiles, heads_q, batch) thread blocks.
 *
 * Variants: the portable kernel (templates/attention/attention_fwd.cuh,
 * mma.sync, sm_80 and newer) and the Hopper kernel (templates/attention/
 * attention_fwd_sm90.cuh, wgmma, sm_90a) share the entry signature and the
 * argument block; fg_kernel_get chooses between them (fgi_kernel_choose)
 * and the launch geometry comes from the chosen row. A layout TMA cannot
 * describe sends fg_attention_forward back to the portable kernel.
 */
#include "attention/attention.h"

#include "base/growable.h"
#include "blockmask/blockmask.h"

#include <limits.h>
#include <string.h>

/* ---- device-side checks --------------------------------------------------- */

static fg_status block_mask_args(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a,
                                 fgi_attn_abi *abi) {
    fg_block_mask *m = (fg_block_mask *)a->block_mask; /* uploading is a cache fill */
    const fg_block_mask_desc *d = &m->desc;
    if (k->config.dense)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "a block mask: this kernel (-dense, config.dense 1) serves calls without one; "
                         "the plain kernel (dense 0) takes block masks");
    const int bm = k->geom[0].q_align ? k->geom[0].q_align : k->geom[0].block_m, bn = k->geom[0].block_n;
    if (d->q_block % bm != 0 || d->kv_block % bn != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask blocks %d x %d: this %s kernel (head dim %d, configured for q "
                         "blocks of %d) needs q blocks that are multiples of %d and kv blocks "
                         "multiples of %d; smaller blocks need a kernel configured with them",
                         d->q_block, d->kv_block, fgi_variant_name(k->kernel->variant),
                         k->config.head_dim, k->config.q_block, bm, bn);
    FGI_TRY(fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, d->q_block,
                                 d->kv_block));
    FGI_TRY(fgi_attn_abi_block_mask(ctx, m, abi));
    /* a kernel whose q tiles merge two mask rows keeps their blocks' states
     * in shared memory: the portable kernel takes longer masks */
    const long long tiles = (long long)abi->bm_kv_blocks * (abi->bm_kv_block / bn);
    if (k->geom[0].q_align && tiles > FGI_FWD_SM90_MERGE_MAX_KB - 1)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "a block mask of %lld kv tiles of %d: the Hopper kernel at head dim %d walks at most %d",
                         tiles, bn, k->config.head_dim, FGI_FWD_SM90_MERGE_MAX_KB - 1);
    return FG_OK;
}

/* ---- the kernel ----------------------------------------------------------- */

/* The attention kernel for `config` (NULL: the forward's defaults) on this
 * device: the Hopper row of its operation where one applies and
 * `allow_hopper`, else the row asked for. */
fg_status fgi_attn_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                            bool allow_hopper, fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output pointer");
    *out = NULL;
    fg_kernel_config cfg = fg_kernel_config_init();
    const fgi_kernel_entry *asked;
    if (config) {
        FGI_TRY(FGI_STRUCT_IN(ctx, fg_kernel_config, config, &cfg));
        asked = fgi_kernel_find(cfg.kind);
        if (!asked || asked->op == FGI_KOP_BLOCK_MASK) {
            char fwd[160], bwd[80];
            fgi_kernel_kinds_text(FGI_KOP_ATTENTION_FWD, fwd, sizeof fwd);
            fgi_kernel_kinds_text(FGI_KOP_ATTENTION_BWD, bwd, sizeof bwd);
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "fg_kernel_get makes attention kernels (kind %s, %s, or "
                             "FG_KERNEL_ATTENTION_DECODE), got kind %d",
                             fwd, bwd, (int)cfg.kind);
        }
    } else {
        cfg.kind = FG_KERNEL_ATTENTION_FWD;
        asked = fgi_kernel_find(cfg.kind);
    }
    FGI_TRY(fgi_cuda_ready(ctx));
    const fgi_kernel_entry *row;
    FGI_TRY(fgi_kernel_choose(ctx, asked, &cfg, allow_hopper, &row));
    cfg.kind = row->kind;
    return fgi_kernel_make(ctx, mod, row, &cfg, out);
}

fg_status fg_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                        fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    return fgi_attn_kernel_get(ctx, mod, config, ctx->hopper_kernel != 0, out);
}

/* ---- launch ----------------------------------------------------------- */

static void fill_abi(const fg_kernel *k, const fg_attention_args *a, const fgi_attn_strides *st,
                     fgi_attn_abi *abi) {
    FGI_ATTN_ABI_FILL_COMMON(abi, a, st);
    abi->q_tiles = (a->q_len + k->geom[0].block_m - 1) / k->geom[0].block_m;
}

/* The Hopper kernel's third argument: q, k, v and out as [batch, heads,
 * len, D] tensor maps (fgi_attn_tensor_map: k's and v's boxes of the
 * geometry's block_n rows; q's of its q_box, or of its block_m where it
 * sets none; out's of a consumer's 64 rows, where the kernel stores O by
 * TMA). An out that TMA cannot describe (not 16-byte aligned) then sends
 * fg_attention_forward to the portable kernel. */
typedef struct hopper_maps {
    CUtensorMap q, k, v, o;
} hopper_maps;

static fg_status encode_maps(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a,
                             const fgi_attn_strides *st, hopper_maps *m) {
    const int q_box = k->geom[0].q_box ? k->geom[0].q_box : k->geom[0].block_m;
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->q, a->dtype, a->q, a->head_dim, a->q_len, a->heads_q, a->batch, st->q, q_box,
                                "q"));
    const int kv_box = k->geom[0].block_n;
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->k, a->dtype, a->k, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->k,
                                kv_box, "k"));
    FGI_TRY(fgi_attn_tensor_map(ctx, &m->v, a->dtype, a->v, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->v,
                                kv_box, "v"));
    /* out's map is read only by the kernels that store O by TMA (the
     * geometry's o_map); the others store O from registers and take any
     * 4-byte aligned out */
    memset(&m->o, 0, sizeof m->o);
    if (k->geom[0].o_map)
        FGI_TRY(fgi_attn_tensor_map(ctx, &m->o, a->dtype, a->out, a->head_dim, a->q_len, a->heads_q, a->batch, st->o,
                                    64, "out"));
    return FG_OK;
}

/* One forward launch of `a`, already in this library's layout. */
static fg_status launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a) {
    if (k->kernel->op == FGI_KOP_ATTENTION_DECODE) return fgi_attn_decode_launch(ctx, k, a);
    if (k->kernel->op != FGI_KOP_ATTENTION_FWD)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "fg_kernel_launch runs forward kernels; this one is the %s "
                         "(fg_kernel_launch_backward runs it)",
                         k->kernel->what);
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_call(ctx, k, a, &st));
    if (a->heads_q > 65535 || a->batch > 65535)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "heads_q %d and batch %d must be <= 65535",
                         a->heads_q, a->batch);
    if (fgi_attn_is_seq(a) && !k->config.ragged)
        return fgi_error(ctx, k->kernel->variant == FGI_VARIANT_SM90 ? FG_ERR_NOT_SUPPORTED : FG_ERR_INVALID_ARGUMENT,
                         "the call has kv_lens, q_offsets or a block table: it needs the forward kernel made "
                         "with config.ragged 1 (fg_attention_kernel_for fetches it), not the %s",
                         k->kernel->what);
    FGI_TRY(fgi_attn_check_io_aligned(ctx, a, &st));
    FGI_TRY(fgi_kernel_check_context(ctx, k));
    if (k->index_floats) {
        /* the kernel's (float)kv_idx - (float)q_idx is the mod's
         * (float)(kv_idx - q_idx) while both convert exactly */
        const long long lo = a->q_offset < a->kv_offset ? a->q_offset : a->kv_offset;
        const long long q_hi = (long long)a->q_offset + a->q_len - 1, kv_hi = (long long)a->kv_offset + a->kv_len - 1;
        const long long hi = q_hi > kv_hi ? q_hi : kv_hi;
        if (lo < -FGI_SPLIT_INDEX_FLOAT_MAX || hi > FGI_SPLIT_INDEX_FLOAT_MAX)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "indices %lld .. %lld: the %s computes this mod's (float)(kv_idx - q_idx) exactly for "
                             "indices up to 2^24 in magnitude; the portable kernel takes these",
                             lo, hi, k->kernel->what);
    }
    if (k->dist_floats) {
        /* the kernel's float distance is (float)(q_idx - kv_idx) while
         * every distance it forms converts exactly: those of the call's
         * positions, and of the rows and columns a tile reaches past
         * the ends (a q tile's 192 rows, a K/V tile's 176 columns) */
        const long long pad = 256;
        const long long d_hi = (long long)a->q_offset + a->q_len - 1 + pad - a->kv_offset;
        const long long d_lo = (long long)a->q_offset - ((long long)a->kv_offset + a->kv_len - 1 + pad);
        if (d_lo < -FGI_SPLIT_INDEX_FLOAT_MAX || d_hi > FGI_SPLIT_INDEX_FLOAT_MAX)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "distances %lld .. %lld: the %s computes this score_mod's (float)(q_idx - kv_idx) "
                             "exactly for distances up to 2^24 in magnitude; the portable kernel takes these",
                             d_lo, d_hi, k->kernel->what);
    }

    fgi_attn_abi abi;
    memset(&abi, 0, sizeof abi);
    fill_abi(k, a, &st, &abi);
    FGI_TRY(fgi_attn_abi_seq(ctx, a, &abi));
    if (a->block_mask) FGI_TRY(block_mask_args(ctx, k, a, &abi));

    fgi_param_blob blob;
    FGI_TRY(fgi_kernel_pack_params(ctx, k, a->binds, a->nbinds, &blob, NULL));

    hopper_maps maps; /* 64-byte aligned, as CUtensorMap is */
    if (k->kernel->variant == FGI_VARIANT_SM90) FGI_TRY(encode_maps(ctx, k, a, &st, &maps));
    void *params[3] = {&abi, blob.bytes, &maps};
    unsigned grid[3] = {(unsigned)abi.q_tiles, (unsigned)a->heads_q, (unsigned)a->batch};
    if (!k->geom[0].persistent) return fgi_kernel_run(ctx, k, 0, grid, params, a->stream);
    /* Persistent: a block per SM (one fits); each takes its first tile by
     * its index and the next ones from a counter zeroed before the launch
     * (in the call's workspace), in the order fgh_tile_of gives: sections
     * of l2_heads (batch, head) pairs (below), heaviest q blocks first.
     * The kernel counts tiles in an int. */
    int sms = 1;
    FGI_TRY(fgi_cuda_sm_count(ctx, &sms));
    /* A block's tile index goes up to tiles - 1 + its grid's size. */
    const long long tiles = (long long)abi.q_tiles * a->heads_q * a->batch;
    if (tiles > (long long)INT_MAX - sms)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "%lld q tiles: the Hopper forward counts at most %lld", tiles,
                         (long long)INT_MAX - sms);
    grid[0] = (unsigned)(tiles < sms ? tiles : sms);
    grid[1] = grid[2] = 1;
    /* With a block mask the tiles' weights differ: sections of the KV
     * heads whose K and V fit in 32 MB of L2 let the heaviest tiles of
     * several heads start first. Without one every tile walks the same
     * blocks, nothing needs balancing, and a section is one KV head's
     * query heads: the fewest K and V bytes read at once. */
    const double kv_head_bytes = 2.0 * a->kv_len * a->head_dim * 2.0; /* K and V, 16-bit */
    int fit = 1;
    if (a->block_mask)
        while (fit < 1024 && 2.0 * fit * kv_head_bytes <= 32.0 * 1024 * 1024) fit *= 2;
    abi.l2_heads = fit * (a->heads_q / a->heads_kv);
    fgi_attn_ws w;
    CUdeviceptr counter = 0;
    FGI_TRY(fgi_attn_ws_take(ctx, &w, a->workspace, a->workspace_size, FGI_FWD_WORKSPACE_BYTES, a->stream, &counter));
    fg_status rc = FG_OK;
    if (fgi_cu()->cuMemsetD32Async(counter, 0, 1, (CUstream)a->stream) != CUDA_SUCCESS)
        rc = fgi_error(ctx, FG_ERR_CUDA, "cuMemsetD32Async (the tile counter) failed");
    abi.tile_counter = (uint64_t)counter;
    if (rc == FG_OK) rc = fgi_kernel_run(ctx, k, 0, grid, params, a->stream);
    const fg_status freed = fgi_attn_ws_free(ctx, &w, a->stream);
    return rc != FG_OK ? rc : freed;
}

fg_status fg_kernel_launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, k, "NULL kernel");
    FGI_CHECK_ARG(ctx, a, "NULL attention arguments");
    fg_attention_args args;
    FGI_TRY(fgi_attn_args_in(ctx, a, &args));
    return launch(ctx, k, &args);
}

/* The forward's config for `a`: its kind (the decode kernel or the
 * forward one), dtype, head dim and block sizes. The kernels read the
 * block mask's geometry at run time; the forward's tile height depends
 * only on whether q blocks are under 128 rows, and blocks under 128 in
 * either direction keep the portable kernel, so a few configurations serve
 * every block size. */
static fg_kernel_config forward_config(const fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a,
                                       bool decode) {
    fg_kernel_config cfg = fg_kernel_config_init();
    cfg.kind = decode && fgi_attn_takes_decode(ctx, a) ? FG_KERNEL_ATTENTION_DECODE : FG_KERNEL_ATTENTION_FWD;
    cfg.dtype = a->dtype;
    cfg.head_dim = a->head_dim;
    const fg_block_mask_desc *bm = a->block_mask ? &a->block_mask->desc : NULL;
    cfg.kv_block = bm && bm->kv_block < 128 ? 64 : 128; /* the decode kernel's tile follows it */
    if (cfg.kind == FG_KERNEL_ATTENTION_FWD) {
        cfg.q_block = bm && bm->q_block < 128 ? 64 : 128;
        cfg.ragged = fgi_attn_is_seq(a);
        cfg.dense = !bm; /* the Hopper kernel's 176-row tiles where they apply */
    } else {
        cfg.head_pairs = fgi_attn_decode_pairs(ctx, mod, a);
    }
    return cfg;
}

/* The decode kernel where the call takes it and it takes the head dim
 * and the block mask, else the forward kernel: for per-sequence lengths,
 * positions or paged K/V its ragged form (forward_config), which only the
 * portable kernel has. */
fg_kernel_config fgi_attn_forward_kernel_config(const fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a) {
    fg_kernel_config cfg = forward_config(ctx, mod, a, true);
    if (cfg.kind == FG_KERNEL_ATTENTION_DECODE &&
        (!fgi_kernel_applies(fgi_kernel_find(cfg.kind), &cfg) || !fgi_attn_decode_walks(a)))
        cfg = forward_config(ctx, mod, a, false);
    return cfg;
}

static fg_status kernel_for(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, fg_kernel **out) {
    const fg_kernel_config cfg = fgi_attn_forward_kernel_config(ctx, mod, a);
    return fg_kernel_get(ctx, mod, &cfg, out);
}

fg_status fg_attention_kernel_for(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                  fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args && out, "NULL mod, arguments or output pointer");
    *out = NULL;
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, args, &a));
    return kernel_for(ctx, mod, &a, out);
}

fg_status fg_attention_workspace_size(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                      size_t *bytes) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args && bytes, "NULL mod, arguments or output pointer");
    *bytes = 0;
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, args, &a));
    if (a.batch < 1 || a.heads_q < 1 || a.heads_kv < 1 || a.q_len < 1 || a.kv_len < 1 || a.heads_q % a.heads_kv)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "batch %d, heads_q %d, heads_kv %d, q_len %d, kv_len %d: each must be >= 1, heads_q a "
                         "multiple of heads_kv",
                         a.batch, a.heads_q, a.heads_kv, a.q_len, a.kv_len);
    const fg_kernel_config cfg = forward_config(ctx, mod, &a, true);
    if (cfg.kind != FG_KERNEL_ATTENTION_DECODE || !fgi_kernel_applies(fgi_kernel_find(cfg.kind), &cfg) ||
        !fgi_attn_decode_walks(&a)) {
        *bytes = FGI_FWD_WORKSPACE_BYTES; /* the Hopper forward's tile counter */
        return FG_OK;
    }
    return fgi_attn_decode_workspace(ctx, &a, &cfg, bytes);
}

fg_status fg_attention_forward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args, "NULL mod or arguments");
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, args, &a));
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, mod, &a, &st));
    fg_kernel *k;
    FGI_TRY(kernel_for(ctx, mod, &a, &k));
    fg_status s = launch(ctx, k, &a);
    const fgi_kernel_entry *row = k->kernel;
    fg_kernel_release(k);
    if (s != FG_ERR_NOT_SUPPORTED) return s;
    /* What the chosen kernel cannot take, the portable forward can: a
     * layout TMA cannot describe (the Hopper kernel), a block mask the
     * decode tiles cannot walk (the forward kernel is tried as
     * kernel_for would pick it, then the portable one). */
    const fg_kernel_config cfg = forward_config(ctx, mod, &a, false);
    bool hopper = row->op == FGI_KOP_ATTENTION_DECODE && ctx->hopper_kernel != 0;
    for (int tries = 0; s == FG_ERR_NOT_SUPPORTED && tries < 2; tries++) {
        FGI_TRY(fgi_attn_kernel_get(ctx, mod, &cfg, hopper, &k));
        const bool was_hopper = k->kernel->variant == FGI_VARIANT_SM90;
        s = launch(ctx, k, &a);
        fg_kernel_release(k);
        if (!was_hopper) break;
        hopper = false;
    }
    return s;
}
