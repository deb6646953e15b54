/* test_canon.c -- the canonical text and hash: one text per meaning.
 *
 * Each row is a pair of mods. In the first table the two must print the same
 * canonical text and share a hash (formatting, comments, parentheses, the
 * names of arguments and locals, parameter defaults and C spellings do not
 * matter); in the second they must differ (anything that changes what is
 * computed, or the layout of the parameters, does). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define HEAD "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
#define MASK(body) HEAD "{ " body " }"
#define SHEAD "float score_mod(float score, int b, int h, int q_idx, int kv_idx) "
#define SCORE(body) SHEAD "{ " body " }"

typedef struct pair {
    const char *why, *a, *b;
} pair;

static const pair same[] = {
    {"whitespace", MASK("return q_idx >= kv_idx;"),
     "bool   mask_mod (int b,int h,int q_idx,int kv_idx)\n{\n\treturn q_idx>=kv_idx ;\n}\n"},
    {"comments", MASK("return q_idx >= kv_idx;"),
     "/* causal */\n// mask\n" HEAD "{ /* keep the past */ return q_idx /* row */ >= kv_idx; // }\n}"},
    {"redundant parentheses", MASK("return q_idx - kv_idx <= 4 && b == 0;"),
     MASK("return (((q_idx - kv_idx)) <= (4)) && ((b) == 0);")},
    {"argument names", MASK("return q_idx >= kv_idx && h < b;"),
     "bool mask_mod(int batch, int head, int q, int kv) { return q >= kv && head < batch; }"},
    {"score argument name", SCORE("return score * 2.0f;"),
     "float score_mod(float s, int b, int h, int q_idx, int kv_idx) { return s * 2.0f; }"},
    {"parameter defaults", "int W = 3;\n" MASK("return q_idx - kv_idx <= W;"),
     "int W = 1024;\n" MASK("return q_idx - kv_idx <= W;")},
    {"float default and const", "float T = 0.5;\n" SCORE("return score / T;"),
     "const float T = -30;\n" SCORE("return score / T;")},
    {"local names", MASK("int d = q_idx - kv_idx; return d >= 0 && d < 8;"),
     MASK("const int distance = q_idx - kv_idx; return distance >= 0 && distance < 8;")},
    {"C spellings of builtins", SCORE("return tanh(score) + exp(score) + abs(score);"),
     SCORE("return tanhf(score) + expf(score) + fabsf(score);")},
    {"implicit and explicit conversions", SCORE("return score + 1;"),
     SCORE("return score + (float)1;")},
    {"int and float literal of one value", SCORE("return score + 1;"),
     SCORE("return score + 1.0f;")},
    {"float literal spellings", SCORE("return score * 0.5f;"), SCORE("return score * 5e-1;")},
    {"hex and decimal", MASK("return (q_idx & 0x10) != 0;"), MASK("return (q_idx & 16) != 0;")},
    {"include line", "#include <flexgen/mod.h>\n" MASK("return true;"), MASK("return true;")},
    {"unary plus and redundant casts", MASK("return +q_idx >= (int)kv_idx;"),
     MASK("return q_idx >= kv_idx;")},
    {"order of the two functions",
     SCORE("return score;") "\n" MASK("return q_idx >= kv_idx;"),
     MASK("return q_idx >= kv_idx;") "\n" SCORE("return score;")},
    {"bool literal in arithmetic", MASK("return q_idx + true > kv_idx;"),
     MASK("return q_idx + 1 > kv_idx;")},
    {"negative literal", SCORE("return score * -2;"), SCORE("return score * (-2.0f);")},
    {"buffer declaration spelling", "const int * const doc;\n" MASK("return doc[q_idx] == doc[kv_idx];"),
     "const int *doc;\n" MASK("return doc[q_idx] == doc[kv_idx];")},
};

