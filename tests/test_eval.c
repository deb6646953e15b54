/*
 * test_eval.c -- the CPU evaluator, as a specification.
 *
 * Each table row is an expression of the mod language, the lane it is
 * evaluated at and the value C gives (computed by the C compiler in the row
 * itself where that is clearer than a literal). Expressions are placed in a
 * small mod file with a few parameters, so that error offsets can be checked
 * against the exact byte the diagnostic must point at.
 *
 *  - int rows are observed twice: `(EXPR) == WANT` as a mask, and
 *    `(float)(EXPR)` as a score (so a broken == cannot hide a wrong value);
 *  - float rows are observed as a score_mod, compared bit for bit (NaN: any
 *    NaN);
 *  - bool rows as a mask_mod.
 * Then whole tiles (short-circuit, locals, odd sizes across chunk borders)
 * against hand-written C, the run-time errors with their offsets and lanes,
 * and bad arguments.
 */
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- the mod every row lives in ---------------------------------------- */

static const char PRELUDE[] =
    "const int *buf;\n"
    "const float *fbuf;\n"
    "int N = 10;\n"
    "float F = 2.5;\n";

static const int32_t BUF[4] = {3, -1, 0, 7};
static const float FBUF[3] = {0.5f, -2.0f, 8.0f};

enum { ROW_B = 2, ROW_H = 5 };

static size_t bind_all(fg_binding *bd) {
    bd[0] = fg_bind_int_buffer("buf", BUF, 4);
    bd[1] = fg_bind_float_buffer("fbuf", FBUF, 3);
    return 2;
}

/* The source of a mod whose mask_mod (or score_mod) has `locals` then
 * `return EXPR;`; *expr_at receives the offset of EXPR in it. */
static char *mod_text(bool score, const char *locals, const char *expr, size_t *expr_at) {
    fgi_buf b = {0};
    fgi_buf_puts(&b, PRELUDE);
    fgi_buf_puts(&b, score ? "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
                           : "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n");
    fgi_buf_puts(&b, locals ? locals : "");
    fgi_buf_puts(&b, "    return ");
    if (expr_at) *expr_at = b.len;
    fgi_buf_puts(&b, expr);
    fgi_buf_puts(&b, ";\n}\n");
    return fgi_buf_take(&b);
}

static fg_mod *load(fg_ctx *ctx, bool score, const char *locals, const char *expr, size_t *expr_at) {
    char *text = mod_text(score, locals, expr, expr_at);
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "row.c", text, (size_t)-1, &m);
    if (st != FG_OK) {
        print_error("does not load: %s\n%s\n%s\n", expr, fg_status_string(st), fg_error_diagnostic(ctx));
        free(text);
        fail();
    }
    free(text);
    return m;
}

