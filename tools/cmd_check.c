/*
 * cmd_check.c -- `flexgen check`: run the GPU forward kernel against the CPU
 * reference on fresh random inputs, and optionally time it.
 *
 *   flexgen check --mask FILE [--score FILE] --batch B --heads H [--kv-heads H]
 *                 --q-len N [--kv-len N] --head-dim D --dtype bf16|fp16
 *                 [--set NAME=VALUE] [--buffer NAME=FILE] [--seed N]
 *                 [--dist uniform|normal] [--block-mask] [--block N]
 *                 [--q-offset N] [--kv-offset N] [--scale X] [--time N]
 *
 * The outputs are poisoned (all bits set: NaN) before the launch, so a value
 * the kernel forgot to write shows up as non-finite. The reference is the
 * library's float64 one, evaluated with the mod itself (no block mask: a
 * block mask built from the mod must not change the result, so the check
 * also covers the GPU block-mask builder). On large problems the reference
 * would take minutes; then only batch 0 and the query heads of the first kv
 * head are compared (the message says so).
 *
 * --time N times N launches with device events after three warm-up
 * launches and prints the median and TFLOP/s, counting FLOPs as
 * FlexAttention's benchmark does: 4 * B * Hq * Q_LEN * KV_LEN * D * density,
 * with density the fraction of (q, kv) pairs the mask keeps, measured here
 * at b = 0, h = 0 (through the block mask when there is one: full blocks
 * count whole, partial blocks are evaluated).
 *
 * Exit codes: 0 within tolerance, 5 (FG_EXIT_TOLERANCE) over it, 4 without
 * a GPU, and the usual codes for bad options and bad mods (cli.h).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cudrv.h"
#include "flexgen.h"

/* Multiply-adds the reference may spend on the whole problem before the
 * check falls back to one slice (about ten seconds on one core). */
#define CHECK_BUDGET 1.0e10

typedef struct options {
    fg_cli_mod_args mod;
    int batch, heads, kv_heads, q_len, kv_len, head_dim;
    fg_dtype dtype;
    int seed, block, time_n, q_offset, kv_offset;
    bool block_mask, normal, no_reference;
    double scale;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen check --mask FILE [--score FILE] --batch B --heads H [--kv-heads H]\n"
            "                     --q-len N [--kv-len N] --head-dim D --dtype bf16|fp16\n"
            "                     [--set NAME=VALUE] [--buffer NAME=FILE] [--seed N]\n"
            "                     [--dist uniform|normal] [--block-mask] [--block N]\n"
            "                     [--q-offset N] [--kv-offset N] [--scale X] [--time N]\n"
            "                     [--no-reference]\n"
            "Run the GPU forward kernel against the CPU reference (float64) on fresh random\n"
            "inputs and print the relative Frobenius error of out, the largest LSE error and\n"
            "the count of non-finite values. Tolerance: 1e-2 (bf16) / 2e-3 (fp16) on out,\n"
            "1e-3 (1 + |lse|) on LSE. --block-mask builds a block mask on the GPU (blocks of\n"
            "--block, default 128); --time N also times N launches (median, TFLOP/s);\n"
            "--no-reference skips the CPU reference (timing only; outputs are still\n"
            "checked for unwritten or non-finite values).\n"
            "Exit: 0 within tolerance, 5 over it, 4 no GPU.\n%s%s",
            fg_cli_mod_help, fg_cli_bind_help);
}

enum { OPT_BATCH = 0x2000, OPT_HEADS, OPT_KV_HEADS, OPT_Q_LEN, OPT_KV_LEN, OPT_HEAD_DIM, OPT_DTYPE,
       OPT_SEED, OPT_DIST, OPT_BLOCK_MASK, OPT_BLOCK, OPT_Q_OFFSET, OPT_KV_OFFSET, OPT_SCALE,
       OPT_TIME, OPT_NO_REFERENCE };

