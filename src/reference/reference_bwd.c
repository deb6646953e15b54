/*
 * reference_bwd.c -- the CPU reference of the backward pass, in float64.
 *
 * For each (b, h) it recomputes what the forward computes (reference.c's
 * rules for which pairs take part, score_mod through the evaluator on the
 * float score scale * q.k), then takes the gradients the plain way:
 *
 *   P    = softmax of the kept scores (row by row, in double)
 *   O    = P V,  delta_i = dO_i . O_i
 *   dV  += P^T dO
 *   dS   = P * (dO V^T - delta)
 *   dR   = dS * d score_mod / d score  (deriv.c's tree, through the evaluator,
 *                                       at the same float raw score)
 *   dQ   = scale * dR K,  dK += scale * dR^T Q
 *   d buf[i] += dS * d score_mod / d (buf[i] as read), per float buffer read
 *
 * O and the LSE are the reference's own, not the kernel's, so the yardstick
 * does not inherit the kernel's rounding. Pairs that do not take part, and
 * pairs whose probability is exactly 0, contribute nothing, and their
 * derivatives are not used (an infinite derivative at a masked pair never
 * meets a zero), as in the kernels. dK and dV of a KV head sum over the query
 * heads of its group.
 */
#include "reference/reference.h"

#include "base/parallel.h"
#include "mod/deriv.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BWD_TILE 64

typedef struct bwd_work {
    fgi_ref_rows rows;               /* q, k, v, dO of the current (b, h), double */
    double *s;                   /* [Q_LEN][KV_LEN]: kept scores, -inf else   */
    float *raw;                  /* [Q_LEN][KV_LEN]: scale * q.k as float     */
    double *dr, *ds;             /* [Q_LEN][KV_LEN]                           */
    uint8_t *mask;               /* [BWD_TILE * BWD_TILE]                     */
    float *fin, *fout;           /* [BWD_TILE * BWD_TILE]                     */
    int32_t *iout;
} bwd_work;

/* Kept scores and raw scores of one (b, h), tile by tile. */
static fg_status scores(fg_ctx *ctx, const fgi_ref_ctx *rc, bwd_work *w, int b, int h) {
    const fg_attention_args *a = rc->a;
    const int D = a->head_dim, Q = a->q_len, KV = a->kv_len;
    const bool has_mask = fg_mod_has_mask(rc->mod), has_score = fg_mod_has_score(rc->mod);
    for (int q0 = 0; q0 < Q; q0 += BWD_TILE) {
        const int nq = Q - q0 < BWD_TILE ? Q - q0 : BWD_TILE;
        for (int kv0 = 0; kv0 < KV; kv0 += BWD_TILE) {
            const int nk = KV - kv0 < BWD_TILE ? KV - kv0 : BWD_TILE;
            if (has_mask)
                FGI_TRY(fgi_eval_mask(ctx, rc->mod, rc->values, b, h, q0 + a->q_offset, nq,
                                      kv0 + a->kv_offset, nk, w->mask));
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) {
                    const double *qr = w->rows.q + (int64_t)(q0 + i) * D, *kr = w->rows.k + (int64_t)(kv0 + j) * D;
                    double dot = 0;
                    for (int d = 0; d < D; d++) dot += qr[d] * kr[d];
                    w->fin[i * nk + j] = (float)((double)rc->scale * dot);
                }
            if (has_score)
                FGI_TRY(fgi_eval_score(ctx, rc->mod, rc->values, b, h, q0 + a->q_offset, nq,
                                       kv0 + a->kv_offset, nk, w->fin, w->fout));
            const float *sc = has_score ? w->fout : w->fin;
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) {
                    const int64_t at = (int64_t)(q0 + i) * KV + kv0 + j;
                    const bool keep = fgi_ref_pair_kept(rc, q0 + i, kv0 + j, has_mask ? w->mask[i * nk + j] : 1);
                    w->raw[at] = w->fin[i * nk + j];
                    w->s[at] = keep ? (double)sc[i * nk + j] : -INFINITY;
                }
        }
    }
    return FG_OK;
}

/* Evaluate a score-shaped function of the mod at every pair with dS != 0,
 * tile by tile, and hand each value to `use`. */
typedef void (*pair_fn)(bwd_work *w, void *arg, int64_t at, float value, int32_t ivalue);

