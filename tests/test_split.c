/*
 * test_split.c -- the mods split by dependency (src/codegen/emit_split.c).
 *
 * The table says, per gallery mod, how many values each part holds (head:
 * b, h and parameters only; row: q_idx without kv_idx; column: kv_idx
 * without q_idx) and which operations must have left the per-element
 * function: natten's divisions and clamps, document's loads, ALiBi's
 * slopes[h], dilated's WINDOW * DILATION; and whether the emitter calls
 * the mask's row and column parts costly (FG_MASK_ROW_COSTLY,
 * FG_MASK_COL_COSTLY: worth computing once per row or column and
 * sharing) and whether the column part reads a buffer (FG_MASK_COL_READS:
 * the Hopper forward reads it a tile ahead), whether what stays per
 * element of the mask is costly (FG_MASK_ELEM_COSTLY), whether the mask reads the
 * indices only through their distance (FG_MASK_DIST), whether score_mod
 * does (FG_SCORE_DIST), and whether score_mod's per-element rest is costly (FG_SCORE_ELEM_COSTLY,
 * which fgi_split_score_elem_costly answers on the host too). Then
 * every gallery mod, and a composition, must compile with
 * NVRTC next to a kernel that compares split and whole mods (gpu_split runs
 * it).
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "split_check.h"

typedef struct split_row {
    const char *mod;
    int mask[3], score[3];     /* members of head, row, col             */
    const char *mask_gone[3];  /* must not appear in fg_mask_split0     */
    const char *score_gone[2]; /* must not appear in fg_score_split0    */
    int row_costly;            /* FG_MASK_ROW_COSTLY                    */
    int col_costly;            /* FG_MASK_COL_COSTLY                    */
    int col_reads;             /* FG_MASK_COL_READS                     */
    int score_costly;          /* FG_SCORE_ELEM_COSTLY                  */
    int dist;                  /* FG_MASK_DIST                          */
    int score_dist;            /* FG_SCORE_DIST                         */
    int elem_costly;           /* FG_MASK_ELEM_COSTLY                   */
    int tile;                  /* FG_MASK_TILE                          */
} split_row;

static const split_row rows[] = {
    {"natten", {3, 4, 2}, {0, 0, 0}, {"fg_idiv", "fg_imod", "fg_iclamp"}, {NULL}, 1, 1, 0, 0, 0, 0, 0, 0},
    {"sasa", {0, 2, 2}, {0, 0, 0}, {"fg_idiv", "fg_imod", NULL}, {NULL}, 1, 1, 0, 0, 0, 0, 0, 0},
    {"document", {0, 1, 1}, {0, 0, 0}, {"fg_load", NULL}, {NULL}, 1, 1, 1, 0, 0, 0, 0, 0},
    {"jagged", {0, 3, 0}, {0, 0, 0}, {"fg_load", NULL}, {NULL}, 1, 0, 0, 0, 0, 0, 0, 0},
    {"flamingo", {0, 2, 1}, {0, 0, 0}, {"fg_load", NULL}, {NULL}, 1, 1, 1, 0, 0, 0, 0, 0},
    {"prefix_lm", {0, 0, 1}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 0, 0, 0, 0, 1},
    {"sliding_window", {0, 0, 0}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 0, 1, 0, 0, 0},
    {"causal", {0, 0, 0}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 0, 1, 0, 0, 0},
    {"alibi", {0, 0, 0}, {1, 0, 0}, {NULL}, {"fg_load", NULL}, 0, 0, 0, 0, 1, 1, 0, 0},
    {"softcap", {0, 0, 0}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 1, 1, 0, 0, 0},
    {"noop", {0, 0, 0}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 0, 0, 0, 0, 0},
    {"dilated", {1, 0, 0}, {0, 0, 0}, {"fg_imul", NULL}, {NULL}, 0, 0, 0, 0, 1, 0, 1, 1},
    {"local_global", {0, 0, 1}, {0, 0, 0}, {NULL}, {NULL}, 0, 0, 0, 0, 0, 0, 0, 1},
};