static int *int_option(options *o, int opt, long long *lo, long long *hi) {
    *lo = 1, *hi = 1 << 30;
    switch (opt) {
    case OPT_BATCH: return &o->batch;
    case OPT_HEADS: return &o->heads;
    case OPT_KV_HEADS: return &o->kv_heads;
    case OPT_Q_LEN: return &o->q_len;
    case OPT_KV_LEN: return &o->kv_len;
    case OPT_HEAD_DIM: return &o->head_dim;
    case OPT_BLOCK: return &o->block;
    case OPT_TIME: return &o->time_n;
    case OPT_SEED: *lo = 0; *hi = 2147483647; return &o->seed;
    case OPT_Q_OFFSET: *lo = -(1ll << 30); return &o->q_offset;
    case OPT_KV_OFFSET: *lo = -(1ll << 30); return &o->kv_offset;
    }
    return NULL;
}

/* FG_EXIT_OK to go on, -1 after --help, else an exit code. */
static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        FG_CLI_MOD_LONGOPTS,
        FG_CLI_BIND_LONGOPTS,
        {"batch", required_argument, 0, OPT_BATCH},
        {"heads", required_argument, 0, OPT_HEADS},
        {"kv-heads", required_argument, 0, OPT_KV_HEADS},
        {"q-len", required_argument, 0, OPT_Q_LEN},
        {"kv-len", required_argument, 0, OPT_KV_LEN},
        {"head-dim", required_argument, 0, OPT_HEAD_DIM},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"seed", required_argument, 0, OPT_SEED},
        {"dist", required_argument, 0, OPT_DIST},
        {"block-mask", no_argument, 0, OPT_BLOCK_MASK},
        {"block", required_argument, 0, OPT_BLOCK},
        {"q-offset", required_argument, 0, OPT_Q_OFFSET},
        {"kv-offset", required_argument, 0, OPT_KV_OFFSET},
        {"scale", required_argument, 0, OPT_SCALE},
        {"time", required_argument, 0, OPT_TIME},
        {"no-reference", no_argument, 0, OPT_NO_REFERENCE},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    fg_cli_mod_args_init(&o->mod);
    o->batch = o->heads = 1;
    o->head_dim = 128;
    o->dtype = FG_BF16;
    o->block = 128;
    o->seed = 1;
    o->normal = true;
    optind = 0; /* glibc: restart scanning, argv[0] is the command name */
    int c, li;
    while ((c = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        long long lo, hi;
        int *ip = int_option(o, c, &lo, &hi);
        if (c == 'h') {
            usage(stdout);
            return -1;
        } else if (ip) {
            if (fg_cli_parse_int(optarg, longopts[li].name, lo, hi, ip)) return FG_EXIT_USAGE;
        } else if (c == OPT_DTYPE) {
            if (!strcmp(optarg, "bf16")) o->dtype = FG_BF16;
            else if (!strcmp(optarg, "fp16")) o->dtype = FG_FP16;
            else return fg_cli_error(FG_EXIT_USAGE, "check: --dtype must be bf16 or fp16, not '%s'", optarg);
        } else if (c == OPT_DIST) {
            if (!strcmp(optarg, "normal")) o->normal = true;
            else if (!strcmp(optarg, "uniform")) o->normal = false;
            else return fg_cli_error(FG_EXIT_USAGE, "check: --dist must be uniform or normal, not '%s'", optarg);
        } else if (c == OPT_SCALE) {
            if (fg_cli_parse_double(optarg, "scale", &o->scale)) return FG_EXIT_USAGE;
        } else if (c == OPT_BLOCK_MASK) {
            o->block_mask = true;
        } else if (c == OPT_NO_REFERENCE) {
            o->no_reference = true;
        } else {
            int r = fg_cli_mod_option(&o->mod, c, optarg);
            if (r < 0) return FG_EXIT_USAGE;
            if (r == 0) {
                usage(stderr);
                return FG_EXIT_USAGE;
            }
        }
    }
    if (optind < argc) return fg_cli_error(FG_EXIT_USAGE, "check: unexpected argument '%s'", argv[optind]);
    if (!fg_cli_has_mod(&o->mod))
        return fg_cli_error(FG_EXIT_USAGE, "check: needs a mod (--mask FILE and/or --score FILE)");
    if (o->q_len <= 0) return fg_cli_error(FG_EXIT_USAGE, "check: needs --q-len N");
    if (o->kv_len <= 0) o->kv_len = o->q_len;
    if (o->kv_heads <= 0) o->kv_heads = o->heads;
    return FG_EXIT_OK;
}

