/* test_emit.c -- the emitter, source assembly and the command-line tool.
 *
 *  - golden files: the emitted mod and the whole attention source of three
 *    gallery mods, byte for byte (scripts/update_golden.sh regenerates);
 *  - how each operator of the mod language is spelled in CUDA (a table);
 *  - the parameter struct: the host's offsets appear as static_asserts, and
 *    NVRTC accepts them -- and rejects a source where they are wrong;
 *  - every gallery mod's kernels (attention forward and block mask) compile
 *    with NVRTC for sm_80 and sm_90a: this is where a broken template fails;
 *  - configs: validation, and what does and does not change the cache key;
 *  - approximate math: its own key, name, macro and template for every
 *    kind that runs score_mod, the accurate kernels untouched, mask_mod
 *    never approximated, and each such kind compiling with it;
 *  - the Hopper backward's block orders (-lead, -pairs): the same for them;
 *  - the CLI as a subprocess: exit codes and the caret diagnostic.
 * The test runs in the source root, so mod paths (and the file names in the
 * golden files) are relative: mods/causal.c. */
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention/attention.h"
#include "blockmask/blockmask.h"
#include "codegen.h"
#include "internal.h"

static fg_ctx *new_ctx(void) {
    fg_ctx *ctx = NULL;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    return ctx;
}

static fg_mod *load(fg_ctx *ctx, const char *path) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_file(ctx, path, &m);
    if (st != FG_OK) {
        print_error("%s: %s\n", path, fg_error_diagnostic(ctx));
        fail();
    }
    return m;
}

static char *emit_mod(fg_ctx *ctx, const fg_mod *m) {
    fgi_buf b = {0};
    fg_status st = fgi_emit_mod(ctx, m, &b);
    if (st != FG_OK) print_error("emit: %s\n", fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    return fgi_buf_take(&b);
}

/* The first differing line, for a readable failure. */
static void assert_same_text(const char *got, const char *want, const char *what) {
    if (strcmp(got, want) == 0) return;
    int line = 1;
    size_t i = 0;
    while (got[i] && got[i] == want[i]) line += got[i++] == '\n';
    print_error("%s differs from its golden file at line %d (scripts/update_golden.sh "
                "regenerates after an intended change)\n",
                what, line);
    fail();
}

/* ---- golden files -------------------------------------------------------- */

static const char *const golden_mods[] = {"causal", "sliding_window", "alibi"};

static void test_golden(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    for (size_t i = 0; i < sizeof golden_mods / sizeof golden_mods[0]; i++) {
        char path[256], gpath[256];
        snprintf(path, sizeof path, "mods/%s.c", golden_mods[i]);
        fg_mod *m = load(ctx, path);

        snprintf(gpath, sizeof gpath, "tests/golden/%s.mod.cu", golden_mods[i]);
        char *want = tu_read_file(gpath);
        assert_non_null(want);
        char *got = emit_mod(ctx, m);
        assert_same_text(got, want, gpath);
        free(got);
        free(want);

        snprintf(gpath, sizeof gpath, "tests/golden/%s.attention_fwd.cu", golden_mods[i]);
        want = tu_read_file(gpath);
        assert_non_null(want);
        char *src = NULL;
        assert_int_equal(fg_generate_source(ctx, m, NULL, &src), FG_OK);
        assert_same_text(src, want, gpath);
        fg_free(src);
        free(want);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* ---- operators ------------------------------------------------------------- */

typedef struct spelling {
    fg_mod_kind kind;
    const char *expr;
    const char *emitted; /* must appear in the emitted return statement */
} spelling;

static const spelling spellings[] = {
    /* int arithmetic wraps; / and % are total; shifts mask their count */
    {FG_MASK_MOD, "q_idx + 1 > q_idx", "return fg_iadd(q_idx, 1) > q_idx;"},
    {FG_MASK_MOD, "q_idx - kv_idx <= N", "return fg_isub(q_idx, kv_idx) <= p.N;"},
    {FG_MASK_MOD, "q_idx * 3 == kv_idx", "return fg_imul(q_idx, 3) == kv_idx;"},
    {FG_MASK_MOD, "q_idx / N == kv_idx / N", "return fg_idiv_by(q_idx, p.fg_div_N) == fg_idiv_by(kv_idx, p.fg_div_N);"},
    {FG_MASK_MOD, "N / (q_idx + 1) >= 0", "return fg_idiv(p.N, fg_iadd(q_idx, 1)) >= 0;"},
    {FG_MASK_MOD, "q_idx % 2 == 0", "return fg_imod(q_idx, 2) == 0;"},
    {FG_MASK_MOD, "(q_idx << 2) > (kv_idx >> 1)", "return fg_shl(q_idx, 2) > fg_shr(kv_idx, 1);"},
    {FG_MASK_MOD, "-q_idx < kv_idx", "return fg_ineg(q_idx) < kv_idx;"},
    {FG_MASK_MOD, "abs(q_idx - kv_idx) <= N", "return fg_iabs(fg_isub(q_idx, kv_idx)) <= p.N;"},
    {FG_MASK_MOD, "min(q_idx, kv_idx) == max(b, h)", "return fg_imin(q_idx, kv_idx) == fg_imax(b, h);"},
    /* C spells these the same, with parentheses where operators mix */
    {FG_MASK_MOD, "q_idx >= kv_idx && kv_idx >= 0 || b == h",
     "return (q_idx >= kv_idx && kv_idx >= 0) || b == h;"},
    {FG_MASK_MOD, "(q_idx & 1) == (kv_idx ^ 3)", "return (q_idx & 1) == (kv_idx ^ 3);"},
    {FG_MASK_MOD, "!(q_idx < kv_idx)", "return !(q_idx < kv_idx);"},
    {FG_MASK_MOD, "q_idx > 0 ? kv_idx < q_idx : true", "return q_idx > 0 ? kv_idx < q_idx : true;"},
    /* implicit conversions are explicit; float -> int saturates */
    {FG_MASK_MOD, "q_idx", "return q_idx != 0;"},
    {FG_MASK_MOD, "(int)(F * (float)q_idx) > kv_idx", "return fg_f2i(fg_fmul(p.F, (float)q_idx)) > kv_idx;"},
    {FG_MASK_MOD, "ids[q_idx] == ids[kv_idx]",
     "return fg_load_i32(p.ids, p.fg_len_ids, q_idx) == fg_load_i32(p.ids, p.fg_len_ids, kv_idx);"},
    /* float arithmetic is one rounding per operator, never an FMA */
    {FG_SCORE_MOD, "score * F + 1.5", "return fg_fadd(fg_fmul(score, p.F), 1.5f);"},
    {FG_SCORE_MOD, "score / F - 0.25", "return fg_fsub(fg_fdiv_by(score, p.F, p.fg_rcp_F), 0.25f);"},
    {FG_SCORE_MOD, "F * tanh(score / F)", "return fg_fmul(p.F, tanhf(fg_fdiv_by(score, p.F, p.fg_rcp_F)));"},
    {FG_SCORE_MOD, "score + slopes[h] * (float)(kv_idx - q_idx)",
     "return fg_fadd(score, fg_fmul(fg_load_f32(p.slopes, p.fg_len_slopes, h), (float)fg_isub(kv_idx, q_idx)));"},
    {FG_SCORE_MOD, "sigmoid(score) + rsqrt(F)", "return fg_fadd(fg_sigmoid(score), fg_rsqrt(p.F));"},
    {FG_SCORE_MOD, "-score", "return -score;"},
    {FG_SCORE_MOD, "q_idx >= kv_idx ? score : -INFINITY", "return q_idx >= kv_idx ? score : __int_as_float(0xff800000);"},
    {FG_SCORE_MOD, "clamp(score, -F, F)", "return fg_fclamp(score, -p.F, p.F);"},
    {FG_SCORE_MOD, "exp2(score) * 0.1", "return fg_fmul(exp2f(score), 0.1f);"},
};

static const fg_param_decl spelling_params[] = {
    {"N", FG_PARAM_SCALAR, FG_TYPE_INT, 4},
    {"F", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 2},
    {"ids", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
    {"slopes", FG_PARAM_BUFFER, FG_TYPE_FLOAT, 0},
};

static void test_spellings(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    for (size_t i = 0; i < sizeof spellings / sizeof spellings[0]; i++) {
        const spelling *s = &spellings[i];
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_expr(ctx, s->kind, s->expr, spelling_params, 4, &m);
        if (st != FG_OK) print_error("'%s': %s\n", s->expr, fg_error_diagnostic(ctx));
        assert_int_equal(st, FG_OK);
        char *out = emit_mod(ctx, m);
        if (!strstr(out, s->emitted)) {
            print_error("'%s'\n  expected: %s\n  emitted:\n%s\n", s->expr, s->emitted, out);
            fail();
        }
        /* the other function is the neutral one */
        if (s->kind == FG_MASK_MOD) {
            assert_non_null(strstr(out, "#define FG_HAS_SCORE_MOD 0"));
            assert_non_null(strstr(out, "    return score;\n"));
        } else {
            assert_non_null(strstr(out, "#define FG_HAS_MASK_MOD 0"));
            assert_non_null(strstr(out, "    return true;\n"));
        }
        free(out);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The most spill stores the Hopper forward may report. ptxas reports the
 * kernel as a whole; the part that spills is the producer warp group's
 * scheduler (the persistent walk's tile and list state at the 24 or 32
 * registers setmaxnreg leaves it: 80-132 bytes, the same for every mod),
 * whose loads wait on nothing the consumers do. A consumer out of its 160
 * or 240 registers spills far more (softcap at three consumers: 384 bytes
 * in the element loop), and that is what the bound catches. */
#define FWD_SM90_SPILL_MAX 160

/* Whether ptxas's report on a Hopper kernel shows a fault: no report, a
 * serialised wgmma pipeline (C7514: a non-wgmma instruction touching a
 * product's registers between its issue and its wait; C7515: one defining
 * them there, such as a register copy where two paths join before the
 * wait; C7512: not enough registers to keep the products in flight; all
 * come as "info" lines, not warnings), setmaxnreg not in effect (C7508), or, for the forward, a
 * spill past FWD_SM90_SPILL_MAX (the backward spills a few bytes at head
 * dim 128 for some mods). */
static bool hopper_report_bad(const char *log, fg_kernel_kind kind) {
    if (!log || strstr(log, "C7514") || strstr(log, "C7515") || strstr(log, "C7512") || strstr(log, "C7508"))
        return true;
    if (kind != FG_KERNEL_ATTENTION_FWD_SM90) return false;
    const char *at = strstr(log, " bytes spill stores");
    if (!at) return true;
    while (at > log && at[-1] >= '0' && at[-1] <= '9') at--;
    return atoi(at) > FWD_SM90_SPILL_MAX;
}

/* The rule above on reports as ptxas writes them (`.` lines shortened). */
static void test_hopper_report_rule(void **state) {
    (void)state;
    static const struct {
        fg_kernel_kind kind;
        const char *log;
        bool bad;
    } cases[] = {
        {FG_KERNEL_ATTENTION_FWD_SM90, ". 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads", false},
        {FG_KERNEL_ATTENTION_FWD_SM90, ". 80 bytes stack frame, 124 bytes spill stores, 160 bytes spill loads", false},
        {FG_KERNEL_ATTENTION_FWD_SM90, ". 88 bytes stack frame, 160 bytes spill stores, 208 bytes spill loads", false},
        {FG_KERNEL_ATTENTION_FWD_SM90, ". 384 bytes stack frame, 384 bytes spill stores, 384 bytes spill loads", true},
        {FG_KERNEL_ATTENTION_FWD_SM90, ". 8 bytes stack frame, 1024 bytes spill stores, 0 bytes spill loads", true},
        {FG_KERNEL_ATTENTION_FWD_SM90, "ptxas info : (C7514) ... 0 bytes spill stores", true},
        {FG_KERNEL_ATTENTION_FWD_SM90, "ptxas info : (C7515) ... 0 bytes spill stores", true},
        {FG_KERNEL_ATTENTION_FWD_SM90, "no properties line", true},
        {FG_KERNEL_ATTENTION_BWD_SM90, ". 8 bytes stack frame, 384 bytes spill stores, 8 bytes spill loads", false},
        {FG_KERNEL_ATTENTION_BWD_SM90, "ptxas info : (C7508) ...", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (hopper_report_bad(cases[i].log, cases[i].kind) != cases[i].bad) print_error("case %zu\n", i);
        assert_int_equal(hopper_report_bad(cases[i].log, cases[i].kind), cases[i].bad);
    }
    assert_true(hopper_report_bad(NULL, FG_KERNEL_ATTENTION_BWD_SM90));
}

/* ---- an identity score_mod --------------------------------------------------- */

/* A score_mod that returns its score unchanged is emitted as none
 * (FG_HAS_SCORE_MOD 0): the kernels then fold the scale into the
 * exponential's multiplier instead of multiplying every score. */
static const struct {
    const char *src;
    int has_score; /* the FG_HAS_SCORE_MOD wanted */
} identity_cases[] = {
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }", 0},
    {"float score_mod(float s, int b, int h, int q, int k) { return s; }", 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return +score; }", 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return (float)score; }", 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    const float s = score;\n    float t = +s;\n    return (float)t;\n}",
     0},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }",
     0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return -score; }", 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score * 2.0f; }", 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return (float)q_idx; }", 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return (float)(int)score; }", 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    float s = score;\n    return s + 0.0f;\n}",
     1},
};

