/*
 * decode.c -- one decode step of `flexgen bench --decode`: B sequences of
 * KV keys each with Q new queries at their ends (positions KV - Q .. KV -
 * 1), K/V contiguous or in a paged cache, run as a serving loop runs it:
 * the kernel fetched once (fg_attention_kernel_for, which names the decode
 * kernel), then one fg_kernel_launch per step.
 *
 *   GPU time    the median of event-timed launches (timing.c), each after
 *               a write of 256 MiB that leaves none of the step's K/V in
 *               the L2, as compare_decode.py's timing does (a window's
 *               few MB would otherwise be read from the L2 every launch);
 *   TB/s        the bytes of K and V the step must read over the GPU time:
 *               2 (K and V) x B x Hkv x D x 2 bytes x the keys some query
 *               of the step can see (all of them for a causal step, the
 *               window for sliding_window), as bench/compare_decode.py
 *               counts them, so the two agree;
 *   host time   the wall-clock time of one fg_kernel_launch call on the
 *               fetched kernel (timing.c's bench_host_us), given a
 *               workspace allocated once (fg_attention_workspace_size) as
 *               a serving loop does: what such a loop pays on the CPU per
 *               step, which must stay under 10 us; in a burst of launches,
 *               and right after a synchronisation (a loop that waits for
 *               each step's tokens).
 *
 * A contiguous step passes the queries' position as q_offset; a paged one
 * passes, as compare_decode.py's paged rows and a serving loop do, a
 * length and a q offset per sequence (device arrays, every sequence KV
 * keys long) and a block table over shuffled pages (paged.c). A mod with a
 * mask_mod gets a block mask for the step's positions, made before the
 * timing as a serving loop makes it once per shape.
 *
 * The timed inputs (q, k, v, out, lse) are allocated once, for the largest
 * shape and layout, and shared by every row: a contiguous step reads K as
 * [B, Hkv, KV, D], a paged one the same memory as [pages, page, Hkv, D].
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

/* Launches per round of the host's timing (timing.c: bench_host_us). */
#define HOST_BURST 100

/* ---- the shared inputs ---------------------------------------------------- */

/* Elements of K (and V) a step of `shape` reads: contiguous, or the paged
 * cache of `page` rows per page that bench_paged_step_make lays out. */
static fg_status kv_elems(fg_ctx *ctx, const bench_opts *o, bench_decode_shape sh, int page, size_t *n) {
    *n = (size_t)sh.batch * o->kv_heads * sh.kv_len * o->head_dim;
    if (page == 0) return FG_OK;
    fg_cli_paging pg;
    if (fg_cli_paging_make(sh.batch, sh.kv_len, NULL, page, 0, &pg) != 0)
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a block table");
    *n = fg_cli_paged_elems(&pg, o->kv_heads, o->head_dim);
    fg_cli_paging_free(&pg);
    return FG_OK;
}

fg_status bench_decode_inputs_alloc(fg_ctx *ctx, const bench_opts *o, bench_decode_inputs *in) {
    size_t nq = 0, nk = 0;
    memset(in, 0, sizeof *in);
    for (int i = 0; i < o->nshapes; i++) {
        const bench_decode_shape sh = o->shapes[i];
        const size_t q = (size_t)sh.batch * o->heads * sh.q_len * o->head_dim;
        nq = q > nq ? q : nq;
        for (int j = 0; j < o->npages; j++) {
            size_t k;
            FGI_TRY(kv_elems(ctx, o, sh, o->pages[j], &k));
            nk = k > nk ? k : nk;
        }
    }
    FGI_TRY(bench_upload_random(ctx, nq, o->dtype, 1, &in->q));
    FGI_TRY(bench_upload_random(ctx, nk, o->dtype, 2, &in->k));
    FGI_TRY(bench_upload_random(ctx, nk, o->dtype, 3, &in->v));
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->out, nq * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->lse, nq / (size_t)o->head_dim * sizeof(float)), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->flush, BENCH_L2_FLUSH_BYTES), "cuMemAlloc");
    return FG_OK;
}

