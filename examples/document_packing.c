/*
 * document_packing.c -- a training-style loop where every batch packs new
 * documents, and the block mask is rebuilt on the GPU each step.
 *
 * Training on packed sequences: each row of the batch is several documents
 * laid back to back, and a token may only attend to earlier tokens of its
 * own document. The document boundaries change with every batch, so the
 * block mask changes with every batch too. FlexAttention users call
 * create_block_mask each step; here the mask is built once on the GPU by a
 * generated kernel (fg_block_mask_create_gpu) and then rebuilt in place for
 * each new document-id buffer (fg_block_mask_rebuild_gpu): no allocation, no
 * compile, no host round trip.
 *
 * The document ids are a buffer parameter (`const int *doc;`): a device
 * pointer bound at run time, so new ids never recompile anything. The disk
 * cache is switched off for this context so the compile counts printed at
 * the end are this run's own: one block-mask kernel and one attention
 * kernel, whatever the number of steps.
 *
 * What it prints: the mod, a CPU picture of one document layout (no GPU
 * needed), then per step the documents in each row, the share of empty
 * blocks, the GPU time of the mask build and of the attention call; the
 * error against the CPU reference on the first and the last step; whether
 * the GPU-built mask equals the CPU-built one; the compile counts. It exits 0
 * only when all of those checks pass.
 *
 * Build: cc document_packing.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

enum { B = 2, H = 8, S = 4096, D = 64, STEPS = 6, CHECK_ROWS = 16 };

static const char *const MOD_SOURCE =
    "/* Documents packed back to back in each batch row, causal inside each.\n"
    " * doc[b * SEQ_LEN + i] is the document id of position i in row b. */\n"
    "int SEQ_LEN = 4096;\n"
    "const int *doc;\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    int row = b * SEQ_LEN;\n"
    "    return q_idx >= kv_idx && doc[row + q_idx] == doc[row + kv_idx];\n"
    "}\n";

/* A new batch: documents of 64 to 2047 tokens until each row is full. Writes
 * the ids and the number of documents per row. */
static void pack_documents(int32_t *doc, int ndocs[B], uint64_t *seed) {
    for (int b = 0; b < B; b++) {
        int pos = 0, id = 0;
        while (pos < S) {
            int len = 64 + (int)(ex_uniform(seed) * 1984);
            for (int i = 0; i < len && pos < S; i++) doc[b * S + pos++] = id;
            id++;
        }
        ndocs[b] = id;
    }
}

/* Do two block masks hold the same eight arrays? Both must be on the host. */
static int same_block_mask(const fg_block_mask *x, const fg_block_mask *y) {
    for (int which = FG_BM_KV_NUM_BLOCKS; which <= FG_BM_FULL_Q_INDICES; which++) {
        const int32_t *px = NULL, *py = NULL;
        uint64_t dx, dy;
        int64_t nx[4], ny[4];
        if (fg_block_mask_array_get(x, (fg_block_mask_array)which, &px, &dx, nx) != FG_OK ||
            fg_block_mask_array_get(y, (fg_block_mask_array)which, &py, &dy, ny) != FG_OK ||
            !px || !py || memcmp(nx, ny, sizeof nx) != 0)
            return 0;
        if (memcmp(px, py, (size_t)(nx[0] * nx[1] * nx[2] * nx[3]) * sizeof *px) != 0) return 0;
    }
    return 1;
}

/* The CPU part: one layout, drawn by the CPU builder. */
static int show_layout(fg_ctx *ctx, const fg_mod *mod, int32_t *doc, uint64_t *seed) {
    int rc = 1, ndocs[B];
    fg_block_mask *mask = NULL;
    char *picture = NULL;
    pack_documents(doc, ndocs, seed);
    fg_block_mask_desc desc = {.batch = B, .heads = 1, .q_len = S, .kv_len = S};
    fg_binding binds[] = {fg_bind_int("SEQ_LEN", S), fg_bind_int_buffer("doc", doc, B * S)};
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, binds, 2, &mask));
    EX_TRY(ctx, fg_block_mask_picture(mask, 16, 32, &picture));
    printf("a batch of %d and %d documents, block mask (CPU builder):\n%s\n", ndocs[0], ndocs[1],
           picture);
    rc = 0;
done:
    fg_free(picture);
    fg_block_mask_destroy(mask);
    return rc;
}

