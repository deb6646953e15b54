/*
 * reference.c -- the CPU reference of the forward pass, the yardstick every
 * GPU result is measured against (tests, `flexgen check`).
 *
 * It computes the same function as the kernel with as little cleverness as
 * will still run at a few thousand positions: inputs converted to double
 * once per (b, h), dot products and softmax in double, and the mods run by
 * the evaluator over 64 x 64 tiles (one walk of the mod's tree per tile, so
 * the evaluator is not the bottleneck). The score handed to score_mod is
 * float(scale * q.k), what the kernel hands it in float32; everything after
 * the mod is double again.
 *
 * Which (q, kv) pairs take part follows FlexAttention's rules exactly, so the
 * reference also checks the kernel's block-mask walk: without a block mask a
 * pair is kept when mask_mod says so (all pairs when there is none); with a
 * block mask a pair in an empty block is dropped, in a full block kept
 * without asking mask_mod, and in a partial block kept when mask_mod says so.
 * The softmax is a two-pass one per row (maximum, then sums), so a fully
 * masked row is recognised before any exponential: output 0, LSE -inf.
 */
#include "reference/reference.h"

#include "base/parallel.h"

#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define REF_TILE 64

enum { ST_EMPTY = 0, ST_PARTIAL = 1, ST_FULL = 2 };

/* ---- 16-bit floats --------------------------------------------------------- */

/* Rows [0, len) of one (b, h) slab of a strided 16-bit tensor, as doubles
 * (exact: every 16-bit value is a float). */
static void load_rows(const fg_attention_args *a, const void *base, const int64_t st[3], int b, int h,
                      int len, double *dst) {
    const uint16_t *p = (const uint16_t *)base + (int64_t)b * st[0] + (int64_t)h * st[1];
    const int D = a->head_dim;
    for (int s = 0; s < len; s++) {
        const uint16_t *row = p + (int64_t)s * st[2];
        for (int d = 0; d < D; d++)
            dst[(int64_t)s * D + d] =
                a->dtype == FG_FP16 ? fgi_fp16_to_float(row[d]) : fgi_bf16_to_float(row[d]);
    }
}

/* Keys [0, len) of sequence b's KV head h from a paged cache: key j is
 * row j % page_size of page table[b][j / page_size]; a key of a page
 * outside [0, num_pages) is zero and marked bad. */
static void load_paged_rows(const fg_attention_args *a, const void *base, const int64_t st[3], int b, int h,
                            int len, double *dst, uint8_t *bad) {
    const int D = a->head_dim, ps = a->page_size;
    const int32_t *table = a->block_table + (int64_t)b * a->max_pages;
    for (int j = 0; j < len; j++) {
        const int32_t page = table[j / ps];
        bad[j] = page < 0 || page >= a->num_pages;
        double *out = dst + (int64_t)j * D;
        if (bad[j]) {
            memset(out, 0, sizeof(double) * (size_t)D);
            continue;
        }
        const uint16_t *row = (const uint16_t *)base + (int64_t)page * st[0] + (int64_t)h * st[1] +
                              (int64_t)(j % ps) * st[2];
        for (int d = 0; d < D; d++)
            out[d] = a->dtype == FG_FP16 ? fgi_fp16_to_float(row[d]) : fgi_bf16_to_float(row[d]);
    }
}

/* ---- which pairs take part ------------------------------------------------ */

/* The status of every (q block, kv block) of one (b, h) from a block mask's
 * host arrays, or NULL-free "no mask" handled by the caller. */
