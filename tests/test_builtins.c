/*
 * test_builtins.c -- every row of src/mod/builtins.def against what the row
 * promises, so that a new builtin cannot be half added.
 *
 * The rows are read with the X-macro, as every consumer reads them; for
 * each one:
 *  - the CUDA spellings exist: an fg_ name is defined as `FG_DEV ... name(`
 *    in templates/common.cuh, any other is one of the CUDA math functions of
 *    CUDA_MATH below (the accurate ones, never an __expf-style intrinsic);
 *    an approximate spelling (cuda_approx) is an fg_..._approx defined in
 *    templates/approx_math.cuh, for float-only functions, and every helper
 *    that file defines is some row's (or float division's);
 *  - include/flexgen/mod.h gives host C the canonical name: a macro, a
 *    function, or the <math.h> function of that name;
 *  - the CPU evaluator computes the row's c_float: at points whose value is
 *    known exactly (POINTS), and bit for bit as the row's c_float expression
 *    itself, compiled here, computes it at random points;
 *  - each derivative rule parses as a float expression of the parameters
 *    x, y, z; away from kinks and jumps it matches a central difference of
 *    the function in double, and at them (KINKS) it takes the value PyTorch
 *    autograd takes.
 * The per-builtin facts this file adds (points, the double version, where a
 * function is smooth) are keyed by FGI_FN_*; a row without them fails.
 */
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "mod/front.h"

/* ---- the table, as builtins.def gives it ------------------------------------ */

#define FGI_BUILTIN(ID, NAME, ARITY, GENERIC, C_INT, C_FLOAT, ...)                   \
    static float c_float_##ID(float x, float y, float z) {                            \
        (void)x;                                                                       \
        (void)y;                                                                       \
        (void)z;                                                                       \
        return C_FLOAT;                                                                \
    }
#include "mod/builtins.def"

typedef struct def_row {
    fgi_builtin fn;
    const char *name;
    int arity;
    bool generic;
    const char *cuda_int, *cuda_float, *cuda_approx;
    float (*c_float)(float x, float y, float z);
    const char *deriv[3];
} def_row;

static const def_row ROWS[] = {
#define FGI_BUILTIN(ID, NAME, ARITY, GENERIC, C_INT, C_FLOAT, CUDA_INT, CUDA_FLOAT, CUDA_APPROX, COSTLY, \
                    DX, DY, DZ)                                                                     \
    {FGI_FN_##ID, NAME, ARITY, GENERIC, CUDA_INT, CUDA_FLOAT, CUDA_APPROX, c_float_##ID, {DX, DY, DZ}},
#include "mod/builtins.def"
};
#define NROWS (sizeof ROWS / sizeof ROWS[0])

/* CUDA's device math functions a row may name without defining them. */
static const char *const CUDA_MATH[] = {
    "fabsf", "fminf", "fmaxf", "expf",  "exp2f", "logf",  "log2f",  "sqrtf", "tanhf",
    "floorf", "ceilf", "powf", "sinf", "cosf",  "roundf", "truncf", "fmodf",
};

/* <math.h>'s functions whose double spelling is the canonical name. */
static const char *const C_MATH[] = {
    "exp", "exp2", "log", "log2", "sqrt", "tanh", "floor",
    "ceil", "pow", "sin", "cos", "round", "trunc", "fmod",
};

static bool in_list(const char *const *list, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(list[i], name) == 0) return true;
    return false;
}

/* ---- reading the other two files ------------------------------------------- */

static char *slurp(const char *rel) {
    char *text = tu_read_file(tu_path(rel));
    if (!text) fail_msg("cannot read %s (FLEXGEN_SOURCE_ROOT=%s)", tu_path(rel), tu_source_root());
    return text;
}

/* Whether the line starting at `line` opens with `prefix` and names
 * `name` as the function it declares: the identifier right before its
 * first '(' (so `return fg_imin(` inside a body does not count). */
static bool declares(const char *line, const char *prefix, const char *name) {
    size_t plen = strlen(prefix);
    if (strncmp(line, prefix, plen) != 0) return false;
    const char *end = strchr(line, '\n');
    const char *paren = strchr(line, '(');
    if (!paren || (end && paren > end)) return false;
    const char *id = paren;
    while (id > line + plen && (id[-1] == '_' || (id[-1] >= 'a' && id[-1] <= 'z') ||
                                (id[-1] >= 'A' && id[-1] <= 'Z') || (id[-1] >= '0' && id[-1] <= '9')))
        id--;
    return (size_t)(paren - id) == strlen(name) && strncmp(id, name, strlen(name)) == 0;
}

