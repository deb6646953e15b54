/* test_core.c -- context, options, errors and the caret diagnostic,
 * bindings and the parameter-struct layout. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void test_status_strings(void **state) {
    (void)state;
    static const fg_status all[] = {FG_OK, FG_ERR_INVALID_ARGUMENT, FG_ERR_OUT_OF_MEMORY, FG_ERR_IO,
                                    FG_ERR_SYNTAX, FG_ERR_UNSUPPORTED, FG_ERR_NAME, FG_ERR_TYPE,
                                    FG_ERR_SIGNATURE, FG_ERR_ARITY, FG_ERR_LIMIT, FG_ERR_EVAL,
                                    FG_ERR_UNBOUND, FG_ERR_SHAPE, FG_ERR_NOT_SUPPORTED, FG_ERR_NOT_FOUND,
                                    FG_ERR_COMPILE, FG_ERR_NO_DEVICE, FG_ERR_CUDA, FG_ERR_CACHE,
                                    FG_ERR_TOLERANCE};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *s = fg_status_string(all[i]);
        assert_non_null(s);
        assert_true(strncmp(s, "FG_", 3) == 0);
        assert_null(strstr(s, "UNKNOWN"));
    }
    assert_non_null(strstr(fg_status_string((fg_status)999), "UNKNOWN"));
}

static void test_version(void **state) {
    (void)state;
    assert_int_equal(fg_version_number(), FLEXGEN_VERSION_NUMBER);
    assert_string_equal(fg_version_string(), FLEXGEN_VERSION_STRING);
}

static void test_diagnostic_caret(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    const char *src = "int W = 3;\nbool mask_mod(int b, int h, int q_idx, int kv_idx) {\n    return q_idx >= kv_ix;\n}\n";
    int64_t off = strstr(src, "kv_ix;") - src;
    assert_int_equal(fgi_error_at(ctx, FG_ERR_NAME, "m.c", src, off, "unknown name 'kv_ix'"), FG_ERR_NAME);
    assert_int_equal(fg_errcode(ctx), FG_ERR_NAME);
    assert_int_equal(fg_error_offset(ctx), off);
    const char *d = fg_error_diagnostic(ctx);
    assert_non_null(strstr(d, "m.c:3:21: error: unknown name 'kv_ix'"));
    assert_non_null(strstr(d, "    return q_idx >= kv_ix;\n"));
    assert_non_null(strstr(d, "\n                        ^~~~~\n"));
    fgi_clear_error(ctx);
    assert_int_equal(fg_errcode(ctx), FG_OK);
    assert_int_equal(fg_error_offset(ctx), -1);
    fg_ctx_destroy(ctx);
    fg_ctx_destroy(NULL);
}


/* An option's default in new contexts for each value of its environment
 * variable (NULL: unset); the variable is restored afterwards. */
typedef struct env_row {
    const char *env;
    int64_t want;
} env_row;

static void check_env_defaults(const char *var, fg_option opt, const env_row *rows, size_t n) {
    const char *was = getenv(var);
    char *saved = was ? strdup(was) : NULL;
    for (size_t i = 0; i < n; i++) {
        if (rows[i].env) setenv(var, rows[i].env, 1);
        else unsetenv(var);
        fg_ctx *e;
        int64_t v = -1;
        assert_int_equal(fg_ctx_create(&e), FG_OK);
        assert_int_equal(fg_ctx_get_int(e, opt, &v), FG_OK);
        assert_int_equal(v, rows[i].want);
        fg_ctx_destroy(e);
    }
    if (saved) setenv(var, saved, 1);
    else unsetenv(var);
    free(saved);
}

/* An int option set in range reads back; each value out of range is
 * refused with FG_ERR_INVALID_ARGUMENT. */
static void check_int_option(fg_ctx *ctx, fg_option opt, int64_t ok, const int64_t *bad, size_t nbad) {
    int64_t v = 0;
    assert_int_equal(fg_ctx_set_int(ctx, opt, ok), FG_OK);
    assert_int_equal(fg_ctx_get_int(ctx, opt, &v), FG_OK);
    assert_int_equal(v, ok);
    for (size_t i = 0; i < nbad; i++) assert_int_equal(fg_ctx_set_int(ctx, opt, bad[i]), FG_ERR_INVALID_ARGUMENT);
}

