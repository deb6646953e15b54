/* test_abi_structs.c -- the public argument structs that may grow
 * (fg_kernel_config, fg_block_mask_desc, fg_attention_args) read as
 * flexgen.h's Conventions say, through the entry points that take them.
 *
 * Each struct is passed as a caller of every kind would pass it: a 0.1
 * caller (struct_size 0), one compiled with this header (sizeof), one
 * compiled with a newer header whose extra fields are all zero (accepted:
 * the same answer as the others) or one of them set (FG_ERR_NOT_SUPPORTED),
 * and a struct_size nobody set (too small, or absurdly large:
 * FG_ERR_INVALID_ARGUMENT). The answer of every accepted call must equal
 * the 0.1 caller's, and a refused call must be refused before it touches a
 * device, so this runs without a GPU. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define TAIL 24 /* bytes a "newer header" adds */

typedef enum caller {
    OLD,        /* struct_size 0: the 0.1 layout                  */
    EXACT,      /* struct_size = sizeof                           */
    NEWER_ZERO, /* a larger struct, extra bytes zero              */
    NEWER_SET,  /* a larger struct, one extra byte set            */
    TOO_SMALL,  /* non-zero, under the 0.1 layout                 */
    ABSURD      /* no struct is that large                        */
} caller;

static const struct {
    caller who;
    const char *name;
    fg_status want;
    const char *words; /* in the message of a refusal */
} callers[] = {
    {OLD, "0.1 caller", FG_OK, NULL},
    {EXACT, "this header", FG_OK, NULL},
    {NEWER_ZERO, "newer header, defaults", FG_OK, NULL},
    {NEWER_SET, "newer header, a new field set", FG_ERR_NOT_SUPPORTED, "newer flexgen"},
    {TOO_SMALL, "struct_size too small", FG_ERR_INVALID_ARGUMENT, "struct_size is 8"},
    {ABSURD, "struct_size absurd", FG_ERR_INVALID_ARGUMENT, "uninitialised"},
};
#define NCALLERS (sizeof callers / sizeof callers[0])

/* The struct as `who` passes it: the 0.1 fields of `base` (its first `v01`
 * bytes, where struct_size starts), then zeros up to the library's `size`
 * and TAIL bytes a newer header would add; struct_size set for `who`.
 * Freed by the caller. */
static void *as_caller(const void *base, size_t v01, size_t size, caller who) {
    unsigned char *p = calloc(1, size + TAIL);
    assert_non_null(p);
    memcpy(p, base, v01);
    size_t claim = 0;
    switch (who) {
    case OLD: claim = 0; break;
    case EXACT: claim = size; break;
    case NEWER_ZERO: claim = size + TAIL; break;
    case NEWER_SET: claim = size + TAIL, p[size + TAIL - 3] = 1; break;
    case TOO_SMALL: claim = 8; break;
    case ABSURD: claim = (size_t)1 << 40; break;
    }
    memcpy(p + v01, &claim, sizeof claim);
    return p;
}

#define AS_CALLER(T, base, who) \
    ((T *)as_caller((base), offsetof(T, struct_size), sizeof(T), (who)))

static void check_refusal(fg_ctx *ctx, size_t i, fg_status st) {
    if (st != callers[i].want)
        print_error("%s: got %s (%s)\n", callers[i].name, fg_status_string(st), fg_errmsg(ctx));
    assert_int_equal(st, callers[i].want);
    if (callers[i].words && !strstr(fg_errmsg(ctx), callers[i].words)) {
        print_error("%s: message '%s' lacks '%s'\n", callers[i].name, fg_errmsg(ctx), callers[i].words);
        fail();
    }
}

