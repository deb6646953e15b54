/*
 * sliding_window.c -- a window size chosen at run time, one compile for all.
 *
 * A scalar parameter of a mod (`int WINDOW = 256;`) is a kernel argument, not
 * a constant baked into the code: the kernel is compiled once, and each call
 * binds the value it wants with fg_bind_int. The block mask does depend on
 * the value (a narrow window leaves most blocks empty), so it is rebuilt for
 * each window; here on the CPU, which needs no kernel at all.
 *
 * The disk cache is switched off for this context so that the count printed
 * at the end is this run's own: exactly one NVRTC compile for four windows
 * (with the disk cache on, a second run would compile nothing).
 *
 * What it prints: the mod's canonical text and parameters, the block-mask
 * picture for one window (no GPU needed), then for each window the share of
 * empty blocks, the time and TFLOP/s of a warm call and the error of the last
 * rows of every head against the CPU reference; finally the cache counters.
 * It exits 0 only when every window is within tolerance and the kernel was
 * compiled exactly once.
 *
 * Build: cc sliding_window.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

enum { B = 2, H = 8, S = 4096, D = 128, CHECK_ROWS = 16, REPEAT = 10 };

static const char *const MOD_SOURCE =
    "/* Causal attention to the keys at most WINDOW positions back. */\n"
    "int WINDOW = 256;\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW;\n"
    "}\n";

static const int WINDOWS[] = {64, 256, 1024, 4096};

static void print_params(const fg_mod *mod) {
    for (size_t i = 0; i < fg_mod_param_count(mod); i++) {
        fg_param_info p;
        if (fg_mod_param(mod, i, &p) != FG_OK) continue;
        printf("parameter %s: %s %s, default %g\n", p.name,
               p.kind == FG_PARAM_SCALAR ? "scalar" : "buffer of",
               p.type == FG_TYPE_INT ? "int" : "float", p.default_value);
    }
}

/* The CPU part: what the mask looks like for one window. */
static int show_mask(fg_ctx *ctx, const fg_mod *mod, int window) {
    int rc = 1;
    fg_block_mask *mask = NULL;
    char *picture = NULL;
    double sparsity = 0;
    fg_block_mask_desc desc = {.batch = 1, .heads = 1, .q_len = S, .kv_len = S};
    fg_binding bind = fg_bind_int("WINDOW", window);
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, &bind, 1, &mask));
    EX_TRY(ctx, fg_block_mask_sparsity(mask, &sparsity));
    EX_TRY(ctx, fg_block_mask_picture(mask, 16, 32, &picture));
    printf("block mask, WINDOW=%d, S=%d: %.1f%% of the blocks empty\n%s\n", window, S,
           100 * sparsity, picture);
    rc = 0;
done:
    fg_free(picture);
    fg_block_mask_destroy(mask);
    return rc;
}

/* One window on the GPU: block mask, warm timing, check. */
static int run_window(fg_ctx *ctx, const fg_mod *mod, fg_attention_args a, fg_attention_args host,
                      int window, uint16_t *hout, float *hlse, ex_dptr out, ex_dptr lse) {
    int rc = 1;
    fg_block_mask *mask = NULL;
    ex_timer timer = {0};
    double sparsity = 0;
    fg_block_mask_desc desc = {.batch = 1, .heads = 1, .q_len = S, .kv_len = S};
    fg_binding bind = fg_bind_int("WINDOW", window); /* a scalar: host and GPU alike */
    size_t n = (size_t)B * H * S * D;

    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, &bind, 1, &mask));
    EX_TRY(ctx, fg_block_mask_sparsity(mask, &sparsity));
    EX_TRY(ctx, fg_block_mask_upload(ctx, mask));
    a.block_mask = mask, a.binds = &bind, a.nbinds = 1;

    EX_REQUIRE(ex_poison(out, n * 2) && ex_poison(lse, (size_t)B * H * S * 4), "memset failed");
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a)); /* the first window compiles here */
    EX_REQUIRE(ex_download(hout, out, n * 2) && ex_download(hlse, lse, (size_t)B * H * S * 4),
               "download failed");

    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");
    ex_timer_begin(&timer);
    for (int i = 0; i < REPEAT; i++) EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    double ms = ex_timer_end(&timer) / REPEAT;

    ex_error err;
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, &bind, 1, hout, hlse, S - CHECK_ROWS, CHECK_ROWS,
                                &err));
    ex_checksum c = ex_checksum_bf16(hout, n);
    printf("%8d  %6.1f%%  %8.3f  %8.1f  %10.2e  %8.2e  %s\n", window, 100 * sparsity, ms,
           ex_tflops(&a, 1.0 - sparsity, ms), err.out_rel, err.lse_max,
           c.nonfinite == 0 && ex_error_ok(&err) ? "ok" : "FAILED");
    rc = c.nonfinite == 0 && ex_error_ok(&err) ? 0 : 1;
done:
    ex_timer_destroy(&timer);
    fg_block_mask_destroy(mask);
    return rc;
}

int main(void) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hout = NULL;
    float *hlse = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0;
    const size_t n = (size_t)B * H * S * D;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_source(ctx, "sliding_window.c", MOD_SOURCE, (size_t)-1, &mod));
    printf("mod:\n%s\n", fg_mod_canonical(mod));
    print_params(mod);
    if (show_mask(ctx, mod, 256)) goto done;

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);
    EX_TRY(ctx, fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0));

    uint64_t seed = 7;
    hq = ex_random_bf16(n, &seed);
    hk = ex_random_bf16(n, &seed);
    hv = ex_random_bf16(n, &seed);
    hout = malloc(n * sizeof *hout);
    hlse = malloc((size_t)B * H * S * sizeof *hlse);
    EX_REQUIRE(hq && hk && hv && hout && hlse, "out of host memory");
    q = ex_alloc(n * 2), k = ex_alloc(n * 2), v = ex_alloc(n * 2), out = ex_alloc(n * 2);
    lse = ex_alloc((size_t)B * H * S * sizeof(float));
    EX_REQUIRE(q && k && v && out && lse, "out of device memory");
    EX_REQUIRE(ex_upload(q, hq, n * 2) && ex_upload(k, hk, n * 2) && ex_upload(v, hv, n * 2),
               "upload failed");

    fg_attention_args a = {0};
    a.batch = B, a.heads_q = H, a.heads_kv = H, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;

    fg_cache_reset_stats();
    printf("B=%d H=%d S=%d D=%d bf16; error over the last %d rows of every head\n", B, H, S, D,
           CHECK_ROWS);
    printf("  WINDOW   empty        ms   TFLOP/s  out rel err   lse err\n");
    int failures = 0;
    for (size_t i = 0; i < sizeof WINDOWS / sizeof WINDOWS[0]; i++)
        failures += run_window(ctx, mod, a, host, WINDOWS[i], hout, hlse, out, lse);

    fg_cache_stats cs;
    fg_cache_get_stats(&cs);
    printf("kernel cache: %llu compiled (NVRTC %.0f ms), %llu memory hits, %llu disk hits\n",
           (unsigned long long)cs.misses, cs.compile_ms, (unsigned long long)cs.memory_hits,
           (unsigned long long)cs.disk_hits);
    EX_REQUIRE(failures == 0, "FAILED: %d window(s) outside tolerance", failures);
    EX_REQUIRE(cs.misses == 1, "FAILED: expected one compile for all windows");
    printf("OK: %zu windows, one compile\n", sizeof WINDOWS / sizeof WINDOWS[0]);
    rc = 0;

done:
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse);
    free(hq), free(hk), free(hv), free(hout), free(hlse);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
