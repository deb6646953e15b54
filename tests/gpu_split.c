/*
 * gpu_split.c -- on the device, the split mods give what the whole mods
 * give: every (q_idx, kv_idx) of a square, for every gallery mod and a
 * composition, with buffers full of values that index in and out of range
 * (out-of-range loads give 0 on the GPU, and the split reads them
 * speculatively), mask results equal and score results equal bit for bit;
 * the index-cast rewrite (FGI_SPLIT_INDEX_FLOATS) inside its range; and
 * the distance form of masks that read q_idx - kv_idx alone, and of
 * score_mods that do; and masks folded over a tile.
 */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "split_check.h"

#define SIDE 300     /* q_idx, kv_idx in [0, SIDE)       */
#define BUF_LEN 257  /* buffer elements: shorter than SIDE */

typedef struct check_source {
    const fg_mod *mod;
    unsigned flags; /* FGI_SPLIT_* */
} check_source;

static fg_status gen(fg_ctx *ctx, void *arg, char **out) {
    const check_source *c = arg;
    return split_check_source_flags(ctx, c->mod, c->flags, out);
}

static void check_ok(fg_ctx *ctx, fg_status st) {
    if (st != FG_OK) print_error("%s: %s\n%s\n", fg_status_string(st), fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
}

/* Buffers: ints in [-2, 40) (ids, offsets, indices that are sometimes out
 * of range), floats in [-1, 1). */
static fg_status fill_values(fg_ctx *ctx, const fg_mod *m, fgi_value *vals, CUdeviceptr *bufs,
                             uint64_t *rng) {
    const fgi_cu_api *cu = fgi_cu();
    for (int i = 0; i < m->nparams; i++) {
        const fgi_param *prm = &m->params[i];
        if (prm->kind == FG_PARAM_SCALAR) {
            if (prm->type == FGI_T_INT) vals[i].scalar.i = prm->def.i;
            else vals[i].scalar.f = prm->def.f;
            continue;
        }
        int32_t host[BUF_LEN];
        for (int k = 0; k < BUF_LEN; k++) {
            if (prm->type == FGI_T_INT) {
                host[k] = (int32_t)(tu_rand_u64(rng) % 42) - 2;
            } else {
                float f = (float)(tu_rand_uniform(rng) * 2.0 - 1.0);
                memcpy(&host[k], &f, 4);
            }
        }
        FGI_CU_TRY(ctx, cu->cuMemAlloc(&bufs[i], sizeof host), "cuMemAlloc");
        FGI_CU_TRY(ctx, cu->cuMemcpyHtoD(bufs[i], host, sizeof host), "cuMemcpyHtoD");
        vals[i].data = (const void *)(uintptr_t)bufs[i];
        vals[i].length = BUF_LEN;
    }
    return FG_OK;
}

/* Mismatches of mask (bad[0]) and score (bad[1]) over the square of
 * indices base .. base + SIDE - 1 at (b, h), the split made with `flags`;
 * bad[2..4]: the boxes of the fold check (split_check.h). */
static fg_status run_check_at(fg_ctx *ctx, const fg_mod *m, unsigned flags, int base, int b, int h, int bad[5]) {
    check_source cs = {m, flags};
    fgi_kernel_spec spec = {.name = "gpu_split", .entry = "fg_split_check", .gen_source = gen, .gen_arg = &cs};
    char key[4096];
    snprintf(key, sizeof key, "gpu_split check %u\n%s", flags, m->canonical);
    spec.key = key;
    CUfunction fn;
    FGI_TRY(fgi_cache_get_function(ctx, &spec, &fn));
    const fgi_cu_api *cu = fgi_cu();
    fgi_value *vals = calloc((size_t)m->nparams + 1, sizeof *vals);
    CUdeviceptr *bufs = calloc((size_t)m->nparams + 1, sizeof *bufs);
    fgi_param_layout *layout = malloc(sizeof *layout);
    if (!vals || !bufs || !layout) return FG_ERR_OUT_OF_MEMORY;
    uint64_t rng = 0x5eed + (uint64_t)h;
    CUdeviceptr dbad = 0;
    fg_status st = fill_values(ctx, m, vals, bufs, &rng);
    if (st == FG_OK) {
        fgi_param_layout_compute(m, layout);
        unsigned char blob[4096];
        assert_true(layout->size <= sizeof blob);
        fgi_param_pack(m, layout, vals, blob);
        int n = SIDE, zero[5] = {0, 0, 0, 0, 0};
        CUresult r = cu->cuMemAlloc(&dbad, sizeof zero);
        if (r == CUDA_SUCCESS) r = cu->cuMemcpyHtoD(dbad, zero, sizeof zero);
        void *args[] = {blob, &b, &h, &n, &base, &dbad};
        if (r == CUDA_SUCCESS) r = cu->cuLaunchKernel(fn, SIDE, 1, 1, 128, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS) r = cu->cuCtxSynchronize();
        if (r == CUDA_SUCCESS) r = cu->cuMemcpyDtoH(bad, dbad, sizeof zero);
        st = fgi_cu_status(ctx, r, "split check");
    }
    if (dbad) cu->cuMemFree(dbad);
    for (int i = 0; i < m->nparams; i++)
        if (bufs[i]) cu->cuMemFree(bufs[i]);
    free(layout);
    free(bufs);
    free(vals);
    return st;
}

static fg_status run_check(fg_ctx *ctx, const fg_mod *m, int b, int h, int bad[5]) {
    return run_check_at(ctx, m, 0, 0, b, h, bad);
}

static const char *const gallery[] = {"natten", "sasa", "document", "jagged", "flamingo",
                                      "prefix_lm", "sliding_window", "causal", "alibi",
                                      "softcap", "noop", "dilated", "local_global"};

static void split_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    for (size_t i = 0; i < sizeof gallery / sizeof gallery[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, gallery[i]);
        for (int h = 0; h < 3; h++) {
            int bad[5] = {-1, -1, -1, -1, -1};
            check_ok(ctx, run_check(ctx, m, 1, h, bad));
            if (bad[0] || bad[1])
                print_error("%s h=%d: %d mask and %d score mismatches\n", gallery[i], h, bad[0],
                            bad[1]);
            assert_int_equal(bad[0], 0);
            assert_int_equal(bad[1], 0);
        }
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

static void composition_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    fg_mod *a = tu_gallery_mod(ctx, "sasa"), *b = tu_gallery_mod(ctx, "jagged");
    fg_mod *c = tu_gallery_mod(ctx, "prefix_lm"), *ab = NULL, *abc = NULL;
    assert_int_equal(fg_mod_or(ctx, a, b, &ab), FG_OK);
    assert_int_equal(fg_mod_and(ctx, ab, c, &abc), FG_OK);
    int bad[5] = {-1, -1, -1, -1, -1};
    check_ok(ctx, run_check(ctx, abc, 0, 0, bad));
    assert_int_equal(bad[0], 0);
    assert_int_equal(bad[1], 0);
    fg_mod_destroy(abc);
    fg_mod_destroy(ab);
    fg_mod_destroy(c);
    fg_mod_destroy(b);
    fg_mod_destroy(a);
    fg_ctx_destroy(ctx);
}

static void table_limit_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    char *text = split_check_big_mod();
    assert_non_null(text);
    fg_mod *m = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "big", text, strlen(text), &m), FG_OK);
    int bad[5] = {-1, -1, -1, -1, -1};
    check_ok(ctx, run_check(ctx, m, 0, 0, bad));
    assert_int_equal(bad[0], 0);
    assert_int_equal(bad[1], 0);
    fg_mod_destroy(m);
    free(text);
    fg_ctx_destroy(ctx);
}

