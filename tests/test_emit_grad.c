/*
 * test_emit_grad.c -- the derivatives of score_mod printed as CUDA
 * (fgi_emit_grad) and the backward kernels they feed
 * (templates/attention/attention_bwd.cuh), compiled with NVRTC: no GPU.
 *
 * For every gallery mod, and mods that read float buffers in several places,
 * the source a backward kernel is made of (common.cuh, the emitted mod, its
 * derivatives, mma_sm80.cuh, the backward template) compiles for sm_80 and
 * sm_90a in bf16 and fp16 at head dims 64 and 128 (and one odd head dim)
 * without an NVRTC warning and without a spill, and so does the Hopper
 * backward's (wgmma_sm90.cuh and attention_bwd_sm90.cuh after it) for
 * sm_90a. Then the text: which buffers get gradient
 * slots, the derivative functions present, and #line back to the mod.
 */
#include "testutil.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "codegen/codegen.h"

static const char *const GALLERY[] = {"noop",     "causal",  "sliding_window", "prefix_lm",
                                      "document", "jagged",  "sasa",           "natten",
                                      "alibi",    "softcap", "flamingo",       "dilated",
                                      "local_global"};

static const char TWO_READS[] =
    "const float *bias;\nconst float *temp;\nconst int *doc;\n"
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
    "    float t = temp[h] + 1.0f;\n"
    "    return score / t + bias[(q_idx - kv_idx) & 15] * (float)doc[kv_idx];\n}\n";

/* The backward source of `mod`, as the library assembles it (the registry's
 * row of `kind`: FG_KERNEL_ATTENTION_BWD or _SM90). */
static char *bwd_source_of(fg_ctx *ctx, const fg_mod *mod, fg_kernel_kind kind, const char *dtype, int d) {
    fg_kernel_config c = FG_KERNEL_CONFIG_INIT;
    c.kind = kind;
    c.dtype = strcmp(dtype, "FP16") == 0 ? FG_FP16 : FG_BF16;
    c.head_dim = d;
    char *src = NULL;
    assert_int_equal(fg_generate_source(ctx, mod, &c, &src), FG_OK);
    /* fg_free'd sources are malloc'd: the caller's free() is fine */
    return src;
}
static char *bwd_source(fg_ctx *ctx, const fg_mod *mod, const char *dtype, int d) {
    return bwd_source_of(ctx, mod, FG_KERNEL_ATTENTION_BWD, dtype, d);
}

/* compile_clean's spill budget. The portable kernels: 24 bytes, which
 * causal's dK/dV pass spills at head dims 128 to 256 since its element
 * loop has no branch per element (attention_notes v29: measured +16% at
 * 192 and +28% at 96 all the same). The Hopper dK/dV pass holds dK, dV,
 * S^T and dP^T (192 registers of its 240) through the element loop, and
 * mods with costly derivatives (ALiBi's buffer gradient, softcap's tanh)
 * spill a few loop-invariant values there. */
#define PORTABLE_SPILL_BUDGET 24
static int spill_budget = PORTABLE_SPILL_BUDGET;

static void compile_clean(fg_ctx *ctx, const char *name, const char *src, const char *arch) {
    void *image = NULL;
    size_t size = 0;
    char *log = NULL;
    fg_status st = fgi_nvrtc_compile_verbose(ctx, src, "bwd", arch, FG_EMIT_CUBIN, &image, &size, &log);
    if (st != FG_OK) fail_msg("%s (%s): %s\n%s", name, arch, fg_errmsg(ctx), log ? log : "");
    bool spills = false;
    for (const char *s = log; s && (s = strstr(s, " bytes spill stores")); s++) {
        const char *n = s;
        while (n > log && n[-1] >= '0' && n[-1] <= '9') n--;
        spills |= atoi(n) > spill_budget;
    }
    if (log && (strstr(log, "warning") || spills))
        fail_msg("%s (%s): NVRTC / ptxas said:\n%s", name, arch, log);
    free(image);
    free(log);
}

