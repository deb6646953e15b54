/* test_parse.c -- the mod language front end: what it accepts, what it
 * refuses (status and exact byte offset for every error class), the types
 * the checker gives, composition, limits, and NULL arguments.
 *
 * In the bad-snippet table an '@' marks where the error must be reported;
 * it is removed before the text is parsed ('@' never occurs in a mod). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define HEAD "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
#define MASK(body) HEAD "{ " body "}"
#define SHEAD "float score_mod(float score, int b, int h, int q_idx, int kv_idx) "
#define SCORE(body) SHEAD "{ " body "}"

typedef struct bad_row {
    const char *src; /* with one '@' at the expected error offset */
    fg_status status;
} bad_row;

static const bad_row bad_rows[] = {
    /* lexer */
    {"@/* never closed\n" MASK("return true; "), FG_ERR_SYNTAX},
    {MASK("return @\"x\" == 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return @'a' == 97; "), FG_ERR_UNSUPPORTED},
    {"@#define N 3\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"@#include <stdio.h>\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"  @#  pragma once\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx @# kv_idx; "), FG_ERR_SYNTAX},
    {MASK("return q_idx < @4294967296; "), FG_ERR_SYNTAX},
    {MASK("return q_idx < @2147483648; "), FG_ERR_SYNTAX},
    {MASK("return q_idx < @017; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx < 10@u; "), FG_ERR_SYNTAX},
    {SCORE("return score * @1e39f; "), FG_ERR_SYNTAX},
    {SCORE("return score * @0x1p3; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx @$ kv_idx; "), FG_ERR_SYNTAX},
    {"// continued @\\\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    /* syntax */
    {MASK("return q_idx >= kv_idx @"), FG_ERR_SYNTAX},
    {MASK("return (q_idx >= kv_idx@; "), FG_ERR_SYNTAX},
    {MASK("return @<< 2; "), FG_ERR_SYNTAX},
    {MASK("return@; "), FG_ERR_SYNTAX},
    {MASK("int x = 1; @"), FG_ERR_SYNTAX},
    {MASK("int x@; return true; "), FG_ERR_SYNTAX},
    {MASK("return q_idx@, kv_idx; "), FG_ERR_SYNTAX},
    {MASK("return true; ") " @}", FG_ERR_SYNTAX},
    {MASK("return true; ") " int x = 1; @}", FG_ERR_SYNTAX},
    {MASK("return true; ") " @return 0; }", FG_ERR_SYNTAX},
    {"@mask_mod(int b, int h, int q_idx, int kv_idx) { return true; }", FG_ERR_SYNTAX},
    {HEAD "@;", FG_ERR_SYNTAX},
    {"int W@;\n" MASK("return true; "), FG_ERR_SYNTAX},
    {MASK("return q_idx > 0 ? 1 @; "), FG_ERR_SYNTAX},
    {HEAD "{ return true; @", FG_ERR_SYNTAX},
    /* outside the subset */
    {MASK("return true; @return false; "), FG_ERR_UNSUPPORTED},
    {MASK("@while (1) { } return true; "), FG_ERR_UNSUPPORTED},
    {MASK("@for (;;) { } return true; "), FG_ERR_UNSUPPORTED},
    {MASK("@if (q_idx) return true; return false; "), FG_ERR_UNSUPPORTED},
    {MASK("@goto out; return true; "), FG_ERR_UNSUPPORTED},
    {MASK("q_idx @= 3; return true; "), FG_ERR_UNSUPPORTED},
    {MASK("int x = 1; x @+= 2; return x > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx@++ > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("@++q_idx; return true; "), FG_ERR_UNSUPPORTED},
    {MASK("return (q_idx @= kv_idx); "), FG_ERR_UNSUPPORTED},
    {"const int *doc;\n" MASK("doc[0] @= 1; return true; "), FG_ERR_UNSUPPORTED},
    {"const int *doc;\n" MASK("return @*doc == 0; "), FG_ERR_UNSUPPORTED},
    {"const int *doc;\n" MASK("return @doc + 1 == 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return @&q_idx != 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx@.x > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return q_idx@->x > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return @sizeof(int) > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("@__asm__ volatile; return true; "), FG_ERR_UNSUPPORTED},
    {MASK("return @printf(q_idx) > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return @mask_mod(b, h, q_idx, kv_idx); "), FG_ERR_UNSUPPORTED},
    {"@struct s { int a; };\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"@typedef int idx;\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"@static int W = 3;\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"int @helper(int x) { return x; }\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"int @*doc;\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"int W = @(3);\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"int W@[4];\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {"const float *s @= 0;\n" MASK("return true; "), FG_ERR_UNSUPPORTED},
    {MASK("@{ } return true; "), FG_ERR_UNSUPPORTED},
    {MASK("@double x = 1; return true; "), FG_ERR_UNSUPPORTED},
    {MASK("return (int@*)q_idx > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("return (@unsigned)q_idx > 0; "), FG_ERR_UNSUPPORTED},
    {MASK("@q_idx; return true; "), FG_ERR_UNSUPPORTED},
    /* signatures */
    {"@int mask_mod(int b, int h, int q_idx, int kv_idx) { return 1; }", FG_ERR_SIGNATURE},
    {"@bool score_mod(float s, int b, int h, int q, int k) { return true; }", FG_ERR_SIGNATURE},
    {"bool mask_mod(int b, int h, int q_idx@) { return true; }", FG_ERR_SIGNATURE},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx@, int x) { return true; }",
     FG_ERR_SIGNATURE},
    {"bool mask_mod(int b, int h, @float q_idx, int kv_idx) { return true; }", FG_ERR_SIGNATURE},
    {"float score_mod(@int score, int b, int h, int q_idx, int kv_idx) { return 0; }",
     FG_ERR_SIGNATURE},
    {"bool mask_mod(@void) { return true; }", FG_ERR_SIGNATURE},
    {"bool mask_mod(int b, int h, int q_idx, int @) { return true; }", FG_ERR_SIGNATURE},
    {"const @bool mask_mod(int b, int h, int q_idx, int kv_idx) { return true; }",
     FG_ERR_SIGNATURE},
    {MASK("return true; ") "\nbool @mask_mod(int b, int h, int q, int k) { return false; }",
     FG_ERR_SIGNATURE},
    {SCORE("return score; ") "\nfloat @score_mod(float s, int b, int h, int q, int k) { return s; }",
     FG_ERR_SIGNATURE},
    {"int W = 3;\n@", FG_ERR_SIGNATURE},
    {"/* only a comment */@", FG_ERR_SIGNATURE},
    /* names */
    {MASK("return q_idx >= @kv_ix; "), FG_ERR_NAME},
    {MASK("return @score > 0; "), FG_ERR_NAME},
    {"int W = 1;\nfloat @W = 2;\n" MASK("return true; "), FG_ERR_NAME},
    {MASK("int x = 1; int @x = 2; return x > 0; "), FG_ERR_NAME},
    {MASK("int @q_idx = 1; return true; "), FG_ERR_NAME},
    {"int W = 1;\n" MASK("int @W = 2; return true; "), FG_ERR_NAME},
    {"int W = 1;\n" MASK("W @= 2; return true; "), FG_ERR_UNSUPPORTED},
    {"int @fg_x = 1;\n" MASK("return true; "), FG_ERR_NAME},
    {"int @FG_X = 1;\n" MASK("return true; "), FG_ERR_NAME},
    {MASK("int @__x = 1; return true; "), FG_ERR_NAME},
    {MASK("int @exp = 1; return true; "), FG_ERR_NAME},
    {MASK("int a = @c; int c = 1; return a > 0; "), FG_ERR_NAME},
    {MASK("int x = @x + 1; return x > 0; "), FG_ERR_NAME},
    {MASK("return q_idx < @W; ") "\nint W = 3;", FG_ERR_NAME},
    {"bool mask_mod(int b, int @b, int q, int k) { return true; }", FG_ERR_NAME},
    {"int W = 1;\nbool mask_mod(int b, int h, int @W, int kv_idx) { return true; }", FG_ERR_NAME},
    {MASK("int @class = 1; return true; "), FG_ERR_NAME},
    {"int @INFINITY = 1;\n" MASK("return true; "), FG_ERR_NAME},
    /* types */
    {SCORE("return score @% 2; "), FG_ERR_TYPE},
    {SCORE("return (float)(q_idx @& 1.0f); "), FG_ERR_TYPE},
    {MASK("return (q_idx @<< 1.5f) > 0; "), FG_ERR_TYPE},
    {SCORE("return @~score; "), FG_ERR_TYPE},
    {"const float *s;\n" SCORE("return s[@score]; "), FG_ERR_TYPE},
    {MASK("return @q_idx[0] > 0; "), FG_ERR_TYPE},
    {"const int *doc;\n" MASK("return @doc == 0; "), FG_ERR_TYPE},
    {"const int *d;\n" MASK("return d[0]@[1] > 0; "), FG_ERR_TYPE},
    {MASK("return @1.5f; "), FG_ERR_TYPE},
    {"int W = @1.5;\n" MASK("return true; "), FG_ERR_TYPE},
    {"@bool flag = true;\n" MASK("return true; "), FG_ERR_TYPE},
    {"const @bool *flags;\n" MASK("return true; "), FG_ERR_TYPE},
    /* arity */
    {MASK("return @min(1, 2, 3) > 0; "), FG_ERR_ARITY},
    {SCORE("return @exp(); "), FG_ERR_ARITY},
    {SCORE("return @clamp(score, 1.0f); "), FG_ERR_ARITY},
    {SCORE("return @powf(score); "), FG_ERR_ARITY},
};

static void test_bad_snippets(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    size_t n = sizeof bad_rows / sizeof bad_rows[0];
    assert_true(n >= 45);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        const char *marked = bad_rows[i].src;
        const char *at = strchr(marked, '@');
        assert_non_null(at);
        assert_null(strchr(at + 1, '@'));
        size_t off = (size_t)(at - marked), len = strlen(marked);
        char *src = malloc(len);
        memcpy(src, marked, off);
        memcpy(src + off, at + 1, len - off); /* includes the NUL */
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_source(ctx, "bad.c", src, (size_t)-1, &m);
        if (st != bad_rows[i].status || fg_error_offset(ctx) != (int64_t)off || m) {
            print_error("row %zu: %s\n  want %s at %zu, got %s at %lld: %s\n", i, marked,
                        fg_status_string(bad_rows[i].status), off, fg_status_string(st),
                        (long long)fg_error_offset(ctx), fg_errmsg(ctx));
            failures++;
        }
        assert_true(strlen(fg_errmsg(ctx)) > 0);
        fg_mod_destroy(m);
        free(src);
    }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* Messages name the token, Lua style. */
static void test_messages(void **state) {
    (void)state;
    static const struct {
        const char *src, *needle;
    } rows[] = {
        {MASK("return << 2; "), "unexpected symbol near '<<'"},
        {MASK("return q_idx >= kv_ix; "), "unknown name 'kv_ix' (did you mean 'kv_idx'?)"},
        {SCORE("return tanhh(score); "), "did you mean 'tanh'?"},
        {MASK("for (;;) {} return true; "), "'for' is not supported"},
        {MASK("return score > 0; "), "only available in score_mod"},
        {MASK("return min(1) > 0; "), "'min' takes 2 arguments, not 1"},
        {MASK("return q_idx++ > 0; "), "'++'"},
        {"#define X 1\n" MASK("return true; "), "'#define'"},
        {SCORE("return score % 2; "), "use fmod"},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = NULL;
        assert_int_not_equal(fg_mod_from_source(ctx, NULL, rows[i].src, (size_t)-1, &m), FG_OK);
        if (!strstr(fg_errmsg(ctx), rows[i].needle)) {
            print_error("row %zu: message '%s' lacks '%s'\n", i, fg_errmsg(ctx), rows[i].needle);
            fail();
        }
    }
    fg_ctx_destroy(ctx);
}

static void test_caret_diagnostic(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    const char *src = "/* causal */\n" HEAD "{\n    return q_idx >= kv_ix;\n}\n";
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "mods/causal.c", src, (size_t)-1, &m), FG_ERR_NAME);
    const char *d = fg_error_diagnostic(ctx);
    assert_non_null(strstr(d, "mods/causal.c:3:21: error: unknown name 'kv_ix' (did you mean "
                               "'kv_idx'?)\n"));
    assert_non_null(strstr(d, "    return q_idx >= kv_ix;\n"));
    assert_non_null(strstr(d, "\n                        ^~~~~\n"));
    fg_ctx_destroy(ctx);
}

/* ---- good snippets ------------------------------------------------------ */

static const char *const good_sources[] = {
    "#include <flexgen/mod.h>\n" MASK("return q_idx >= kv_idx; "),
    "  #  include   <flexgen/mod.h>   // the header\n" MASK("return true; "),
    "/* sliding window */\nint WINDOW = 1024;\n" MASK("return q_idx >= kv_idx && q_idx - "
                                                       "kv_idx <= WINDOW; "),
    "const int W = -3;\nfloat T = -1.5e-3f;\nfloat U = .5;\nfloat V = 7;\nfloat I = -INFINITY;\n"
        MASK("return q_idx - kv_idx > W; "),
    "const float *slopes;\n" SCORE("return score + slopes[h] * (float)(kv_idx - q_idx); ") "\n"
        MASK("return q_idx >= kv_idx; "),
    "const int *doc;\nconst int * const offsets;\n"
        MASK("const int d = doc[q_idx]; bool same = d == doc[kv_idx]; "
             "return same && offsets[d] <= kv_idx; "),
    SCORE("return q_idx >= kv_idx ? score : -INFINITY; "),
    SCORE("float cap = 30.0f; return cap * tanhf(score / cap); "),
    SCORE("return score + 1 - 2 * 3 / 4 + (float)(5 % 3); "),
    MASK("return (q_idx << 1 >> 1 & 7 | 8 ^ 3) != ~kv_idx; "),
    MASK("return !(q_idx < kv_idx) || (q_idx <= 3 && kv_idx > 4) || q_idx == 0 || b != h; "),
    MASK("return (bool)q_idx && (int)1.5f == 1 && (float)h >= 0.0f; "),
    SCORE("return abs(score) + min(q_idx, kv_idx) + max(1.0f, score) + clamp(score, -1, 1); "),
    SCORE("return exp(score) + exp2(score) + log(1.0f) + log2(2.0f) + sqrt(4.0f) + rsqrt(4.0f)"
          " + tanh(score) + sigmoid(score) + floor(score) + ceil(score) + pow(score, 2)"
          " + sin(score) + cos(score) + round(score) + trunc(score) + fmod(score, 3); "),
    SCORE("return expf(score) + fabsf(score) + fminf(score, 1) + fmaxf(score, 1) + sqrtf(4)"
          " + exp2f(1) + logf(2) + floorf(score) + ceilf(score) + powf(score, 2); "),
    MASK("int a = 0x7fffffff; int m = -2147483648; return a > m && 0xFF == 255; "),
    SCORE("return true ? NAN : INFINITY; "),
    MASK("return q_idx > 0 ? kv_idx > 0 : q_idx < 0 ? true : false; "),
    "bool mask_mod(int batch, int head, int q, int kv)\n{\n  return q >= kv;\n}\n",
    "\xEF\xBB\xBF#include <flexgen/mod.h>\r\n" MASK("return true; "),
    "float score_mod(float s, int bb, int hh, int qq, int kk) { return s * 2; }",
    MASK("return q_idx >= kv_idx; ") "\r\n// trailing comment\r\n",
    MASK("const float x = 1e-3; bool y = x; int z = y + y; return z; "),
};

static void test_good_snippets(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof good_sources / sizeof good_sources[0]; i++) {
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_source(ctx, "good.c", good_sources[i], (size_t)-1, &m);
        if (st != FG_OK) {
            print_error("row %zu: %s\n%s", i, good_sources[i], fg_error_diagnostic(ctx));
            fail();
        }
        assert_true(fg_mod_has_mask(m) || fg_mod_has_score(m));
        assert_true(strlen(fg_mod_canonical(m)) > 0);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The checker's typing, seen through the canonical text of the expression
 * form: implicit conversions appear as casts, casts of literals are folded. */
static void test_types(void **state) {
    (void)state;
    static const struct {
        fg_mod_kind kind;
        const char *expr, *canonical;
    } rows[] = {
        {FG_MASK_MOD, "q_idx >= kv_idx", "q_idx >= kv_idx"},
        {FG_SCORE_MOD, "score + 1", "score + 1.0f"},
        {FG_SCORE_MOD, "score + q_idx", "score + (float)q_idx"},
        {FG_SCORE_MOD, "q_idx / 2", "(float)(q_idx / 2)"},
        {FG_SCORE_MOD, "q_idx / 2.0f", "(float)q_idx / 2.0f"},
        {FG_MASK_MOD, "q_idx & 1", "(bool)(q_idx & 1)"},
        {FG_MASK_MOD, "!q_idx", "!(bool)q_idx"},
        {FG_MASK_MOD, "true + 1 > 1", "1 + 1 > 1"},
        {FG_MASK_MOD, "(int)2.9f == 2", "2 == 2"},
        {FG_MASK_MOD, "(int)q_idx == (int)kv_idx", "q_idx == kv_idx"},
        {FG_MASK_MOD, "(q_idx > 0) == (kv_idx > 0)", "(q_idx > 0) == (kv_idx > 0)"},
        {FG_MASK_MOD, "(q_idx > 0) == 1", "(int)(q_idx > 0) == 1"},
        {FG_MASK_MOD, "min(q_idx, 2.5f) > 1", "min((float)q_idx, 2.5f) > 1.0f"},
        {FG_MASK_MOD, "fminf(q_idx, kv_idx) > 0", "min((float)q_idx, (float)kv_idx) > 0.0f"},
        {FG_MASK_MOD, "abs(q_idx - kv_idx) <= 3", "abs(q_idx - kv_idx) <= 3"},
        {FG_SCORE_MOD, "expf(q_idx)", "exp((float)q_idx)"},
        {FG_SCORE_MOD, "-(-score)", "- -score"},
        {FG_SCORE_MOD, "+score * -2", "score * -2.0f"},
        {FG_SCORE_MOD, "q_idx > kv_idx ? 1 : score", "q_idx > kv_idx ? 1.0f : score"},
        {FG_MASK_MOD, "q_idx ? kv_idx : h", "(bool)((bool)q_idx ? kv_idx : h)"},
        {FG_MASK_MOD, "(q_idx - kv_idx) * 2 < (h + 1) % 3", "(q_idx - kv_idx) * 2 < (h + 1) % 3"},
        {FG_MASK_MOD, "q_idx - (kv_idx - 1) > 0", "q_idx - (kv_idx - 1) > 0"},
        {FG_MASK_MOD, "-2147483648 < q_idx", "(-2147483647 - 1) < q_idx"},
        {FG_SCORE_MOD, "(float)(bool)2", "1.0f"},
        {FG_SCORE_MOD, "(float)(int)NAN + (int)1e10f", "0.0f + 2147483648.0f"},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_expr(ctx, rows[i].kind, rows[i].expr, NULL, 0, &m);
        if (st != FG_OK) {
            print_error("row %zu: %s: %s\n", i, rows[i].expr, fg_errmsg(ctx));
            fail();
        }
        const fgi_func *fn = rows[i].kind == FG_MASK_MOD ? m->mask->func : m->score;
        assert_int_equal(fn->ret->type, rows[i].kind == FG_MASK_MOD ? FGI_T_BOOL : FGI_T_FLOAT);
        char *text = fgi_expr_canonical(m, fn, fn->ret);
        bool same = strcmp(text, rows[i].canonical) == 0;
        if (!same)
            print_error("row %zu: %s: got '%s', want '%s'\n", i, rows[i].expr, text,
                        rows[i].canonical);
        free(text);
        assert_true(same);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* Every node of a checked tree obeys the contract in internal.h. */
static void check_contract(const fgi_expr *e) {
    assert_int_not_equal(e->type, FGI_T_NONE);
    assert_int_not_equal(e->kind, FGI_E_NAME);
    switch (e->kind) {
    case FGI_E_BINARY:
        if (e->op >= FGI_OP_LT && e->op <= FGI_OP_NE) {
            assert_int_equal(e->a->type, e->b->type);
            assert_int_equal(e->type, FGI_T_BOOL);
        } else if (e->op == FGI_OP_LAND || e->op == FGI_OP_LOR) {
            assert_int_equal(e->a->type, FGI_T_BOOL);
            assert_int_equal(e->b->type, FGI_T_BOOL);
        } else {
            assert_int_equal(e->a->type, e->type);
            assert_int_equal(e->b->type, e->type);
            assert_int_not_equal(e->type, FGI_T_BOOL);
            if (e->op >= FGI_OP_MOD && e->op <= FGI_OP_BXOR) assert_int_equal(e->type, FGI_T_INT);
        }
        check_contract(e->a);
        check_contract(e->b);
        break;
    case FGI_E_UNARY:
        assert_int_not_equal(e->op, FGI_OP_PLUS);
        if (e->op == FGI_OP_NOT) assert_int_equal(e->a->type, FGI_T_BOOL);
        else assert_int_equal(e->a->type, e->type);
        check_contract(e->a);
        break;
    case FGI_E_COND:
        assert_int_equal(e->a->type, FGI_T_BOOL);
        assert_int_equal(e->b->type, e->type);
        assert_int_equal(e->c->type, e->type);
        check_contract(e->a);
        check_contract(e->b);
        check_contract(e->c);
        break;
    case FGI_E_CAST:
        assert_int_not_equal(e->a->type, e->type);
        check_contract(e->a);
        break;
    case FGI_E_INDEX:
        assert_null(e->b);
        assert_int_equal(e->a->type, FGI_T_INT);
        check_contract(e->a);
        break;
    case FGI_E_CALL:
        assert_true(e->op >= 0 && e->op < FGI_FN_COUNT);
        for (int i = 0; i < e->nargs; i++) {
            if (e->op <= FGI_FN_CLAMP) assert_int_equal(e->args[i]->type, e->type);
            else assert_int_equal(e->args[i]->type, FGI_T_FLOAT);
            check_contract(e->args[i]);
        }
        break;
    default:
        break;
    }
}

static void test_contract(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof good_sources / sizeof good_sources[0]; i++) {
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "good.c", good_sources[i], (size_t)-1, &m),
                         FG_OK);
        const fgi_func *fns[2] = {m->mask ? m->mask->func : NULL, m->score};
        for (int k = 0; k < 2; k++) {
            if (!fns[k]) continue;
            for (int l = 0; l < fns[k]->nlocals; l++) {
                assert_int_equal(fns[k]->locals[l].init->type, fns[k]->locals[l].type);
                check_contract(fns[k]->locals[l].init);
            }
            check_contract(fns[k]->ret);
        }
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

static void test_resolution(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    const char *src = "int W = 4;\nconst float *slopes;\n"
                      "float score_mod(float s, int bb, int hh, int q, int k) {\n"
                      "    float x = slopes[hh];\n    return s + x * W;\n}\n";
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "alibi.c", src, (size_t)-1, &m), FG_OK);
    assert_string_equal(fg_mod_name(m), "alibi");
    const fgi_func *fn = m->score;
    assert_string_equal(fn->arg_names[FGI_ARG_SCORE], "s");
    assert_string_equal(fn->arg_names[FGI_ARG_B], "bb");
    assert_string_equal(fn->arg_names[FGI_ARG_KV_IDX], "k");
    assert_int_equal(fn->nlocals, 1);
    const fgi_expr *init = fn->locals[0].init;
    assert_int_equal(init->kind, FGI_E_INDEX);
    assert_int_equal(init->index, 1);
    assert_int_equal(init->type, FGI_T_FLOAT);
    assert_int_equal(init->a->kind, FGI_E_ARG);
    assert_int_equal(init->a->op, FGI_ARG_H);
    assert_int_equal(init->offset, (int)(strstr(src, "slopes[") - src));
    const fgi_expr *r = fn->ret; /* s + x * (float)W */
    assert_int_equal(r->kind, FGI_E_BINARY);
    assert_int_equal(r->a->kind, FGI_E_ARG);
    assert_int_equal(r->a->op, FGI_ARG_SCORE);
    assert_int_equal(r->b->b->kind, FGI_E_CAST);
    assert_int_equal(r->b->b->a->kind, FGI_E_PARAM);
    assert_int_equal(r->b->b->a->index, 0);
    assert_int_equal(fn->ret_offset, (int)(strstr(src, "return") - src));
    assert_int_equal(fn->offset, (int)(strstr(src, "score_mod") - src));
    assert_int_equal(m->params[0].offset, (int)(strstr(src, "W =") - src));

    assert_int_equal(fg_mod_param_count(m), 2);
    fg_param_info info;
    assert_int_equal(fg_mod_param(m, 0, &info), FG_OK);
    assert_string_equal(info.name, "W");
    assert_int_equal(info.kind, FG_PARAM_SCALAR);
    assert_int_equal(info.type, FG_TYPE_INT);
    assert_true(info.default_value == 4.0);
    assert_int_equal(fg_mod_param(m, 1, &info), FG_OK);
    assert_string_equal(info.name, "slopes");
    assert_int_equal(info.kind, FG_PARAM_BUFFER);
    assert_int_equal(info.type, FG_TYPE_FLOAT);
    assert_int_equal(fg_mod_param(m, 2, &info), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fgi_mod_find_param(m, "slopes"), 1);
    assert_int_equal(fgi_mod_find_param(m, "nope"), -1);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* The mod keeps its own copy of the text: diagnostics work after the
 * caller's buffer is gone. */
static void test_source_is_copied(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    char *text = strdup(MASK("return q_idx >= kv_idx; "));
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "dir/x.y.c", text, strlen(text), &m), FG_OK);
    memset(text, 'x', strlen(text));
    free(text);
    assert_non_null(strstr(m->mask->func->src, "return q_idx"));
    assert_string_equal(m->mask->func->filename, "dir/x.y.c");
    assert_string_equal(fg_mod_name(m), "x.y");
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

static void test_files(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_file(ctx, "/nonexistent/dir/causal.c", &m), FG_ERR_IO);
    assert_null(m);
    assert_non_null(strstr(fg_errmsg(ctx), "No such file"));
    assert_int_equal(fg_mod_from_file(ctx, "/", &m), FG_ERR_IO);
    char path[] = "/tmp/flexgen_test_parse_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("int W = 2;\n" MASK("return q_idx - kv_idx < W; "), f);
    fclose(f);
    assert_int_equal(fg_mod_from_file(ctx, path, &m), FG_OK);
    assert_true(fg_mod_has_mask(m));
    assert_false(fg_mod_has_score(m));
    fg_mod_destroy(m);
    /* an error in a file names the file */
    f = fopen(path, "w");
    fputs(MASK("return q_idx >= kv_ix; "), f);
    fclose(f);
    assert_int_equal(fg_mod_from_file(ctx, path, &m), FG_ERR_NAME);
    assert_non_null(strstr(fg_error_diagnostic(ctx), path));
    /* a file longer than the source limit is refused without reading it all */
    f = fopen(path, "w");
    for (int i = 0; i < 70000; i++) fputc(' ', f);
    fputs(MASK("return true; "), f);
    fclose(f);
    assert_int_equal(fg_mod_from_file(ctx, path, &m), FG_ERR_LIMIT);
    assert_null(m);
    remove(path);
    fg_ctx_destroy(ctx);
}

/* ---- the expression form and composition -------------------------------- */

static void test_expr_form(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_param_decl params[] = {
        {"WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 256},
        {"doc", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"scale", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.5},
    };
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD,
                                      "doc[q_idx] == doc[kv_idx] && q_idx - kv_idx <= WINDOW",
                                      params, 3, &m),
                     FG_OK);
    assert_string_equal(fg_mod_name(m), "expr");
    assert_int_equal(fg_mod_param_count(m), 3);
    fg_param_info info;
    assert_int_equal(fg_mod_param(m, 2, &info), FG_OK);
    assert_true(info.default_value == 0.5);
    fg_mod_destroy(m);
    assert_int_equal(fg_mod_from_expr(ctx, FG_SCORE_MOD, "score * scale", params, 3, &m), FG_OK);
    fg_mod_destroy(m);

    static const struct {
        fg_mod_kind kind;
        const char *expr;
        fg_status status;
        int offset;
    } bad[] = {
        {FG_MASK_MOD, "q_idx >= kv_ix", FG_ERR_NAME, 9},
        {FG_MASK_MOD, "score > 0", FG_ERR_NAME, 0},
        {FG_MASK_MOD, "q_idx >= kv_idx;", FG_ERR_SYNTAX, 15},
        {FG_MASK_MOD, "q_idx >= kv_idx) || true", FG_ERR_SYNTAX, 15},
        {FG_MASK_MOD, "", FG_ERR_SYNTAX, 0},
        {FG_MASK_MOD, "scale", FG_ERR_TYPE, 0},
        {FG_SCORE_MOD, "score % 2", FG_ERR_TYPE, 6},
        {FG_MASK_MOD, "q_idx = 1", FG_ERR_UNSUPPORTED, 6},
        {FG_MASK_MOD, "q_idx; } int x = 3; bool y() { return 1", FG_ERR_SYNTAX, 5},
        {FG_MASK_MOD, "doc", FG_ERR_TYPE, 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fg_status st = fg_mod_from_expr(ctx, bad[i].kind, bad[i].expr, params, 3, &m);
        if (st != bad[i].status || fg_error_offset(ctx) != bad[i].offset) {
            print_error("row %zu: %s: got %s at %lld (%s)\n", i, bad[i].expr,
                        fg_status_string(st), (long long)fg_error_offset(ctx), fg_errmsg(ctx));
            fail();
        }
        assert_null(m);
    }

    /* parameter declarations through the API are checked like the file's */
    static const struct {
        fg_param_decl decl;
        fg_status status;
    } bad_decls[] = {
        {{NULL, FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_INVALID_ARGUMENT},
        {{"1x", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_INVALID_ARGUMENT},
        {{"a b", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_INVALID_ARGUMENT},
        {{"W", (fg_param_kind)7, FG_TYPE_INT, 0}, FG_ERR_INVALID_ARGUMENT},
        {{"W", FG_PARAM_SCALAR, FG_TYPE_BOOL, 0}, FG_ERR_INVALID_ARGUMENT},
        {{"W", FG_PARAM_SCALAR, FG_TYPE_INT, 1.5}, FG_ERR_INVALID_ARGUMENT},
        {{"W", FG_PARAM_SCALAR, FG_TYPE_INT, 1e12}, FG_ERR_INVALID_ARGUMENT},
        {{"fg_w", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_NAME},
        {{"for", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_NAME},
        {{"int", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_NAME},
        {{"q_idx", FG_PARAM_SCALAR, FG_TYPE_INT, 0}, FG_ERR_NAME},
    };
    for (size_t i = 0; i < sizeof bad_decls / sizeof bad_decls[0]; i++) {
        fg_status st = fg_mod_from_expr(ctx, FG_MASK_MOD, "true", &bad_decls[i].decl, 1, &m);
        if (st != bad_decls[i].status) {
            print_error("decl row %zu: got %s (%s)\n", i, fg_status_string(st), fg_errmsg(ctx));
            fail();
        }
        assert_null(m);
    }
    fg_param_decl dup[] = {{"W", FG_PARAM_SCALAR, FG_TYPE_INT, 0},
                           {"W", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0}};
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, "true", dup, 2, &m), FG_ERR_NAME);
    fg_ctx_destroy(ctx);
}

static fg_mod *parse_ok(fg_ctx *ctx, const char *src) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "part.c", src, (size_t)-1, &m);
    if (st != FG_OK) {
        print_error("%s", fg_error_diagnostic(ctx));
        fail();
    }
    return m;
}

static void test_composition(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *causal = parse_ok(ctx, MASK("return q_idx >= kv_idx; "));
    fg_mod *window = parse_ok(ctx, "const int *doc;\nint W = 8;\n"
                                   MASK("int d = q_idx - kv_idx; return d <= W && doc[d] > 0; "));
    fg_mod *window2 = parse_ok(ctx, "int W = 99;\nconst int *doc;\nint V = 1;\n"
                                    MASK("return q_idx - kv_idx <= W + V + doc[0]; "));
    fg_mod *clash = parse_ok(ctx, "float W = 8;\n" MASK("return q_idx < W; "));
    fg_mod *clash2 = parse_ok(ctx, "const int *W;\n" MASK("return W[q_idx] > 0; "));
    fg_mod *score = parse_ok(ctx, "float CAP = 20;\n" SCORE("return CAP * tanh(score / CAP); "));
    fg_mod *both = parse_ok(ctx, MASK("return true; ") "\n" SCORE("return score; "));

    fg_mod *a = NULL, *o = NULL, *c = NULL, *x = NULL;
    assert_int_equal(fg_mod_and(ctx, causal, window, &a), FG_OK);
    assert_string_equal(fg_mod_name(a), "part_and_part");
    assert_int_equal(a->mask->op, FGI_MASK_AND);
    assert_int_equal(a->mask->a->op, FGI_MASK_LEAF);
    assert_int_equal(fg_mod_param_count(a), 2);
    assert_non_null(strstr(fg_mod_canonical(a), ") && ("));
    assert_non_null(strstr(fg_mod_canonical(a), "const int *doc;\nint W;\n"));

    /* shared params are merged and the second input's indices remapped */
    assert_int_equal(fg_mod_or(ctx, a, window2, &o), FG_OK);
    assert_int_equal(o->mask->op, FGI_MASK_OR);
    assert_int_equal(fg_mod_param_count(o), 3);
    assert_string_equal(o->params[2].name, "V");
    const fgi_expr *r = o->mask->b->func->ret; /* q - kv <= W + V + doc[0] */
    assert_int_equal(r->b->a->a->kind, FGI_E_PARAM);
    assert_int_equal(r->b->a->a->index, 1); /* W */
    assert_int_equal(r->b->a->b->index, 2); /* V */
    assert_int_equal(r->b->b->kind, FGI_E_INDEX);
    assert_int_equal(r->b->b->index, 0); /* doc */
    assert_non_null(strstr(fg_mod_canonical(o), "||"));

    /* the inputs are untouched and may go away */
    assert_int_equal(window2->mask->func->ret->b->a->a->index, 0);
    fg_mod_destroy(window2);
    window2 = NULL;
    assert_non_null(strstr(o->mask->b->func->src, "doc[0]"));

    assert_int_equal(fg_mod_and(ctx, causal, clash, &x), FG_OK);
    fg_mod_destroy(x);
    assert_int_equal(fg_mod_and(ctx, window, clash, &x), FG_ERR_NAME);
    assert_null(x);
    assert_int_equal(fg_mod_or(ctx, window, clash2, &x), FG_ERR_NAME);
    assert_int_equal(fg_mod_and(ctx, causal, score, &x), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_and(ctx, causal, both, &x), FG_ERR_INVALID_ARGUMENT);

    assert_int_equal(fg_mod_combine(ctx, a, score, &c), FG_OK);
    assert_true(fg_mod_has_mask(c) && fg_mod_has_score(c));
    assert_int_equal(fg_mod_param_count(c), 3);
    assert_int_equal(c->score->ret->a->index, 2); /* CAP after doc, W */
    fg_mod_destroy(c);
    assert_int_equal(fg_mod_combine(ctx, NULL, score, &c), FG_OK);
    assert_false(fg_mod_has_mask(c));
    assert_string_equal(fg_mod_canonical(c), fg_mod_canonical(score));
    fg_mod_destroy(c);
    assert_int_equal(fg_mod_combine(ctx, causal, NULL, &c), FG_OK);
    assert_string_equal(fg_mod_canonical(c), fg_mod_canonical(causal));
    assert_int_equal(fg_mod_hash(c), fg_mod_hash(causal));
    fg_mod_destroy(c);
    assert_int_equal(fg_mod_combine(ctx, score, NULL, &c), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_combine(ctx, causal, causal, &c), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_combine(ctx, NULL, NULL, &c), FG_ERR_INVALID_ARGUMENT);
    assert_null(c);

    /* composition depth is bounded like expression depth */
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_DEPTH, 8), FG_OK);
    fg_mod *chain = NULL;
    assert_int_equal(fg_mod_and(ctx, causal, causal, &chain), FG_OK);
    fg_status st = FG_OK;
    int levels = 2;
    while (st == FG_OK && levels < 100) {
        fg_mod *next = NULL;
        st = fg_mod_or(ctx, chain, causal, &next);
        if (st == FG_OK) {
            fg_mod_destroy(chain);
            chain = next;
            levels++;
        }
    }
    assert_int_equal(st, FG_ERR_LIMIT);
    assert_int_equal(levels, 8);
    fg_mod_destroy(chain);

    fg_mod *mods[] = {causal, window, clash, clash2, score, both, a, o};
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) fg_mod_destroy(mods[i]);
    fg_ctx_destroy(ctx);
}

/* ---- limits: errors, never crashes --------------------------------------- */

static char *repeat_mask(const char *prefix, const char *unit, int n, const char *suffix) {
    size_t len = strlen(HEAD) + strlen(prefix) + strlen(unit) * (size_t)n + strlen(suffix) + 8;
    char *s = malloc(len);
    char *p = s + sprintf(s, "%s%s", HEAD, prefix);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", unit);
    sprintf(p, "%s", suffix);
    return s;
}

static void test_limits(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_SOURCE, 1 << 20), FG_OK);
    static const struct {
        const char *prefix, *unit;
        int n;
        const char *suffix;
    } rows[] = {
        {"{ return ", "(", 10000, "q_idx"},           /* parentheses */
        {"{ return ", "!", 10000, "q_idx; }"},         /* unary chain */
        {"{ return ", "- ", 10000, "q_idx > 0; }"},
        {"{ return 0", " + 1", 10000, " > 0; }"},      /* long flat chain */
        {"{ return ", "q_idx ? 1 : ", 10000, "0; }"}, /* conditional chain */
        {"{ return ", "abs(", 10000, "q_idx"},         /* calls */
        {"{ return ", "(int)", 10000, "q_idx; }"},     /* casts */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *src = repeat_mask(rows[i].prefix, rows[i].unit, rows[i].n, rows[i].suffix);
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_source(ctx, "deep.c", src, (size_t)-1, &m);
        if (st != FG_ERR_LIMIT) {
            print_error("row %zu: got %s (%s)\n", i, fg_status_string(st), fg_errmsg(ctx));
            fail();
        }
        assert_null(m);
        free(src);
    }
    /* within the limit it parses */
    char *ok = repeat_mask("{ return ", "(", 50, "q_idx >= kv_idx");
    size_t n = strlen(ok);
    ok = realloc(ok, n + 80);
    for (int i = 0; i < 50; i++) ok[n++] = ')';
    strcpy(ok + n, "; }");
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "ok.c", ok, (size_t)-1, &m), FG_OK);
    fg_mod_destroy(m);
    free(ok);

    /* 1000 locals */
    fgi_buf b = {0};
    fgi_buf_puts(&b, HEAD "{\n");
    for (int i = 0; i < 1000; i++) fgi_buf_printf(&b, "    int v%d = %d;\n", i, i);
    fgi_buf_puts(&b, "    return v999 > 0;\n}\n");
    assert_int_equal(fg_mod_from_source(ctx, "locals.c", b.data, b.len, &m), FG_ERR_LIMIT);
    assert_int_equal(fg_error_offset(ctx), (int64_t)(strstr(b.data, "v64 =") - b.data));
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_LOCALS, 1000), FG_OK);
    assert_int_equal(fg_mod_from_source(ctx, "locals.c", b.data, b.len, &m), FG_OK);
    assert_int_equal(m->mask->func->nlocals, 1000);
    fg_mod_destroy(m);
    fgi_buf_free(&b);

    /* 100k characters of source */
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_SOURCE, 64 * 1024), FG_OK);
    char *big = malloc(100001);
    memset(big, ' ', 100000);
    big[100000] = '\0';
    memcpy(big + 1000, MASK("return true; "), strlen(MASK("return true; ")));
    assert_int_equal(fg_mod_from_source(ctx, "big.c", big, (size_t)-1, &m), FG_ERR_LIMIT);
    assert_null(m);
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, big, NULL, 0, &m), FG_ERR_LIMIT);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_SOURCE, 200000), FG_OK);
    assert_int_equal(fg_mod_from_source(ctx, "big.c", big, (size_t)-1, &m), FG_OK);
    fg_mod_destroy(m);
    free(big);

    /* too many parameters */
    fgi_buf_puts(&b, "");
    for (int i = 0; i < 300; i++) fgi_buf_printf(&b, "int P%d = %d;\n", i, i);
    fgi_buf_puts(&b, MASK("return true; "));
    assert_int_equal(fg_mod_from_source(ctx, "params.c", b.data, b.len, &m), FG_ERR_LIMIT);
    fgi_buf_free(&b);
    fg_ctx_destroy(ctx);
}