static const pair different[] = {
    {"comparison", MASK("return q_idx >= kv_idx;"), MASK("return q_idx > kv_idx;")},
    {"operand order", MASK("return q_idx - kv_idx < 4;"), MASK("return kv_idx - q_idx < 4;")},
    {"associativity", MASK("return q_idx - kv_idx - h > 0;"),
     MASK("return q_idx - (kv_idx - h) > 0;")},
    {"literal value", MASK("return q_idx - kv_idx < 4;"), MASK("return q_idx - kv_idx < 5;")},
    {"float literal value", SCORE("return score * 0.1f;"), SCORE("return score * 0.2f;")},
    {"parameter name", "int W = 3;\n" MASK("return q_idx - kv_idx <= W;"),
     "int V = 3;\n" MASK("return q_idx - kv_idx <= V;")},
    {"parameter type", "int W = 3;\n" MASK("return q_idx - kv_idx <= W;"),
     "float W = 3;\n" MASK("return q_idx - kv_idx <= W;")},
    {"parameter order", "int A = 1;\nint B = 2;\n" MASK("return q_idx < A + B;"),
     "int B = 2;\nint A = 1;\n" MASK("return q_idx < A + B;")},
    {"unused parameter", MASK("return true;"), "int W = 1;\n" MASK("return true;")},
    {"buffer element type", "const int *s;\n" SCORE("return score + s[h];"),
     "const float *s;\n" SCORE("return score + s[h];")},
    {"integer and float division", MASK("return q_idx / 2 > 1;"),
     MASK("return q_idx / 2.0f > 1;")},
    {"local type", MASK("float x = q_idx / 3; return x > 1;"),
     MASK("int x = q_idx / 3; return x > 1;")},
    {"argument swap", MASK("return b < h;"), MASK("return h < b;")},
    {"extra score_mod", MASK("return true;"), MASK("return true;") "\n" SCORE("return score;")},
    {"mask only versus score only", MASK("return true;"), SCORE("return score;")},
    {"builtin", SCORE("return exp(score);"), SCORE("return exp2(score);")},
    {"min and max", SCORE("return min(score, 1.0f);"), SCORE("return max(score, 1.0f);")},
    {"conditional branches", SCORE("return q_idx >= kv_idx ? score : -INFINITY;"),
     SCORE("return q_idx >= kv_idx ? -INFINITY : score;")},
    {"and versus or", MASK("return q_idx > 0 && kv_idx > 0;"),
     MASK("return q_idx > 0 || kv_idx > 0;")},
    {"INFINITY and NAN", SCORE("return INFINITY;"), SCORE("return NAN;")},
    {"scalar and buffer", "int W = 0;\n" MASK("return true;"), "const int *W;\n" MASK("return true;")},
};

static fg_mod *parse(fg_ctx *ctx, const char *src) {
    fg_mod *m = NULL;
    if (fg_mod_from_source(ctx, "canon.c", src, (size_t)-1, &m) != FG_OK) {
        print_error("%s\n%s", src, fg_error_diagnostic(ctx));
        fail();
    }
    return m;
}

static void test_same_meaning(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_true(sizeof same / sizeof same[0] >= 10);
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        fg_mod *a = parse(ctx, same[i].a), *b = parse(ctx, same[i].b);
        if (strcmp(fg_mod_canonical(a), fg_mod_canonical(b)) != 0) {
            print_error("%s: canonical texts differ:\n%s---\n%s", same[i].why,
                        fg_mod_canonical(a), fg_mod_canonical(b));
            fail();
        }
        assert_true(fg_mod_hash(a) == fg_mod_hash(b));
        fg_mod_destroy(a);
        fg_mod_destroy(b);
    }
    fg_ctx_destroy(ctx);
}