static bool mask_at(fg_ctx *ctx, const char *expr, int q, int kv) {
    fg_mod *m = load(ctx, false, NULL, expr, NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    uint8_t out = 0xAA;
    fg_status st = fg_mod_eval_mask(ctx, m, bd, nb, ROW_B, ROW_H, q, 1, kv, 1, &out);
    if (st != FG_OK) print_error("%s: %s\n", expr, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    assert_true(out == 0 || out == 1);
    fg_mod_destroy(m);
    return out;
}

static float score_at(fg_ctx *ctx, const char *expr, int q, int kv, float in) {
    fg_mod *m = load(ctx, true, NULL, expr, NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    float out = -12345.0f;
    fg_status st = fg_mod_eval_score(ctx, m, bd, nb, ROW_B, ROW_H, q, 1, kv, 1, &in, &out);
    if (st != FG_OK) print_error("%s: %s\n", expr, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    fg_mod_destroy(m);
    return out;
}

static bool same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- int semantics ------------------------------------------------------ */

typedef struct int_row {
    const char *expr;
    int q, kv;
    int32_t want;
} int_row;

static void check_int_rows(fg_ctx *ctx, const int_row *rows, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int_row *r = &rows[i];
        char text[512];
        if (r->want == INT32_MIN) snprintf(text, sizeof text, "(%s) == -2147483648", r->expr);
        else snprintf(text, sizeof text, "(%s) == %d", r->expr, (int)r->want);
        bool eq = mask_at(ctx, text, r->q, r->kv);
        snprintf(text, sizeof text, "(float)(%s)", r->expr);
        float f = score_at(ctx, text, r->q, r->kv, 0.0f);
        if (!eq || !same_float(f, (float)r->want)) {
            print_error("row %zu: %s at (q=%d, kv=%d): want %d, got == %d, as float %.9g\n", i,
                        r->expr, r->q, r->kv, (int)r->want, (int)eq, (double)f);
            fail();
        }
    }
}

static void test_int_arithmetic(void **state) {
    fg_ctx *ctx = *state;
    const int_row rows[] = {
        /* arguments and parameters */
        {"q_idx", 7, 3, 7},
        {"kv_idx", 7, 3, 3},
        {"b * 10 + h", 0, 0, ROW_B * 10 + ROW_H},
        {"N", 0, 0, 10},
        {"q_idx - kv_idx", 3, 7, -4},
        {"q_idx * kv_idx + 1", 12, 11, 133},
        /* wrapping arithmetic */
        {"2147483647 + q_idx", 1, 0, INT32_MIN},
        {"-2147483648 - q_idx", 1, 0, INT32_MAX},
        {"q_idx * 1000000007", 3, 0, (int32_t)(3u * 1000000007u)},
        {"q_idx * 65536 * 65536", 5, 0, 0},
        {"-(-2147483648 + q_idx)", 0, 0, INT32_MIN},
        {"+q_idx", 9, 0, 9},
        {"-q_idx", 9, 0, -9},
        /* division and modulo truncate toward zero */
        {"(q_idx - 14) / 2", 7, 0, -3},
        {"(q_idx - 14) % 2", 7, 0, -1},
        {"q_idx / -2", 7, 0, -3},
        {"q_idx % -2", 7, 0, 1},
        {"-q_idx / -2", 7, 0, 3},
        {"-q_idx % -2", 7, 0, -1},
        {"q_idx / kv_idx", 100, 7, 14},
        {"q_idx % kv_idx", 100, 7, 2},
        {"(-2147483648 + q_idx) / 1", 0, 0, INT32_MIN},
        {"(-2147483648 + q_idx) / -2", 0, 0, 1073741824},
        {"2147483647 / -1 + q_idx", 0, 0, -2147483647},
        /* bitwise and shifts */
        {"q_idx & kv_idx", 12, 10, 8},
        {"q_idx | kv_idx", 12, 10, 14},
        {"q_idx ^ kv_idx", 12, 10, 6},
        {"~q_idx", 12, 0, -13},
        {"1 << q_idx", 31, 0, INT32_MIN},
        {"q_idx << kv_idx", 3, 4, 48},
        {"-q_idx << 4", 1, 0, -16},
        {"(-q_idx) >> 2", 17, 0, -5},
        {"-1 >> kv_idx", 0, 31, -1},
        {"(-2147483648 + q_idx) >> 31", 0, 0, -1},
        {"q_idx >> kv_idx", 1024, 3, 128},
        {"q_idx << 0", 77, 0, 77},
        /* precedence as in C */
        {"q_idx + kv_idx * 2 - 1", 3, 4, 10},
        {"q_idx << 1 + kv_idx", 1, 2, 8},
        {"q_idx & 3 | kv_idx ^ 1", 6, 4, 7},
        /* bool in arithmetic is 0 / 1 */
        {"(q_idx > kv_idx) + 1", 5, 4, 2},
        {"(q_idx > kv_idx) * 7", 4, 5, 0},
        /* conditional */
        {"q_idx > kv_idx ? q_idx : kv_idx", 3, 9, 9},
        {"q_idx > kv_idx ? q_idx : kv_idx", 9, 3, 9},
        {"q_idx ? 1 : 2", 0, 0, 2},
        /* casts to int: truncation, saturation, NaN -> 0, bool */
        {"(int)F", 0, 0, 2},
        {"(int)(-F)", 0, 0, -2},
        {"(int)((float)q_idx * 0.5)", 7, 0, 3},
        {"(int)(-(float)q_idx * 0.5)", 7, 0, -3},
        {"(int)((float)q_idx * 1e10)", 1, 0, INT32_MAX},
        {"(int)((float)q_idx * -1e10)", 1, 0, INT32_MIN},
        {"(int)((float)q_idx * 2147483648.0)", 1, 0, INT32_MAX},
        {"(int)((float)q_idx * -2147483648.0)", 1, 0, INT32_MIN},
        {"(int)(INFINITY * (float)q_idx)", 1, 0, INT32_MAX},
        {"(int)(-INFINITY * (float)q_idx)", 1, 0, INT32_MIN},
        {"(int)(NAN * (float)q_idx)", 1, 0, 0},
        {"(int)(sqrt(-(float)q_idx))", 1, 0, 0},
        {"(int)(q_idx == 7)", 7, 0, 1},
        {"(int)(q_idx == 7)", 6, 0, 0},
        /* int overloads of the builtins */
        {"abs(q_idx - 10)", 3, 0, 7},
        {"abs(q_idx)", 3, 0, 3},
        {"abs(-2147483648 + q_idx)", 0, 0, INT32_MIN},
        {"min(q_idx, kv_idx)", 3, -4, -4},
        {"max(q_idx, kv_idx)", 3, -4, 3},
        {"clamp(q_idx, 2, 5)", 0, 0, 2},
        {"clamp(q_idx, 2, 5)", 9, 0, 5},
        {"clamp(q_idx, 2, 5)", 4, 0, 4},
        {"clamp(q_idx, kv_idx, N)", 11, 3, 10},
        /* buffers */
        {"buf[q_idx]", 0, 0, 3},
        {"buf[q_idx]", 3, 0, 7},
        {"buf[buf[kv_idx] + 1]", 0, 1, 3},
        {"(int)fbuf[q_idx]", 2, 0, 8},
    };
    check_int_rows(ctx, rows, sizeof rows / sizeof rows[0]);
}

/* ---- float semantics ---------------------------------------------------- */

typedef struct float_row {
    const char *expr;
    int q, kv;
    float score; /* the score_mod's input */
    float want;
} float_row;

static void check_float_rows(fg_ctx *ctx, const float_row *rows, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float_row *r = &rows[i];
        float got = score_at(ctx, r->expr, r->q, r->kv, r->score);
        if (!same_float(got, r->want)) {
            print_error("row %zu: %s at (q=%d, kv=%d, score=%g): want %.9g, got %.9g\n", i, r->expr,
                        r->q, r->kv, (double)r->score, (double)r->want, (double)got);
            fail();
        }
    }
}

static void test_float_arithmetic(void **state) {
    fg_ctx *ctx = *state;
    /* Inputs the compiler cannot see, so that the expected values come from
     * the same libm at run time rather than from constant folding (which
     * rounds correctly where libm may be an ulp off). */
    volatile float vol[] = {1.0f, 3.0f, 0.7f, 1.7f, 2.0f, 2.5f, 30.0f, 0.25f};
    const float third = vol[0], three = vol[1], c07 = vol[2], c17 = vol[3], two = vol[4],
                c25 = vol[5], c30 = vol[6], quarter = vol[7];
    const float_row rows[] = {
        {"score", 0, 0, 1.25f, 1.25f},
        {"F", 0, 0, 0.0f, 2.5f},
        {"score * 2.0 + 1.0", 0, 0, 1.5f, 4.0f},
        {"1.0 / (float)(q_idx)", 3, 0, 0.0f, third / three},
        {"score / 3.0", 0, 0, 1.0f, third / three},
        {"score - (float)q_idx", 5, 0, 0.1f, 0.1f - 5.0f},
        {"-score", 0, 0, 0.0f, -0.0f},
        {"score / (float)kv_idx", 0, 0, 1.0f, INFINITY},
        {"score / (float)kv_idx", 0, 0, -1.0f, -INFINITY},
        {"score / (float)kv_idx", 0, 0, 0.0f, NAN},
        {"-INFINITY", 0, 0, 0.0f, -INFINITY},
        {"score * 16777217.0", 0, 0, 1.0f, 16777216.0f},
        {"score + 1e-8", 0, 0, 1.0f, 1.0f},
        /* promotion: int operands become float, division stays int first */
        {"(float)(q_idx / 2) * 1.5", 7, 0, 0.0f, 4.5f},
        {"q_idx / 2 * 1.5", 7, 0, 0.0f, 4.5f},
        {"q_idx * 1.5", 7, 0, 0.0f, 10.5f},
        {"score + q_idx", 16777216, 0, 1.0f, 16777216.0f},
        {"score + N", 0, 0, 0.5f, 10.5f},
        {"(float)(q_idx > kv_idx)", 2, 1, 0.0f, 1.0f},
        {"(float)(-2147483648 + q_idx)", 0, 0, 0.0f, -2147483648.0f},
        {"fbuf[q_idx] * score", 1, 0, 3.0f, -6.0f},
        {"q_idx > 1 ? score : -score", 0, 0, 2.0f, -2.0f},
        {"q_idx > 1 ? score : (float)q_idx", 5, 0, 2.0f, 2.0f},
        /* every float builtin against libm (single precision) */
        {"abs(score)", 0, 0, -2.5f, fabsf(-2.5f)},
        {"min(score, F)", 0, 0, 3.0f, 2.5f},
        {"max(score, F)", 0, 0, 3.0f, 3.0f},
        {"min(score, NAN * (float)q_idx)", 1, 0, 3.0f, fminf(3.0f, NAN)},
        {"clamp(score, -1.0, 1.0)", 0, 0, 7.0f, 1.0f},
        {"clamp(score, -1.0, 1.0)", 0, 0, -7.0f, -1.0f},
        {"clamp(score, -1.0, 1.0)", 0, 0, 0.25f, 0.25f},
        {"exp(score)", 0, 0, 0.7f, expf(c07)},
        {"exp2(score)", 0, 0, 0.7f, exp2f(c07)},
        {"log(score)", 0, 0, 0.7f, logf(c07)},
        {"log(score)", 0, 0, 0.0f, -INFINITY},
        {"log2(score)", 0, 0, 0.7f, log2f(c07)},
        {"sqrt(score)", 0, 0, 2.0f, sqrtf(two)},
        {"sqrt(score)", 0, 0, -2.0f, NAN},
        {"rsqrt(score)", 0, 0, 2.0f, 1.0f / sqrtf(two)},
        {"tanh(score)", 0, 0, 0.7f, tanhf(c07)},
        {"sigmoid(score)", 0, 0, 0.7f, 1.0f / (1.0f + expf(-c07))},
        {"sigmoid(score)", 0, 0, -200.0f, 0.0f},
        {"floor(score)", 0, 0, -1.5f, -2.0f},
        {"ceil(score)", 0, 0, -1.5f, -1.0f},
        {"pow(score, F)", 0, 0, 1.7f, powf(c17, c25)},
        {"sin(score)", 0, 0, 0.7f, sinf(c07)},
        {"cos(score)", 0, 0, 0.7f, cosf(c07)},
        {"round(score)", 0, 0, 2.5f, 3.0f},
        {"round(score)", 0, 0, -2.5f, -3.0f},
        {"trunc(score)", 0, 0, -2.7f, -2.0f},
        {"fmod(score, 2.0)", 0, 0, -7.5f, fmodf(-7.5f, two)},
        {"exp((float)q_idx * 0.25)", 3, 0, 0.0f, expf(three * quarter)},
        /* the soft-cap and ALiBi shapes */
        {"F * tanh(score / F)", 0, 0, 30.0f, c25 * tanhf(c30 / c25)},
        {"score + fbuf[h - 5] * (float)(kv_idx - q_idx)", 9, 2, 1.0f, 1.0f + 0.5f * -7.0f},
    };
    check_float_rows(ctx, rows, sizeof rows / sizeof rows[0]);
}

/* ---- bool semantics ----------------------------------------------------- */

typedef struct bool_row {
    const char *expr;
    int q, kv;
    bool want;
} bool_row;

static void test_bool_logic(void **state) {
    fg_ctx *ctx = *state;
    const bool_row rows[] = {
        {"true", 0, 0, true},
        {"false", 0, 0, false},
        {"q_idx >= kv_idx", 3, 3, true},
        {"q_idx >= kv_idx", 2, 3, false},
        {"q_idx > kv_idx", 3, 3, false},
        {"q_idx < kv_idx", -5, 3, true},
        {"q_idx <= kv_idx", 4, 3, false},
        {"q_idx == kv_idx", 4, 4, true},
        {"q_idx != kv_idx", 4, 4, false},
        {"!(q_idx == kv_idx)", 4, 5, true},
        {"(q_idx > 1) == (kv_idx > 1)", 0, 0, true},
        {"(q_idx > 1) != (kv_idx > 1)", 5, 0, true},
        /* float comparisons, NaN unordered */
        {"F > 2.0", 0, 0, true},
        {"(float)q_idx < 0.5", 0, 0, true},
        {"NAN * (float)q_idx < 1.0", 1, 0, false},
        {"NAN * (float)q_idx >= 1.0", 1, 0, false},
        {"NAN * (float)q_idx == NAN * (float)q_idx", 1, 0, false},
        {"NAN * (float)q_idx != NAN * (float)q_idx", 1, 0, true},
        {"-INFINITY < (float)q_idx", -2147483647, 0, true},
        /* conversions to bool in conditions */
        {"(bool)q_idx", 0, 0, false},
        {"(bool)q_idx", -3, 0, true},
        {"(bool)(F - 2.5)", 0, 0, false},
        {"(bool)(0.25 * (float)q_idx)", 1, 0, true},
        {"(bool)(NAN * (float)q_idx)", 1, 0, true},
        {"q_idx && kv_idx", 1, 0, false},
        {"q_idx || kv_idx", 0, 2, true},
        {"!q_idx", 0, 0, true},
        /* logic */
        {"q_idx > 0 && kv_idx > 0", 1, 1, true},
        {"q_idx > 0 && kv_idx > 0", 1, 0, false},
        {"q_idx > 0 || kv_idx > 0", 0, 0, false},
        {"q_idx > 0 || kv_idx > 0", 0, 1, true},
        {"q_idx > 0 || kv_idx > 0 && false", 1, 1, true},
        {"q_idx > 2 ? kv_idx > 2 : kv_idx < 2", 3, 1, false},
        {"q_idx > 2 ? kv_idx > 2 : kv_idx < 2", 1, 1, true},
        /* short-circuit protects the right side (errors if evaluated) */
        {"q_idx < 4 && buf[q_idx] > 0", 9, 0, false},
        {"q_idx >= 4 || buf[q_idx] > 0", 9, 0, true},
        {"kv_idx != 0 && q_idx / kv_idx > 1", 5, 0, false},
        {"kv_idx == 0 || q_idx % kv_idx == 0", 5, 0, true},
        {"kv_idx > 0 ? q_idx / kv_idx > 1 : q_idx > 100", 5, 0, false},
        {"kv_idx < 32 ? 1 << kv_idx == 32 : q_idx > 0", 0, 40, false},
        {"kv_idx < 0 ? buf[kv_idx] == 0 : fbuf[kv_idx] > 0.0", 5, 2, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        bool got = mask_at(ctx, rows[i].expr, rows[i].q, rows[i].kv);
        if (got != rows[i].want) {
            print_error("row %zu: %s at (q=%d, kv=%d): want %d\n", i, rows[i].expr, rows[i].q,
                        rows[i].kv, (int)rows[i].want);
            fail();
        }
    }
}

/* ---- locals ------------------------------------------------------------- */

typedef struct local_row {
    const char *locals;
    const char *expr;
    int q, kv;
    int32_t want; /* observed as `(EXPR) == want` */
} local_row;

static void test_locals(void **state) {
    fg_ctx *ctx = *state;
    const local_row rows[] = {
        {"    int d = q_idx - kv_idx;\n", "d * d", 7, 3, 16},
        {"    int a = q_idx + 1;\n    int c = a * 2;\n    int d = c - a;\n", "d", 4, 0, 5},
        {"    float x = (float)q_idx * 0.5;\n    int y = (int)x;\n", "y", 7, 0, 3},
        {"    bool nearby = abs(q_idx - kv_idx) < 3;\n    int w = nearby ? 10 : 20;\n", "w", 7, 6, 10},
        {"    const int s = buf[q_idx];\n", "s >= 0 && kv_idx < 4 ? buf[kv_idx] : -9", 0, 3, 7},
        {"    const int s = buf[q_idx];\n", "s >= 0 && kv_idx < 4 ? buf[kv_idx] : -9", 1, 3, -9},
        /* a local shadows nothing and is read after later locals */
        {"    int a = q_idx;\n    int c = kv_idx;\n", "a - c", 10, 4, 6},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const local_row *r = &rows[i];
        char expr[256];
        snprintf(expr, sizeof expr, "(%s) == %d", r->expr, (int)r->want);
        fg_mod *m = load(ctx, false, r->locals, expr, NULL);
        fg_binding bd[4];
        size_t nb = bind_all(bd);
        uint8_t out = 7;
        assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, r->q, 1, r->kv, 1, &out), FG_OK);
        if (out != 1) {
            print_error("row %zu: %s%s at (q=%d, kv=%d)\n", i, r->locals, r->expr, r->q, r->kv);
            fail();
        }
        fg_mod_destroy(m);
    }
}

/* ---- whole tiles against hand-written C ---------------------------------- */

/* One mask exercising locals, a buffer behind a guard, ?: and a division
 * behind a guard; every lane is compared with the same thing in C. */
static const char TILE_LOCALS[] = "    int d = q_idx - kv_idx;\n    int m = (q_idx * 7 + kv_idx * 3) % 11;\n";
static const char TILE_EXPR[] =
    "d >= 0 && (kv_idx < 4 ? buf[kv_idx] >= 0 : (m == 0 || d / m < 9)) || (q_idx & 7) == 3";

static bool tile_c(int q, int kv) {
    int d = q - kv;
    int m = (q * 7 + kv * 3) % 11;
    return (d >= 0 && (kv < 4 ? BUF[kv] >= 0 : (m == 0 || d / m < 9))) || (q & 7) == 3;
}

static void test_tiles(void **state) {
    fg_ctx *ctx = *state;
    static const struct {
        int q0, nq, kv0, nk;
    } shapes[] = {
        {0, 1, 0, 1},       {5, 1, 3, 1},     {0, 1, 0, 1000}, {999, 1000, 0, 1},
        {0, 127, 0, 129},   {64, 127, 1, 129}, {0, 300, 0, 300}, {17, 300, 0, 300},
        {0, 128, 0, 128},   {0, 129, 0, 128}, {3, 7, 2000, 5},  {0, 1, 0, 16385},
    };
    fg_mod *m = load(ctx, false, TILE_LOCALS, TILE_EXPR, NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int q0 = shapes[s].q0, nq = shapes[s].nq, kv0 = shapes[s].kv0, nk = shapes[s].nk;
        uint8_t *out = malloc((size_t)nq * nk);
        memset(out, 0xAA, (size_t)nq * nk);
        fg_status st = fg_mod_eval_mask(ctx, m, bd, nb, 1, 1, q0, nq, kv0, nk, out);
        if (st != FG_OK) print_error("%s\n", fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nk; j++)
                if (out[(size_t)i * nk + j] != tile_c(q0 + i, kv0 + j)) {
                    print_error("shape %zu: lane (q=%d, kv=%d) got %d\n", s, q0 + i, kv0 + j,
                                out[(size_t)i * nk + j]);
                    fail();
                }
        free(out);
    }
    fg_mod_destroy(m);
}

/* Division and modulo over whole tiles, for divisors shared by every lane
 * (the evaluator's multiply-and-shift path) and mixed ones, with dividends
 * up to nearly INT_MAX and of both signs. */
static void test_division_tiles(void **state) {
    fg_ctx *ctx = *state;
    static const int32_t divisors[] = {1, 2, 3, 7, 10, 128, 641, 65535, 65536, 1000003,
                                       1073741825, 2147483647, -1, -3, -65536};
    static const struct {
        int q0, nq, kv0, nk;
    } tiles[] = {{2000, 47, 0, 301}, {-2100, 40, 5, 90}, {0, 3, 0, 5000}, {-20, 41, -7, 15}};
    /* quotients are seen whole (as a float, to within 2^-24) and by their
     * low 16 bits (exactly), which together pin them down */
    fg_mod *dm = load(ctx, true, NULL, "(float)((q_idx * 1000003 + kv_idx * 7) / N & 65535)", NULL);
    fg_mod *fm = load(ctx, true, NULL, "(float)((q_idx * 1000003 + kv_idx * 7) / N)", NULL);
    fg_mod *mm = load(ctx, true, NULL, "(float)((q_idx * 1000003 + kv_idx * 7) % N)", NULL);
    fg_mod *vm = load(ctx, true, NULL, "(float)((q_idx * 1000003) / (kv_idx == 0 ? N : kv_idx))", NULL);
    for (size_t di = 0; di < sizeof divisors / sizeof divisors[0]; di++)
        for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++) {
            int q0 = tiles[ti].q0, nq = tiles[ti].nq, kv0 = tiles[ti].kv0, nk = tiles[ti].nk;
            size_t n = (size_t)nq * nk;
            float *in = calloc(n, sizeof *in), *d = malloc(n * sizeof *d), *m = malloc(n * sizeof *m),
                  *v = malloc(n * sizeof *v), *f = malloc(n * sizeof *f);
            fg_binding bd[4];
            size_t nb = bind_all(bd);
            bd[nb++] = fg_bind_int("N", divisors[di]);
            assert_int_equal(fg_mod_eval_score(ctx, dm, bd, nb, 0, 0, q0, nq, kv0, nk, in, d), FG_OK);
            assert_int_equal(fg_mod_eval_score(ctx, fm, bd, nb, 0, 0, q0, nq, kv0, nk, in, f), FG_OK);
            assert_int_equal(fg_mod_eval_score(ctx, mm, bd, nb, 0, 0, q0, nq, kv0, nk, in, m), FG_OK);
            assert_int_equal(fg_mod_eval_score(ctx, vm, bd, nb, 0, 0, q0, nq, kv0, nk, in, v), FG_OK);
            for (int i = 0; i < nq; i++)
                for (int j = 0; j < nk; j++) {
                    int32_t x = (q0 + i) * 1000003 + (kv0 + j) * 7, y = divisors[di];
                    int32_t vx = (q0 + i) * 1000003, vy = kv0 + j == 0 ? y : kv0 + j;
                    size_t k = (size_t)i * nk + j;
                    if (d[k] != (float)(x / y & 65535) || f[k] != (float)(x / y) || m[k] != (float)(x % y) || v[k] != (float)(vx / vy)) {
                        print_error("%d / %d: got %.9g %.9g, %d / %d: got %.9g\n", x, y,
                                    (double)d[k], (double)m[k], vx, vy, (double)v[k]);
                        fail();
                    }
                }
            free(in);
            free(d);
            free(m);
            free(v);
            free(f);
        }
    fg_mod_destroy(dm);
    fg_mod_destroy(fm);
    fg_mod_destroy(mm);
    fg_mod_destroy(vm);
}

