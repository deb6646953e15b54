/*
 * measure.c -- one case of `flexgen bench`, from its mod files to a row of
 * results: the block mask's first build and in-place rebuilds, the first
 * calls (cold, from disk, memory hit), the forward speed, with --backward
 * the backward speed, then the accuracy check. Each case gets its own empty
 * cache folder, so "cold" means cold.
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

/* ---- a cache folder per case ---------------------------------------------- */

/* A fresh, empty cache folder for one case. */
static bool fresh_cache_dir(char *buf, size_t n) {
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, n, "%s/flexgen-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(buf) != NULL;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The folder and whatever is in it (cache files, and temporary files of an
 * interrupted write). */
static void remove_cache_dir(const char *dir) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fg_cli_error(0, "bench: could not remove %s", dir);
}

/* ---- the backward ----------------------------------------------------------- */

/* The backward's speed on the forward's out and lse (the timed forward
 * runs left them in place): dq, dk, dv and the gradient of every float
 * buffer score_mod's value depends on, as a training step with learnable
 * buffers computes them. TFLOP/s count 2.5 times the forward's FLOPs (two
 * matmuls forward, five backward). */
static fg_status time_backward(fg_ctx *ctx, const bench_opts *o, const bench_fwd_arg *fa,
                               const bench_dev_params *d, const bench_inputs *in, bench_result *r) {
    const char *names[BENCH_MAX_PARAMS];
    int nnames = 0;
    FGI_TRY(fg_cli_grad_buffers(ctx, fa->mod, names, BENCH_MAX_PARAMS, &nnames));
    fg_binding binds[BENCH_MAX_PARAMS];
    CUdeviceptr mem[BENCH_MAX_PARAMS] = {0};
    size_t nb = 0;
    fg_status st = FG_OK;
    for (int k = 0; st == FG_OK && k < nnames; k++) {
        const fg_binding *b = NULL;
        for (size_t i = 0; i < d->n && !b; i++)
            if (strcmp(d->binds[i].name, names[k]) == 0) b = &d->binds[i];
        if (!b || b->kind != FG_PARAM_BUFFER || b->value.buffer.length <= 0) continue; /* nothing to write */
        const int64_t len = b->value.buffer.length;
        st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&mem[nb], (size_t)len * 4), "cuMemAlloc");
        if (st == FG_OK) binds[nb] = fg_bind_float_buffer(names[k], (const float *)(uintptr_t)mem[nb], len), nb++;
    }
    bench_bwd_arg ba;
    memset(&ba, 0, sizeof ba);
    ba.mod = fa->mod;
    ba.args = fg_attention_bwd_args_init();
    ba.args.fwd = &fa->args;
    ba.args.dout = (const void *)(uintptr_t)in->dout;
    ba.args.dq = (void *)(uintptr_t)in->dq, ba.args.dk = (void *)(uintptr_t)in->dk;
    ba.args.dv = (void *)(uintptr_t)in->dv;
    ba.args.grad_binds = binds, ba.args.ngrad_binds = nb;
    ba.args.deterministic = o->deterministic;
    /* One untimed call first: it compiles the backward kernels, which must
     * not happen between two events even with --warmup 0. */
    if (st == FG_OK) st = bench_launch_backward(ctx, &ba);
    if (st == FG_OK) st = bench_sync(ctx);
    if (st == FG_OK) st = bench_time_median(ctx, bench_launch_backward, &ba, o->warmup, o->iters, 0, &r->bwd_ms);
    if (st == FG_OK)
        r->bwd_tflops = 2.5 * 4.0 * o->batch * o->heads * (double)o->seq * o->seq * o->head_dim * r->density /
                        (r->bwd_ms * 1e-3) / 1e12;
    for (size_t i = 0; i < BENCH_MAX_PARAMS; i++)
        if (mem[i]) fgi_cu()->cuMemFree(mem[i]);
    return st;
}

/* ---- one case --------------------------------------------------------------- */

fg_status bench_load_case_mod(fg_ctx *ctx, const bench_case *c, fg_mod **out) {
    fg_mod *m = NULL, *s = NULL;
    *out = NULL;
    if (c->mask_file) FGI_TRY(fg_mod_from_file(ctx, c->mask_file, &m));
    if (c->score_file) {
        fg_status st = fg_mod_from_file(ctx, c->score_file, &s);
        if (st != FG_OK) {
            fg_mod_destroy(m);
            return st;
        }
    }
    if (m && s) {
        fg_status st = fg_mod_combine(ctx, m, s, out);
        fg_mod_destroy(m);
        fg_mod_destroy(s);
        return st;
    }
    *out = m ? m : s;
    return FG_OK;
}