/* ---- inputs ------------------------------------------------------------------ */

/* An input as a 16-bit float, rounded to nearest even. fp16 keeps this
 * command's own range rule, so that a seed goes on giving the inputs it
 * gave: magnitudes under the normal range become 0 (no subnormals) and
 * those from 2^16 up saturate at 65504. */
static uint16_t to16(fg_dtype dt, float f) {
    if (dt == FG_BF16) return fgi_float_to_bf16(f);
    float a = fabsf(f);
    if (a < 0x1p-14f) f = copysignf(0.0f, f);
    else if (!(a < 65536.0f)) f = copysignf(65504.0f, f);
    return fgi_float_to_fp16(f);
}

static double from16(fg_dtype dt, uint16_t h) {
    return dt == FG_BF16 ? fgi_bf16_to_float(h) : fgi_fp16_to_float(h);
}

/* Normal (Box-Muller) or uniform in [-1, 1). */
static uint16_t *random_tensor(size_t n, fg_dtype dt, bool normal, uint64_t *s) {
    uint16_t *x = malloc(n * 2);
    if (!x) return NULL;
    for (size_t i = 0; i < n; i++) {
        double u = fg_cli_rand_uniform(s), v;
        if (normal) v = sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * fg_cli_rand_uniform(s));
        else v = 2 * u - 1;
        x[i] = to16(dt, (float)v);
    }
    return x;
}

/* ---- device memory ------------------------------------------------------------ */

typedef struct device {
    CUdeviceptr q, k, v, out, lse;
    CUdeviceptr buf[FG_CLI_MAX_ITEMS];
    fg_binding binds[FG_CLI_MAX_ITEMS];
    size_t nbinds;
} device;

static fg_status upload(fg_ctx *ctx, CUdeviceptr *d, const void *p, size_t bytes) {
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(d, bytes), "cuMemAlloc");
    if (p) FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(*d, p, bytes), "cuMemcpyHtoD");
    return FG_OK;
}

static fg_status device_binds(fg_ctx *ctx, const fg_cli_bindings *host, device *dev) {
    for (size_t i = 0; i < host->n; i++) {
        dev->binds[i] = host->binds[i];
        dev->nbinds = i + 1;
        if (host->binds[i].kind != FG_PARAM_BUFFER || host->binds[i].value.buffer.length == 0) continue;
        FGI_TRY(upload(ctx, &dev->buf[i], host->binds[i].value.buffer.data,
                       (size_t)host->binds[i].value.buffer.length * 4));
        dev->binds[i].value.buffer.data = (const void *)(uintptr_t)dev->buf[i];
    }
    return FG_OK;
}

static void device_free(device *d) {
    CUdeviceptr all[5] = {d->q, d->k, d->v, d->out, d->lse};
    for (int i = 0; i < 5; i++)
        if (all[i]) fgi_cu()->cuMemFree(all[i]);
    for (size_t i = 0; i < d->nbinds; i++)
        if (d->buf[i]) fgi_cu()->cuMemFree(d->buf[i]);
}

/* ---- comparison ---------------------------------------------------------------- */

typedef struct result {
    double rel, lse_err;
    long nonfinite, lse_mismatch;
    int checked_batch, checked_heads;
} result;

/* Reference on batch 0 x the query heads of kv head 0 when the whole
 * problem is over budget, else on everything. */