static void test_identity_score(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    for (size_t i = 0; i < sizeof identity_cases / sizeof identity_cases[0]; i++) {
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_source(ctx, "identity.c", identity_cases[i].src, (size_t)-1, &m);
        if (st != FG_OK) print_error("case %zu: %s\n", i, fg_error_diagnostic(ctx));
        assert_int_equal(st, FG_OK);
        assert_true(fg_mod_has_score(m)); /* the mod still has one */
        char *out = emit_mod(ctx, m);
        char want[64];
        snprintf(want, sizeof want, "#define FG_HAS_SCORE_MOD %d\n", identity_cases[i].has_score);
        if (!strstr(out, want)) {
            print_error("case %zu: expected %s in:\n%s\n", i, want, out);
            fail();
        }
        free(out);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* ---- #line and composition ------------------------------------------------- */

/* `m` compiles to PTX under `cfg` (no GPU needed); the log on failure. */
static void assert_compiles(fg_ctx *ctx, const fg_mod *m, const fg_kernel_config *cfg) {
    void *img = NULL;
    size_t size = 0;
    fg_status st = fg_compile(ctx, m, cfg, FG_EMIT_PTX, &img, &size);
    if (st != FG_OK) print_error("%s\n%s\n", fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    fg_free(img);
}

static void test_line_directives(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/natten.c");
    char *out = emit_mod(ctx, m);
    /* mods/natten.c: `int r = KERNEL / 2;` is line 18, the return line 25 */
    assert_non_null(strstr(out, "#line 18 \"mods/natten.c\"\n    const int l0 = fg_idiv(p.KERNEL, 2); /* r */\n"));
    assert_non_null(strstr(out, "#line 25 \"mods/natten.c\"\n    return "));
    /* after the body, the generated file's own numbering: the directive
     * names the line that follows it */
    const char *back = strstr(out, "#line ");
    while (back && strstr(back, "\"mods/natten.c\"") == strchr(back, '"')) back = strstr(back + 1, "#line ");
    assert_non_null(back);
    int n = 0;
    assert_int_equal(sscanf(back, "#line %d \"flexgen.cu\"", &n), 1);
    int actual = 1;
    for (const char *c = out; c < back; c++) actual += *c == '\n';
    assert_int_equal(n, actual + 1);
    free(out);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

static void test_composition(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *causal = load(ctx, "mods/causal.c");
    fg_mod *prefix = load(ctx, "mods/prefix_lm.c");
    fg_mod *sw = load(ctx, "mods/sliding_window.c");
    fg_mod *or_ = NULL, *and_ = NULL;
    assert_int_equal(fg_mod_or(ctx, prefix, sw, &or_), FG_OK);
    assert_int_equal(fg_mod_and(ctx, causal, or_, &and_), FG_OK);
    char *out = emit_mod(ctx, and_);
    assert_non_null(strstr(out, "bool fg_mask_part0("));
    assert_non_null(strstr(out, "bool fg_mask_part2("));
    assert_null(strstr(out, "bool fg_mask_part3("));
    assert_non_null(strstr(out, "return fg_mask_part0(p, b, h, q_idx, kv_idx) && "
                                "(fg_mask_part1(p, b, h, q_idx, kv_idx) || "
                                "fg_mask_part2(p, b, h, q_idx, kv_idx));"));
    /* each part keeps its own file for #line */
    assert_non_null(strstr(out, "\"mods/causal.c\""));
    assert_non_null(strstr(out, "\"mods/prefix_lm.c\""));
    assert_non_null(strstr(out, "\"mods/sliding_window.c\""));
    free(out);
    fg_kernel_config cfg = {FG_KERNEL_BLOCK_MASK, 0, 0, 64, 64, "sm_80"};
    assert_compiles(ctx, and_, &cfg);
    fg_mod_destroy(and_);
    fg_mod_destroy(or_);
    fg_mod_destroy(sw);
    fg_mod_destroy(prefix);
    fg_mod_destroy(causal);
    fg_ctx_destroy(ctx);
}

/* ---- the parameter struct ----------------------------------------------------- */

static const char layout_mod[] =
    "int A = 1;\n"
    "const float *B;\n"
    "float C = 2.0;\n"
    "const int *D;\n"
    "int E = 3;\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return D[q_idx] > A + E && (float)kv_idx < C * B[kv_idx];\n"
    "}\n";

/* The block-mask kernel of m as source, after checking that NVRTC compiles
 * it (its static_asserts hold the host's parameter layout); fg_free it. */
static char *block_mask_compiles(fg_ctx *ctx, const fg_mod *m, const char *name) {
    char *src = NULL;
    fg_kernel_config cfg = {FG_KERNEL_BLOCK_MASK, 0, 0, 0, 0, "sm_80"};
    assert_int_equal(fg_generate_source(ctx, m, &cfg, &src), FG_OK);
    void *img = NULL;
    size_t size = 0;
    fg_status st = fgi_nvrtc_compile(ctx, src, name, "sm_80", FG_EMIT_PTX, &img, &size, NULL);
    if (st != FG_OK) print_error("%s\n", fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    free(img);
    return src;
}

static void test_param_layout(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "layout.c", layout_mod, (size_t)-1, &m), FG_OK);
    fgi_param_layout layout;
    fgi_param_layout_compute(m, &layout);
    char *out = emit_mod(ctx, m);
    char line[160];
    for (int i = 0; i < m->nparams; i++) {
        snprintf(line, sizeof line, "static_assert(fg_offsetof(fg_mod_params, %s) == %zu,",
                 m->params[i].name, layout.offsets[i]);
        assert_non_null(strstr(out, line));
    }
    snprintf(line, sizeof line, "static_assert(sizeof(fg_mod_params) == %zu,", layout.size);
    assert_non_null(strstr(out, line));
    free(out);

    /* NVRTC agrees with the host ... */
    char *src = block_mask_compiles(ctx, m, "layout");
    void *img = NULL;
    size_t size = 0;
    /* ... and the asserts are live: a wrong offset does not compile */
    snprintf(line, sizeof line, "fg_offsetof(fg_mod_params, D) == %zu", layout.offsets[3]);
    char *hit = strstr(src, line);
    assert_non_null(hit);
    char *num = strstr(hit, "== ") + 3;
    num[0] = num[0] == '9' ? '1' : (char)(num[0] + 1);
    assert_int_equal(fgi_nvrtc_compile(ctx, src, "layout", "sm_80", FG_EMIT_PTX, &img, &size, NULL),
                     FG_ERR_COMPILE);
    assert_non_null(strstr(fg_compile_log(ctx), "static assertion failed"));
    fg_free(src);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* ---- launch geometry against the templates' layouts ------------------------------- */

/* The portable backward's passes and the decode walks check at compile
 * time that their launch geometry's shared memory (src/codegen/kernels.c,
 * printed as FG_LAUNCH_SMEM_<entry>) holds the layout they use, as the
 * Hopper kernels do: a geometry that falls short fails NVRTC instead of
 * reading past the block's shared memory. Every head dim class compiles,
 * and the check is live: the same source with half the entry's shared
 * memory does not. */
static void test_launch_geometry(void **state) {
    (void)state;
    static const struct {
        fg_kernel_kind kind;
        int head_dim;
        const char *entry;
    } cases[] = {
        {FG_KERNEL_ATTENTION_BWD, 64, "fg_attention_bwd_dkdv"},
        {FG_KERNEL_ATTENTION_BWD, 128, "fg_attention_bwd_dq_tiles"},
        {FG_KERNEL_ATTENTION_BWD, 256, "fg_attention_bwd_dkdv"},
        {FG_KERNEL_ATTENTION_DECODE, 64, "fg_attention_decode_r16"},
        {FG_KERNEL_ATTENTION_DECODE, 128, "fg_attention_decode_r16"},
        {FG_KERNEL_ATTENTION_DECODE, 256, "fg_attention_decode_r16"},
    };
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_kernel_config cfg = {cases[i].kind, 0, cases[i].head_dim, 0, 0, "sm_90a"};
        char *src = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &cfg, &src), FG_OK);
        void *img = NULL;
        size_t size = 0;
        fg_status st = fgi_nvrtc_compile(ctx, src, "geometry", "sm_90a", FG_EMIT_PTX, &img, &size, NULL);
        if (st != FG_OK) print_error("%s d%d: %s\n", cases[i].entry, cases[i].head_dim, fg_compile_log(ctx));
        assert_int_equal(st, FG_OK);
        free(img);

        char define[128];
        snprintf(define, sizeof define, "#define FG_LAUNCH_SMEM_%s ", cases[i].entry);
        const char *at = strstr(src, define);
        assert_non_null(at);
        const char *num = at + strlen(define);
        char *end = NULL;
        const long bytes = strtol(num, &end, 10);
        assert_true(bytes > 0);
        const size_t head = (size_t)(num - src), total = strlen(src);
        char *short_src = malloc(total + 32);
        assert_non_null(short_src);
        memcpy(short_src, src, head);
        const int w = snprintf(short_src + head, 32, "%ld", bytes / 2);
        memcpy(short_src + head + (size_t)w, end, strlen(end) + 1);
        img = NULL;
        assert_int_equal(fgi_nvrtc_compile(ctx, short_src, "geometry", "sm_90a", FG_EMIT_PTX, &img, &size, NULL),
                         FG_ERR_COMPILE);
        assert_non_null(strstr(fg_compile_log(ctx), "static assertion failed"));
        free(short_src);
        fg_free(src);
    }
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* Which forward kernels store O through a tensor map of out (the
 * geometry's o_map, which forward.c reads to encode one): the Hopper
 * forward at two consumers, and at three (head dim 64) where the mod has a
 * mask_mod (FGH_O_BUF); no other kernel. The template checks the host's
 * value with a static_assert: the first row's source with the value
 * flipped must not compile. */
static void test_o_map_rule(void **state) {
    (void)state;
    static const struct {
        fg_kernel_kind kind;
        const char *mod, *entry;
        int head_dim, want;
    } cases[] = {
        {FG_KERNEL_ATTENTION_FWD_SM90, "mods/causal.c", "fg_attention_fwd", 64, 1},
        {FG_KERNEL_ATTENTION_FWD_SM90, "mods/noop.c", "fg_attention_fwd", 64, 0},
        {FG_KERNEL_ATTENTION_FWD_SM90, "mods/softcap.c", "fg_attention_fwd", 64, 1}, /* two consumers */
        {FG_KERNEL_ATTENTION_FWD_SM90, "mods/noop.c", "fg_attention_fwd", 128, 1},
        {FG_KERNEL_ATTENTION_FWD_SM90, "mods/causal.c", "fg_attention_fwd", 256, 1},
        {FG_KERNEL_ATTENTION_FWD, "mods/causal.c", "fg_attention_fwd", 64, 0},
        {FG_KERNEL_ATTENTION_DECODE, "mods/causal.c", "fg_attention_decode_r16", 64, 0},
    };
    fg_ctx *ctx = new_ctx();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_mod *m = load(ctx, cases[i].mod);
        fg_kernel_config cfg = {cases[i].kind, 0, cases[i].head_dim, 0, 0, "sm_90a"};
        char *src = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &cfg, &src), FG_OK);
        char define[128];
        snprintf(define, sizeof define, "#define FG_LAUNCH_O_MAP_%s ", cases[i].entry);
        char *at = strstr(src, define);
        if (!at) print_error("%s d%d: no %s\n", cases[i].mod, cases[i].head_dim, define);
        assert_non_null(at);
        char *num = at + strlen(define);
        if (atoi(num) != cases[i].want)
            print_error("%s %s d%d: o_map %d, want %d\n", cases[i].mod, cases[i].entry, cases[i].head_dim, atoi(num),
                        cases[i].want);
        assert_int_equal(atoi(num), cases[i].want);
        if (i == 0) {
            *num = cases[i].want ? '0' : '1';
            void *img = NULL;
            size_t size = 0;
            assert_int_equal(fgi_nvrtc_compile(ctx, src, "o_map", "sm_90a", FG_EMIT_PTX, &img, &size, NULL),
                             FG_ERR_COMPILE);
            assert_non_null(strstr(fg_compile_log(ctx), "static assertion failed"));
            assert_non_null(strstr(fg_compile_log(ctx), "fwd_sm90_geometry's o_map"));
        }
        fg_free(src);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* ---- divisor parameters ---------------------------------------------------------- */

/* fg_iquot_by of templates/common.cuh, spelled in C. */
static int32_t quot_by(int32_t a, fgi_divisor v) {
    const uint32_t n = a < 0 ? 0u - (uint32_t)a : (uint32_t)a;
    const uint32_t q = (uint32_t)(((uint64_t)n * v.m) >> v.shift);
    return (a < 0) != (v.d < 0) ? (int32_t)(0u - q) : (int32_t)q;
}

/* fg_idiv / fg_imod's definitions: C's truncating division, total. */
static int32_t want_div(int32_t a, int32_t d) {
    if (d == 0) return 0;
    if (d == -1) return (int32_t)(0u - (uint32_t)a);
    return a / d;
}
static int32_t want_mod(int32_t a, int32_t d) { return d == 0 || d == -1 ? 0 : a % d; }

/* fg_divides_by of templates/common.cuh, spelled in C. */
static bool divides_by(int32_t a, fgi_divisor v) {
    const uint32_t r = v.rot & 31u, t = (uint32_t)a * v.inv + ((v.bound >> 1) << r);
    return (r ? (t >> r) | (t << (32u - r)) : t) <= v.bound;
}

static void check_division(int32_t a, int32_t d) {
    const fgi_divisor v = fgi_divisor_of(d);
    const int32_t q = v.zero ? 0 : quot_by(a, v);
    const int32_t r = (int32_t)((uint32_t)a - (uint32_t)quot_by(a, v) * (uint32_t)v.d);
    if (q != want_div(a, d) || r != want_mod(a, d))
        fail_msg("%d / %d: %d (want %d), %% %d (want %d); m %u shift %u", a, d, q, want_div(a, d), r,
                 want_mod(a, d), v.m, v.shift);
    if (divides_by(a, v) != (want_mod(a, d) == 0))
        fail_msg("%d %% %d == 0: %d (want %d); inv %u rot %u bound %u", a, d, divides_by(a, v),
                 want_mod(a, d) == 0, v.inv, v.rot, v.bound);
}

static void test_divisors(void **state) {
    (void)state;
    /* The host's magic numbers against exact division: every divisor up to
     * 2048 and its negative, powers of two and their neighbours, the
     * extremes, and random ones; dividends at the edges and near multiples. */
    int32_t ds[8192];
    int nd = 0;
    for (int32_t d = -2048; d <= 2048; d++) ds[nd++] = d;
    for (int k = 11; k <= 30; k++)
        for (int s = -1; s <= 1; s++) ds[nd++] = (int32_t)((1 << k) + s), ds[nd++] = -(int32_t)((1 << k) + s);
    ds[nd++] = INT32_MAX, ds[nd++] = INT32_MIN, ds[nd++] = INT32_MIN + 1, ds[nd++] = 1 << 30;
    uint64_t rng = 0xd1715;
    while (nd < (int)(sizeof ds / sizeof ds[0])) ds[nd++] = (int32_t)(uint32_t)tu_rand_u64(&rng);
    for (int i = 0; i < nd; i++) {
        const int32_t d = ds[i];
        const int32_t edges[] = {0, 1, -1, 2, -2, INT32_MAX, INT32_MIN, INT32_MIN + 1, INT32_MAX - 1};
        for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) check_division(edges[e], d);
        for (int k = 0; k < 24; k++) {
            const int64_t mult = (int64_t)(tu_rand_u64(&rng) % 2000001) - 1000000;
            const int64_t near = mult * d + (int64_t)(tu_rand_u64(&rng) % 3) - 1;
            if (near >= INT32_MIN && near <= INT32_MAX) check_division((int32_t)near, d);
            /* exact multiples too, where the divisibility test says yes */
            const int64_t exact = (d ? mult % (INT64_C(0x80000000) / (d < 0 ? -(int64_t)d : d)) : mult) * d;
            if (exact >= INT32_MIN && exact <= INT32_MAX) check_division((int32_t)exact, d);
            check_division((int32_t)(uint32_t)tu_rand_u64(&rng), d);
        }
    }

    /* Which parameters are divisors: int scalars on the right of an int / or
     * % (through + and casts), float scalars on the right of a float /; not
     * literals, buffers, or an int parameter a float division divides by. */
    static const char src[] = "int P = 3;\nint Q = 5;\nint R = 7;\nfloat F = 2.0;\nconst int *buf;\n"
                              "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
                              "    int d = (q_idx - kv_idx) % P;\n"
                              "    return d == 0 && q_idx / +Q < R && (float)kv_idx / F < 100.0 &&\n"
                              "           kv_idx / 3 >= 0 && buf[q_idx % (int)Q] >= 0 &&\n"
                              "           (q_idx + kv_idx) % P == 0 && 0 != kv_idx % P;\n}\n";
    fg_ctx *ctx = new_ctx();
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "divisors.c", src, (size_t)-1, &m), FG_OK);
    const bool want[] = {true, true, false, true, false};
    assert_int_equal(m->nparams, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(m->params[i].divisor, want[i]);
    fgi_param_layout layout;
    fgi_param_layout_compute(m, &layout);
    char *out = emit_mod(ctx, m);
    assert_non_null(strstr(out, "fg_imod_by(fg_isub(q_idx, kv_idx), p.fg_div_P)"));
    assert_non_null(strstr(out, "fg_idiv_by(q_idx, p.fg_div_Q)"));
    /* a remainder compared with 0: the divisibility test */
    assert_non_null(strstr(out, "fg_divides_by(fg_iadd(q_idx, kv_idx), p.fg_div_P)"));
    assert_non_null(strstr(out, "!fg_divides_by(kv_idx, p.fg_div_P)"));
    assert_null(strstr(out, "fg_div_R"));
    assert_non_null(strstr(out, "fg_fdiv_by((float)kv_idx, p.F, p.fg_rcp_F)"));
    char line[160];
    snprintf(line, sizeof line, "static_assert(fg_offsetof(fg_mod_params, fg_div_Q) == %zu,", layout.div_offsets[1]);
    assert_non_null(strstr(out, line));
    free(out);
    /* The packed blob holds each divisor's magic numbers where the kernel
     * reads them, and NVRTC agrees with the host's layout. */
    fgi_value values[FGI_MAX_PARAMS];
    fg_binding binds[] = {fg_bind_int("P", -6), fg_bind_int_buffer("buf", NULL, 0)};
    assert_int_equal(fgi_bind(ctx, m, binds, 2, values), FG_OK);
    unsigned char blob[FGI_PARAM_BLOB_MAX];
    fgi_param_pack(m, &layout, values, blob);
    fgi_divisor got, p6 = fgi_divisor_of(-6), q5 = fgi_divisor_of(5);
    memcpy(&got, blob + layout.div_offsets[0], sizeof got);
    assert_memory_equal(&got, &p6, sizeof got);
    memcpy(&got, blob + layout.div_offsets[1], sizeof got);
    assert_memory_equal(&got, &q5, sizeof got);
    float rcp_f = 0;
    memcpy(&rcp_f, blob + layout.div_offsets[3], sizeof rcp_f);
    assert_true(rcp_f == 0.5f);
    /* A float divisor whose reciprocal is no normal float is refused. */
    const float refused[] = {1e-40f, -0x1p-127f, 0x1p127f, -3e38f};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        fg_binding bad[] = {fg_bind_float("F", refused[k]), fg_bind_int_buffer("buf", NULL, 0)};
        assert_int_equal(fgi_bind(ctx, m, bad, 2, values), FG_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(fg_errmsg(ctx), "'F'"));
    }
    const float taken[] = {0.0f, -INFINITY, 0x1p-126f, -0x1p126f, 20.0f};
    for (size_t k = 0; k < sizeof taken / sizeof taken[0]; k++) {
        fg_binding ok[] = {fg_bind_float("F", taken[k]), fg_bind_int_buffer("buf", NULL, 0)};
        assert_int_equal(fgi_bind(ctx, m, ok, 2, values), FG_OK);
    }
    fg_free(block_mask_compiles(ctx, m, "divisors"));
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* fg_fdiv_by of templates/common.cuh, spelled in C (fmaf rounds once, as
 * __fmaf_rn does; the build never contracts a * y into an FMA). */