/* A score_mod over a tile crossing chunk borders, in place (in == out). */
static float score_c(float s, int q, int kv) {
    int d = q - kv;
    return d > 0 ? s * 0.5f - (float)(d % 5) : (kv < 3 ? FBUF[kv] : s);
}

static void test_score_tiles(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *m = load(ctx, true, "    int d = q_idx - kv_idx;\n",
                     "d > 0 ? score * 0.5 - (float)(d % 5) : (kv_idx < 3 ? fbuf[kv_idx] : score)", NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    int nq = 300, nk = 301;
    size_t n = (size_t)nq * nk;
    float *in = malloc(n * sizeof *in), *io = malloc(n * sizeof *io), *out = malloc(n * sizeof *out);
    uint64_t seed = 42;
    for (size_t i = 0; i < n; i++) io[i] = in[i] = (float)(tu_rand_uniform(&seed) * 20.0 - 10.0);
    assert_int_equal(fg_mod_eval_score(ctx, m, bd, nb, 0, 0, 0, nq, 0, nk, in, out), FG_OK);
    assert_int_equal(fg_mod_eval_score(ctx, m, bd, nb, 0, 0, 0, nq, 0, nk, io, io), FG_OK);
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            size_t k = (size_t)i * nk + j;
            float want = score_c(in[k], i, j);
            if (!same_float(out[k], want) || !same_float(io[k], want)) {
                print_error("lane (%d, %d): want %.9g got %.9g / in place %.9g\n", i, j,
                            (double)want, (double)out[k], (double)io[k]);
                fail();
            }
        }
    free(in);
    free(io);
    free(out);
    fg_mod_destroy(m);
}

