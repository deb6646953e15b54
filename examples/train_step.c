/*
 * train_step.c -- a few training steps of one attention layer: forward,
 * backward and an SGD update, with new document boundaries every step.
 *
 * The layer trains on packed sequences: each row of the batch is several
 * documents back to back, and a token attends to earlier tokens of its own
 * document only. Every step brings a new batch, so new boundaries and a new
 * block mask, rebuilt in place on the GPU from a device buffer of document
 * ids (fg_block_mask_rebuild_gpu, as in document_packing.c). Then, per step:
 *
 *   forward   out, lse = attention(q, k, v)          fg_kernel_launch
 *   backward  dq, dk, dv = d loss / d (q, k, v)      fg_kernel_launch_backward
 *   loss      sum(out * dout) for a fixed random dout
 *   update    q -= LR * dq, and the same for k and v
 *
 * The loss is the usual way to test a backward pass: its gradient with
 * respect to out is exactly dout, so the backward receives a known dout and
 * everything it returns is d loss / d input. Both kernels are fetched once
 * with fg_kernel_get before the loop (the backward is kind
 * FG_KERNEL_ATTENTION_BWD: one module with all its entry points), so the
 * loop only launches. The forward keeps its lse: the backward reads it
 * instead of recomputing the softmax normaliser.
 *
 * The update runs on the host: the gradients come back for the checks
 * anyway, and fp32 master copies of q, k and v live there, rounded to bf16
 * for the device after each update (the mixed-precision recipe; a bf16
 * weight would lose most small updates to rounding). Only the forward and
 * backward are timed. The loss is printed per step; it tends to fall, but
 * each step sees another mask, so it is no convergence test.
 *
 * Each step poisons out, lse, dq, dk and dv (0xFF bytes: NaN in bf16 and
 * fp32) before the launches and counts the non-finite values after, so an
 * element the kernels forgot to write cannot pass. On the first and last
 * steps dq, dk and dv are compared with fg_attention_reference_backward (the
 * CPU reference, float64, mask_mod evaluated at every pair, so it does not
 * lean on the GPU-built block mask): relative Frobenius error at most 2e-2,
 * bf16's budget. The shape is small so that each reference call takes about
 * a second: it costs O(B * Hq * S^2 * D). It uses grouped-query attention
 * (4 query heads over 2 KV heads), so dk and dv are sums over each group.
 *
 * What it prints: the mod, a CPU picture of one document layout (no GPU
 * needed), the time to fetch the kernels (compiled on the first run, from
 * the disk cache on later ones), then per step the documents per row, the
 * share of empty blocks, the GPU time of the mask rebuild, of the forward
 * and of the backward, the loss, and on the checked steps the errors
 * against the reference. It exits 0 only when every check passes.
 *
 * Build: cc train_step.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

enum { B = 2, HQ = 4, HKV = 2, S = 1024, D = 64, STEPS = 5 };

/* The learning rate: large enough that the loss moves visibly in a step. */
static const double LR = 0.05;
/* Relative Frobenius error allowed for a bf16 gradient. */
static const double GRAD_TOL = 2e-2;

static const char *const MOD_SOURCE =
    "/* Documents packed back to back in each batch row, causal inside each.\n"
    " * doc[b * SEQ_LEN + i] is the document id of position i in row b. */\n"
    "int SEQ_LEN = 1024;\n"
    "const int *doc;\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    int row = b * SEQ_LEN;\n"
    "    return q_idx >= kv_idx && doc[row + q_idx] == doc[row + kv_idx];\n"
    "}\n";

/* A new batch: documents of 32 to 543 tokens until each row is full, so
 * the 128-token blocks are a mix of partial, full and empty ones. Writes
 * the ids and the number of documents per row. */