static void test_options(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fg_ctx_set_string(ctx, FG_OPT_ARCH, "sm_80"), FG_OK);
    assert_int_equal(fg_ctx_set_string(ctx, FG_OPT_ARCH, "sm_90a"), FG_OK);
    assert_int_equal(fg_ctx_set_string(ctx, FG_OPT_ARCH, "gfx90a"), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_set_string(ctx, FG_OPT_ARCH, "sm_9"), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_DEPTH, 2), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_MAX_DEPTH, 50), FG_OK);
    int64_t v = 0;
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_MAX_DEPTH, &v), FG_OK);
    assert_int_equal(v, 50);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_ARCH, 1), FG_ERR_INVALID_ARGUMENT);
    /* The Hopper-kernel switch: on unless the environment says 0; 0 or 1. */
    const char *env = getenv("FLEXGEN_HOPPER_KERNEL");
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_HOPPER_KERNEL, &v), FG_OK);
    assert_int_equal(v, env && strcmp(env, "0") == 0 ? 0 : 1);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, 0), FG_OK);
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_HOPPER_KERNEL, &v), FG_OK);
    assert_int_equal(v, 0);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_HOPPER_KERNEL, 2), FG_ERR_INVALID_ARGUMENT);
    /* Approximate math: off unless the environment says 1 (the test
     * environment says 0); 0 or 1. */
    const char *am = getenv("FLEXGEN_APPROX_MATH");
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_APPROX_MATH, &v), FG_OK);
    assert_int_equal(v, am && strcmp(am, "1") == 0 ? 1 : 0);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 1), FG_OK);
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_APPROX_MATH, &v), FG_OK);
    assert_int_equal(v, 1);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 2), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, -1), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_APPROX_MATH, &v), FG_OK);
    assert_int_equal(v, 1);
    static const env_row approx_envs[] = {{"1", 1}, {"0", 0}, {"", 0}, {"yes", 0}, {"2", 0}};
    check_env_defaults("FLEXGEN_APPROX_MATH", FG_OPT_APPROX_MATH, approx_envs,
                       sizeof approx_envs / sizeof approx_envs[0]);
    /* Context-parallel compute streams: 2 unless the environment says 1. */
    static const env_row cp_envs[] = {{NULL, 2}, {"1", 1}, {"2", 2}, {"0", 2}, {"", 2}};
    check_env_defaults("FLEXGEN_CP_STREAMS", FG_OPT_CP_STREAMS, cp_envs, sizeof cp_envs / sizeof cp_envs[0]);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_CP_STREAMS, 1), FG_OK);
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_CP_STREAMS, &v), FG_OK);
    assert_int_equal(v, 1);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_CP_STREAMS, 0), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_CP_STREAMS, 3), FG_ERR_INVALID_ARGUMENT);
    /* Decode splits: chosen per call (0) unless the environment names a
     * count in [0, 128]; anything else leaves the default. */
    static const env_row split_envs[] = {{NULL, 0}, {"16", 16}, {"128", 128}, {"129", 0},
                                         {"-1", 0},  {"x", 0},   {"", 0}};
    check_env_defaults("FLEXGEN_DECODE_SPLITS", FG_OPT_DECODE_SPLITS, split_envs,
                       sizeof split_envs / sizeof split_envs[0]);
    static const int64_t bad_splits[] = {-1, 129};
    check_int_option(ctx, FG_OPT_DECODE_SPLITS, 7, bad_splits, 2);
    /* The backward's leading tiles: chosen per call (-1) unless the
     * environment names a count in [-1, 65535]. */
    static const env_row lead_envs[] = {{NULL, -1}, {"0", 0}, {"2", 2}, {"65535", 65535}, {"65536", -1},
                                        {"-2", -1}, {"x", -1}, {"", -1}};
    check_env_defaults("FLEXGEN_BWD_LEAD_TILES", FG_OPT_BWD_LEAD_TILES, lead_envs,
                       sizeof lead_envs / sizeof lead_envs[0]);
    static const int64_t bad_leads[] = {-2, 65536};
    check_int_option(ctx, FG_OPT_BWD_LEAD_TILES, 3, bad_leads, 2);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_BWD_LEAD_TILES, -1), FG_OK);
    /* The backward's and the decode kernel's pairs of kv heads (chosen per
     * call) and the decode kernel's L2 prefetch (chosen per device): -1
     * unless the environment says 0 or 1. */
    static const env_row auto_envs[] = {{NULL, -1}, {"0", 0},   {"1", 1},  {"-1", -1},
                                        {"2", -1},  {"-2", -1}, {"x", -1}, {"", -1}};
    static const struct {
        const char *env;
        fg_option opt;
        int64_t set; /* a valid value set before the bad ones */
    } autos[] = {{"FLEXGEN_BWD_HEAD_PAIRS", FG_OPT_BWD_HEAD_PAIRS, 1},
                 {"FLEXGEN_DECODE_HEAD_PAIRS", FG_OPT_DECODE_HEAD_PAIRS, 1},
                 {"FLEXGEN_DECODE_L2_PREFETCH", FG_OPT_DECODE_L2_PREFETCH, 0}};
    for (size_t i = 0; i < sizeof autos / sizeof autos[0]; i++) {
        check_env_defaults(autos[i].env, autos[i].opt, auto_envs, sizeof auto_envs / sizeof auto_envs[0]);
        static const int64_t bad_auto[] = {-2, 2};
        check_int_option(ctx, autos[i].opt, autos[i].set, bad_auto, 2);
        assert_int_equal(fg_ctx_set_int(ctx, autos[i].opt, -1), FG_OK);
    }
    /* The backward's tail split: on (1) unless the environment says 0. */
    static const env_row on_envs[] = {{NULL, 1}, {"0", 0}, {"1", 1}, {"2", 1}, {"-1", 1}, {"x", 1}, {"", 1}};
    static const struct {
        const char *env;
        fg_option opt;
    } switches[] = {{"FLEXGEN_BWD_TAIL_SPLIT", FG_OPT_BWD_TAIL_SPLIT}};
    for (size_t i = 0; i < sizeof switches / sizeof switches[0]; i++) {
        check_env_defaults(switches[i].env, switches[i].opt, on_envs, sizeof on_envs / sizeof on_envs[0]);
        static const int64_t bad_switch[] = {-1, 2};
        check_int_option(ctx, switches[i].opt, 0, bad_switch, 2);
        assert_int_equal(fg_ctx_set_int(ctx, switches[i].opt, 1), FG_OK);
    }
    assert_int_equal(fg_kernel_kind_of(NULL), 0);
    assert_int_equal(fg_ctx_set_int(NULL, FG_OPT_MAX_DEPTH, 50), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_ctx_create(NULL), FG_ERR_INVALID_ARGUMENT);
    fg_ctx_destroy(ctx);
}