/* A mod without mask_mod masks nothing; without score_mod copies. */
static void test_absent_functions(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *mask_only = load(ctx, false, NULL, "q_idx >= kv_idx", NULL);
    fg_mod *score_only = load(ctx, true, NULL, "score * 2.0", NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    uint8_t mk[12];
    float in[12], out[12];
    for (int i = 0; i < 12; i++) in[i] = (float)i - 3.5f;
    assert_int_equal(fg_mod_eval_mask(ctx, score_only, bd, nb, 0, 0, 0, 3, 0, 4, mk), FG_OK);
    for (int i = 0; i < 12; i++) assert_int_equal(mk[i], 1);
    assert_int_equal(fg_mod_eval_score(ctx, mask_only, bd, nb, 0, 0, 0, 3, 0, 4, in, out), FG_OK);
    for (int i = 0; i < 12; i++) assert_true(same_float(out[i], in[i]));
    assert_int_equal(fg_mod_eval_score(ctx, score_only, bd, nb, 0, 0, 0, 3, 0, 4, in, out), FG_OK);
    for (int i = 0; i < 12; i++) assert_true(same_float(out[i], in[i] * 2.0f));
    fg_mod_destroy(mask_only);
    fg_mod_destroy(score_only);
}

/* and/or composition short-circuits exactly like && and ||. */
static void test_composition(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *small = load(ctx, false, NULL, "kv_idx < 4", NULL);
    fg_mod *large = load(ctx, false, NULL, "kv_idx >= 4", NULL);
    fg_mod *reads = load(ctx, false, NULL, "buf[kv_idx] >= 0", NULL);
    fg_mod *and_m = NULL, *or_m = NULL, *bad = NULL;
    assert_int_equal(fg_mod_and(ctx, small, reads, &and_m), FG_OK);
    assert_int_equal(fg_mod_or(ctx, large, reads, &or_m), FG_OK);
    assert_int_equal(fg_mod_and(ctx, reads, small, &bad), FG_OK);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    uint8_t out[3 * 10];
    assert_int_equal(fg_mod_eval_mask(ctx, and_m, bd, nb, 0, 0, 0, 3, 0, 10, out), FG_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 10; j++) assert_int_equal(out[i * 10 + j], j < 4 && BUF[j] >= 0);
    assert_int_equal(fg_mod_eval_mask(ctx, or_m, bd, nb, 0, 0, 0, 3, 0, 10, out), FG_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 10; j++) assert_int_equal(out[i * 10 + j], j >= 4 || BUF[j] >= 0);
    /* the other order reads out of bounds first */
    assert_int_equal(fg_mod_eval_mask(ctx, bad, bd, nb, 0, 0, 0, 3, 0, 10, out), FG_ERR_EVAL);
    assert_non_null(strstr(fg_errmsg(ctx), "q_idx=0, kv_idx=4"));
    fg_mod_destroy(small);
    fg_mod_destroy(large);
    fg_mod_destroy(reads);
    fg_mod_destroy(and_m);
    fg_mod_destroy(or_m);
    fg_mod_destroy(bad);
}

/* Deep trees and many locals: the evaluator's scratch grows with them and
 * its chunks shrink, the results do not change. */
static void check_score_tile(fg_ctx *ctx, const char *locals, const char *expr, int q_mul,
                             int kv_mul, int add) {
    fg_mod *m = load(ctx, true, locals, expr, NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    int nq = 97, nk = 301;
    float *in = calloc((size_t)nq * nk, sizeof *in), *out = malloc((size_t)nq * nk * sizeof *out);
    assert_int_equal(fg_mod_eval_score(ctx, m, bd, nb, 0, 0, 3, nq, 5, nk, in, out), FG_OK);
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++)
            assert_true(out[(size_t)i * nk + j] == (float)(q_mul * (3 + i) + kv_mul * (5 + j) + add));
    free(in);
    free(out);
    fg_mod_destroy(m);
}

static void test_deep_and_wide(void **state) {
    fg_ctx *ctx = *state;
    enum { DEPTH = 150, LOCALS = 60 };
    fgi_buf e = {0};
    /* left-deep: ((q_idx + 1) + 1) + ... */
    fgi_buf_puts(&e, "(float)(q_idx");
    for (int i = 0; i < DEPTH; i++) fgi_buf_puts(&e, " + 1");
    fgi_buf_puts(&e, ")");
    check_score_tile(ctx, NULL, e.data, 1, 0, DEPTH);
    fgi_buf_free(&e);
    /* right-deep: 2 * (1 + 2 * (1 + ... kv_idx)) */
    fgi_buf_puts(&e, "(float)(");
    for (int i = 0; i < 20; i++) fgi_buf_puts(&e, "2 * (1 + ");
    fgi_buf_puts(&e, "kv_idx");
    for (int i = 0; i < 20; i++) fgi_buf_puts(&e, ")");
    fgi_buf_puts(&e, ")");
    /* x -> 2 (1 + x) twenty times: 2^20 x + (2^21 - 2) */
    check_score_tile(ctx, NULL, e.data, 0, 1 << 20, (1 << 21) - 2);
    fgi_buf_free(&e);
    /* a chain of locals, each reading the one before */
    fgi_buf_puts(&e, "    int l0 = q_idx;\n");
    for (int i = 1; i < LOCALS; i++) fgi_buf_printf(&e, "    int l%d = l%d + kv_idx;\n", i, i - 1);
    char ret[32];
    snprintf(ret, sizeof ret, "(float)l%d", LOCALS - 1);
    check_score_tile(ctx, e.data, ret, 1, LOCALS - 1, 0);
    fgi_buf_free(&e);
}

/* ---- run-time errors ----------------------------------------------------- */

typedef struct err_row {
    bool score;
    const char *locals;   /* NULL: none */
    const char *expr;
    const char *at;       /* the offending token: first occurrence in locals+return */
    int q0, nq, kv0, nk;  /* the tile */
    const char *lane;     /* the first offending lane, as the message names it */
} err_row;

static void test_errors(void **state) {
    fg_ctx *ctx = *state;
    const err_row rows[] = {
        {false, NULL, "q_idx / kv_idx > 0", "/", 0, 4, 0, 3, "q_idx=0, kv_idx=0"},
        {false, NULL, "q_idx % kv_idx > 0", "%", 2, 4, 0, 3, "q_idx=2, kv_idx=0"},
        {false, NULL, "q_idx / (kv_idx - 2) > 0", "/", 0, 2, 0, 5, "q_idx=0, kv_idx=2"},
        {false, NULL, "(-2147483648 + q_idx) / -1 > 0", "/", 0, 2, 0, 2, "q_idx=0, kv_idx=0"},
        {false, NULL, "(-2147483648 + q_idx) % -1 == 0", "%", 0, 2, 0, 2, "q_idx=0, kv_idx=0"},
        {false, NULL, "kv_idx + (-2147483648 + q_idx) / (kv_idx - 1) > 0", "/", 0, 1, 1, 3,
         "q_idx=0, kv_idx=1"},
        {false, NULL, "1 << kv_idx == 0", "<<", 0, 1, 30, 3, "q_idx=0, kv_idx=32"},
        {false, NULL, "1 << (kv_idx - 1) == 0", "<<", 3, 1, 0, 3, "q_idx=3, kv_idx=0"},
        {false, NULL, "q_idx >> kv_idx == 0", ">>", 0, 1, 31, 2, "q_idx=0, kv_idx=32"},
        {false, NULL, "q_idx >> -kv_idx == 0", ">>", 0, 1, 0, 2, "q_idx=0, kv_idx=1"},
        {false, NULL, "buf[q_idx - 1] > 0", "buf", 0, 2, 0, 2, "q_idx=0, kv_idx=0"},
        {false, NULL, "buf[q_idx] > 0", "buf", 0, 6, 0, 2, "q_idx=4, kv_idx=0"},
        {false, NULL, "q_idx > 0 && fbuf[kv_idx] > 0.0", "fbuf", 0, 2, 0, 5, "q_idx=1, kv_idx=3"},
        {false, NULL, "q_idx == 299 && kv_idx == 298 ? buf[kv_idx] > 0 : true", "buf", 0, 300, 0, 300,
         "q_idx=299, kv_idx=298"},
        {false, NULL, "kv_idx == 0 || q_idx / (kv_idx - 3) > 0", "/", 0, 2, 0, 5, "q_idx=0, kv_idx=3"},
        {false, NULL, "kv_idx != 0 ? true : buf[q_idx + 3] == 0", "buf", 0, 3, 0, 2,
         "q_idx=1, kv_idx=0"},
        {false, NULL, "abs(q_idx / kv_idx) > 0", "/", 1, 1, 0, 1, "q_idx=1, kv_idx=0"},
        {false, NULL, "buf[buf[q_idx] + 5] > 0", "buf[buf", 0, 1, 0, 1, "q_idx=0, kv_idx=0"},
        /* errors in locals point into the local's initialiser */
        {false, "    int x = 10 / kv_idx;\n", "x > 0", "/", 0, 2, 0, 2, "q_idx=0, kv_idx=0"},
        {false, "    int s = buf[q_idx];\n", "kv_idx > 100 && s > 0", "buf", 3, 3, 0, 1,
         "q_idx=4, kv_idx=0"},
        /* and in score_mods */
        {true, NULL, "score / (float)(1 / kv_idx)", "/ kv", 0, 1, 0, 2, "q_idx=0, kv_idx=0"},
        {true, NULL, "score + fbuf[h]", "fbuf", 0, 1, 0, 1, "b=2, h=5, q_idx=0, kv_idx=0"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const err_row *r = &rows[i];
        size_t expr_at;
        fg_mod *m = load(ctx, r->score, r->locals, r->expr, &expr_at);
        /* the offending token's offset in the source */
        char *text = mod_text(r->score, r->locals, r->expr, NULL);
        const char *body = strstr(text, r->locals ? r->locals : r->expr);
        const char *tok = strstr(body, r->at);
        assert_non_null(tok);
        int64_t want_off = tok - text;
        free(text);
        fg_binding bd[4];
        size_t nb = bind_all(bd);
        size_t n = (size_t)r->nq * r->nk;
        void *out = malloc(n * sizeof(float));
        float *in = calloc(n, sizeof(float));
        fg_status st = r->score
            ? fg_mod_eval_score(ctx, m, bd, nb, ROW_B, ROW_H, r->q0, r->nq, r->kv0, r->nk, in, out)
            : fg_mod_eval_mask(ctx, m, bd, nb, ROW_B, ROW_H, r->q0, r->nq, r->kv0, r->nk, out);
        if (st != FG_ERR_EVAL || fg_error_offset(ctx) != want_off || !strstr(fg_errmsg(ctx), r->lane)) {
            print_error("row %zu: %s: want FG_ERR_EVAL at %lld naming '%s'; got %s at %lld: %s\n", i,
                        r->expr, (long long)want_off, r->lane, fg_status_string(st),
                        (long long)fg_error_offset(ctx), fg_errmsg(ctx));
            fail();
        }
        /* the diagnostic renders the line with a caret */
        assert_non_null(strstr(fg_error_diagnostic(ctx), "row.c:"));
        free(out);
        free(in);
        fg_mod_destroy(m);
    }
}

/* The messages name the operation. */
static void test_error_messages(void **state) {
    fg_ctx *ctx = *state;
    static const struct {
        const char *expr;
        const char *words;
    } rows[] = {
        {"q_idx / kv_idx > 0", "division by zero"},
        {"q_idx % kv_idx > 0", "modulo by zero"},
        {"(-2147483648 + kv_idx) / -1 > 0", "INT_MIN / -1"},
        {"(-2147483648 + kv_idx) % -1 > 0", "INT_MIN % -1"},
        {"q_idx << (kv_idx + 32) > 0", "shift count 32"},
        {"q_idx >> (kv_idx - 1) > 0", "shift count -1"},
        {"buf[kv_idx - 1] > 0", "index -1 out of bounds of buffer 'buf' (length 4)"},
        {"fbuf[kv_idx + 3] > 0.0", "index 3 out of bounds of buffer 'fbuf' (length 3)"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = load(ctx, false, NULL, rows[i].expr, NULL);
        fg_binding bd[4];
        size_t nb = bind_all(bd);
        uint8_t out;
        assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, 1, 0, 1, &out), FG_ERR_EVAL);
        if (!strstr(fg_errmsg(ctx), rows[i].words)) {
            print_error("%s: message '%s' lacks '%s'\n", rows[i].expr, fg_errmsg(ctx), rows[i].words);
            fail();
        }
        fg_mod_destroy(m);
    }
}

/* ---- bad calls ----------------------------------------------------------- */

static void test_bad_arguments(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *m = load(ctx, false, NULL, "buf[kv_idx] > 0", NULL);
    fg_mod *sm = load(ctx, true, NULL, "score", NULL);
    fg_binding bd[4];
    size_t nb = bind_all(bd);
    uint8_t out[4];
    float in[4] = {0}, fo[4];
    /* unbound buffer, unknown name, wrong kind */
    assert_int_equal(fg_mod_eval_mask(ctx, m, NULL, 0, 0, 0, 0, 1, 0, 1, out), FG_ERR_UNBOUND);
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, 1, 0, 0, 0, 1, 0, 1, out), FG_ERR_UNBOUND);
    fg_binding extra[3] = {bd[0], bd[1], fg_bind_int("nope", 1)};
    assert_int_equal(fg_mod_eval_mask(ctx, m, extra, 3, 0, 0, 0, 1, 0, 1, out), FG_ERR_UNBOUND);
    fg_binding wrong[2] = {fg_bind_int("buf", 1), bd[1]};
    assert_int_equal(fg_mod_eval_mask(ctx, m, wrong, 2, 0, 0, 0, 1, 0, 1, out), FG_ERR_UNBOUND);
    /* NULLs and bad sizes */
    assert_int_equal(fg_mod_eval_mask(NULL, m, bd, nb, 0, 0, 0, 1, 0, 1, out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, NULL, bd, nb, 0, 0, 0, 1, 0, 1, out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, 1, 0, 1, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, m, NULL, 2, 0, 0, 0, 1, 0, 1, out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, -1, 0, 1, out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, 1, 0, -5, out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, INT_MAX, 2, 0, 1, out),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_score(NULL, sm, bd, 0, 0, 0, 0, 1, 0, 1, in, fo), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_score(ctx, NULL, bd, 0, 0, 0, 0, 1, 0, 1, in, fo), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_score(ctx, sm, bd, nb, 0, 0, 0, 1, 0, 1, NULL, fo), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_eval_score(ctx, sm, bd, nb, 0, 0, 0, 1, 0, 1, in, NULL), FG_ERR_INVALID_ARGUMENT);
    /* an empty tile is nothing to do, even without an output */
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, 0, 0, 5, NULL), FG_OK);
    assert_int_equal(fg_mod_eval_score(ctx, sm, bd, nb, 0, 0, 0, 3, 0, 0, NULL, NULL), FG_OK);
    /* a buffer of length 0 is bound but every read is out of bounds */
    fg_binding empty[2] = {fg_bind_int_buffer("buf", NULL, 0), bd[1]};
    assert_int_equal(fg_mod_eval_mask(ctx, m, empty, 2, 0, 0, 0, 1, 0, 1, out), FG_ERR_EVAL);
    /* success clears the last error */
    assert_int_equal(fg_mod_eval_mask(ctx, m, bd, nb, 0, 0, 0, 2, 0, 2, out), FG_OK);
    assert_int_equal(fg_errcode(ctx), FG_OK);
    fg_mod_destroy(m);
    fg_mod_destroy(sm);
}