static bool any_line_declares(const char *text, const char *prefix, const char *name) {
    for (const char *line = text; line && *line;) {
        if (declares(line, prefix, name)) return true;
        line = strchr(line, '\n');
        if (line) line++;
    }
    return false;
}

/* ---- the table itself ------------------------------------------------------- */

/* ROWS and what builtins.c serves from the same file agree, and every row is
 * well formed. */
static void test_rows(void **state) {
    (void)state;
    assert_int_equal(NROWS, FGI_FN_COUNT);
    for (size_t i = 0; i < NROWS; i++) {
        const def_row *r = &ROWS[i];
        const fgi_builtin_info *bi = fgi_builtin_get(r->fn);
        assert_int_equal(r->fn, (int)i);
        assert_non_null(bi);
        assert_string_equal(bi->name, r->name);
        assert_int_equal(bi->arity, r->arity);
        assert_true(r->arity >= 1 && r->arity <= 3);
        bool force_float = true;
        assert_int_equal(fgi_builtin_lookup(r->name, &force_float), (int)r->fn);
        assert_false(force_float);
        /* an int version exactly when the row is generic */
        if (r->generic != (r->cuda_int != NULL))
            fail_msg("%s: generic is %d but cuda_int is %s", r->name, r->generic,
                     r->cuda_int ? r->cuda_int : "NULL");
        assert_non_null(r->cuda_float);
        for (int k = 0; k < 3; k++) {
            assert_non_null(bi->deriv[k]);
            assert_string_equal(bi->deriv[k], r->deriv[k]);
            if ((k < r->arity) != (*r->deriv[k] != 0))
                fail_msg("%s: derivative rule %d is \"%s\" with arity %d", r->name, k, r->deriv[k],
                         r->arity);
        }
    }
    assert_null(fgi_builtin_get(FGI_FN_COUNT));
    assert_null(fgi_builtin_get(-1));
}

/* ---- a: the CUDA spellings exist -------------------------------------------- */

static void check_cuda_name(const char *common, const char *builtin, const char *name) {
    if (strncmp(name, "fg_", 3) == 0) {
        if (!any_line_declares(common, "FG_DEV ", name))
            fail_msg("%s: %s is not defined as `FG_DEV ... %s(` in templates/common.cuh", builtin,
                     name, name);
    } else if (!in_list(CUDA_MATH, sizeof CUDA_MATH / sizeof CUDA_MATH[0], name)) {
        fail_msg("%s: %s is neither an fg_ helper nor one of the CUDA math functions", builtin, name);
    }
}

static void test_cuda_spellings(void **state) {
    (void)state;
    char *common = slurp("templates/common.cuh");
    for (size_t i = 0; i < NROWS; i++) {
        const def_row *r = &ROWS[i];
        check_cuda_name(common, r->name, r->cuda_float);
        if (r->cuda_int) check_cuda_name(common, r->name, r->cuda_int);
        /* the emitter asks for the same names by result type */
        assert_string_equal(fgi_emit_builtin_fn(r->fn, FGI_T_FLOAT), r->cuda_float);
        if (r->cuda_int) assert_string_equal(fgi_emit_builtin_fn(r->fn, FGI_T_INT), r->cuda_int);
        else assert_null(fgi_emit_builtin_fn(r->fn, FGI_T_INT));
    }
    /* the check itself: a call inside a body is no definition */
    assert_true(any_line_declares(common, "FG_DEV ", "fg_iclamp"));
    assert_false(declares("FG_DEV int fg_iclamp(int x) { return fg_imin(x, 0); }\n", "FG_DEV ",
                          "fg_imin"));
    free(common);
}

/* Approximate math: a row's cuda_approx is a float-only builtin's
 * fg_..._approx of templates/approx_math.cuh (none of common.cuh's: the
 * accurate sources do not carry that file), the builtins whose fast
 * versions have no bound over the whole range keep their accurate
 * spelling, and approx_math.cuh defines nothing but the rows' helpers and
 * float division's. */