void bench_decode_inputs_free(const bench_decode_inputs *in) {
    const CUdeviceptr p[] = {in->q, in->k, in->v, in->out, in->lse, in->flush};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) fgi_cu()->cuMemFree(p[i]);
}

/* ---- one step --------------------------------------------------------------- */

/* Keys some query of the step (queries at off + i) can see at b = 0, h = 0:
 * every key without a mask_mod. */
static fg_status visible_keys(fg_ctx *ctx, const fg_mod *mod, const bench_params *s, bench_decode_shape sh,
                              int off, int64_t *keys) {
    *keys = sh.kv_len;
    if (!fg_mod_has_mask(mod)) return FG_OK;
    const int T = 4096;
    fg_binding hb[BENCH_MAX_PARAMS];
    bench_params_bind(s, hb);
    uint8_t *m = malloc((size_t)sh.q_len * T);
    if (!m) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory");
    fg_status st = FG_OK;
    int64_t n = 0;
    for (int k0 = 0; st == FG_OK && k0 < sh.kv_len; k0 += T) {
        const int nk = sh.kv_len - k0 < T ? sh.kv_len - k0 : T;
        st = fg_mod_eval_mask(ctx, mod, hb, (size_t)s->n, 0, 0, off, sh.q_len, k0, nk, m);
        for (int j = 0; st == FG_OK && j < nk; j++) {
            bool seen = false;
            for (int i = 0; i < sh.q_len; i++) seen = seen || m[(size_t)i * nk + j];
            n += seen;
        }
    }
    free(m);
    *keys = n;
    return st;
}

/* The step on the shared inputs, its queries the newest tokens. */
static fg_attention_args step_args(const bench_opts *o, bench_decode_shape sh, const bench_decode_inputs *in) {
    fg_attention_args a = fg_attention_args_init();
    a.batch = sh.batch, a.heads_q = o->heads, a.heads_kv = o->kv_heads;
    a.q_len = sh.q_len, a.kv_len = sh.kv_len, a.head_dim = o->head_dim, a.dtype = o->dtype;
    a.q = (const void *)(uintptr_t)in->q, a.k = (const void *)(uintptr_t)in->k;
    a.v = (const void *)(uintptr_t)in->v, a.out = (void *)(uintptr_t)in->out;
    a.lse = (float *)(uintptr_t)in->lse;
    a.q_offset = sh.kv_len - sh.q_len;
    return a;
}

/* Step a made paged: the host side in p, its device copies in dev (kv_lens,
 * q_offsets, block table), which a then reads. */
static fg_status page_step(fg_ctx *ctx, int page, bench_paged_step *p, CUdeviceptr dev[3], fg_attention_args *a) {
    FGI_TRY(bench_paged_step_make(ctx, a, page, p));
    bench_paged_step_apply(p, a);
    const size_t B = (size_t)a->batch;
    FGI_TRY(bench_upload_ints(ctx, p->kv_lens, B, &dev[0]));
    FGI_TRY(bench_upload_ints(ctx, p->q_offsets, B, &dev[1]));
    FGI_TRY(bench_upload_ints(ctx, p->pg.table, B * (size_t)p->pg.max_pages, &dev[2]));
    a->kv_lens = (const int32_t *)(uintptr_t)dev[0];
    a->q_offsets = (const int32_t *)(uintptr_t)dev[1];
    a->block_table = (const int32_t *)(uintptr_t)dev[2];
    return FG_OK;
}

/* The timed part: the kernel for the call fetched once, one untimed launch,
 * then the GPU's and the host's times. */
