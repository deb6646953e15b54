/*
 * test_deriv.c -- the derivatives of score_mod (src/mod/deriv.c), against
 * finite differences of score_mod itself.
 *
 * Each row is a score_mod; at random lanes the derived d score_mod / d score,
 * evaluated by the same evaluator as score_mod, must match the central
 * difference (f(s + e) - f(s - e)) / 2e of score_mod. Lanes where score_mod
 * is not finite (a masked score) must have derivative 0, and lanes within
 * reach of a kink the row names are skipped (the kinks' own values are
 * builtins.def's, checked in test_builtins). Then the buffer gradients: for
 * each float buffer read, the derived index must be the element read and the
 * derived value the difference quotient of score_mod in that element.
 */
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mod/deriv.h"

static const float BIAS[8] = {0.25f, -0.5f, 1.0f, 0.75f, -1.25f, 0.1f, 2.0f, -0.3f};

typedef struct row {
    const char *src;       /* a mod file with a score_mod                        */
    float kinks[4];        /* scores where score_mod is not smooth (NAN: none)  */
    int nsites;            /* float buffer reads that get gradients              */
} row;

#define NONE {NAN, NAN, NAN, NAN}

static const row ROWS[] = {
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }", NONE, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score * 2.0f + 1.0f; }",
     NONE, 0},
    {"float score_mod(float s, int b, int h, int q, int k) { return -s / (1.0f + s * s); }", NONE, 0},
    {"float SOFTCAP = 20.0f;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return SOFTCAP * tanh(score / SOFTCAP);\n}\n",
     NONE, 0},
    {"const float *bias;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + bias[h] * (float)(kv_idx - q_idx);\n}\n",
     NONE, 1},
    {"const float *bias;\nfloat T = 2.0f;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    float s = score / T;\n"
     "    float w = sigmoid(s) * exp2(bias[(q_idx - kv_idx) & 7]);\n"
     "    const int k = q_idx % 3;\n"
     "    return q_idx >= kv_idx ? w * s + pow(abs(s) + 1.0f, 1.5f) + (float)k : -INFINITY;\n}\n",
     {0.0f, NAN, NAN, NAN}, 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return clamp(score, -1.0f, 1.0f) + max(score, 0.5f) * min(score, 2.0f);\n}\n",
     {-1.0f, 1.0f, 0.5f, 2.0f}, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return log(1.0f + exp(score)) + sqrt(score * score + 1.0f) + sin(score) * cos(score)\n"
     "        + rsqrt(score * score + 2.0f) + log2(score * score + 0.5f);\n}\n",
     NONE, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return floor(score) + score - round(score) * 0.5f + trunc(score) + ceil(score);\n}\n",
     {-2.5f, -2.0f, -1.5f, -1.0f}, 0},
    {"const float *bias;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    float a = bias[q_idx & 7];\n"
     "    float c = a * score;\n"
     "    return c > 0.0f ? c * bias[kv_idx & 7] : exp(c) - bias[0];\n}\n",
     {0.0f, NAN, NAN, NAN}, 3},
};

static fg_mod *load(fg_ctx *ctx, const char *src) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "row", src, (size_t)-1, &m);
    if (st != FG_OK) fail_msg("%s\n%s", fg_error_diagnostic(ctx), src);
    return m;
}

static bool near_kink(const row *r, float s, float eps) {
    for (int k = 0; k < 4; k++) {
        if (isnan(r->kinks[k])) continue;
        /* a kink at every integer or half-integer for the rounding row */
        if (r->kinks[0] == -2.5f) {
            float frac = s * 2.0f - floorf(s * 2.0f);
            return frac < 4 * eps || frac > 1 - 4 * eps;
        }
        if (fabsf(s - r->kinks[k]) < 4 * eps) return true;
    }
    return false;
}

/* score_mod at one lane, and its value at score +- eps. */
static float f_at(fg_ctx *ctx, const fg_mod *m, const fgi_value *v, int h, int q, int kv, float s) {
    float out;
    assert_int_equal(fgi_eval_score(ctx, m, v, 0, h, q, 1, kv, 1, &s, &out), FG_OK);
    return out;
}

