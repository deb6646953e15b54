/* test_cp_api.c -- the public face of context parallelism without a GPU or
 * NCCL: which rows each rank holds (fg_cp_shard_rows), the sharded
 * forward's and backward's argument checks and their answer when libnccl
 * is missing, the checks that need a communicator but no device (through
 * a stand-in libnccl, tests/fake_nccl.c, in a child process: the library
 * loads NCCL once per process), and the kernels that read no mod (the
 * merge, the partial sums) compiled by NVRTC. (The planner itself: test_cp_plan.c; the 2-GPU
 * results: gpu_cp on a machine with two GPUs and NCCL.) */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "codegen/kernels.h"
#include "jit.h"

typedef struct shard_row {
    fg_cp_layout layout;
    int world, rank;
    int64_t len;
    int n;
    int64_t start[2], rows[2];
} shard_row;

/* Cut in units of 128 rows: 1000 rows are 8 units (the last of 104 rows). */
static const shard_row SHARDS[] = {
    {FG_CP_CONTIGUOUS, 1, 0, 1000, 1, {0, 0}, {1000, 0}},
    {FG_CP_CONTIGUOUS, 2, 0, 1000, 1, {0, 0}, {512, 0}},
    {FG_CP_CONTIGUOUS, 2, 1, 1000, 1, {512, 0}, {488, 0}},
    {FG_CP_ZIGZAG, 2, 0, 1000, 2, {0, 768}, {256, 232}},
    {FG_CP_ZIGZAG, 2, 1, 1000, 2, {256, 512}, {256, 256}},
    {FG_CP_ZIGZAG, 2, 0, 131072, 2, {0, 98304}, {32768, 32768}},
    {FG_CP_CONTIGUOUS, 3, 2, 128 * 7, 1, {128 * 5, 0}, {256, 0}}, /* 7 units: 3, 2, 2 */
};

static void test_shard_rows(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof SHARDS / sizeof SHARDS[0]; i++) {
        const shard_row *r = &SHARDS[i];
        int64_t start[2], rows[2];
        int n = -1;
        assert_int_equal(fg_cp_shard_rows(r->layout, r->world, r->rank, r->len, start, rows, &n), FG_OK);
        assert_int_equal(n, r->n);
        for (int c = 0; c < n; c++) {
            assert_int_equal(start[c], r->start[c]);
            assert_int_equal(rows[c], r->rows[c]);
        }
    }
    /* every row once over the ranks, for both layouts and odd lengths */
    for (int layout = FG_CP_CONTIGUOUS; layout <= FG_CP_ZIGZAG; layout++)
        for (int world = 1; world <= 8; world++)
            for (int64_t len = 1; len < 3000; len += 377) {
                char *seen = calloc((size_t)len, 1);
                for (int rank = 0; rank < world; rank++) {
                    int64_t start[2], rows[2];
                    int n;
                    assert_int_equal(fg_cp_shard_rows((fg_cp_layout)layout, world, rank, len, start, rows, &n), FG_OK);
                    for (int c = 0; c < n; c++)
                        for (int64_t j = start[c]; j < start[c] + rows[c]; j++) seen[j]++;
                }
                for (int64_t j = 0; j < len; j++) assert_int_equal(seen[j], 1);
                free(seen);
            }
    int64_t s[2], l[2];
    int n;
    assert_int_equal(fg_cp_shard_rows(FG_CP_ZIGZAG, 0, 0, 100, s, l, &n), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_cp_shard_rows(FG_CP_ZIGZAG, 2, 2, 100, s, l, &n), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_cp_shard_rows((fg_cp_layout)7, 2, 0, 100, s, l, &n), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_cp_shard_rows(FG_CP_ZIGZAG, 2, 0, 0, s, l, &n), FG_ERR_SHAPE);
    assert_int_equal(fg_cp_shard_rows(FG_CP_ZIGZAG, 2, 0, 100, NULL, l, &n), FG_ERR_INVALID_ARGUMENT);
}

