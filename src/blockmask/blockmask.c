/*
 * blockmask.c -- block masks on the host: the object, the CPU builder,
 * from_kv_blocks, the accessors, sparsity, the picture and the copies
 * between host and device. The GPU builder is in blockmask_gpu.c.
 *
 * Everything funnels through one intermediate form, the tile map: one byte
 * per (b, h, q block, kv block) tile, 0 empty / 1 partial / 2 full. The CPU
 * builder fills it from the evaluator, from_kv_blocks fills it from the
 * user's lists, and the GPU kernels fill the very same map on the device.
 * One compaction (tile map -> eight arrays) then serves all three, which is
 * what makes the builders agree bit for bit: ascending indices fall out of
 * scanning the map in order, and the tails of the index rows are zero.
 *
 * A mask that never reads h (or b) is the same for every head (batch
 * entry): both builders classify the tiles of head 0 only and let the
 * compaction copy them to the others. That is a plain property of the AST,
 * not a guess about which mask it is, and it makes B=4 x H=16 cost what
 * B=4 x H=1 costs.
 *
 * Classification only looks at in-range positions (q < q_len, kv < kv_len):
 * the last q / kv block of a ragged length is judged on the part that
 * exists. The evaluator is asked for exactly that clipped tile, so the mod
 * is never evaluated out of range either.
 *
 * The CPU builder walks the tiles row by row. The evaluator does one
 * vector-at-a-time walk of the mask's tree per chunk of lanes (a whole 128 x
 * 128 tile), over a strip of tiles of one q block at a time so that its
 * scratch is set up once per strip; classifying a tile is then a memchr scan
 * per row for the value opposite to its first element, which stops as soon
 * as the tile is known to be partial.
 */
#include "blockmask/blockmask.h"

#include "base/growable.h"
#include "codegen/codegen.h"
#include "driver/cudrv.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TILE_EMPTY = 0, TILE_PARTIAL = 1, TILE_FULL = 2 };

/* ---- geometry ---------------------------------------------------------- */

static bool is_block_size(int n) { return n >= 16 && n <= 256 && (n & (n - 1)) == 0; }

fg_status fgi_bm_normalise(fg_ctx *ctx, const fg_block_mask_desc *desc, fg_block_mask_desc *norm) {
    FGI_CHECK_ARG(ctx, desc && norm, "NULL block-mask description");
    fg_block_mask_desc in; /* the caller's struct in this library's layout */
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_block_mask_desc, desc, &in));
    desc = &in;
    *norm = *desc;
    if (norm->q_block == 0) norm->q_block = 128;
    if (norm->kv_block == 0) norm->kv_block = 128;
    if (norm->batch < 1 || norm->heads < 1)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask batch %d and heads %d must be >= 1",
                         desc->batch, desc->heads);
    if (norm->q_len < 1 || norm->kv_len < 1)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask q_len %d and kv_len %d must be >= 1",
                         desc->q_len, desc->kv_len);
    if ((int64_t)norm->q_offset + norm->q_len - 1 > INT32_MAX || (int64_t)norm->kv_offset + norm->kv_len - 1 > INT32_MAX)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask offsets %d / %d push the mod's indices past the int range",
                         norm->q_offset, norm->kv_offset);
    if (!is_block_size(norm->q_block) || !is_block_size(norm->kv_block))
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "block sizes %d x %d: each must be a power of two in [16, 256]",
                         desc->q_block, desc->kv_block);
    int64_t qb = (norm->q_len + (int64_t)norm->q_block - 1) / norm->q_block;
    int64_t kb = (norm->kv_len + (int64_t)norm->kv_block - 1) / norm->kv_block;
    /* Every array is indexed with int32 on the device; each factor is at
     * most 2^31, so checking step by step keeps the products in range. */
    int64_t tiles = (int64_t)norm->batch * norm->heads;
    if (tiles <= INT32_MAX / 2) tiles *= qb;
    if (tiles <= INT32_MAX / 2) tiles *= kb;
    if (tiles > INT32_MAX / 2)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask of %lld tiles is too large",
                         (long long)tiles);
    return FG_OK;
}

