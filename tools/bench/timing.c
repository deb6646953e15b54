/*
 * timing.c -- the timed loop of `flexgen bench`: `warmup` untimed launches,
 * then `iters` launches each between two CUDA events on the default
 * stream, one synchronisation at the end, and the median of the event
 * times (the mean of the middle two for an even count), which a stray slow
 * launch does not move. The launches it times are a forward pass, a
 * backward pass and a block-mask rebuild.
 */
#include <stdlib.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

fg_status bench_time_median(fg_ctx *ctx, bench_launch_fn fn, void *arg, int warmup, int iters, double *ms) {
    const fgi_cu_api *cu = fgi_cu();
    for (int i = 0; i < warmup; i++) FGI_TRY(fn(ctx, arg));
    CUevent *ev = calloc((size_t)iters * 2, sizeof *ev);
    double *t = calloc((size_t)iters, sizeof *t);
    fg_status st = ev && t ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    int made = 0;
    for (; st == FG_OK && made < iters * 2; made++)
        st = fgi_cu_status(ctx, cu->cuEventCreate(&ev[made], CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i], NULL), "cuEventRecord");
        if (st == FG_OK) st = fn(ctx, arg);
        if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i + 1], NULL), "cuEventRecord");
    }
    if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuCtxSynchronize(), "cuCtxSynchronize");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        float e = 0;
        st = fgi_cu_status(ctx, cu->cuEventElapsedTime(&e, ev[2 * i], ev[2 * i + 1]), "cuEventElapsedTime");
        t[i] = e;
    }
    if (st == FG_OK) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        *ms = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    }
    for (int i = 0; i < made; i++) cu->cuEventDestroy(ev[i]);
    free(ev);
    free(t);
    return st;
}

fg_status bench_sync(fg_ctx *ctx) {
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxSynchronize(), "cuCtxSynchronize");
    return FG_OK;
}

fg_status bench_launch_forward(fg_ctx *ctx, void *p) {
    bench_fwd_arg *a = p;
    return fg_attention_forward(ctx, a->mod, &a->args);
}

fg_status bench_launch_backward(fg_ctx *ctx, void *p) {
    bench_bwd_arg *a = p;
    return fg_attention_backward(ctx, a->mod, &a->args);
}

fg_status bench_launch_rebuild(fg_ctx *ctx, void *p) {
    bench_rebuild_arg *a = p;
    return fg_block_mask_rebuild_gpu(ctx, a->mask, a->mod, a->binds, a->nbinds, NULL);
}
