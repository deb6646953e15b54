/* gpu_attention.c -- the forward kernel against the CPU reference.
 *
 * Every case draws fresh random inputs, poisons the outputs (all-ones bits:
 * NaN in bf16, fp16 and float32), runs the kernel through the public API and
 * compares with fg_attention_reference on the same inputs:
 *     ||out - ref||_F / ||ref||_F  <= 1e-2 (bf16), 2e-3 (fp16)
 *     |lse - ref| <= 1e-3 (1 + |ref|), -inf exactly where the reference has it
 *     no non-finite value in out, no NaN in lse, rows with LSE -inf exactly 0
 *     padding between output rows (strided layouts) never written.
 * The table covers every gallery mod x {D 64, 128} x {bf16, fp16} (and once
 * at D 96, 192 and 256) on several
 * shapes from the list, with and without block masks (CPU- and
 * GPU-built), then GQA / MQA, B / H broadcast, offsets, fully masked rows,
 * BSHD strides, odd head dims, Q_LEN != KV_LEN, and the argument errors only
 * a device call can meet (alignment, block sizes, kernel mismatch).
 * The features and the gallery run twice: with the Hopper kernel allowed
 * (on a compute capability 9.0 GPU it serves head dims 64, 96, 128, 192
 * and 256 with blocks of 128) and with FG_OPT_HOPPER_KERNEL 0, so the portable kernel is
 * checked on every case too. So does the approximate-math set
 * (FG_OPT_APPROX_MATH 1: softcap, ALiBi, noop and a score_mod on every
 * function it respells, D 64 and 128, bf16 and fp16, decode-shaped calls
 * among them), held to the same tolerances: its largest error, tanh's
 * relative 2^-11, moves a score s by |s| 2^-11 (softcap's scores here stay
 * within +-2, its cap), so each softmax weight by under 2^-10 relative --
 * a quarter of the rounding of the weights to bf16 (2^-8) that the kernels
 * do anyway, twice fp16's (2^-11) -- and the LSE by under 2^-10 absolute,
 * while fp16's output tolerance 2e-3 is 4x 2^-11 and the LSE's at least
 * 1e-3. The other functions are good to 2^-16 or better.
 * FLEXGEN_TEST_QUICK=1 runs a reduced table (for compute-sanitizer). */
#include "gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cudrv.h"
#include "internal.h"

static int failures = 0;
static int hopper_allowed = 1; /* the FG_OPT_HOPPER_KERNEL of the running test */
static int approx_math = 0;    /* its FG_OPT_APPROX_MATH                        */

