/*
 * causal.c -- one causal attention call, checked against the CPU reference.
 *
 * The shortest complete use of flexgen. The mask_mod is a C expression,
 * `q_idx >= kv_idx`. A block mask is built from it on the CPU: the same
 * object FlexAttention's create_block_mask returns, here with the blocks
 * above the diagonal empty (never visited), the ones below full (visited
 * without evaluating the mask) and the diagonal ones partial. Then one
 * forward call on bf16 tensors in [B, H, S, D] layout. The first call
 * compiles the kernel with NVRTC, or loads it from the disk cache when an
 * earlier run compiled it; the calls after it find it in memory.
 *
 * What it prints, and what to look at:
 *   - the mod's canonical text and the block-mask picture ('#' full,
 *     '+' partial, '.' empty) with its sparsity: this part needs no GPU;
 *   - the time of the first call (with the compile or the cache load) and of
 *     a warm call, and the warm TFLOP/s counted over the non-empty blocks;
 *   - a checksum of the whole output (sum, sum of magnitudes, non-finite
 *     count, which must be 0);
 *   - the error of the first and the last rows of every head against
 *     fg_attention_reference (float64 on the CPU). The program exits 0 only
 *     when both are within bf16 tolerance.
 *
 * Build: cc causal.c $(pkg-config --cflags --libs flexgen) -lm -o causal
 */
#include "example_util.h"

enum { B = 2, H = 8, S = 4096, D = 128, CHECK_ROWS = 16, REPEAT = 20 };

int main(void) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_block_mask *mask = NULL;
    char *picture = NULL;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hout = NULL;
    float *hlse = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0;
    ex_timer timer = {0};
    const size_t n = (size_t)B * H * S * D;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_expr(ctx, FG_MASK_MOD, "q_idx >= kv_idx", NULL, 0, &mod));
    printf("mod:\n%s\n", fg_mod_canonical(mod));

    /* batch = heads = 1: one mask broadcast over every batch and head. */
    fg_block_mask_desc desc = {.batch = 1, .heads = 1, .q_len = S, .kv_len = S};
    double sparsity = 0;
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, NULL, 0, &mask));
    EX_TRY(ctx, fg_block_mask_sparsity(mask, &sparsity));
    EX_TRY(ctx, fg_block_mask_picture(mask, 16, 32, &picture));
    printf("block mask for S=%d, blocks of 128x128, %.1f%% empty:\n%s\n", S, 100 * sparsity,
           picture);

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);

    uint64_t seed = 42;
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
    EX_REQUIRE(ex_poison(out, n * 2) && ex_poison(lse, (size_t)B * H * S * 4), "memset failed");
    EX_TRY(ctx, fg_block_mask_upload(ctx, mask));

    fg_attention_args a = {0};
    a.batch = B, a.heads_q = H, a.heads_kv = H, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.block_mask = mask; /* strides all 0: contiguous; scale 0: 1/sqrt(D) */

    /* The first call: compile (or disk-cache load) + launch. */
    fg_cache_reset_stats();
    double t0 = ex_now_ms();
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    EX_REQUIRE(ex_sync(), "first call failed on the GPU");
    double first_ms = ex_now_ms() - t0;
    fg_cache_stats cs;
    fg_cache_get_stats(&cs);
    printf("first call: %.1f ms (%s; NVRTC %.1f ms, load %.1f ms)\n", first_ms,
           cs.misses ? "compiled" : cs.disk_hits ? "loaded from the disk cache" : "in memory",
           cs.compile_ms, cs.load_ms);

    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");
    ex_timer_begin(&timer);
    for (int i = 0; i < REPEAT; i++) EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    double ms = ex_timer_end(&timer) / REPEAT;
    printf("warm call: %.3f ms, %.1f TFLOP/s (B=%d H=%d S=%d D=%d bf16, density %.3f)\n", ms,
           ex_tflops(&a, 1.0 - sparsity, ms), B, H, S, D, 1.0 - sparsity);

    EX_REQUIRE(ex_download(hout, out, n * 2) &&
                   ex_download(hlse, lse, (size_t)B * H * S * sizeof *hlse),
               "download failed");
    ex_checksum c = ex_checksum_bf16(hout, n);
    printf("checksum: sum %.6f, sum|x| %.6f, non-finite %zu\n", c.sum, c.abs_sum, c.nonfinite);

    /* The reference takes the same arguments with host pointers. */
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;
    ex_error err = {0}, e;
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, NULL, 0, hout, hlse, 0, CHECK_ROWS, &e));
    ex_error_merge(&err, &e);
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, NULL, 0, hout, hlse, S - CHECK_ROWS, CHECK_ROWS, &e));
    ex_error_merge(&err, &e);
    printf("vs CPU reference (rows 0..%d and %d..%d of every head): out rel err %.2e, "
           "lse err %.2e\n", CHECK_ROWS - 1, S - CHECK_ROWS, S - 1, err.out_rel, err.lse_max);
    EX_REQUIRE(c.nonfinite == 0 && ex_error_ok(&err), "FAILED: outside tolerance (out %.0e, lse %.0e)",
               EX_BF16_OUT_TOL, EX_LSE_TOL);
    printf("OK\n");
    rc = 0;

done:
    ex_timer_destroy(&timer);
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse);
    free(hq), free(hk), free(hv), free(hout), free(hlse);
    fg_free(picture);
    fg_block_mask_destroy(mask);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