fg_status fgi_bm_new(fg_ctx *ctx, const fg_block_mask_desc *norm, fg_block_mask **out) {
    fg_block_mask *m = calloc(1, sizeof *m);
    if (!m) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (block mask)");
    m->desc = *norm;
    m->q_blocks = (norm->q_len + norm->q_block - 1) / norm->q_block;
    m->kv_blocks = (norm->kv_len + norm->kv_block - 1) / norm->kv_block;
    int64_t bh = (int64_t)norm->batch * norm->heads;
    int64_t qb = m->q_blocks, kb = m->kv_blocks;
    const int64_t counts[FGI_BM_NARRAYS] = {bh * qb, bh * qb * kb, bh * qb, bh * qb * kb,
                                            bh * kb, bh * kb * qb, bh * kb, bh * kb * qb};
    int64_t off = 0;
    for (int i = 0; i < FGI_BM_NARRAYS; i++) {
        m->count[i] = counts[i];
        m->offset[i] = off;
        off += counts[i];
    }
    m->total = off;
    m->cu_device = -1;
    *out = m;
    return FG_OK;
}

fg_status fgi_bm_alloc_host(fg_ctx *ctx, fg_block_mask *m) {
    if (m->host_block) return FG_OK;
    m->host_block = calloc((size_t)m->total, sizeof(int32_t));
    if (!m->host_block) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (block mask arrays)");
    for (int i = 0; i < FGI_BM_NARRAYS; i++) m->host[i] = m->host_block + m->offset[i];
    return FG_OK;
}

void fgi_bm_free_device(fg_block_mask *m) {
    /* Device memory only exists after fgi_cuda_ready succeeded, so the
     * driver table is loaded. A failure here (context already gone) leaves
     * nothing to clean up that the driver does not reclaim itself. */
    if (m->device_block) fgi_cu()->cuMemFree((CUdeviceptr)m->device_block);
    if (m->tiles) fgi_cu()->cuMemFree((CUdeviceptr)m->tiles);
    /* the counts' copy may still be landing in the pinned memory */
    if (m->counts_event) {
        if (m->counts_queued) fgi_cu()->cuEventSynchronize((CUevent)m->counts_event);
        fgi_cu()->cuEventDestroy((CUevent)m->counts_event);
    }
    if (m->counts_host) fgi_cu()->cuMemFreeHost(m->counts_host);
    m->counts_event = NULL;
    m->counts_host = NULL;
    m->counts_queued = false;
    m->device_block = 0;
    m->tiles = 0;
    memset(m->device, 0, sizeof m->device);
    m->device_valid = false;
}

void fg_block_mask_destroy(fg_block_mask *mask) {
    if (!mask) return;
    fgi_bm_free_device(mask);
    fgi_codegen_free(mask->cg);
    free(mask->cg);
    free(mask->host_block);
    free(mask);
}

/* ---- tile map -> the eight arrays ---------------------------------------- */

/* One compacted list: the indices i in [0, n) whose tile (read at
 * tiles[i * stride]) has class `want`, ascending, then zeros. */
static int32_t compact_list(const uint8_t *tiles, int n, int64_t stride, uint8_t want,
                            int32_t *indices) {
    int32_t k = 0;
    for (int i = 0; i < n; i++)
        if (tiles[i * stride] == want) indices[k++] = i;
    memset(indices + k, 0, (size_t)(n - k) * sizeof *indices);
    return k;
}

/* Fill the host arrays of m from a tile map [B'][H'][QB][KB], where B' is
 * B when per_b and 1 otherwise (the map then holds the tiles of b = 0 for
 * every b), and H' likewise. */
