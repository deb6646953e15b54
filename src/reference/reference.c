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
#include "attention/attention.h"

#include "blockmask/blockmask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_TILE 64

enum { ST_EMPTY = 0, ST_PARTIAL = 1, ST_FULL = 2 };

/* ---- 16-bit floats --------------------------------------------------------- */

static double bf16_to_double(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double fp16_to_double(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v;
    if (exp == 0) v = ldexp((double)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexp((double)(man | 1024), exp - 25);
    return sign ? -v : v;
}

/* Rows [0, len) of one (b, h) slab of a strided 16-bit tensor, as doubles. */
static void load_rows(const fg_attention_args *a, const void *base, const int64_t st[3], int b, int h,
                      int len, double *dst) {
    const uint16_t *p = (const uint16_t *)base + (int64_t)b * st[0] + (int64_t)h * st[1];
    const int D = a->head_dim;
    for (int s = 0; s < len; s++) {
        const uint16_t *row = p + (int64_t)s * st[2];
        for (int d = 0; d < D; d++)
            dst[(int64_t)s * D + d] = a->dtype == FG_FP16 ? fp16_to_double(row[d]) : bf16_to_double(row[d]);
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
    const fg_mod *mod;
    const fgi_value *values;
    const fg_block_mask *bm;
    float scale;
    double *q, *k, *v;    /* [len][D] of this (b, h)                   */
    double *s;            /* [REF_TILE][kv_len]: scores of a q tile      */
    uint8_t *states;      /* [QB][KB] when there is a block mask         */
    uint8_t *mask;        /* [REF_TILE * REF_TILE]                       */
    float *fin, *fout;    /* [REF_TILE * REF_TILE] score_mod in and out  */
} ref_work;

/* Scores of rows [q0, q0+nq) against kv tile [kv0, kv0+nk): -inf where the
 * pair does not take part. */
static fg_status score_tile(fg_ctx *ctx, ref_work *w, int b, int h, int q0, int nq, int kv0, int nk) {
    const fg_attention_args *a = w->a;
    const int D = a->head_dim, KV = a->kv_len;
    const bool has_mask = fg_mod_has_mask(w->mod), has_score = fg_mod_has_score(w->mod);
    if (has_mask)
        FGI_TRY(fgi_eval_mask(ctx, w->mod, w->values, b, h, q0 + a->q_offset, nq, kv0 + a->kv_offset,
                              nk, w->mask));
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
        FGI_TRY(fgi_eval_score(ctx, w->mod, w->values, b, h, q0 + a->q_offset, nq, kv0 + a->kv_offset,
                               nk, w->fin, w->fout));
    const float *sc = has_score ? w->fout : w->fin;
    for (int i = 0; i < nq; i++) {
        for (int j = 0; j < nk; j++) {
            int st = has_mask ? ST_PARTIAL : ST_FULL;
            if (w->bm) {
                const int qb = (q0 + i) / w->bm->desc.q_block, kb = (kv0 + j) / w->bm->desc.kv_block;
                st = w->states[(int64_t)qb * w->bm->kv_blocks + kb];
            }
            bool keep = st == ST_FULL || (st == ST_PARTIAL && (!has_mask || w->mask[i * nk + j]));
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
        double mx = -INFINITY;
        for (int j = 0; j < KV; j++)
            if (srow[j] > mx) mx = srow[j];
        memset(orow, 0, sizeof(double) * (size_t)D);
        if (mx == -INFINITY) {
            if (lse) lse[r] = -INFINITY;
            continue;
        }
        double l = 0;
        for (int j = 0; j < KV; j++) {
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

static fg_status one_head(fg_ctx *ctx, ref_work *w, const fgi_attn_strides *st, int b, int h,
                          double *out, double *lse) {
    const fg_attention_args *a = w->a;
    const int hk = h / (a->heads_q / a->heads_kv);
    load_rows(a, a->q, st->q, b, h, a->q_len, w->q);
    load_rows(a, a->k, st->k, b, hk, a->kv_len, w->k);
    load_rows(a, a->v, st->v, b, hk, a->kv_len, w->v);
    if (w->bm) block_states(w->bm, b, h, w->states);
    for (int q0 = 0; q0 < a->q_len; q0 += REF_TILE) {
        const int nq = a->q_len - q0 < REF_TILE ? a->q_len - q0 : REF_TILE;
        for (int kv0 = 0; kv0 < a->kv_len; kv0 += REF_TILE) {
            const int nk = a->kv_len - kv0 < REF_TILE ? a->kv_len - kv0 : REF_TILE;
            FGI_TRY(score_tile(ctx, w, b, h, q0, nq, kv0, nk));
        }
        finish_rows(w, b, h, q0, nq, out, lse);
    }
    return FG_OK;
}

static fg_status check_block_mask(fg_ctx *ctx, const fg_attention_args *a) {
    const fg_block_mask *m = a->block_mask;
    if (!m) return FG_OK;
    if (!m->host_valid)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the block mask has no host copy: fg_block_mask_download it first");
    return fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, m->desc.q_block,
                                m->desc.kv_block);
}

fg_status fg_attention_reference(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                 double *out, double *lse) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out, "NULL output");
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, mod, args, &st));
    FGI_TRY(check_block_mask(ctx, args));
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bind(ctx, mod, args->binds, args->nbinds, values));

    const size_t D = (size_t)args->head_dim;
    ref_work w;
    memset(&w, 0, sizeof w);
    w.a = args;
    w.mod = mod;
    w.values = values;
    w.bm = args->block_mask;
    w.scale = fgi_attn_scale(args);
    w.q = malloc(sizeof(double) * D * (size_t)args->q_len);
    w.k = malloc(sizeof(double) * D * (size_t)args->kv_len);
    w.v = malloc(sizeof(double) * D * (size_t)args->kv_len);
    w.s = malloc(sizeof(double) * REF_TILE * (size_t)args->kv_len);
    w.mask = malloc(REF_TILE * REF_TILE);
    w.fin = malloc(sizeof(float) * REF_TILE * REF_TILE);
    w.fout = malloc(sizeof(float) * REF_TILE * REF_TILE);
    if (w.bm) w.states = malloc((size_t)w.bm->q_blocks * (size_t)w.bm->kv_blocks);
    fg_status s = FG_OK;
    if (!w.q || !w.k || !w.v || !w.s || !w.mask || !w.fin || !w.fout || (w.bm && !w.states))
        s = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference)");
    for (int b = 0; s == FG_OK && b < args->batch; b++)
        for (int h = 0; s == FG_OK && h < args->heads_q; h++) s = one_head(ctx, &w, &st, b, h, out, lse);
    free(w.q);
    free(w.k);
    free(w.v);
    free(w.s);
    free(w.mask);
    free(w.fin);
    free(w.fout);
    free(w.states);
    return s;
}