static void run_case(fg_ctx *ctx, const acase *c) {
    char name[256];
    case_name(c, name, sizeof name);
    const double t_start = fgi_now_ms();
    fg_mod *mod = case_mod(ctx, c);
    binds bb;
    gallery_binds(c->mod, c, &bb);

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
    if (c->inf_v) hv[(size_t)(c->kv / 2) * (size_t)a.v_stride[2]] = c->dtype == FG_BF16 ? 0x7f80 : 0x7c00;
    const size_t nlse = (size_t)c->b * c->hq * c->q;
    CUdeviceptr dq = upload(hq, nq * 2), dk = upload(hk, nk * 2), dv = upload(hv, nk * 2), dout, dlse;
    const size_t out_bytes = (no + (size_t)c->out_off) * 2; /* out itself starts out_off elements in */
    assert_int_equal(fgi_cu()->cuMemAlloc(&dout, out_bytes), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemAlloc(&dlse, nlse * 4), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemsetD8(dout, 0xff, out_bytes), CUDA_SUCCESS);
    const CUdeviceptr out = dout + (size_t)c->out_off * 2;
    assert_int_equal(fgi_cu()->cuMemsetD8(dlse, 0xff, nlse * 4), CUDA_SUCCESS);

    fg_block_mask *bm = NULL;
    if (c->bm != BM_NONE) {
        fg_block_mask_desc desc = {c->bm_b ? c->bm_b : c->b, c->bm_h ? c->bm_h : c->hq, c->q, c->kv,
                                   c->q_block, c->kv_block};
        /* A block mask is built from the mod's view of the indices, so it
         * only applies without offsets; cases with offsets build none. */
        fg_status st = c->bm == BM_CPU
                           ? fg_block_mask_create(ctx, mod, &desc, bb.host, (size_t)bb.n, &bm)
                           : fg_block_mask_create_gpu(ctx, mod, &desc, bb.dev, (size_t)bb.n, NULL, &bm);
        if (st != FG_OK) print_error("%s: block mask: %s\n", name, fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
        if (c->bm == BM_GPU) assert_int_equal(fg_block_mask_download(ctx, bm), FG_OK);
    }
    a.block_mask = bm;

    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)out, a.lse = (float *)(uintptr_t)dlse;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n;
    const double t_gpu = fgi_now_ms();
    fg_status st = fg_attention_forward(ctx, mod, &a);
    if (st != FG_OK) print_error("%s: %s: %s\n%s", name, fg_status_string(st), fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    uint16_t *gout = malloc(no * 2);
    float *glse = malloc(nlse * 4);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(gout, out, no * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(glse, dlse, nlse * 4), CUDA_SUCCESS);

    const double t_ref = fgi_now_ms();
    /* The reference reads the same host arrays with the same strides. */
    double *rout = malloc(sizeof(double) * nlse * (size_t)c->d), *rlse = malloc(sizeof(double) * nlse);
    a.q = hq, a.k = hk, a.v = hv, a.binds = bb.host;
    st = fg_attention_reference(ctx, mod, &a, rout, rlse);
    if (st != FG_OK) print_error("%s: reference: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);

    double num = 0, den = 0, lse_err = 0;
    long nonfinite = 0, bad_masked = 0, pad_written = 0, lse_inf_mismatch = 0, masked_rows = 0, inf_rows = 0;
    for (int b = 0; b < c->b; b++)
        for (int h = 0; h < c->hq; h++)
            for (int i = 0; i < c->q; i++) {
                const size_t r = ((size_t)b * c->hq + h) * c->q + i;
                const uint16_t *orow = gout + b * a.out_stride[0] + h * a.out_stride[1] + i * a.out_stride[2];
                const bool masked = isinf(rlse[r]);
                masked_rows += masked && i < c->expect_masked_rows;
                /* (inf_v) a row of the query heads whose V holds the +inf:
                 * not compared; counted where its reference is not finite */
                const bool poisoned = c->inf_v && b == 0 && h / (c->hq / c->hkv) == 0;
                for (int d = 0; d < c->d && poisoned; d++)
                    if (!isfinite(rout[r * c->d + d])) {
                        inf_rows++;
                        break;
                    }
                for (int d = 0; d < c->d && !poisoned; d++) {
                    double g = from16(c->dtype, orow[d]), x = rout[r * c->d + d];
                    if (!isfinite(g)) nonfinite++;
                    if (masked && g != 0.0) bad_masked++;
                    num += (g - x) * (g - x);
                    den += x * x;
                }
                if (c->layout == BSHD)
                    for (int d = c->d; d < c->d + c->pad; d++) pad_written += orow[d] != 0xffff;
                if (isnan(glse[r])) nonfinite++;
                else if (masked || isinf(glse[r])) lse_inf_mismatch += !(isinf(glse[r]) && glse[r] < 0 && masked);
                else {
                    double e = fabs(glse[r] - rlse[r]) / (1 + fabs(rlse[r]));
                    if (e > lse_err) lse_err = e;
                }
            }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const double tol = c->dtype == FG_BF16 ? 1e-2 : 2e-3;
    const bool ok = rel <= tol && lse_err <= 1e-3 && nonfinite == 0 && bad_masked == 0 &&
                    pad_written == 0 && lse_inf_mismatch == 0 &&
                    masked_rows == (long)c->expect_masked_rows * c->b * c->hq && (!c->inf_v || inf_rows > 0);
    const double t_end = fgi_now_ms();
    printf("%-4s %s%s%s: rel %.2e lse %.2e (setup %.0f ms, gpu %.0f ms, reference %.0f ms)\n",
           ok ? "ok" : "FAIL", hopper_allowed ? "" : "[portable] ", approx_math ? "[approx] " : "", name, rel,
           lse_err, t_gpu - t_start, t_ref - t_gpu, t_end - t_ref);
    fflush(stdout);
    if (!ok) {
        printf("     nonfinite %ld, nonzero masked %ld, padding written %ld, lse -inf mismatch %ld, "
               "masked rows %ld, rows reading inf %ld\n",
               nonfinite, bad_masked, pad_written, lse_inf_mismatch, masked_rows, inf_rows);
        failures++;
    }
    free(rout), free(rlse), free(gout), free(glse), free(hq), free(hk), free(hv);
    fgi_cu()->cuMemFree(dq), fgi_cu()->cuMemFree(dk), fgi_cu()->cuMemFree(dv);
    fgi_cu()->cuMemFree(dout), fgi_cu()->cuMemFree(dlse);
    fg_block_mask_destroy(bm);
    binds_free(&bb);
    fg_mod_destroy(mod);
}

static bool quick(void) {
    const char *q = getenv("FLEXGEN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static fg_ctx *gpu_ctx(void) {
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, hopper_allowed), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, approx_math), FG_OK);
    return ctx;
}

