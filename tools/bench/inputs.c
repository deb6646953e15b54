/*
 * inputs.c -- what the kernels of `flexgen bench` read, in device memory:
 * random normal q, k and v (never zeros, which hide unwritten outputs and
 * run faster than real data), the out and lse they write (with --backward
 * also a random normal dout and the dq, dk and dv the backward writes), and
 * the parameter values of a case.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

/* ---- random 16-bit inputs ------------------------------------------------- */

/* Box-Muller, both values of each pair. */
uint16_t *bench_random_halves(size_t n, fg_dtype dt, uint64_t seed) {
    uint16_t *x = malloc(n * sizeof *x);
    if (!x) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(fg_cli_rand_uniform_pos(&s)));
        double t = 6.283185307179586 * fg_cli_rand_uniform_pos(&s);
        float a = (float)(r * cos(t)), b = (float)(r * sin(t));
        x[i] = dt == FG_BF16 ? fgi_float_to_bf16(a) : fgi_float_to_fp16(a);
        if (i + 1 < n) x[i + 1] = dt == FG_BF16 ? fgi_float_to_bf16(b) : fgi_float_to_fp16(b);
    }
    return x;
}

fg_status bench_upload_halves(fg_ctx *ctx, const uint16_t *h, size_t n, CUdeviceptr *out) {
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(out, n * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(*out, h, n * 2), "cuMemcpyHtoD");
    return FG_OK;
}

/* ---- the timed runs' tensors ---------------------------------------------- */

fg_status bench_inputs_alloc(fg_ctx *ctx, const bench_opts *o, bench_inputs *in) {
    size_t n = (size_t)o->batch * o->heads * o->seq * o->head_dim;
    memset(in, 0, sizeof *in);
    CUdeviceptr *random[4] = {&in->q, &in->k, &in->v, &in->dout};
    for (int t = 0; t < (o->backward ? 4 : 3); t++) {
        uint16_t *h = bench_random_halves(n, o->dtype, 1 + (uint64_t)t);
        if (!h) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the inputs");
        CUdeviceptr *p = random[t];
        fg_status st = bench_upload_halves(ctx, h, n, p);
        free(h);
        FGI_TRY(st);
    }
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->out, n * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->lse, sizeof(float) * (size_t)o->batch * o->heads * o->seq),
               "cuMemAlloc");
    if (o->backward) {
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->dq, n * 2), "cuMemAlloc");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->dk, n * 2), "cuMemAlloc");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->dv, n * 2), "cuMemAlloc");
    }
    return FG_OK;
}

void bench_inputs_free(const bench_inputs *in) {
    const CUdeviceptr p[] = {in->q, in->k, in->v, in->out, in->lse, in->dout, in->dq, in->dk, in->dv};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) fgi_cu()->cuMemFree(p[i]);
}

/* ---- parameter values ----------------------------------------------------- */

void bench_dev_params_free(bench_dev_params *d) {
    for (size_t i = 0; i < d->n; i++)
        if (d->mem[i]) fgi_cu()->cuMemFree(d->mem[i]);
    memset(d, 0, sizeof *d);
}

fg_status bench_dev_params_upload(fg_ctx *ctx, const bench_params *s, bench_dev_params *d) {
    memset(d, 0, sizeof *d);
    bench_params_bind(s, d->binds);
    d->n = (size_t)s->n;
    for (int i = 0; i < s->n; i++) {
        const bench_param *p = &s->p[i];
        if (p->kind != FG_PARAM_BUFFER || p->length == 0) continue;
        size_t bytes = (size_t)p->length * 4;
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&d->mem[i], bytes), "cuMemAlloc");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(d->mem[i], p->data, bytes), "cuMemcpyHtoD");
        d->binds[i].value.buffer.data = (const void *)(uintptr_t)d->mem[i];
    }
    return FG_OK;
}
