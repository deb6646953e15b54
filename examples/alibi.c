/*
 * alibi.c -- a score_mod that reads a buffer: ALiBi's per-head slopes.
 *
 * ALiBi (Press et al., "Train Short, Test Long") adds to each score a bias
 * proportional to the distance between query and key, with one slope per
 * head: m_h = 2^(-8 (h + 1) / H). The slopes are a buffer parameter,
 * `const float *slopes;`: the mod indexes it with `slopes[h]`, and the
 * program binds a pointer and a length at run time (host memory for the
 * CPU evaluator and the reference, device memory for the GPU). Bound like
 * this the slopes are data, not code: new values need no compile. The
 * program shows it by running a second set of slopes through the same
 * kernel.
 *
 * What it prints: the mod's canonical text and parameters; the bias the
 * score_mod adds on a 4 x 4 tile for the first and the last head, computed
 * by the CPU evaluator (no GPU needed); then, for each set of slopes, the
 * time, a checksum and the error against the CPU reference; and the cache
 * counters, showing that the second set ran the kernel the first one
 * fetched. It exits 0 only when both runs are within tolerance, their
 * outputs differ, and the second run fetched no kernel.
 *
 * Build: cc alibi.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

enum { B = 2, H = 16, S = 2048, D = 128, CHECK_ROWS = 16 };

static const char *const MOD_SOURCE =
    "/* ALiBi: a linear distance bias with one slope per head, causal. */\n"
    "const float *slopes;\n"
    "\n"
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
    "    return score + slopes[h] * (float)(kv_idx - q_idx);\n"
    "}\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return q_idx >= kv_idx;\n"
    "}\n";

/* m_h = 2^(-steepness (h + 1) / H); ALiBi's own choice is steepness 8. */
static void make_slopes(float *slopes, double steepness) {
    for (int h = 0; h < H; h++) slopes[h] = (float)exp2(-steepness * (h + 1) / H);
}

/* The CPU evaluator on a tile of zero scores: what is left is the bias. */
static int show_bias(fg_ctx *ctx, const fg_mod *mod, const float *slopes) {
    int rc = 1;
    enum { T = 4, Q0 = 100, KV0 = 97 };
    float zero[T * T] = {0}, bias[T * T];
    fg_binding bind = fg_bind_float_buffer("slopes", slopes, H);
    for (int h = 0; h < H; h += H - 1) {
        EX_TRY(ctx, fg_mod_eval_score(ctx, mod, &bind, 1, 0, h, Q0, T, KV0, T, zero, bias));
        printf("bias for head %d (slope %g), q_idx %d..%d down, kv_idx %d..%d across:\n", h,
               slopes[h], Q0, Q0 + T - 1, KV0, KV0 + T - 1);
        for (int i = 0; i < T; i++) {
            for (int j = 0; j < T; j++) printf(" %9.5f", bias[i * T + j]);
            printf("\n");
        }
    }
    rc = 0;
done:
    return rc;
}

/* One run with the slopes now in `dslopes` / `hslopes`. */
static int run(fg_ctx *ctx, const fg_mod *mod, fg_attention_args a, fg_attention_args host,
               ex_dptr dslopes, const float *hslopes, uint16_t *hout, float *hlse, ex_dptr out,
               ex_dptr lse, ex_checksum *sum) {
    int rc = 1;
    ex_timer timer = {0};
    size_t n = (size_t)B * H * S * D;
    fg_binding gpu_bind = fg_bind_float_buffer("slopes", (const float *)ex_ptr(dslopes), H);
    fg_binding cpu_bind = fg_bind_float_buffer("slopes", hslopes, H);
    a.binds = &gpu_bind, a.nbinds = 1;

    EX_REQUIRE(ex_upload(dslopes, hslopes, H * sizeof *hslopes), "upload failed");
    EX_REQUIRE(ex_poison(out, n * 2) && ex_poison(lse, (size_t)B * H * S * 4), "memset failed");
    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");
    ex_timer_begin(&timer);
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    double ms = ex_timer_end(&timer);
    EX_REQUIRE(ex_download(hout, out, n * 2) && ex_download(hlse, lse, (size_t)B * H * S * 4),
               "download failed");

    ex_error err, e;
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, &cpu_bind, 1, hout, hlse, 0, CHECK_ROWS, &err));
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, &cpu_bind, 1, hout, hlse, S - CHECK_ROWS,
                                CHECK_ROWS, &e));
    ex_error_merge(&err, &e);
    *sum = ex_checksum_bf16(hout, n);
    printf("  %.3f ms; checksum %.6f (sum|x| %.6f, non-finite %zu); vs CPU reference: out rel "
           "err %.2e, lse err %.2e\n", ms, sum->sum, sum->abs_sum, sum->nonfinite, err.out_rel,
           err.lse_max);
    rc = sum->nonfinite == 0 && ex_error_ok(&err) ? 0 : 1;
