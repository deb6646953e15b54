/*
 * accuracy.c -- the accuracy checks of `flexgen bench`: a call on fresh
 * random inputs on the GPU against the library's float64 CPU reference on
 * the same inputs, as the relative Frobenius error of out, the largest LSE
 * error, and the count of non-finite outputs. The output is poisoned
 * before the launch, so a value the kernel never wrote counts as
 * non-finite. The GPU call has a block mask built for it on the GPU (for a
 * mod with a mask_mod), the reference has none: built from the mod, the
 * mask must not change the result.
 *
 * The forward's check runs a case on (1, 2, Sc, D), Sc = --check-seq or
 * else min(S, 1024). A decode step's runs on (min(B, 2), KV', Q) with
 * KV' = --check-seq or else min(KV, 4096), the queries at the end of the
 * sequences and K/V as the timed step has them: contiguous, or in a
 * paged cache whose rows no key lives in hold NaN (a kernel must never
 * read them).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

/* A 16-bit NaN in bf16 and fp16: the poison of outputs and unused rows. */
#define POISON16 0xFFFFu

/* The GPU's hout / hlse (n outputs, rows LSEs) against the reference. */
static void compare(fg_dtype dt, const uint16_t *hout, const float *hlse, const double *ref, const double *ref_lse,
                    size_t n, size_t rows, bench_accuracy *acc) {
    double num = 0, den = 0, lse_err = 0;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double x = dt == FG_BF16 ? fgi_bf16_to_float(hout[i]) : fgi_fp16_to_float(hout[i]);
        if (!isfinite(x)) {
            bad++;
            continue;
        }
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    for (size_t i = 0; i < rows; i++) {
        if (isinf(ref_lse[i]) && isinf(hlse[i]) && ref_lse[i] < 0 && hlse[i] < 0) continue;
        double e = fabs((double)hlse[i] - ref_lse[i]);
        if (!(e <= lse_err)) lse_err = isfinite(e) ? e : INFINITY;
    }
    acc->err_out = den > 0 ? sqrt(num / den) : sqrt(num);
    acc->err_lse = lse_err;
    acc->nonfinite = bad;
    acc->checked = true;
}

/* Device copies of what a call reads and writes. */
typedef struct device_call {
    CUdeviceptr q, k, v, out, lse, kv_lens, q_offsets, table;
} device_call;

static void device_call_free(const device_call *m) {
    const CUdeviceptr p[] = {m->q, m->k, m->v, m->out, m->lse, m->kv_lens, m->q_offsets, m->table};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) fgi_cu()->cuMemFree(p[i]);
}

/* The device call `a` for the host call h (nq elements in q and out, nk
 * in k and v), its out poisoned. */
static fg_status device_call_make(fg_ctx *ctx, const fg_attention_args *h, size_t nq, size_t nk, device_call *m,
                                  fg_attention_args *a) {
    const size_t rows = nq / (size_t)h->head_dim, B = (size_t)h->batch;
    FGI_TRY(bench_upload_halves(ctx, h->q, nq, &m->q));
    FGI_TRY(bench_upload_halves(ctx, h->k, nk, &m->k));
    FGI_TRY(bench_upload_halves(ctx, h->v, nk, &m->v));
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&m->out, nq * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&m->lse, sizeof(float) * rows), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemsetD8(m->out, 0xff, nq * 2), "cuMemsetD8");
    if (h->kv_lens) FGI_TRY(bench_upload_ints(ctx, h->kv_lens, B, &m->kv_lens));
    if (h->q_offsets) FGI_TRY(bench_upload_ints(ctx, h->q_offsets, B, &m->q_offsets));
    if (h->block_table) FGI_TRY(bench_upload_ints(ctx, h->block_table, B * (size_t)h->max_pages, &m->table));
    *a = *h;
    a->q = (const void *)(uintptr_t)m->q, a->k = (const void *)(uintptr_t)m->k;
    a->v = (const void *)(uintptr_t)m->v, a->out = (void *)(uintptr_t)m->out;
    a->lse = (float *)(uintptr_t)m->lse;
    a->kv_lens = (const int32_t *)(uintptr_t)m->kv_lens;
    a->q_offsets = (const int32_t *)(uintptr_t)m->q_offsets;
    a->block_table = (const int32_t *)(uintptr_t)m->table;
    return FG_OK;
}

/* The call h -- host q, k, v (nq elements in q, nk in k and v) and int32
 * arrays; out, lse, binds and block_mask not read -- with the parameter
 * values s, on the GPU and in the reference. */
