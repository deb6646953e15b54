/*
 * decode.c -- the decode path of the forward: when fg_attention_forward
 * takes the decode kernel, how a decode launch is laid out, and the host
 * check of a block table.
 *
 * A decode launch (templates/attention/attention_decode.cuh):
 *   1. the forward's argument block plus the decode fields of abi.def: the
 *      GQA group, the packed rows (group x q_len) and their row tiles, the
 *      ragged and paged arrays;
 *   2. the entry point: tiles of 16, 32 or 64 packed rows, the smallest
 *      that holds a sequence's rows of one KV head (more rows take several
 *      tiles); with a block mask every row of a tile must read one mask
 *      row (see block_mask_args);
 *   3. the split count (choose_split): enough thread blocks to fill every
 *      SM once with resident blocks, never more than a split per 2 K/V
 *      tiles nor FGI_DEC_MAX_SPLIT;
 *   4. with 2 to 8 splits on a Hopper GPU that holds them as thread block
 *      clusters, one launch whose clusters merge their own splits; else,
 *      with more than one split, fp32 workspace for the parts (the
 *      caller's, fg_attention_args.workspace, when large enough; else the
 *      library pool's for this call), the walk, the merge -- all on the
 *      caller's stream.
 * With KV heads in pairs (the -pairs kernel, head dim 64) steps 1-3 see
 * the call as the walk does (pair_view): half the KV heads, each row the
 * pair's two rows side by side (the head stride doubled), twice the query
 * heads per KV head.
 */
#include "attention/attention.h"

#include "blockmask/blockmask.h"

#include <string.h>

bool fgi_attn_takes_decode(const fg_ctx *ctx, const fg_attention_args *a) {
    if (ctx->decode_kernel == 0) return false;
    return ctx->decode_kernel == 2 || a->q_len <= FG_DECODE_MAX_Q;
}

/* ---- the launch ----------------------------------------------------------------- */

/* A block mask the decode tiles can walk: its kv blocks whole K/V tiles
 * (64 rows, or 128 in a kernel made for kv blocks of 128), and one mask
 * row per tile of packed rows -- a group of one (the tile's rows are
 * queries of one head, never more than a q block of them: plan_decode
 * picks the tile), or every row in one tile with the mask's heads
 * broadcast and q_len inside one q block. */
bool fgi_attn_decode_walks(const fg_attention_args *a) {
    if (!a->block_mask) return true;
    const fg_block_mask_desc *d = &a->block_mask->desc;
    const int group = a->heads_q / a->heads_kv;
    const bool one_row = group == 1 || (group * a->q_len <= 64 && d->heads == 1 && a->q_len <= d->q_block);
    return d->kv_block % FGI_DEC_BLOCK_N == 0 && one_row;
}

/* The block mask's fields of the argument block, for a mask the decode
 * tiles of `block_n` rows can walk (FG_ERR_NOT_SUPPORTED otherwise). */
static fg_status block_mask_args(fg_ctx *ctx, const fg_attention_args *a, int block_n, fgi_attn_abi *abi) {
    fg_block_mask *m = (fg_block_mask *)a->block_mask; /* uploading is a cache fill */
    const fg_block_mask_desc *d = &m->desc;
    FGI_TRY(fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, d->q_block, d->kv_block));
    if (d->kv_block % block_n)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask kv blocks of %d: this decode kernel walks tiles of %d rows (a kernel made "
                         "for kv blocks under 128 walks tiles of %d)",
                         d->kv_block, block_n, FGI_DEC_BLOCK_N);
    if (!fgi_attn_decode_walks(a))
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask blocks %d x %d over %d heads: the decode kernel walks kv blocks of "
                         "multiples of %d, and with grouped query heads a mask broadcast over heads "
                         "with q_len (%d) inside one q block",
                         d->q_block, d->kv_block, d->heads, FGI_DEC_BLOCK_N, a->q_len);
    return fgi_attn_abi_block_mask(ctx, m, abi);
}

/* ---- KV heads in pairs ------------------------------------------------------------ */

/* A K or V tensor's head stride as the kernels read it (fgi_attn_check_args's
 * effective strides): all zero means [num_pages, page, heads_kv, D] when
 * paged, [batch, heads_kv, len, D] otherwise. */
static int64_t head_stride(const fg_attention_args *a, const int64_t st[4]) {
    if (st[0] || st[1] || st[2] || st[3]) return st[1];
    return a->block_table ? a->head_dim : (int64_t)a->kv_len * a->head_dim;
}