static void arrays_from_tiles(fg_block_mask *m, const uint8_t *tiles, bool per_b, bool per_h) {
    const int QB = m->q_blocks, KB = m->kv_blocks, H = m->desc.heads;
    const int64_t bh_count = (int64_t)m->desc.batch * H;
    int32_t **a = m->host;
    for (int64_t bh = 0; bh < bh_count; bh++) {
        int64_t src = (per_b ? bh / H : 0) * (per_h ? H : 1) + (per_h ? bh % H : 0);
        const uint8_t *t = tiles + src * QB * KB;
        for (int qb = 0; qb < QB; qb++) {
            int64_t row = bh * QB + qb;
            a[0][row] = compact_list(t + (int64_t)qb * KB, KB, 1, TILE_PARTIAL, a[1] + row * KB);
            a[2][row] = compact_list(t + (int64_t)qb * KB, KB, 1, TILE_FULL, a[3] + row * KB);
        }
        for (int kb = 0; kb < KB; kb++) {
            int64_t col = bh * KB + kb;
            a[4][col] = compact_list(t + kb, QB, KB, TILE_PARTIAL, a[5] + col * QB);
            a[6][col] = compact_list(t + kb, QB, KB, TILE_FULL, a[7] + col * QB);
        }
    }
    m->host_valid = true;
}

/* ---- which of b and h the mask reads ------------------------------------------ */

static void expr_uses(const fgi_expr *e, bool *ub, bool *uh) {
    if (!e) return;
    if (e->kind == FGI_E_ARG) {
        *ub |= e->op == FGI_ARG_B;
        *uh |= e->op == FGI_ARG_H;
    }
    expr_uses(e->a, ub, uh);
    expr_uses(e->b, ub, uh);
    expr_uses(e->c, ub, uh);
    for (int i = 0; i < e->nargs; i++) expr_uses(e->args[i], ub, uh);
}

static void node_uses(const fgi_mask_node *n, bool *ub, bool *uh) {
    if (!n) return;
    if (n->op == FGI_MASK_LEAF && n->func) {
        for (int i = 0; i < n->func->nlocals; i++) expr_uses(n->func->locals[i].init, ub, uh);
        expr_uses(n->func->ret, ub, uh);
    }
    node_uses(n->a, ub, uh);
    node_uses(n->b, ub, uh);
}

void fgi_bm_mask_uses(const fg_mod *mod, bool *uses_b, bool *uses_h) {
    *uses_b = *uses_h = false;
    node_uses(mod->mask, uses_b, uses_h);
}

/* ---- the CPU builder ------------------------------------------------------ */

/* Classify the tile of nk columns at `v` (rows of `pitch` bytes): look for
 * the value opposite to the first element, row by row, stopping as soon as
 * it turns up. */
static uint8_t classify(const uint8_t *v, int nq, int nk, size_t pitch) {
    int other = !v[0];
    for (int r = 0; r < nq; r++)
        if (memchr(v + (size_t)r * pitch, other, (size_t)nk)) return TILE_PARTIAL;
    return v[0] ? TILE_FULL : TILE_EMPTY;
}

/* The evaluator is asked for a strip of tiles at once (one q block by up to
 * STRIP_LANES / q_block columns): the same tree walk per chunk of lanes,
 * but its scratch is set up once per strip instead of once per tile. */
#define STRIP_LANES ((size_t)1 << 20)

/* Classify the tiles of (b, h) in [0, nb) x [0, nh) into a map [nb][nh]. */
static fg_status classify_all(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values,
                              const fg_block_mask *m, int nb, int nh, uint8_t *tiles,
                              uint8_t *scratch, int strip_blocks) {
    const fg_block_mask_desc *d = &m->desc;
    const int QB = m->q_blocks, KB = m->kv_blocks;
    for (int b = 0; b < nb; b++)
        for (int h = 0; h < nh; h++)
            for (int qb = 0; qb < QB; qb++) {
                int q0 = qb * d->q_block;
                int nq = d->q_len - q0 < d->q_block ? d->q_len - q0 : d->q_block;
                uint8_t *trow = tiles + (((int64_t)b * nh + h) * QB + qb) * KB;
                for (int kb0 = 0; kb0 < KB; kb0 += strip_blocks) {
                    int k0 = kb0 * d->kv_block;
                    int kend = (kb0 + strip_blocks) * d->kv_block;
                    int width = (kend < d->kv_len ? kend : d->kv_len) - k0;
                    FGI_TRY(fgi_eval_mask(ctx, mod, values, b, h, q0 + d->q_offset, nq, k0 + d->kv_offset, width,
                                          scratch));
                    for (int kb = kb0; kb < KB && kb < kb0 + strip_blocks; kb++) {
                        int c0 = (kb - kb0) * d->kv_block;
                        int nk = width - c0 < d->kv_block ? width - c0 : d->kv_block;
                        trow[kb] = classify(scratch + c0, nq, nk, (size_t)width);
                    }
                }
            }
    return FG_OK;
}