static fg_status at_pairs(fg_ctx *ctx, const fgi_ref_ctx *rc, bwd_work *w, const fgi_func *fn, int b, int h,
                          pair_fn use, void *arg) {
    const fg_attention_args *a = rc->a;
    const int Q = a->q_len, KV = a->kv_len;
    const bool is_int = fn->ret->type == FGI_T_INT;
    for (int q0 = 0; q0 < Q; q0 += BWD_TILE) {
        const int nq = Q - q0 < BWD_TILE ? Q - q0 : BWD_TILE;
        for (int kv0 = 0; kv0 < KV; kv0 += BWD_TILE) {
            const int nk = KV - kv0 < BWD_TILE ? KV - kv0 : BWD_TILE;
            bool any = false;
            for (int i = 0; i < nq && !any; i++)
                for (int j = 0; j < nk && !any; j++) any = w->ds[(int64_t)(q0 + i) * KV + kv0 + j] != 0.0;
            if (!any) continue;
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) w->fin[i * nk + j] = w->raw[(int64_t)(q0 + i) * KV + kv0 + j];
            FGI_TRY(fgi_eval_func(ctx, rc->mod, fn, rc->values, b, h, q0 + a->q_offset, nq, kv0 + a->kv_offset,
                                  nk, w->fin, is_int ? (void *)w->iout : (void *)w->fout));
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) {
                    const int64_t at = (int64_t)(q0 + i) * KV + kv0 + j;
                    if (w->ds[at] != 0.0)
                        use(w, arg, at, is_int ? 0.f : w->fout[i * nk + j], is_int ? w->iout[i * nk + j] : 0);
                }
        }
    }
    return FG_OK;
}

static void use_d_score(bwd_work *w, void *arg, int64_t at, float v, int32_t iv) {
    (void)arg, (void)iv;
    w->dr[at] = w->ds[at] * (double)v;
}

/* A buffer read: first pass records the index of each pair, second pass adds
 * dS * derivative to the gradient there. */
typedef struct site_pass {
    int32_t *index;     /* [Q_LEN][KV_LEN] */
    double *grad;       /* the buffer's gradient */
    int64_t length;
} site_pass;

static void use_index(bwd_work *w, void *arg, int64_t at, float v, int32_t iv) {
    (void)w, (void)v;
    ((site_pass *)arg)->index[at] = iv;
}

static void use_site(bwd_work *w, void *arg, int64_t at, float v, int32_t iv) {
    (void)iv;
    site_pass *sp = arg;
    const int32_t i = sp->index[at];
    if (i >= 0 && i < sp->length) sp->grad[i] += w->ds[at] * (double)v;
}

static fg_status one_head(fg_ctx *ctx, const fgi_ref_ctx *rc, bwd_work *w, const fgi_mod_grad *g,
                          const fgi_value *values, const fgi_ref_bwd_out *out, int32_t *site_index,
                          int b, int h) {
    const fg_attention_args *a = rc->a;
    const int D = a->head_dim, Q = a->q_len, KV = a->kv_len;
    const int hk = h / (a->heads_q / a->heads_kv);
    fgi_ref_load_head(rc, &w->rows, b, h, out->dout, out->dout_stride);
    FGI_TRY(scores(ctx, rc, w, b, h));
    double *dq = out->dq + ((int64_t)b * a->heads_q + h) * Q * D;
    double *dk = out->dk + ((int64_t)b * a->heads_kv + hk) * KV * D;
    double *dv = out->dv + ((int64_t)b * a->heads_kv + hk) * KV * D;
    double *o = malloc(sizeof(double) * (size_t)D);
    if (!o) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference backward)");
    for (int i = 0; i < Q; i++) {
        double *srow = w->s + (int64_t)i * KV, *dsrow = w->ds + (int64_t)i * KV;
        const double *dor = w->rows.dout + (int64_t)i * D;
        double mx = -INFINITY;
        for (int j = 0; j < KV; j++) mx = srow[j] > mx ? srow[j] : mx;
        if (mx == -INFINITY) { /* fully masked: no gradient at all */
            memset(dsrow, 0, sizeof(double) * (size_t)KV);
            continue;
        }
        double l = 0;
        for (int j = 0; j < KV; j++) l += srow[j] == -INFINITY ? 0.0 : exp(srow[j] - mx);
        /* srow becomes P, dsrow dP then dS */
        memset(o, 0, sizeof(double) * (size_t)D);
        for (int j = 0; j < KV; j++) {
            srow[j] = srow[j] == -INFINITY ? 0.0 : exp(srow[j] - mx) / l;
            if (srow[j] == 0.0) continue;
            const double *vr = w->rows.v + (int64_t)j * D;
            for (int d = 0; d < D; d++) o[d] += srow[j] * vr[d];
        }
        double delta = 0;
        for (int d = 0; d < D; d++) delta += dor[d] * o[d];
        if (out->dlse) delta -= out->dlse[((int64_t)b * a->heads_q + h) * Q + i]; /* d lse_i / d s_ij = P_ij */
        for (int j = 0; j < KV; j++) {
            if (srow[j] == 0.0) {
                dsrow[j] = 0.0;
                continue;
            }
            const double *vr = w->rows.v + (int64_t)j * D;
            double dp = 0;
            for (int d = 0; d < D; d++) dp += dor[d] * vr[d];
            dsrow[j] = srow[j] * (dp - delta);
            double *dvr = dv + (int64_t)j * D;
            for (int d = 0; d < D; d++) dvr[d] += srow[j] * dor[d];
        }
    }
    free(o);
    /* dR = dS * d score_mod / d score (1 without a score_mod). */
    if (g->d_score) {
        memset(w->dr, 0, sizeof(double) * (size_t)Q * (size_t)KV);
        FGI_TRY(at_pairs(ctx, rc, w, g->d_score, b, h, use_d_score, NULL));
    } else {
        memcpy(w->dr, w->ds, sizeof(double) * (size_t)Q * (size_t)KV);
    }
    for (int i = 0; i < Q; i++) {
        const double *drrow = w->dr + (int64_t)i * KV;
        const double *qr = w->rows.q + (int64_t)i * D;
        double *dqr = dq + (int64_t)i * D;
        for (int j = 0; j < KV; j++) {
            const double r = drrow[j] * (double)rc->scale;
            if (r == 0.0) continue;
            const double *kr = w->rows.k + (int64_t)j * D;
            double *dkr = dk + (int64_t)j * D;
            for (int d = 0; d < D; d++) {
                dqr[d] += r * kr[d];
                dkr[d] += r * qr[d];
            }
        }
    }
    for (int k = 0; k < g->nsites; k++) {
        double *grad = out->buf_grads ? out->buf_grads[g->sites[k].param] : NULL;
        if (!grad) continue;
        site_pass sp = {site_index, grad, values[g->sites[k].param].length};
        FGI_TRY(at_pairs(ctx, rc, w, g->sites[k].index, b, h, use_index, &sp));
        FGI_TRY(at_pairs(ctx, rc, w, g->sites[k].grad, b, h, use_site, &sp));
    }
    return FG_OK;
}