static fg_status compare(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *run, const options *o,
                         const uint16_t *hq, const uint16_t *hk, const uint16_t *hv, const uint16_t *gout,
                         const float *glse, result *r) {
    fg_attention_args a = *run;
    a.q = hq, a.k = hk, a.v = hv, a.lse = NULL, a.block_mask = NULL, a.stream = NULL;
    double work = (double)o->batch * o->heads * o->q_len * (double)o->kv_len * o->head_dim;
    if (work > CHECK_BUDGET) {
        a.batch = 1;
        a.heads_q = o->heads / o->kv_heads;
        a.heads_kv = 1;
    }
    /* Contiguous BHSD: the slice is the first rows of every tensor, with
     * the full problem's strides. */
    const int64_t qs[4] = {(int64_t)o->heads * o->q_len * o->head_dim, (int64_t)o->q_len * o->head_dim,
                           o->head_dim, 1};
    const int64_t ks[4] = {(int64_t)o->kv_heads * o->kv_len * o->head_dim,
                           (int64_t)o->kv_len * o->head_dim, o->head_dim, 1};
    memcpy(a.q_stride, qs, sizeof qs), memcpy(a.out_stride, qs, sizeof qs);
    memcpy(a.k_stride, ks, sizeof ks), memcpy(a.v_stride, ks, sizeof ks);
    const size_t rows = (size_t)a.batch * a.heads_q * o->q_len, D = (size_t)o->head_dim;
    double *rout = malloc(sizeof(double) * rows * D), *rlse = malloc(sizeof(double) * rows);
    if (!rout || !rlse) {
        free(rout), free(rlse);
        return FG_ERR_OUT_OF_MEMORY;
    }
    fg_status st = fg_attention_reference(ctx, mod, &a, rout, rlse);
    memset(r, 0, sizeof *r);
    r->checked_batch = a.batch, r->checked_heads = a.heads_q;
    double num = 0, den = 0;
    for (int b = 0; st == FG_OK && b < a.batch; b++)
        for (int h = 0; h < a.heads_q; h++)
            for (int i = 0; i < o->q_len; i++) {
                size_t rr = ((size_t)b * a.heads_q + h) * o->q_len + i;
                size_t gr = ((size_t)b * o->heads + h) * o->q_len + i;
                for (size_t d = 0; d < D; d++) {
                    double g = from16(o->dtype, gout[gr * D + d]), x = rout[rr * D + d];
                    if (!isfinite(g)) r->nonfinite++;
                    num += (g - x) * (g - x);
                    den += x * x;
                }
                double gl = glse[gr], xl = rlse[rr];
                if (isnan(gl)) r->nonfinite++;
                else if (isinf(xl) || isinf(gl)) r->lse_mismatch += !(isinf(xl) && isinf(gl) && gl < 0);
                else if (fabs(gl - xl) / (1 + fabs(xl)) > r->lse_err) r->lse_err = fabs(gl - xl) / (1 + fabs(xl));
            }
    r->rel = den > 0 ? sqrt(num / den) : sqrt(num);
    free(rout), free(rlse);
    return st;
}

/* ---- density and timing -------------------------------------------------------- */

/* Fraction of (q, kv) pairs kept at b = 0, h = 0, evaluated in tiles (only
 * the partial blocks when there is a block mask). */