/* The internal entry point with values filled by hand. */
static void test_internal_values(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *m = load(ctx, false, NULL, "q_idx - kv_idx <= N && buf[kv_idx % 4] != 0", NULL);
    fgi_value vals[4];
    memset(vals, 0, sizeof vals);
    int ib = fgi_mod_find_param(m, "buf"), ifb = fgi_mod_find_param(m, "fbuf"),
        in_ = fgi_mod_find_param(m, "N");
    assert_true(ib >= 0 && ifb >= 0 && in_ >= 0);
    vals[ib].data = BUF;
    vals[ib].length = 4;
    vals[ifb].data = FBUF;
    vals[ifb].length = 3;
    vals[in_].scalar.i = 2;
    uint8_t out[6 * 6];
    assert_int_equal(fgi_eval_mask(ctx, m, vals, 0, 0, 0, 6, 0, 6, out), FG_OK);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) assert_int_equal(out[i * 6 + j], i - j <= 2 && BUF[j % 4] != 0);
    fg_mod_destroy(m);
}

static int setup(void **state) {
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) return -1;
    *state = ctx;
    return 0;
}

static int teardown(void **state) {
    fg_ctx_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int_arithmetic),  cmocka_unit_test(test_float_arithmetic),
        cmocka_unit_test(test_bool_logic),      cmocka_unit_test(test_locals),
        cmocka_unit_test(test_tiles),           cmocka_unit_test(test_score_tiles),
        cmocka_unit_test(test_absent_functions), cmocka_unit_test(test_composition),
        cmocka_unit_test(test_deep_and_wide),   cmocka_unit_test(test_division_tiles),
        cmocka_unit_test(test_errors),          cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_bad_arguments),   cmocka_unit_test(test_internal_values),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