/* What both builders check and resolve before building: the pointers, the
 * normalised shape and the bound parameter values. */
fg_status fgi_bm_create_args(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc,
                             const fg_binding *binds, size_t nbinds, fg_block_mask **out,
                             fg_block_mask_desc *norm, fgi_value *values) {
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output pointer");
    *out = NULL;
    FGI_TRY(fgi_bm_normalise(ctx, desc, norm));
    return fgi_bind(ctx, mod, binds, nbinds, values);
}

fg_status fg_block_mask_create(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc,
                               const fg_binding *binds, size_t nbinds, fg_block_mask **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    fg_block_mask_desc norm;
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bm_create_args(ctx, mod, desc, binds, nbinds, out, &norm, values));

    fg_block_mask *m;
    FGI_TRY(fgi_bm_new(ctx, &norm, &m));
    fg_status st = fgi_bm_alloc_host(ctx, m);
    int64_t ntiles = m->count[1];
    uint8_t *tiles = st == FG_OK ? malloc((size_t)ntiles) : NULL;
    int strip = (int)(STRIP_LANES / ((size_t)norm.q_block * norm.kv_block));
    if (strip > m->kv_blocks) strip = m->kv_blocks;
    uint8_t *scratch = tiles ? malloc((size_t)strip * norm.q_block * norm.kv_block) : NULL;
    if (st == FG_OK && !scratch) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (tile map)");
    bool per_b, per_h;
    fgi_bm_mask_uses(mod, &per_b, &per_h);
    if (st == FG_OK)
        st = classify_all(ctx, mod, values, m, per_b ? norm.batch : 1, per_h ? norm.heads : 1,
                          tiles, scratch, strip);
    if (st == FG_OK) arrays_from_tiles(m, tiles, per_b, per_h);
    free(scratch);
    free(tiles);
    if (st != FG_OK) {
        fg_block_mask_destroy(m);
        return st;
    }
    m->mod_hash = mod->hash;
    *out = m;
    fgi_clear_error(ctx);
    return FG_OK;
}

/* ---- from_kv_blocks -------------------------------------------------------- */

/* Mark one row's list in the tile row, checking the count and that the
 * indices are in range, strictly ascending and not already marked. */
static fg_status mark_list(fg_ctx *ctx, const char *what, int64_t row, int KB, int32_t n,
                           const int32_t *idx, uint8_t cls, uint8_t *trow) {
    if (n < 0 || n > KB)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "%s_num_blocks[%lld] = %d is outside [0, %d]",
                         what, (long long)row, n, KB);
    for (int32_t i = 0; i < n; i++) {
        int32_t k = idx[i];
        if (k < 0 || k >= KB)
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "%s_indices[%lld][%d] = %d is outside [0, %d)", what, (long long)row,
                             i, k, KB);
        if (i > 0 && k <= idx[i - 1])
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "%s_indices[%lld] is not strictly ascending at entry %d (%d after %d)",
                             what, (long long)row, i, k, idx[i - 1]);
        if (trow[k] != TILE_EMPTY)
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "kv block %d of row %lld is listed both as partial and as full", k,
                             (long long)row);
        trow[k] = cls;
    }
    return FG_OK;
}