static fg_mod *mod_src(fg_ctx *ctx, const char *text) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "test", text, (size_t)-1, &m);
    if (st != FG_OK) print_error("%s\n%s\n", fg_status_string(st), fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

static const char WINDOW[] = "int WINDOW = 3;\n"
                             "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
                             "{ return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW; }\n";

/* ---- the layouts ---------------------------------------------------------- */

static void test_layouts(void **state) {
    (void)state;
    /* struct_size sits right after the 0.1 fields; later fields come after
     * it (the 0.2 fields: fg_kernel_config's ragged, fg_attention_args'
     * ragged, paged and workspace ones, fg_block_mask_desc's offsets,
     * fg_attention_bwd_args' workspace). */
    assert_int_equal(offsetof(fg_kernel_config, struct_size) + sizeof(size_t), offsetof(fg_kernel_config, ragged));
    assert_int_equal(offsetof(fg_kernel_config, ragged) + sizeof(int), offsetof(fg_kernel_config, approx_math));
    assert_int_equal(offsetof(fg_kernel_config, approx_math) + sizeof(int), offsetof(fg_kernel_config, lead_first));
    assert_int_equal(offsetof(fg_kernel_config, lead_first) + sizeof(int), offsetof(fg_kernel_config, head_pairs));
    assert_int_equal(offsetof(fg_kernel_config, head_pairs) + sizeof(int), offsetof(fg_kernel_config, dense));
    assert_int_equal(offsetof(fg_block_mask_desc, struct_size) + sizeof(size_t), offsetof(fg_block_mask_desc, q_offset));
    assert_int_equal(offsetof(fg_attention_args, struct_size) + sizeof(size_t), offsetof(fg_attention_args, kv_lens));
    assert_int_equal(offsetof(fg_attention_bwd_args, struct_size) + sizeof(size_t),
                     offsetof(fg_attention_bwd_args, workspace));
    if (sizeof(void *) == 8) { /* the 0.1 sizes on LP64: they never change */
        assert_int_equal(offsetof(fg_kernel_config, struct_size), 32);
        assert_int_equal(sizeof(fg_kernel_config), 64); /* approx_math took ragged's padding, lead_first 8 more, head_pairs their padding, dense 8 more */
        assert_int_equal(offsetof(fg_block_mask_desc, struct_size), 24);
        assert_int_equal(offsetof(fg_attention_args, struct_size), 248);
        assert_int_equal(offsetof(fg_attention_bwd_args, struct_size), 192);
    }
    /* The initialisers: every field zero, struct_size set. */
    fg_kernel_config c = FG_KERNEL_CONFIG_INIT, c2 = fg_kernel_config_init();
    fg_block_mask_desc d = FG_BLOCK_MASK_DESC_INIT, d2 = fg_block_mask_desc_init();
    fg_attention_args a = FG_ATTENTION_ARGS_INIT, a2 = fg_attention_args_init();
    assert_int_equal(c.struct_size, sizeof c);
    assert_int_equal(d.struct_size, sizeof d);
    assert_int_equal(a.struct_size, sizeof a);
    const fg_kernel_config *cs[2] = {&c, &c2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(cs[i]->kind, 0);
        assert_int_equal(cs[i]->dtype, 0);
        assert_int_equal(cs[i]->head_dim + cs[i]->q_block + cs[i]->kv_block, 0);
        assert_null(cs[i]->arch);
        assert_int_equal(cs[i]->ragged, 0);
        assert_int_equal(cs[i]->approx_math, 0);
        assert_int_equal(cs[i]->struct_size, sizeof(fg_kernel_config));
    }
    assert_memory_equal(&d, &d2, sizeof d); /* six ints, a size_t, two ints: no padding */
    assert_int_equal(d.batch + d.heads + d.q_len + d.kv_len + d.q_block + d.kv_block, 0);
    assert_int_equal(d.q_offset + d.kv_offset, 0);
    const fg_attention_args *as[2] = {&a, &a2};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(as[i]->batch + as[i]->head_dim + as[i]->q_offset + as[i]->kv_offset, 0);
        assert_true(as[i]->scale == 0.f);
        assert_null(as[i]->q);
        assert_null(as[i]->block_mask);
        assert_null(as[i]->binds);
        assert_null(as[i]->stream);
        assert_null(as[i]->kv_lens);
        assert_null(as[i]->q_offsets);
        assert_null(as[i]->block_table);
        assert_int_equal(as[i]->page_size + as[i]->num_pages + as[i]->max_pages, 0);
        assert_null(as[i]->workspace);
        assert_int_equal(as[i]->workspace_size, 0);
        assert_int_equal(as[i]->struct_size, sizeof(fg_attention_args));
    }
    fg_attention_bwd_args b = FG_ATTENTION_BWD_ARGS_INIT, b2 = fg_attention_bwd_args_init();
    const fg_attention_bwd_args *bs[2] = {&b, &b2};
    for (int i = 0; i < 2; i++) {
        assert_null(bs[i]->fwd);
        assert_null(bs[i]->dout);
        assert_int_equal(bs[i]->ngrad_binds + (size_t)bs[i]->deterministic, 0);
        assert_null(bs[i]->workspace);
        assert_int_equal(bs[i]->workspace_size, 0);
        assert_int_equal(bs[i]->struct_size, sizeof(fg_attention_bwd_args));
    }
}