static int allow_hopper(void **state) {
    (void)state;
    hopper_allowed = 1, approx_math = 0;
    return 0;
}
static int portable_only(void **state) {
    (void)state;
    hopper_allowed = 0, approx_math = 0;
    return 0;
}
static int approx_hopper(void **state) {
    (void)state;
    hopper_allowed = 1, approx_math = 1;
    return 0;
}
static int approx_portable(void **state) {
    (void)state;
    hopper_allowed = 0, approx_math = 1;
    return 0;
}

/* ---- the gallery sweep ------------------------------------------------------ */

/* Mods [m0, m1) of the gallery sweep. Each case's shape, block mask and
 * block size follow from its place in the whole sweep (k, w), so a part
 * runs the cases the whole sweep runs for its mods. */
static void gallery_mods(int m0, int m1) {
    fg_ctx *ctx = gpu_ctx();
    const int dims[2] = {64, 128};
    const fg_dtype dts[2] = {FG_BF16, FG_FP16};
    const int reps = quick() ? 1 : 2;
    for (int m = m0; m < m1; m++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 2; ti++)
                for (int rep = 0; rep < reps; rep++) {
                    const int k = ((m * 2 + di) * 2 + ti) * reps + rep;
                    if (quick() && (di + ti) % 2) continue;
                    const shape *s = &shapes[quick() ? k % 3 : (k * 3 + m) % NSHAPES];
                    acase c = {gallery[m], NULL, dims[di], dts[ti], s->b, s->hq, s->hkv, s->q, s->kv,
                               0, 0, BHSD, 0, k % 3, 0, 0, rep ? 64 : 128, 128, 0.f, 0};
                    run_case(ctx, &c);
                }
    /* The Hopper kernel's other head dims (96 stored as 128, 192 and 256
     * with 64-row K/V tiles): every mod once at each, the dtype and the
     * block size alternating. The portable kernel's odd head dims are the
     * features'. */
    const int wide[3] = {96, 192, 256};
    for (int m = m0; m < (hopper_allowed ? m1 : m0); m++)
        for (int di = 0; di < 3; di++) {
            const int w = m * 3 + di;
            if (quick() && w % 3) continue;
            const shape *s = &shapes[(w * 5 + m) % NSHAPES];
            acase c = {gallery[m], NULL, wide[di], w % 2 ? FG_FP16 : FG_BF16, s->b, s->hq, s->hkv, s->q, s->kv,
                       0, 0, BHSD, 0, w % 3, 0, 0, w % 4 == 1 ? 256 : 128, w % 4 == 3 ? 256 : 128, 0.f, 0};
            run_case(ctx, &c);
        }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* The sweep in four parts, so that scripts/gpu_suite.sh runs them as four
 * shards side by side: most of a part's time is its NVRTC compiles (about
 * 1.5 s each, one core), a few dozen a part. */
#define GALLERY_PART(n) gallery_mods(NGALLERY * (n) / 4, NGALLERY * ((n) + 1) / 4)
GPU_TEST(test_gallery_0, GALLERY_PART(0))
GPU_TEST(test_gallery_1, GALLERY_PART(1))
GPU_TEST(test_gallery_2, GALLERY_PART(2))
GPU_TEST(test_gallery_3, GALLERY_PART(3))

/* ---- the features one at a time --------------------------------------------- */

#define CAUSAL_SRC "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }\n"
/* Rows before 70 see nothing: fully masked rows, in and across tiles. */
#define LATE_SRC                                                                   \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return q_idx >= 70 && kv_idx <= q_idx;\n}\n"
/* A mask and a score that depend on b and h (the block mask must not
 * broadcast for this one). */
#define BH_SRC                                                                     \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return (q_idx + b + 2 * h) % 3 != 0 || kv_idx == 0;\n}\n"                 \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"        \
    "    return score * (1.0 + 0.25 * (float)h) - 0.5 * (float)b;\n}\n"

/* ALiBi's bias with a scalar slope beside a mask that reads q_idx and
 * kv_idx apart (not only through their difference): the forward keeps the
 * score_mod per element. */
