/* test_reference.c -- the CPU reference (fg_attention_reference) against
 * answers worked out by hand.
 *
 * Every case is small enough that the expected output is a formula in the
 * test: one-hot queries and values turn the attention into "the softmax of a
 * few known scores, written into a few known columns", so the expected
 * numbers are exp() of literals, not the output of a second implementation.
 * The cases pin down the semantics the GPU kernel is held to: softmax and
 * LSE (natural log), a fully masked row (0 and -inf), the GQA head mapping,
 * strides (BHSD and BSHD give the same answer), score_mod seeing the score
 * after the scale, q/kv offsets, and FlexAttention's block-mask rule (a full
 * block is kept without asking mask_mod). Then the argument errors. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/reference.h"

#define D 16
#define TOL 1e-12

static uint16_t bf(float f) { /* exact for the small values used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static fg_mod *mod_src(fg_ctx *ctx, const char *text) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "test", text, (size_t)-1, &m);
    if (st != FG_OK) print_error("%s\n%s\n", fg_status_string(st), fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

#define MASK_SIG "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
#define SCORE_SIG "float score_mod(float score, int b, int h, int q_idx, int kv_idx) "
static const char NOOP[] = SCORE_SIG "{ return score; }\n";
static const char CAUSAL[] = MASK_SIG "{ return q_idx >= kv_idx; }\n";
static const char NEVER[] = MASK_SIG "{ return kv_idx < 0; }\n";
static const char CLAMP1[] = SCORE_SIG "{ return min(score, 1.0); }\n";

/* A problem of one batch: q [Hq][Q][D], k and v [Hkv][KV][D], contiguous. */
typedef struct problem {
    int hq, hkv, q, kv;
    uint16_t *qd, *kd, *vd;
    double *out, *lse;
    fg_attention_args args;
} problem;

static void problem_init(problem *p, int hq, int hkv, int q, int kv) {
    memset(p, 0, sizeof *p);
    p->hq = hq, p->hkv = hkv, p->q = q, p->kv = kv;
    p->qd = calloc((size_t)hq * q * D, 2);
    p->kd = calloc((size_t)hkv * kv * D, 2);
    p->vd = calloc((size_t)hkv * kv * D, 2);
    p->out = calloc((size_t)hq * q * D, sizeof(double));
    p->lse = calloc((size_t)hq * q, sizeof(double));
    fg_attention_args *a = &p->args;
    a->batch = 1, a->heads_q = hq, a->heads_kv = hkv, a->q_len = q, a->kv_len = kv, a->head_dim = D;
    a->dtype = FG_BF16;
    a->q = p->qd, a->k = p->kd, a->v = p->vd, a->out = p->out; /* out: any non-NULL */
    a->scale = 1.0f;
}

static void problem_free(problem *p) {
    free(p->qd), free(p->kd), free(p->vd), free(p->out), free(p->lse);
}

static uint16_t *qrow(problem *p, int h, int i) { return p->qd + ((size_t)h * p->q + i) * D; }
static uint16_t *krow(problem *p, int h, int j) { return p->kd + ((size_t)h * p->kv + j) * D; }
static uint16_t *vrow(problem *p, int h, int j) { return p->vd + ((size_t)h * p->kv + j) * D; }
static double out_at(problem *p, int h, int i, int d) { return p->out[((size_t)h * p->q + i) * D + d]; }
static double lse_at(problem *p, int h, int i) { return p->lse[(size_t)h * p->q + i]; }