static void block_states(const fg_block_mask *m, int b, int h, uint8_t *states) {
    const int QB = m->q_blocks, KB = m->kv_blocks;
    const int mb = m->desc.batch == 1 ? 0 : b, mh = m->desc.heads == 1 ? 0 : h;
    memset(states, ST_EMPTY, (size_t)QB * KB);
    for (int qb = 0; qb < QB; qb++) {
        int64_t row = ((int64_t)mb * m->desc.heads + mh) * QB + qb;
        const int32_t *np = m->host[fgi_bm_slot(FG_BM_KV_NUM_BLOCKS)];
        const int32_t *ip = m->host[fgi_bm_slot(FG_BM_KV_INDICES)];
        const int32_t *fnp = m->host[fgi_bm_slot(FG_BM_FULL_KV_NUM_BLOCKS)];
        const int32_t *fip = m->host[fgi_bm_slot(FG_BM_FULL_KV_INDICES)];
        for (int i = 0; i < np[row] && i < KB; i++) {
            int kb = ip[row * KB + i];
            if (kb >= 0 && kb < KB) states[(int64_t)qb * KB + kb] = ST_PARTIAL;
        }
        for (int i = 0; i < fnp[row] && i < KB; i++) {
            int kb = fip[row * KB + i];
            if (kb >= 0 && kb < KB) states[(int64_t)qb * KB + kb] = ST_FULL;
        }
    }
}

/* ---- one (b, h) ------------------------------------------------------------ */

typedef struct ref_work {
    const fg_attention_args *a;
    const fgi_ref_ctx *rc;
    const fg_mod *mod;
    const fgi_value *values;
    float scale;
    double *q, *k, *v;    /* [len][D] of this (b, h) (rows.q, .k, .v)    */
    double *s;            /* [REF_TILE][kv_len]: scores of a q tile      */
    uint8_t *mask;        /* [REF_TILE * REF_TILE]                       */
    float *fin, *fout;    /* [REF_TILE * REF_TILE] score_mod in and out  */
    const fgi_ref_rows *rows; /* the current (b, h)'s rows, length, offset */
} ref_work;

/* Scores of rows [q0, q0+nq) against kv tile [kv0, kv0+nk): -inf where the
 * pair does not take part. */
static fg_status score_tile(fg_ctx *ctx, ref_work *w, int b, int h, int q0, int nq, int kv0, int nk) {
    const fg_attention_args *a = w->a;
    const int D = a->head_dim, KV = a->kv_len, qoff = w->rows->q_offset;
    const bool has_mask = fg_mod_has_mask(w->mod), has_score = fg_mod_has_score(w->mod);
    if (has_mask)
        FGI_TRY(fgi_eval_mask(ctx, w->mod, w->values, b, h, q0 + qoff, nq, kv0 + a->kv_offset, nk, w->mask));
    for (int i = 0; i < nq; i++) {
        const double *qr = w->q + (int64_t)(q0 + i) * D;
        for (int j = 0; j < nk; j++) {
            const double *kr = w->k + (int64_t)(kv0 + j) * D;
            double dot = 0;
            for (int d = 0; d < D; d++) dot += qr[d] * kr[d];
            w->fin[i * nk + j] = (float)((double)w->scale * dot);
        }
    }
    if (has_score)
        FGI_TRY(fgi_eval_score(ctx, w->mod, w->values, b, h, q0 + qoff, nq, kv0 + a->kv_offset, nk, w->fin,
                               w->fout));
    const float *sc = has_score ? w->fout : w->fin;
    for (int i = 0; i < nq; i++) {
        for (int j = 0; j < nk; j++) {
            bool keep = fgi_ref_pair_kept(w->rc, q0 + i, kv0 + j, has_mask ? w->mask[i * nk + j] : 1) &&
                        !w->rows->kv_bad[kv0 + j];
            w->s[(int64_t)i * KV + kv0 + j] = keep ? (double)sc[i * nk + j] : -INFINITY;
        }
    }
    return FG_OK;
}

/* Softmax and P V for rows [q0, q0+nq) from their scores in w->s. */
static void finish_rows(ref_work *w, int b, int h, int q0, int nq, double *out, double *lse) {
    const fg_attention_args *a = w->a;
    const int D = a->head_dim, KV = a->kv_len;
    for (int i = 0; i < nq; i++) {
        const double *srow = w->s + (int64_t)i * KV;
        const int64_t r = ((int64_t)b * a->heads_q + h) * a->q_len + q0 + i;
        double *orow = out + r * D;
        const int len = w->rows->kv_len;
        double mx = -INFINITY;
        for (int j = 0; j < len; j++)
            if (srow[j] > mx) mx = srow[j];
        memset(orow, 0, sizeof(double) * (size_t)D);
        if (mx == -INFINITY) {
            if (lse) lse[r] = -INFINITY;
            continue;
        }
        double l = 0;
        for (int j = 0; j < len; j++) {
            if (srow[j] == -INFINITY) continue;
            double p = exp(srow[j] - mx);
            l += p;
            const double *vr = w->v + (int64_t)j * D;
            for (int d = 0; d < D; d++) orow[d] += p * vr[d];
        }
        for (int d = 0; d < D; d++) orow[d] /= l;
        if (lse) lse[r] = mx + log(l);
    }
}