static fg_status time_step(fg_ctx *ctx, const bench_opts *o, const fg_mod *mod, bench_kernel_arg *ka,
                           CUdeviceptr flush, bench_decode_result *r) {
    FGI_TRY(fg_attention_kernel_for(ctx, mod, &ka->args, &ka->kernel));
    r->kernel = fg_cli_kernel_name(fg_kernel_kind_of(ka->kernel));
    /* the workspace a serving loop allocates once (fg_attention_args) */
    size_t ws_bytes = 0;
    CUdeviceptr ws = 0;
    FGI_TRY(fg_attention_workspace_size(ctx, mod, &ka->args, &ws_bytes));
    if (ws_bytes) FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&ws, ws_bytes), "cuMemAlloc");
    ka->args.workspace = (void *)(uintptr_t)ws, ka->args.workspace_size = ws_bytes;
    fg_status st = bench_launch_kernel(ctx, ka);
    if (st == FG_OK) st = bench_sync(ctx);
    if (st == FG_OK) st = bench_time_median(ctx, bench_launch_kernel, ka, o->warmup, o->iters, flush, &r->gpu_ms);
    if (st == FG_OK)
        st = bench_host_us(ctx, bench_launch_kernel, ka, o->iters, HOST_BURST, &r->host_us, &r->host_first_us);
    if (st == FG_OK) st = bench_sync(ctx);
    if (ws) fgi_cu()->cuMemFree(ws);
    ka->args.workspace = NULL, ka->args.workspace_size = 0;
    if (st == FG_OK) r->tbps = r->bytes / (r->gpu_ms * 1e-3) / 1e12;
    return st;
}

fg_status bench_run_decode(fg_ctx *ctx, const bench_opts *o, const bench_case *c, bench_decode_shape sh,
                           int page, const bench_decode_inputs *in, bench_decode_result *r) {
    fg_mod *mod = NULL;
    fg_block_mask *bm = NULL;
    bench_params s = {0};
    bench_dev_params d = {0};
    bench_paged_step ps = {0};
    CUdeviceptr arrays[3] = {0};
    bench_kernel_arg ka = {.kernel = NULL, .args = step_args(o, sh, in)};
    snprintf(r->name, sizeof r->name, "%s", c->name);
    r->shape = sh, r->page = page;
    fg_status st = bench_load_case_mod(ctx, c, &mod);
    if (st == FG_OK) snprintf(r->mod_name, sizeof r->mod_name, "%s", fg_mod_name(mod));
    /* positions are those of the KV length: the gallery's values for it */
    if (st == FG_OK) st = bench_case_params(ctx, o, c, mod, sh.batch, o->heads, sh.kv_len, &s);
    if (st == FG_OK) st = bench_dev_params_upload(ctx, &s, &d);
    if (st == FG_OK && fg_mod_has_mask(mod))
        st = bench_block_mask_create(ctx, mod, sh.batch, o->heads, sh.q_len, sh.kv_len, ka.args.q_offset, &d, &bm);
    if (st == FG_OK) st = visible_keys(ctx, mod, &s, sh, ka.args.q_offset, &r->keys);
    r->bytes = 2.0 * sh.batch * o->kv_heads * o->head_dim * 2.0 * (double)r->keys;
    ka.args.block_mask = bm, ka.args.binds = d.binds, ka.args.nbinds = d.n;
    if (st == FG_OK && page > 0) st = page_step(ctx, page, &ps, arrays, &ka.args);
    if (st == FG_OK) st = time_step(ctx, o, mod, &ka, in->flush, r);
    if (st == FG_OK) st = bench_sync(ctx); /* before the arrays go */
    fg_kernel_release(ka.kernel);
    for (int i = 0; i < 3; i++)
        if (arrays[i]) fgi_cu()->cuMemFree(arrays[i]);
    bench_paged_step_free(&ps);
    fg_block_mask_destroy(bm);
    bench_dev_params_free(&d);
    bench_params_free(&s);
    if (st == FG_OK && o->check) st = bench_check_decode(ctx, o, c, mod, sh, page, &r->acc);
    if (st != FG_OK) { /* report now: the cleanup below may clear the error */
        snprintf(r->failure, sizeof r->failure, "%s: %s", fg_status_string(st), fg_errmsg(ctx));
        fg_cli_fail(ctx, st, r->name);
    }
    fg_mod_destroy(mod);
    return st;
}