static fg_status density_of(fg_ctx *ctx, const fg_mod *mod, const fg_cli_bindings *hb,
                            const fg_block_mask *bm, const options *o, double *density) {
    *density = 1.0;
    if (!fg_mod_has_mask(mod) && !bm) return FG_OK;
    const int T = 128;
    uint8_t *m = malloc((size_t)T * T);
    if (!m) return FG_ERR_OUT_OF_MEMORY;
    double kept = 0;
    fg_status st = FG_OK;
    const int32_t *num = NULL, *idx = NULL, *fnum = NULL, *fidx = NULL;
    int64_t dims[4] = {0, 0, 0, 0};
    fg_block_mask_desc d;
    if (bm) {
        fg_block_mask_get_desc(bm, &d);
        fg_block_mask_array_get(bm, FG_BM_KV_NUM_BLOCKS, &num, NULL, dims);
        fg_block_mask_array_get(bm, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
        fg_block_mask_array_get(bm, FG_BM_FULL_KV_INDICES, &fidx, NULL, NULL);
        fg_block_mask_array_get(bm, FG_BM_KV_INDICES, &idx, NULL, dims);
    }
    for (int q0 = 0; st == FG_OK && q0 < o->q_len; q0 += bm ? d.q_block : T) {
        const int nq = o->q_len - q0 < (bm ? d.q_block : T) ? o->q_len - q0 : (bm ? d.q_block : T);
        if (!bm) {
            for (int k0 = 0; st == FG_OK && k0 < o->kv_len; k0 += T) {
                const int nk = o->kv_len - k0 < T ? o->kv_len - k0 : T;
                st = fg_mod_eval_mask(ctx, mod, hb->binds, hb->n, 0, 0, q0 + o->q_offset, nq,
                                      k0 + o->kv_offset, nk, m);
                for (int i = 0; i < nq * nk; i++) kept += m[i];
            }
            continue;
        }
        const int qb = q0 / d.q_block, KB = (int)dims[3];
        for (int i = 0; i < fnum[qb]; i++) {
            int k0 = fidx[(int64_t)qb * KB + i] * d.kv_block;
            int nk = o->kv_len - k0 < d.kv_block ? o->kv_len - k0 : d.kv_block;
            kept += (double)nq * nk;
        }
        for (int i = 0; st == FG_OK && i < num[qb]; i++) {
            int k0 = idx[(int64_t)qb * KB + i] * d.kv_block;
            int nk = o->kv_len - k0 < d.kv_block ? o->kv_len - k0 : d.kv_block;
            for (int s0 = 0; st == FG_OK && s0 < nq; s0 += T / 4) { /* stay within the T x T scratch */
                int ns = nq - s0 < T / 4 ? nq - s0 : T / 4;
                for (int t0 = 0; st == FG_OK && t0 < nk; t0 += T) {
                    int nt = nk - t0 < T ? nk - t0 : T;
                    st = fg_mod_eval_mask(ctx, mod, hb->binds, hb->n, 0, 0, q0 + s0 + o->q_offset, ns,
                                          k0 + t0 + o->kv_offset, nt, m);
                    for (int j = 0; j < ns * nt; j++) kept += m[j];
                }
            }
        }
    }
    free(m);
    *density = kept / ((double)o->q_len * o->kv_len);
    return st;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static fg_status time_runs(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, int n, double *median_ms) {
    fg_kernel_config cfg = {.kind = FG_KERNEL_ATTENTION_FWD, .dtype = a->dtype, .head_dim = a->head_dim};
    fg_kernel *k;
    FGI_TRY(fg_kernel_get(ctx, mod, &cfg, &k));
    CUevent e0 = NULL, e1 = NULL;
    float *ms = malloc(sizeof(float) * (size_t)n);
    fg_status st = ms ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; st == FG_OK && i < 3; i++) st = fg_kernel_launch(ctx, k, a);
    for (int i = 0; st == FG_OK && i < n; i++) {
        st = fgi_cu_status(ctx, fgi_cu()->cuEventRecord(e0, (CUstream)a->stream), "cuEventRecord");
        if (st == FG_OK) st = fg_kernel_launch(ctx, k, a);
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventRecord(e1, (CUstream)a->stream), "cuEventRecord");
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventSynchronize(e1), "cuEventSynchronize");
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventElapsedTime(&ms[i], e0, e1), "cuEventElapsedTime");
    }
    if (st == FG_OK) {
        qsort(ms, (size_t)n, sizeof *ms, cmp_float);
        *median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    }
    if (e0) fgi_cu()->cuEventDestroy(e0);
    if (e1) fgi_cu()->cuEventDestroy(e1);
    free(ms);
    fg_kernel_release(k);
    return st;
}