/* FGI_SPLIT_INDEX_FLOATS: the split's (float)kv_idx - (float)q_idx gives
 * the whole mod's (float)(kv_idx - q_idx) bit for bit wherever both
 * indices lie within 2^24 in magnitude (at 0, just under 2^24 and at
 * -2^24), and not beyond (ALiBi's score from 2^24 + 1000 on): why the
 * kernels that take it refuse such launches. */
static void index_floats_equal_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    const int bases[] = {0, (1 << 24) - SIDE, -(1 << 24)};
    for (size_t i = 0; i < sizeof split_check_index_casts / sizeof split_check_index_casts[0]; i++) {
        const char *text = split_check_index_casts[i].text;
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "casts", text, strlen(text), &m), FG_OK);
        for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++) {
            int bad[5] = {-1, -1, -1, -1, -1};
            check_ok(ctx, run_check_at(ctx, m, FGI_SPLIT_INDEX_FLOATS, bases[k], 0, 1, bad));
            if (bad[0] || bad[1])
                print_error("case %zu at %d: %d mask and %d score mismatches\n", i, bases[k], bad[0], bad[1]);
            assert_int_equal(bad[0], 0);
            assert_int_equal(bad[1], 0);
        }
        fg_mod_destroy(m);
    }
    fg_mod *alibi = tu_gallery_mod(ctx, "alibi");
    int bad[5] = {-1, -1, -1, -1, -1};
    check_ok(ctx, run_check_at(ctx, alibi, FGI_SPLIT_INDEX_FLOATS, (1 << 24) + 1000, 0, 1, bad));
    assert_true(bad[1] > 0);
    check_ok(ctx, run_check_at(ctx, alibi, 0, (1 << 24) + 1000, 0, 1, bad));
    assert_int_equal(bad[1], 0);
    fg_mod_destroy(alibi);
    fg_ctx_destroy(ctx);
}

/* Case i's mask split gives fg_mask_mod's results (check kernel: bad[0])
 * over squares at 0 and far from it, at three heads; `folded`, when
 * given, adds up the boxes that took each folded form (bad[2], bad[3]). */