static void test_d_score(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    uint64_t rng = 0x5eed;
    for (size_t r = 0; r < sizeof ROWS / sizeof ROWS[0]; r++) {
        fg_mod *m = load(ctx, ROWS[r].src);
        fgi_mod_grad g;
        assert_int_equal(fgi_mod_derive(ctx, m, &g), FG_OK);
        assert_non_null(g.d_score);
        assert_int_equal(g.nsites, ROWS[r].nsites);
        fg_binding bd = fg_bind_float_buffer("bias", BIAS, 8);
        fgi_value v[8];
        assert_int_equal(fgi_bind(ctx, m, &bd, fgi_mod_find_param(m, "bias") >= 0 ? 1 : 0, v), FG_OK);
        int checked = 0;
        for (int t = 0; t < 200; t++) {
            const int h = (int)(tu_rand_u64(&rng) % 4), q = (int)(tu_rand_u64(&rng) % 50),
                      kv = (int)(tu_rand_u64(&rng) % 50);
            const float s = (float)(tu_rand_uniform(&rng) * 6.0 - 3.0);
            float d;
            assert_int_equal(fgi_eval_func(ctx, m, g.d_score, v, 0, h, q, 1, kv, 1, &s, &d), FG_OK);
            const float f = f_at(ctx, m, v, h, q, kv, s);
            if (!isfinite(f)) {
                assert_true(d == 0.0f);
                continue;
            }
            assert_true(isfinite(d));
            const float eps = 1e-2f * fmaxf(1.0f, fabsf(s));
            if (near_kink(&ROWS[r], s, eps)) continue;
            const double fd = ((double)f_at(ctx, m, v, h, q, kv, s + eps) -
                               (double)f_at(ctx, m, v, h, q, kv, s - eps)) / (2.0 * eps);
            if (fabs(fd - d) > 3e-3 * fmax(1.0, fabs(fd)))
                fail_msg("row %zu: d/dscore at s=%g (h %d q %d kv %d) is %g, finite difference %g", r,
                         (double)s, h, q, kv, (double)d, fd);
            checked++;
        }
        assert_true(checked > 50);
        fgi_mod_grad_free(&g);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* d score_mod / d bias[i], summed over the reads of bias[i], against the
 * difference quotient in bias[i]. */
static void test_buffer_grads(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    uint64_t rng = 0xb1a5;
    for (size_t r = 0; r < sizeof ROWS / sizeof ROWS[0]; r++) {
        if (ROWS[r].nsites == 0) continue;
        fg_mod *m = load(ctx, ROWS[r].src);
        fgi_mod_grad g;
        assert_int_equal(fgi_mod_derive(ctx, m, &g), FG_OK);
        float bias[8];
        memcpy(bias, BIAS, sizeof bias);
        fg_binding bd = fg_bind_float_buffer("bias", bias, 8);
        fgi_value v[8];
        assert_int_equal(fgi_bind(ctx, m, &bd, 1, v), FG_OK);
        for (int t = 0; t < 100; t++) {
            const int h = (int)(tu_rand_u64(&rng) % 4), q = (int)(tu_rand_u64(&rng) % 50),
                      kv = (int)(tu_rand_u64(&rng) % 50);
            const float s = (float)(tu_rand_uniform(&rng) * 6.0 - 3.0);
            if (!isfinite(f_at(ctx, m, v, h, q, kv, s))) continue;
            double grad[8] = {0};
            for (int k = 0; k < g.nsites; k++) {
                assert_int_equal(g.sites[k].param, fgi_mod_find_param(m, "bias"));
                int32_t idx;
                float d;
                assert_int_equal(fgi_eval_func(ctx, m, g.sites[k].index, v, 0, h, q, 1, kv, 1, &s, &idx), FG_OK);
                assert_int_equal(fgi_eval_func(ctx, m, g.sites[k].grad, v, 0, h, q, 1, kv, 1, &s, &d), FG_OK);
                assert_true(idx >= 0 && idx < 8);
                grad[idx] += d;
            }
            for (int i = 0; i < 8; i++) {
                const float eps = 1e-2f;
                const float keep = bias[i];
                bias[i] = keep + eps;
                const double hi = f_at(ctx, m, v, h, q, kv, s);
                bias[i] = keep - eps;
                const double lo = f_at(ctx, m, v, h, q, kv, s);
                bias[i] = keep;
                /* the row with a branch on the sign of a bias product: skip
                 * lanes where the perturbation flips it */
                if ((hi > 0) != (lo > 0) && r == sizeof ROWS / sizeof ROWS[0] - 1) continue;
                const double fd = (hi - lo) / (2.0 * eps);
                if (fabs(fd - grad[i]) > 3e-3 * fmax(1.0, fabs(fd)))
                    fail_msg("row %zu: d/dbias[%d] at s=%g (h %d q %d kv %d) is %g, finite difference %g", r,
                             i, (double)s, h, q, kv, grad[i], fd);
            }
        }
        fgi_mod_grad_free(&g);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* No score_mod: nothing to derive. A mask never has a derivative. */
static void test_no_score(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, "q_idx >= kv_idx", NULL, 0, &m), FG_OK);
    fgi_mod_grad g;
    assert_int_equal(fgi_mod_derive(ctx, m, &g), FG_OK);
    assert_null(g.d_score);
    assert_int_equal(g.nsites, 0);
    fgi_mod_grad_free(&g);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_d_score),
        cmocka_unit_test(test_buffer_grads),
        cmocka_unit_test(test_no_score),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