/* Embedded NULs and arbitrary bytes are errors, not crashes. */
static void test_binary_input(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    const char src[] = "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q\0 >= kv_idx; }";
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "nul.c", src, sizeof src - 1, &m), FG_ERR_SYNTAX);
    assert_int_equal(fg_error_offset(ctx), (int64_t)strlen(src));
    const char *d = fg_error_diagnostic(ctx);
    assert_non_null(d);
    const char utf8[] = "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return \xc3\xa9; }";
    assert_int_equal(fg_mod_from_source(ctx, "u.c", utf8, (size_t)-1, &m), FG_ERR_SYNTAX);
    assert_non_null(strstr(fg_errmsg(ctx), "0xC3"));
    fg_ctx_destroy(ctx);
}

static void test_null_arguments(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = parse_ok(ctx, MASK("return true; "));
    fg_mod *out = NULL;
    const char *src = MASK("return true; ");
    assert_int_equal(fg_mod_from_source(NULL, "x", src, (size_t)-1, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_source(ctx, "x", NULL, 3, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_source(ctx, "x", src, (size_t)-1, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_file(NULL, "x", &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_file(ctx, NULL, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_file(ctx, "x", NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_expr(NULL, FG_MASK_MOD, "true", NULL, 0, &out),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, NULL, NULL, 0, &out),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, "true", NULL, 2, &out),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_expr(ctx, (fg_mod_kind)0, "true", NULL, 0, &out),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, "true", NULL, 0, NULL),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_and(NULL, m, m, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_and(ctx, NULL, m, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_and(ctx, m, NULL, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_and(ctx, m, m, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_or(NULL, m, m, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_or(ctx, NULL, m, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_or(ctx, m, NULL, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_or(ctx, m, m, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_combine(NULL, m, NULL, &out), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_combine(ctx, m, NULL, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_null(out);
    fg_param_info info;
    assert_int_equal(fg_mod_param(NULL, 0, &info), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_param(m, 0, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_mod_param_count(NULL), 0);
    assert_int_equal(fg_mod_has_mask(NULL), 0);
    assert_int_equal(fg_mod_has_score(NULL), 0);
    assert_non_null(fg_mod_name(NULL));
    assert_non_null(fg_mod_canonical(NULL));
    assert_int_equal(fg_mod_hash(NULL), 0);
    fg_mod_destroy(NULL);
    /* a mod and itself compose */
    assert_int_equal(fg_mod_and(ctx, m, m, &out), FG_OK);
    fg_mod_destroy(out);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_snippets),   cmocka_unit_test(test_messages),
        cmocka_unit_test(test_caret_diagnostic), cmocka_unit_test(test_good_snippets),
        cmocka_unit_test(test_types),          cmocka_unit_test(test_contract),
        cmocka_unit_test(test_resolution),     cmocka_unit_test(test_source_is_copied),
        cmocka_unit_test(test_files),          cmocka_unit_test(test_expr_form),
        cmocka_unit_test(test_composition),    cmocka_unit_test(test_limits),
        cmocka_unit_test(test_binary_input),   cmocka_unit_test(test_null_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