static void test_approx_spellings(void **state) {
    (void)state;
    char *approx = slurp("templates/approx_math.cuh"), *common = slurp("templates/common.cuh");
    const char *seen[NROWS + 1];
    size_t nseen = 0;
    for (size_t i = 0; i < NROWS; i++) {
        const def_row *r = &ROWS[i];
        const fgi_builtin_info *bi = fgi_builtin_get(r->fn);
        if ((bi->cuda_approx == NULL) != (r->cuda_approx == NULL) ||
            (r->cuda_approx && strcmp(bi->cuda_approx, r->cuda_approx) != 0))
            fail_msg("%s: builtins.c serves another cuda_approx than builtins.def's", r->name);
        if (!r->cuda_approx) continue;
        size_t n = strlen(r->cuda_approx);
        if (strncmp(r->cuda_approx, "fg_", 3) != 0 || n < 10 || strcmp(r->cuda_approx + n - 7, "_approx") != 0)
            fail_msg("%s: cuda_approx %s is not an fg_..._approx name", r->name, r->cuda_approx);
        if (!any_line_declares(approx, "FG_DEV float ", r->cuda_approx))
            fail_msg("%s: %s is not defined as `FG_DEV float %s(` in templates/approx_math.cuh", r->name,
                     r->cuda_approx, r->cuda_approx);
        if (any_line_declares(common, "FG_DEV ", r->cuda_approx))
            fail_msg("%s: %s belongs in approx_math.cuh, not common.cuh", r->name, r->cuda_approx);
        if (r->generic) fail_msg("%s: an approximate spelling for a function with an int version", r->name);
        seen[nseen++] = r->cuda_approx;
    }
    /* tanh is the reason the option exists; pow, sin and cos stay accurate */
    assert_string_equal(fgi_builtin_get(FGI_FN_TANH)->cuda_approx, "fg_tanh_approx");
    assert_null(fgi_builtin_get(FGI_FN_POW)->cuda_approx);
    assert_null(fgi_builtin_get(FGI_FN_SIN)->cuda_approx);
    assert_null(fgi_builtin_get(FGI_FN_COS)->cuda_approx);
    seen[nseen++] = "fg_fdiv_approx";
    assert_true(any_line_declares(approx, "FG_DEV float ", "fg_fdiv_approx"));
    for (const char *line = approx; line && *line;) {
        if (strncmp(line, "FG_DEV ", 7) == 0) {
            bool known = false;
            for (size_t k = 0; k < nseen && !known; k++) known = declares(line, "FG_DEV ", seen[k]);
            if (!known) fail_msg("templates/approx_math.cuh defines a helper no row spells: %.60s", line);
        }
        line = strchr(line, '\n');
        if (line) line++;
    }
    free(approx);
    free(common);
}

/* ---- b: host C knows every canonical name ------------------------------------ */

static void test_host_header(void **state) {
    (void)state;
    char *header = slurp("include/flexgen/mod.h");
    for (size_t i = 0; i < NROWS; i++) {
        const char *name = ROWS[i].name;
        if (any_line_declares(header, "#define ", name)) continue;
        if (any_line_declares(header, "static inline ", name)) continue;
        if (in_list(C_MATH, sizeof C_MATH / sizeof C_MATH[0], name)) continue;
        fail_msg("%s: include/flexgen/mod.h neither defines it nor gets it from <math.h>", name);
    }
    free(header);
}

/* ---- evaluating through the mod language -------------------------------------- */

static const fg_param_decl XYZ[3] = {{"x", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0},
                                     {"y", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0},
                                     {"z", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0}};

/* A score_mod of the float parameters x, y, z (the score is not used). */
static fg_mod *xyz_mod(fg_ctx *ctx, const char *expr) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_expr(ctx, FG_SCORE_MOD, expr, XYZ, 3, &m);
    if (st != FG_OK)
        fail_msg("\"%s\" does not parse as a float expression of x, y, z: %s\n%s", expr,
                 fg_status_string(st), fg_error_diagnostic(ctx));
    return m;
}