static fg_status one_head(fg_ctx *ctx, ref_work *w, int b, int h, double *out, double *lse) {
    const fg_attention_args *a = w->a;
    for (int q0 = 0; q0 < a->q_len; q0 += REF_TILE) {
        const int nq = a->q_len - q0 < REF_TILE ? a->q_len - q0 : REF_TILE;
        const int len = w->rows->kv_len;
        for (int kv0 = 0; kv0 < len; kv0 += REF_TILE) {
            const int nk = len - kv0 < REF_TILE ? len - kv0 : REF_TILE;
            FGI_TRY(score_tile(ctx, w, b, h, q0, nq, kv0, nk));
        }
        finish_rows(w, b, h, q0, nq, out, lse);
    }
    return FG_OK;
}

/* ---- shared with the backward reference ----------------------------------- */

fg_status fgi_ref_init(fg_ctx *ctx, fgi_ref_ctx *rc, const fg_mod *mod, const fg_attention_args *a,
                       fgi_value *values) {
    memset(rc, 0, sizeof *rc);
    FGI_TRY(fgi_attn_check_args(ctx, mod, a, &rc->st));
    const fg_block_mask *m = a->block_mask;
    if (m) {
        if (!m->host_valid)
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "the block mask has no host copy: fg_block_mask_download it first");
        FGI_TRY(fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, m->desc.q_block,
                                     m->desc.kv_block));
    }
    FGI_TRY(fgi_bind(ctx, mod, a->binds, a->nbinds, values));
    rc->a = a;
    rc->mod = mod;
    rc->values = values;
    rc->bm = m;
    rc->scale = fgi_attn_scale(a);
    if (m && !(rc->states = malloc((size_t)m->q_blocks * (size_t)m->kv_blocks)))
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference)");
    return FG_OK;
}

void fgi_ref_free(fgi_ref_ctx *rc) {
    free(rc->states);
    rc->states = NULL;
}

fg_status fgi_ref_rows_alloc(fg_ctx *ctx, const fgi_ref_ctx *rc, fgi_ref_rows *r, bool with_dout) {
    const size_t D = (size_t)rc->a->head_dim;
    memset(r, 0, sizeof *r);
    r->q = malloc(sizeof(double) * D * (size_t)rc->a->q_len);
    r->k = malloc(sizeof(double) * D * (size_t)rc->a->kv_len);
    r->v = malloc(sizeof(double) * D * (size_t)rc->a->kv_len);
    if (with_dout) r->dout = malloc(sizeof(double) * D * (size_t)rc->a->q_len);
    r->kv_bad = calloc((size_t)rc->a->kv_len, 1);
    if (!r->q || !r->k || !r->v || !r->kv_bad || (with_dout && !r->dout)) {
        fgi_ref_rows_free(r);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference)");
    }
    return FG_OK;
}

void fgi_ref_rows_free(fgi_ref_rows *r) {
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->dout);
    free(r->kv_bad);
    memset(r, 0, sizeof *r);
}