/* ---- fg_kernel_config ------------------------------------------------------ */

static void test_kernel_config(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = mod_src(ctx, WINDOW);
    const fg_kernel_config configs[] = {
        {FG_KERNEL_ATTENTION_FWD, FG_FP16, 64, 0, 0, NULL},
        {FG_KERNEL_BLOCK_MASK, 0, 0, 64, 128, NULL},
        {FG_KERNEL_ATTENTION_FWD_SM90, FG_BF16, 128, 0, 0, NULL},
    };
    for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
        char *want = NULL;
        assert_int_equal(fg_generate_source(ctx, m, &configs[k], &want), FG_OK);
        for (size_t i = 0; i < NCALLERS; i++) {
            fg_kernel_config *c = AS_CALLER(fg_kernel_config, &configs[k], callers[i].who);
            char *src = NULL;
            fg_status st = fg_generate_source(ctx, m, c, &src);
            check_refusal(ctx, i, st);
            if (st == FG_OK) assert_string_equal(src, want);
            else assert_null(src);
            fg_free(src);
            /* fg_kernel_get reads the struct before it looks for a device */
            if (callers[i].want != FG_OK) {
                fg_kernel *kernel = NULL;
                check_refusal(ctx, i, fg_kernel_get(ctx, m, c, &kernel));
                assert_null(kernel);
            }
            free(c);
        }
        fg_free(want);
    }
    /* 0.2's ragged: its own source for the portable forward (FG_RAGGED 1,
     * named -ragged), ignored by the kinds without a ragged form, refused
     * by the Hopper forward */
    fg_kernel_config rc = fg_kernel_config_init(), plain = fg_kernel_config_init();
    rc.kind = plain.kind = FG_KERNEL_ATTENTION_FWD;
    rc.ragged = 1;
    char *rs = NULL, *ps = NULL;
    assert_int_equal(fg_generate_source(ctx, m, &rc, &rs), FG_OK);
    assert_int_equal(fg_generate_source(ctx, m, &plain, &ps), FG_OK);
    assert_non_null(strstr(rs, "#define FG_RAGGED 1\n"));
    assert_non_null(strstr(rs, "-ragged.cu"));
    assert_non_null(strstr(ps, "#define FG_RAGGED 0\n"));
    fg_free(rs), fg_free(ps);
    rc.kind = plain.kind = FG_KERNEL_ATTENTION_DECODE;
    assert_int_equal(fg_generate_source(ctx, m, &rc, &rs), FG_OK);
    assert_int_equal(fg_generate_source(ctx, m, &plain, &ps), FG_OK);
    assert_string_equal(rs, ps);
    fg_free(rs), fg_free(ps);
    rc.kind = FG_KERNEL_ATTENTION_FWD_SM90;
    assert_int_equal(fg_generate_source(ctx, m, &rc, &rs), FG_ERR_NOT_SUPPORTED);
    /* 0.2's approx_math: its own source (FG_APPROX_MATH 1, named -approx);
     * a caller of the 0.1 layout cannot ask for it (the field is past its
     * struct_size, so not read); 2 is no value of it */
    fg_kernel_config ac = fg_kernel_config_init();
    ac.kind = plain.kind = FG_KERNEL_ATTENTION_FWD;
    ac.approx_math = 1;
    assert_int_equal(fg_generate_source(ctx, m, &ac, &rs), FG_OK);
    assert_int_equal(fg_generate_source(ctx, m, &plain, &ps), FG_OK);
    assert_non_null(strstr(rs, "#define FG_APPROX_MATH 1\n"));
    assert_non_null(strstr(rs, "-approx.cu"));
    assert_null(strstr(ps, "FG_APPROX_MATH"));
    fg_free(rs);
    ac.struct_size = 0;
    assert_int_equal(fg_generate_source(ctx, m, &ac, &rs), FG_OK);
    assert_string_equal(rs, ps);
    fg_free(rs), fg_free(ps);
    ac.struct_size = sizeof ac, ac.approx_math = 2;
    assert_int_equal(fg_generate_source(ctx, m, &ac, &rs), FG_ERR_INVALID_ARGUMENT);
    assert_null(rs);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* ---- fg_block_mask_desc ------------------------------------------------------ */