static void run(fg_ctx *ctx, const fg_mod *mod, problem *p) {
    fg_status st = fg_attention_reference(ctx, mod, &p->args, p->out, p->lse);
    if (st != FG_OK) print_error("%s: %s\n", fg_status_string(st), fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
}

/* Query i is i * e0; key j is j * e0 (so q_i . k_j = i * j); value j is e_(j % D).
 * Row i's output in column j is then softmax_j(scale * i * j). */
static void ramp(problem *p, int h) {
    for (int i = 0; i < p->q; i++) qrow(p, h, i)[0] = bf((float)i);
    for (int j = 0; j < p->kv; j++) {
        krow(p, h, j)[0] = bf((float)j);
        vrow(p, h, j)[j % D] = bf(1.0f);
    }
}

static void test_softmax_by_hand(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, NOOP);
    problem p;
    problem_init(&p, 1, 1, 3, 3);
    ramp(&p, 0);
    run(ctx, mod, &p);
    /* Row 0: scores 0 0 0. Row 1: 0 1 2. Row 2: 0 2 4. */
    const double e = exp(1.0);
    const double rows[3][3] = {{1, 1, 1}, {1, e, e * e}, {1, e * e, e * e * e * e}};
    for (int i = 0; i < 3; i++) {
        double sum = rows[i][0] + rows[i][1] + rows[i][2];
        for (int j = 0; j < 3; j++) assert_true(fabs(out_at(&p, 0, i, j) - rows[i][j] / sum) < TOL);
        for (int d = 3; d < D; d++) assert_true(out_at(&p, 0, i, d) == 0.0);
        assert_true(fabs(lse_at(&p, 0, i) - log(sum)) < TOL);
    }
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

static void test_causal_and_offsets(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    problem p;
    problem_init(&p, 1, 1, 2, 3);
    ramp(&p, 0);
    run(ctx, mod, &p);
    /* Row 0 sees key 0 only; row 1 sees keys 0 and 1 (scores 0, 1). */
    const double e = exp(1.0);
    assert_true(fabs(out_at(&p, 0, 0, 0) - 1.0) < TOL);
    assert_true(fabs(lse_at(&p, 0, 0) - 0.0) < TOL);
    assert_true(fabs(out_at(&p, 0, 1, 0) - 1 / (1 + e)) < TOL);
    assert_true(fabs(out_at(&p, 0, 1, 1) - e / (1 + e)) < TOL);
    assert_true(out_at(&p, 0, 1, 2) == 0.0);
    /* With q_offset 1 the mod sees rows 1 and 2: row 0 now sees keys 0, 1. */
    p.args.q_offset = 1;
    run(ctx, mod, &p);
    assert_true(fabs(lse_at(&p, 0, 0) - log(2.0)) < TOL); /* scores 0, 0 */
    assert_true(fabs(lse_at(&p, 0, 1) - log(1 + e + e * e)) < TOL);
    /* kv_offset 2: row i sees key j when i >= j + 2: row 0 none, row 1 none. */
    p.args.q_offset = 0;
    p.args.kv_offset = 2;
    run(ctx, mod, &p);
    for (int i = 0; i < 2; i++) {
        assert_true(isinf(lse_at(&p, 0, i)) && lse_at(&p, 0, i) < 0);
        for (int d = 0; d < D; d++) assert_true(out_at(&p, 0, i, d) == 0.0);
    }
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

static void test_fully_masked_row(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, NEVER);
    problem p;
    problem_init(&p, 1, 1, 70, 130); /* more than one 64 x 64 tile each way */
    ramp(&p, 0);
    for (size_t i = 0; i < (size_t)70 * D; i++) p.out[i] = NAN; /* poisoned */
    run(ctx, mod, &p);
    for (int i = 0; i < 70; i++) {
        assert_true(isinf(lse_at(&p, 0, i)) && lse_at(&p, 0, i) < 0);
        for (int d = 0; d < D; d++) assert_true(out_at(&p, 0, i, d) == 0.0);
    }
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* Query heads 0..5 over kv heads 0..2: head h must read kv head h / 2. Value
 * rows of kv head g are all (g + 1), so the output is (g + 1) everywhere. */
static void test_gqa_mapping(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, NOOP);
    problem p;
    problem_init(&p, 6, 3, 4, 5);
    for (int g = 0; g < 3; g++)
        for (int j = 0; j < 5; j++)
            for (int d = 0; d < D; d++) {
                vrow(&p, g, j)[d] = bf((float)(g + 1));
                krow(&p, g, j)[d] = bf((float)((j + d) % 3) - 1.0f);
            }
    for (int h = 0; h < 6; h++)
        for (int i = 0; i < 4; i++)
            for (int d = 0; d < D; d++) qrow(&p, h, i)[d] = bf(0.25f * (float)((h + i + d) % 5));
    run(ctx, mod, &p);
    for (int h = 0; h < 6; h++)
        for (int i = 0; i < 4; i++)
            for (int d = 0; d < D; d++) assert_true(fabs(out_at(&p, h, i, d) - (h / 2 + 1)) < TOL);
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* The same numbers laid out BSHD (through strides, with padded rows) give
 * exactly the BHSD answer. */
static void test_strides(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    enum { B = 2, H = 2, S = 9, PAD = 8 };
    const size_t n = (size_t)B * H * S * D;
    uint16_t *x[3], *y[3];
    uint64_t seed = 7;
    for (int t = 0; t < 3; t++) {
        x[t] = malloc(n * 2);
        y[t] = calloc((size_t)B * S * H * (D + PAD), 2);
        for (size_t i = 0; i < n; i++) x[t][i] = bf((float)(tu_rand_uniform(&seed) * 4 - 2));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int s = 0; s < S; s++)
                    memcpy(y[t] + (((size_t)b * S + s) * H + h) * (D + PAD),
                           x[t] + (((size_t)b * H + h) * S + s) * D, D * 2);
    }
    double *o1 = malloc(n * sizeof(double)), *o2 = malloc(n * sizeof(double));
    double l1[B * H * S], l2[B * H * S];
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = D, a.dtype = FG_BF16;
    a.q = x[0], a.k = x[1], a.v = x[2], a.out = o1;
    assert_int_equal(fg_attention_reference(ctx, mod, &a, o1, l1), FG_OK);
    const int64_t st[4] = {(int64_t)S * H * (D + PAD), D + PAD, (int64_t)H * (D + PAD), 1};
    memcpy(a.q_stride, st, sizeof st);
    memcpy(a.k_stride, st, sizeof st);
    memcpy(a.v_stride, st, sizeof st);
    a.q = y[0], a.k = y[1], a.v = y[2];
    assert_int_equal(fg_attention_reference(ctx, mod, &a, o2, l2), FG_OK);
    assert_memory_equal(o1, o2, n * sizeof(double));
    assert_memory_equal(l1, l2, sizeof l1);
    for (int t = 0; t < 3; t++) free(x[t]), free(y[t]);
    free(o1), free(o2);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* score_mod = min(score, 1) with scale 0.5 and raw dots 4 and 0: after the
 * scale the scores are 2 and 0, clamped to 1 and 0. (Clamping first and
 * scaling after would give 0.5 and 0.) */
static void test_score_mod_after_scale(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CLAMP1);
    problem p;
    problem_init(&p, 1, 1, 1, 2);
    qrow(&p, 0, 0)[0] = bf(2.0f);
    krow(&p, 0, 0)[0] = bf(2.0f);
    vrow(&p, 0, 0)[0] = bf(1.0f);
    vrow(&p, 0, 1)[1] = bf(1.0f);
    p.args.scale = 0.5f;
    run(ctx, mod, &p);
    const double e = exp(1.0);
    assert_true(fabs(out_at(&p, 0, 0, 0) - e / (1 + e)) < TOL);
    assert_true(fabs(out_at(&p, 0, 0, 1) - 1 / (1 + e)) < TOL);
    assert_true(fabs(lse_at(&p, 0, 0) - log(1 + e)) < TOL);
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* FlexAttention's rule: a full block is used without asking mask_mod. The
 * mod masks everything, the block mask says q block 0 x kv block 1 is full:
 * rows 0..15 attend to keys 16..31 (scores i * j), rows 16..31 to nothing. */
static void test_block_mask_rule(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, NEVER);
    fg_block_mask_desc desc = {1, 1, 32, 32, 16, 16};
    const int32_t num[2] = {0, 0}, idx[4] = {0, 0, 0, 0};
    const int32_t fnum[2] = {1, 0}, fidx[4] = {1, 0, 0, 0};
    fg_block_mask *bm = NULL;
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, &desc, num, idx, fnum, fidx, &bm), FG_OK);
    problem p;
    problem_init(&p, 1, 1, 32, 32);
    for (int i = 0; i < 32; i++) qrow(&p, 0, i)[0] = bf(0.125f * (float)(i % 4));
    for (int j = 0; j < 32; j++) {
        krow(&p, 0, j)[0] = bf((float)(j % 3));
        vrow(&p, 0, j)[j % D] = bf(1.0f);
    }
    p.args.block_mask = bm;
    run(ctx, mod, &p);
    for (int i = 0; i < 32; i++) {
        if (i >= 16) {
            assert_true(isinf(lse_at(&p, 0, i)));
            continue;
        }
        /* Keys 16..31: score 0.125 (i % 4) (j % 3); value j is e_(j % 16). */
        double sum = 0, col[D] = {0};
        for (int j = 16; j < 32; j++) {
            double w = exp(0.125 * (i % 4) * (j % 3));
            sum += w;
            col[j % D] += w;
        }
        assert_true(fabs(lse_at(&p, 0, i) - log(sum)) < TOL);
        for (int d = 0; d < D; d++) assert_true(fabs(out_at(&p, 0, i, d) - col[d] / sum) < TOL);
    }
    problem_free(&p);
    fg_block_mask_destroy(bm);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* fp16 inputs: 1.5 and -0.75 are exact; out = the value row. */