static void test_different_meaning(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_true(sizeof different / sizeof different[0] >= 10);
    for (size_t i = 0; i < sizeof different / sizeof different[0]; i++) {
        fg_mod *a = parse(ctx, different[i].a), *b = parse(ctx, different[i].b);
        if (strcmp(fg_mod_canonical(a), fg_mod_canonical(b)) == 0 ||
            fg_mod_hash(a) == fg_mod_hash(b)) {
            print_error("%s: canonical texts agree:\n%s", different[i].why, fg_mod_canonical(a));
            fail();
        }
        fg_mod_destroy(a);
        fg_mod_destroy(b);
    }
    fg_ctx_destroy(ctx);
}

/* The hash is FNV-1a of the canonical text, and the text reads as C. */
static void test_hash_and_text(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = parse(ctx, "/* sliding window */\nint WINDOW = 1024;\n"
                           "bool mask_mod(int b, int h, int q, int kv) {\n"
                           "    int d = q - kv;   // distance\n"
                           "    return q >= kv && d <= WINDOW;\n}\n");
    const char *c = fg_mod_canonical(m);
    assert_string_equal(c, "int WINDOW;\n"
                           "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
                           "    int l0 = q_idx - kv_idx;\n"
                           "    return q_idx >= kv_idx && l0 <= WINDOW;\n"
                           "}\n");
    assert_true(fg_mod_hash(m) == fgi_fnv1a(FGI_FNV_SEED, c, strlen(c)));
    assert_null(strstr(c, "*/"));
    fg_mod_destroy(m);

    m = parse(ctx, "const float *slopes;\n"
                   SCORE("return score + slopes[h] * (kv_idx - q_idx);"));
    assert_string_equal(fg_mod_canonical(m),
                        "const float *slopes;\n"
                        "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
                        "    return score + slopes[h] * (float)(kv_idx - q_idx);\n"
                        "}\n");
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* Float literals print in the shortest form that reads back exactly. */
static void test_float_literals(void **state) {
    (void)state;
    static const struct {
        const char *lit, *printed;
    } rows[] = {
        {"0.1f", "0.1f"},          {"30", "30.0f"},           {"1e10f", "10000000000.0f"},
        {"1e30", "1e+30f"},        {"16777217", "16777216.0f"}, {"1e-7f", "0.0000001f"},
        {"3.14159265358979", "3.1415927f"}, {"INFINITY", "INFINITY"}, {"NAN", "NAN"},
        {"1.17549435e-38f", "1.1754944e-38f"}, {"0", "0.0f"}, {"-0.0f", "-0.0f"},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char expr[64];
        snprintf(expr, sizeof expr, "(float)(%s)", rows[i].lit);
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_expr(ctx, FG_SCORE_MOD, expr, NULL, 0, &m), FG_OK);
        char *text = fgi_expr_canonical(m, m->score, m->score->ret);
        if (strcmp(text, rows[i].printed) != 0) {
            print_error("%s printed as %s, want %s\n", rows[i].lit, text, rows[i].printed);
            free(text);
            fail();
        }
        /* and reads back to the same value */
        fg_mod *again = NULL;
        assert_int_equal(fg_mod_from_expr(ctx, FG_SCORE_MOD, text, NULL, 0, &again), FG_OK);
        assert_string_equal(fg_mod_canonical(again), fg_mod_canonical(m));
        free(text);
        fg_mod_destroy(again);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The expression form and the file form give the same mod. */
static void test_expr_equals_file(void **state) {
    (void)state;
    static const struct {
        fg_mod_kind kind;
        const char *expr, *file;
        fg_param_decl params[2];
        size_t nparams;
    } rows[] = {
        {FG_MASK_MOD, "q_idx >= kv_idx", MASK("return q_idx >= kv_idx;"), {{0}}, 0},
        {FG_MASK_MOD, "q_idx >= kv_idx && q_idx - kv_idx <= WINDOW",
         "int WINDOW = 1024;\n"
         "bool mask_mod(int b, int h, int q, int kv) { return q >= kv && (q - kv) <= WINDOW; }",
         {{"WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 64}}, 1},
        {FG_MASK_MOD, "doc[q_idx] == doc[kv_idx] && q_idx >= kv_idx",
         "const int *doc;\n" MASK("return doc[q_idx] == doc[kv_idx] && q_idx >= kv_idx;"),
         {{"doc", FG_PARAM_BUFFER, FG_TYPE_INT, 0}}, 1},
        {FG_SCORE_MOD, "score + slopes[h] * (kv_idx - q_idx)",
         "const float *slopes;\n" SCORE("return score + slopes[h] * (float)(kv_idx - q_idx);"),
         {{"slopes", FG_PARAM_BUFFER, FG_TYPE_FLOAT, 0}}, 1},
        {FG_SCORE_MOD, "CAP * tanhf(score / CAP)",
         "float CAP = 50.0f;\n" SCORE("return CAP * tanh(score / CAP);"),
         {{"CAP", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 20}}, 1},
        {FG_SCORE_MOD, "q_idx >= kv_idx ? score : -INFINITY",
         SCORE("return q_idx >= kv_idx ? score : -INFINITY;"), {{0}}, 0},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *e = NULL;
        if (fg_mod_from_expr(ctx, rows[i].kind, rows[i].expr, rows[i].params, rows[i].nparams,
                             &e) != FG_OK) {
            print_error("%s: %s\n", rows[i].expr, fg_error_diagnostic(ctx));
            fail();
        }
        fg_mod *f = parse(ctx, rows[i].file);
        if (strcmp(fg_mod_canonical(e), fg_mod_canonical(f)) != 0) {
            print_error("row %zu:\n%s---\n%s", i, fg_mod_canonical(e), fg_mod_canonical(f));
            fail();
        }
        assert_true(fg_mod_hash(e) == fg_mod_hash(f));
        fg_mod_destroy(e);
        fg_mod_destroy(f);
    }
    fg_ctx_destroy(ctx);
}

/* Composition: order and operator matter, formatting of the parts does not. */
static void test_composition(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *causal = parse(ctx, MASK("return q_idx >= kv_idx;"));
    fg_mod *causal2 = parse(ctx, "bool mask_mod(int b,int h,int q,int k){return (q>=k);}");
    fg_mod *win = parse(ctx, "int W = 8;\n" MASK("return q_idx - kv_idx <= W;"));
    fg_mod *win2 = parse(ctx, "int W = 99;\n" MASK("return (q_idx - kv_idx) <= W;"));
    fg_mod *ab = NULL, *ab2 = NULL, *ba = NULL, *o = NULL;
    assert_int_equal(fg_mod_and(ctx, causal, win, &ab), FG_OK);
    assert_int_equal(fg_mod_and(ctx, causal2, win2, &ab2), FG_OK);
    assert_int_equal(fg_mod_and(ctx, win, causal, &ba), FG_OK);
    assert_int_equal(fg_mod_or(ctx, causal, win, &o), FG_OK);
    assert_string_equal(fg_mod_canonical(ab), fg_mod_canonical(ab2));
    assert_true(fg_mod_hash(ab) == fg_mod_hash(ab2));
    assert_string_not_equal(fg_mod_canonical(ab), fg_mod_canonical(ba));
    assert_string_not_equal(fg_mod_canonical(ab), fg_mod_canonical(o));
    assert_string_equal(fg_mod_canonical(ab),
                        "int W;\n"
                        "bool mask_mod(int b, int h, int q_idx, int kv_idx) ({\n"
                        "        return q_idx >= kv_idx;\n"
                        "    }) && ({\n"
                        "        return q_idx - kv_idx <= W;\n"
                        "    })\n");
    fg_mod *all[] = {causal, causal2, win, win2, ab, ab2, ba, o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fg_mod_destroy(all[i]);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_meaning),     cmocka_unit_test(test_different_meaning),
        cmocka_unit_test(test_hash_and_text),    cmocka_unit_test(test_float_literals),
        cmocka_unit_test(test_expr_equals_file), cmocka_unit_test(test_composition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