done:
    ex_timer_destroy(&timer);
    return rc;
}

int main(void) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_block_mask *mask = NULL;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hout = NULL;
    float *hlse = NULL, slopes[H];
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0, dslopes = 0;
    const size_t n = (size_t)B * H * S * D;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_source(ctx, "alibi.c", MOD_SOURCE, (size_t)-1, &mod));
    printf("mod:\n%s\n", fg_mod_canonical(mod));
    for (size_t i = 0; i < fg_mod_param_count(mod); i++) {
        fg_param_info p;
        EX_TRY(ctx, fg_mod_param(mod, i, &p));
        printf("parameter %s: %s %s\n", p.name, p.kind == FG_PARAM_BUFFER ? "buffer of" : "scalar",
               p.type == FG_TYPE_FLOAT ? "float" : "int");
    }
    make_slopes(slopes, 8.0);
    if (show_bias(ctx, mod, slopes)) goto done;

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);

    uint64_t seed = 11;
    hq = ex_random_bf16(n, &seed);
    hk = ex_random_bf16(n, &seed);
    hv = ex_random_bf16(n, &seed);
    hout = malloc(n * sizeof *hout);
    hlse = malloc((size_t)B * H * S * sizeof *hlse);
    EX_REQUIRE(hq && hk && hv && hout && hlse, "out of host memory");
    q = ex_alloc(n * 2), k = ex_alloc(n * 2), v = ex_alloc(n * 2), out = ex_alloc(n * 2);
    lse = ex_alloc((size_t)B * H * S * sizeof(float));
    dslopes = ex_alloc(H * sizeof(float));
    EX_REQUIRE(q && k && v && out && lse && dslopes, "out of device memory");
    EX_REQUIRE(ex_upload(q, hq, n * 2) && ex_upload(k, hk, n * 2) && ex_upload(v, hv, n * 2),
               "upload failed");

    /* The block mask comes from mask_mod alone; the causal blocks are the
     * same for every set of slopes. */
    fg_block_mask_desc desc = {.batch = 1, .heads = 1, .q_len = S, .kv_len = S};
    fg_binding host_slopes = fg_bind_float_buffer("slopes", slopes, H);
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, &host_slopes, 1, &mask));
    EX_TRY(ctx, fg_block_mask_upload(ctx, mask));

    fg_attention_args a = {0};
    a.batch = B, a.heads_q = H, a.heads_kv = H, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.block_mask = mask;
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;

    printf("B=%d H=%d S=%d D=%d bf16; error over rows 0..%d and %d..%d of every head\n", B, H, S,
           D, CHECK_ROWS - 1, S - CHECK_ROWS, S - 1);
    ex_checksum first, second;
    fg_cache_stats s0, s1, s2;
    fg_cache_reset_stats();
    fg_cache_get_stats(&s0);
    printf("slopes 2^(-8(h+1)/%d), m_0 = %g:\n", H, slopes[0]);
    int failures = run(ctx, mod, a, host, dslopes, slopes, hout, hlse, out, lse, &first);
    fg_cache_get_stats(&s1);
    make_slopes(slopes, 4.0);
    printf("slopes 2^(-4(h+1)/%d), m_0 = %g:\n", H, slopes[0]);
    failures += run(ctx, mod, a, host, dslopes, slopes, hout, hlse, out, lse, &second);
    fg_cache_get_stats(&s2);

    uint64_t fetched1 = (s1.misses - s0.misses) + (s1.disk_hits - s0.disk_hits);
    uint64_t fetched2 = (s2.misses - s1.misses) + (s2.disk_hits - s1.disk_hits);
    printf("kernel cache: first run %llu compiled, %llu from disk; second run %llu memory hit(s), "
           "%llu fetched\n", (unsigned long long)(s1.misses - s0.misses),
           (unsigned long long)(s1.disk_hits - s0.disk_hits),
           (unsigned long long)(s2.memory_hits - s1.memory_hits), (unsigned long long)fetched2);
    EX_REQUIRE(failures == 0, "FAILED: outside tolerance");
    EX_REQUIRE(first.sum != second.sum, "FAILED: new slopes did not change the output");
    EX_REQUIRE(fetched1 == 1 && fetched2 == 0, "FAILED: the second set of slopes fetched a kernel");
    printf("OK\n");
    rc = 0;

done:
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse), ex_free(dslopes);
    free(hq), free(hk), free(hv), free(hout), free(hlse);
    fg_block_mask_destroy(mask);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
