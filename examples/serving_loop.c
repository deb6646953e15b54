/*
 * serving_loop.c -- prefill, then many decode steps over a growing KV cache;
 * after the first step every kernel comes from the cache.
 *
 * An inference server runs the same attention millions of times with
 * shapes that change every call: the KV cache grows by one token per step
 * and the query is the newest token. Two things make that work here:
 *
 *  - q_offset. The mods see q_idx + q_offset and kv_idx + kv_offset, so a
 *    one-token query at step t is position kv_len - 1 of the sequence, and
 *    the sliding-window mask below keeps the keys at most WINDOW positions
 *    back in the cache. Without the offset the query would be position 0.
 *  - The kernel cache. Lengths and offsets are launch arguments, not part of
 *    the cache key, so the prefill's kernel serves every decode step. The
 *    first call compiles it (or loads it from the disk cache of an earlier
 *    run); each later call is a memory hit, a hash lookup of microseconds.
 *    A server that wants to skip even that fetches the kernel once with
 *    fg_kernel_get and calls fg_kernel_launch.
 *
 * The cache is laid out the way servers keep it, [B][capacity][Hkv][D]
 * (BSHD), with grouped-query attention (16 query heads over 4 KV heads);
 * strides describe the layout, and kv_len says how much of it is filled. No
 * block mask: with a single query row the kernel evaluates mask_mod on the
 * keys it visits.
 *
 * What it prints: the mod; the prefill's time and the cache counters after
 * it; the decode loop's GPU time per step and host time per call; the cache
 * counters after the first and the last step; the error against the CPU
 * reference of the prefill's last rows and of every 8th decode step. It
 * exits 0 only when every check is within tolerance and no decode step after
 * the first compiled or loaded a kernel.
 *
 * Build: cc serving_loop.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

enum {
    B = 2, HQ = 16, HKV = 4, D = 128, CAPACITY = 4096,
    PREFILL = 1000, STEPS = 64, WINDOW = 512, CHECK_ROWS = 16
};

static const char *const MOD_SOURCE =
    "/* Causal attention to the keys at most WINDOW positions back. */\n"
    "int WINDOW = 512;\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW;\n"
    "}\n";

/* Element offset of (b, s) in a [B][len][heads][D] tensor. */
static size_t bshd(int b, int s, int len, int heads) {
    return (((size_t)b * len + s) * heads) * D;
}

/* Strides in elements, (b, h, s, d) order, for [B][len][heads][D]. */
static void bshd_strides(int64_t st[4], int len, int heads) {
    st[0] = (int64_t)len * heads * D, st[1] = D, st[2] = (int64_t)heads * D, st[3] = 1;
}

/* Append positions [from, to) of every sequence to the device cache. */
static int append_kv(ex_dptr k, ex_dptr v, const uint16_t *hk, const uint16_t *hv, int from,
                     int to) {
    size_t off, bytes = (size_t)(to - from) * HKV * D * 2;
    for (int b = 0; b < B; b++) {
        off = bshd(b, from, CAPACITY, HKV);
        if (!ex_upload(k + off * 2, hk + off, bytes) || !ex_upload(v + off * 2, hv + off, bytes))
            return 0;
    }
    return 1;
}

static void print_stats(const char *when) {
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    printf("cache %-20s compiled %llu, disk hits %llu, memory hits %llu\n", when,
           (unsigned long long)s.misses, (unsigned long long)s.disk_hits,
           (unsigned long long)s.memory_hits);
}

/* The CPU evaluator on one query row: which keys does position `pos` see? */
static int show_row(fg_ctx *ctx, const fg_mod *mod, const fg_binding *window, int pos) {
    int rc = 1, first = -1, last = -1;
    uint8_t *row = malloc((size_t)pos + 1);
    EX_REQUIRE(row, "out of host memory");
    EX_TRY(ctx, fg_mod_eval_mask(ctx, mod, window, 1, 0, 0, pos, 1, 0, pos + 1, row));
    for (int j = 0; j <= pos; j++)
        if (row[j]) last = j, first = first < 0 ? j : first;
    printf("the query at position %d sees keys %d..%d\n", pos, first, last);
    rc = 0;
done:
    free(row);
    return rc;
}

static uint64_t fetched(void) {
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    return s.misses + s.disk_hits;
}