static fg_status tiles_from_lists(fg_ctx *ctx, const fg_block_mask *m, const int32_t *kv_num,
                                  const int32_t *kv_idx, const int32_t *full_num,
                                  const int32_t *full_idx, uint8_t *tiles) {
    const int KB = m->kv_blocks;
    for (int64_t row = 0; row < m->count[0]; row++) {
        uint8_t *trow = tiles + row * KB;
        FGI_TRY(mark_list(ctx, "kv", row, KB, kv_num[row], kv_idx + row * KB, TILE_PARTIAL, trow));
        if (full_num)
            FGI_TRY(mark_list(ctx, "full_kv", row, KB, full_num[row], full_idx + row * KB,
                              TILE_FULL, trow));
    }
    return FG_OK;
}

fg_status fg_block_mask_from_kv_blocks(fg_ctx *ctx, const fg_block_mask_desc *desc,
                                       const int32_t *kv_num_blocks, const int32_t *kv_indices,
                                       const int32_t *full_kv_num_blocks,
                                       const int32_t *full_kv_indices, fg_block_mask **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out && kv_num_blocks && kv_indices, "NULL kv_num_blocks, kv_indices or output");
    FGI_CHECK_ARG(ctx, !full_kv_num_blocks == !full_kv_indices,
                  "full_kv_num_blocks and full_kv_indices must both be given or both be NULL");
    *out = NULL;
    fg_block_mask_desc norm;
    FGI_TRY(fgi_bm_normalise(ctx, desc, &norm));
    fg_block_mask *m;
    FGI_TRY(fgi_bm_new(ctx, &norm, &m));
    fg_status st = fgi_bm_alloc_host(ctx, m);
    uint8_t *tiles = st == FG_OK ? calloc((size_t)m->count[1], 1) : NULL;
    if (st == FG_OK && !tiles) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (tile map)");
    if (st == FG_OK)
        st = tiles_from_lists(ctx, m, kv_num_blocks, kv_indices, full_kv_num_blocks,
                              full_kv_indices, tiles);
    if (st == FG_OK) arrays_from_tiles(m, tiles, true, true);
    free(tiles);
    if (st != FG_OK) {
        fg_block_mask_destroy(m);
        return st;
    }
    *out = m;
    fgi_clear_error(ctx);
    return FG_OK;
}

/* ---- accessors --------------------------------------------------------------- */

fg_status fg_block_mask_get_desc(const fg_block_mask *mask, fg_block_mask_desc *desc) {
    if (!mask || !desc) return FG_ERR_INVALID_ARGUMENT;
    *desc = mask->desc;
    return FG_OK;
}

fg_status fg_block_mask_array_get(const fg_block_mask *mask, fg_block_mask_array which,
                                  const int32_t **host, uint64_t *device, int64_t dims[4]) {
    if (!mask || which < FG_BM_KV_NUM_BLOCKS || which > FG_BM_FULL_Q_INDICES)
        return FG_ERR_INVALID_ARGUMENT;
    int s = fgi_bm_slot(which);
    bool by_q = s < 4; /* kv_* arrays are per q block, q_* per kv block */
    int outer = by_q ? mask->q_blocks : mask->kv_blocks;
    int inner = by_q ? mask->kv_blocks : mask->q_blocks;
    if (host) *host = mask->host_valid ? mask->host[s] : NULL;
    if (device) *device = mask->device_valid ? mask->device[s] : 0;
    if (dims) {
        dims[0] = mask->desc.batch;
        dims[1] = mask->desc.heads;
        dims[2] = outer;
        dims[3] = (s % 2 == 1) ? inner : 1;
    }
    return FG_OK;
}

fg_status fg_block_mask_sparsity(const fg_block_mask *mask, double *sparsity) {
    if (!mask || !sparsity || !mask->host_valid) return FG_ERR_INVALID_ARGUMENT;
    int64_t nonempty = 0;
    for (int64_t r = 0; r < mask->count[0]; r++) nonempty += mask->host[0][r] + mask->host[2][r];
    int64_t tiles = mask->count[1];
    *sparsity = 1.0 - (double)nonempty / (double)tiles;
    return FG_OK;
}