/* ---- units on threads ---------------------------------------------------------- */

/* The work comes in units of one (b, KV head): a unit runs the query heads
 * of its group in order and is the only one to write their dQ rows and its
 * dK and dV rows, so units run on any thread with the arithmetic of one.
 * The float buffers' gradients are shared by every unit: a unit adds into
 * partial arrays of its own, which are added to the gradients in unit
 * order (each unit waits for the one before it), so those sums too are the
 * same on any number of threads. Threads take units in order from a
 * counter, each with its own scratch, block states and (with more than
 * one thread) a private context for errors; the first unit that failed is
 * run again on the caller's context for the error a single thread gives. */

#define BWD_MAX_BYTES ((size_t)4 << 30)

typedef struct bwd_shared {
    atomic_int next; /* the next unit to take */
    int units;
    pthread_mutex_t lock;
    pthread_cond_t turn;
    int committed; /* units whose partials are in the gradients (under lock) */
    int first_bad; /* the first unit that failed, or INT_MAX (under lock)   */
} bwd_shared;

typedef struct bwd_job {
    fg_ctx *ctx; /* errors */
    fgi_ref_ctx rc;
    const fgi_mod_grad *g;
    const fgi_value *values;
    const fgi_ref_bwd_out *out; /* the caller's */
    fgi_ref_bwd_out mine;       /* the same with this job's partial buffer gradients */
    double *partial[FGI_MAX_PARAMS];
    /* Param p's gradient length when it is wanted, else 0 (buf_grads has an
     * entry for each parameter a site reads, and only those). */
    int64_t glen[FGI_MAX_PARAMS];
    bwd_work w;
    int32_t *site_index;
    bwd_shared *sh;
    fg_status status;
    int failed_unit; /* the unit that failed; 0 for a failure before any */
} bwd_job;

static void bwd_job_free(bwd_job *j) {
    fgi_ref_rows_free(&j->w.rows);
    free(j->rc.states);
    free(j->w.s);
    free(j->w.raw);
    free(j->w.dr);
    free(j->w.ds);
    free(j->w.mask);
    free(j->w.fin);
    free(j->w.fout);
    free(j->w.iout);
    free(j->site_index);
    for (int p = 0; p < FGI_MAX_PARAMS; p++) free(j->partial[p]);
}