static void test_gallery_compiles(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    static const struct {
        const char *dtype, *arch;
        int d;
    } cfgs[] = {{"BF16", "sm_90a", 128}, {"FP16", "sm_80", 64}, {"BF16", "sm_80", 80}};
    for (size_t i = 0; i < sizeof GALLERY / sizeof GALLERY[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, GALLERY[i]);
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            /* every config for two mods, one config (rotating) for the rest */
            if (i >= 2 && c != i % 3) continue;
            char *src = bwd_source(ctx, m, cfgs[c].dtype, cfgs[c].d);
            char what[96];
            snprintf(what, sizeof what, "%s, %s, head dim %d", GALLERY[i], cfgs[c].dtype, cfgs[c].d);
            compile_clean(ctx, what, src, cfgs[c].arch);
            free(src);
        }
        /* the Hopper backward: head dims 64 and 128, sm_90a; ptxas must not
         * serialise its wgmma (a warning fails compile_clean) */
        const int hd = i % 2 ? 64 : 128;
        char *src = bwd_source_of(ctx, m, FG_KERNEL_ATTENTION_BWD_SM90, i % 3 ? "BF16" : "FP16", hd);
        char what[96];
        snprintf(what, sizeof what, "%s, Hopper, head dim %d", GALLERY[i], hd);
        spill_budget = 160;
        compile_clean(ctx, what, src, "sm_90a");
        spill_budget = PORTABLE_SPILL_BUDGET;
        free(src);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

static void test_buffer_slots(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "two_reads.c", TWO_READS, (size_t)-1, &m), FG_OK);
    fgi_buf b = {0};
    assert_int_equal(fgi_emit_grad(ctx, m, "x.cu", &b), FG_OK);
    char *text = fgi_buf_take(&b);
    /* float buffers read get a slot; the int buffer does not */
    assert_non_null(strstr(text, "long long *__restrict__ bias;"));
    assert_non_null(strstr(text, "long long *__restrict__ temp;"));
    assert_null(strstr(text, "__restrict__ doc;"));
    assert_non_null(strstr(text, "fg_score_grad("));
    assert_non_null(strstr(text, "fg_grad_index1("));
    assert_null(strstr(text, "fg_grad_index2("));
    assert_non_null(strstr(text, "#line 5 \"two_reads.c\""));
    assert_non_null(strstr(text, "fg_grad_add(g.bias, c.i"));
    assert_non_null(strstr(text, "fg_grad_add_warp(g.bias, c.i"));
    free(text);
    char *src = bwd_source(ctx, m, "BF16", 64);
    compile_clean(ctx, "two_reads", src, "sm_80");
    compile_clean(ctx, "two_reads", src, "sm_90a");
    free(src);
    src = bwd_source_of(ctx, m, FG_KERNEL_ATTENTION_BWD_SM90, "BF16", 128);
    /* two gradient sites keep the read of S^T's accumulators (FGS_FIRST_
     * WRITE_ONLY); since the dQ storers (72f865d) ptxas spills 212 bytes
     * stored and 68 loaded here, where it spilled 152 and 332: more
     * stores, a fifth of the loads (the storers' own registers, 24 a
     * thread, among them); since the rotated q walk (attention_notes v40)
     * 236 and 104, the producer's (15 spill instructions -> 27) and one
     * more in the consumers; since the walk with its entries a block
     * ahead and dK staged in a free stage (attention_notes v42) 284 and
     * 168, again mostly the producer's (27 spill instructions -> 43, the
     * consumers' 58 -> 61); since the stage's rows barrier (attention_notes
     * v45) 316 and 192, the producer's wait on it */
    spill_budget = 320;
    compile_clean(ctx, "two_reads, Hopper", src, "sm_90a");
    spill_budget = PORTABLE_SPILL_BUDGET;
    free(src);
    fg_mod_destroy(m);

    /* A mask alone: the derivative is 1 and nothing is accumulated. */
    assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, "q_idx >= kv_idx", NULL, 0, &m), FG_OK);
    fgi_buf c = {0};
    assert_int_equal(fgi_emit_grad(ctx, m, NULL, &c), FG_OK);
    text = fgi_buf_take(&c);
    assert_non_null(strstr(text, "return 1.0f;"));
    assert_null(strstr(text, "fg_grad_add(g."));
    free(text);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* FG_SCORE_GRAD_CONST: 1 where d score_mod / d score is a finite
 * constant (the backward then drops its guard against an infinite
 * derivative where P underflows), 0 where it depends on anything. */
static void test_grad_const(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    static const struct {
        fg_mod_kind kind;
        const char *expr;
        int want;
    } cases[] = {
        {FG_MASK_MOD, "q_idx >= kv_idx", 1},                    /* no score_mod: 1 */
        {FG_SCORE_MOD, "score + (float)(kv_idx - q_idx)", 1},  /* ALiBi's shape */
        {FG_SCORE_MOD, "score * 2.0f", 1},
        {FG_SCORE_MOD, "(float)q_idx", 1},                      /* 0 everywhere */
        {FG_SCORE_MOD, "score * score", 0},
        {FG_SCORE_MOD, "tanhf(score)", 0},
        {FG_SCORE_MOD, "score * (float)h", 0},
        {FG_SCORE_MOD, "q_idx >= kv_idx ? score : 0.0f", 0},
        {FG_SCORE_MOD, "score * INFINITY", 0},                  /* constant, not finite */
        {FG_SCORE_MOD, "score * (1.0f / 0.0f)", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_mod *m = NULL;
        fg_status st = fg_mod_from_expr(ctx, cases[i].kind, cases[i].expr, NULL, 0, &m);
        if (st != FG_OK) fail_msg("case %zu: %s", i, fg_error_diagnostic(ctx));
        fgi_buf b = {0};
        assert_int_equal(fgi_emit_grad(ctx, m, NULL, &b), FG_OK);
        char *text = fgi_buf_take(&b);
        char want[48];
        snprintf(want, sizeof want, "#define FG_SCORE_GRAD_CONST %d\n", cases[i].want);
        if (!strstr(text, want)) fail_msg("case %zu (%s): expected %s in:\n%s", i, cases[i].expr, want, text);
        free(text);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_const),
        cmocka_unit_test(test_buffer_slots),
        cmocka_unit_test(test_gallery_compiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
