/*
 * timing.c -- the timed loop of `flexgen bench`: `warmup` untimed launches,
 * then `iters` launches each between two CUDA events on the default
 * stream, one synchronisation at the end, and the median of the event
 * times (the mean of the middle two for an even count), which a stray slow
 * launch does not move. Where asked (decode steps, whose K/V of a short
 * walk would otherwise stay in the L2 from one launch to the next), a
 * buffer larger than the L2 is written before each timed launch, outside
 * its events, as triton.testing.do_bench does. The launches it times are
 * a forward pass, a backward pass, a block-mask rebuild and a launch of a
 * cached kernel.
 *
 * The host's side of a launch is timed too: the wall-clock time of a
 * burst of back-to-back launches with nothing else in the timed region (no
 * synchronisation: the device runs behind), divided by the burst's length,
 * the median over rounds with the device drained between them -- so the
 * queue of pending launches never fills and makes a launch wait -- and
 * apart the first launch of each burst, the one right after the drain: a
 * serving loop that waits for every step's result pays that one each time
 * (a launch that takes stream-ordered memory may find the pool given back
 * at the synchronisation).
 */
#include <stdlib.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of t[0 .. n) (sorted in place), the mean of the middle two
 * for an even n. */
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

fg_status bench_time_median(fg_ctx *ctx, bench_launch_fn fn, void *arg, int warmup, int iters,
                            CUdeviceptr flush, double *ms) {
    const fgi_cu_api *cu = fgi_cu();
    for (int i = 0; i < warmup; i++) FGI_TRY(fn(ctx, arg));
    CUevent *ev = calloc((size_t)iters * 2, sizeof *ev);
    double *t = calloc((size_t)iters, sizeof *t);
    fg_status st = ev && t ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    int made = 0;
    for (; st == FG_OK && made < iters * 2; made++)
        st = fgi_cu_status(ctx, cu->cuEventCreate(&ev[made], CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        if (flush) st = fgi_cu_status(ctx, cu->cuMemsetD8Async(flush, 0, BENCH_L2_FLUSH_BYTES, NULL), "cuMemsetD8Async");
        if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i], NULL), "cuEventRecord");
        if (st == FG_OK) st = fn(ctx, arg);
        if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i + 1], NULL), "cuEventRecord");
    }
    if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuCtxSynchronize(), "cuCtxSynchronize");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        float e = 0;
        st = fgi_cu_status(ctx, cu->cuEventElapsedTime(&e, ev[2 * i], ev[2 * i + 1]), "cuEventElapsedTime");
        t[i] = e;
    }
    if (st == FG_OK) *ms = median(t, iters);
    for (int i = 0; i < made; i++) cu->cuEventDestroy(ev[i]);
    free(ev);
    free(t);
    return st;
}

fg_status bench_host_us(fg_ctx *ctx, bench_launch_fn fn, void *arg, int rounds, int burst, double *us,
                        double *first_us) {
    double *t = calloc((size_t)rounds * 2, sizeof *t), *first = t + rounds;
    if (!t) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    fg_status st = FG_OK;
    for (int i = 0; st == FG_OK && i < rounds; i++) {
        st = bench_sync(ctx);
        const double t0 = fgi_now_ms();
        if (st == FG_OK) st = fn(ctx, arg);
        const double t1 = fgi_now_ms();
        for (int j = 1; st == FG_OK && j < burst; j++) st = fn(ctx, arg);
        t[i] = (fgi_now_ms() - t0) * 1e3 / burst;
        first[i] = (t1 - t0) * 1e3;
    }
    if (st == FG_OK) st = bench_sync(ctx);
    if (st == FG_OK) *us = median(t, rounds), *first_us = median(first, rounds);
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

fg_status bench_launch_kernel(fg_ctx *ctx, void *p) {
    bench_kernel_arg *a = p;
    return fg_kernel_launch(ctx, a->kernel, &a->args);
}

fg_status bench_launch_rebuild(fg_ctx *ctx, void *p) {
    bench_rebuild_arg *a = p;
    return fg_block_mask_rebuild_gpu(ctx, a->mask, a->mod, a->binds, a->nbinds, NULL);
}