static float fdiv_by(float a, float b, float y) {
    const float q0 = a * y;
    const float r = fmaf(-q0, b, a);
    const float q1 = fmaf(r, y, q0);
    const float aa = fabsf(a), ab = fabsf(b);
    const bool exact = aa >= 0x1p-60f && aa <= 0x1p60f && ab >= 0x1p-60f && ab <= 0x1p60f;
    return exact ? q1 : q0;
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* One pair against IEEE division: bit for bit where fg_fdiv_by promises it
 * (|a|, |b| in [2^-60, 2^60]), and outside it the same zero, infinity or NaN
 * and at most one ulp away. */
static void check_fdiv_by(float a, float b) {
    const float want = a / b, got = fdiv_by(a, b, 1.0f / b);
    const bool in_range = fabsf(a) >= 0x1p-60f && fabsf(a) <= 0x1p60f && fabsf(b) >= 0x1p-60f &&
                          fabsf(b) <= 0x1p60f;
    if (isnan(want) && isnan(got)) return;
    if (float_bits(want) == float_bits(got)) return;
    if (!in_range && isfinite(want) && want != 0 && isfinite(got) && got != 0 &&
        fabsf(got - want) <= fabsf(nextafterf(want, INFINITY) - want))
        return;
    fail_msg("%a / %a: %a, want %a%s", (double)a, (double)b, (double)got, (double)want,
             in_range ? " (in the exact range)" : "");
}

static void test_float_divisors(void **state) {
    (void)state;
    /* Divisors: softcaps, fractions, significands of all ones and of one
     * past a power of two, pi, the range's edges and beyond it, zero, inf,
     * NaN, random ones; dividends: every 4099th bit pattern (both signs,
     * every exponent, zeros, subnormals, infinities, NaNs). */
    float bs[48] = {20.0f, 30.0f, 50.0f, 3.0f, 7.0f, 0.1f, 1.0f / 3.0f, -5.0f, 1.5f, 0.0f, -0.0f,
                    INFINITY, NAN, 0x1.fffffep0f, 0x1.fffffep-1f, 0x1.000002p0f, 3.14159265f, 0x1p-60f,
                    0x1.fffffep59f, 0x1p60f, 0x1p-61f, 0x1p61f, 1e-30f, 1e30f, 0x1p-126f, 0x1p126f};
    int nb = 26;
    uint64_t rng = 0xfd1b;
    while (nb < (int)(sizeof bs / sizeof bs[0])) {
        const uint32_t u = ((uint32_t)tu_rand_u64(&rng) & 0x807fffffu) | (uint32_t)(60 + tu_rand_u64(&rng) % 136) << 23;
        memcpy(&bs[nb++], &u, sizeof u);
    }
    for (int i = 0; i < nb; i++)
        for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
            float a;
            const uint32_t bits = (uint32_t)u;
            memcpy(&a, &bits, sizeof a);
            check_fdiv_by(a, bs[i]);
        }
}