static void test_fp16(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, NOOP);
    problem p;
    problem_init(&p, 1, 1, 1, 1);
    p.args.dtype = FG_FP16;
    p.vd[0] = 0x3e00; /* 1.5   */
    p.vd[1] = 0xba00; /* -0.75 */
    p.vd[2] = 0x0001; /* 2^-24, a subnormal */
    run(ctx, mod, &p);
    assert_true(out_at(&p, 0, 0, 0) == 1.5);
    assert_true(out_at(&p, 0, 0, 1) == -0.75);
    assert_true(out_at(&p, 0, 0, 2) == ldexp(1.0, -24));
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* ---- argument errors ------------------------------------------------------- */

typedef struct bad_case {
    const char *what;
    void (*edit)(fg_attention_args *a);
    fg_status expect;
} bad_case;

static void e_heads(fg_attention_args *a) { a->heads_kv = 3; }       /* 4 % 3 */
static void e_dim(fg_attention_args *a) { a->head_dim = 40; }
static void e_dim_big(fg_attention_args *a) { a->head_dim = 272; }
static void e_dtype(fg_attention_args *a) { a->dtype = (fg_dtype)7; }
static void e_null_q(fg_attention_args *a) { a->q = NULL; }
static void e_len(fg_attention_args *a) { a->q_len = 0; }
static void e_dstride(fg_attention_args *a) { a->k_stride[0] = 64, a->k_stride[1] = 64, a->k_stride[2] = 32, a->k_stride[3] = 2; }
static void e_negstride(fg_attention_args *a) { a->v_stride[0] = -16, a->v_stride[1] = 16, a->v_stride[2] = 16, a->v_stride[3] = 1; }
static void e_offset(fg_attention_args *a) { a->q_offset = 2147483647; }
static void e_scale(fg_attention_args *a) { a->scale = INFINITY; }
static void e_binds(fg_attention_args *a) { a->nbinds = 2; }