static char *emit_split(fg_ctx *ctx, const fg_mod *m) {
    fgi_buf b = {0};
    fg_status st = fgi_emit_split(ctx, m, &b);
    if (st != FG_OK) print_error("%s: %s\n", fg_status_string(st), fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    char *s = fgi_buf_take(&b);
    assert_non_null(s);
    return s;
}

/* Members of `struct NAME { ... };` in the text: one ';' each. */
static int count_members(const char *text, const char *name) {
    char open[64];
    snprintf(open, sizeof open, "struct %s {\n", name);
    const char *s = strstr(text, open);
    assert_non_null(s);
    s += strlen(open);
    const char *end = strstr(s, "};");
    assert_non_null(end);
    int n = 0;
    for (; s < end; s++) n += *s == ';';
    return n;
}

/* The body of function `name` (up to its closing "\n}"), malloc'd; NULL
 * when there is no such function. */
static char *function_body(const char *text, const char *name) {
    char sig[64];
    snprintf(sig, sizeof sig, " %s(", name);
    const char *s = strstr(text, sig);
    if (!s) return NULL;
    const char *end = strstr(s, "\n}");
    assert_non_null(end);
    size_t n = (size_t)(end - s);
    char *body = malloc(n + 1);
    assert_non_null(body);
    memcpy(body, s, n);
    body[n] = 0;
    return body;
}

static void check_gone(const char *text, const char *fn, const char *const *gone, int n,
                       const char *mod) {
    char *body = function_body(text, fn);
    for (int i = 0; i < n && gone[i]; i++) {
        assert_non_null(body);
        if (strstr(body, gone[i])) {
            print_error("%s: %s still computes %s per element:\n%s\n", mod, fn, gone[i], body);
            fail();
        }
    }
    free(body);
}

/* A mod from source text, failing the test with its diagnostic. */
static fg_mod *mod_of(fg_ctx *ctx, const char *name, const char *text) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, name, text, strlen(text), &m);
    if (st != FG_OK) print_error("%s: %s\n", name, fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

/* The split text holds `#define NAME VALUE`; `what` names the case. */
static void assert_define(const char *text, const char *name, int value, const char *what) {
    char want[64];
    snprintf(want, sizeof want, "#define %s %d\n", name, value);
    if (!strstr(text, want)) print_error("%s: expected %s in\n%s\n", what, want, text);
    assert_non_null(strstr(text, want));
}

/* `body` (a function's text) holds none of the NULL-terminated `words`;
 * `what` names the case and the function in a failure. */
static void assert_reads_none(const char *body, const char *const *words, const char *what) {
    for (const char *const *w = words; *w; w++) {
        if (strstr(body, *w)) print_error("%s reads %s:\n%s\n", what, *w, body);
        assert_null(strstr(body, *w));
    }
}
static const char *const no_index[] = {"q_idx", "kv_idx", NULL};

/* The mod, its split (with the rewrites `flags` asks for) and the checking
 * kernel compile with NVRTC; `what` names the case in a failure. */
static void compiles_beside_whole(fg_ctx *ctx, const fg_mod *m, unsigned flags, const char *what) {
    char *src = NULL;
    assert_int_equal(split_check_source_flags(ctx, m, flags, &src), FG_OK);
    void *img = NULL;
    size_t size = 0;
    fg_status st = fgi_nvrtc_compile(ctx, src, "split_check.cu", "sm_90a", FG_EMIT_PTX, &img, &size, NULL);
    if (st != FG_OK) print_error("%s: %s\n", what, fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    free(img);
    free(src);
}

static void gallery_table(void **state) {
    (void)state;
    static const char *const kinds[3] = {"head", "row", "col"};
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const split_row *r = &rows[i];
        fg_mod *m = tu_gallery_mod(ctx, r->mod);
        char *text = emit_split(ctx, m);
        for (int k = 0; k < 3; k++) {
            char name[32];
            snprintf(name, sizeof name, "fg_mask_%s", kinds[k]);
            int got = count_members(text, name);
            if (got != r->mask[k]) print_error("%s: %s has %d members\n%s\n", r->mod, name, got, text);
            assert_int_equal(got, r->mask[k]);
            snprintf(name, sizeof name, "fg_score_%s", kinds[k]);
            got = count_members(text, name);
            if (got != r->score[k]) print_error("%s: %s has %d members\n%s\n", r->mod, name, got, text);
            assert_int_equal(got, r->score[k]);
        }
        assert_define(text, "FG_MASK_ROW_COSTLY", r->row_costly, r->mod);
        assert_define(text, "FG_MASK_COL_COSTLY", r->col_costly, r->mod);
        assert_define(text, "FG_MASK_COL_READS", r->col_reads, r->mod);
        assert_define(text, "FG_MASK_DIST", r->dist, r->mod);
        assert_define(text, "FG_SCORE_DIST", r->score_dist, r->mod);
        assert_define(text, "FG_MASK_ELEM_COSTLY", r->elem_costly, r->mod);
        assert_define(text, "FG_MASK_TILE", r->tile, r->mod);
        assert_define(text, "FG_SCORE_ELEM_COSTLY", r->score_costly, r->mod);
        assert_int_equal(fgi_split_score_elem_costly(m), r->score_costly);
        check_gone(text, "fg_mask_split0", r->mask_gone, 3, r->mod);
        check_gone(text, "fg_score_split0", r->score_gone, 2, r->mod);
        free(text);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* A composed mask is split leaf by leaf and combined as fg_mask_mod is. */
static void composition_splits_per_leaf(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *a = tu_gallery_mod(ctx, "natten"), *b = tu_gallery_mod(ctx, "document");
    fg_mod *c = tu_gallery_mod(ctx, "prefix_lm");
    fg_mod *ab = NULL, *abc = NULL;
    assert_int_equal(fg_mod_and(ctx, a, b, &ab), FG_OK);
    assert_int_equal(fg_mod_or(ctx, ab, c, &abc), FG_OK);
    char *text = emit_split(ctx, abc);
    assert_int_equal(count_members(text, "fg_mask_row"), 4 + 1);
    assert_int_equal(count_members(text, "fg_mask_col"), 2 + 1 + 1);
    assert_non_null(strstr(text, "((fg_mask_split0(p, hd, b, h, q_idx, kv_idx, r, c) && "
                                 "fg_mask_split1(p, hd, b, h, q_idx, kv_idx, r, c)) || "
                                 "fg_mask_split2(p, hd, b, h, q_idx, kv_idx, r, c))"));
    /* Each leaf's values carry its number. */
    assert_non_null(strstr(text, "r.f1_"));
    assert_non_null(strstr(text, "c.f2_"));
    /* One costly leaf (natten's divisions) makes the whole column part so. */
    assert_non_null(strstr(text, "#define FG_MASK_COL_COSTLY 1\n"));
    free(text);
    fg_mod_destroy(abc);
    fg_mod_destroy(ab);
    fg_mod_destroy(c);
    fg_mod_destroy(b);
    fg_mod_destroy(a);
    fg_ctx_destroy(ctx);
}

/* Mods written to defeat the analysis: a local read in both halves, a
 * head value inside a row value, nesting through ?: and casts, a score_mod
 * whose only hoistable part is a row. */
static void tricky_mods_split(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int row, col, score_row;
    } cases[] = {
        {"int W = 7;\n"
         "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
         "    int t = q_idx / W;\n"
         "    int u = t + kv_idx;\n"
         "    return (q_idx % 3 == 0 ? u : kv_idx / (W + h)) > (int)((float)t * 0.5);\n"
         "}\n",
         3, 1, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score * exp2(-(float)(q_idx / 64)) + (float)kv_idx;\n"
         "}\n",
         0, 0, 1},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_mod *m = mod_of(ctx, "tricky", cases[i].text);
        char *text = emit_split(ctx, m);
        assert_int_equal(count_members(text, "fg_mask_row"), cases[i].row);
        assert_int_equal(count_members(text, "fg_mask_col"), cases[i].col);
        assert_int_equal(count_members(text, "fg_score_row"), cases[i].score_row);
        free(text);
        /* And it compiles next to the whole mod. */
        compiles_beside_whole(ctx, m, 0, "tricky mod");
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The distance form (FG_MASK_DIST): set where the mask reads the indices
 * only through q_idx - kv_idx, and then fg_mask_dist reads neither and
 * compiles beside the whole mod (gpu_split checks its results). */
static void distance_form(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof split_check_distance / sizeof split_check_distance[0]; i++) {
        fg_mod *m = mod_of(ctx, "dist", split_check_distance[i].text);
        char *text = emit_split(ctx, m);
        assert_define(text, "FG_MASK_DIST", split_check_distance[i].dist, split_check_distance[i].text);
        char *body = function_body(text, "fg_mask_dist0");
        if (split_check_distance[i].dist) {
            assert_non_null(body);
            assert_reads_none(body, no_index, split_check_distance[i].text);
        } else {
            assert_null(body);
        }
        free(body);
        free(text);
        compiles_beside_whole(ctx, m, 0, "distance mask");
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The mask folded over a tile (FG_MASK_TILE): set where every index read
 * apart from a difference lies in a monotone comparison and the fold
 * leaves something to gain, and then the folded form reads neither index
 * and compiles beside the whole mod (gpu_split checks its results). */
static void fold_form(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof split_check_fold / sizeof split_check_fold[0]; i++) {
        fg_mod *m = mod_of(ctx, "fold", split_check_fold[i].text);
        char *text = emit_split(ctx, m);
        assert_define(text, "FG_MASK_TILE", split_check_fold[i].tile, split_check_fold[i].text);
        char *body = function_body(text, "fg_mask_fold0");
        char *init = function_body(text, "fg_mask_tile_init");
        if (split_check_fold[i].tile) {
            assert_non_null(body);
            assert_non_null(init);
            static const char *const no_part[] = {"q_idx", "kv_idx", "c.f", "r.f", NULL}; /* nor a row or column part */
            assert_reads_none(body, no_part, split_check_fold[i].text);
            assert_non_null(strstr(body, "t.a0_0"));
        } else {
            assert_null(body);
            assert_null(init);
        }
        free(init);
        free(body);
        free(text);
        compiles_beside_whole(ctx, m, 0, "folded mask");
        fg_mod_destroy(m);
    }
    /* A composition folds leaf by leaf: local_global && dilated, two
     * leaves' atoms in one tile struct, fg_mask_fold the && of the two
     * leaves' folded forms. */
    fg_mod *lg = tu_gallery_mod(ctx, "local_global"), *dil = tu_gallery_mod(ctx, "dilated"), *both = NULL;
    assert_int_equal(fg_mod_and(ctx, lg, dil, &both), FG_OK);
    char *text = emit_split(ctx, both);
    assert_define(text, "FG_MASK_TILE", 1, "local_global && dilated");
    assert_non_null(strstr(text, "t.a0_0"));
    assert_non_null(strstr(text, "t.a1_0"));
    assert_non_null(strstr(text, "fg_mask_fold0<U>(p, hd, b, h, fg_dist, t) && fg_mask_fold1<U>(p, hd, b, h, fg_dist, t)"));
    free(text);
    compiles_beside_whole(ctx, both, 0, "folded composition");
    fg_mod_destroy(both);
    fg_mod_destroy(dil);
    fg_mod_destroy(lg);
    fg_ctx_destroy(ctx);
}

/* The score_mod by diagonals (FG_SCORE_DIST): set where score_mod reads
 * the indices only through q_idx - kv_idx, and then fg_score_diag_init and
 * fg_score_dist read neither, and the split compiles beside the whole mod
 * (gpu_split checks its bits). */
static void score_distance_form(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof split_check_score_distance / sizeof split_check_score_distance[0]; i++) {
        const char *src = split_check_score_distance[i].text;
        fg_mod *m = mod_of(ctx, "sdist", src);
        char *text = emit_split(ctx, m);
        assert_define(text, "FG_SCORE_DIST", split_check_score_distance[i].dist, src);
        if (split_check_score_distance[i].dist)
            assert_define(text, "FG_SCORE_ADDS", split_check_score_distance[i].adds, src);
        char *addend = function_body(text, "fg_score_addend");
        if (split_check_score_distance[i].adds) { /* Y alone: neither an index nor the score */
            assert_non_null(addend);
            static const char *const no_score[] = {"q_idx", "kv_idx", "score", NULL};
            assert_reads_none(strchr(addend, '{'), no_score, src);
        } else {
            assert_null(addend);
        }
        free(addend);
        static const char *const fns[2] = {"fg_score_diag_init", "fg_score_dist"};
        for (int f = 0; f < 2; f++) {
            char *body = function_body(text, fns[f]);
            if (split_check_score_distance[i].dist) {
                assert_non_null(body);
                assert_reads_none(body, no_index, fns[f]);
            } else {
                assert_null(body);
            }
            free(body);
        }
        if (split_check_score_distance[i].dist) { /* nothing of the distance is left per score */
            char *body = function_body(text, "fg_score_dist");
            assert_null(strstr(strchr(body, '{'), "fg_dist"));
            free(body);
        }
        free(text);
        compiles_beside_whole(ctx, m, 0, "distance score_mod");
        compiles_beside_whole(ctx, m, FGI_SPLIT_INDEX_FLOATS, "distance score_mod, index floats");
        compiles_beside_whole(ctx, m, FGI_SPLIT_DIST_FLOATS, "distance score_mod, distance floats");
        /* FGI_SPLIT_DIST_FLOATS: a cast of the distance in the diagonal part
         * reads the float distance, and only there */
        fgi_buf fb = {0};
        assert_int_equal(fgi_emit_split_math(ctx, m, FGI_MATH_ACCURATE, FGI_SPLIT_DIST_FLOATS, &fb), FG_OK);
        char *ftext = fgi_buf_take(&fb);
        char *fdiag = function_body(ftext, "fg_score_diag_init");
        const bool casts = fgi_split_casts_distance(m);
        if (fdiag) assert_int_equal(strstr(strchr(fdiag, '{'), "fg_dist_f") != NULL, casts);
        else assert_false(casts);
        free(fdiag);
        free(ftext);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* What stays per score decides FG_SCORE_ELEM_COSTLY: costly work hoisted
 * to a head, row or column part does not count; a division, a buffer read,
 * an int-to-float conversion or a transcendental per score does. Of
 * those, a division or a costly call sets FG_SCORE_ELEM_CALLS. */
static void score_element_cost(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int costly, calls; /* FG_SCORE_ELEM_COSTLY, FG_SCORE_ELEM_CALLS */
    } cases[] = {
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score * 0.5f; }", 0, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score * exp2(-(float)(q_idx / 64)) + sqrt((float)kv_idx);\n}\n",
         0, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score / 30.0f; }", 1, 1},
        /* of the distance alone: made per diagonal (FG_SCORE_DIST), so
         * what stays per score is an FSUB */
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    float d = (float)(q_idx - kv_idx);\n    return score - exp(-d * d);\n}\n",
         0, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    float d = (float)(q_idx - kv_idx);\n    return score - exp(-d * score);\n}\n",
         1, 1},
        {"const float *bias;\nint N = 64;\n"
         "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score + bias[q_idx * N + kv_idx];\n}\n",
         1, 0},
        {"const float *bias;\n"
         "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score + bias[h]; }\n",
         0, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score + 0.5f * (float)(kv_idx - q_idx);\n}\n",
         0, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score + 0.5f * (float)(kv_idx - 2 * q_idx);\n}\n",
         1, 0},
        {"bool mask_mod(int b, int h, int q_idx, int kv_idx) { return (q_idx / 7) == (kv_idx / 7); }\n", 0, 0},
        /* the distance's cast per diagonal only beside a mask of the
         * distance too: beside prefix_lm's it stays per score */
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score + 0.5f * (float)(kv_idx - q_idx);\n}\n"
         "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return kv_idx < 64 || q_idx >= kv_idx; }\n",
         1, 0},
        {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
         "    return score + 0.5f * (float)(kv_idx - q_idx);\n}\n"
         "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx - kv_idx < 64; }\n",
         0, 0},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_mod *m = mod_of(ctx, "cost", cases[i].text);
        char *text = emit_split(ctx, m);
        assert_define(text, "FG_SCORE_ELEM_COSTLY", cases[i].costly, cases[i].text);
        assert_define(text, "FG_SCORE_ELEM_CALLS", cases[i].calls, cases[i].text);
        assert_int_equal(fgi_split_score_elem_costly(m), cases[i].costly);
        free(text);
        fg_mod_destroy(m);
    }
    assert_false(fgi_split_score_elem_costly(NULL));
    fg_ctx_destroy(ctx);
}