int main(void) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_block_mask *mask = NULL, *cpu_mask = NULL;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hout = NULL;
    float *hlse = NULL;
    int32_t *hdoc = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0, doc = 0;
    ex_timer timer = {0};
    const size_t n = (size_t)B * H * S * D;
    uint64_t seed = 2024;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_source(ctx, "document_packing.c", MOD_SOURCE, (size_t)-1, &mod));
    printf("mod:\n%s\n", fg_mod_canonical(mod));
    hdoc = malloc((size_t)B * S * sizeof *hdoc);
    EX_REQUIRE(hdoc, "out of host memory");
    if (show_layout(ctx, mod, hdoc, &seed)) goto done;

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);
    EX_TRY(ctx, fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0));

    hq = ex_random_bf16(n, &seed);
    hk = ex_random_bf16(n, &seed);
    hv = ex_random_bf16(n, &seed);
    hout = malloc(n * sizeof *hout);
    hlse = malloc((size_t)B * H * S * sizeof *hlse);
    EX_REQUIRE(hq && hk && hv && hout && hlse, "out of host memory");
    q = ex_alloc(n * 2), k = ex_alloc(n * 2), v = ex_alloc(n * 2), out = ex_alloc(n * 2);
    lse = ex_alloc((size_t)B * H * S * sizeof(float));
    doc = ex_alloc((size_t)B * S * sizeof(int32_t));
    EX_REQUIRE(q && k && v && out && lse && doc, "out of device memory");
    EX_REQUIRE(ex_upload(q, hq, n * 2) && ex_upload(k, hk, n * 2) && ex_upload(v, hv, n * 2),
               "upload failed");
    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");

    /* The same parameters twice: device memory for the GPU, host memory for
     * the CPU builder and the reference. */
    fg_binding gpu_binds[] = {fg_bind_int("SEQ_LEN", S),
                              fg_bind_int_buffer("doc", (const int32_t *)ex_ptr(doc), B * S)};
    fg_binding cpu_binds[] = {fg_bind_int("SEQ_LEN", S), fg_bind_int_buffer("doc", hdoc, B * S)};
    fg_block_mask_desc desc = {.batch = B, .heads = 1, .q_len = S, .kv_len = S};

    fg_attention_args a = {0};
    a.batch = B, a.heads_q = H, a.heads_kv = H, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.binds = gpu_binds, a.nbinds = 2;
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;

    fg_cache_reset_stats();
    uint64_t mask_compiles = 0, attn_compiles = 0;
    fg_cache_stats before, after;
    ex_error worst = {0};
    printf("B=%d H=%d S=%d D=%d bf16\n", B, H, S, D);
    printf("step  documents  empty  mask build ms  attention ms  TFLOP/s\n");
    for (int step = 0; step < STEPS; step++) {
        int ndocs[B];
        pack_documents(hdoc, ndocs, &seed);
        EX_REQUIRE(ex_upload(doc, hdoc, (size_t)B * S * sizeof *hdoc), "upload failed");

        fg_cache_get_stats(&before);
        ex_timer_begin(&timer);
        if (!mask)
            EX_TRY(ctx, fg_block_mask_create_gpu(ctx, mod, &desc, gpu_binds, 2, NULL, &mask));
        else
            EX_TRY(ctx, fg_block_mask_rebuild_gpu(ctx, mask, mod, gpu_binds, 2, NULL));
        double build_ms = ex_timer_end(&timer);
        fg_cache_get_stats(&after);
        mask_compiles += after.misses - before.misses;

        a.block_mask = mask;
        EX_REQUIRE(ex_poison(out, n * 2) && ex_poison(lse, (size_t)B * H * S * 4), "memset failed");
        before = after;
        ex_timer_begin(&timer);
        EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
        double attn_ms = ex_timer_end(&timer);
        fg_cache_get_stats(&after);
        attn_compiles += after.misses - before.misses;

        /* Reading the mask on the host is for the printout, not the loop. */
        double sparsity = 0;
        EX_TRY(ctx, fg_block_mask_download(ctx, mask));
        EX_TRY(ctx, fg_block_mask_sparsity(mask, &sparsity));
        printf("%4d  %4d+%-4d  %4.1f%%  %13.3f  %12.3f  %7.1f%s\n", step, ndocs[0], ndocs[1],
               100 * sparsity, build_ms, attn_ms, ex_tflops(&a, 1 - sparsity, attn_ms),
               step == 0 ? "   (includes the compiles)" : "");

        if (step == 0 || step == STEPS - 1) {
            ex_error e;
            EX_REQUIRE(ex_download(hout, out, n * 2) &&
                           ex_download(hlse, lse, (size_t)B * H * S * sizeof *hlse),
                       "download failed");
            EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, cpu_binds, 2, hout, hlse,
                                        S - CHECK_ROWS, CHECK_ROWS, &e));
            ex_error_merge(&worst, &e);
            EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, cpu_binds, 2, hout, hlse, S / 2,
                                        CHECK_ROWS, &e));
            ex_error_merge(&worst, &e);
            worst.nonfinite += ex_checksum_bf16(hout, n).nonfinite;
        }
    }

    /* The CPU builder on the last layout must give the same arrays. */
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, cpu_binds, 2, &cpu_mask));
    int same = same_block_mask(mask, cpu_mask);
    printf("vs CPU reference (steps 0 and %d, rows %d..%d and %d..%d): out rel err %.2e, "
           "lse err %.2e, non-finite %zu\n", STEPS - 1, S / 2, S / 2 + CHECK_ROWS - 1,
           S - CHECK_ROWS, S - 1, worst.out_rel, worst.lse_max, worst.nonfinite);
    printf("GPU block mask == CPU block mask: %s\n", same ? "yes" : "NO");
    printf("compiled: %llu block-mask kernel(s), %llu attention kernel(s) in %d steps\n",
           (unsigned long long)mask_compiles, (unsigned long long)attn_compiles, STEPS);
    EX_REQUIRE(ex_error_ok(&worst), "FAILED: outside tolerance");
    EX_REQUIRE(same, "FAILED: the GPU and CPU builders disagree");
    EX_REQUIRE(mask_compiles == 1 && attn_compiles == 1, "FAILED: expected one compile per kind");
    printf("OK\n");
    rc = 0;

done:
    ex_timer_destroy(&timer);
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse), ex_free(doc);
    free(hq), free(hk), free(hv), free(hout), free(hlse), free(hdoc);
    fg_block_mask_destroy(cpu_mask);
    fg_block_mask_destroy(mask);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