/* ---- every gallery mod compiles ------------------------------------------------ */

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_gallery_compiles(void **state) {
    (void)state;
    DIR *d = opendir("mods");
    assert_non_null(d);
    char *names[128];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 128) {
        size_t l = strlen(e->d_name);
        if (l > 2 && strcmp(e->d_name + l - 2, ".c") == 0) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    assert_true(n >= 3);
    qsort(names, (size_t)n, sizeof names[0], name_cmp);

    /* The portable kernel and the block-mask builder for both archs, the
     * Hopper forward and backward for their only one, at every head dim
     * they take. */
    static const struct {
        fg_kernel_kind kind;
        int head_dim;
        const char *arch, *label;
    } builds[] = {
        {FG_KERNEL_ATTENTION_FWD, 0, "sm_80", "attention"},
        {FG_KERNEL_ATTENTION_FWD, 0, "sm_90a", "attention"},
        {FG_KERNEL_BLOCK_MASK, 0, "sm_80", "blockmask"},
        {FG_KERNEL_BLOCK_MASK, 0, "sm_90a", "blockmask"},
        {FG_KERNEL_ATTENTION_FWD_SM90, 128, "sm_90a", "attention-sm90 d128"},
        {FG_KERNEL_ATTENTION_FWD_SM90, 64, "sm_90a", "attention-sm90 d64"},
        {FG_KERNEL_ATTENTION_FWD_SM90, 96, "sm_90a", "attention-sm90 d96"},
        {FG_KERNEL_ATTENTION_FWD_SM90, 192, "sm_90a", "attention-sm90 d192"},
        {FG_KERNEL_ATTENTION_FWD_SM90, 256, "sm_90a", "attention-sm90 d256"},
        {FG_KERNEL_ATTENTION_BWD_SM90, 128, "sm_90a", "attention-bwd-sm90 d128"},
        {FG_KERNEL_ATTENTION_BWD_SM90, 64, "sm_90a", "attention-bwd-sm90 d64"},
    };
    fg_ctx *ctx = new_ctx();
    int failures = 0;
    for (int i = 0; i < n; i++) {
        char path[300];
        snprintf(path, sizeof path, "mods/%s", names[i]);
        fg_mod *m = load(ctx, path);
        for (size_t k = 0; k < sizeof builds / sizeof builds[0]; k++) {
            const char *const arch = builds[k].arch;
            fg_kernel_config cfg = {builds[k].kind, 0, builds[k].head_dim, 0, 0, arch};
            void *img = NULL;
            size_t size = 0;
            double t0 = fgi_now_ms();
            fg_status st;
            char *log = NULL;
            if (builds[k].kind == FG_KERNEL_ATTENTION_FWD_SM90 || builds[k].kind == FG_KERNEL_ATTENTION_BWD_SM90) {
                /* With ptxas's report, held by hopper_report_bad (C7514
                 * also followed a branch between two waits of different
                 * depths). */
                char *src = NULL;
                st = fg_generate_source(ctx, m, &cfg, &src);
                if (st == FG_OK)
                    st = fgi_nvrtc_compile_verbose(ctx, src, names[i], arch, FG_EMIT_CUBIN, &img, &size, &log);
                fg_free(src);
                if (st == FG_OK && hopper_report_bad(log, builds[k].kind)) {
                    print_error("%s %s: ptxas report:\n%s\n", path, builds[k].label, log ? log : "(none)");
                    failures++;
                }
            } else {
                st = fg_compile(ctx, m, &cfg, FG_EMIT_CUBIN, &img, &size);
            }
            /* The templates and the emitted mods compile without a
             * warning (an unused helper, an unreachable loop...). */
            const char *full_log = log ? log : fg_compile_log(ctx);
            if (st == FG_OK && full_log && strstr(full_log, "warning")) {
                print_error("%s %s %s: NVRTC warnings:\n%s\n", path, builds[k].label, arch, full_log);
                failures++;
            }
            free(log);
            double ms = fgi_now_ms() - t0;
            if (st != FG_OK) {
                print_error("%s %s %s: %s\n%s\n", path, builds[k].label, arch, fg_errmsg(ctx),
                            fg_compile_log(ctx));
                failures++;
            } else if (size < 1000) {
                print_error("%s: a %zu-byte cubin\n", path, size);
                failures++;
            }
            /* a mod must not make NVRTC crawl (a branchy helper once
             * took minutes inside the unrolled block-mask loop); the
             * bound leaves room for a loaded 2-core machine, where the
             * largest kernel here (the Hopper backward at head dim 64)
             * has taken 35 s */
            if (ms > 90000) {
                print_error("%s %s %s: compiling took %.0f ms\n", path, builds[k].label, arch, ms);
                failures++;
            }
            fg_free(img);
        }
        fg_mod_destroy(m);
        free(names[i]);
    }
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* ---- configs and keys -------------------------------------------------------- */

typedef struct config_case {
    fg_kernel_config cfg;
    fg_status want;
} config_case;

static const config_case config_cases[] = {
    {{0, 0, 0, 0, 0, NULL}, FG_OK}, /* all defaults */
    {{FG_KERNEL_ATTENTION_FWD, FG_FP16, 64, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 256, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 16, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 24, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 272, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD, FG_BF16, -16, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD, (fg_dtype)7, 0, 0, 0, NULL}, FG_ERR_INVALID_ARGUMENT},
    {{(fg_kernel_kind)9, 0, 0, 0, 0, NULL}, FG_ERR_INVALID_ARGUMENT},
    {{FG_KERNEL_BLOCK_MASK, 0, 0, 16, 256, NULL}, FG_OK},
    {{FG_KERNEL_BLOCK_MASK, 0, 0, 100, 128, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_BLOCK_MASK, 0, 0, 128, 512, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_BLOCK_MASK, 0, 0, 8, 128, NULL}, FG_ERR_NOT_SUPPORTED},
    /* the Hopper kernel: head dims 64, 96, 128, 192 and 256, blocks of 128
     * and more, sm_90a; its backward: 64 and 128 */
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 0, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_FP16, 64, 256, 128, "sm_90a"}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 96, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 192, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_FP16, 256, 0, 0, NULL}, FG_OK},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 80, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 160, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 32, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_BWD_SM90, FG_BF16, 96, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_BWD_SM90, FG_BF16, 256, 0, 0, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 128, 64, 128, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 128, 128, 64, NULL}, FG_ERR_NOT_SUPPORTED},
    {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 128, 0, 0, "sm_80"}, FG_ERR_NOT_SUPPORTED},
};