static void pack_documents(int32_t *doc, int ndocs[B], uint64_t *seed) {
    for (int b = 0; b < B; b++) {
        int pos = 0, id = 0;
        while (pos < S) {
            int len = 32 + (int)(ex_uniform(seed) * 512);
            for (int i = 0; i < len && pos < S; i++) doc[b * S + pos++] = id;
            id++;
        }
        ndocs[b] = id;
    }
}

/* n values uniform in [-1, 1): an fp32 master copy and its bf16 rounding. */
static void random_weights(float *w, uint16_t *w16, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) {
        w[i] = (float)(2.0 * ex_uniform(seed) - 1.0);
        w16[i] = ex_bf16(w[i]);
    }
}

/* w -= LR * grad on the fp32 master copy, then the bf16 copy for the GPU. */
static void sgd(float *w, uint16_t *w16, const uint16_t *grad, size_t n) {
    for (size_t i = 0; i < n; i++) {
        w[i] -= (float)(LR * ex_float(grad[i]));
        w16[i] = ex_bf16(w[i]);
    }
}

static double dot_bf16(const uint16_t *x, const uint16_t *y, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)ex_float(x[i]) * ex_float(y[i]);
    return s;
}

/* ||gpu - ref|| / ||ref|| (Frobenius); a NaN in gpu makes it NaN, which no
 * tolerance accepts. */
static double rel_error(const uint16_t *gpu, const double *ref, size_t n) {
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < n; i++) {
        double d = ex_float(gpu[i]) - ref[i];
        diff2 += d * d;
        ref2 += ref[i] * ref[i];
    }
    return ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
}

/* The larger error; NaN when either is NaN, so it shows in the summary. */
static double worse(double x, double y) {
    return isnan(x) || isnan(y) ? NAN : fmax(x, y);
}

/* Milliseconds between two events that have completed. */
static double event_ms(void *from, void *to) {
    float ms = -1.0f;
    if (!ex_cu_ok(ex_cu.cuEventElapsedTime(&ms, from, to), "cuEventElapsedTime")) return -1.0;
    return ms;
}

static const char *kernel_kind_name(fg_kernel_kind kind) {
    switch (kind) {
    case FG_KERNEL_ATTENTION_FWD: return "portable forward";
    case FG_KERNEL_ATTENTION_FWD_SM90: return "Hopper forward";
    case FG_KERNEL_ATTENTION_BWD: return "backward";
    default: return "?";
    }
}