static void test_block_mask_desc(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = mod_src(ctx, WINDOW);
    const fg_block_mask_desc shape = {2, 1, 100, 70, 32, 16};
    fg_block_mask *want = NULL;
    assert_int_equal(fg_block_mask_create(ctx, m, &shape, NULL, 0, &want), FG_OK);
    const int32_t *want_kv;
    int64_t dims[4];
    assert_int_equal(fg_block_mask_array_get(want, FG_BM_KV_INDICES, &want_kv, NULL, dims), FG_OK);
    const size_t n = (size_t)(dims[0] * dims[1] * dims[2] * dims[3]);
    for (size_t i = 0; i < NCALLERS; i++) {
        fg_block_mask_desc *d = AS_CALLER(fg_block_mask_desc, &shape, callers[i].who);
        fg_block_mask *bm = NULL;
        fg_status st = fg_block_mask_create(ctx, m, d, NULL, 0, &bm);
        check_refusal(ctx, i, st);
        if (st == FG_OK) {
            fg_block_mask_desc got;
            memset(&got, 0xff, sizeof got);
            assert_int_equal(fg_block_mask_get_desc(bm, &got), FG_OK);
            assert_int_equal(got.struct_size, sizeof got);
            assert_int_equal(got.q_len, 100);
            assert_int_equal(got.kv_block, 16);
            const int32_t *kv;
            assert_int_equal(fg_block_mask_array_get(bm, FG_BM_KV_INDICES, &kv, NULL, NULL), FG_OK);
            assert_memory_equal(kv, want_kv, n * sizeof *kv);
            /* what get_desc returns goes back in as it is */
            fg_block_mask *again = NULL;
            assert_int_equal(fg_block_mask_create(ctx, m, &got, NULL, 0, &again), FG_OK);
            fg_block_mask_destroy(again);
        } else {
            assert_null(bm);
            int32_t num[2 * 4] = {0}, idx[2 * 4 * 5] = {0};
            check_refusal(ctx, i, fg_block_mask_from_kv_blocks(ctx, d, num, idx, NULL, NULL, &bm));
            assert_null(bm);
        }
        fg_block_mask_destroy(bm);
        free(d);
    }
    fg_block_mask_destroy(want);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

/* ---- fg_attention_args --------------------------------------------------------- */

#define B 1
#define H 2
#define S 9
#define HD 16

static void test_attention_args(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *m = mod_src(ctx, WINDOW);
    uint16_t *x = calloc(3 * B * H * S * HD, sizeof *x);
    assert_non_null(x);
    uint64_t rng = 7;
    for (size_t i = 0; i < 3 * B * H * S * HD; i++) /* small bf16 values */
        x[i] = (uint16_t)(0x3c00 + (tu_rand_u64(&rng) % 256)) | (uint16_t)(i % 2 ? 0x8000 : 0);
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = HD;
    a.dtype = FG_BF16;
    a.q = x, a.k = x + B * H * S * HD, a.v = x + 2 * B * H * S * HD;
    a.out = x; /* not written by the reference: out and lse are its own */
    fg_binding w = fg_bind_int("WINDOW", 2);
    a.binds = &w, a.nbinds = 1;
    const size_t n = (size_t)B * H * S * HD, nl = (size_t)B * H * S;
    double *want = malloc(n * sizeof *want), *want_lse = malloc(nl * sizeof *want_lse);
    double *out = malloc(n * sizeof *out), *lse = malloc(nl * sizeof *lse);
    assert_true(want && want_lse && out && lse);
    assert_int_equal(fg_attention_reference(ctx, m, &a, want, want_lse), FG_OK);
    for (size_t i = 0; i < NCALLERS; i++) {
        fg_attention_args *c = AS_CALLER(fg_attention_args, &a, callers[i].who);
        memset(out, 0, n * sizeof *out);
        fg_status st = fg_attention_reference(ctx, m, c, out, lse);
        check_refusal(ctx, i, st);
        if (st == FG_OK) {
            assert_memory_equal(out, want, n * sizeof *out);
            assert_memory_equal(lse, want_lse, nl * sizeof *lse);
        } else {
            /* the GPU entry points refuse it the same way, before any
             * device is asked for (the pointers here are host memory) */
            check_refusal(ctx, i, fg_attention_forward(ctx, m, c));
        }
        free(c);
    }
    free(want);
    free(want_lse);
    free(out);
    free(lse);
    free(x);
    fg_mod_destroy(m);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_kernel_config),
        cmocka_unit_test(test_block_mask_desc),
        cmocka_unit_test(test_attention_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