fg_status bench_run_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const bench_inputs *in,
                         bench_result *r) {
    const int B = o->batch, H = o->heads, S = o->seq, D = o->head_dim;
    fg_mod *mod = NULL;
    fg_block_mask *bm = NULL;
    bench_params s = {0};
    bench_dev_params d = {0};
    char cache[4096] = "";
    fg_cache_stats s0, s1;
    snprintf(r->name, sizeof r->name, "%s", c->name);
    fg_status st = bench_load_case_mod(ctx, c, &mod);
    if (st == FG_OK) snprintf(r->mod_name, sizeof r->mod_name, "%s", fg_mod_name(mod));
    if (st == FG_OK) st = bench_case_params(ctx, o, c, mod, B, H, S, &s);
    if (st == FG_OK) st = bench_dev_params_upload(ctx, &s, &d);
    if (st == FG_OK && !fresh_cache_dir(cache, sizeof cache))
        st = fgi_error(ctx, FG_ERR_IO, "cannot create a temporary cache folder: %s", strerror(errno));
    if (st == FG_OK) st = fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, cache);
    fg_cache_forget_memory();

    /* Block mask: first build (builder compiled cold), then in-place rebuilds.
     * A mask_mod that never reads b (h) gets one block mask for every batch
     * entry (head), as a user would build it. */
    r->density = 1.0;
    r->bm_first_ms = r->bm_rebuild_ms = NAN; /* none without a mask_mod */
    if (st == FG_OK && fg_mod_has_mask(mod)) {
        double t0 = fgi_now_ms();
        st = bench_block_mask_create(ctx, mod, B, H, S, S, 0, &d, &bm);
        if (st == FG_OK) st = bench_sync(ctx);
        r->bm_first_ms = fgi_now_ms() - t0;
        bench_rebuild_arg ra = {bm, mod, d.binds, d.n};
        if (st == FG_OK)
            st = bench_time_median(ctx, bench_launch_rebuild, &ra, o->warmup, o->iters, 0, &r->bm_rebuild_ms);
        double sparsity = 0;
        if (st == FG_OK) st = fg_block_mask_download(ctx, bm);
        if (st == FG_OK) st = fg_block_mask_sparsity(bm, &sparsity);
        r->density = 1.0 - sparsity;
    }

    /* First calls: cold (empty disk cache), then from disk, then a memory hit. */
    bench_fwd_arg fa;
    memset(&fa, 0, sizeof fa);
    fa.mod = mod;
    fg_attention_args *a = &fa.args;
    a->batch = B, a->heads_q = a->heads_kv = H, a->q_len = a->kv_len = S, a->head_dim = D;
    a->dtype = o->dtype;
    a->q = (const void *)(uintptr_t)in->q, a->k = (const void *)(uintptr_t)in->k;
    a->v = (const void *)(uintptr_t)in->v, a->out = (void *)(uintptr_t)in->out;
    a->lse = (float *)(uintptr_t)in->lse;
    a->block_mask = bm, a->binds = d.binds, a->nbinds = d.n;
    if (st == FG_OK) {
        fg_cache_get_stats(&s0);
        double t0 = fgi_now_ms();
        st = fg_attention_forward(ctx, mod, a);
        if (st == FG_OK) st = bench_sync(ctx);
        r->cold_ms = fgi_now_ms() - t0;
        fg_cache_get_stats(&s1);
        r->nvrtc_ms = s1.compile_ms - s0.compile_ms;
    }
    if (st == FG_OK) {
        fg_cache_forget_memory();
        fg_cache_get_stats(&s0);
        double t0 = fgi_now_ms();
        st = fg_attention_forward(ctx, mod, a);
        if (st == FG_OK) st = bench_sync(ctx);
        r->disk_ms = fgi_now_ms() - t0;
        fg_cache_get_stats(&s1);
        r->disk_load_ms = s1.load_ms - s0.load_ms;
    }
    if (st == FG_OK) {
        /* as forward asks */
        fg_kernel_config cfg = {.kind = FG_KERNEL_ATTENTION_FWD, .dtype = o->dtype, .head_dim = D};
        fg_kernel *k = NULL;
        st = fg_kernel_get(ctx, mod, &cfg, &k);
        r->kernel = fg_kernel_kind_of(k) == FG_KERNEL_ATTENTION_FWD_SM90 ? "sm90" : "portable";
        fg_kernel_release(k);
        const int n = 1000;
        double t0 = fgi_now_ms();
        for (int i = 0; st == FG_OK && i < n; i++) {
            st = fg_kernel_get(ctx, mod, &cfg, &k);
            fg_kernel_release(k);
        }
        r->mem_hit_us = (fgi_now_ms() - t0) * 1e3 / n;
    }

    /* Forward speed. */
    if (st == FG_OK) st = bench_time_median(ctx, bench_launch_forward, &fa, o->warmup, o->iters, 0, &r->fwd_ms);
    if (st == FG_OK)
        r->tflops = 4.0 * B * H * (double)S * S * D * r->density / (r->fwd_ms * 1e-3) / 1e12;
    if (st == FG_OK && o->backward) st = time_backward(ctx, o, &fa, &d, in, r);

    fg_block_mask_destroy(bm);
    bench_dev_params_free(&d);
    bench_params_free(&s);
    if (st == FG_OK && o->check) st = bench_check_case(ctx, o, c, mod, &r->acc);
    if (st != FG_OK) { /* report now: the cleanup below may clear the error */
        snprintf(r->failure, sizeof r->failure, "%s: %s", fg_status_string(st), fg_errmsg(ctx));
        fg_cli_fail(ctx, st, r->name);
    }
    if (cache[0]) remove_cache_dir(cache);
    fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, NULL);
    fg_mod_destroy(mod);
    return st;
}