static float eval_xyz(fg_ctx *ctx, const fg_mod *m, float x, float y, float z) {
    fg_binding bd[3] = {fg_bind_float("x", x), fg_bind_float("y", y), fg_bind_float("z", z)};
    float in = 0.0f, out = -12345.0f;
    fg_status st = fg_mod_eval_score(ctx, m, bd, 3, 0, 0, 0, 1, 0, 1, &in, &out);
    if (st != FG_OK) fail_msg("%s: %s", fg_mod_canonical(m), fg_errmsg(ctx));
    return out;
}

/* The builtin called on x (, y (, z)). */
static fg_mod *call_mod(fg_ctx *ctx, const def_row *r) {
    static const char *const args[4] = {"", "(x)", "(x, y)", "(x, y, z)"};
    char expr[64];
    snprintf(expr, sizeof expr, "%s%s", r->name, args[r->arity]);
    return xyz_mod(ctx, expr);
}

static bool same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- where each function is smooth, and its double version ------------------- */

/* Distance from x to the nearest multiple of `step` shifted by `offset`. */
static double grid_distance(double x, double step, double offset) {
    double t = (x - offset) / step;
    return fabs(t - nearbyint(t)) * step;
}

/* Whether fn is smooth in a neighbourhood of (x, y, z) wide enough for a
 * difference quotient: away from kinks, jumps and the edge of the domain. */
static bool smooth_at(fgi_builtin fn, double x, double y, double z) {
    const double gap = 0.1;
    switch (fn) {
    case FGI_FN_ABS: return fabs(x) > gap;
    case FGI_FN_MIN:
    case FGI_FN_MAX: return fabs(x - y) > gap;
    case FGI_FN_CLAMP: return fabs(x - y) > gap && fabs(x - z) > gap && fabs(y - z) > gap;
    case FGI_FN_LOG:
    case FGI_FN_LOG2:
    case FGI_FN_SQRT:
    case FGI_FN_RSQRT:
    case FGI_FN_POW: return x > gap;
    case FGI_FN_FLOOR:
    case FGI_FN_CEIL:
    case FGI_FN_TRUNC: return grid_distance(x, 1.0, 0.0) > gap;
    case FGI_FN_ROUND: return grid_distance(x, 1.0, 0.5) > gap;
    case FGI_FN_FMOD: return fabs(y) > 0.5 && grid_distance(x / y, 1.0, 0.0) > 0.05;
    default: return true;
    }
}

/* The function in double, for the difference quotients. */
static double host_double(fgi_builtin fn, double x, double y, double z) {
    switch (fn) {
    case FGI_FN_ABS: return fabs(x);
    case FGI_FN_MIN: return fmin(x, y);
    case FGI_FN_MAX: return fmax(x, y);
    case FGI_FN_CLAMP: return fmin(fmax(x, y), z);
    case FGI_FN_EXP: return exp(x);
    case FGI_FN_EXP2: return exp2(x);
    case FGI_FN_LOG: return log(x);
    case FGI_FN_LOG2: return log2(x);
    case FGI_FN_SQRT: return sqrt(x);
    case FGI_FN_RSQRT: return 1.0 / sqrt(x);
    case FGI_FN_TANH: return tanh(x);
    case FGI_FN_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case FGI_FN_FLOOR: return floor(x);
    case FGI_FN_CEIL: return ceil(x);
    case FGI_FN_POW: return pow(x, y);
    case FGI_FN_SIN: return sin(x);
    case FGI_FN_COS: return cos(x);
    case FGI_FN_ROUND: return round(x);
    case FGI_FN_TRUNC: return trunc(x);
    case FGI_FN_FMOD: return fmod(x, y);
    case FGI_FN_COUNT: break;
    }
    (void)z;
    fail_msg("builtin %d has no double version in test_builtins.c", (int)fn);
    return NAN;
}

/* A random point in [-3, 3]^3, rounded to floats, where fn is smooth. */
static void sample(fgi_builtin fn, uint64_t *rng, float v[3]) {
    for (int tries = 0; tries < 10000; tries++) {
        for (int i = 0; i < 3; i++) v[i] = (float)(6.0 * tu_rand_uniform(rng) - 3.0);
        if (smooth_at(fn, v[0], v[1], v[2])) return;
    }
    fail_msg("no smooth point found for builtin %d", (int)fn);
}

/* ---- c: the evaluator computes c_float ------------------------------------------ */

typedef struct point_row {
    fgi_builtin fn;
    float x, y, z;
    float want; /* exact */
} point_row;