#define BIAS_APART_SRC                                                             \
    "float S = 0.0625;\n"                                                          \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return kv_idx < 64 || q_idx >= kv_idx;\n}\n"                              \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"        \
    "    return score + S * (float)(kv_idx - q_idx);\n}\n"

/* A capped score (tanh: work per score a branch would skip) beside a
 * dilated window: the forward makes score_mod at every position of a
 * partial tile and then the mask folded over each warp's box
 * (FGA_FOLD_TILES): by diagonals with the window's bounds read from the
 * box where they hold over it, with them where they do not. */
#define CAPPED_DILATED_SRC                                                         \
    "float T = 4.0;\n"                                                             \
    "int P = 3;\n"                                                                 \
    "int W = 60;\n"                                                                \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    int d = q_idx - kv_idx;\n"                                                \
    "    return d >= 0 && d <= W * P && d % P == 0;\n}\n"                          \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"        \
    "    return T * tanh(score / T);\n}\n"

/* Division by a float parameter (fg_fdiv_by, the host's reciprocal): the
 * mask keeps a pair where bit 2^-17 of (q_idx + kv_idx) / F is 0, the last
 * bit of the quotients from 64 up, so a quotient that differed from the CPU
 * evaluator's IEEE division would flip elements and show in the output. */
#define FDIV_SRC                                                                   \
    "float F = 3.0;\n"                                                             \
    "float G = 10.0;\n"                                                            \
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"                       \
    "    return (int)((float)(q_idx + kv_idx) / F * 131072.0) % 2 == 0 || kv_idx / 7 == q_idx / 7;\n}\n" \
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"        \
    "    return score / G + (float)(q_idx - kv_idx) / F / 64.0;\n}\n"

