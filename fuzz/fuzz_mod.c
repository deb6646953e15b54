/* fuzz_mod.c -- libFuzzer target over the whole front end and the CPU
 * evaluator: any byte string goes through the file form and the expression
 * form; whatever checks is printed canonically, composed with itself,
 * emitted as CUDA (whole and split by dependency) and evaluated on a small
 * tile with every buffer bound to a small host array (so out-of-range
 * indices must come back as FG_ERR_EVAL).
 * Nothing may crash, leak or trip a sanitizer; errors are the expected
 * outcome for most inputs. The same entry point is driven by replay_main.c
 * over fuzz/corpus in every build, and by libFuzzer in scripts/fuzz.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { TILE = 6, BUF_LEN = 8 };

static void bind_all(const fg_mod *mod, fg_binding *binds, size_t *n, const int32_t *ibuf,
                     const float *fbuf) {
    *n = 0;
    for (size_t i = 0; i < fg_mod_param_count(mod) && *n < 16; i++) {
        fg_param_info info;
        if (fg_mod_param(mod, i, &info) != FG_OK || info.kind != FG_PARAM_BUFFER) continue;
        binds[(*n)++] = info.type == FG_TYPE_INT ? fg_bind_int_buffer(info.name, ibuf, BUF_LEN)
                                                 : fg_bind_float_buffer(info.name, fbuf, BUF_LEN);
    }
}

static void exercise(fg_ctx *ctx, const fg_mod *mod) {
    /* canonical text of every function's return expression */
    const fgi_func *fns[2] = {mod->mask && mod->mask->op == FGI_MASK_LEAF ? mod->mask->func : NULL,
                              mod->score};
    for (int k = 0; k < 2; k++) {
        if (!fns[k]) continue;
        char *t = fgi_expr_canonical(mod, fns[k], fns[k]->ret);
        free(t);
    }
    /* emitted CUDA, whole and split by dependency (with every rewrite:
     * index and distance casts as floats, the distance and folded forms) */
    fgi_buf cuda = {0};
    (void)fgi_emit_mod(ctx, mod, &cuda);
    fgi_buf_free(&cuda);
    fgi_buf split = {0};
    (void)fgi_emit_split_math(ctx, mod, FGI_MATH_ACCURATE, FGI_SPLIT_INDEX_FLOATS | FGI_SPLIT_DIST_FLOATS, &split);
    fgi_buf_free(&split);
    /* evaluation on a tile with small buffers */
    static const int32_t ibuf[BUF_LEN] = {0, 1, 2, 3, -1, 7, 2147483647, -2147483647 - 1};
    static const float fbuf[BUF_LEN] = {0.0f, 1.0f, -2.5f, 0.125f, 1e30f, -1e-30f, 3.0f, 0.5f};
    fg_binding binds[16];
    size_t nb;
    bind_all(mod, binds, &nb, ibuf, fbuf);
    uint8_t mask[TILE * TILE];
    float in[TILE * TILE], out[TILE * TILE];
    for (int i = 0; i < TILE * TILE; i++) in[i] = (float)(i % 7) - 3.0f;
    (void)fg_mod_eval_mask(ctx, mod, binds, nb, 0, 1, 0, TILE, 0, TILE, mask);
    (void)fg_mod_eval_mask(ctx, mod, binds, nb, 1, 0, 2, TILE, 5, TILE, mask);
    (void)fg_mod_eval_score(ctx, mod, binds, nb, 0, 1, 0, TILE, 0, TILE, in, out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) return 0;
    fg_mod *m = NULL;
    if (fg_mod_from_source(ctx, "fuzz.c", (const char *)data, size, &m) == FG_OK) {
        exercise(ctx, m);
        fg_mod *twice = NULL;
        if (fg_mod_has_mask(m) && !fg_mod_has_score(m) && fg_mod_and(ctx, m, m, &twice) == FG_OK)
            exercise(ctx, twice);
        fg_mod_destroy(twice);
        fg_mod_destroy(m);
    } else {
        (void)fg_error_diagnostic(ctx);
    }
    /* the same bytes as a bare expression, with a few declared parameters */
    char *expr = malloc(size + 1);
    if (expr) {
        memcpy(expr, data, size);
        expr[size] = '\0';
        static const fg_param_decl params[] = {
            {"W", FG_PARAM_SCALAR, FG_TYPE_INT, 4},
            {"T", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.5},
            {"doc", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
            {"slopes", FG_PARAM_BUFFER, FG_TYPE_FLOAT, 0},
        };
        fg_mod_kind kind = size && (data[0] & 1) ? FG_SCORE_MOD : FG_MASK_MOD;
        if (fg_mod_from_expr(ctx, kind, expr, params, 4, &m) == FG_OK) {
            exercise(ctx, m);
            fg_mod_destroy(m);
        } else {
            (void)fg_error_diagnostic(ctx);
        }
        free(expr);
    }
    fg_ctx_destroy(ctx);
    return 0;
}
