/*
 * test_reference_bwd.c -- the CPU reference backward against central
 * finite differences of the CPU reference forward.
 *
 * The loss is L = sum(dO * O) + sum(dlse * lse) for a fixed random dO and
 * dlse, so dL/dx is what the backward returns for x in q, k, v. Inputs are fp16 on a grid of 2^-6 in
 * [-1, 1], and each is moved by +-2^-8, which fp16 represents exactly there:
 * the difference quotient then sees exactly the perturbed input, and the
 * forward in double (the score_mod in float) is smooth enough at that step
 * for a 1e-2 relative match. A float buffer read by score_mod is perturbed
 * directly. Each row is a mod and a shape: GQA, Q_LEN != KV_LEN, a block
 * mask (full blocks kept without asking mask_mod), offsets, fully masked
 * rows (their gradients must be exactly 0).
 */
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "reference/reference.h"

#define D 16

static uint16_t to_fp16(double v) { /* v on the 2^-10 grid, |v| < 2: exact */
    if (v == 0) return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    double m = fabs(v);
    int e;
    double f = frexp(m, &e); /* m = f * 2^e, f in [0.5, 1) */
    int exp = e - 1 + 15;
    if (exp <= 0) return sign | (uint16_t)lround(m * 16777216.0); /* subnormal: 2^-24 units */
    uint16_t man = (uint16_t)lround((f * 2.0 - 1.0) * 1024.0);
    return sign | (uint16_t)(exp << 10) | man;
}

static double from_fp16(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
    double v = exp == 0 ? ldexp(man, -24) : ldexp(man | 1024, exp - 25);
    return sign ? -v : v;
}

typedef struct row {
    const char *name;
    const char *src;
    int hq, hkv, q, kv;
    int q_offset, kv_offset;
    int block;        /* block-mask block size, 0: no block mask */
    bool slopes;      /* binds the float buffer `slopes` [hq]   */
} row;

#define MASK_SIG "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
#define SCORE_SIG "float score_mod(float score, int b, int h, int q_idx, int kv_idx) "

static const row ROWS[] = {
    {"noop", SCORE_SIG "{ return score; }\n", 2, 2, 5, 7, 0, 0, 0, false},
    {"causal gqa", MASK_SIG "{ return q_idx >= kv_idx; }\n", 4, 2, 6, 6, 0, 0, 0, false},
    {"alibi", "const float *slopes;\n" SCORE_SIG "{ return score + slopes[h] * (float)(kv_idx - q_idx); }\n"
     MASK_SIG "{ return q_idx >= kv_idx; }\n", 2, 1, 7, 5, 2, 0, 0, true},
    {"softcap", "float CAP = 2.0f;\n" SCORE_SIG "{ return CAP * tanh(score / CAP); }\n", 1, 1, 4, 9, 0, 0, 0,
     false},
    {"masked rows", MASK_SIG "{ return q_idx >= kv_idx + 3; }\n", 2, 1, 6, 5, 0, 0, 0, false},
    {"block mask", MASK_SIG "{ return kv_idx <= q_idx + 1 && q_idx % 3 != 1; }\n", 2, 2, 40, 40, 0, 0, 16,
     false},
    {"offsets and a temperature", "const float *slopes;\n" SCORE_SIG
     "{ float t = slopes[h % 2] + 1.5f; return score / t + (q_idx > kv_idx ? 0.5f : -0.25f); }\n",
     2, 2, 5, 6, 3, 1, 0, true},
};

typedef struct problem {
    const row *r;
    fg_attention_args a;
    uint16_t *q, *k, *v, *dout;
    float *dlse; /* d L / d lse */
    float slopes[4];
    double *lse;
    fg_binding bind;
    fg_block_mask *bm;
    double *out;
} problem;

static double loss(fg_ctx *ctx, const fg_mod *m, problem *p) {
    assert_int_equal(fg_attention_reference(ctx, m, &p->a, p->out, p->lse), FG_OK);
    const size_t rows = (size_t)p->r->hq * p->r->q, n = rows * D;
    double L = 0;
    for (size_t i = 0; i < n; i++) L += p->out[i] * from_fp16(p->dout[i]);
    for (size_t i = 0; i < rows; i++) /* a fully masked row's lse, -inf, has no gradient */
        if (isfinite(p->lse[i])) L += p->dlse[i] * p->lse[i];
    return L;
}

static uint16_t *random_fp16(size_t n, uint64_t *rng) {
    uint16_t *x = malloc(n * 2);
    for (size_t i = 0; i < n; i++) x[i] = to_fp16((double)((int)(tu_rand_u64(rng) % 129) - 64) / 64.0);
    return x;
}

/* Compare one tensor's analytical gradient with difference quotients at a
 * sample of its elements. */
