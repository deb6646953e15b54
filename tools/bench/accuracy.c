/*
 * accuracy.c -- the accuracy check of `flexgen bench`: one case's forward
 * output on (1, 2, Sc, D), Sc = --check-seq or else min(S, 1024), from
 * fresh random inputs, against the library's float64 CPU reference, as the
 * relative Frobenius error of out, the largest LSE error, and the count of
 * non-finite outputs. The output is poisoned before the launch, so a value
 * the kernel never wrote counts as non-finite.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The accuracy check on (1, 2, Sc, D): GPU against the float64 reference. */
fg_status bench_check_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                           bench_result *r) {
    const int B = 1, H = 2, S = o->check_seq > 0 ? o->check_seq : (o->seq < 1024 ? o->seq : 1024);
    const int D = o->head_dim;
    size_t n = (size_t)B * H * S * D;
    bench_params s;
    bench_dev_params d = {0};
    fg_block_mask *bm = NULL;
    CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0, dlse = 0;
    uint16_t *hq = bench_random_halves(n, o->dtype, 101), *hk = bench_random_halves(n, o->dtype, 102);
    uint16_t *hv = bench_random_halves(n, o->dtype, 103), *hout = malloc(n * 2);
    float *hlse = malloc(sizeof(float) * (size_t)B * H * S);
    double *ref = malloc(sizeof(double) * n), *ref_lse = malloc(sizeof(double) * (size_t)B * H * S);
    fg_status st = bench_case_params(ctx, o, c, mod, B, H, S, &s);
    if (!hq || !hk || !hv || !hout || !hlse || !ref || !ref_lse) st = FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) st = bench_dev_params_upload(ctx, &s, &d);
    if (st == FG_OK) st = bench_upload_halves(ctx, hq, n, &dq);
    if (st == FG_OK) st = bench_upload_halves(ctx, hk, n, &dk);
    if (st == FG_OK) st = bench_upload_halves(ctx, hv, n, &dv);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&dout, n * 2), "cuMemAlloc");
    if (st == FG_OK)
        st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&dlse, sizeof(float) * (size_t)B * H * S), "cuMemAlloc");
    if (st == FG_OK) /* poison: an unwritten output shows as non-finite */
        st = fgi_cu_status(ctx, fgi_cu()->cuMemsetD8(dout, 0xff, n * 2), "cuMemsetD8");
    fg_block_mask_desc desc = {.batch = 1, .heads = 1, .q_len = S, .kv_len = S,
                               .q_block = 128, .kv_block = 128};
    if (st == FG_OK && fg_mod_has_mask(mod))
        st = fg_block_mask_create_gpu(ctx, mod, &desc, d.binds, d.n, NULL, &bm);
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = D;
    a.dtype = o->dtype;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.block_mask = bm, a.binds = d.binds, a.nbinds = d.n;
    if (st == FG_OK) st = fg_attention_forward(ctx, mod, &a);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hout, dout, n * 2), "cuMemcpyDtoH");
    if (st == FG_OK)
        st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hlse, dlse, sizeof(float) * (size_t)B * H * S),
                           "cuMemcpyDtoH");
    if (st == FG_OK) {
        fg_binding hb[BENCH_MAX_PARAMS];
        bench_params_bind(&s, hb);
        fg_attention_args h = a;
        h.q = hq, h.k = hk, h.v = hv, h.out = ref, h.lse = NULL, h.block_mask = NULL;
        h.binds = hb, h.nbinds = (size_t)s.n;
        st = fg_attention_reference(ctx, mod, &h, ref, ref_lse);
    }
    if (st == FG_OK) {
        double num = 0, den = 0, lse_err = 0;
        long bad = 0;
        for (size_t i = 0; i < n; i++) {
            double x = o->dtype == FG_BF16 ? fgi_bf16_to_float(hout[i]) : fgi_fp16_to_float(hout[i]);
            if (!isfinite(x)) {
                bad++;
                continue;
            }
            num += (x - ref[i]) * (x - ref[i]);
            den += ref[i] * ref[i];
        }
        for (size_t i = 0; i < (size_t)B * H * S; i++) {
            if (isinf(ref_lse[i]) && isinf(hlse[i]) && ref_lse[i] < 0 && hlse[i] < 0) continue;
            double e = fabs((double)hlse[i] - ref_lse[i]);
            if (!(e <= lse_err)) lse_err = isfinite(e) ? e : INFINITY;
        }
        r->err_out = den > 0 ? sqrt(num / den) : sqrt(num);
        r->err_lse = lse_err;
        r->nonfinite = bad;
        r->checked = true;
    }
    fg_block_mask_destroy(bm);
    if (dq) fgi_cu()->cuMemFree(dq);
    if (dk) fgi_cu()->cuMemFree(dk);
    if (dv) fgi_cu()->cuMemFree(dv);
    if (dout) fgi_cu()->cuMemFree(dout);
    if (dlse) fgi_cu()->cuMemFree(dlse);
    bench_dev_params_free(&d);
    bench_params_free(&s);
    free(hq), free(hk), free(hv), free(hout), free(hlse), free(ref), free(ref_lse);
    return st;
}