void fgi_ref_load_head(const fgi_ref_ctx *rc, fgi_ref_rows *r, int b, int h, const void *dout,
                       const int64_t dout_stride[4]) {
    const fg_attention_args *a = rc->a;
    const int hk = h / (a->heads_q / a->heads_kv);
    r->kv_len = a->kv_len;
    if (a->kv_lens) r->kv_len = a->kv_lens[b] < 0 ? 0 : a->kv_lens[b] > a->kv_len ? a->kv_len : a->kv_lens[b];
    r->q_offset = a->q_offsets ? a->q_offsets[b] : a->q_offset;
    load_rows(a, a->q, rc->st.q, b, h, a->q_len, r->q);
    if (a->block_table) {
        load_paged_rows(a, a->k, rc->st.k, b, hk, r->kv_len, r->k, r->kv_bad);
        load_paged_rows(a, a->v, rc->st.v, b, hk, r->kv_len, r->v, r->kv_bad);
    } else {
        load_rows(a, a->k, rc->st.k, b, hk, r->kv_len, r->k);
        load_rows(a, a->v, rc->st.v, b, hk, r->kv_len, r->v);
    }
    if (dout && r->dout) {
        const int64_t *s = dout_stride;
        int64_t st[3];
        if (s[0] == 0 && s[1] == 0 && s[2] == 0 && s[3] == 0) {
            st[2] = a->head_dim;
            st[1] = (int64_t)a->q_len * a->head_dim;
            st[0] = (int64_t)a->heads_q * st[1];
        } else {
            st[0] = s[0], st[1] = s[1], st[2] = s[2];
        }
        load_rows(a, dout, st, b, h, a->q_len, r->dout);
    }
    if (rc->bm) block_states(rc->bm, b, h, rc->states);
}

bool fgi_ref_pair_kept(const fgi_ref_ctx *rc, int q, int kv, int mask_bit) {
    int st = fg_mod_has_mask(rc->mod) ? ST_PARTIAL : ST_FULL;
    if (rc->bm) {
        const int qb = q / rc->bm->desc.q_block, kb = kv / rc->bm->desc.kv_block;
        st = rc->states[(int64_t)qb * rc->bm->kv_blocks + kb];
    }
    return st == ST_FULL || (st == ST_PARTIAL && mask_bit);
}

/* ---- the forward reference ------------------------------------------------------ */

/* The (b, h) pairs are independent: each writes its own rows of out and
 * lse, with the same arithmetic in the same order whichever thread runs
 * it, so the answer is bit for bit the same on any number of threads.
 * Threads take pairs in order from a shared counter; each has its own
 * copies of what a pair writes (block states, the rows as doubles, the
 * tiles' scratch) and, with more than one thread, a private context for
 * errors (a context is one thread's). A failure stops the pairs after it;
 * the first failing pair is then run again on the caller's context, so the
 * error reported is the one a single thread reports. */

/* At most this much working memory among the threads (a pair's rows and
 * scores grow with the lengths). */
#define REF_MAX_BYTES ((size_t)2 << 30)

typedef struct ref_shared {
    atomic_int next;      /* the next pair to take                      */
    atomic_int first_bad; /* the first pair that failed, or INT_MAX     */
    int pairs;
} ref_shared;

typedef struct ref_job {
    fg_ctx *ctx; /* errors */
    const fg_mod *mod;
    const fg_attention_args *a;
    const fgi_value *values;
    fgi_ref_ctx rc; /* the call's, with block states of its own */
    double *out, *lse;
    ref_shared *sh;
    fg_status status;
    int failed_pair; /* the pair that failed; 0 for a failure before any */
} ref_job;

/* Pairs from the counter until none is left or one before them failed. */
static void ref_job_run(ref_job *j) {
    const fg_attention_args *a = j->a;
    fgi_ref_rows rows;
    ref_work w;
    memset(&w, 0, sizeof w);
    j->status = fgi_ref_rows_alloc(j->ctx, &j->rc, &rows, false);
    w.a = a;
    w.rc = &j->rc;
    w.mod = j->mod;
    w.values = j->values;
    w.scale = j->rc.scale;
    w.q = rows.q;
    w.k = rows.k;
    w.v = rows.v;
    w.rows = &rows;
    w.s = malloc(sizeof(double) * REF_TILE * (size_t)a->kv_len);
    w.mask = malloc(REF_TILE * REF_TILE);
    w.fin = malloc(sizeof(float) * REF_TILE * REF_TILE);
    w.fout = malloc(sizeof(float) * REF_TILE * REF_TILE);
    if (j->status == FG_OK && (!w.s || !w.mask || !w.fin || !w.fout))
        j->status = fgi_error(j->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference)");
    ref_shared *sh = j->sh;
    while (j->status == FG_OK) {
        const int p = atomic_fetch_add(&sh->next, 1);
        if (p >= sh->pairs || p > atomic_load(&sh->first_bad)) break;
        const int b = p / a->heads_q, h = p % a->heads_q;
        fgi_ref_load_head(&j->rc, &rows, b, h, NULL, NULL);
        j->status = one_head(j->ctx, &w, b, h, j->out, j->lse);
        j->failed_pair = p;
    }
    if (j->status != FG_OK) {
        const int p = j->failed_pair;
        int bad = atomic_load(&sh->first_bad);
        while (p < bad && !atomic_compare_exchange_weak(&sh->first_bad, &bad, p)) {
        }
    }
    fgi_ref_rows_free(&rows);
    free(w.s);
    free(w.mask);
    free(w.fin);
    free(w.fout);
}