static void check_tensor(fg_ctx *ctx, const fg_mod *m, problem *p, const char *what, uint16_t *x, size_t n,
                         const double *grad, uint64_t *rng) {
    for (int t = 0; t < 24; t++) {
        const size_t i = (size_t)(tu_rand_u64(rng) % n);
        const uint16_t keep = x[i];
        const double v = from_fp16(keep), eps = 1.0 / 256.0;
        x[i] = to_fp16(v + eps);
        const double hi = loss(ctx, m, p);
        x[i] = to_fp16(v - eps);
        const double lo = loss(ctx, m, p);
        x[i] = keep;
        const double fd = (hi - lo) / (2 * eps);
        if (fabs(fd - grad[i]) > 1e-2 * fmax(0.05, fabs(fd)))
            fail_msg("%s: d%s[%zu] is %.6g, finite difference %.6g", p->r->name, what, i, grad[i], fd);
    }
}

static void test_against_differences(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    uint64_t rng = 0xbacc;
    for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++) {
        const row *r = &ROWS[ri];
        fg_mod *m = NULL;
        if (fg_mod_from_source(ctx, r->name, r->src, (size_t)-1, &m) != FG_OK)
            fail_msg("%s: %s", r->name, fg_error_diagnostic(ctx));
        problem p;
        memset(&p, 0, sizeof p);
        p.r = r;
        const size_t nq = (size_t)r->hq * r->q * D, nk = (size_t)r->hkv * r->kv * D;
        p.q = random_fp16(nq, &rng);
        p.k = random_fp16(nk, &rng);
        p.v = random_fp16(nk, &rng);
        p.dout = random_fp16(nq, &rng);
        p.out = calloc(nq, sizeof(double));
        p.lse = calloc((size_t)r->hq * r->q, sizeof(double));
        p.dlse = malloc(sizeof(float) * (size_t)r->hq * r->q);
        for (int i = 0; i < r->hq * r->q; i++) p.dlse[i] = (float)((int)(tu_rand_u64(&rng) % 65) - 32) / 32.0f;
        for (int i = 0; i < 4; i++) p.slopes[i] = 0.25f * (float)(i + 1);
        fg_attention_args *a = &p.a;
        a->batch = 1, a->heads_q = r->hq, a->heads_kv = r->hkv, a->q_len = r->q, a->kv_len = r->kv;
        a->head_dim = D, a->dtype = FG_FP16, a->scale = 0.5f;
        a->q = p.q, a->k = p.k, a->v = p.v, a->out = p.out;
        a->q_offset = r->q_offset, a->kv_offset = r->kv_offset;
        if (r->slopes) {
            p.bind = fg_bind_float_buffer("slopes", p.slopes, 4);
            a->binds = &p.bind, a->nbinds = 1;
        }
        if (r->block) {
            fg_block_mask_desc desc = {1, 1, r->q, r->kv, r->block, r->block};
            assert_int_equal(fg_block_mask_create(ctx, m, &desc, a->binds, a->nbinds, &p.bm), FG_OK);
            a->block_mask = p.bm;
        }
        double *dq = calloc(nq, sizeof(double)), *dk = calloc(nk, sizeof(double)),
               *dv = calloc(nk, sizeof(double));
        double slope_grad[4] = {0};
        double *bufs[4] = {0};
        if (r->slopes) bufs[fgi_mod_find_param(m, "slopes")] = slope_grad;
        fgi_ref_bwd_out o = {p.dout, {0, 0, 0, 0}, p.dlse, dq, dk, dv, bufs};
        if (fgi_attention_reference_backward(ctx, m, a, &o) != FG_OK) fail_msg("%s: %s", r->name, fg_errmsg(ctx));
        for (size_t i = 0; i < nq; i++) assert_true(isfinite(dq[i]));
        for (size_t i = 0; i < nk; i++) assert_true(isfinite(dk[i]) && isfinite(dv[i]));
        check_tensor(ctx, m, &p, "q", p.q, nq, dq, &rng);
        check_tensor(ctx, m, &p, "k", p.k, nk, dk, &rng);
        check_tensor(ctx, m, &p, "v", p.v, nk, dv, &rng);
        if (r->slopes)
            for (int i = 0; i < 4; i++) {
                const float keep = p.slopes[i], eps = 1.0f / 64.0f;
                p.slopes[i] = keep + eps;
                const double hi = loss(ctx, m, &p);
                p.slopes[i] = keep - eps;
                const double lo = loss(ctx, m, &p);
                p.slopes[i] = keep;
                const double fd = (hi - lo) / (2.0 * eps);
                if (fabs(fd - slope_grad[i]) > 2e-2 * fmax(0.05, fabs(fd)))
                    fail_msg("%s: dslopes[%d] is %.6g, finite difference %.6g", r->name, i, slope_grad[i], fd);
            }
        if (strcmp(r->name, "masked rows") == 0) /* rows 0-2 see no key */
            for (int h = 0; h < r->hq; h++)
                for (int i = 0; i < 3; i++)
                    for (int d = 0; d < D; d++) assert_true(dq[((size_t)h * r->q + i) * D + d] == 0.0);
        free(dq), free(dk), free(dv);
        free(p.q), free(p.k), free(p.v), free(p.dout), free(p.out), free(p.lse), free(p.dlse);
        fg_block_mask_destroy(p.bm);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The units shared among threads: dQ, dK, dV and a buffer's gradient
 * (summed over every unit) bit for bit what one thread gives, and the
 * error word for word, for thread counts that divide the six units and
 * that do not, more threads than units, and the default. */
static void test_threads(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = NULL;
    const char *src = "const float *slopes;\n" SCORE_SIG "{ return score + slopes[h] * (float)(kv_idx - q_idx); }\n"
                      MASK_SIG "{ return q_idx + 20 >= kv_idx; }\n";
    assert_int_equal(fg_mod_from_source(ctx, "threads", src, (size_t)-1, &m), FG_OK);
    const int B = 3, HQ = 4, HKV = 2, Q = 37, KV = 45;
    uint64_t rng = 0x7e4d;
    const size_t nq = (size_t)B * HQ * Q * D, nk = (size_t)B * HKV * KV * D;
    uint16_t *q = random_fp16(nq, &rng), *k = random_fp16(nk, &rng), *v = random_fp16(nk, &rng);
    uint16_t *dout = random_fp16(nq, &rng);
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fg_attention_args a = fg_attention_args_init();
    a.batch = B, a.heads_q = HQ, a.heads_kv = HKV, a.q_len = Q, a.kv_len = KV, a.head_dim = D;
    a.dtype = FG_FP16, a.scale = 0.5f;
    a.q = q, a.k = k, a.v = v, a.out = q;
    fg_binding bind = fg_bind_float_buffer("slopes", slopes, 4);
    a.binds = &bind, a.nbinds = 1;
    const int sp = fgi_mod_find_param(m, "slopes");
    double *g1[2][4], *bufs[2][4] = {{0}};
    double *dq[2], *dk[2], *dv[2];
    for (int t = 0; t < 2; t++) {
        dq[t] = malloc(nq * sizeof(double)), dk[t] = malloc(nk * sizeof(double)), dv[t] = malloc(nk * sizeof(double));
        bufs[t][sp] = g1[t][0] = malloc(4 * sizeof(double));
    }
    fgi_ref_bwd_out one = {dout, {0, 0, 0, 0}, NULL, dq[0], dk[0], dv[0], bufs[0]};
    fgi_ref_bwd_out many = {dout, {0, 0, 0, 0}, NULL, dq[1], dk[1], dv[1], bufs[1]};
    assert_int_equal(fgi_attention_reference_backward_threads(ctx, m, &a, &one, 1), FG_OK);
    static const int counts[] = {2, 3, 4, 32, 0};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        memset(dq[1], 0xff, nq * sizeof(double)), memset(g1[1][0], 0xff, 4 * sizeof(double));
        assert_int_equal(fgi_attention_reference_backward_threads(ctx, m, &a, &many, counts[i]), FG_OK);
        if (memcmp(dq[0], dq[1], nq * sizeof(double)) || memcmp(dk[0], dk[1], nk * sizeof(double)) ||
            memcmp(dv[0], dv[1], nk * sizeof(double)) || memcmp(g1[0][0], g1[1][0], 4 * sizeof(double)))
            fail_msg("%d threads: not one thread's gradients", counts[i]);
    }
    /* Too short a buffer for heads 2 and 3: the first failing unit is
     * (batch 0, KV head 1), and the message is one thread's. */
    bind = fg_bind_float_buffer("slopes", slopes, 2);
    const fg_status st1 = fgi_attention_reference_backward_threads(ctx, m, &a, &one, 1);
    assert_int_equal(st1, FG_ERR_EVAL);
    char msg1[1024];
    snprintf(msg1, sizeof msg1, "%s", fg_errmsg(ctx));
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        const fg_status stn = fgi_attention_reference_backward_threads(ctx, m, &a, &many, counts[i]);
        if (stn != st1 || strcmp(msg1, fg_errmsg(ctx)))
            fail_msg("%d threads: %s / %s", counts[i], fg_errmsg(ctx), msg1);
    }
    for (int t = 0; t < 2; t++) free(dq[t]), free(dk[t]), free(dv[t]), free(g1[t][0]);
    free(q), free(k), free(v), free(dout);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_differences),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