static void test_configs(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/sliding_window.c");
    for (size_t i = 0; i < sizeof config_cases / sizeof config_cases[0]; i++) {
        fgi_codegen cg;
        fg_status st = fgi_codegen_init(ctx, m, &config_cases[i].cfg, &cg);
        if (st != config_cases[i].want) print_error("config case %zu: %s\n", i, fg_errmsg(ctx));
        assert_int_equal(st, config_cases[i].want);
        if (st == FG_OK) fgi_codegen_free(&cg);
    }
    fgi_codegen cg;
    assert_int_equal(fgi_codegen_init(ctx, m, NULL, &cg), FG_OK);
    assert_string_equal(cg.name, "attention_fwd-sliding_window-bf16-d128");
    assert_string_equal(cg.spec.entry, "fg_attention_fwd");
    assert_int_equal(cg.config.head_dim, 128);
    assert_int_equal(cg.config.dtype, FG_BF16);
    assert_non_null(strstr(cg.key, fg_mod_canonical(m)));
    fgi_codegen_free(&cg);
    /* The Hopper kernel has its own name, template and arch. */
    const fg_kernel_config hopper = {FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 64, 0, 0, NULL};
    assert_int_equal(fgi_codegen_init(ctx, m, &hopper, &cg), FG_OK);
    assert_string_equal(cg.name, "attention_fwd_sm90-sliding_window-bf16-d64");
    assert_string_equal(cg.spec.entry, "fg_attention_fwd");
    assert_string_equal(cg.spec.arch, "sm_90a");
    fgi_codegen_free(&cg);
    char *src = NULL;
    assert_int_equal(fg_generate_source(ctx, m, &hopper, &src), FG_OK);
    assert_non_null(strstr(src, "templates/attention/attention_common.cuh"));
    assert_non_null(strstr(src, "templates/attention/attention_fwd_sm90.cuh"));
    assert_non_null(strstr(src, "wgmma.mma_async"));
    assert_non_null(strstr(src, "cp.async.bulk.tensor"));
    fg_free(src);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

static char *key_of(fg_ctx *ctx, const fg_mod *m, fg_kernel_config cfg) {
    fgi_codegen cg;
    assert_int_equal(fgi_codegen_init(ctx, m, &cfg, &cg), FG_OK);
    char *k = strdup(cg.key);
    fgi_codegen_free(&cg);
    return k;
}

static void test_keys(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *a = load(ctx, "mods/sliding_window.c");
    fg_mod *b = NULL;
    /* another default value and other names: the same kernel */
    assert_int_equal(fg_mod_from_source(ctx, "other.c",
                                        "int WINDOW = 7; bool mask_mod(int B, int H, int q, int k)"
                                        " { return q >= k && q - k <= WINDOW; }",
                                        (size_t)-1, &b),
                     FG_OK);
    fg_kernel_config att = {FG_KERNEL_ATTENTION_FWD, FG_BF16, 128, 0, 0, NULL};
    fg_kernel_config bm = {FG_KERNEL_BLOCK_MASK, 0, 0, 128, 128, NULL};
    char *k1 = key_of(ctx, a, att), *k2 = key_of(ctx, b, att);
    assert_string_equal(k1, k2);
    free(k2);
    struct {
        fg_kernel_config cfg;
        bool same_as_att;
    } rows[] = {
        {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 128, 128, 128, NULL}, true}, /* the defaults */
        {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 128, 64, 64, NULL}, false}, /* q tile size */
        {{FG_KERNEL_ATTENTION_FWD, FG_FP16, 128, 0, 0, NULL}, false},
        {{FG_KERNEL_ATTENTION_FWD, FG_BF16, 64, 0, 0, NULL}, false},
        {{FG_KERNEL_BLOCK_MASK, 0, 0, 128, 128, NULL}, false},
        {{FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 128, 0, 0, NULL}, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char *k = key_of(ctx, a, rows[i].cfg);
        assert_int_equal(strcmp(k, k1) == 0, rows[i].same_as_att);
        free(k);
    }
    char *b1 = key_of(ctx, a, bm);
    fg_kernel_config bm2 = {FG_KERNEL_BLOCK_MASK, FG_FP16, 64, 128, 64, NULL};
    char *b2 = key_of(ctx, a, bm2);
    assert_string_not_equal(b1, b2); /* block sizes are compiled in */
    bm2.kv_block = 128;
    free(b2);
    b2 = key_of(ctx, a, bm2);
    assert_string_equal(b1, b2); /* dtype and head dim are not used */
    free(b1);
    free(b2);
    free(k1);
    fg_mod_destroy(b);
    fg_mod_destroy(a);
    fg_ctx_destroy(ctx);
}

/* ---- approximate math ------------------------------------------------------- */

/* A score_mod calling every builtin approximate math respells, a float
 * division, and pow (which it keeps), behind a mask whose own float math
 * must stay accurate. */
static const char APPROX_SRC[] =
    "float T = 3.0;\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return exp(0.01 * (float)(q_idx - kv_idx)) >= 1.0;\n}\n"
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
    "    float d = (float)(q_idx - kv_idx + 1);\n"
    "    return T * tanh(score / T) + 0.1 * (exp(-d) + exp2(-d) + log(d + 1.0) + log2(d + 2.0)\n"
    "           + sigmoid(score) + rsqrt(d + 1.0) + pow(d + 1.0, 0.5));\n}\n";

/* The spellings approximate math puts into APPROX_SRC's score_mod. */
static const char *const APPROX_NAMES[] = {"fg_tanh_approx(", "fg_fdiv_approx(", "fg_exp_approx(",
                                           "fg_exp2_approx(", "fg_log_approx(", "fg_log2_approx(",
                                           "fg_sigmoid_approx(", "fg_rsqrt_approx("};
#define NAPPROX (sizeof APPROX_NAMES / sizeof APPROX_NAMES[0])

/* The kinds that run score_mod, each at a head dim it takes. */
static const struct {
    fg_kernel_kind kind;
    int head_dim;
    const char *label;
} approx_kinds[] = {
    {FG_KERNEL_ATTENTION_FWD, 128, "attention_fwd"},
    {FG_KERNEL_ATTENTION_FWD_SM90, 128, "attention_fwd_sm90"},
    {FG_KERNEL_ATTENTION_BWD, 64, "attention_bwd"},
    {FG_KERNEL_ATTENTION_BWD_SM90, 64, "attention_bwd_sm90"},
    {FG_KERNEL_ATTENTION_DECODE, 128, "attention_decode"},
};
#define NAPPROX_KINDS (sizeof approx_kinds / sizeof approx_kinds[0])

/* The text of `src` from `from` to the next line that is "}" alone (a
 * function's body), malloc'd; fails when `from` is absent. */
static char *section(const char *src, const char *from) {
    const char *a = strstr(src, from);
    if (!a) fail_msg("no '%s' in the source", from);
    const char *b = strstr(a, "\n}\n");
    size_t n = b ? (size_t)(b - a) : strlen(a);
    char *t = malloc(n + 1);
    assert_non_null(t);
    memcpy(t, a, n);
    t[n] = 0;
    return t;
}

static fg_kernel_config approx_config(size_t k, int approx) {
    fg_kernel_config c = fg_kernel_config_init();
    c.kind = approx_kinds[k].kind;
    c.head_dim = approx_kinds[k].head_dim;
    c.approx_math = approx;
    return c;
}

/* `key` is `base` with one line more, the one starting at `line`'s first
 * occurrence in `key`, and otherwise the same. */
static void assert_one_line_more(const char *key, const char *base, const char *line) {
    const char *at = strstr(key, line);
    assert_non_null(at);
    const char *end = strchr(at, '\n') + 1;
    assert_int_equal(strlen(key) - (size_t)(end - at), strlen(base));
    assert_memory_equal(key, base, (size_t)(at - key));
    assert_string_equal(end, base + (at - key));
}

/* Keys, names and sources: the accurate kernel of every kind is what it
 * was (no key line, no macro, no template: the goldens and test_keys hold
 * its bytes), the approximate one differs in exactly those; the context's
 * option stands in for the config's 0; the block-mask builder ignores it. */
static void test_approx_keys(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "approx.c", APPROX_SRC, (size_t)-1, &m), FG_OK);
    for (size_t k = 0; k < NAPPROX_KINDS; k++) {
        fgi_codegen acc, apx, opt;
        fg_kernel_config c0 = approx_config(k, 0), c1 = approx_config(k, 1);
        assert_int_equal(fgi_codegen_init(ctx, m, &c0, &acc), FG_OK);
        assert_int_equal(fgi_codegen_init(ctx, m, &c1, &apx), FG_OK);
        assert_int_equal(acc.config.approx_math, 0);
        assert_int_equal(apx.config.approx_math, 1);
        assert_null(strstr(acc.key, "approx"));
        assert_non_null(strstr(apx.key, "\napprox_math 1 approx_math.cuh "));
        assert_string_not_equal(acc.key, apx.key);
        /* one line more, and the rest the same */
        assert_one_line_more(apx.key, acc.key, "approx_math 1");
        char want[200];
        snprintf(want, sizeof want, "%s-approx", acc.name);
        assert_string_equal(apx.name, want);
        assert_non_null(strstr(acc.name, approx_kinds[k].label));
        /* the context's option, where the config says 0 */
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 1), FG_OK);
        assert_int_equal(fgi_codegen_init(ctx, m, &c0, &opt), FG_OK);
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 0), FG_OK);
        assert_string_equal(opt.key, apx.key);
        assert_string_equal(opt.name, apx.name);
        fgi_codegen_free(&opt);

        char *sa = NULL, *s1 = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &c0, &sa), FG_OK);
        assert_int_equal(fg_generate_source(ctx, m, &c1, &s1), FG_OK);
        assert_null(strstr(sa, "FG_APPROX_MATH"));
        assert_null(strstr(sa, "_approx"));
        assert_non_null(strstr(s1, "#define FG_APPROX_MATH 1\n"));
        assert_non_null(strstr(s1, "/* ==== templates/approx_math.cuh ==== */\n"));
        assert_non_null(strstr(s1, ", approximate math.\n"));
        snprintf(want, sizeof want, "%s.cu -- generated by flexgen", apx.name);
        assert_non_null(strstr(s1, want));
        /* after common.cuh, before the emitted mod that calls it */
        assert_true(strstr(s1, "templates/common.cuh ====") < strstr(s1, "templates/approx_math.cuh ===="));
        assert_true(strstr(s1, "templates/approx_math.cuh ====") < strstr(s1, "---- the mod: "));
        /* score_mod approximate, mask_mod accurate */
        char *score = section(s1, "float fg_score_mod("), *mask = section(s1, "bool fg_mask_mod(");
        for (size_t i = 0; i < NAPPROX; i++)
            if (!strstr(score, APPROX_NAMES[i])) fail_msg("%s: no %s in fg_score_mod", apx.name, APPROX_NAMES[i]);
        assert_non_null(strstr(score, "powf("));
        assert_null(strstr(score, "tanhf("));
        assert_null(strstr(score, "fg_fdiv("));
        assert_null(strstr(score, "fg_fdiv_by("));
        assert_non_null(strstr(mask, "expf("));
        assert_null(strstr(mask, "_approx"));
        free(score), free(mask);
        if (strstr(s1, "FG_HAS_SPLIT_MODS")) { /* and their split forms alike: the mask's, then the score's */
            const char *mask_split = strstr(s1, "struct fg_mask_head"), *score_split = strstr(s1, "struct fg_score_head");
            assert_true(mask_split && score_split && mask_split < score_split);
            const size_t n = (size_t)(score_split - mask_split);
            char *mtext = malloc(n + 1);
            assert_non_null(mtext);
            memcpy(mtext, mask_split, n), mtext[n] = 0;
            assert_null(strstr(mtext, "_approx"));
            assert_non_null(strstr(mtext, "expf("));
            assert_non_null(strstr(score_split, "fg_tanh_approx("));
            free(mtext);
        }
        if (approx_kinds[k].kind == FG_KERNEL_ATTENTION_BWD || approx_kinds[k].kind == FG_KERNEL_ATTENTION_BWD_SM90) {
            /* the derivative of tanh is written with tanh: approximate too */
            char *grad = section(s1, "float fg_score_grad(");
            assert_non_null(strstr(grad, "fg_tanh_approx("));
            assert_null(strstr(grad, "tanhf("));
            free(grad);
        }
        fg_free(sa), fg_free(s1);
        fgi_codegen_free(&acc), fgi_codegen_free(&apx);
    }
    /* the ragged forward: both suffixes */
    fg_kernel_config rc = approx_config(0, 1);
    rc.ragged = 1;
    fgi_codegen cg;
    assert_int_equal(fgi_codegen_init(ctx, m, &rc, &cg), FG_OK);
    assert_string_equal(cg.name, "attention_fwd-approx-bf16-d128-ragged-approx");
    fgi_codegen_free(&cg);
    /* the block-mask builder runs mask_mod only: one kernel either way */
    fg_kernel_config b0 = {FG_KERNEL_BLOCK_MASK, 0, 0, 64, 64, NULL, sizeof(fg_kernel_config), 0, 0};
    fg_kernel_config b1 = b0;
    b1.approx_math = 1;
    char *k0 = key_of(ctx, m, b0), *k1 = key_of(ctx, m, b1);
    assert_string_equal(k0, k1);
    free(k0), free(k1);
    char *src = NULL;
    assert_int_equal(fg_generate_source(ctx, m, &b1, &src), FG_OK);
    assert_null(strstr(src, "FG_APPROX_MATH"));
    assert_null(strstr(src, "_approx("));
    fg_free(src);
    /* approx_math is 0 or 1 */
    fg_kernel_config bad = approx_config(0, 2);
    assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fg_errmsg(ctx), "approx_math 2"));
    bad.approx_math = -1;
    assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* ---- the Hopper backward's block orders ------------------------------------- */