static const acase features[] = {
    /* mod  src  D  dtype  B Hq Hkv Q KV  qoff kvoff  layout pad  bm bmB bmH qb kvb scale masked inf_v out_off */
    /* GQA and MQA */
    {"causal", NULL, 128, FG_BF16, 2, 8, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 64, FG_FP16, 1, 4, 1, 200, 333, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 64, 0, 0},
    {"sliding_window", NULL, 128, FG_BF16, 1, 6, 1, 513, 513, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* block masks broadcast over B, over H, over both */
    {"document", NULL, 64, FG_BF16, 3, 2, 2, 400, 400, 0, 0, BHSD, 0, BM_CPU, 1, 1, 128, 128, 0, 0},
    {"causal", NULL, 128, FG_FP16, 2, 3, 3, 257, 257, 0, 0, BHSD, 0, BM_GPU, 1, 0, 64, 64, 0, 0},
    {"prefix_lm", NULL, 64, FG_BF16, 2, 4, 2, 300, 260, 0, 0, BHSD, 0, BM_CPU, 0, 1, 128, 64, 0, 0},
    {NULL, BH_SRC, 64, FG_BF16, 2, 3, 3, 200, 190, 0, 0, BHSD, 0, BM_CPU, 0, 0, 64, 64, 0, 0},
    {NULL, BH_SRC, 128, FG_FP16, 2, 2, 1, 129, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {NULL, FDIV_SRC, 64, FG_BF16, 1, 2, 2, 300, 300, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {NULL, FDIV_SRC, 128, FG_FP16, 1, 2, 2, 200, 333, 0, 0, BHSD, 0, BM_GPU, 0, 0, 64, 64, 0, 0},
    /* offsets: a chunk of queries at the end of a longer KV cache */
    {"causal", NULL, 128, FG_BF16, 1, 2, 2, 64, 700, 636, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 64, FG_FP16, 1, 2, 1, 100, 900, 800, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"sliding_window", NULL, 64, FG_BF16, 1, 1, 1, 300, 300, 37, 5, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* A distance bias beside a mask that reads the indices apart, at head
     * dim 128, whose Hopper kernel computes (float)(kv_idx - q_idx) per
     * score as (float)kv_idx - (float)q_idx: indices just under 2^24 (that
     * kernel), then across it (refused there: the portable kernel runs) */
    {NULL, BIAS_APART_SRC, 128, FG_FP16, 1, 2, 2, 200, 300, (1 << 24) - 400, (1 << 24) - 500, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {NULL, BIAS_APART_SRC, 128, FG_BF16, 1, 2, 1, 200, 300, (1 << 24) - 100, (1 << 24) - 250, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* ALiBi alone at head dim 128, made by diagonals from the integer
     * distance: indices across 2^24 on the Hopper kernel */
    {"alibi", NULL, 128, FG_BF16, 1, 2, 1, 200, 300, (1 << 24) - 100, (1 << 24) - 250, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* ALiBi's distance as the Hopper forward's float distance
     * (FGI_SPLIT_DIST_FLOATS): distances just under 2^24 (that kernel, where
     * one float step is 1), then past it (refused there: the portable
     * kernel runs) */
    {"alibi", NULL, 64, FG_BF16, 1, 2, 2, 200, 300, (1 << 24) - 1000, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 64, FG_FP16, 1, 2, 1, 200, 300, (1 << 24) + 100, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* score_mod everywhere, then the mask folded over the tile (Hopper at
     * 64 and 128, the portable kernel at 80) */
    {NULL, CAPPED_DILATED_SRC, 64, FG_BF16, 1, 2, 1, 700, 700, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {NULL, CAPPED_DILATED_SRC, 128, FG_FP16, 1, 2, 2, 500, 650, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {NULL, CAPPED_DILATED_SRC, 80, FG_BF16, 1, 2, 1, 400, 400, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    /* fully masked rows, with and without a block mask */
    {NULL, LATE_SRC, 64, FG_BF16, 1, 2, 2, 200, 200, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 70},
    {NULL, LATE_SRC, 128, FG_FP16, 2, 1, 1, 200, 150, 0, 0, BHSD, 0, BM_GPU, 0, 0, 64, 64, 0, 70},
    /* BSHD, padded rows (the padding must stay untouched) */
    {"causal", NULL, 128, FG_BF16, 2, 4, 2, 190, 190, 0, 0, BSHD, 8, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 64, FG_FP16, 1, 2, 2, 77, 300, 0, 0, BSHD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* a non-default scale */
    {"noop", NULL, 128, FG_BF16, 1, 2, 2, 100, 100, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0.3f, 0},
    /* scales large enough that a later tile's scores pass its rows' running
     * maxima by more than the Hopper forward's exponentials against the
     * maxima as they stand allow (fgh_tile_exp_stale): those tiles take the
     * usual path again, in fp16's range */
    {"causal", NULL, 64, FG_FP16, 1, 2, 2, 700, 700, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 4.0f, 0},
    {"noop", NULL, 128, FG_FP16, 1, 2, 1, 300, 900, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 2.0f, 0},
    /* odd head dims */
    {"causal", NULL, 32, FG_BF16, 1, 2, 1, 129, 129, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"alibi", NULL, 48, FG_FP16, 1, 2, 2, 100, 177, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 80, FG_BF16, 1, 2, 2, 257, 257, 0, 0, BSHD, 8, BM_GPU, 0, 0, 128, 64, 0, 0},
    {"noop", NULL, 96, FG_BF16, 2, 2, 2, 127, 127, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* 96 through the Hopper kernel's padded columns: the padding and the
     * next head's columns in BSHD rows must stay untouched */
    {"sliding_window", NULL, 96, FG_FP16, 2, 3, 1, 300, 300, 0, 0, BSHD, 8, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"document", NULL, 192, FG_BF16, 2, 4, 2, 333, 333, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
    {"causal", NULL, 192, FG_FP16, 1, 2, 2, 64, 700, 636, 0, BSHD, 8, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"softcap", NULL, 112, FG_FP16, 1, 2, 1, 200, 200, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    {"sliding_window", NULL, 160, FG_BF16, 1, 2, 2, 300, 300, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
    {"causal", NULL, 256, FG_BF16, 1, 2, 2, 257, 257, 0, 0, BHSD, 0, BM_CPU, 0, 0, 64, 64, 0, 0},
    {"prefix_lm", NULL, 256, FG_BF16, 2, 4, 1, 300, 260, 0, 0, BHSD, 0, BM_CPU, 0, 1, 128, 128, 0, 0},
    {NULL, LATE_SRC, 256, FG_FP16, 2, 1, 1, 200, 150, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 70},
    {"noop", NULL, 256, FG_FP16, 1, 1, 1, 100, 1000, 0, 0, BSHD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"natten", NULL, 16, FG_BF16, 1, 1, 1, 300, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    /* Q_LEN != KV_LEN: decode-like and the reverse */
    {"noop", NULL, 128, FG_BF16, 2, 4, 1, 1, 1000, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0},
    {"flamingo", NULL, 128, FG_BF16, 1, 2, 2, 1000, 129, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0},
    /* +inf in one KV head's V, more q tiles than a GPU has SMs (the
     * persistent Hopper forward walks several per block): only the rows
     * that read it may differ */
    {"noop", NULL, 64, FG_BF16, 2, 32, 8, 1024, 1024, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0, 1},
    {"document", NULL, 64, FG_BF16, 2, 32, 8, 1024, 1024, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0, 1},
    {"causal", NULL, 128, FG_FP16, 2, 32, 8, 1024, 1024, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0, 1},
    /* out 4-byte but not 16-byte aligned: D=128 and D=64 softcap (kernels
     * that store O by TMA: the portable one runs), D=64 causal (registers) */
    {"noop", NULL, 128, FG_BF16, 1, 2, 2, 300, 300, 0, 0, BHSD, 0, BM_NONE, 0, 0, 128, 128, 0, 0, 0, 2},
    {"softcap", NULL, 64, FG_FP16, 1, 2, 1, 200, 257, 0, 0, BHSD, 0, BM_CPU, 0, 0, 128, 128, 0, 0, 0, 2},
    {"causal", NULL, 64, FG_BF16, 2, 2, 2, 333, 333, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0, 0, 2},
    /* long: 8191 x 8191 with a GPU block mask */
    {"sliding_window", NULL, 64, FG_BF16, 1, 1, 1, 8191, 8191, 0, 0, BHSD, 0, BM_GPU, 0, 0, 128, 128, 0, 0},
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

/* The table in two halves, two shards of scripts/gpu_suite.sh (as the
 * gallery's parts). */
#define NFEATURES ((int)(sizeof features / sizeof features[0]))
GPU_TEST(test_features_0, feature_rows(0, NFEATURES / 2))
GPU_TEST(test_features_1, feature_rows(NFEATURES / 2, NFEATURES))

/* ---- approximate math ------------------------------------------------------- */

/* A score_mod on every function approximate math respells, and a float
 * division; the reference computes it accurately. Its values stay within a
 * few units, as real score_mods' do, its tanh term within +-2. */
static const char APPROX_SRC[] =
    "float T = 2.0;\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx + 16 >= kv_idx; }\n"
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
    "    float d = (float)(abs(q_idx - kv_idx) + 1);\n"
    "    return T * tanh(score / T) + 0.5 * sigmoid(score) - 0.25 * log(d) + 0.5 * exp(-d / 8.0)\n"
    "           + 0.1 * (log2(d) - exp2(-d) + rsqrt(d));\n}\n";

/* softcap, ALiBi and noop (the set: a transcendental, a bias, and
 * neither) at D 64 and 128 in bf16 and fp16 over the sweep's shapes, and
 * APPROX_SRC, all at the accurate kernels' tolerances (the file's top
 * comment says why they hold). The kernels that ran must be the
 * approximate ones. */
static void test_approx_math(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    static const char *const mods[] = {"softcap", "alibi", "noop", NULL};
    const int dims[2] = {64, 128};
    const fg_dtype dts[2] = {FG_BF16, FG_FP16};
    int k = 0;
    for (int m = 0; m < 4; m++)
        for (int di = 0; di < 2; di++)
            for (int ti = 0; ti < 2; ti++, k++) {
                if (quick() && (di + ti + m) % 2) continue;
                const shape *s = &shapes[(k * 3 + m) % NSHAPES];
                acase c = {mods[m], mods[m] ? NULL : APPROX_SRC, dims[di], dts[ti], s->b, s->hq, s->hkv,
                           s->q, s->kv, 0, 0, BHSD, 0, k % 3, 0, 0, k % 2 ? 64 : 128, 128, 0.f, 0};
                run_case(ctx, &c);
            }
    /* the kernels that serve such calls (a decode step, a prefill, the
     * backward) are the approximate ones */
    fg_mod *mod = tu_gallery_mod(ctx, "softcap");
    for (int q = 1; q <= 256; q += 255) {
        fg_attention_args a = fg_attention_args_init();
        a.batch = 1, a.heads_q = a.heads_kv = 2, a.q_len = q, a.kv_len = 256, a.head_dim = 128;
        a.dtype = FG_BF16;
        fg_kernel *kern = NULL;
        assert_int_equal(fg_attention_kernel_for(ctx, mod, &a, &kern), FG_OK);
        assert_int_equal(kern->config.approx_math, 1);
        fg_kernel_release(kern);
    }
    fg_kernel_config cfg = fg_kernel_config_init();
    cfg.kind = FG_KERNEL_ATTENTION_BWD, cfg.head_dim = 64;
    fg_kernel *kern = NULL;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &kern), FG_OK);
    assert_int_equal(kern->config.approx_math, 1);
    fg_kernel_release(kern);
    /* a config's 1 asks for it whatever the context says */
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 0), FG_OK);
    cfg.kind = FG_KERNEL_ATTENTION_FWD, cfg.approx_math = 1;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &kern), FG_OK);
    assert_int_equal(kern->config.approx_math, 1);
    fg_kernel_release(kern);
    cfg.approx_math = 0;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &kern), FG_OK);
    assert_int_equal(kern->config.approx_math, 0);
    fg_kernel_release(kern);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* ---- errors only a device call meets; launches without recompiles -------- */

static void test_device_errors(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    fg_mod *mod = tu_gallery_mod(ctx, "sliding_window");
    CUdeviceptr buf;
    const size_t elems = 2 * 256 * 64;
    assert_int_equal(fgi_cu()->cuMemAlloc(&buf, elems * 2 * 4 + 64), CUDA_SUCCESS);
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = 1, a.heads_q = 2, a.heads_kv = 2, a.q_len = 256, a.kv_len = 256, a.head_dim = 64;
    a.dtype = FG_BF16;
    a.q = (const void *)(uintptr_t)buf;
    a.k = (const void *)(uintptr_t)(buf + elems * 2);
    a.v = (const void *)(uintptr_t)(buf + elems * 4);
    a.out = (void *)(uintptr_t)(buf + elems * 6);
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);

    fg_attention_args e = a;
    e.q = (const void *)(uintptr_t)(buf + 2); /* not 16-byte aligned */
    assert_int_equal(fg_attention_forward(ctx, mod, &e), FG_ERR_SHAPE);
    e = a;
    const int64_t odd_rows[4] = {2 * 256 * 68, 256 * 68, 68, 1}; /* rows 136 bytes apart */
    memcpy(e.k_stride, odd_rows, sizeof odd_rows);
    assert_int_equal(fg_attention_forward(ctx, mod, &e), FG_ERR_SHAPE);

    /* Block masks: q blocks of 32 are too small for the kernel's 64-row
     * tiles; a mask of another length does not fit. */
    fg_block_mask_desc d32 = {1, 1, 256, 256, 32, 64}, dlen = {1, 1, 200, 256, 128, 128};
    fg_block_mask *bm;
    assert_int_equal(fg_block_mask_create(ctx, mod, &d32, NULL, 0, &bm), FG_OK);
    e = a;
    e.block_mask = bm;
    assert_int_equal(fg_attention_forward(ctx, mod, &e), FG_ERR_NOT_SUPPORTED);
    fg_block_mask_destroy(bm);
    assert_int_equal(fg_block_mask_create(ctx, mod, &dlen, NULL, 0, &bm), FG_OK);
    e.block_mask = bm;
    assert_int_equal(fg_attention_forward(ctx, mod, &e), FG_ERR_SHAPE);
    fg_block_mask_destroy(bm);

    /* A kernel object: launched with other window values, no recompile;
     * refuses a call of another head dim or dtype. */
    fg_kernel_config cfg = {FG_KERNEL_ATTENTION_FWD, FG_BF16, 64, 0, 0, NULL};
    fg_kernel *k;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &k), FG_OK);
    fg_cache_stats s0, s1;
    fg_cache_get_stats(&s0);
    for (int w = 1; w < 300; w += 37) {
        fg_binding bw = fg_bind_int("WINDOW", w);
        e = a;
        e.binds = &bw, e.nbinds = 1;
        assert_int_equal(fg_kernel_launch(ctx, k, &e), FG_OK);
    }
    fg_cache_get_stats(&s1);
    assert_true(s1.misses == s0.misses);
    e = a;
    e.head_dim = 128;
    assert_int_equal(fg_kernel_launch(ctx, k, &e), FG_ERR_INVALID_ARGUMENT);
    e = a;
    e.dtype = FG_FP16;
    assert_int_equal(fg_kernel_launch(ctx, k, &e), FG_ERR_INVALID_ARGUMENT);
    fg_binding wrong = fg_bind_float("WINDOW", 3.5f);
    e = a;
    e.binds = &wrong, e.nbinds = 1;
    assert_int_equal(fg_kernel_launch(ctx, k, &e), FG_ERR_UNBOUND);
    assert_int_equal(fg_kernel_launch(ctx, NULL, &a), FG_ERR_INVALID_ARGUMENT);
    fg_kernel_release(k);
    fg_kernel_release(NULL);
    cfg.kind = FG_KERNEL_BLOCK_MASK;
    assert_int_equal(fg_kernel_get(ctx, mod, &cfg, &k), FG_ERR_INVALID_ARGUMENT);

    /* The Hopper kernel by name: only on compute capability 9.0, only for
     * head dims 64, 96, 128, 192, 256 and blocks of 128 or more. */
    int major = 0, minor = 0;
    assert_int_equal(fgi_cuda_arch(ctx, &major, &minor), FG_OK);
    fg_kernel_config h = {FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 64, 0, 0, NULL};
    fg_kernel_config any = {FG_KERNEL_ATTENTION_FWD, FG_BF16, 64, 0, 0, NULL};
    /* 64 and its other head dims are its own; 80 it does not take */
    static const int hopper_dims[4] = {64, 96, 192, 256};
    for (int i = 0; i < 4; i++) {
        any.head_dim = hopper_dims[i];
        assert_int_equal(fg_kernel_get(ctx, mod, &any, &k), FG_OK);
        assert_int_equal(fg_kernel_kind_of(k), major == 9 && minor == 0 && hopper_allowed
                                                   ? FG_KERNEL_ATTENTION_FWD_SM90
                                                   : FG_KERNEL_ATTENTION_FWD);
        fg_kernel_release(k);
    }
    any.head_dim = 80;
    assert_int_equal(fg_kernel_get(ctx, mod, &any, &k), FG_OK);
    assert_int_equal(fg_kernel_kind_of(k), FG_KERNEL_ATTENTION_FWD);
    fg_kernel_release(k);
    assert_int_equal(fg_kernel_kind_of(NULL), 0);
    if (major == 9 && minor == 0) {
        assert_int_equal(fg_kernel_get(ctx, mod, &h, &k), FG_OK);
        assert_int_equal(fg_kernel_kind_of(k), FG_KERNEL_ATTENTION_FWD_SM90);
        assert_int_equal(fg_kernel_launch(ctx, k, &a), FG_OK);
        fg_block_mask_desc d64 = {1, 1, 256, 256, 128, 64};
        assert_int_equal(fg_block_mask_create(ctx, mod, &d64, NULL, 0, &bm), FG_OK);
        e = a;
        e.block_mask = bm; /* kv blocks of 64 are under the Hopper kernel's tile */
        assert_int_equal(fg_kernel_launch(ctx, k, &e), FG_ERR_NOT_SUPPORTED);
        fg_block_mask_destroy(bm);
        fg_kernel_release(k);
        h.head_dim = 80;
        assert_int_equal(fg_kernel_get(ctx, mod, &h, &k), FG_ERR_NOT_SUPPORTED);
        h.head_dim = 64, h.q_block = 64;
        assert_int_equal(fg_kernel_get(ctx, mod, &h, &k), FG_ERR_NOT_SUPPORTED);
    } else {
        assert_int_equal(fg_kernel_get(ctx, mod, &h, &k), FG_ERR_NOT_SUPPORTED);
    }
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    fgi_cu()->cuMemFree(buf);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    tu_require_gpu();
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* scripts/gpu_suite.sh reads this table for its shards, a test a line */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_device_errors, allow_hopper),
        cmocka_unit_test_setup(test_features_0, allow_hopper),
        cmocka_unit_test_setup(test_features_1, allow_hopper),
        cmocka_unit_test_setup(test_gallery_0, allow_hopper),
        cmocka_unit_test_setup(test_gallery_1, allow_hopper),
        cmocka_unit_test_setup(test_gallery_2, allow_hopper),
        cmocka_unit_test_setup(test_gallery_3, allow_hopper),
        cmocka_unit_test_setup(test_features_0, portable_only),
        cmocka_unit_test_setup(test_features_1, portable_only),
        cmocka_unit_test_setup(test_gallery_0, portable_only),
        cmocka_unit_test_setup(test_gallery_1, portable_only),
        cmocka_unit_test_setup(test_gallery_2, portable_only),
        cmocka_unit_test_setup(test_gallery_3, portable_only),
        cmocka_unit_test_setup(test_approx_math, approx_hopper),
        cmocka_unit_test_setup(test_approx_math, approx_portable),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    fg_cache_stats cs;
    fg_cache_get_stats(&cs);
    printf("kernel cache: %llu compiles (%.0f ms), %llu memory hits, %llu disk hits\n",
           (unsigned long long)cs.misses, cs.compile_ms, (unsigned long long)cs.memory_hits,
           (unsigned long long)cs.disk_hits);
    return rc;
}
