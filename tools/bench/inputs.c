/*
 * inputs.c -- what the kernels of `flexgen bench` read, in device memory:
 * random normal q, k and v (never zeros, which hide unwritten outputs and
 * run faster than real data), the out and lse they write (with --backward
 * also a random normal dout and the dq, dk and dv the backward writes), the
 * parameter values of a case and its block mask.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "blockmask.h"
#include "cli.h"

/* The longest block of random values bench_upload_random draws (32 MiB):
 * longer tensors repeat it. */
#define RANDOM_BLOCK ((size_t)1 << 24)

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

fg_status bench_upload_random(fg_ctx *ctx, size_t n, fg_dtype dt, uint64_t seed, CUdeviceptr *out) {
    const size_t block = n < RANDOM_BLOCK ? n : RANDOM_BLOCK;
    uint16_t *h = bench_random_halves(block, dt, seed);
    if (!h) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the inputs");
    fg_status st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(out, n * 2), "cuMemAlloc");
    for (size_t at = 0; st == FG_OK && at < n; at += block) {
        const size_t m = n - at < block ? n - at : block;
        st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyHtoD(*out + at * 2, h, m * 2), "cuMemcpyHtoD");
    }
    free(h);
    return st;
}

fg_status bench_upload_ints(fg_ctx *ctx, const int32_t *h, size_t n, CUdeviceptr *out) {
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(out, n * sizeof *h), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(*out, h, n * sizeof *h), "cuMemcpyHtoD");
    return FG_OK;
}

/* ---- the timed runs' tensors ---------------------------------------------- */

fg_status bench_inputs_alloc(fg_ctx *ctx, const bench_opts *o, bench_inputs *in) {
    size_t n = (size_t)o->batch * o->heads * o->seq * o->head_dim;
    memset(in, 0, sizeof *in);
    CUdeviceptr *random[4] = {&in->q, &in->k, &in->v, &in->dout};
    for (int t = 0; t < (o->backward ? 4 : 3); t++)
        FGI_TRY(bench_upload_random(ctx, n, o->dtype, 1 + (uint64_t)t, random[t]));
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

/* ---- the block mask ------------------------------------------------------- */

fg_status bench_block_mask_create(fg_ctx *ctx, const fg_mod *mod, int B, int H, int q_len, int kv_len,
                                  int q_offset, const bench_dev_params *d, fg_block_mask **out) {
    bool uses_b, uses_h;
    fgi_bm_mask_uses(mod, &uses_b, &uses_h);
    fg_block_mask_desc desc = fg_block_mask_desc_init();
    desc.batch = uses_b ? B : 1, desc.heads = uses_h ? H : 1;
    desc.q_len = q_len, desc.kv_len = kv_len, desc.q_block = desc.kv_block = 128;
    desc.q_offset = q_offset;
    return fg_block_mask_create_gpu(ctx, mod, &desc, d->binds, d->n, NULL, out);
}