/* ---- the command ------------------------------------------------------------------ */

typedef struct state {
    options o;
    fg_ctx *ctx;
    fg_mod *mod;
    fg_cli_bindings hb;
    bool have_hb;
    device dev;
    fg_block_mask *bm;
    uint16_t *hq, *hk, *hv, *gout;
    float *glse;
} state;

static int run_check(state *s) {
    options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    int rc = fg_cli_load_mod(ctx, &o->mod, &s->mod);
    if (rc) return rc;
    rc = fg_cli_bind(ctx, s->mod, &o->mod, &s->hb);
    if (rc) return rc;
    s->have_hb = true;
    fg_status st = fgi_cuda_ready(ctx);
    if (st == FG_ERR_NO_DEVICE)
        return fg_cli_error(FG_EXIT_NO_GPU, "check: no usable CUDA device (%s): the check needs a GPU",
                            fg_errmsg(ctx));
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");

    const size_t D = (size_t)o->head_dim;
    const size_t nq = (size_t)o->batch * o->heads * o->q_len * D;
    const size_t nk = (size_t)o->batch * o->kv_heads * o->kv_len * D;
    const size_t nl = (size_t)o->batch * o->heads * o->q_len;
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ ((uint64_t)o->seed * 0x100000001b3ull);
    s->hq = random_tensor(nq, o->dtype, o->normal, &seed);
    s->hk = random_tensor(nk, o->dtype, o->normal, &seed);
    s->hv = random_tensor(nk, o->dtype, false, &seed);
    s->gout = malloc(nq * 2);
    s->glse = malloc(nl * 4);
    if (!s->hq || !s->hk || !s->hv || !s->gout || !s->glse)
        return fg_cli_error(FG_EXIT_OTHER, "check: out of host memory");

    device *dv = &s->dev;
    st = upload(ctx, &dv->q, s->hq, nq * 2);
    if (st == FG_OK) st = upload(ctx, &dv->k, s->hk, nk * 2);
    if (st == FG_OK) st = upload(ctx, &dv->v, s->hv, nk * 2);
    if (st == FG_OK) st = upload(ctx, &dv->out, NULL, nq * 2);
    if (st == FG_OK) st = upload(ctx, &dv->lse, NULL, nl * 4);
    if (st == FG_OK) st = device_binds(ctx, &s->hb, dv);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemsetD8(dv->out, 0xff, nq * 2), "cuMemsetD8");
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemsetD8(dv->lse, 0xff, nl * 4), "cuMemsetD8");
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");

    if (o->block_mask) {
        fg_block_mask_desc bd = {.batch = o->batch, .heads = o->heads, .q_len = o->q_len, .kv_len = o->kv_len,
                                 .q_block = o->block, .kv_block = o->block};
        st = fg_block_mask_create_gpu(ctx, s->mod, &bd, dv->binds, dv->nbinds, NULL, &s->bm);
        if (st == FG_OK) st = fg_block_mask_download(ctx, s->bm);
        if (st != FG_OK) return fg_cli_fail(ctx, st, "check: block mask");
    }

    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = o->batch, a.heads_q = o->heads, a.heads_kv = o->kv_heads;
    a.q_len = o->q_len, a.kv_len = o->kv_len, a.head_dim = o->head_dim, a.dtype = o->dtype;
    a.q = (const void *)(uintptr_t)dv->q, a.k = (const void *)(uintptr_t)dv->k;
    a.v = (const void *)(uintptr_t)dv->v, a.out = (void *)(uintptr_t)dv->out;
    a.lse = (float *)(uintptr_t)dv->lse;
    a.scale = (float)o->scale;
    a.q_offset = o->q_offset, a.kv_offset = o->kv_offset;
    a.block_mask = s->bm;
    a.binds = dv->binds, a.nbinds = dv->nbinds;
    double t0 = fgi_now_ms();
    st = fg_attention_forward(ctx, s->mod, &a);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuCtxSynchronize(), "kernel execution");
    double first_ms = fgi_now_ms() - t0;
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(s->gout, dv->out, nq * 2), "cuMemcpyDtoH");
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(s->glse, dv->lse, nl * 4), "cuMemcpyDtoH");
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");

    result r;
    fg_attention_args host = a;
    host.binds = s->hb.binds, host.nbinds = s->hb.n;
    if (o->no_reference) {
        memset(&r, 0, sizeof r);
        r.checked_batch = o->batch, r.checked_heads = o->heads;
        for (size_t i = 0; i < nq; i++) r.nonfinite += !isfinite(from16(o->dtype, s->gout[i]));
        for (size_t i = 0; i < nl; i++) r.nonfinite += isnan(s->glse[i]);
    } else {
        st = compare(ctx, s->mod, &host, o, s->hq, s->hk, s->hv, s->gout, s->glse, &r);
        if (st != FG_OK) return fg_cli_fail(ctx, st, "check: reference");
    }
    const double tol = o->dtype == FG_BF16 ? 1e-2 : 2e-3;
    const bool ok = r.rel <= tol && r.lse_err <= 1e-3 && r.nonfinite == 0 && r.lse_mismatch == 0;
    printf("mod %s: B=%d Hq=%d Hkv=%d Q=%d KV=%d D=%d %s%s (first call %.1f ms)\n", fg_mod_name(s->mod),
           o->batch, o->heads, o->kv_heads, o->q_len, o->kv_len, o->head_dim,
           o->dtype == FG_BF16 ? "bf16" : "fp16", s->bm ? ", GPU block mask" : "", first_ms);
    if (o->no_reference) printf("no reference run (--no-reference): only non-finite values checked\n");
    else if (r.checked_batch != o->batch || r.checked_heads != o->heads)
        printf("checked against the reference: batch 0, query heads 0..%d (the whole problem is large)\n",
               r.checked_heads - 1);
    if (!o->no_reference) {
        printf("out: relative Frobenius error %.3e (tolerance %.0e)\n", r.rel, tol);
        printf("lse: max error %.3e (tolerance 1e-3 (1 + |lse|)), -inf mismatches %ld\n", r.lse_err,
               r.lse_mismatch);
    }
    printf("non-finite values: %ld\n", r.nonfinite);

    if (o->time_n > 0) {
        double density, ms;
        st = density_of(ctx, s->mod, &s->hb, s->bm, o, &density);
        if (st == FG_OK) st = time_runs(ctx, s->mod, &a, o->time_n, &ms);
        if (st != FG_OK) return fg_cli_fail(ctx, st, "check: timing");
        double flops = 4.0 * o->batch * o->heads * (double)o->q_len * o->kv_len * o->head_dim * density;
        printf("time: median %.3f ms over %d launches, density %.4f, %.1f TFLOP/s\n", ms, o->time_n,
               density, flops / (ms * 1e-3) / 1e12);
    }
    printf("%s\n", ok ? "PASS" : "FAIL: outside tolerance");
    return ok ? FG_EXIT_OK : FG_EXIT_TOLERANCE;
}

int fg_cmd_check(int argc, char **argv) {
    state s;
    memset(&s, 0, sizeof s);
    int rc = parse_args(argc, argv, &s.o);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    if (fg_ctx_create(&s.ctx) != FG_OK) return fg_cli_error(FG_EXIT_OTHER, "check: out of memory");
    rc = run_check(&s);
    device_free(&s.dev); /* frees only what was allocated */
    fg_block_mask_destroy(s.bm);
    if (s.have_hb) fg_cli_bindings_free(&s.hb);
    fg_mod_destroy(s.mod);
    free(s.hq), free(s.hk), free(s.hv), free(s.gout), free(s.glse);
    fg_ctx_destroy(s.ctx);
    return rc;
}
