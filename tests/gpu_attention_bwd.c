/* gpu_attention_bwd.c -- the backward kernels against the CPU reference.
 *
 * Every case draws fresh random q, k, v and dout (and, outside
 * deterministic mode, d loss / d lse), runs the GPU forward for
 * out and lse, poisons dq, dk, dv, the buffer gradients and the workspace
 * (all-ones bits: NaN in bf16, fp16 and fp32), runs fg_attention_backward
 * on that workspace and compares with
 * fg_attention_reference_backward (float64) on the same inputs, its delta
 * taken from the stored output as the backward's is (stored_o_dlse):
 *     ||g - ref||_F / ||ref||_F <= 2e-2 (bf16), 5e-3 (fp16)
 * for dq, dk and dv, <= 1e-3 for every buffer gradient (fp32 sums); no
 * non-finite value anywhere;
 * padding between rows (BSHD with padding) never written. Where the
 * reference gradient is all zero (a single key: dS is exactly 0) the error is
 * the absolute one, under the same bound.
 * The table: every gallery mod x {D 64, 128} x {bf16, fp16} over lengths 1,
 * 17, 127, 129, 1000 and Q_LEN != KV_LEN, with and without block masks;
 * then GQA 4:1 and MQA, offsets, fully masked rows, B / H broadcast of the
 * block mask, BSHD, odd head dims (16 to 256), buffer gradients (ALiBi
 * slopes, a relative-bias table, a per-head temperature), dK and dV not
 * 16-byte aligned (no TMA store), the dK/dV pass's leading tiles started
 * first (FG_OPT_BWD_LEAD_TILES, and the backward's own choice on a mask
 * with global keys), the pass in pairs of kv heads (FG_OPT_BWD_HEAD_PAIRS),
 * and every case once more in deterministic mode, which must also give the same bits
 * twice. On a Hopper GPU the table runs over the Hopper kernels (head
 * dims 64 and 128; the others, and kv blocks under 128, take the portable
 * ones), then once more with FG_OPT_HOPPER_KERNEL 0 over the portable
 * ones. Then approximate math (FG_OPT_APPROX_MATH 1, forward and backward):
 * softcap at D 64 and 128 in bf16 and fp16, ALiBi with its slopes'
 * gradient and a score_mod on every function it respells, on the Hopper
 * and the portable kernels, at the same tolerances (tanh's relative 2^-11
 * moves softcap's scores, within its cap of 2 here, by under 2^-10, and
 * the derivative 1 - tanh^2 by under 2^-10 absolute: at most a fifth of
 * fp16's 5e-3, a twentieth of bf16's 2e-2). Errors only a device call
 * meets close it.
 * FLEXGEN_TEST_QUICK=1 runs a reduced table (for compute-sanitizer). */
#include "gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"

/* A relative-bias table and a per-head temperature: two float buffers that
 * get gradients, read at computed indices (clamped into the table). */
#define BIAS_SRC                                                                          \
    "const float *bias;\nconst float *temp;\nint SPAN = 64;\n"                             \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"              \
    "    int d = clamp(q_idx - kv_idx, -SPAN, SPAN);\n"                                    \
    "    return score / temp[h] + bias[d + SPAN];\n}\n"                                    \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx + 8 >= kv_idx; }\n"
#define CAUSAL_SRC "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }\n"
/* a linear bias, as ALiBi's */
#define RAMP_SCORE_SRC \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score + 0.01f * (float)(kv_idx - q_idx); }\n"
#define LATE_SRC                                                                   \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return q_idx >= 70 && kv_idx <= q_idx;\n}\n"
#define BH_SRC                                                                     \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return (q_idx + b + 2 * h) % 3 != 0 || kv_idx == 0;\n}\n"                 \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"        \
    "    return score * (1.0 + 0.25 * (float)h) - 0.5 * (float)b;\n}\n"

static int failures = 0;
static int deterministic = 0;   /* the mode of the running test           */
static int hopper_allowed = 1;  /* its FG_OPT_HOPPER_KERNEL: 0 keeps the
                                   portable kernels where the Hopper ones
                                   would apply (head dims 64 and 128)     */
static int approx_math = 0;     /* its FG_OPT_APPROX_MATH                 */
static int grads_unaligned = 0; /* dK and dV 4 bytes past a 16-byte
                                   boundary: the Hopper pass stores them
                                   thread by thread, not by TMA          */