/* lead_first and head_pairs: each its own key line, name suffix and macro
 * on the Hopper backward, the plain kernel none of them; the portable
 * backward ignores both (one kernel); 0 or 1 each, never both; each form
 * compiles. */
static void test_order_forms(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    static const struct {
        int lead, pairs;
        const char *key_line, *suffix, *macro, *header;
    } forms[] = {
        {1, 0, "\nlead_first 1\n", "-lead", "#define FG_LEAD_FIRST 1\n", ", leading kv tiles first.\n"},
        {0, 1, "\nhead_pairs 1\n", "-pairs", "#define FG_HEAD_PAIRS 1\n", ", kv heads in pairs.\n"},
    };
    fg_kernel_config plain = fg_kernel_config_init();
    plain.kind = FG_KERNEL_ATTENTION_BWD_SM90;
    fgi_codegen p0;
    assert_int_equal(fgi_codegen_init(ctx, m, &plain, &p0), FG_OK);
    assert_string_equal(p0.name, "attention_bwd_sm90-causal-bf16-d128");
    char *src0 = NULL;
    assert_int_equal(fg_generate_source(ctx, m, &plain, &src0), FG_OK);
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        assert_null(strstr(p0.key, forms[i].key_line));
        assert_null(strstr(src0, forms[i].macro));
        fg_kernel_config c = plain;
        c.lead_first = forms[i].lead, c.head_pairs = forms[i].pairs;
        fgi_codegen cg;
        assert_int_equal(fgi_codegen_init(ctx, m, &c, &cg), FG_OK);
        assert_int_equal(cg.config.lead_first, forms[i].lead);
        assert_int_equal(cg.config.head_pairs, forms[i].pairs);
        /* one key line more, the rest the same */
        assert_non_null(strstr(cg.key, forms[i].key_line));
        assert_one_line_more(cg.key, p0.key, forms[i].key_line + 1);
        char want[200];
        snprintf(want, sizeof want, "%s%s", p0.name, forms[i].suffix);
        assert_string_equal(cg.name, want);
        fgi_codegen_free(&cg);
        char *src = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &c, &src), FG_OK);
        assert_non_null(strstr(src, forms[i].macro));
        assert_non_null(strstr(src, forms[i].header));
        fg_free(src);
        assert_compiles(ctx, m, &c);
        /* the portable backward has one kernel for every order */
        fg_kernel_config pc = c, pp = plain;
        pc.kind = pp.kind = FG_KERNEL_ATTENTION_BWD;
        char *kc = key_of(ctx, m, pc), *kp = key_of(ctx, m, pp);
        assert_string_equal(kc, kp);
        free(kc), free(kp);
    }
    fg_free(src0);
    fgi_codegen_free(&p0);
    /* 0 or 1 each, and one of them at most */
    fgi_codegen cg;
    fg_kernel_config bad = plain;
    bad.head_pairs = 2;
    assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fg_errmsg(ctx), "head_pairs 2"));
    bad = plain, bad.lead_first = -1;
    assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
    bad = plain, bad.lead_first = 1, bad.head_pairs = 1;
    assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fg_errmsg(ctx), "set one of them"));
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* ---- the Hopper forward for calls without a block mask ---------------------- */

/* dense: at head dim 128 for a mod without a mask_mod, its own key line,
 * name suffix, macro and header words, 176-row tiles in the launch
 * geometry, and it compiles; where it would change nothing (a mask_mod,
 * head dim 64, the portable forward) the plain kernel's key; 0 or 1. */