static void test_param_layout(void **state) {
    (void)state;
    fgi_param params[3] = {
        {.name = "W", .kind = FG_PARAM_SCALAR, .type = FGI_T_INT, .def.i = 7},
        {.name = "doc", .kind = FG_PARAM_BUFFER, .type = FGI_T_INT},
        {.name = "s", .kind = FG_PARAM_SCALAR, .type = FGI_T_FLOAT, .def.f = 0.5f},
    };
    fg_mod mod;
    memset(&mod, 0, sizeof mod);
    mod.params = params;
    mod.nparams = 3;
    fgi_param_layout lay;
    fgi_param_layout_compute(&mod, &lay);
    assert_int_equal(lay.offsets[0], 0);
    assert_int_equal(lay.offsets[1], 8);
    assert_int_equal(lay.offsets[2], 24);
    assert_int_equal(lay.size, 32);
    fgi_value vals[3] = {{.scalar.i = 5}, {.data = (void *)0x1000, .length = 9}, {.scalar.f = 2.0f}};
    unsigned char blob[32];
    fgi_param_pack(&mod, &lay, vals, blob);
    int32_t w;
    uint64_t ptr;
    int64_t len;
    float s;
    memcpy(&w, blob, 4);
    memcpy(&ptr, blob + 8, 8);
    memcpy(&len, blob + 16, 8);
    memcpy(&s, blob + 24, 4);
    assert_int_equal(w, 5);
    assert_int_equal(ptr, 0x1000);
    assert_int_equal(len, 9);
    assert_true(s == 2.0f);
}

static void test_buf(void **state) {
    (void)state;
    fgi_buf b = {0};
    for (int i = 0; i < 1000; i++) fgi_buf_printf(&b, "%d,", i);
    assert_int_equal(strncmp(b.data, "0,1,2,", 6), 0);
    char *s = fgi_buf_take(&b);
    assert_non_null(strstr(s, ",999,"));
    fg_free(s);
    fgi_arena a;
    fgi_arena_init(&a);
    for (int i = 0; i < 5000; i++) {
        char *p = fgi_arena_alloc(&a, (size_t)i % 100);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
    }
    assert_string_equal(fgi_arena_strndup(&a, "hello", 3), "hel");
    fgi_arena_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_strings), cmocka_unit_test(test_version),
        cmocka_unit_test(test_diagnostic_caret), cmocka_unit_test(test_options),
        cmocka_unit_test(test_param_layout), cmocka_unit_test(test_buf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