static bool quick(void) {
    const char *q = getenv("FLEXGEN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* The case's parameters: the gallery's, or BIAS_SRC's two tables. */
static void case_binds(const acase *c, binds *bb) {
    gallery_binds(c->mod, c, bb);
    if (!c->src || strcmp(c->src, BIAS_SRC) != 0) return;
    float *bias = malloc(sizeof *bias * 129), *temp = malloc(sizeof *temp * (size_t)c->hq);
    for (int i = 0; i < 129; i++) bias[i] = (float)normal();
    for (int h = 0; h < c->hq; h++) temp[h] = 0.5f + (float)tu_rand_uniform(&rng);
    add_buffer(bb, "bias", FG_TYPE_FLOAT, bias, 129);
    add_buffer(bb, "temp", FG_TYPE_FLOAT, temp, c->hq);
}

/* The float buffers of the case that get gradients. */
static bool wants_grad(const acase *c, const char *name) {
    if (c->mod && !strcmp(c->mod, "alibi")) return !strcmp(name, "slopes");
    return c->src && !strcmp(c->src, BIAS_SRC) && (!strcmp(name, "bias") || !strcmp(name, "temp"));
}

typedef struct grads {
    int n;
    const char *name[4];
    int len[4];
    CUdeviceptr dev[4];
    fg_binding gdev[4], gref[4];
    double *ref[4];
    float *got[4], *again[4];
} grads;

static double rel_err16(const acase *c, const uint16_t *g, const double *ref, int h, int s, const int64_t st[4],
                        long *nonfinite, long *pad_written) {
    double num = 0, den = 0;
    for (int b = 0; b < c->b; b++)
        for (int hh = 0; hh < h; hh++)
            for (int i = 0; i < s; i++) {
                const uint16_t *row = g + b * st[0] + hh * st[1] + i * st[2];
                const double *rr = ref + (((size_t)b * h + hh) * s + i) * c->d;
                for (int d = 0; d < c->d; d++) {
                    const double x = from16(c->dtype, row[d]), y = rr[d];
                    if (!isfinite(x)) (*nonfinite)++;
                    num += (x - y) * (x - y);
                    den += y * y;
                }
                if (c->layout == BSHD)
                    for (int d = c->d; d < c->d + c->pad; d++) *pad_written += row[d] != 0xffff;
            }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double rel_err32(const float *g, const double *ref, int n, long *nonfinite) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(g[i])) (*nonfinite)++;
        num += ((double)g[i] - ref[i]) * ((double)g[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The d loss / d lse that makes the reference's delta the GPU's. A
 * backward receives the forward's output in the dtype and takes
 * delta_i = dO_i . O_i from it, as every FlashAttention-style backward
 * does; the reference recomputes O in float64. So the reference is given
 * dlse_i + dO_i . (O_i exact - O_i stored), and both subtract the same
 * delta. Without it a gradient whose terms cancel (sum_kv dS_ij is 0 for
 * the exact O) measures the stored output's rounding, not the backward:
 * the per-head temperature's gradient at D=192 in bf16 sat at 1.6e-2 to
 * 2.4e-2 (bf16's tolerance is 2e-2), moved by the forward's rounding
 * alone, and ALiBi's slope gradient at Q_LEN 1000, KV_LEN 17 was 2e-2 to
 * 30x off; with it the two measure 5e-7 and 1.4e-5. */
static float *stored_o_dlse(fg_ctx *ctx, const fg_mod *mod, const acase *c, const fg_attention_args *host,
                            CUdeviceptr dout, size_t no, const uint16_t *hdo, const float *dlse) {
    const size_t nlse = (size_t)c->b * c->hq * c->q;
    double *exact = malloc(sizeof(double) * nlse * (size_t)c->d);
    uint16_t *stored = malloc(no * 2);
    float *out = malloc(4 * nlse);
    assert_non_null(exact), assert_non_null(stored), assert_non_null(out);
    assert_int_equal(fg_attention_reference(ctx, mod, host, exact, NULL), FG_OK);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(stored, dout, no * 2), CUDA_SUCCESS);
    const int64_t *st = host->out_stride;
    for (int b = 0; b < c->b; b++)
        for (int h = 0; h < c->hq; h++)
            for (int i = 0; i < c->q; i++) {
                const size_t row = ((size_t)b * c->hq + h) * c->q + i;
                const int64_t at = b * st[0] + h * st[1] + i * st[2];
                double corr = 0;
                for (int d = 0; d < c->d; d++)
                    corr += from16(c->dtype, hdo[at + d]) * (exact[row * c->d + d] - from16(c->dtype, stored[at + d]));
                out[row] = (float)((dlse ? dlse[row] : 0.0) + corr);
            }
    free(exact), free(stored);
    return out;
}

static void run_case(fg_ctx *ctx, const acase *c) {
    char name[256];
    case_name(c, name, sizeof name);
    const double t_start = fgi_now_ms();
    fg_mod *mod = case_mod(ctx, c);
    binds bb;
    case_binds(c, &bb);

    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = c->b, a.heads_q = c->hq, a.heads_kv = c->hkv, a.q_len = c->q, a.kv_len = c->kv;
    a.head_dim = c->d, a.dtype = c->dtype, a.scale = c->scale;
    a.q_offset = c->q_offset, a.kv_offset = c->kv_offset;
    size_t nq, nk, no;
    strides_of(c, c->hq, c->q, a.q_stride, &nq);
    strides_of(c, c->hkv, c->kv, a.k_stride, &nk);
    memcpy(a.v_stride, a.k_stride, sizeof a.k_stride);
    strides_of(c, c->hq, c->q, a.out_stride, &no);
    uint16_t *hq = random_tensor(c, c->hq, c->q, a.q_stride, nq, true);
    uint16_t *hk = random_tensor(c, c->hkv, c->kv, a.k_stride, nk, true);
    uint16_t *hv = random_tensor(c, c->hkv, c->kv, a.k_stride, nk, false);
    uint16_t *hdo = random_tensor(c, c->hq, c->q, a.out_stride, no, true);
    const size_t nlse = (size_t)c->b * c->hq * c->q;
    CUdeviceptr dq = upload(hq, nq * 2), dk = upload(hk, nk * 2), dv = upload(hv, nk * 2);
    CUdeviceptr ddo = upload(hdo, no * 2), dout, dlse, gq, gk, gv;
    assert_int_equal(fgi_cu()->cuMemAlloc(&dout, no * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemAlloc(&dlse, nlse * 4), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemAlloc(&gq, nq * 2), CUDA_SUCCESS);
    const size_t goff = grads_unaligned ? 4 : 0; /* bytes before dK and dV */
    assert_int_equal(fgi_cu()->cuMemAlloc(&gk, nk * 2 + goff), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemAlloc(&gv, nk * 2 + goff), CUDA_SUCCESS);

    fg_block_mask *bm = NULL;
    if (c->bm != BM_NONE) {
        fg_block_mask_desc desc = {c->bm_b ? c->bm_b : c->b, c->bm_h ? c->bm_h : c->hq, c->q, c->kv,
                                   c->q_block, c->kv_block};
        fg_status st = c->bm == BM_CPU
                           ? fg_block_mask_create(ctx, mod, &desc, bb.host, (size_t)bb.n, &bm)
                           : fg_block_mask_create_gpu(ctx, mod, &desc, bb.dev, (size_t)bb.n, NULL, &bm);
        if (st != FG_OK) print_error("%s: block mask: %s\n", name, fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
        if (c->bm == BM_GPU) assert_int_equal(fg_block_mask_download(ctx, bm), FG_OK);
    }
    a.block_mask = bm;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n;
    fg_status st = fg_attention_forward(ctx, mod, &a);
    if (st != FG_OK) print_error("%s: forward: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);

    /* The gradient outputs of the buffers that get one. */
    grads gr;
    memset(&gr, 0, sizeof gr);
    for (int i = 0; i < bb.n; i++) {
        if (bb.host[i].kind != FG_PARAM_BUFFER || !wants_grad(c, bb.host[i].name)) continue;
        const int k = gr.n++, len = (int)bb.host[i].value.buffer.length;
        gr.name[k] = bb.host[i].name;
        gr.len[k] = len;
        assert_int_equal(fgi_cu()->cuMemAlloc(&gr.dev[k], 4 * (size_t)len), CUDA_SUCCESS);
        gr.gdev[k] = fg_bind_float_buffer(gr.name[k], (const float *)(uintptr_t)gr.dev[k], len);
        gr.ref[k] = malloc(sizeof(double) * (size_t)len);
        gr.gref[k] = fg_bind_float_buffer(gr.name[k], (const float *)gr.ref[k], len);
        gr.got[k] = malloc(4 * (size_t)len);
        gr.again[k] = malloc(4 * (size_t)len);
    }

    fg_attention_bwd_args b = FG_ATTENTION_BWD_ARGS_INIT;
    b.fwd = &a;
    b.dout = (const void *)(uintptr_t)ddo;
    b.dq = (void *)(uintptr_t)gq, b.dk = (void *)(uintptr_t)(gk + goff), b.dv = (void *)(uintptr_t)(gv + goff);
    memcpy(b.dout_stride, a.out_stride, sizeof b.dout_stride);
    memcpy(b.dq_stride, a.q_stride, sizeof b.dq_stride);
    memcpy(b.dk_stride, a.k_stride, sizeof b.dk_stride);
    memcpy(b.dv_stride, a.k_stride, sizeof b.dv_stride);
    b.grad_binds = gr.gdev, b.ngrad_binds = (size_t)gr.n;
    b.deterministic = deterministic;
    /* Outside deterministic mode the loss also reads the lse: a random
     * d loss / d lse. */
    float *hdlse = NULL;
    CUdeviceptr ddlse = 0;
    if (!deterministic) {
        hdlse = malloc(4 * nlse);
        for (size_t i = 0; i < nlse; i++) hdlse[i] = (float)normal();
        ddlse = upload(hdlse, 4 * nlse);
        b.dlse = (const float *)(uintptr_t)ddlse;
    }

    /* A workspace of the test's own, poisoned like the outputs before each
     * run (all-ones bits: NaN as fp32): the kernels must zero whatever
     * accumulator they add into. */
    size_t ws_bytes = 0;
    st = fg_attention_backward_workspace_size(ctx, mod, &b, &ws_bytes);
    if (st != FG_OK) print_error("%s: workspace size: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    CUdeviceptr ws = 0;
    if (ws_bytes) assert_int_equal(fgi_cu()->cuMemAlloc(&ws, ws_bytes), CUDA_SUCCESS);
    b.workspace = (void *)(uintptr_t)ws, b.workspace_size = ws_bytes;

    uint16_t *out_q = malloc(nq * 2), *out_k = malloc(nk * 2), *out_v = malloc(nk * 2);
    long differs = 0;
    const int runs = deterministic ? 2 : 1;
    const double t_gpu = fgi_now_ms();
    for (int run = 0; run < runs; run++) {
        /* poison every output */
        assert_int_equal(fgi_cu()->cuMemsetD8(gq, 0xff, nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(gk, 0xff, nk * 2 + goff), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(gv, 0xff, nk * 2 + goff), CUDA_SUCCESS);
        for (int k = 0; k < gr.n; k++)
            assert_int_equal(fgi_cu()->cuMemsetD8(gr.dev[k], 0xff, 4 * (size_t)gr.len[k]), CUDA_SUCCESS);
        if (ws) assert_int_equal(fgi_cu()->cuMemsetD8(ws, 0xff, ws_bytes), CUDA_SUCCESS);
        st = fg_attention_backward(ctx, mod, &b);
        if (st != FG_OK) print_error("%s: backward: %s: %s\n%s", name, fg_status_string(st), fg_errmsg(ctx),
                                     fg_compile_log(ctx));
        assert_int_equal(st, FG_OK);
        assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
        uint16_t *tq = run ? malloc(nq * 2) : out_q, *tk = run ? malloc(nk * 2) : out_k,
                 *tv = run ? malloc(nk * 2) : out_v;
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(tq, gq, nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(tk, gk + goff, nk * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(tv, gv + goff, nk * 2), CUDA_SUCCESS);
        for (int k = 0; k < gr.n; k++)
            assert_int_equal(fgi_cu()->cuMemcpyDtoH(run ? gr.again[k] : gr.got[k], gr.dev[k], 4 * (size_t)gr.len[k]),
                             CUDA_SUCCESS);
        if (run) {
            differs += memcmp(tq, out_q, nq * 2) != 0;
            differs += memcmp(tk, out_k, nk * 2) != 0;
            differs += memcmp(tv, out_v, nk * 2) != 0;
            for (int k = 0; k < gr.n; k++) differs += memcmp(gr.got[k], gr.again[k], 4 * (size_t)gr.len[k]) != 0;
            free(tq), free(tk), free(tv);
        }
    }

    /* The reference on the same host arrays. */
    const double t_ref = fgi_now_ms();
    double *rq = malloc(sizeof(double) * nlse * (size_t)c->d);
    double *rk = malloc(sizeof(double) * (size_t)c->b * c->hkv * c->kv * (size_t)c->d);
    double *rv = malloc(sizeof(double) * (size_t)c->b * c->hkv * c->kv * (size_t)c->d);
    fg_attention_args ha = a;
    ha.q = hq, ha.k = hk, ha.v = hv, ha.binds = bb.host;
    ha.out = hq; /* not read by the reference */
    fg_attention_bwd_args hb = b;
    hb.fwd = &ha;
    float *ref_dlse = stored_o_dlse(ctx, mod, c, &ha, dout, no, hdo, hdlse);
    hb.dout = hdo, hb.dq = rq, hb.dk = rk, hb.dv = rv, hb.dlse = ref_dlse;
    memset(hb.dq_stride, 0, sizeof hb.dq_stride);
    memset(hb.dk_stride, 0, sizeof hb.dk_stride);
    memset(hb.dv_stride, 0, sizeof hb.dv_stride);
    hb.grad_binds = gr.gref;
    st = fg_attention_reference_backward(ctx, mod, &hb);
    if (st != FG_OK) print_error("%s: reference: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);

    long nonfinite = 0, pad_written = 0;
    const double eq = rel_err16(c, out_q, rq, c->hq, c->q, a.q_stride, &nonfinite, &pad_written);
    const double ek = rel_err16(c, out_k, rk, c->hkv, c->kv, a.k_stride, &nonfinite, &pad_written);
    const double ev = rel_err16(c, out_v, rv, c->hkv, c->kv, a.k_stride, &nonfinite, &pad_written);
    double eg[4] = {0};
    for (int k = 0; k < gr.n; k++) eg[k] = rel_err32(gr.got[k], gr.ref[k], gr.len[k], &nonfinite);
    const double tol = c->dtype == FG_BF16 ? 2e-2 : 5e-3;
    bool ok = eq <= tol && ek <= tol && ev <= tol && nonfinite == 0 && pad_written == 0 && differs == 0;
    /* The buffer gradients are fp32 sums of fp32 terms: given the stored O
     * (stored_o_dlse) they measured 1.4e-5 at most (ALiBi's slopes at
     * Q_LEN 1000, KV_LEN 17, deterministic), against the reference. */
    const double grad_tol = 1e-3;
    for (int k = 0; k < gr.n; k++) ok &= eg[k] <= grad_tol;
    const double t_end = fgi_now_ms();
    printf("%-4s %s%s%s%s%s: dq %.2e dk %.2e dv %.2e", ok ? "ok" : "FAIL", deterministic ? "[deterministic] " : "",
           hopper_allowed ? "" : "[portable] ", approx_math ? "[approx] " : "",
           grads_unaligned ? "[dk, dv unaligned] " : "", name, eq, ek, ev);
    for (int k = 0; k < gr.n; k++) printf(" d%s %.2e", gr.name[k], eg[k]);
    printf(" (setup %.0f ms, gpu %.0f ms, reference %.0f ms)\n", t_gpu - t_start, t_ref - t_gpu, t_end - t_ref);
    if (!ok) {
        printf("     nonfinite %ld, padding written %ld, runs that differ %ld\n", nonfinite, pad_written,
               differs);
        failures++;
    }
    fflush(stdout);

    for (int k = 0; k < gr.n; k++) {
        fgi_cu()->cuMemFree(gr.dev[k]);
        free(gr.ref[k]), free(gr.got[k]), free(gr.again[k]);
    }
    free(rq), free(rk), free(rv), free(out_q), free(out_k), free(out_v);
    free(hq), free(hk), free(hv), free(hdo), free(hdlse), free(ref_dlse);
    CUdeviceptr all[] = {dq, dk, dv, ddo, dout, dlse, gq, gk, gv, ddlse, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) fgi_cu()->cuMemFree(all[i]);
    fg_block_mask_destroy(bm);
    binds_free(&bb);
    fg_mod_destroy(mod);
}

static fg_ctx *gpu_ctx(void) {
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, hopper_allowed), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, approx_math), FG_OK);
    return ctx;
}

static int atomic_mode(void **state) {
    (void)state;
    deterministic = 0, hopper_allowed = 1, approx_math = 0;
    return 0;
}
static int deterministic_mode(void **state) {
    (void)state;
    deterministic = 1, hopper_allowed = 1, approx_math = 0;
    return 0;
}
static int portable_mode(void **state) {
    (void)state;
    deterministic = 0, hopper_allowed = 0, approx_math = 0;
    return 0;
}
static int approx_mode(void **state) {
    (void)state;
    deterministic = 0, hopper_allowed = 1, approx_math = 1;
    return 0;
}
static int approx_portable_mode(void **state) {
    (void)state;
    deterministic = 0, hopper_allowed = 0, approx_math = 1;
    return 0;
}

/* ---- the gallery sweep ------------------------------------------------------ */

/* Mods [m0, m1) of the sweep; a case's shape and block size follow from
 * its place in the whole sweep (k). */
static void gallery_mods(int m0, int m1) {
    fg_ctx *ctx = gpu_ctx();
    const int dims[2] = {64, 128};
    const fg_dtype dts[2] = {FG_BF16, FG_FP16};
    for (int m = m0; m < m1; m++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 2; ti++) {
                const int k = (m * 2 + di) * 2 + ti;
                if ((quick() || deterministic) && (di + ti + m) % 2) continue;
                const shape *s = &shapes[quick() ? k % 3 : (k * 3 + m) % NSHAPES];
                acase c = {gallery[m], NULL, dims[di], dts[ti], s->b, s->hq, s->hkv, s->q, s->kv,
                           0, 0, BHSD, 0, k % 3, 0, 0, k % 2 ? 64 : 128, 128, 0.f, 0};
                run_case(ctx, &c);
            }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* The sweep and the feature table below each in two halves: four shards
 * of scripts/gpu_suite.sh a mode where there were two, whose NVRTC
 * compiles (most of their time) run side by side. */
GPU_TEST(test_gallery_0, gallery_mods(0, NGALLERY / 2))
GPU_TEST(test_gallery_1, gallery_mods(NGALLERY / 2, NGALLERY))

/* ---- the features one at a time --------------------------------------------- */

static const acase features[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    /* GQA 4:1 and MQA */
    {"causal", NULL, 128, FG_BF16, 2, 8, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 64, FG_FP16, 1, 4, 1, 200, 333, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 64, 0, 0},
    {"sliding_window", NULL, 128, FG_BF16, 1, 6, 1, 513, 513, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* block masks broadcast over B, over H, over both */
    {"document", NULL, 64, FG_BF16, 3, 2, 2, 400, 400, 0, 0, BHSD, 0, BM_CPU, 1, 1, 128, 128, 0, 0},
    {"causal", NULL, 128, FG_FP16, 2, 3, 3, 257, 257, 0, 0, BHSD, 0, BM_GPU, 1, 0, 64, 64, 0, 0},
    {"prefix_lm", NULL, 64, FG_BF16, 2, 4, 2, 300, 260, 0, 0, BHSD, 0, BM_CPU, 0, 1, 128, 64, 0, 0},
    {NULL, BH_SRC, 64, FG_BF16, 2, 3, 3, 200, 190, 0, 0, BHSD, 0, BM_CPU, 0, 0, 64, 64, 0, 0},
    {NULL, BH_SRC, 128, FG_FP16, 2, 2, 1, 129, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* offsets */
    {"causal", NULL, 128, FG_BF16, 1, 2, 2, 64, 700, 636, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 64, FG_FP16, 1, 2, 1, 100, 900, 800, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"sliding_window", NULL, 64, FG_BF16, 1, 1, 1, 300, 300, 37, 5, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* fully masked rows, with and without a block mask */
    {NULL, LATE_SRC, 64, FG_BF16, 1, 2, 2, 200, 200, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 70},
    {NULL, LATE_SRC, 128, FG_FP16, 2, 1, 1, 200, 150, 0, 0, BHSD, 0, BM_GPU, 0, 0, 64, 64, 0, 70},
    /* BSHD, padded rows (the padding must stay untouched) */
    {"causal", NULL, 128, FG_BF16, 2, 4, 2, 190, 190, 0, 0, BSHD, 8, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 64, FG_FP16, 1, 2, 2, 77, 300, 0, 0, BSHD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* a non-default scale */
    {"noop", NULL, 128, FG_BF16, 1, 2, 2, 100, 100, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0.3f, 0},
    /* buffer gradients: a relative-bias table and a per-head temperature */
    {NULL, BIAS_SRC, 64, FG_BF16, 2, 4, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {NULL, BIAS_SRC, 128, FG_FP16, 1, 2, 2, 129, 1000, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 128, FG_BF16, 2, 8, 8, 1000, 1000, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
    /* odd head dims, 16 to 256 */
    {"causal", NULL, 32, FG_BF16, 1, 2, 1, 129, 129, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 48, FG_FP16, 1, 2, 2, 100, 177, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 80, FG_BF16, 1, 2, 2, 257, 257, 0, 0, BSHD, 8, BM_GPU, 0, 0, 128, 64, 0, 0},
    {"noop", NULL, 96, FG_BF16, 2, 2, 2, 127, 127, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 112, FG_FP16, 1, 2, 1, 200, 200, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"sliding_window", NULL, 160, FG_BF16, 1, 2, 2, 300, 300, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
    {NULL, BIAS_SRC, 192, FG_BF16, 1, 2, 2, 200, 200, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"causal", NULL, 256, FG_BF16, 1, 2, 2, 257, 257, 0, 0, BHSD, 0, BM_CPU, 0, 0, 64, 64, 0, 0},
    {"noop", NULL, 256, FG_FP16, 1, 1, 1, 100, 1000, 0, 0, BSHD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"natten", NULL, 16, FG_BF16, 1, 1, 1, 300, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* Q_LEN != KV_LEN both ways */
    {"noop", NULL, 128, FG_BF16, 2, 4, 1, 1, 1000, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"flamingo", NULL, 128, FG_BF16, 1, 2, 2, 1000, 129, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    /* a buffer gradient at Q_LEN >> KV_LEN (see stored_o_dlse) */
    {"alibi", NULL, 64, FG_FP16, 1, 2, 2, 1000, 17, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
};

/* Rows [i0, i1) of the feature table. */
static void feature_rows(int i0, int i1) {
    fg_ctx *ctx = gpu_ctx();
    for (int i = i0; i < i1; i++) {
        if (quick() && (i % 3 != 0 || (double)features[i].q * features[i].kv > 300.0 * 300.0)) continue;
        run_case(ctx, &features[i]);
    }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

#define NFEATURES ((int)(sizeof features / sizeof features[0]))
GPU_TEST(test_features_0, feature_rows(0, NFEATURES / 2))
GPU_TEST(test_features_1, feature_rows(NFEATURES / 2, NFEATURES))

/* ---- approximate math ------------------------------------------------------- */

/* Every function approximate math respells, in a score_mod with a
 * derivative for each (the reference's are accurate). */
#define APPROX_SRC                                                                                  \
    "float T = 2.0;\n"                                                                              \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx + 16 >= kv_idx; }\n"         \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"                         \
    "    float d = (float)(abs(q_idx - kv_idx) + 1);\n"                                            \
    "    return T * tanh(score / T) + 0.5 * sigmoid(score) - 0.25 * log(d) + 0.5 * exp(-d / 8.0)\n" \
    "           + 0.1 * (log2(d) - exp2(-d) + rsqrt(d)) + 0.2 * exp(0.1 * score);\n}\n"

static const acase approx_cases[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    {"softcap", NULL, 64, FG_BF16, 1, 2, 2, 129, 129, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 64, FG_FP16, 2, 4, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 128, FG_BF16, 1, 2, 1, 257, 700, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 128, FG_FP16, 1, 2, 2, 17, 1000, 0, 0, BSHD, 8, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 64, FG_FP16, 2, 4, 4, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {NULL, APPROX_SRC, 64, FG_BF16, 1, 2, 2, 200, 200, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {NULL, APPROX_SRC, 128, FG_FP16, 1, 2, 1, 300, 260, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
};

static void test_approx(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    const int n = (int)(sizeof approx_cases / sizeof approx_cases[0]);
    for (int i = 0; i < n; i++) {
        if (quick() && i % 2) continue;
        run_case(ctx, &approx_cases[i]);
    }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* Backward arguments for forward `a` whose tensors lie in one device
 * buffer of 16-bit elements, `elems` per tensor: dout, dq, dk and dv at
 * 8, 10, 12 and 14 times elems bytes, after the forward's q, k, v, out. */
static fg_attention_bwd_args bwd_args_in(const fg_attention_args *a, CUdeviceptr buf, size_t elems) {
    fg_attention_bwd_args b = FG_ATTENTION_BWD_ARGS_INIT;
    b.fwd = a;
    b.dout = (const void *)(uintptr_t)(buf + elems * 8);
    b.dq = (void *)(uintptr_t)(buf + elems * 10);
    b.dk = (void *)(uintptr_t)(buf + elems * 12);
    b.dv = (void *)(uintptr_t)(buf + elems * 14);
    return b;
}

/* ---- the dK/dV pass's tile order -------------------------------------------- */

/* Global keys 0..15 every query sees, and a band of 64 behind each query:
 * at 2048 rows the first kv tile of every head has 16 q blocks, each of
 * the others one or two, so the backward starts the first tiles first by
 * itself (fgi_bwd_lead_tiles) once the grid is over a wave. */
#define GLOBAL_SRC                                                                 \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return kv_idx <= q_idx && (kv_idx < 16 || q_idx - kv_idx <= 64);\n}\n"

/* A case run with one of the dK/dV pass's order options set. */
typedef struct order_case {
    acase c;
    int value; /* the option's value: -1 the backward's choice */
} order_case;

/* Run `cases` with `opt` set to each one's value (every other one in the
 * quick table). */
static void run_order_cases(fg_option opt, const char *what, const order_case *cases, size_t n) {
    fg_ctx *ctx = gpu_ctx();
    for (size_t i = 0; i < n; i++) {
        if (quick() && i % 2) continue;
        assert_int_equal(fg_ctx_set_int(ctx, opt, cases[i].value), FG_OK);
        printf("[%s %d] ", what, cases[i].value);
        run_case(ctx, &cases[i].c);
    }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* The Hopper pass's -lead kernel with the order asked for
 * (FG_OPT_BWD_LEAD_TILES; more leading tiles than the call has keeps all
 * but one), with and without block masks, GQA, batches, kv lengths off
 * the tile; then the choice itself. */
static const order_case lead_cases[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    {{"causal", NULL, 128, FG_BF16, 2, 8, 2, 700, 700, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0}, 1},
    {{"document", NULL, 64, FG_FP16, 3, 2, 2, 400, 400, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0}, 2},
    {{"noop", NULL, 128, FG_BF16, 1, 2, 2, 129, 1000, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 3},
    {{"sliding_window", NULL, 64, FG_BF16, 2, 4, 1, 513, 513, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 100},
    {{"local_global", NULL, 128, FG_FP16, 1, 3, 3, 1000, 1000, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0}, 1},
    {{NULL, GLOBAL_SRC, 64, FG_BF16, 1, 9, 9, 2048, 2048, 0, 0, BHSD, 0, BM_CPU, 1, 1, 128, 128, 0, 0}, -1},
};

static void test_lead_tiles(void **state) {
    (void)state;
    run_order_cases(FG_OPT_BWD_LEAD_TILES, "lead tiles", lead_cases, sizeof lead_cases / sizeof lead_cases[0]);
}

/* The Hopper pass in pairs of kv heads (FG_OPT_BWD_HEAD_PAIRS, the -pairs
 * kernel: forced, and chosen where the estimate says so: causal and
 * prefix masks built on the CPU or the GPU), GQA, batches, kv lengths off
 * the tile, head dim 64 forced; an odd number of kv heads keeps the plain
 * kernel whatever the option. */
static const order_case pairs_cases[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    {{"causal", NULL, 128, FG_BF16, 2, 8, 4, 1000, 1300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0}, 1},
    {{"noop", NULL, 128, FG_FP16, 1, 2, 2, 700, 700, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 1},
    {{"causal", NULL, 128, FG_BF16, 1, 8, 8, 2300, 2300, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0}, -1},
    {{"sliding_window", NULL, 128, FG_BF16, 1, 3, 3, 900, 900, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0}, 1},
    {{"prefix_lm", NULL, 128, FG_BF16, 2, 4, 2, 2500, 2500, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0}, -1},
    {{"document", NULL, 64, FG_BF16, 1, 4, 2, 600, 600, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0}, 1},
};

static void test_head_pairs(void **state) {
    (void)state;
    run_order_cases(FG_OPT_BWD_HEAD_PAIRS, "head pairs", pairs_cases, sizeof pairs_cases / sizeof pairs_cases[0]);
}

/* The Hopper pass's tail split (FG_OPT_BWD_TAIL_SPLIT, on the -lead
 * kernel): calls without a block mask whose blocks fill under half the SMs
 * split each block over several (pieces walking shares of the q steps,
 * across the GQA group's heads; dK and dV summed in fp32), kv lengths off
 * the tile, a buffer gradient summed over pieces (alibi), and the option
 * off. Most of test_gallery's and test_features' cases without a block
 * mask split too (every small grid has a tail). */
static const order_case tail_cases[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    {{"noop", NULL, 128, FG_BF16, 1, 4, 2, 1000, 1300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 1},
    {{"alibi", NULL, 64, FG_FP16, 2, 2, 2, 513, 700, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 1},
    {{"softcap", NULL, 128, FG_BF16, 1, 1, 1, 3000, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 1},
    {{"noop", NULL, 64, FG_BF16, 1, 2, 2, 700, 700, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 0},
    {{"sliding_window", NULL, 128, FG_FP16, 3, 2, 1, 129, 520, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0}, 1},
};

static void test_tail_split(void **state) {
    (void)state;
    run_order_cases(FG_OPT_BWD_TAIL_SPLIT, "tail split", tail_cases, sizeof tail_cases / sizeof tail_cases[0]);
}

/* The backward's own choice of kernel: -lead on the global-key mask
 * (GLOBAL_SRC), -pairs on a causal one at head dim 128 with an even
 * number of kv heads (test_bwd_order has this shape's estimate), neither
 * at head dim 64, with an odd number or with a score_mod, with the mask built on the CPU
 * and on the GPU. A GPU-built mask is never downloaded here: its counts
 * reach the host by the copy queued behind its build
 * (fgi_block_mask_counts), which has landed once the context is
 * synchronised. Until then the choice is the grid order; it must never
 * wait for the copy. */
static void test_order_choice(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    int major = 0, minor = 0;
    assert_int_equal(fgi_cuda_arch(ctx, &major, &minor), FG_OK);
    const bool hopper = major == 9 && minor == 0;
    enum { B = 1, H_MAX = 10, S = 2048, D_MAX = 128 };
    const size_t most = (size_t)B * H_MAX * S * D_MAX;
    CUdeviceptr buf = 0, lse = 0;
    assert_int_equal(fgi_cu()->cuMemAlloc(&buf, most * 2 * 8), CUDA_SUCCESS); /* q k v out dout dq dk dv */
    assert_int_equal(fgi_cu()->cuMemAlloc(&lse, (size_t)B * H_MAX * S * 4), CUDA_SUCCESS);
    const struct {
        const char *name, *src;
        bool gpu;        /* the mask's builder */
        int d, h;        /* head dim, heads (q and kv) */
        bool lead, pairs; /* the kernel chosen on Hopper */
    } cases[] = {
        {"global-key", GLOBAL_SRC, false, 64, 9, true, false},
        {"global-key", GLOBAL_SRC, true, 64, 9, true, false},
        {"causal", CAUSAL_SRC, true, 64, 10, false, false},
        {"causal", CAUSAL_SRC, false, 128, 10, false, true},
        {"causal", CAUSAL_SRC, true, 128, 10, false, true},
        {"causal", CAUSAL_SRC, false, 128, 9, false, false},
        {"causal with a score_mod", CAUSAL_SRC RAMP_SCORE_SRC, false, 128, 10, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int H = cases[i].h, D = cases[i].d;
        const size_t elems = (size_t)B * H * S * D;
        fg_mod *mod = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "m", cases[i].src, (size_t)-1, &mod), FG_OK);
        fg_block_mask_desc desc = {B, H, S, S, 128, 128, sizeof(fg_block_mask_desc), 0, 0};
        fg_block_mask *bm = NULL;
        assert_int_equal(cases[i].gpu ? fg_block_mask_create_gpu(ctx, mod, &desc, NULL, 0, NULL, &bm)
                                      : fg_block_mask_create(ctx, mod, &desc, NULL, 0, &bm),
                         FG_OK);
        assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
        fg_attention_args a = FG_ATTENTION_ARGS_INIT;
        a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = D, a.dtype = FG_BF16;
        a.q = (const void *)(uintptr_t)buf, a.k = (const void *)(uintptr_t)(buf + elems * 2);
        a.v = (const void *)(uintptr_t)(buf + elems * 4), a.out = (void *)(uintptr_t)(buf + elems * 6);
        a.lse = (float *)(uintptr_t)lse, a.block_mask = bm;
        fg_attention_bwd_args b = bwd_args_in(&a, buf, elems);
        fg_kernel *k = NULL;
        assert_int_equal(fg_attention_backward_kernel_for(ctx, mod, &b, &k), FG_OK);
        printf("[order choice] %s mask, %s, head dim %d, %d heads: %s\n", cases[i].name,
               cases[i].gpu ? "GPU-built" : "CPU-built", D, H,
               k->config.lead_first ? "-lead" : k->config.head_pairs ? "-pairs" : "grid order");
        assert_int_equal(k->config.lead_first, hopper && cases[i].lead);
        assert_int_equal(k->config.head_pairs, hopper && cases[i].pairs);
        fg_kernel_release(k);
        fg_block_mask_destroy(bm);
        fg_mod_destroy(mod);
    }
    /* Without a block mask, 32 blocks fill a quarter of the SMs: the tail
     * split takes the -lead kernel on Hopper, unless it is off or the pass
     * is deterministic. */
    const struct {
        int split, deterministic;
        bool lead;
    } dense[] = {{1, 0, true}, {0, 0, false}, {1, 1, false}};
    fg_mod *noop = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "noop", CAUSAL_SRC, (size_t)-1, &noop), FG_OK);
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_BWD_TAIL_SPLIT, dense[i].split), FG_OK);
        const int H = 2, D = 128;
        const size_t elems = (size_t)B * H * S * D;
        fg_attention_args a = FG_ATTENTION_ARGS_INIT;
        a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = D, a.dtype = FG_BF16;
        a.q = (const void *)(uintptr_t)buf, a.k = (const void *)(uintptr_t)(buf + elems * 2);
        a.v = (const void *)(uintptr_t)(buf + elems * 4), a.out = (void *)(uintptr_t)(buf + elems * 6);
        a.lse = (float *)(uintptr_t)lse;
        fg_attention_bwd_args b = bwd_args_in(&a, buf, elems);
        b.deterministic = dense[i].deterministic;
        fg_kernel *k = NULL;
        assert_int_equal(fg_attention_backward_kernel_for(ctx, noop, &b, &k), FG_OK);
        printf("[order choice] no block mask, tail split %d, deterministic %d: %s\n", dense[i].split,
               dense[i].deterministic, k->config.lead_first ? "-lead" : "grid order");
        assert_int_equal(k->config.lead_first, hopper && dense[i].lead);
        fg_kernel_release(k);
    }
    fg_mod_destroy(noop);
    fgi_cu()->cuMemFree(buf);
    fgi_cu()->cuMemFree(lse);
    fg_ctx_destroy(ctx);
}

/* ---- dK and dV not 16-byte aligned ------------------------------------------- */

/* The Hopper pass stores dK and dV through the TMA unit when both are
 * 16-byte aligned, else each thread its own elements: these cases take the
 * second way (at the head dims of the Hopper kernels, GQA, edges). */
static const acase unaligned_cases[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked */
    {"causal", NULL, 128, FG_BF16, 1, 4, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 64, FG_FP16, 1, 2, 1, 257, 190, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
};

static void test_unaligned_grads(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    grads_unaligned = 1;
    for (size_t i = 0; i < sizeof unaligned_cases / sizeof unaligned_cases[0]; i++) run_case(ctx, &unaligned_cases[i]);
    grads_unaligned = 0;
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* ---- errors only a device call meets ----------------------------------------- */

static void test_device_errors(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    fg_mod *mod = tu_gallery_mod(ctx, "alibi");
    const int S = 256, H = 2, D = 64;
    const size_t elems = (size_t)H * S * D;
    CUdeviceptr buf, slopes, gslopes;
    assert_int_equal(fgi_cu()->cuMemAlloc(&buf, elems * 2 * 8 + (size_t)H * S * 4 + 64), CUDA_SUCCESS);
    const float host_slopes[2] = {0.5f, 0.25f};
    slopes = upload(host_slopes, sizeof host_slopes);
    assert_int_equal(fgi_cu()->cuMemAlloc(&gslopes, 64), CUDA_SUCCESS);
    fg_binding bind = fg_bind_float_buffer("slopes", (const float *)(uintptr_t)slopes, 2);
    fg_attention_args a = FG_ATTENTION_ARGS_INIT;
    a.batch = 1, a.heads_q = H, a.heads_kv = H, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = (const void *)(uintptr_t)buf;
    a.k = (const void *)(uintptr_t)(buf + elems * 2);
    a.v = (const void *)(uintptr_t)(buf + elems * 4);
    a.out = (void *)(uintptr_t)(buf + elems * 6);
    a.lse = (float *)(uintptr_t)(buf + elems * 16);
    a.binds = &bind, a.nbinds = 1;
    assert_int_equal(fgi_cu()->cuMemsetD8(buf, 0, elems * 16), CUDA_SUCCESS);
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);
    fg_attention_bwd_args b = bwd_args_in(&a, buf, elems);
    assert_int_equal(fg_attention_backward(ctx, mod, &b), FG_OK);
    fg_binding g = fg_bind_float_buffer("slopes", (const float *)(uintptr_t)gslopes, 2);
    b.grad_binds = &g, b.ngrad_binds = 1;
    assert_int_equal(fg_attention_backward(ctx, mod, &b), FG_OK);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);

    /* A kernel object fetched once, launched many times, no recompiles. */
    fg_kernel_config cfg = FG_KERNEL_CONFIG_INIT;
    cfg.kind = FG_KERNEL_ATTENTION_BWD, cfg.head_dim = D;
    fg_kernel *k = NULL;
    int major = 0, minor = 0;
    assert_int_equal(fgi_cuda_arch(ctx, &major, &minor), FG_OK);
    const bool hopper = major == 9 && minor == 0;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &k), FG_OK);
    assert_int_equal(fg_kernel_kind_of(k), hopper ? FG_KERNEL_ATTENTION_BWD_SM90 : FG_KERNEL_ATTENTION_BWD);
    fg_cache_stats s0, s1;
    fg_cache_get_stats(&s0);
    for (int i = 0; i < 5; i++) assert_int_equal(fg_kernel_launch_backward(ctx, k, &b), FG_OK);
    fg_cache_get_stats(&s1);
    assert_int_equal(s1.misses, s0.misses);
    assert_int_equal(s1.memory_hits, s0.memory_hits);
    /* a backward kernel is not a forward one, and the reverse */
    assert_int_equal(fg_kernel_launch(ctx, k, &a), FG_ERR_INVALID_ARGUMENT);
    fg_kernel *fk = NULL;
    cfg.kind = FG_KERNEL_ATTENTION_FWD;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &fk), FG_OK);
    assert_int_equal(fg_kernel_launch_backward(ctx, fk, &b), FG_ERR_INVALID_ARGUMENT);
    fg_kernel_release(fk);
    /* the kernel the call itself runs, fetched for launching */
    fg_kernel *ck = NULL;
    assert_int_equal(fg_attention_backward_kernel_for(ctx, mod, &b, &ck), FG_OK);
    assert_int_equal(fg_kernel_kind_of(ck), hopper ? FG_KERNEL_ATTENTION_BWD_SM90 : FG_KERNEL_ATTENTION_BWD);
    assert_int_equal(fg_kernel_launch_backward(ctx, ck, &b), FG_OK);
    fg_kernel_release(ck);
    ck = (fg_kernel *)&ck;
    fg_attention_bwd_args nofwd = b;
    nofwd.fwd = NULL;
    assert_int_equal(fg_attention_backward_kernel_for(ctx, mod, &nofwd, &ck), FG_ERR_INVALID_ARGUMENT);
    assert_null(ck);
    assert_int_equal(fg_attention_backward_kernel_for(NULL, mod, &b, &ck), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_backward_kernel_for(ctx, NULL, &b, &ck), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_backward_kernel_for(ctx, mod, &b, NULL), FG_ERR_INVALID_ARGUMENT);
    /* The Hopper backward by name: only on compute capability 9.0, and not
     * for head dims it does not take; FG_OPT_HOPPER_KERNEL 0 keeps the
     * portable one. */
    fg_kernel *hk = NULL;
    cfg.kind = FG_KERNEL_ATTENTION_BWD_SM90;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &hk), hopper ? FG_OK : FG_ERR_NOT_SUPPORTED);
    if (hk) assert_int_equal(fg_kernel_launch_backward(ctx, hk, &b), FG_OK);
    cfg.head_dim = 96;
    fg_kernel *h96 = NULL;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &h96), FG_ERR_NOT_SUPPORTED);
    cfg.kind = FG_KERNEL_ATTENTION_BWD, cfg.head_dim = D;
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, 0), FG_OK);
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &fk), FG_OK);
    assert_int_equal(fg_kernel_kind_of(fk), FG_KERNEL_ATTENTION_BWD);
    fg_kernel_release(fk);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, 1), FG_OK);

    /* Bad calls: each a status, none launches. */
    fg_attention_bwd_args bad = b;
    bad.fwd = NULL;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_backward(ctx, mod, NULL), FG_ERR_INVALID_ARGUMENT);
    bad = b, bad.dq = NULL;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_attention_args no_lse = a;
    no_lse.lse = NULL;
    bad = b, bad.fwd = &no_lse;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_INVALID_ARGUMENT);
    bad = b, bad.dout = (const void *)(uintptr_t)(buf + elems * 8 + 2); /* cp.async needs 16 bytes */
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_SHAPE);
    bad = b, bad.dk_stride[3] = 2;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_SHAPE);
    bad = b, bad.struct_size = 3;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_INVALID_ARGUMENT);
    /* gradient bindings: unknown name, an int or scalar, too short, twice */
    fg_binding gb[2] = {fg_bind_float_buffer("nope", (const float *)(uintptr_t)gslopes, 2), g};
    bad = b, bad.grad_binds = gb, bad.ngrad_binds = 1;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_UNBOUND);
    gb[0] = fg_bind_float_buffer("slopes", (const float *)(uintptr_t)gslopes, 1);
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_SHAPE);
    gb[0] = g, bad.ngrad_binds = 2;
    assert_int_equal(fg_attention_backward(ctx, mod, &bad), FG_ERR_INVALID_ARGUMENT);
    fg_mod *doc = tu_gallery_mod(ctx, "document");
    gb[0] = fg_bind_float_buffer("document_id", (const float *)(uintptr_t)gslopes, 2);
    fg_binding ids = fg_bind_int_buffer("document_id", (const int32_t *)(uintptr_t)slopes, 2);
    fg_attention_args da = a;
    da.q_len = da.kv_len = 2, da.binds = &ids;
    bad = b, bad.fwd = &da, bad.grad_binds = gb, bad.ngrad_binds = 1;
    assert_int_equal(fg_attention_backward(ctx, doc, &bad), FG_ERR_UNBOUND);
    fg_mod_destroy(doc);
    /* block masks with blocks under the kernels' tiles */
    fg_mod *causal = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "causal", CAUSAL_SRC, (size_t)-1, &causal), FG_OK);
    fg_block_mask_desc desc = {1, 1, S, S, 32, 32, sizeof(fg_block_mask_desc)};
    fg_block_mask *bm = NULL;
    assert_int_equal(fg_block_mask_create(ctx, causal, &desc, NULL, 0, &bm), FG_OK);
    fg_attention_args ma = a;
    ma.block_mask = bm, ma.binds = NULL, ma.nbinds = 0;
    bad = b, bad.fwd = &ma, bad.grad_binds = NULL, bad.ngrad_binds = 0;
    assert_int_equal(fg_attention_backward(ctx, causal, &bad), FG_ERR_NOT_SUPPORTED);
    fg_block_mask_destroy(bm);
    /* kv blocks of 64: the Hopper kernel refuses them, fg_attention_backward
     * falls back to the portable one */
    fg_block_mask_desc d64 = {1, 1, S, S, 128, 64, sizeof(fg_block_mask_desc)};
    assert_int_equal(fg_block_mask_create(ctx, causal, &d64, NULL, 0, &bm), FG_OK);
    ma.block_mask = bm;
    assert_int_equal(fg_attention_forward(ctx, causal, &ma), FG_OK);
    assert_int_equal(fg_attention_backward(ctx, causal, &bad), FG_OK);
    if (hopper) {
        fg_kernel *ck = NULL;
        cfg.kind = FG_KERNEL_ATTENTION_BWD_SM90;
        assert_int_equal(fg_kernel_get(ctx, causal, &cfg, &ck), FG_OK);
        assert_int_equal(fg_kernel_launch_backward(ctx, ck, &bad), FG_ERR_NOT_SUPPORTED);
        fg_kernel_release(ck);
    }
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    fg_block_mask_destroy(bm);
    fg_kernel_release(hk);
    fg_mod_destroy(causal);

    fg_kernel_release(k);
    fgi_cu()->cuMemFree(buf), fgi_cu()->cuMemFree(slopes), fgi_cu()->cuMemFree(gslopes);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    tu_require_gpu();
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Named by test and mode, so FLEXGEN_TEST_FILTER can pick e.g. "*portable". */
#define MODE_TEST(f, mode) { #f "/" #mode, f, mode, NULL, NULL }
    /* scripts/gpu_suite.sh reads this table for its shards, a test a line */
    const struct CMUnitTest tests[] = {
        MODE_TEST(test_device_errors, atomic_mode),
        MODE_TEST(test_features_0, atomic_mode),
        MODE_TEST(test_features_1, atomic_mode),
        MODE_TEST(test_unaligned_grads, atomic_mode),
        MODE_TEST(test_gallery_0, atomic_mode),
        MODE_TEST(test_gallery_1, atomic_mode),
        MODE_TEST(test_lead_tiles, atomic_mode),
        MODE_TEST(test_lead_tiles, deterministic_mode),
        MODE_TEST(test_head_pairs, atomic_mode),
        MODE_TEST(test_head_pairs, deterministic_mode),
        MODE_TEST(test_tail_split, atomic_mode),
        MODE_TEST(test_tail_split, deterministic_mode),
        cmocka_unit_test(test_order_choice),
        MODE_TEST(test_features_0, deterministic_mode),
        MODE_TEST(test_features_1, deterministic_mode),
        MODE_TEST(test_gallery_0, deterministic_mode),
        MODE_TEST(test_gallery_1, deterministic_mode),
        MODE_TEST(test_features_0, portable_mode),
        MODE_TEST(test_features_1, portable_mode),
        MODE_TEST(test_gallery_0, portable_mode),
        MODE_TEST(test_gallery_1, portable_mode),
        MODE_TEST(test_approx, approx_mode),
        MODE_TEST(test_approx, approx_portable_mode),
    };
#undef MODE_TEST
    return cmocka_run_group_tests(tests, NULL, NULL);
}