static void test_dense_form(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    static const struct {
        const char *mod;
        int head_dim;
        fg_kernel_kind kind;
        bool applies;
    } rows[] = {
        {"mods/noop.c", 128, FG_KERNEL_ATTENTION_FWD_SM90, true},
        {"mods/causal.c", 128, FG_KERNEL_ATTENTION_FWD_SM90, false},
        {"mods/alibi.c", 128, FG_KERNEL_ATTENTION_FWD_SM90, false},
        {"mods/noop.c", 64, FG_KERNEL_ATTENTION_FWD_SM90, false},
        {"mods/noop.c", 256, FG_KERNEL_ATTENTION_FWD_SM90, false},
        {"mods/noop.c", 128, FG_KERNEL_ATTENTION_FWD, false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = load(ctx, rows[i].mod);
        fg_kernel_config plain = fg_kernel_config_init();
        plain.kind = rows[i].kind;
        plain.head_dim = rows[i].head_dim;
        fg_kernel_config c = plain;
        c.dense = 1;
        fgi_codegen p0, cg;
        assert_int_equal(fgi_codegen_init(ctx, m, &plain, &p0), FG_OK);
        assert_int_equal(fgi_codegen_init(ctx, m, &c, &cg), FG_OK);
        assert_int_equal(cg.config.dense, rows[i].applies);
        assert_int_equal(fgi_fwd_dense_applies(&c, m), rows[i].head_dim == 128 && !strstr(rows[i].mod, "alibi") &&
                                                           !strstr(rows[i].mod, "causal"));
        if (!rows[i].applies) {
            assert_string_equal(cg.key, p0.key);
            assert_string_equal(cg.name, p0.name);
        } else {
            assert_one_line_more(cg.key, p0.key, "dense 1\n");
            char want[200];
            snprintf(want, sizeof want, "%s-dense", p0.name);
            assert_string_equal(cg.name, want);
            char *src = NULL, *src0 = NULL;
            assert_int_equal(fg_generate_source(ctx, m, &c, &src), FG_OK);
            assert_int_equal(fg_generate_source(ctx, m, &plain, &src0), FG_OK);
            assert_non_null(strstr(src, "#define FG_DENSE 1\n"));
            assert_null(strstr(src0, "#define FG_DENSE"));
            assert_non_null(strstr(src, ", no block mask (176-row kv tiles).\n"));
            assert_non_null(strstr(src, "#define FG_LAUNCH_BLOCK_N_fg_attention_fwd 176\n"));
            assert_non_null(strstr(src0, "#define FG_LAUNCH_BLOCK_N_fg_attention_fwd 128\n"));
            fg_free(src), fg_free(src0);
            assert_compiles(ctx, m, &c);
        }
        fgi_codegen_free(&cg);
        fgi_codegen_free(&p0);
        fg_kernel_config bad = plain;
        bad.dense = 2;
        assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(fg_errmsg(ctx), "dense 2"));
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* ---- the decode kernel's KV heads in pairs ------------------------------------ */

/* The spill stores ptxas reports for entry point `entry` in `log` (its
 * verbose report), or -1 when the report does not name it. */
static long entry_spill(const char *log, const char *entry) {
    char want[160];
    snprintf(want, sizeof want, "Compiling entry function '%s'", entry);
    const char *at = strstr(log, want);
    if (!at) return -1;
    at = strstr(at, " bytes spill stores");
    if (!at) return -1;
    while (at[-1] >= '0' && at[-1] <= '9') at--;
    return atol(at);
}

/* The decode kernel's head dims: 64, 128 and 256 make source; 16 and 32
 * (whose shared rows hold fewer than the 8 chunks fgd_at's swizzle
 * permutes) are refused with the reason, and the kernel does not apply
 * to them, so a call of those head dims takes the forward kernel
 * (fgi_attn_forward_kernel_config). */
static void test_decode_head_dims(void **state) {
    (void)state;
    static const struct {
        int head_dim;
        bool ok;
    } rows[] = {{16, false}, {32, false}, {48, false}, {64, true}, {128, true}, {256, true}};
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    const fgi_kernel_entry *dec = fgi_kernel_find(FG_KERNEL_ATTENTION_DECODE);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_kernel_config c = fg_kernel_config_init();
        c.kind = FG_KERNEL_ATTENTION_DECODE;
        c.head_dim = rows[i].head_dim;
        char *src = NULL;
        const fg_status st = fg_generate_source(ctx, m, &c, &src);
        if ((st == FG_OK) != rows[i].ok) fail_msg("head dim %d: status %d", rows[i].head_dim, (int)st);
        if (!rows[i].ok) {
            assert_int_equal(st, FG_ERR_NOT_SUPPORTED);
            assert_non_null(strstr(fg_errmsg(ctx), "supports 64, 128 and 256"));
        }
        assert_int_equal(fgi_kernel_applies(dec, &c), rows[i].ok);
        fg_free(src);
    }
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* Which decode walk a paged call at head dim 64 takes (config.head_pairs,
 * fgi_attn_forward_kernel_config): by FG_OPT_DECODE_HEAD_PAIRS's choice
 * (-1) two KV heads at once unless a block mask of a local mask makes the
 * walks short (sliding_window, local_global: one head a walk); 1 in pairs
 * wherever they fit; 0 never; and never where they do not fit (odd KV
 * heads, head dim 128). */
static void test_decode_pairs_choice(void **state) {
    (void)state;
    static const struct {
        const char *mod;
        int opt, block_mask, heads_kv, head_dim;
        bool pairs;
    } rows[] = {
        {"causal", -1, 1, 2, 64, true},          {"causal", -1, 0, 2, 64, true},
        {"sliding_window", -1, 1, 2, 64, false}, {"sliding_window", -1, 0, 2, 64, true},
        {"local_global", -1, 1, 2, 64, false},   {"softcap", -1, 1, 2, 64, true},
        {"sliding_window", 1, 1, 2, 64, true},   {"causal", 0, 1, 2, 64, false},
        {"causal", -1, 1, 1, 64, false},         {"causal", 1, 1, 2, 128, false},
    };
    fg_ctx *ctx = new_ctx();
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char path[64];
        snprintf(path, sizeof path, "mods/%s.c", rows[i].mod);
        fg_mod *m = load(ctx, path);
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_HEAD_PAIRS, rows[i].opt), FG_OK);
        fg_block_mask bm;
        memset(&bm, 0, sizeof bm);
        bm.desc.batch = 1, bm.desc.heads = 1, bm.desc.q_block = 128, bm.desc.kv_block = 128;
        int32_t table = 0;
        fg_attention_args a = fg_attention_args_init();
        a.batch = 1, a.heads_q = 8, a.heads_kv = rows[i].heads_kv, a.q_len = 1, a.kv_len = 4097;
        a.head_dim = rows[i].head_dim, a.dtype = FG_BF16;
        a.block_table = &table, a.page_size = 16, a.num_pages = 300, a.max_pages = 257;
        a.block_mask = rows[i].block_mask ? &bm : NULL;
        const fg_kernel_config c = fgi_attn_forward_kernel_config(ctx, m, &a);
        assert_int_equal(c.kind, FG_KERNEL_ATTENTION_DECODE);
        if (c.head_pairs != rows[i].pairs)
            fail_msg("%s option %d block mask %d heads_kv %d head dim %d: pairs %d", rows[i].mod, rows[i].opt,
                     rows[i].block_mask, rows[i].heads_kv, rows[i].head_dim, c.head_pairs);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* The decode walk's K/V tiles as the source tells the template
 * (FG_LAUNCH_BLOCK_N / _SMEM of the r16 walk) per head dim, pairs and kv
 * block: 128-row tiles where the block mask's kv blocks allow them and a
 * walk row is 128 columns or fewer (two stages of K and V at 64, the
 * shared memory asked raised to keep a third block off an SM; at 128
 * the ring of three K-or-V slots, FGD_KV_RING), else 64 rows; shared
 * memory for two blocks an SM up to 128 columns, plus Q's region past
 * them; and the threads of the 32-row walk: eight warps in the -pairs
 * walk over 128-row tiles, four elsewhere. */
static void test_decode_tiles(void **state) {
    (void)state;
    static const struct {
        int head_dim, pairs, kv_block, block_n;
        long smem;
        int r32_threads;
    } rows[] = {
        {64, 0, 128, 128, 80 * 1024, 128},                      /* two stages (64 KB + 1 KB), asked as 80 KB */
        {64, 0, 64, 64, 5 * 2 * 64 * 128 + 1024, 128},           /* five stages */
        {64, 1, 128, 128, 3 * 128 * 256 + 1024, 256},            /* the ring */
        {64, 1, 64, 64, 3 * 2 * 64 * 256 + 1024, 128},           /* three stages */
        {128, 0, 128, 128, 3 * 128 * 256 + 1024, 128},           /* the ring */
        {128, 0, 256, 128, 3 * 128 * 256 + 1024, 128},           /* the ring */
        {128, 0, 64, 64, 3 * 2 * 64 * 256 + 1024, 128},          /* three stages */
        {256, 0, 128, 64, 2 * 2 * 64 * 512 + 64 * 512 + 1024, 128}, /* two stages, Q apart */
    };
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_kernel_config c = fg_kernel_config_init();
        c.kind = FG_KERNEL_ATTENTION_DECODE;
        c.head_dim = rows[i].head_dim;
        c.head_pairs = rows[i].pairs;
        c.kv_block = rows[i].kv_block;
        char *src = NULL, want[128];
        assert_int_equal(fg_generate_source(ctx, m, &c, &src), FG_OK);
        snprintf(want, sizeof want, "#define FG_LAUNCH_BLOCK_N_fg_attention_decode_r16 %d\n", rows[i].block_n);
        if (!strstr(src, want)) fail_msg("row %zu: no \"%s\"", i, want);
        snprintf(want, sizeof want, "#define FG_LAUNCH_SMEM_fg_attention_decode_r16 %ld\n", rows[i].smem);
        if (!strstr(src, want)) fail_msg("row %zu: no \"%s\"", i, want);
        snprintf(want, sizeof want, "#define FG_LAUNCH_THREADS_fg_attention_decode_r32_paged %d\n",
                 rows[i].r32_threads);
        if (!strstr(src, want)) fail_msg("row %zu: no \"%s\"", i, want);
        fg_free(src);
    }
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* The decode kernel's L2 prefetch (FG_OPT_DECODE_L2_PREFETCH): the rule
 * per device, then the option's three values on the decode kernel (1: the
 * key line and the macro; 0: neither; -1 without a GPU, as here or in CI:
 * the rule's unknown device, so the prefetch) and on a kernel that has no
 * such copies (never). */
static void test_decode_l2_prefetch(void **state) {
    (void)state;
    static const struct {
        int option;
        double dram; /* bytes per SM clock */
        bool want;
    } rule[] = {
        {-1, 0, true},    /* unknown device: the H100's choice */
        {-1, 12.8, true}, /* an H100 SXM */
        {-1, 15.9, true},  {-1, 16.0, false}, {-1, 18.8, false}, /* an H200 */
        {0, 12.8, false},  {0, 0, false},     {1, 18.8, true},   {1, 0, true},
    };
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++)
        assert_int_equal(fgi_dec_l2_prefetch_at(rule[i].option, rule[i].dram), rule[i].want);
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    fg_kernel_config dec = fg_kernel_config_init(), fwd = fg_kernel_config_init();
    dec.kind = FG_KERNEL_ATTENTION_DECODE;
    fwd.kind = FG_KERNEL_ATTENTION_FWD;
    const bool no_gpu = fgi_cuda_dram_per_sm_clock(ctx) == 0;
    static const int options[] = {1, 0, -1};
    char *keys[3] = {0};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_L2_PREFETCH, options[i]), FG_OK);
        const bool want = options[i] == 1 || (options[i] == -1 && no_gpu);
        if (options[i] == -1 && !no_gpu) continue; /* on a GPU: the device's choice */
        fgi_codegen cg;
        assert_int_equal(fgi_codegen_init(ctx, m, &dec, &cg), FG_OK);
        assert_int_equal(strstr(cg.key, "\nl2_prefetch 1\n") != NULL, want);
        assert_string_equal(cg.name, "attention_decode-causal-bf16-d128");
        keys[i] = strdup(cg.key);
        fgi_codegen_free(&cg);
        char *src = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &dec, &src), FG_OK);
        assert_int_equal(strstr(src, "#define FG_L2_PREFETCH 1\n") != NULL, want);
        fg_free(src);
        assert_int_equal(fg_generate_source(ctx, m, &fwd, &src), FG_OK);
        assert_null(strstr(src, "#define FG_L2_PREFETCH"));
        fg_free(src);
    }
    assert_one_line_more(keys[0], keys[1], "l2_prefetch 1\n");
    if (keys[2]) assert_string_equal(keys[2], keys[0]);
    for (int i = 0; i < 3; i++) free(keys[i]);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* head_pairs on the decode kernel: at head dim 64 its own key line, name
 * suffix, macro and header, and the walk of head dim 128 (64-row tiles of
 * 256-byte rows, three stages: the geometry printed for the template);
 * other head dims refuse it. ALiBi's kernel compiles for sm_90a without a
 * warning, each walk spilling no more than the same walk at head dim 128
 * (the GPU tests compile the gallery for the GPU's arch). */
static void test_decode_pairs(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    fg_kernel_config plain = fg_kernel_config_init();
    plain.kind = FG_KERNEL_ATTENTION_DECODE;
    plain.head_dim = 64;
    fg_kernel_config c = plain;
    c.head_pairs = 1;
    fgi_codegen p0, p1;
    assert_int_equal(fgi_codegen_init(ctx, m, &plain, &p0), FG_OK);
    assert_int_equal(fgi_codegen_init(ctx, m, &c, &p1), FG_OK);
    assert_string_equal(p0.name, "attention_decode-causal-bf16-d64");
    assert_string_equal(p1.name, "attention_decode-causal-bf16-d64-pairs");
    assert_null(strstr(p0.key, "head_pairs"));
    assert_non_null(strstr(p1.key, "\nhead_pairs 1\n"));
    assert_one_line_more(p1.key, p0.key, "head_pairs 1\n");
    fgi_codegen_free(&p0);
    fgi_codegen_free(&p1);
    char *src0 = NULL, *src1 = NULL;
    assert_int_equal(fg_generate_source(ctx, m, &plain, &src0), FG_OK);
    assert_int_equal(fg_generate_source(ctx, m, &c, &src1), FG_OK);
    assert_null(strstr(src0, "#define FG_HEAD_PAIRS"));
    assert_non_null(strstr(src1, "#define FG_HEAD_PAIRS 1\n"));
    assert_non_null(strstr(src1, ", kv heads in pairs.\n"));
    /* plain: 128-row tiles of 128-byte rows, three stages; pairs: 128-row
     * tiles of 256-byte rows, K and V in a ring of three slots (the tile
     * sizes per walk: test_decode_tiles) */
    assert_non_null(strstr(src0, "#define FG_LAUNCH_BLOCK_N_fg_attention_decode_r16 128\n"));
    assert_non_null(strstr(src1, "#define FG_LAUNCH_BLOCK_N_fg_attention_decode_r16 128\n"));
    assert_non_null(strstr(src1, "#define FG_LAUNCH_SMEM_fg_attention_decode_r16 99328\n"));
    fg_free(src0);
    fg_free(src1);
    fgi_codegen cg;
    static const int other_dims[] = {32, 128, 256};
    for (size_t i = 0; i < sizeof other_dims / sizeof other_dims[0]; i++) {
        fg_kernel_config bad = c;
        bad.head_dim = other_dims[i];
        assert_int_equal(fgi_codegen_init(ctx, m, &bad, &cg), FG_ERR_NOT_SUPPORTED);
        assert_non_null(strstr(fg_errmsg(ctx), "head dim 64 only"));
    }
    fg_mod_destroy(m);

    /* ALiBi: the gallery's most registers in these walks (its casts and
     * slopes beside the scores) */
    static const char *const mods[] = {"mods/alibi.c"};
    static const char *const archs[] = {"sm_90a"};
    int failures = 0;
    for (size_t i = 0; i < sizeof mods / sizeof mods[0]; i++) {
        m = load(ctx, mods[i]);
        for (size_t k = 0; k < sizeof archs / sizeof archs[0]; k++) {
            /* the pairs' walk against the plain one of head dim 128 */
            char *logs[2] = {NULL, NULL};
            for (int form = 0; form < 2; form++) {
                fg_kernel_config cc = c;
                cc.arch = archs[k];
                if (form == 1) cc.head_pairs = 0, cc.head_dim = 128;
                char *src = NULL;
                void *img = NULL;
                size_t size = 0;
                fg_status st = fg_generate_source(ctx, m, &cc, &src);
                if (st == FG_OK)
                    st = fgi_nvrtc_compile_verbose(ctx, src, mods[i], archs[k], FG_EMIT_CUBIN, &img, &size, &logs[form]);
                if (st != FG_OK || !logs[form] || strstr(logs[form], "warning")) {
                    print_error("%s %s %s: %s\n%s\n", mods[i], archs[k], form ? "d128" : "pairs", fg_errmsg(ctx),
                                logs[form] ? logs[form] : fg_compile_log(ctx));
                    failures++;
                }
                fg_free(img);
                fg_free(src);
            }
            for (int e = 0; logs[0] && logs[1] && e < FGI_KERNEL_MAX_ENTRIES; e++) {
                const char *entry = fgi_kernel_find(FG_KERNEL_ATTENTION_DECODE)->entries[e];
                if (!entry) break;
                const long pairs = entry_spill(logs[0], entry), d128 = entry_spill(logs[1], entry);
                if (pairs < 0 || d128 < 0 || pairs > d128) {
                    print_error("%s %s %s: %ld bytes of spill stores, the head-dim-128 walk %ld\n", mods[i], archs[k],
                                entry, pairs, d128);
                    failures++;
                }
            }
            free(logs[0]);
            free(logs[1]);
        }
        fg_mod_destroy(m);
    }
    assert_int_equal(failures, 0);
    fg_ctx_destroy(ctx);
}

/* Every kind that runs score_mod compiles with approximate math for each
 * arch it takes (the Hopper ones for sm_90a only), without a warning, and
 * the PTX holds the instructions the bounds are stated for. */
static void test_approx_compiles(void **state) {
    (void)state;
    fg_ctx *ctx = new_ctx();
    fg_mod *mods[2] = {NULL, NULL};
    assert_int_equal(fg_mod_from_source(ctx, "approx.c", APPROX_SRC, (size_t)-1, &mods[0]), FG_OK);
    mods[1] = load(ctx, "mods/softcap.c");
    static const char *const archs[2] = {"sm_80", "sm_90a"};
    int failures = 0;
    for (int mi = 0; mi < 2; mi++)
        for (size_t k = 0; k < NAPPROX_KINDS; k++)
            for (int ai = 0; ai < 2; ai++) {
                const bool hopper = approx_kinds[k].kind == FG_KERNEL_ATTENTION_FWD_SM90 ||
                                    approx_kinds[k].kind == FG_KERNEL_ATTENTION_BWD_SM90;
                if (hopper && ai == 0) continue;
                /* every kind and arch for softcap; APPROX_SRC once per kind */
                if (mi == 0 && !hopper && ai == 1) continue;
                fg_kernel_config c = approx_config(k, 1);
                c.arch = archs[ai];
                c.dtype = (k + (size_t)ai) % 2 ? FG_FP16 : FG_BF16;
                char *src = NULL;
                assert_int_equal(fg_generate_source(ctx, mods[mi], &c, &src), FG_OK);
                void *img = NULL;
                size_t size = 0;
                char *log = NULL;
                const bool ptx = mi == 0; /* read the instructions back */
                fg_status st = fgi_nvrtc_compile_verbose(ctx, src, approx_kinds[k].label, archs[ai],
                                                         ptx ? FG_EMIT_PTX : FG_EMIT_CUBIN, &img, &size, &log);
                const char *what = mi == 0 ? "approx.c" : "softcap";
                if (st != FG_OK) {
                    print_error("%s %s %s: %s\n%s\n", what, approx_kinds[k].label, archs[ai], fg_errmsg(ctx),
                                log ? log : "");
                    failures++;
                } else if (log && strstr(log, "warning")) {
                    print_error("%s %s %s: NVRTC warnings:\n%s\n", what, approx_kinds[k].label, archs[ai], log);
                    failures++;
                } else if (!ptx && hopper && hopper_report_bad(log, approx_kinds[k].kind)) {
                    /* the Hopper kernels' wgmma pipelines, as test_gallery_compiles holds them */
                    print_error("%s %s: ptxas report:\n%s\n", what, approx_kinds[k].label, log ? log : "(none)");
                    failures++;
                } else if (ptx) {
                    static const char *const insns[] = {"tanh.approx.f32", "ex2.approx.f32", "lg2.approx.f32",
                                                        "rsqrt.approx.f32", "div.full.f32"};
                    for (size_t i = 0; i < sizeof insns / sizeof insns[0]; i++)
                        if (!memmem(img, size, insns[i], strlen(insns[i]))) {
                            print_error("%s %s %s: no %s in the PTX\n", what, approx_kinds[k].label, archs[ai],
                                        insns[i]);
                            failures++;
                        }
                }
                free(log);
                fg_free(img);
                fg_free(src);
            }
    fg_mod_destroy(mods[0]);
    fg_mod_destroy(mods[1]);
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* ---- the CLI ------------------------------------------------------------------ */

typedef struct cli_result {
    int code;
    char err[4096];
    char out[8192];
} cli_result;

static char tmpdir[64]; /* scratch files of the CLI tests */

static const char *tmp(const char *name) {
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", tmpdir, name);
    return p;
}

/* Run the tool with a shell command line tail; stdout and stderr captured. */
static void run_cli(const char *args, cli_result *r) {
    const char *cli = getenv("FLEXGEN_CLI");
    if (!cli) {
        print_error("FLEXGEN_CLI is not set (meson sets it)\n");
        fail();
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>'%s' >'%s'", cli, args, tmp("stderr.txt"), tmp("stdout.txt"));
    int st = system(cmd);
    assert_true(st != -1 && WIFEXITED(st));
    r->code = WEXITSTATUS(st);
    char *e = tu_read_file(tmp("stderr.txt")), *o = tu_read_file(tmp("stdout.txt"));
    snprintf(r->err, sizeof r->err, "%s", e ? e : "");
    snprintf(r->out, sizeof r->out, "%s", o ? o : "");
    free(e);
    free(o);
    remove(tmp("stderr.txt"));
    remove(tmp("stdout.txt"));
}

static void test_cli(void **state) {
    (void)state;
    cli_result r;
    char bad[128], args[256];
    snprintf(bad, sizeof bad, "%s", tmp("bad.c"));
    FILE *f = fopen(bad, "w");
    assert_non_null(f);
    fputs("bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n    return q_idx >= kv_ix;\n}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--mask '%s'", bad);
    run_cli(args, &r);
    remove(bad);
    assert_int_equal(r.code, 2);
    assert_non_null(strstr(r.err, "bad.c:2:21"));
    assert_non_null(strstr(r.err, "kv_ix"));
    assert_non_null(strstr(r.err, "return q_idx >= kv_ix;\n"));
    assert_non_null(strstr(r.err, " ^~~~~\n"));
    assert_string_equal(r.out, "");

    static const struct {
        const char *args;
        int code;
        const char *in_stderr; /* or in stdout for code 0 */
    } rows[] = {
        {"--expr-mask 'q_idx >= '", 2, "^"},
        {"--expr-mask 'q_idx >= kv_idx' --dtype fp32", 1, "fp32"},
        {"--bogus", 1, "--bogus"},
        {"", 1, "usage"},
        {"--mask mods/causal.c --head-dim 24", 6, "head dim 24"},
        {"nonsense", 1, "nonsense"},
        {"--help", 0, "Exit codes"},
        {"--version", 0, FLEXGEN_VERSION_STRING},
        {"--expr-mask 'q_idx >= kv_idx' --canonical",
         0, "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n    return q_idx >= kv_idx;\n}\n"},
        {"--expr-mask 'q_idx - kv_idx <= W' --param int:W=4 --emit mod", 0,
         "return fg_isub(q_idx, kv_idx) <= p.W;"},
        {"--mask mods/causal.c --kernel blockmask --block 64", 0, "#define FG_Q_BLOCK 64\n"},
        {"--mask mods/causal.c --score mods/softcap.c --emit mod", 0, "tanhf(fg_fdiv_by(score, p.SOFTCAP, p.fg_rcp_SOFTCAP))"},
        {"--mask mods/causal.c --score mods/softcap.c --emit mod --approx-math", 0,
         "fg_tanh_approx(fg_fdiv_approx(score, p.SOFTCAP))"},
        {"--mask mods/softcap.c --approx-math --kernel decode", 0, "#define FG_APPROX_MATH 1\n"},
        /* usage errors of check and bench --decode: found before any GPU is looked for */
        {"check --mask mods/causal.c --batch 2 --q-len 1 --kv-lens 5,6,7", 1, "one per sequence of --batch 2"},
        {"check --mask mods/causal.c --batch 2 --q-len 1 --kv-lens 5,x", 1, "'x' is not a whole number"},
        {"check --mask mods/causal.c --batch 2 --q-len 1 --kv-len 4 --kv-lens 5,1", 1, "past --kv-len 4"},
        {"check --mask mods/causal.c --batch 2 --q-len 1 --q-offsets 1,2 --q-offset 3", 1, "not both"},
        {"check --mask mods/causal.c --batch 2 --q-len 1 --kv-lens 3,4 --block-mask", 1, "q offsets differ"},
        {"check --mask mods/causal.c --q-len 1 --paged --backward", 1, "--backward goes without --paged"},
        {"check --mask mods/causal.c --batch 2 --q-len 1 --kv-lens 3,4 --backward", 1, "--backward goes without"},
        {"check --mask mods/causal.c --q-len 1 --page-size 24", 1, "power of two"},
        {"check --mask mods/causal.c --q-len 1 --decode-kernel 3", 1, "decode-kernel"},
        {"check --help", 0, "--kv-lens L1,L2,..."},
        {"check --help", 0, "--approx-math"},
        {"check --help", 0, "--no-buffer-grads leaves"},
        {"check --mask mods/alibi.c --q-len 1 --no-buffer-grads", 1, "mode of the backward"},
        {"check --mask mods/causal.c --q-len 1 --approx-math --page-size 24", 1, "power of two"},
        {"bench --decode --batch 4", 1, "--shapes B:KV:Q"},
        {"bench --decode --shapes 1:2", 1, "is not B:KV:Q"},
        {"bench --decode --pages 0,24", 1, "power of two"},
        {"bench --decode --heads 12 --kv-heads 8", 1, "not a multiple of --kv-heads 8"},
        {"bench --decode --backward", 1, "forward only"},
        {"bench --shapes 1:2:3", 1, "go with --decode"},
        {"bench --help", 0, "--pages LIST"},
        {"bench --help", 0, "--approx-math"},
        {"bench --approx-math --shapes 1:2:3", 1, "go with --decode"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        run_cli(rows[i].args, &r);
        const char *text = rows[i].code == 0 ? r.out : r.err;
        if (r.code != rows[i].code || !strstr(text, rows[i].in_stderr)) {
            print_error("flexgen %s: exit %d (want %d)\nstdout:\n%.2000s\nstderr:\n%s\n", rows[i].args,
                        r.code, rows[i].code, r.out, r.err);
            fail();
        }
    }
    /* the canonical text of the expression is the file's */
    fg_ctx *ctx = new_ctx();
    fg_mod *m = load(ctx, "mods/causal.c");
    run_cli("--mask mods/causal.c --canonical", &r);
    assert_int_equal(r.code, 0);
    assert_memory_equal(r.out, fg_mod_canonical(m), strlen(fg_mod_canonical(m)));
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

int main(void) {
    if (chdir(tu_source_root()) != 0) {
        fprintf(stderr, "test_emit: cannot enter the source root %s\n", tu_source_root());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),          cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_identity_score),  cmocka_unit_test(test_hopper_report_rule),
        cmocka_unit_test(test_line_directives), cmocka_unit_test(test_composition),
        cmocka_unit_test(test_param_layout),    cmocka_unit_test(test_configs),
        cmocka_unit_test(test_keys),            cmocka_unit_test(test_cli),
        cmocka_unit_test(test_gallery_compiles), cmocka_unit_test(test_launch_geometry),
        cmocka_unit_test(test_o_map_rule),
        cmocka_unit_test(test_divisors), cmocka_unit_test(test_float_divisors),
        cmocka_unit_test(test_approx_keys),     cmocka_unit_test(test_approx_compiles),
        cmocka_unit_test(test_order_forms),
        cmocka_unit_test(test_dense_form),
        cmocka_unit_test(test_decode_pairs),
        cmocka_unit_test(test_decode_head_dims),
        cmocka_unit_test(test_decode_pairs_choice),
        cmocka_unit_test(test_decode_tiles),
        cmocka_unit_test(test_decode_l2_prefetch),
    };
    /* a run can take some of the tests only (the gallery's compiles take
     * minutes) */
    const char *filter = getenv("FLEXGEN_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/flexgen_test_emit_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "test_emit: cannot make a scratch folder\n");
        return 1;
    }
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    rmdir(tmpdir);
    return failed;
}