static void mask_equal_far_and_near(fg_ctx *ctx, const fg_mod *m, size_t i, int folded[2]) {
    const int bases[] = {0, 1000003};
    for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++)
        for (int h = 0; h < 3; h++) {
            int bad[5] = {-1, -1, -1, -1, -1};
            check_ok(ctx, run_check_at(ctx, m, 0, bases[k], 0, h, bad));
            if (bad[0]) print_error("case %zu at %d h=%d: %d mask mismatches\n", i, bases[k], h, bad[0]);
            assert_int_equal(bad[0], 0);
            if (folded) {
                folded[0] += bad[2];
                folded[1] += bad[3];
            }
        }
}

/* fg_mask_dist at q_idx - kv_idx gives fg_mask_mod's results (the check
 * kernel compares them where FG_MASK_DIST), over squares at 0 and far from
 * it, at three heads. */
static void distance_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    for (size_t i = 0; i < sizeof split_check_distance / sizeof split_check_distance[0]; i++) {
        const char *text = split_check_distance[i].text;
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "dist", text, strlen(text), &m), FG_OK);
        mask_equal_far_and_near(ctx, m, i, NULL);
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

/* Where the mask folds over a tile, fg_mask_fold gives fg_mask_mod's
 * results in every box fg_mask_tile_init allows it for (the check kernel
 * compares them where FG_MASK_TILE), over squares at 0 and far from it,
 * at three heads; and the boxes reach both folded forms. */
static void fold_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    for (size_t i = 0; i < sizeof split_check_fold / sizeof split_check_fold[0]; i++) {
        const char *text = split_check_fold[i].text;
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "fold", text, strlen(text), &m), FG_OK);
        int folded[2] = {0, 0};
        mask_equal_far_and_near(ctx, m, i, folded);
        if (split_check_fold[i].tile) { /* the boxes took both folded forms */
            if (!folded[0] || !folded[1]) print_error("case %zu: %d / %d boxes folded\n", i, folded[0], folded[1]);
            assert_true(folded[0] > 0);
            assert_true(folded[1] > 0);
        }
        fg_mod_destroy(m);
    }
    /* a composition, folded leaf by leaf, with the gallery's parameters:
     * its boxes near 0 reach local_global's global keys */
    fg_mod *lg = tu_gallery_mod(ctx, "local_global"), *dil = tu_gallery_mod(ctx, "dilated"), *both = NULL;
    assert_int_equal(fg_mod_or(ctx, lg, dil, &both), FG_OK);
    for (int h = 0; h < 2; h++) {
        int bad[5] = {-1, -1, -1, -1, -1};
        check_ok(ctx, run_check(ctx, both, 0, h, bad));
        if (bad[0]) print_error("local_global || dilated h=%d: %d mask mismatches\n", h, bad[0]);
        assert_int_equal(bad[0], 0);
        assert_true(bad[2] + bad[3] > 0);
    }
    fg_mod_destroy(both);
    fg_mod_destroy(dil);
    fg_mod_destroy(lg);
    fg_ctx_destroy(ctx);
}

/* fg_score_dist of fg_score_diag_init at q_idx - kv_idx gives
 * fg_score_mod's bits (the check kernel compares them where FG_SCORE_DIST),
 * over squares at 0 and far from it, at three heads, with and without the
 * index-cast rewrite beside it. */
static void score_distance_equals_whole(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    const int bases[] = {0, 1000003};
    const unsigned flags[] = {0, FGI_SPLIT_INDEX_FLOATS, FGI_SPLIT_DIST_FLOATS};
    for (size_t i = 0; i < sizeof split_check_score_distance / sizeof split_check_score_distance[0]; i++) {
        const char *text = split_check_score_distance[i].text;
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "sdist", text, strlen(text), &m), FG_OK);
        for (size_t k = 0; k < sizeof bases / sizeof bases[0]; k++)
            for (size_t f = 0; f < sizeof flags / sizeof flags[0]; f++)
                for (int h = 0; h < 3; h++) {
                    int bad[5] = {-1, -1, -1, -1, -1};
                    check_ok(ctx, run_check_at(ctx, m, flags[f], bases[k], 0, h, bad));
                    if (bad[1])
                        print_error("case %zu at %d h=%d flags %u: %d score mismatches\n", i, bases[k], h,
                                    flags[f], bad[1]);
                    assert_int_equal(bad[1], 0);
                }
        fg_mod_destroy(m);
    }
    fg_ctx_destroy(ctx);
}

int main(void) {
    tu_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_equals_whole),
        cmocka_unit_test(composition_equals_whole),
        cmocka_unit_test(table_limit_equals_whole),
        cmocka_unit_test(index_floats_equal_whole),
        cmocka_unit_test(distance_equals_whole),
        cmocka_unit_test(fold_equals_whole),
        cmocka_unit_test(score_distance_equals_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