static void test_forward_errors(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, "causal");
    static uint16_t x[2 * 4 * 256 * 64];
    fg_attention_args a = fg_attention_args_init();
    a.batch = 1, a.heads_q = 4, a.heads_kv = 2, a.q_len = a.kv_len = 256, a.head_dim = 64, a.dtype = FG_BF16;
    a.q = a.k = a.v = x, a.out = x;
    int comm_stand_in[3] = {0, 2, 0};
    fg_cp_args cp = fg_cp_args_init();
    cp.local = &a, cp.comm = comm_stand_in, cp.global_len = 512, cp.layout = FG_CP_ZIGZAG;
    typedef struct bad {
        const char *what;
        fg_status want;
        const char *says;
    } bad;
    const bad cases[] = {
        {"no comm", FG_ERR_INVALID_ARGUMENT, "communicator"},
        {"layout", FG_ERR_INVALID_ARGUMENT, "layout"},
        {"global_len", FG_ERR_SHAPE, "global_len"},
        {"q_offset", FG_ERR_INVALID_ARGUMENT, "places its pairs"},
        {"q_len != kv_len", FG_ERR_SHAPE, "self-attention"},
        {"strided k", FG_ERR_SHAPE, "contiguous"},
        {"no nccl", FG_ERR_NOT_SUPPORTED, "/nonexistent/libnccl.so.2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_attention_args a2 = a;
        fg_cp_args c2 = cp;
        c2.local = &a2;
        switch (i) {
        case 0: c2.comm = NULL; break;
        case 1: c2.layout = (fg_cp_layout)0; break;
        case 2: c2.global_len = 0; break;
        case 3: a2.q_offset = 5; break;
        case 4: a2.kv_len = 128; break;
        case 5:
            a2.k_stride[0] = 4 * 256 * 64, a2.k_stride[1] = 2 * 256 * 64, a2.k_stride[2] = 128, a2.k_stride[3] = 1;
            break;
        default: break;
        }
        fg_status st = fg_attention_forward_cp(ctx, mod, &c2);
        if (st != cases[i].want || !strstr(fg_errmsg(ctx), cases[i].says))
            fail_msg("%s: %s: %s", cases[i].what, fg_status_string(st), fg_errmsg(ctx));
    }
    assert_int_equal(fg_attention_forward_cp(ctx, NULL, &cp), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_forward_cp(NULL, mod, &cp), FG_ERR_INVALID_ARGUMENT);

    /* a plan is made from the arguments of a call without one, with the
     * call's checks */
    fg_cp_plan *plan = (fg_cp_plan *)1;
    assert_int_equal(fg_cp_plan_create(ctx, mod, &cp, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_cp_plan_create(NULL, mod, &cp, &plan), FG_ERR_INVALID_ARGUMENT);
    fg_cp_args with = cp;
    with.plan = (const fg_cp_plan *)&with;
    assert_int_equal(fg_cp_plan_create(ctx, mod, &with, &plan), FG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fg_errmsg(ctx), "without a plan"));
    assert_null(plan);
    with = cp, with.layout = (fg_cp_layout)9;
    assert_int_equal(fg_cp_plan_create(ctx, mod, &with, &plan), FG_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fg_errmsg(ctx), "layout"));
    assert_int_equal(fg_cp_plan_create(ctx, mod, &cp, &plan), FG_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(fg_errmsg(ctx), "/nonexistent/libnccl.so.2"));
    assert_null(plan);
    fg_cp_plan_destroy(NULL);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