fg_status fgi_block_mask_check(fg_ctx *ctx, const fg_block_mask *mask, int batch, int heads,
                               int q_len, int kv_len, int q_block, int kv_block) {
    FGI_CHECK_ARG(ctx, mask, "NULL block mask");
    const fg_block_mask_desc *d = &mask->desc;
    if (d->batch != 1 && d->batch != batch)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask batch %d does not match %d (nor broadcast)",
                         d->batch, batch);
    if (d->heads != 1 && d->heads != heads)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask heads %d does not match %d (nor broadcast)",
                         d->heads, heads);
    if (d->q_len != q_len || d->kv_len != kv_len)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask lengths %d x %d do not match %d x %d",
                         d->q_len, d->kv_len, q_len, kv_len);
    if (d->q_block != q_block || d->kv_block != kv_block)
        return fgi_error(ctx, FG_ERR_SHAPE, "block mask blocks %d x %d do not match the kernel's %d x %d",
                         d->q_block, d->kv_block, q_block, kv_block);
    return FG_OK;
}

/* ---- the picture ----------------------------------------------------------------- */

/* One picture cell covering q blocks [q0, q1) x kv blocks [k0, k1): '#' when
 * every tile there is full, '.' when every one is empty, '+' otherwise. */
static char cell(const uint8_t *t, int KB, int q0, int q1, int k0, int k1) {
    bool any_full = false, any_empty = false, any_partial = false;
    for (int q = q0; q < q1; q++)
        for (int k = k0; k < k1; k++) {
            uint8_t c = t[(int64_t)q * KB + k];
            any_full |= c == TILE_FULL;
            any_empty |= c == TILE_EMPTY;
            any_partial |= c == TILE_PARTIAL;
        }
    if (!any_partial && !any_empty) return '#';
    if (!any_partial && !any_full) return '.';
    return '+';
}

/* The tile map of one (b, h), rebuilt from the kv_* arrays. */
static void tiles_of(const fg_block_mask *m, int64_t bh, uint8_t *t) {
    const int QB = m->q_blocks, KB = m->kv_blocks;
    memset(t, TILE_EMPTY, (size_t)QB * KB);
    for (int qb = 0; qb < QB; qb++) {
        int64_t row = bh * QB + qb;
        for (int i = 0; i < m->host[0][row]; i++) t[(int64_t)qb * KB + m->host[1][row * KB + i]] = TILE_PARTIAL;
        for (int i = 0; i < m->host[2][row]; i++) t[(int64_t)qb * KB + m->host[3][row * KB + i]] = TILE_FULL;
    }
}

static void picture_one(fgi_buf *out, const uint8_t *t, int QB, int KB, int rows, int cols) {
    int fr = (QB + rows - 1) / rows, fc = (KB + cols - 1) / cols;
    for (int q = 0; q < QB; q += fr) {
        for (int k = 0; k < KB; k += fc) {
            char c = cell(t, KB, q, q + fr < QB ? q + fr : QB, k, k + fc < KB ? k + fc : KB);
            fgi_buf_append(out, &c, 1);
        }
        fgi_buf_puts(out, "\n");
    }
}

#define PICTURE_MAX_HEADS 4