/* The CPU part: one layout, drawn by the CPU builder. */
static int show_layout(fg_ctx *ctx, const fg_mod *mod, int32_t *doc, uint64_t *seed) {
    int rc = 1, ndocs[B];
    fg_block_mask *mask = NULL;
    char *picture = NULL;
    pack_documents(doc, ndocs, seed);
    fg_block_mask_desc desc = FG_BLOCK_MASK_DESC_INIT;
    desc.batch = B, desc.heads = 1, desc.q_len = S, desc.kv_len = S;
    fg_binding binds[] = {fg_bind_int("SEQ_LEN", S), fg_bind_int_buffer("doc", doc, B * S)};
    EX_TRY(ctx, fg_block_mask_create(ctx, mod, &desc, binds, 2, &mask));
    EX_TRY(ctx, fg_block_mask_picture(mask, 8, 8, &picture));
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
    fg_block_mask *mask = NULL;
    fg_kernel *fwd = NULL, *bwd = NULL;
    /* Host: fp32 master weights, their bf16 copies, results, reference. */
    float *wq = NULL, *wk = NULL, *wv = NULL, *hlse = NULL;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hdout = NULL, *hout = NULL;
    uint16_t *hdq = NULL, *hdk = NULL, *hdv = NULL;
    double *rdq = NULL, *rdk = NULL, *rdv = NULL;
    int32_t *hdoc = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0, dout = 0, dq = 0, dk = 0, dv = 0, doc = 0;
    ex_timer t_mask = {0}, t_fwd = {0}, t_bwd = {0};
    const size_t nq = (size_t)B * HQ * S * D, nkv = (size_t)B * HKV * S * D;
    const size_t nlse = (size_t)B * HQ * S;
    uint64_t seed = 7;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, fg_mod_from_source(ctx, "train_documents.c", MOD_SOURCE, (size_t)-1, &mod));
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

    wq = malloc(nq * sizeof *wq), wk = malloc(nkv * sizeof *wk), wv = malloc(nkv * sizeof *wv);
    hq = malloc(nq * 2), hk = malloc(nkv * 2), hv = malloc(nkv * 2);
    hout = malloc(nq * 2), hdq = malloc(nq * 2), hdk = malloc(nkv * 2), hdv = malloc(nkv * 2);
    hlse = malloc(nlse * sizeof *hlse);
    rdq = malloc(nq * sizeof *rdq), rdk = malloc(nkv * sizeof *rdk), rdv = malloc(nkv * sizeof *rdv);
    EX_REQUIRE(wq && wk && wv && hq && hk && hv && hout && hdq && hdk && hdv && hlse && rdq && rdk &&
                   rdv, "out of host memory");
    random_weights(wq, hq, nq, &seed);
    random_weights(wk, hk, nkv, &seed);
    random_weights(wv, hv, nkv, &seed);
    hdout = ex_random_bf16(nq, &seed);
    EX_REQUIRE(hdout, "out of host memory");

    q = ex_alloc(nq * 2), k = ex_alloc(nkv * 2), v = ex_alloc(nkv * 2);
    out = ex_alloc(nq * 2), lse = ex_alloc(nlse * sizeof(float)), dout = ex_alloc(nq * 2);
    dq = ex_alloc(nq * 2), dk = ex_alloc(nkv * 2), dv = ex_alloc(nkv * 2);
    doc = ex_alloc((size_t)B * S * sizeof(int32_t));
    EX_REQUIRE(q && k && v && out && lse && dout && dq && dk && dv && doc, "out of device memory");
    EX_REQUIRE(ex_upload(q, hq, nq * 2) && ex_upload(k, hk, nkv * 2) && ex_upload(v, hv, nkv * 2) &&
                   ex_upload(dout, hdout, nq * 2) &&
                   ex_upload(doc, hdoc, (size_t)B * S * sizeof *hdoc),
               "upload failed");
    EX_REQUIRE(ex_timer_create(&t_mask) && ex_timer_create(&t_fwd) && ex_timer_create(&t_bwd),
               "no CUDA events");

    /* The same parameters twice: device memory for the GPU, host memory for
     * the reference. */
    fg_binding gpu_binds[] = {fg_bind_int("SEQ_LEN", S),
                              fg_bind_int_buffer("doc", (const int32_t *)ex_ptr(doc), B * S)};
    fg_binding cpu_binds[] = {fg_bind_int("SEQ_LEN", S), fg_bind_int_buffer("doc", hdoc, B * S)};

    /* Both kernels once, before the loop: compiled here on the first run,
     * from the disk cache on later ones. The block mask too: its builder is
     * compiled by the first create, and every step then rebuilds it. */
    fg_kernel_config cfg = FG_KERNEL_CONFIG_INIT;
    cfg.dtype = FG_BF16, cfg.head_dim = D;
    fg_cache_stats before, after;
    fg_cache_get_stats(&before);
    double t0 = ex_now_ms();
    cfg.kind = FG_KERNEL_ATTENTION_FWD;
    EX_TRY(ctx, fg_kernel_get(ctx, mod, &cfg, &fwd));
    double t1 = ex_now_ms();
    cfg.kind = FG_KERNEL_ATTENTION_BWD;
    EX_TRY(ctx, fg_kernel_get(ctx, mod, &cfg, &bwd));
    double t2 = ex_now_ms();
    fg_block_mask_desc desc = FG_BLOCK_MASK_DESC_INIT;
    desc.batch = B, desc.heads = 1, desc.q_len = S, desc.kv_len = S;
    EX_TRY(ctx, fg_block_mask_create_gpu(ctx, mod, &desc, gpu_binds, 2, NULL, &mask));
    EX_REQUIRE(ex_sync(), "the block-mask build failed on the GPU");
    fg_cache_get_stats(&after);
    printf("kernels fetched: %s %.0f ms, %s %.0f ms, block-mask builder %.0f ms "
           "(%llu compiled, %llu from the disk cache, %llu from memory)\n",
           kernel_kind_name(fg_kernel_kind_of(fwd)), t1 - t0,
           kernel_kind_name(fg_kernel_kind_of(bwd)), t2 - t1, ex_now_ms() - t2,
           (unsigned long long)(after.misses - before.misses),
           (unsigned long long)(after.disk_hits - before.disk_hits),
           (unsigned long long)(after.memory_hits - before.memory_hits));

    fg_attention_args a = FG_ATTENTION_ARGS_INIT;
    a.batch = B, a.heads_q = HQ, a.heads_kv = HKV, a.q_len = S, a.kv_len = S, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.block_mask = mask;
    a.binds = gpu_binds, a.nbinds = 2;

    fg_attention_bwd_args g = FG_ATTENTION_BWD_ARGS_INIT;
    g.fwd = &a;
    g.dout = ex_ptr(dout);
    g.dq = ex_ptr(dq), g.dk = ex_ptr(dk), g.dv = ex_ptr(dv);

    /* The reference's view of the same call: host q, k, v (the bf16 values
     * the GPU has), host bindings, no block mask. It reads neither out nor
     * lse, but takes the forward's arguments as they were. */
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv, host.out = hout, host.lse = hlse;
    host.block_mask = NULL;
    host.binds = cpu_binds;
    fg_attention_bwd_args ref = FG_ATTENTION_BWD_ARGS_INIT;
    ref.fwd = &host;
    ref.dout = hdout;
    ref.dq = rdq, ref.dk = rdk, ref.dv = rdv;

    printf("B=%d Hq=%d Hkv=%d S=%d D=%d bf16, SGD with lr %.2f\n", B, HQ, HKV, S, D, LR);
    printf("step  documents  empty  mask ms  forward ms  backward ms  fwd+bwd ms       loss\n");
    double worst = 0, later_ms = 0;
    int grads_ok = 1;
    size_t nonfinite = 0;
    for (int step = 0; step < STEPS; step++) {
        int ndocs[B];
        pack_documents(hdoc, ndocs, &seed);
        EX_REQUIRE(ex_upload(doc, hdoc, (size_t)B * S * sizeof *hdoc), "upload failed");
        ex_timer_begin(&t_mask);
        EX_TRY(ctx, fg_block_mask_rebuild_gpu(ctx, mask, mod, gpu_binds, 2, NULL));
        double mask_ms = ex_timer_end(&t_mask);

        EX_REQUIRE(ex_poison(out, nq * 2) && ex_poison(lse, nlse * sizeof(float)) &&
                       ex_poison(dq, nq * 2) && ex_poison(dk, nkv * 2) && ex_poison(dv, nkv * 2),
                   "memset failed");
        /* No sync between the two launches: t_bwd's start event is also the
         * forward's end. */
        ex_timer_begin(&t_fwd);
        EX_TRY(ctx, fg_kernel_launch(ctx, fwd, &a));
        ex_timer_begin(&t_bwd);
        EX_TRY(ctx, fg_kernel_launch_backward(ctx, bwd, &g));
        double bwd_ms = ex_timer_end(&t_bwd);
        double fwd_ms = event_ms(t_fwd.start, t_bwd.start);
        if (step > 0) later_ms += fwd_ms + bwd_ms;

        /* Everything past here is for the printout, the checks and the
         * update: off the clock. */
        EX_REQUIRE(ex_download(hout, out, nq * 2) && ex_download(hdq, dq, nq * 2) &&
                       ex_download(hdk, dk, nkv * 2) && ex_download(hdv, dv, nkv * 2),
                   "download failed");
        size_t bad = ex_checksum_bf16(hout, nq).nonfinite + ex_checksum_bf16(hdq, nq).nonfinite +
                     ex_checksum_bf16(hdk, nkv).nonfinite + ex_checksum_bf16(hdv, nkv).nonfinite;
        nonfinite += bad;
        double sparsity = 0;
        EX_TRY(ctx, fg_block_mask_download(ctx, mask));
        EX_TRY(ctx, fg_block_mask_sparsity(mask, &sparsity));
        printf("%4d  %4d+%-4d  %4.1f%%  %7.3f  %10.3f  %11.3f  %10.3f  %9.3f%s\n", step,
               ndocs[0], ndocs[1], 100 * sparsity, mask_ms, fwd_ms, bwd_ms, fwd_ms + bwd_ms,
               dot_bf16(hout, hdout, nq), step == 0 ? "  (first launches)" : "");
        if (bad) printf("      %zu non-finite values in out, dq, dk, dv\n", bad);

        if (step == 0 || step == STEPS - 1) {
            double r0 = ex_now_ms();
            EX_TRY(ctx, fg_attention_reference_backward(ctx, mod, &ref));
            double r1 = ex_now_ms();
            double eq = rel_error(hdq, rdq, nq), ek = rel_error(hdk, rdk, nkv),
                   ev = rel_error(hdv, rdv, nkv);
            printf("      vs CPU reference (float64, %.1f s): rel err dq %.2e, dk %.2e, dv %.2e\n",
                   (r1 - r0) / 1e3, eq, ek, ev);
            /* Written so that a NaN error fails. */
            grads_ok = grads_ok && eq <= GRAD_TOL && ek <= GRAD_TOL && ev <= GRAD_TOL;
            worst = worse(worst, worse(eq, worse(ek, ev)));
        }

        if (step < STEPS - 1) {
            sgd(wq, hq, hdq, nq);
            sgd(wk, hk, hdk, nkv);
            sgd(wv, hv, hdv, nkv);
            EX_REQUIRE(ex_upload(q, hq, nq * 2) && ex_upload(k, hk, nkv * 2) &&
                           ex_upload(v, hv, nkv * 2),
                       "upload failed");
        }
    }
    /* The first launches may pay one-time costs (lazy module loading, the
     * stream memory pool's first allocation), so the mean leaves them out. */
    printf("forward + backward: %.3f ms per step (mean of steps 1..%d)\n",
           later_ms / (STEPS - 1), STEPS - 1);
    printf("gradients vs CPU reference (steps 0 and %d): worst rel err %.2e (tolerance %.0e), "
           "non-finite %zu\n", STEPS - 1, worst, GRAD_TOL, nonfinite);
    EX_REQUIRE(grads_ok, "FAILED: a gradient is outside tolerance");
    EX_REQUIRE(nonfinite == 0, "FAILED: non-finite outputs (unwritten or overflowed)");
    printf("OK\n");
    rc = 0;

done:
    if (ex_cu.ok) ex_sync(); /* nothing may still run on memory freed below */
    ex_timer_destroy(&t_mask), ex_timer_destroy(&t_fwd), ex_timer_destroy(&t_bwd);
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse), ex_free(dout);
    ex_free(dq), ex_free(dk), ex_free(dv), ex_free(doc);
    free(wq), free(wk), free(wv), free(hlse);
    free(hq), free(hk), free(hv), free(hdout), free(hout), free(hdq), free(hdk), free(hdv);
    free(rdq), free(rdk), free(rdv), free(hdoc);
    fg_kernel_release(fwd);
    fg_kernel_release(bwd);
    fg_block_mask_destroy(mask);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