/* FGI_SPLIT_INDEX_FLOATS: each bare (float)(kv_idx - q_idx) becomes
 * fg_fsub of a column part (float)kv_idx and a row part (float)q_idx, in
 * the order the subtraction had, no longer costly per score; without the
 * flag nothing changes; fgi_split_casts_indices finds them where the
 * forward keeps them per element (not in a score_mod of the distance
 * alone, which it makes by diagonals); and the
 * rewritten split compiles next to the whole mod (gpu_split runs it). */
static void index_casts_rewritten(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof split_check_index_casts / sizeof split_check_index_casts[0]; i++) {
        const char *text = split_check_index_casts[i].text;
        const int want = split_check_index_casts[i].rewritten;
        fg_mod *m = mod_of(ctx, "casts", text);
        /* a score_mod of the distance alone is made by diagonals (its casts
         * as written there): the forward has no rewritten cast to guard */
        assert_int_equal(fgi_split_casts_indices(m), want > 0 && !fgi_split_casts_distance(m));
        fgi_buf b = {0};
        assert_int_equal(fgi_emit_split_math(ctx, m, FGI_MATH_ACCURATE, FGI_SPLIT_INDEX_FLOATS, &b), FG_OK);
        char *split = fgi_buf_take(&b);
        assert_non_null(split);
        int n = 0;
        for (const char *p = split; (p = strstr(p, "fg_fsub(")); p++) {
            const bool col_row = strncmp(p, "fg_fsub(c.", 10) == 0 && strstr(p, ", r.") == strchr(p, ',');
            const bool row_col = strncmp(p, "fg_fsub(r.", 10) == 0 && strstr(p, ", c.") == strchr(p, ',');
            n += col_row || row_col;
        }
        if (n != want) print_error("case %zu: %d rewritten casts, expected %d\n%s\n", i, n, want, split);
        assert_int_equal(n, want);
        if (i == 0) { /* ALiBi: kv first, and nothing costly left per score */
            assert_non_null(strstr(split, "fg_fsub(c."));
            assert_non_null(strstr(split, "#define FG_SCORE_ELEM_COSTLY 0\n"));
        }
        if (i == 1) assert_non_null(strstr(split, "fg_fsub(r."));
        free(split);
        char *plain = emit_split(ctx, m);
        assert_null(strstr(plain, "fg_fsub(c."));
        assert_null(strstr(plain, "fg_fsub(r."));
        free(plain);
        compiles_beside_whole(ctx, m, FGI_SPLIT_INDEX_FLOATS, "index casts");
        fg_mod_destroy(m);
    }
    fg_mod *alibi = tu_gallery_mod(ctx, "alibi"), *causal = tu_gallery_mod(ctx, "causal");
    assert_false(fgi_split_casts_indices(alibi)); /* made by diagonals */
    assert_false(fgi_split_casts_indices(causal));
    assert_false(fgi_split_casts_indices(NULL));
    assert_true(fgi_split_casts_distance(alibi));
    assert_false(fgi_split_casts_distance(causal));
    assert_false(fgi_split_casts_distance(NULL));
    /* beside a mask that reads an index apart, the forward keeps the
     * element loop: no float distance */
    fg_mod *both = mod_of(ctx, "alibi_prefix",
                          "const float *slopes;\n"
                          "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
                          "    return score + slopes[h] * (float)(kv_idx - q_idx);\n}\n"
                          "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return kv_idx < 64 || q_idx >= kv_idx; }\n");
    assert_true(fgi_split_casts_indices(both));
    assert_false(fgi_split_casts_distance(both));
    fg_mod_destroy(both);
    fg_mod_destroy(causal);
    fg_mod_destroy(alibi);
    fg_ctx_destroy(ctx);
}