static fg_status bwd_job_alloc(bwd_job *j) {
    const fg_attention_args *a = j->rc.a;
    const size_t Q = (size_t)a->q_len, KV = (size_t)a->kv_len;
    const fg_block_mask *m = j->rc.bm;
    j->rc.states = m ? malloc((size_t)m->q_blocks * (size_t)m->kv_blocks) : NULL;
    fg_status s = fgi_ref_rows_alloc(j->ctx, &j->rc, &j->w.rows, true);
    bwd_work *w = &j->w;
    w->s = malloc(sizeof(double) * Q * KV);
    w->raw = malloc(sizeof(float) * Q * KV);
    w->dr = malloc(sizeof(double) * Q * KV);
    w->ds = malloc(sizeof(double) * Q * KV);
    w->mask = malloc(BWD_TILE * BWD_TILE);
    w->fin = malloc(sizeof(float) * BWD_TILE * BWD_TILE);
    w->fout = malloc(sizeof(float) * BWD_TILE * BWD_TILE);
    w->iout = malloc(sizeof(int32_t) * BWD_TILE * BWD_TILE);
    j->site_index = j->g->nsites ? malloc(sizeof(int32_t) * Q * KV) : NULL;
    bool ok = w->s && w->raw && w->dr && w->ds && w->mask && w->fin && w->fout && w->iout &&
              (!j->g->nsites || j->site_index) && (!m || j->rc.states);
    if (j->out->buf_grads)
        for (int k = 0; k < j->g->nsites; k++) {
            const int p = j->g->sites[k].param;
            if (j->out->buf_grads[p]) j->glen[p] = j->values[p].length;
        }
    j->mine = *j->out;
    j->mine.buf_grads = j->partial;
    for (int p = 0; p < FGI_MAX_PARAMS; p++)
        if (j->glen[p] && !(j->partial[p] = malloc(sizeof(double) * (size_t)j->glen[p]))) ok = false;
    if (s == FG_OK && !ok) s = fgi_error(j->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference backward)");
    return s;
}

/* Unit u's partials into the gradients, after unit u - 1's; false when a
 * unit before it failed (nothing is added then). */
static bool bwd_commit(bwd_job *j, int u) {
    bwd_shared *sh = j->sh;
    pthread_mutex_lock(&sh->lock);
    while (sh->committed != u && sh->first_bad > sh->committed) pthread_cond_wait(&sh->turn, &sh->lock);
    const bool go = sh->committed == u;
    if (go) {
        for (int p = 0; p < FGI_MAX_PARAMS; p++)
            for (int64_t i = 0; i < j->glen[p]; i++) j->out->buf_grads[p][i] += j->partial[p][i];
        sh->committed = u + 1;
        pthread_cond_broadcast(&sh->turn);
    }
    pthread_mutex_unlock(&sh->lock);
    return go;
}

static void bwd_job_run(bwd_job *j) {
    const fg_attention_args *a = j->rc.a;
    bwd_shared *sh = j->sh;
    const int group = a->heads_q / a->heads_kv;
    j->status = bwd_job_alloc(j);
    j->failed_unit = 0;
    while (j->status == FG_OK) {
        const int u = atomic_fetch_add(&sh->next, 1);
        if (u >= sh->units) break;
        const int b = u / a->heads_kv, hk = u % a->heads_kv;
        for (int p = 0; p < FGI_MAX_PARAMS; p++)
            if (j->glen[p]) memset(j->partial[p], 0, sizeof(double) * (size_t)j->glen[p]);
        for (int h = hk * group; j->status == FG_OK && h < (hk + 1) * group; h++)
            j->status = one_head(j->ctx, &j->rc, &j->w, j->g, j->values, &j->mine, j->site_index, b, h);
        j->failed_unit = u;
        if (j->status == FG_OK && !bwd_commit(j, u)) break; /* a unit before it failed */
    }
    if (j->status != FG_OK) {
        pthread_mutex_lock(&sh->lock);
        if (j->failed_unit < sh->first_bad) sh->first_bad = j->failed_unit;
        pthread_cond_broadcast(&sh->turn);
        pthread_mutex_unlock(&sh->lock);
    }
}

static void bwd_job_thread(void *job) { bwd_job_run(job); }

/* Threads for `units` units: the cores, within the memory bound (a thread
 * holds four Q x KV arrays and a unit's rows). */
static int bwd_threads(const fg_attention_args *a, int units) {
    const size_t D = (size_t)a->head_dim, Q = (size_t)a->q_len, KV = (size_t)a->kv_len;
    return fgi_parallel_threads(units, 32 * Q * KV + sizeof(double) * D * (2 * Q + 2 * KV), BWD_MAX_BYTES);
}