/* Whether the pair's rows lie side by side in k and v: an even number of
 * KV heads, each head's row starting head_dim elements after the one
 * before. */
static bool pairs_fit(const fg_attention_args *a) {
    return a->heads_kv % 2 == 0 && head_stride(a, a->k_stride) == a->head_dim &&
           head_stride(a, a->v_stride) == a->head_dim;
}

/* The call as a walk over KV heads in pairs sees it. */
static fg_attention_args pair_view(const fg_attention_args *a) {
    fg_attention_args p = *a;
    p.heads_kv /= 2;
    return p;
}

/* Chosen (-1): one KV head a walk where a block mask of a local mask
 * makes every walk a few tiles: there the pairs' tiles of twice the bytes
 * each wait as long as one head's, and half as many walk at once (paged
 * sliding_window at head dim 64 +9-12% one head a walk; long walks 0.3-6%
 * faster in pairs: bench/attention_notes.md, decode d48). */
bool fgi_attn_decode_pairs(const fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a) {
    if (!ctx->decode_head_pairs || a->head_dim != 64 || !pairs_fit(a)) return false;
    if (ctx->decode_head_pairs < 0 && a->block_mask && mod && fgi_mask_is_local(mod)) return false;
    const fg_attention_args p = pair_view(a);
    return fgi_attn_decode_walks(&p);
}

/* Splits of each (sequence, KV head, row tile)'s walk. Chosen: the blocks
 * that are resident at once on every SM (two per SM up to head dim 128,
 * whose shared memory allows two; one over it) divided by the walks,
 * rounded down so that the grid is one full wave, at least 1; or the
 * context's FG_OPT_DECODE_SPLITS. Either way at most one split per 2
 * tiles of the longest walk and FGI_DEC_MAX_SPLIT, and no empty split:
 * the kernel gives each split ceil(tiles / n) tiles, so n is lowered to
 * the fewest splits that take the same tiles each (33 splits of 1024
 * tiles would be 32 of 32 and an empty one). */
static int choose_split(const fg_ctx *ctx, int sms, const fg_attention_args *a, int row_tiles, int block_n) {
    const int64_t walks = (int64_t)a->batch * a->heads_kv * row_tiles;
    const int64_t slots = (int64_t)sms * (a->head_dim <= 128 ? 2 : 1);
    int64_t n = ctx->decode_splits ? ctx->decode_splits : slots / walks;
    const int64_t tiles = (a->kv_len + block_n - 1) / block_n;
    if (n > (tiles + 1) / 2) n = (tiles + 1) / 2;
    if (n > FGI_DEC_MAX_SPLIT) n = FGI_DEC_MAX_SPLIT;
    if (n < 1) return 1;
    const int64_t per = (tiles + n - 1) / n;
    return (int)((tiles + per - 1) / per);
}

/* How a decode call is laid out: the entry point (by packed rows, and
 * with a one-row-per-q-block mask of a group of one, no taller than the
 * mask's q blocks), the packed rows and their tiles, the split count (of
 * a walk in K/V tiles of `block_n` rows), and the workspace of the parts
 * (lse, then o; 0 bytes without a split). */
typedef struct decode_plan {
    int entry, group, rows, row_tiles, n_split;
    size_t lse_bytes, ws_bytes;
} decode_plan;