static void ref_job_thread(void *job) { ref_job_run(job); }

/* Threads for `pairs` pairs: the cores, within the memory bound. */
static int ref_threads(const fg_attention_args *a, int pairs) {
    const size_t D = (size_t)a->head_dim;
    const size_t per = sizeof(double) * (D * ((size_t)a->q_len + 2 * (size_t)a->kv_len) +
                                         REF_TILE * (size_t)a->kv_len);
    return fgi_parallel_threads(pairs, per, REF_MAX_BYTES);
}

/* Pairs [from, pairs) on `threads` threads (1: the calling thread, on ctx). */
static fg_status ref_run(fg_ctx *ctx, const fgi_ref_ctx *rc, const fg_attention_args *args, double *out,
                         double *lse, int from, int threads) {
    ref_shared sh;
    atomic_init(&sh.next, from);
    atomic_init(&sh.first_bad, INT_MAX);
    sh.pairs = args->batch * args->heads_q;
    ref_job jobs[FGI_PARALLEL_MAX];
    const fg_block_mask *m = rc->bm;
    fg_status st = FG_OK;
    int made = 0;
    for (; made < threads; made++) {
        ref_job *j = &jobs[made];
        *j = (ref_job){ctx, rc->mod, args, rc->values, *rc, out, lse, &sh, FG_OK, 0};
        j->rc.states = NULL;
        if (threads > 1 && fg_ctx_create(&j->ctx) != FG_OK) j->ctx = NULL;
        if (!j->ctx || (m && !(j->rc.states = malloc((size_t)m->q_blocks * (size_t)m->kv_blocks)))) {
            if (j->ctx != ctx) fg_ctx_destroy(j->ctx);
            st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference)");
            break;
        }
    }
    if (st == FG_OK) fgi_parallel_run(jobs, sizeof jobs[0], made, ref_job_thread);
    for (int i = 0; i < made; i++) {
        if (st == FG_OK && threads == 1) st = jobs[i].status;
        free(jobs[i].rc.states);
        if (jobs[i].ctx != ctx) fg_ctx_destroy(jobs[i].ctx);
    }
    if (st != FG_OK || threads == 1) return st;
    const int bad = atomic_load(&sh.first_bad);
    if (bad == INT_MAX) return FG_OK;
    /* Again on the caller's context from the first pair that failed (every
     * pair before it passed on the threads). Should it pass there (memory
     * ran short on a thread), the answer is whole. */
    return ref_run(ctx, rc, args, out, lse, bad, 1);
}

fg_status fgi_attention_reference_threads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                          double *out, double *lse, int threads) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out, "NULL output");
    fgi_ref_ctx rc;
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_ref_init(ctx, &rc, mod, args, values));
    const int pairs = args->batch * args->heads_q;
    if (threads <= 0) threads = ref_threads(args, pairs);
    if (threads > FGI_PARALLEL_MAX) threads = FGI_PARALLEL_MAX;
    if (threads > pairs) threads = pairs > 0 ? pairs : 1;
    const fg_status s = ref_run(ctx, &rc, args, out, lse, 0, threads);
    fgi_ref_free(&rc);
    return s;
}

fg_status fg_attention_reference(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                 double *out, double *lse) {
    return fgi_attention_reference_threads(ctx, mod, args, out, lse, 0);
}