static const point_row POINTS[] = {
    {FGI_FN_ABS, -2.5f, 0, 0, 2.5f},
    {FGI_FN_ABS, -0.0f, 0, 0, 0.0f},
    {FGI_FN_ABS, 3.0f, 0, 0, 3.0f},
    {FGI_FN_MIN, 1.0f, 2.0f, 0, 1.0f},
    {FGI_FN_MIN, -1.0f, -3.0f, 0, -3.0f},
    {FGI_FN_MIN, NAN, 2.0f, 0, 2.0f}, /* a NaN argument is ignored */
    {FGI_FN_MAX, 1.0f, 2.0f, 0, 2.0f},
    {FGI_FN_MAX, 2.0f, NAN, 0, 2.0f},
    {FGI_FN_CLAMP, 5.0f, 0.0f, 3.0f, 3.0f},
    {FGI_FN_CLAMP, -1.0f, 0.0f, 3.0f, 0.0f},
    {FGI_FN_CLAMP, 2.0f, 0.0f, 3.0f, 2.0f},
    {FGI_FN_CLAMP, 2.0f, 3.0f, 1.0f, 1.0f}, /* lo > hi: hi wins */
    {FGI_FN_EXP, 0.0f, 0, 0, 1.0f},
    {FGI_FN_EXP, -INFINITY, 0, 0, 0.0f},
    {FGI_FN_EXP2, 3.0f, 0, 0, 8.0f},
    {FGI_FN_EXP2, -1.0f, 0, 0, 0.5f},
    {FGI_FN_LOG, 1.0f, 0, 0, 0.0f},
    {FGI_FN_LOG, 0.0f, 0, 0, -INFINITY},
    {FGI_FN_LOG2, 8.0f, 0, 0, 3.0f},
    {FGI_FN_LOG2, 0.25f, 0, 0, -2.0f},
    {FGI_FN_SQRT, 9.0f, 0, 0, 3.0f},
    {FGI_FN_SQRT, 2.25f, 0, 0, 1.5f},
    {FGI_FN_SQRT, -1.0f, 0, 0, NAN},
    {FGI_FN_RSQRT, 4.0f, 0, 0, 0.5f},
    {FGI_FN_RSQRT, 0.25f, 0, 0, 2.0f},
    {FGI_FN_RSQRT, 0.0f, 0, 0, INFINITY},
    {FGI_FN_TANH, 0.0f, 0, 0, 0.0f},
    {FGI_FN_TANH, INFINITY, 0, 0, 1.0f},
    {FGI_FN_SIGMOID, 0.0f, 0, 0, 0.5f},
    {FGI_FN_SIGMOID, -INFINITY, 0, 0, 0.0f},
    {FGI_FN_FLOOR, -1.5f, 0, 0, -2.0f},
    {FGI_FN_FLOOR, 2.7f, 0, 0, 2.0f},
    {FGI_FN_CEIL, -1.5f, 0, 0, -1.0f},
    {FGI_FN_CEIL, 2.2f, 0, 0, 3.0f},
    {FGI_FN_ROUND, 2.5f, 0, 0, 3.0f}, /* half away from zero */
    {FGI_FN_ROUND, -2.5f, 0, 0, -3.0f},
    {FGI_FN_ROUND, 0.49999997f, 0, 0, 0.0f},
    {FGI_FN_TRUNC, -1.7f, 0, 0, -1.0f},
    {FGI_FN_TRUNC, 1.7f, 0, 0, 1.0f},
    {FGI_FN_POW, 2.0f, 10.0f, 0, 1024.0f},
    {FGI_FN_POW, 9.0f, 0.5f, 0, 3.0f},
    {FGI_FN_POW, 2.0f, -2.0f, 0, 0.25f},
    {FGI_FN_POW, 0.0f, 0.0f, 0, 1.0f},
    {FGI_FN_SIN, 0.0f, 0, 0, 0.0f},
    {FGI_FN_COS, 0.0f, 0, 0, 1.0f},
    {FGI_FN_FMOD, 7.0f, 3.0f, 0, 1.0f},
    {FGI_FN_FMOD, -7.0f, 3.0f, 0, -1.0f}, /* the sign of x */
    {FGI_FN_FMOD, 7.5f, -2.0f, 0, 1.5f},
};
#define NPOINTS (sizeof POINTS / sizeof POINTS[0])