static fg_status plan_decode(fg_ctx *ctx, const fg_attention_args *a, int block_n, bool pairs, decode_plan *p) {
    memset(p, 0, sizeof *p);
    p->group = a->heads_q / a->heads_kv;
    int64_t rows = (int64_t)p->group * a->q_len;
    /* A pair's rows (the -pairs walk): its two heads' group x q_len rows
     * one after the other; 9 to 16 a head are padded to 16, so that each
     * of the 32-row walk's two slabs is one head's (fgd_row_of, HALF); 8 or
     * fewer share the 16-row walk's slab, more take the 64-row walk. */
    const int64_t per_head = rows / 2;
    if (pairs && per_head > 8 && per_head < 16) rows = 32;
    if (rows > (1 << 30))
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "group %d x q_len %d packed rows are too many", p->group,
                         a->q_len);
    p->entry = rows <= 16 ? FGI_DEC_R16 : rows <= 32 ? FGI_DEC_R32 : FGI_DEC_R64;
    if (a->block_mask && p->group == 1) {
        /* rows of one tile inside one q block */
        const int qb = a->block_mask->desc.q_block;
        while (fgi_dec_tile_rows(p->entry) > qb && p->entry > FGI_DEC_R16) p->entry--;
    }
    const int rb = fgi_dec_tile_rows(p->entry);
    p->rows = (int)rows;
    p->row_tiles = (int)((rows + rb - 1) / rb);
    if ((int64_t)a->heads_kv * p->row_tiles > 65535 || a->batch > 65535)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "heads_kv %d x %d row tiles and batch %d must each be <= 65535", a->heads_kv, p->row_tiles,
                         a->batch);
    int sms;
    FGI_TRY(fgi_cuda_sm_count(ctx, &sms));
    p->n_split = choose_split(ctx, sms, a, p->row_tiles, block_n);
    const size_t prows = (size_t)a->batch * (size_t)a->heads_q * (size_t)a->q_len;
    if (p->n_split > 1) {
        if (prows > INT32_MAX) /* the merge's grid: a block per row */
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "batch %d x heads %d x q_len %d rows are too many", a->batch,
                             a->heads_q, a->q_len);
        p->lse_bytes = fgi_attn_ws_round(prows * (size_t)p->n_split * 4);
        p->ws_bytes = fgi_attn_ws_round(p->lse_bytes + prows * (size_t)p->n_split * (size_t)a->head_dim * 4);
    }
    return FG_OK;
}

/* The walk's entry point (by the plan's tile, paged or not) and grid:
 * (splits, KV heads x row tiles, batch) of the walk's view of the call. */
static int walk_entry(const fg_attention_args *walk, const decode_plan *p, unsigned grid[3]) {
    grid[0] = (unsigned)p->n_split, grid[1] = (unsigned)(walk->heads_kv * p->row_tiles), grid[2] = (unsigned)walk->batch;
    return p->entry + (walk->block_table ? FGI_DEC_PAGED - FGI_DEC_R16 : 0);
}

/* Whether a walk of 2 to 8 splits runs as one thread block cluster: where
 * the GPU holds every cluster at once (the split count assumed one wave).
 * Its blocks then merge their parts among themselves (attention_decode.cuh):
 * no parts to store, no merge to launch. */
static bool merges_in_clusters(fg_ctx *ctx, fg_kernel *k, const decode_plan *p, int entry, const unsigned grid[3]) {
    const int64_t blocks = (int64_t)grid[0] * grid[1] * grid[2];
    return p->n_split >= 2 && p->n_split <= FGI_CLUSTER_MAX &&
           (int64_t)fgi_kernel_clusters(ctx, k, entry, p->n_split) * p->n_split >= blocks;
}

/* The call as the walk of a kernel of `cfg` sees it (pair_view with KV
 * heads in pairs), and that walk's plan. */
static fg_status plan_walk(fg_ctx *ctx, const fg_attention_args *a, const fg_kernel_config *cfg,
                           fg_attention_args *walk, decode_plan *p) {
    *walk = cfg->head_pairs ? pair_view(a) : *a;
    return plan_decode(ctx, walk, fgi_dec_block_n(cfg), cfg->head_pairs, p);
}

fg_status fgi_attn_decode_workspace(fg_ctx *ctx, const fg_attention_args *a, const fg_kernel_config *cfg,
                                    size_t *bytes) {
    fg_attention_args walk;
    decode_plan p;
    FGI_TRY(plan_walk(ctx, a, cfg, &walk, &p));
    *bytes = p.ws_bytes;
    return FG_OK;
}

fg_status fgi_attn_decode_clustered(fg_ctx *ctx, const fg_attention_args *a, fg_kernel *k, bool *clustered) {
    fg_attention_args walk;
    decode_plan p;
    FGI_TRY(plan_walk(ctx, a, &k->config, &walk, &p));
    unsigned grid[3];
    const int entry = walk_entry(&walk, &p, grid);
    *clustered = merges_in_clusters(ctx, k, &p, entry, grid);
    return FG_OK;
}