static void gallery_compiles(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, rows[i].mod);
        compiles_beside_whole(ctx, m, 0, rows[i].mod);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* Past the table's limit the split still compiles (and gpu_split checks
 * that it still gives the whole mod's results). */
static void table_limit_degrades(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    char *text = split_check_big_mod();
    assert_non_null(text);
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "big", text, strlen(text), &m);
    if (st != FG_OK) print_error("%s\n", fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    char *split = emit_split(ctx, m);
    int row = count_members(split, "fg_mask_row"), col = count_members(split, "fg_mask_col");
    assert_true(row + col + count_members(split, "fg_mask_head") <= 256);
    assert_true(row > 100 && col > 100);
    /* t found no room: it is computed per element, as is kv_idx / 5. */
    char *body = function_body(split, "fg_mask_split0");
    assert_non_null(body);
    assert_non_null(strstr(body, "fg_idiv(q_idx, (7))"));
    assert_non_null(strstr(body, "fg_idiv(kv_idx, (5))"));
    free(body);
    free(split);
    compiles_beside_whole(ctx, m, 0, "the big mod");
    fg_mod_destroy(m);
    free(text);
    fg_ctx_destroy(ctx);
}

static void bad_arguments(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fgi_buf b = {0};
    assert_int_equal(fgi_emit_split(NULL, NULL, &b), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fgi_emit_split(ctx, NULL, &b), FG_ERR_INVALID_ARGUMENT);
    fgi_buf_free(&b);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gallery_table),
        cmocka_unit_test(composition_splits_per_leaf),
        cmocka_unit_test(tricky_mods_split), cmocka_unit_test(distance_form),
        cmocka_unit_test(fold_form),
        cmocka_unit_test(score_distance_form),
        cmocka_unit_test(score_element_cost),
        cmocka_unit_test(index_casts_rewritten), cmocka_unit_test(gallery_compiles),
        cmocka_unit_test(table_limit_degrades),
        cmocka_unit_test(bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