static void test_evaluator(void **state) {
    fg_ctx *ctx = *state;
    for (size_t i = 0; i < NROWS; i++) {
        const def_row *r = &ROWS[i];
        fg_mod *m = call_mod(ctx, r);
        int known = 0;
        for (size_t j = 0; j < NPOINTS; j++) {
            const point_row *p = &POINTS[j];
            if (p->fn != r->fn) continue;
            known++;
            float got = eval_xyz(ctx, m, p->x, p->y, p->z);
            float c = r->c_float(p->x, p->y, p->z);
            if (!same_float(got, p->want) || !same_float(c, p->want))
                fail_msg("%s(%g, %g, %g): want %.9g, evaluator %.9g, c_float %.9g", r->name,
                         (double)p->x, (double)p->y, (double)p->z, (double)p->want, (double)got,
                         (double)c);
        }
        if (known == 0) fail_msg("%s: no row in POINTS", r->name);
        uint64_t rng = 0x5eed0000u + (uint64_t)i;
        for (int n = 0; n < 20; n++) {
            float v[3];
            sample(r->fn, &rng, v);
            float got = eval_xyz(ctx, m, v[0], v[1], v[2]);
            float c = r->c_float(v[0], v[1], v[2]);
            if (!same_float(got, c))
                fail_msg("%s(%.9g, %.9g, %.9g): evaluator %.9g, c_float %.9g", r->name, (double)v[0],
                         (double)v[1], (double)v[2], (double)got, (double)c);
        }
        fg_mod_destroy(m);
    }
}

/* ---- d: the derivative rules --------------------------------------------------- */

/* Away from kinks: each rule against the central difference of the double
 * function, relative error 1e-3 (absolute near zero). */
static void test_derivatives_smooth(void **state) {
    fg_ctx *ctx = *state;
    for (size_t i = 0; i < NROWS; i++) {
        const def_row *r = &ROWS[i];
        const fgi_builtin_info *bi = fgi_builtin_get(r->fn);
        uint64_t rng = 0xd1ff0000u + (uint64_t)i;
        for (int k = 0; k < r->arity; k++) {
            fg_mod *rule = xyz_mod(ctx, bi->deriv[k]);
            for (int n = 0; n < 40; n++) {
                float v[3];
                sample(r->fn, &rng, v);
                double lo[3] = {v[0], v[1], v[2]}, hi[3] = {v[0], v[1], v[2]};
                double h = 1e-5 * fmax(1.0, fabs((double)v[k]));
                lo[k] -= h;
                hi[k] += h;
                double want = (host_double(r->fn, hi[0], hi[1], hi[2]) -
                               host_double(r->fn, lo[0], lo[1], lo[2])) / (2.0 * h);
                double got = eval_xyz(ctx, rule, v[0], v[1], v[2]);
                if (!(fabs(got - want) <= 1e-3 * fmax(fabs(want), 1e-2)))
                    fail_msg("d %s / d arg %d at (%.9g, %.9g, %.9g): rule \"%s\" gives %.9g, "
                             "the difference quotient %.9g",
                             r->name, k, (double)v[0], (double)v[1], (double)v[2], bi->deriv[k], got,
                             want);
            }
            fg_mod_destroy(rule);
        }
    }
}

typedef struct kink_row {
    fgi_builtin fn;
    int arg;   /* d / d argument `arg` */
    float x, y, z;
    float want;
    const char *why;
} kink_row;

/* PyTorch autograd's values where the functions are not differentiable
 * (torch/csrc/autograd/FunctionsManual.cpp and derivatives.yaml): abs by
 * sgn; minimum / maximum split a tie; clamp with tensor bounds by
 * clamp_backward (x: lo <= x <= hi) and clamp_backward_min_max (lo: x < lo
 * while lo < hi; hi: x > hi, or hi < lo); the rounding functions 0; fmod
 * 1 and -trunc(x / y) on both sides of a jump; pow_backward_self /
 * _exponent at x == 0; sqrt and log by their formulas at 0. */