fg_status fgi_attn_decode_launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a) {
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_call(ctx, k, a, &st));
    FGI_TRY(fgi_attn_check_io_aligned(ctx, a, &st));
    FGI_TRY(fgi_kernel_check_context(ctx, k));
    if (k->config.head_pairs) {
        if (a->heads_kv % 2 != 0 || st.k[1] != a->head_dim || st.v[1] != a->head_dim)
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "the -pairs decode kernel walks KV heads in pairs: it needs an even number of KV heads "
                             "whose k and v rows lie side by side (head stride %d); this call has %d KV heads, "
                             "head strides %lld and %lld",
                             a->head_dim, a->heads_kv, (long long)st.k[1], (long long)st.v[1]);
        st.k[1] *= 2, st.v[1] *= 2;
    }
    fg_attention_args walk;
    decode_plan plan;
    FGI_TRY(plan_walk(ctx, a, &k->config, &walk, &plan));
    a = &walk;
    const int block_n = k->geom[FGI_DEC_R16].block_n;
    fgi_attn_abi abi;
    memset(&abi, 0, sizeof abi);
    FGI_ATTN_ABI_FILL_COMMON(&abi, a, &st);
    if (a->block_mask) FGI_TRY(block_mask_args(ctx, a, block_n, &abi));
    abi.group = plan.group;
    abi.rows = plan.rows;
    abi.row_tiles = plan.row_tiles;
    abi.n_split = plan.n_split;
    FGI_TRY(fgi_attn_abi_seq(ctx, a, &abi));

    fgi_param_blob blob;
    FGI_TRY(fgi_kernel_pack_params(ctx, k, a->binds, a->nbinds, &blob, NULL));

    void *params[2] = {&abi, blob.bytes};
    unsigned grid[3];
    const int entry = walk_entry(a, &plan, grid);
    if (merges_in_clusters(ctx, k, &plan, entry, grid))
        return fgi_kernel_run_cluster(ctx, k, entry, grid, plan.n_split, params, a->stream);

    /* The parts: in the caller's workspace when it is large enough, else
     * from the library's pool for this call. */
    const int64_t prows = (int64_t)a->batch * a->heads_q * a->q_len;
    fgi_attn_ws w;
    CUdeviceptr base;
    FGI_TRY(fgi_attn_ws_take(ctx, &w, a->workspace, a->workspace_size, plan.ws_bytes, a->stream, &base));
    if (base) {
        abi.lse_part = base;
        abi.o_part = base + plan.lse_bytes;
    }
    fg_status s = fgi_kernel_run(ctx, k, entry, grid, params, a->stream);
    if (s == FG_OK && abi.n_split > 1) {
        /* a thread block per output row, placed on the SMs as the walk's
         * blocks leave them (the walk is one wave: choose_split) */
        const unsigned mgrid[3] = {(unsigned)prows, 1, 1};
        s = fgi_kernel_run_dependent(ctx, k, FGI_DEC_MERGE, mgrid, params, a->stream);
    }
    fg_status f = fgi_attn_ws_free(ctx, &w, a->stream);
    return s != FG_OK ? s : f;
}

/* ---- the block table, on the host ------------------------------------------------- */

fg_status fg_block_table_check(fg_ctx *ctx, const fg_attention_args *args, const int32_t *block_table,
                               const int32_t *kv_lens) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, args && block_table, "NULL arguments or block table");
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, args, &a));
    FGI_TRY(fgi_attn_check_pages(ctx, &a));
    const int ps = a.page_size;
    if (a.batch < 1 || a.kv_len < 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "batch %d must be >= 1, kv_len %d >= 0", a.batch, a.kv_len);
    for (int b = 0; b < a.batch; b++) {
        int len = kv_lens ? kv_lens[b] : a.kv_len;
        if (len < 0 || len > a.kv_len)
            return fgi_error(ctx, FG_ERR_SHAPE, "sequence %d: KV length %d outside [0, kv_len %d]", b, len,
                             a.kv_len);
        const int used = (len + ps - 1) / ps;
        if (used > a.max_pages)
            return fgi_error(ctx, FG_ERR_SHAPE, "sequence %d: KV length %d needs %d pages, the table has %d", b,
                             len, used, a.max_pages);
        for (int i = 0; i < used; i++) {
            const int32_t page = block_table[(int64_t)b * a.max_pages + i];
            if (page < 0 || page >= a.num_pages)
                return fgi_error(ctx, FG_ERR_SHAPE,
                                 "block table: sequence %d, page %d (keys %d..%d) is %d, outside [0, %d)", b, i,
                                 i * ps, i * ps + ps - 1, (int)page, a.num_pages);
        }
    }
    return FG_OK;
}