fg_status fg_block_mask_picture(const fg_block_mask *mask, int max_rows, int max_cols, char **text) {
    if (!mask || !text || max_rows < 0 || max_cols < 0 || !mask->host_valid)
        return FG_ERR_INVALID_ARGUMENT;
    *text = NULL;
    int rows = max_rows ? max_rows : 32, cols = max_cols ? max_cols : 64;
    const fg_block_mask_desc *d = &mask->desc;
    double sp = 0;
    fg_block_mask_sparsity(mask, &sp);
    fgi_buf out = {0};
    fgi_buf_printf(&out, "BlockMask(shape=(%d, %d, %d, %d), block=(%d, %d), sparsity=%.2f%%)\n",
                   d->batch, d->heads, d->q_len, d->kv_len, d->q_block, d->kv_block, 100.0 * sp);
    uint8_t *t = malloc((size_t)mask->q_blocks * mask->kv_blocks);
    if (!t) {
        fgi_buf_free(&out);
        return FG_ERR_OUT_OF_MEMORY;
    }
    int64_t bh_count = (int64_t)d->batch * d->heads;
    for (int64_t bh = 0; bh < bh_count && bh < PICTURE_MAX_HEADS; bh++) {
        fgi_buf_printf(&out, "(%lld, %lld)\n", (long long)(bh / d->heads), (long long)(bh % d->heads));
        tiles_of(mask, bh, t);
        picture_one(&out, t, mask->q_blocks, mask->kv_blocks, rows, cols);
    }
    if (bh_count > PICTURE_MAX_HEADS)
        fgi_buf_printf(&out, "... (%lld more (batch, head) pairs)\n",
                       (long long)(bh_count - PICTURE_MAX_HEADS));
    free(t);
    *text = fgi_buf_take(&out);
    return *text ? FG_OK : FG_ERR_OUT_OF_MEMORY;
}

/* ---- host <-> device ------------------------------------------------------------- */

static fg_status alloc_device(fg_ctx *ctx, fg_block_mask *m) {
    if (m->device_block) return FG_OK;
    CUdeviceptr p = 0;
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&p, (size_t)m->total * sizeof(int32_t)), "cuMemAlloc");
    m->device_block = (uint64_t)p;
    for (int i = 0; i < FGI_BM_NARRAYS; i++)
        m->device[i] = m->device_block + (uint64_t)m->offset[i] * sizeof(int32_t);
    m->cu_device = ctx->device;
    return FG_OK;
}

fg_status fgi_bm_alloc_device(fg_ctx *ctx, fg_block_mask *m) { return alloc_device(ctx, m); }

fg_status fg_block_mask_upload(fg_ctx *ctx, fg_block_mask *mask) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mask, "NULL block mask");
    FGI_CHECK_ARG(ctx, mask->host_valid, "block mask has no host arrays to upload");
    FGI_TRY(fgi_cuda_ready(ctx));
    FGI_TRY(alloc_device(ctx, mask));
    FGI_CU_TRY(ctx,
               fgi_cu()->cuMemcpyHtoD((CUdeviceptr)mask->device_block, mask->host_block,
                                      (size_t)mask->total * sizeof(int32_t)),
               "cuMemcpyHtoD (block mask)");
    mask->device_valid = true;
    return FG_OK;
}

fg_status fg_block_mask_download(fg_ctx *ctx, fg_block_mask *mask) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mask, "NULL block mask");
    FGI_CHECK_ARG(ctx, mask->device_valid, "block mask has no device arrays to download");
    FGI_TRY(fgi_cuda_ready(ctx));
    FGI_TRY(fgi_bm_alloc_host(ctx, mask));
    /* Synchronous copy on the legacy stream: waits for a build queued on it. */
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxSynchronize(), "cuCtxSynchronize (block mask)");
    FGI_CU_TRY(ctx,
               fgi_cu()->cuMemcpyDtoH(mask->host_block, (CUdeviceptr)mask->device_block,
                                      (size_t)mask->total * sizeof(int32_t)),
               "cuMemcpyDtoH (block mask)");
    mask->host_valid = true;
    return FG_OK;
}

fg_status fgi_block_mask_device_array(fg_ctx *ctx, fg_block_mask *mask, fg_block_mask_array which,
                                      uint64_t *ptr) {
    FGI_CHECK_ARG(ctx, mask && ptr, "NULL block mask or output");
    FGI_CHECK_ARG(ctx, which >= FG_BM_KV_NUM_BLOCKS && which <= FG_BM_FULL_Q_INDICES,
                  "bad block-mask array %d", (int)which);
    if (!mask->device_valid) FGI_TRY(fg_block_mask_upload(ctx, mask));
    *ptr = mask->device[fgi_bm_slot(which)];
    return FG_OK;
}