static void test_backward_errors(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, "causal");
    static uint16_t x[2 * 4 * 256 * 64];
    static float lse[4 * 256];
    fg_attention_args a = fg_attention_args_init();
    a.batch = 1, a.heads_q = 4, a.heads_kv = 2, a.q_len = a.kv_len = 256, a.head_dim = 64, a.dtype = FG_BF16;
    a.q = a.k = a.v = x, a.out = x, a.lse = lse;
    fg_attention_bwd_args b = fg_attention_bwd_args_init();
    b.fwd = &a, b.dout = x, b.dq = b.dk = b.dv = x;
    int comm_stand_in[3] = {0, 2, 0};
    fg_cp_bwd_args cp = fg_cp_bwd_args_init();
    cp.local = &b, cp.comm = comm_stand_in, cp.global_len = 512, cp.layout = FG_CP_ZIGZAG;
    fg_binding grad = {.name = "slopes"};
    typedef struct bad {
        const char *what;
        fg_status want;
        const char *says;
    } bad;
    const bad cases[] = {
        {"no comm", FG_ERR_INVALID_ARGUMENT, "communicator"},
        {"layout", FG_ERR_INVALID_ARGUMENT, "fg_cp_bwd_args.layout"},
        {"global_len", FG_ERR_SHAPE, "global_len"},
        {"kv_offset", FG_ERR_INVALID_ARGUMENT, "places its pairs"},
        {"no lse", FG_ERR_INVALID_ARGUMENT, "lse"},
        {"a gradient of no parameter", FG_ERR_UNBOUND, "names no parameter"},
        {"workspace", FG_ERR_INVALID_ARGUMENT, "workspace"},
        {"no local", FG_ERR_INVALID_ARGUMENT, "local shard"},
        {"wrong shard length", FG_ERR_NOT_SUPPORTED, "/nonexistent/libnccl.so.2"},
        {"no nccl", FG_ERR_NOT_SUPPORTED, "/nonexistent/libnccl.so.2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fg_attention_args a2 = a;
        fg_attention_bwd_args b2 = b;
        b2.fwd = &a2;
        fg_cp_bwd_args c2 = cp;
        c2.local = &b2;
        switch (i) {
        case 0: c2.comm = NULL; break;
        case 1: c2.layout = (fg_cp_layout)0; break;
        case 2: c2.global_len = 0; break;
        case 3: a2.kv_offset = 5; break;
        case 4: a2.lse = NULL; break;
        case 5: b2.grad_binds = &grad, b2.ngrad_binds = 1; break;
        case 6: b2.workspace = x, b2.workspace_size = 256; break;
        case 7: c2.local = NULL; break;
        case 8: c2.global_len = 4096; break; /* the communicator is asked first */
        default: break;
        }
        fg_status st = fg_attention_backward_cp(ctx, mod, &c2);
        if (st != cases[i].want || !strstr(fg_errmsg(ctx), cases[i].says))
            fail_msg("%s: %s: %s", cases[i].what, fg_status_string(st), fg_errmsg(ctx));
    }
    assert_int_equal(fg_attention_backward_cp(ctx, NULL, &cp), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_backward_cp(NULL, mod, &cp), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_attention_backward_cp(ctx, mod, NULL), FG_ERR_INVALID_ARGUMENT);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* The rows without a mod compile for both dtypes on the oldest device they
 * run on, each entry point in the PTX: their templates are only ever
 * compiled at run time, so this is where a typo in one shows without a
 * GPU. */
static void test_modless_kernels_compile(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod;
    assert_int_equal(fg_mod_from_expr(ctx, FG_SCORE_MOD, "score", NULL, 0, &mod), FG_OK);
    const fgi_kernel_op ops[] = {FGI_KOP_ATTENTION_MERGE, FGI_KOP_PARTIAL_SUM};
    const fg_dtype dtypes[] = {FG_BF16, FG_FP16};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        for (size_t j = 0; j < 2; j++) {
            const fgi_kernel_entry *row = fgi_kernel_lookup(ops[i], FGI_VARIANT_PORTABLE);
            assert_non_null(row);
            fg_kernel_config cfg = fg_kernel_config_init();
            cfg.dtype = dtypes[j];
            fgi_codegen cg;
            assert_int_equal(fgi_codegen_init_kernel(ctx, mod, row, &cfg, &cg), FG_OK);
            char *src = NULL;
            assert_int_equal(cg.spec.gen_source(ctx, cg.spec.gen_arg, &src), FG_OK);
            void *img = NULL;
            size_t n = 0;
            fg_status st = fgi_nvrtc_compile(ctx, src, cg.spec.name, "sm_80", FG_EMIT_PTX, &img, &n, NULL);
            if (st != FG_OK) fail_msg("%s: %s\n%s", row->label, fg_errmsg(ctx), fg_compile_log(ctx));
            bool found = false;
            for (size_t k = 0; k + strlen(row->entries[0]) <= n && !found; k++)
                found = memcmp((const char *)img + k, row->entries[0], strlen(row->entries[0])) == 0;
            if (!found) fail_msg("%s: no entry point %s in the PTX", row->label, row->entries[0]);
            fg_free(img);
            free(src);
            fgi_codegen_free(&cg);
        }
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* With a communicator (the stand-in's: rank, size, device), what every
 * rank checks before any transfer, in a child process whose NCCL is the
 * stand-in. The child exits with the number of rows that failed. */
typedef struct comm_row {
    const char *what;
    int rank, size;
    int64_t global_len;
    fg_cp_layout layout;
    int rows; /* the shard's */
    bool backward;
    fg_status want;
    const char *says;
} comm_row;

static const comm_row COMM_ROWS[] = {
    /* 200 rows are 2 units of 128: fewer than zig-zag's 4 chunks of 2 ranks */
    {"too short for zig-zag", 0, 2, 200, FG_CP_ZIGZAG, 128, false, FG_ERR_SHAPE, "fewer than the 4 chunks"},
    {"too short, backward", 1, 2, 200, FG_CP_ZIGZAG, 72, true, FG_ERR_SHAPE, "at least 385 rows"},
    {"too short for 3 ranks", 2, 3, 256, FG_CP_CONTIGUOUS, 0, false, FG_ERR_SHAPE, "2 units of 128"},
    {"too many ranks", 0, 65, 1 << 20, FG_CP_CONTIGUOUS, 128, false, FG_ERR_NOT_SUPPORTED, "1 to 64"},
    {"wrong shard", 1, 2, 1000, FG_CP_CONTIGUOUS, 500, false, FG_ERR_SHAPE, "holds 488 rows of 1000"},
    {"wrong shard, backward", 0, 2, 1000, FG_CP_ZIGZAG, 500, true, FG_ERR_SHAPE, "holds 488 rows"},
    /* everything right: the first thing that needs the device says so */
    {"no device", 1, 2, 1000, FG_CP_ZIGZAG, 512, false, FG_ERR_NO_DEVICE, ""},
    {"no device, backward", 0, 2, 1000, FG_CP_CONTIGUOUS, 512, true, FG_ERR_NO_DEVICE, ""},
};

static int comm_checks_child(void) {
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return 99;
    fg_mod *mod = tu_gallery_mod(ctx, "causal");
    static uint16_t x[4 * 1000 * 64];
    static float lse[4 * 1000];
    int failed = 0;
    for (size_t i = 0; i < sizeof COMM_ROWS / sizeof COMM_ROWS[0]; i++) {
        const comm_row *r = &COMM_ROWS[i];
        int comm[3] = {r->rank, r->size, 0};
        fg_attention_args a = fg_attention_args_init();
        a.batch = 1, a.heads_q = a.heads_kv = 4, a.q_len = a.kv_len = r->rows > 0 ? r->rows : 1;
        a.head_dim = 64, a.dtype = FG_BF16, a.q = a.k = a.v = x, a.out = x, a.lse = lse;
        fg_status st;
        if (r->backward) {
            fg_attention_bwd_args b = fg_attention_bwd_args_init();
            b.fwd = &a, b.dout = x, b.dq = b.dk = b.dv = x;
            fg_cp_bwd_args cp = fg_cp_bwd_args_init();
            cp.local = &b, cp.comm = comm, cp.global_len = r->global_len, cp.layout = r->layout;
            st = fg_attention_backward_cp(ctx, mod, &cp);
        } else {
            fg_cp_args cp = fg_cp_args_init();
            cp.local = &a, cp.comm = comm, cp.global_len = r->global_len, cp.layout = r->layout;
            st = fg_attention_forward_cp(ctx, mod, &cp);
        }
        if (st != r->want || !strstr(fg_errmsg(ctx), r->says)) {
            fprintf(stderr, "%s: %s: %s\n", r->what, fg_status_string(st), fg_errmsg(ctx));
            failed++;
        }
    }
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return failed;
}

static void test_checks_with_a_communicator(void **state) {
    (void)state;
    const char *fake = getenv("FLEXGEN_TEST_FAKE_NCCL");
    if (!fake || access(fake, R_OK) != 0) skip(); /* run outside meson: no stand-in built */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("FLEXGEN_NCCL_LIB", fake, 1);
        setenv("FLEXGEN_LIBCUDA", "/nonexistent/libcuda.so.1", 1); /* no device, even on a GPU machine */
        _exit(comm_checks_child());
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
    /* The process-wide NCCL loader looks once: make it look somewhere empty. */
    setenv("FLEXGEN_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    const struct CMUnitTest tests[] = {
        /* first: its child must not inherit a loaded (or failed) NCCL */
        cmocka_unit_test(test_checks_with_a_communicator),
        cmocka_unit_test(test_shard_rows),
        cmocka_unit_test(test_forward_errors),
        cmocka_unit_test(test_backward_errors),
        cmocka_unit_test(test_modless_kernels_compile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