int main(void) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    uint16_t *hk = NULL, *hv = NULL, *hq = NULL, *hout = NULL;
    float *hlse = NULL;
    ex_dptr k = 0, v = 0, q = 0, out = 0, lse = 0;
    ex_timer timer = {0};
    const size_t kv_n = (size_t)B * CAPACITY * HKV * D, q_n = (size_t)B * PREFILL * HQ * D;
    uint64_t seed = 99;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_source(ctx, "serving_window.c", MOD_SOURCE, (size_t)-1, &mod));
    printf("mod:\n%s\n", fg_mod_canonical(mod));
    fg_binding window = fg_bind_int("WINDOW", WINDOW);
    if (show_row(ctx, mod, &window, PREFILL + STEPS - 1)) goto done;

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);

    /* The keys and values the model would produce, one position per step. */
    hk = ex_random_bf16(kv_n, &seed);
    hv = ex_random_bf16(kv_n, &seed);
    hq = ex_random_bf16(q_n, &seed);
    hout = malloc(q_n * sizeof *hout);
    hlse = malloc((size_t)B * HQ * PREFILL * sizeof *hlse);
    EX_REQUIRE(hk && hv && hq && hout && hlse, "out of host memory");
    k = ex_alloc(kv_n * 2), v = ex_alloc(kv_n * 2), q = ex_alloc(q_n * 2), out = ex_alloc(q_n * 2);
    lse = ex_alloc((size_t)B * HQ * PREFILL * sizeof(float));
    EX_REQUIRE(k && v && q && out && lse, "out of device memory");
    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");

    fg_attention_args a = {0};
    a.batch = B, a.heads_q = HQ, a.heads_kv = HKV, a.head_dim = D, a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    bshd_strides(a.k_stride, CAPACITY, HKV);
    bshd_strides(a.v_stride, CAPACITY, HKV);
    a.binds = &window, a.nbinds = 1;
    ex_error worst = {0}, e;

    /* Prefill: the prompt's PREFILL tokens attend to each other. */
    fg_cache_reset_stats();
    EX_REQUIRE(append_kv(k, v, hk, hv, 0, PREFILL) && ex_upload(q, hq, q_n * 2), "upload failed");
    a.q_len = PREFILL, a.kv_len = PREFILL, a.q_offset = 0;
    bshd_strides(a.q_stride, PREFILL, HQ);
    bshd_strides(a.out_stride, PREFILL, HQ);
    double t0 = ex_now_ms();
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    EX_REQUIRE(ex_sync(), "prefill failed on the GPU");
    printf("prefill of %d tokens: %.1f ms (first call: includes the kernel fetch)\n", PREFILL,
           ex_now_ms() - t0);
    print_stats("after prefill:");
    EX_REQUIRE(ex_download(hout, out, q_n * 2) &&
                   ex_download(hlse, lse, (size_t)B * HQ * PREFILL * sizeof *hlse),
               "download failed");
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, &window, 1, hout, hlse, PREFILL - CHECK_ROWS,
                                CHECK_ROWS, &e));
    ex_error_merge(&worst, &e);

    /* Decode: one new token per step, at position kv_len - 1. */
    a.q_len = 1;
    bshd_strides(a.q_stride, 1, HQ);
    bshd_strides(a.out_stride, 1, HQ);
    uint64_t fetched_after_first = 0;
    double gpu_ms = 0, host_ms = 0;
    int checked = 0;
    for (int t = 0; t < STEPS; t++) {
        int pos = PREFILL + t;
        const uint16_t *step_q = hq + (size_t)t * B * HQ * D; /* any fresh values do */
        EX_REQUIRE(append_kv(k, v, hk, hv, pos, pos + 1) &&
                       ex_upload(q, step_q, (size_t)B * HQ * D * 2),
                   "upload failed");
        a.kv_len = pos + 1;
        a.q_offset = pos;

        ex_timer_begin(&timer);
        double h0 = ex_now_ms();
        EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
        double h1 = ex_now_ms();
        double ms = ex_timer_end(&timer);
        if (t == 0) {
            print_stats("after decode step 0:");
            fetched_after_first = fetched();
        } else {
            gpu_ms += ms, host_ms += h1 - h0;
        }

        if (t % 8 == 7 || t == STEPS - 1) {
            EX_REQUIRE(ex_download(hout, out, (size_t)B * HQ * D * 2) &&
                           ex_download(hlse, lse, (size_t)B * HQ * sizeof *hlse),
                       "download failed");
            host = a;
            host.q = step_q, host.k = hk, host.v = hv;
            EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, &window, 1, hout, hlse, 0, 1, &e));
            ex_error_merge(&worst, &e);
            checked++;
        }
    }
    printf("decode: %d steps, KV cache %d -> %d tokens, window %d\n", STEPS, PREFILL + 1,
           PREFILL + STEPS, WINDOW);
    printf("  steps 1..%d: %.3f ms GPU per step, %.1f us host time per fg_attention_forward\n",
           STEPS - 1, gpu_ms / (STEPS - 1), 1e3 * host_ms / (STEPS - 1));
    print_stats("after the last step:");
    printf("vs CPU reference (prefill rows %d..%d, %d decode steps): out rel err %.2e, lse err "
           "%.2e, non-finite %zu\n", PREFILL - CHECK_ROWS, PREFILL - 1, checked, worst.out_rel,
           worst.lse_max, worst.nonfinite);
    EX_REQUIRE(ex_error_ok(&worst), "FAILED: outside tolerance");
    EX_REQUIRE(fetched() == fetched_after_first,
               "FAILED: a decode step after the first compiled or loaded a kernel");
    printf("OK: every step after the first found its kernel in memory\n");
    rc = 0;

done:
    ex_timer_destroy(&timer);
    ex_free(k), ex_free(v), ex_free(q), ex_free(out), ex_free(lse);
    free(hk), free(hv), free(hq), free(hout), free(hlse);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