/* Units [from, units) on `threads` threads (1: the calling thread, on ctx). */
static fg_status bwd_run(fg_ctx *ctx, const fgi_ref_ctx *rc, const fgi_mod_grad *g, const fgi_value *values,
                         const fgi_ref_bwd_out *out, int from, int threads) {
    bwd_shared sh;
    atomic_init(&sh.next, from);
    sh.units = rc->a->batch * rc->a->heads_kv;
    sh.committed = from;
    sh.first_bad = INT_MAX;
    pthread_mutex_init(&sh.lock, NULL);
    pthread_cond_init(&sh.turn, NULL);
    bwd_job jobs[FGI_PARALLEL_MAX];
    fg_status st = FG_OK;
    int made = 0;
    for (; made < threads; made++) {
        bwd_job *j = &jobs[made];
        memset(j, 0, sizeof *j);
        j->ctx = ctx, j->rc = *rc, j->rc.states = NULL, j->g = g, j->values = values, j->out = out, j->sh = &sh;
        if (threads > 1 && fg_ctx_create(&j->ctx) != FG_OK) {
            st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (reference backward)");
            break;
        }
    }
    if (st == FG_OK) fgi_parallel_run(jobs, sizeof jobs[0], made, bwd_job_thread);
    for (int i = 0; i < made; i++) {
        if (st == FG_OK && threads == 1) st = jobs[i].status;
        bwd_job_free(&jobs[i]);
        if (jobs[i].ctx != ctx) fg_ctx_destroy(jobs[i].ctx);
    }
    pthread_mutex_destroy(&sh.lock);
    pthread_cond_destroy(&sh.turn);
    if (st != FG_OK || threads == 1 || sh.first_bad == INT_MAX) return st;
    /* Again on the caller's context from the first unit that failed: every
     * unit before it passed and added its partials, none after it did, and
     * the dQ, dK and dV rows of it and the units after it (one range each:
     * a unit's rows follow the one before's) start from zero again. Should
     * it pass there (memory ran short on a thread), the answer is whole. */
    const int bad = sh.first_bad;
    const fg_attention_args *a = rc->a;
    const size_t D = (size_t)a->head_dim, group = (size_t)(a->heads_q / a->heads_kv);
    const size_t q_rows = group * (size_t)a->q_len * D, kv_rows = (size_t)a->kv_len * D;
    const size_t rest = (size_t)(sh.units - bad);
    memset(out->dq + (size_t)bad * q_rows, 0, sizeof(double) * rest * q_rows);
    memset(out->dk + (size_t)bad * kv_rows, 0, sizeof(double) * rest * kv_rows);
    memset(out->dv + (size_t)bad * kv_rows, 0, sizeof(double) * rest * kv_rows);
    return bwd_run(ctx, rc, g, values, out, bad, 1);
}

fg_status fgi_attention_reference_backward_threads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                                   const fgi_ref_bwd_out *out, int threads) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out && out->dout && out->dq && out->dk && out->dv, "NULL dout, dq, dk or dv");
    fgi_ref_ctx rc;
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_ref_init(ctx, &rc, mod, args, values));
    const fg_attention_args *a = args;
    const size_t D = (size_t)a->head_dim, Q = (size_t)a->q_len, KV = (size_t)a->kv_len;
    memset(out->dq, 0, sizeof(double) * (size_t)a->batch * (size_t)a->heads_q * Q * D);
    memset(out->dk, 0, sizeof(double) * (size_t)a->batch * (size_t)a->heads_kv * KV * D);
    memset(out->dv, 0, sizeof(double) * (size_t)a->batch * (size_t)a->heads_kv * KV * D);
    fgi_mod_grad g;
    fg_status s = fgi_mod_derive(ctx, mod, &g);
    if (s != FG_OK) {
        fgi_ref_free(&rc);
        return s;
    }
    if (out->buf_grads)
        for (int k = 0; k < g.nsites; k++) {
            double *grad = out->buf_grads[g.sites[k].param];
            if (grad) memset(grad, 0, sizeof(double) * (size_t)values[g.sites[k].param].length);
        }
    const int units = a->batch * a->heads_kv;
    if (threads <= 0) threads = bwd_threads(a, units);
    if (threads > FGI_PARALLEL_MAX) threads = FGI_PARALLEL_MAX;
    if (threads > units) threads = units > 0 ? units : 1;
    s = bwd_run(ctx, &rc, &g, values, out, 0, threads);
    fgi_ref_free(&rc);
    fgi_mod_grad_free(&g);
    return s;
}

fg_status fgi_attention_reference_backward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                           const fgi_ref_bwd_out *out) {
    return fgi_attention_reference_backward_threads(ctx, mod, args, out, 0);
}