static const kink_row KINKS[] = {
    {FGI_FN_ABS, 0, 0.0f, 0, 0, 0.0f, "abs'(0) = sgn(0)"},
    {FGI_FN_ABS, 0, -0.0f, 0, 0, 0.0f, "abs'(-0) = sgn(-0)"},
    {FGI_FN_ABS, 0, -2.0f, 0, 0, -1.0f, "abs' < 0"},
    {FGI_FN_MIN, 0, 1.0f, 1.0f, 0, 0.5f, "min tie"},
    {FGI_FN_MIN, 1, 1.0f, 1.0f, 0, 0.5f, "min tie"},
    {FGI_FN_MIN, 0, 1.0f, 2.0f, 0, 1.0f, "min from x"},
    {FGI_FN_MIN, 1, 1.0f, 2.0f, 0, 0.0f, "min not from y"},
    {FGI_FN_MAX, 0, -1.0f, -1.0f, 0, 0.5f, "max tie"},
    {FGI_FN_MAX, 1, -1.0f, -1.0f, 0, 0.5f, "max tie"},
    {FGI_FN_MAX, 0, 1.0f, 2.0f, 0, 0.0f, "max not from x"},
    {FGI_FN_MAX, 1, 1.0f, 2.0f, 0, 1.0f, "max from y"},
    /* clamp(x, lo = 1, hi = 3) */
    {FGI_FN_CLAMP, 0, 1.0f, 1.0f, 3.0f, 1.0f, "clamp, x at lo"},
    {FGI_FN_CLAMP, 1, 1.0f, 1.0f, 3.0f, 0.0f, "clamp, x at lo"},
    {FGI_FN_CLAMP, 2, 1.0f, 1.0f, 3.0f, 0.0f, "clamp, x at lo"},
    {FGI_FN_CLAMP, 0, 3.0f, 1.0f, 3.0f, 1.0f, "clamp, x at hi"},
    {FGI_FN_CLAMP, 1, 3.0f, 1.0f, 3.0f, 0.0f, "clamp, x at hi"},
    {FGI_FN_CLAMP, 2, 3.0f, 1.0f, 3.0f, 0.0f, "clamp, x at hi"},
    {FGI_FN_CLAMP, 0, 0.0f, 1.0f, 3.0f, 0.0f, "clamp, x below lo"},
    {FGI_FN_CLAMP, 1, 0.0f, 1.0f, 3.0f, 1.0f, "clamp, x below lo"},
    {FGI_FN_CLAMP, 2, 0.0f, 1.0f, 3.0f, 0.0f, "clamp, x below lo"},
    {FGI_FN_CLAMP, 0, 4.0f, 1.0f, 3.0f, 0.0f, "clamp, x above hi"},
    {FGI_FN_CLAMP, 1, 4.0f, 1.0f, 3.0f, 0.0f, "clamp, x above hi"},
    {FGI_FN_CLAMP, 2, 4.0f, 1.0f, 3.0f, 1.0f, "clamp, x above hi"},
    {FGI_FN_CLAMP, 0, 2.0f, 3.0f, 1.0f, 0.0f, "clamp, lo > hi"},
    {FGI_FN_CLAMP, 1, 2.0f, 3.0f, 1.0f, 0.0f, "clamp, lo > hi"},
    {FGI_FN_CLAMP, 2, 2.0f, 3.0f, 1.0f, 1.0f, "clamp, lo > hi"},
    {FGI_FN_CLAMP, 0, 1.0f, 1.0f, 1.0f, 1.0f, "clamp, x = lo = hi"},
    {FGI_FN_CLAMP, 1, 1.0f, 1.0f, 1.0f, 0.0f, "clamp, x = lo = hi"},
    {FGI_FN_CLAMP, 2, 1.0f, 1.0f, 1.0f, 0.0f, "clamp, x = lo = hi"},
    {FGI_FN_CLAMP, 0, 0.0f, 1.0f, 1.0f, 0.0f, "clamp, x below lo = hi"},
    {FGI_FN_CLAMP, 1, 0.0f, 1.0f, 1.0f, 0.0f, "clamp, x below lo = hi"},
    {FGI_FN_CLAMP, 2, 0.0f, 1.0f, 1.0f, 0.0f, "clamp, x below lo = hi"},
    {FGI_FN_CLAMP, 0, 2.0f, 1.0f, 1.0f, 0.0f, "clamp, x above lo = hi"},
    {FGI_FN_CLAMP, 1, 2.0f, 1.0f, 1.0f, 0.0f, "clamp, x above lo = hi"},
    {FGI_FN_CLAMP, 2, 2.0f, 1.0f, 1.0f, 1.0f, "clamp, x above lo = hi"},
    /* the rounding functions: 0 everywhere, jumps included */
    {FGI_FN_FLOOR, 0, 2.0f, 0, 0, 0.0f, "floor at an integer"},
    {FGI_FN_FLOOR, 0, -0.5f, 0, 0, 0.0f, "floor"},
    {FGI_FN_CEIL, 0, 2.0f, 0, 0, 0.0f, "ceil at an integer"},
    {FGI_FN_CEIL, 0, 0.25f, 0, 0, 0.0f, "ceil"},
    {FGI_FN_ROUND, 0, 2.5f, 0, 0, 0.0f, "round at a half"},
    {FGI_FN_ROUND, 0, -1.0f, 0, 0, 0.0f, "round"},
    {FGI_FN_TRUNC, 0, 3.0f, 0, 0, 0.0f, "trunc at an integer"},
    {FGI_FN_TRUNC, 0, -0.75f, 0, 0, 0.0f, "trunc"},
    /* fmod at and beside its jumps (x / y an integer) */
    {FGI_FN_FMOD, 0, 6.0f, 3.0f, 0, 1.0f, "fmod at a jump"},
    {FGI_FN_FMOD, 1, 6.0f, 3.0f, 0, -2.0f, "fmod at a jump"},
    {FGI_FN_FMOD, 1, -6.0f, 3.0f, 0, 2.0f, "fmod at a jump, x < 0"},
    {FGI_FN_FMOD, 1, 7.0f, 3.0f, 0, -2.0f, "fmod"},
    {FGI_FN_FMOD, 1, 7.0f, -3.0f, 0, 2.0f, "fmod, y < 0"},
    {FGI_FN_FMOD, 1, 1.0f, 3.0f, 0, 0.0f, "fmod, |x| < |y|"},
    /* pow at x == 0 */
    {FGI_FN_POW, 0, 0.0f, 2.0f, 0, 0.0f, "pow, x = 0"},
    {FGI_FN_POW, 0, 0.0f, 0.0f, 0, 0.0f, "pow, y = 0"},
    {FGI_FN_POW, 0, 3.0f, 0.0f, 0, 0.0f, "pow, y = 0"},
    {FGI_FN_POW, 1, 0.0f, 2.0f, 0, 0.0f, "pow, x = 0, y >= 0"},
    {FGI_FN_POW, 1, 0.0f, 0.0f, 0, 0.0f, "pow, x = 0, y >= 0"},
    /* the edge of the domain */
    {FGI_FN_SQRT, 0, 0.0f, 0, 0, INFINITY, "sqrt at 0"},
    {FGI_FN_LOG, 0, 0.0f, 0, 0, INFINITY, "log at 0"},
};
#define NKINKS (sizeof KINKS / sizeof KINKS[0])

static void test_derivatives_at_kinks(void **state) {
    fg_ctx *ctx = *state;
    for (size_t i = 0; i < NKINKS; i++) {
        const kink_row *kr = &KINKS[i];
        const fgi_builtin_info *bi = fgi_builtin_get(kr->fn);
        assert_non_null(bi);
        assert_true(kr->arg < bi->arity);
        fg_mod *rule = xyz_mod(ctx, bi->deriv[kr->arg]);
        float got = eval_xyz(ctx, rule, kr->x, kr->y, kr->z);
        if (!(got == kr->want))
            fail_msg("%s (row %zu): d %s / d arg %d at (%g, %g, %g) is %g, PyTorch takes %g "
                     "(rule \"%s\")",
                     kr->why, i, bi->name, kr->arg, (double)kr->x, (double)kr->y, (double)kr->z,
                     (double)got, (double)kr->want, bi->deriv[kr->arg]);
        fg_mod_destroy(rule);
    }
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
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_cuda_spellings),
        cmocka_unit_test(test_approx_spellings),
        cmocka_unit_test(test_host_header),
        cmocka_unit_test(test_evaluator),
        cmocka_unit_test(test_derivatives_smooth),
        cmocka_unit_test(test_derivatives_at_kinks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