static const bad_case bad_cases[] = {
    {"Hq not a multiple of Hkv", e_heads, FG_ERR_SHAPE},
    {"head dim not a multiple of 16", e_dim, FG_ERR_NOT_SUPPORTED},
    {"head dim over 256", e_dim_big, FG_ERR_NOT_SUPPORTED},
    {"unknown dtype", e_dtype, FG_ERR_INVALID_ARGUMENT},
    {"NULL q", e_null_q, FG_ERR_INVALID_ARGUMENT},
    {"zero length", e_len, FG_ERR_SHAPE},
    {"d stride not 1", e_dstride, FG_ERR_SHAPE},
    {"negative stride", e_negstride, FG_ERR_SHAPE},
    {"q_offset overflows int", e_offset, FG_ERR_SHAPE},
    {"infinite scale", e_scale, FG_ERR_INVALID_ARGUMENT},
    {"NULL bindings, count 2", e_binds, FG_ERR_INVALID_ARGUMENT},
};

static void test_bad_arguments(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    problem p;
    problem_init(&p, 4, 2, 3, 3);
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        fg_attention_args a = p.args;
        bad_cases[i].edit(&a);
        fg_status st = fg_attention_reference(ctx, mod, &a, p.out, p.lse);
        if (st != bad_cases[i].expect)
            print_error("%s: got %s (%s)\n", bad_cases[i].what, fg_status_string(st), fg_errmsg(ctx));
        assert_int_equal(st, bad_cases[i].expect);
        assert_true(fg_errmsg(ctx)[0] != 0);
    }
    assert_int_equal(fg_attention_reference(ctx, mod, &p.args, NULL, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_reference(ctx, NULL, &p.args, p.out, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_reference(NULL, mod, &p.args, p.out, NULL), FG_ERR_INVALID_ARGUMENT);
    /* A buffer parameter left unbound. */
    fg_mod *doc = mod_src(ctx, "const int *doc;\n" MASK_SIG "{ return doc[q_idx] == doc[kv_idx]; }\n");
    assert_int_equal(fg_attention_reference(ctx, doc, &p.args, p.out, NULL), FG_ERR_UNBOUND);
    /* Bound, but too short: the evaluator reports the out-of-range read. */
    const int32_t ids[2] = {0, 0};
    fg_binding bd = fg_bind_int_buffer("doc", ids, 2);
    p.args.binds = &bd;
    p.args.nbinds = 1;
    assert_int_equal(fg_attention_reference(ctx, doc, &p.args, p.out, NULL), FG_ERR_EVAL);
    fg_mod_destroy(doc);
    problem_free(&p);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* In [-0.5, 0.5), from a linear congruential step (inputs that are not
 * worked out by hand, for the test below only). */
static float lcg_half(uint64_t *seed) {
    *seed = *seed * 6364136223846793005ull + 1;
    return (float)(*seed >> 40) / 0x1p24f - 0.5f;
}

/* The (b, h) pairs shared among threads: the answer bit for bit and the
 * error word for word what one thread gives, for thread counts that divide
 * the pairs and that do not, more threads than pairs, and the default. */
static void test_threads(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, "const float *slope;\n" MASK_SIG "{ return q_idx + 40 >= kv_idx; }\n" SCORE_SIG
                               "{ return score + slope[h] * (float)(kv_idx - q_idx) + 0.5 * (float)b; }\n");
    const int B = 3, HQ = 4, HKV = 2, Q = 70, KV = 90;
    fg_attention_args a = fg_attention_args_init();
    a.batch = B, a.heads_q = HQ, a.heads_kv = HKV, a.q_len = Q, a.kv_len = KV, a.head_dim = D;
    a.dtype = FG_BF16, a.scale = 0.25f;
    const size_t nq = (size_t)B * HQ * Q * D, nk = (size_t)B * HKV * KV * D, nl = (size_t)B * HQ * Q;
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2);
    uint64_t seed = 7;
    for (size_t i = 0; i < nq; i++) q[i] = bf(lcg_half(&seed));
    for (size_t i = 0; i < nk; i++) k[i] = bf(lcg_half(&seed));
    for (size_t i = 0; i < nk; i++) v[i] = bf(lcg_half(&seed));
    a.q = q, a.k = k, a.v = v, a.out = q;
    const float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fg_binding bind = fg_bind_float_buffer("slope", slopes, 4);
    a.binds = &bind, a.nbinds = 1;
    double *out1 = malloc(nq * sizeof(double)), *lse1 = malloc(nl * sizeof(double));
    double *outn = malloc(nq * sizeof(double)), *lsen = malloc(nl * sizeof(double));
    assert_int_equal(fgi_attention_reference_threads(ctx, mod, &a, out1, lse1, 1), FG_OK);
    static const int counts[] = {2, 4, 5, 32, 0};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        memset(outn, 0xff, nq * sizeof(double)), memset(lsen, 0xff, nl * sizeof(double));
        assert_int_equal(fgi_attention_reference_threads(ctx, mod, &a, outn, lsen, counts[i]), FG_OK);
        if (memcmp(out1, outn, nq * sizeof(double)) || memcmp(lse1, lsen, nl * sizeof(double)))
            print_error("%d threads\n", counts[i]);
        assert_memory_equal(out1, outn, nq * sizeof(double));
        assert_memory_equal(lse1, lsen, nl * sizeof(double));
    }
    /* Too short a buffer for heads 2 and 3: every batch fails there, the
     * first failing pair is (0, 2), and the message is one thread's. */
    bind = fg_bind_float_buffer("slope", slopes, 2);
    const fg_status st1 = fgi_attention_reference_threads(ctx, mod, &a, out1, lse1, 1);
    assert_int_equal(st1, FG_ERR_EVAL);
    char *msg1 = strdup(fg_errmsg(ctx));
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        const fg_status stn = fgi_attention_reference_threads(ctx, mod, &a, outn, lsen, counts[i]);
        if (stn != st1 || strcmp(msg1, fg_errmsg(ctx)))
            print_error("%d threads: %s / %s\n", counts[i], fg_errmsg(ctx), msg1);
        assert_int_equal(stn, st1);
        assert_string_equal(fg_errmsg(ctx), msg1);
    }
    free(msg1);
    free(out1), free(lse1), free(outn), free(lsen), free(q), free(k), free(v);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_by_hand),
        cmocka_unit_test(test_causal_and_offsets),
        cmocka_unit_test(test_fully_masked_row),
        cmocka_unit_test(test_gqa_mapping),
        cmocka_unit_test(test_strides),
        cmocka_unit_test(test_score_mod_after_scale),
        cmocka_unit_test(test_block_mask_rule),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