static fg_status check_call(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *h, size_t nk,
                            const bench_params *s, bench_accuracy *acc) {
    const size_t rows = (size_t)h->batch * h->heads_q * h->q_len, nq = rows * (size_t)h->head_dim;
    bench_dev_params d = {0};
    device_call m = {0};
    fg_block_mask *bm = NULL;
    fg_attention_args a = *h;
    uint16_t *hout = malloc(nq * 2);
    float *hlse = malloc(sizeof(float) * rows);
    double *ref = malloc(sizeof(double) * nq), *ref_lse = malloc(sizeof(double) * rows);
    fg_status st = hout && hlse && ref && ref_lse ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) st = bench_dev_params_upload(ctx, s, &d);
    if (st == FG_OK) st = device_call_make(ctx, h, nq, nk, &m, &a);
    const int q_offset = h->q_offsets ? h->q_offsets[0] : h->q_offset; /* equal for every sequence */
    if (st == FG_OK && fg_mod_has_mask(mod))
        st = bench_block_mask_create(ctx, mod, h->batch, h->heads_q, h->q_len, h->kv_len, q_offset, &d, &bm);
    a.block_mask = bm, a.binds = d.binds, a.nbinds = d.n;
    if (st == FG_OK) st = fg_attention_forward(ctx, mod, &a);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hout, m.out, nq * 2), "cuMemcpyDtoH");
    if (st == FG_OK)
        st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hlse, m.lse, sizeof(float) * rows), "cuMemcpyDtoH");
    if (st == FG_OK) {
        fg_binding hb[BENCH_MAX_PARAMS];
        bench_params_bind(s, hb);
        fg_attention_args r = *h;
        r.out = ref, r.lse = NULL, r.block_mask = NULL, r.binds = hb, r.nbinds = (size_t)s->n;
        st = fg_attention_reference(ctx, mod, &r, ref, ref_lse);
    }
    if (st == FG_OK) compare(h->dtype, hout, hlse, ref, ref_lse, nq, rows, acc);
    fg_block_mask_destroy(bm);
    device_call_free(&m);
    bench_dev_params_free(&d);
    free(hout), free(hlse), free(ref), free(ref_lse);
    return st;
}

fg_status bench_check_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                           bench_accuracy *acc) {
    const int B = 1, H = 2, S = o->check_seq > 0 ? o->check_seq : (o->seq < 1024 ? o->seq : 1024);
    const size_t n = (size_t)B * H * S * o->head_dim;
    bench_params s;
    uint16_t *hq = bench_random_halves(n, o->dtype, 101), *hk = bench_random_halves(n, o->dtype, 102);
    uint16_t *hv = bench_random_halves(n, o->dtype, 103);
    fg_status st = bench_case_params(ctx, o, c, mod, B, H, S, &s);
    if (st == FG_OK && (!hq || !hk || !hv)) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory");
    fg_attention_args h = fg_attention_args_init();
    h.batch = B, h.heads_q = h.heads_kv = H, h.q_len = h.kv_len = S, h.head_dim = o->head_dim;
    h.dtype = o->dtype, h.q = hq, h.k = hk, h.v = hv;
    if (st == FG_OK) st = check_call(ctx, mod, &h, n, &s, acc);
    bench_params_free(&s);
    free(hq), free(hk), free(hv);
    return st;
}

/* ---- a decode step -------------------------------------------------------- */

/* The host side of a decode check: the inputs, and for a paged step the
 * cache and what the timed step passes with it (decode.c). */
typedef struct decode_host {
    uint16_t *q, *k, *v, *kc, *vc;
    bench_paged_step ps;
} decode_host;

static void decode_host_free(decode_host *x) {
    free(x->q), free(x->k), free(x->v), free(x->kc), free(x->vc);
    bench_paged_step_free(&x->ps);
}

/* K and V of h moved into a paged cache of `page` rows per page, as the
 * timed step has them; *nk becomes the cache's size. */
static fg_status page_decode(fg_ctx *ctx, int page, decode_host *x, fg_attention_args *h, size_t *nk) {
    FGI_TRY(bench_paged_step_make(ctx, h, page, &x->ps));
    const fg_cli_paging *pg = &x->ps.pg;
    x->kc = fg_cli_paged_copy(pg, x->k, h->heads_kv, h->kv_len, h->head_dim, NULL, POISON16);
    x->vc = fg_cli_paged_copy(pg, x->v, h->heads_kv, h->kv_len, h->head_dim, NULL, POISON16);
    if (!x->kc || !x->vc) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the paged cache");
    h->k = x->kc, h->v = x->vc;
    bench_paged_step_apply(&x->ps, h);
    *nk = fg_cli_paged_elems(pg, h->heads_kv, h->head_dim);
    return FG_OK;
}

fg_status bench_check_decode(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                             bench_decode_shape shape, int page, bench_accuracy *acc) {
    const int longest = o->check_seq > 0 ? o->check_seq : 4096;
    const int B = shape.batch < 2 ? shape.batch : 2, KV = shape.kv_len < longest ? shape.kv_len : longest;
    const int Q = shape.q_len, D = o->head_dim;
    size_t nq = (size_t)B * o->heads * Q * D, nk = (size_t)B * o->kv_heads * KV * D;
    decode_host x;
    memset(&x, 0, sizeof x);
    bench_params s;
    fg_status st = bench_case_params(ctx, o, c, mod, B, o->heads, KV, &s);
    x.q = bench_random_halves(nq, o->dtype, 101);
    x.k = bench_random_halves(nk, o->dtype, 102);
    x.v = bench_random_halves(nk, o->dtype, 103);
    if (st == FG_OK && (!x.q || !x.k || !x.v)) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory");
    fg_attention_args h = fg_attention_args_init();
    h.batch = B, h.heads_q = o->heads, h.heads_kv = o->kv_heads, h.q_len = Q, h.kv_len = KV, h.head_dim = D;
    h.dtype = o->dtype, h.q = x.q, h.k = x.k, h.v = x.v;
    h.q_offset = KV - Q; /* the newest tokens */
    if (st == FG_OK && page > 0) st = page_decode(ctx, page, &x, &h, &nk);
    if (st == FG_OK) st = check_call(ctx, mod, &h, nk, &s, acc);
    bench_params_free(&s);
    decode_host_free(&x);
    return st;
}
