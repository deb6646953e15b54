/* gpu_cp.c -- fg_attention_forward_cp and fg_attention_backward_cp on two
 * ranks against the CPU references of the whole sequence: two GPUs of one
 * machine with NCCL, or both ranks on GPU 0 with the loopback communicator
 * (loopback_nccl.c, as $FLEXGEN_NCCL_LIB), which NCCL itself refuses.
 *
 * One communicator per rank from ncclCommInitAll, one thread per rank (NCCL
 * needs the ranks' calls in flight together), each with its own fg_ctx,
 * stream and shard (on one GPU both share the device's primary context);
 * everything else (inputs, uploads, the reference) runs on the main
 * thread. For every gallery mod, both layouts, lengths that cut
 * evenly and lengths that do not, the ranks' out and lse rows, put back at
 * their global positions, must meet the forward's tolerances
 * (check_out: 1e-2 relative in bf16, 2e-3 in fp16; LSE 1e-3; -inf and 0
 * exactly where every key is masked). Then every rank runs the backward
 * on its rows of one random dout (and, in some cases, dlse), and dq, dk,
 * dv put back at their global positions must meet the backward's
 * tolerances (relative Frobenius error 2e-2 in bf16, 5e-3 in fp16, no
 * non-finite value), as must the gradient of a float buffer (ALiBi's
 * slopes): every rank's with grads_summed, else the sum of the ranks'
 * shares. Half of the cases make one fg_cp_plan per rank for
 * both calls, every other case runs on one compute stream
 * (FG_OPT_CP_STREAMS 1) instead of two, and every third merges its
 * partials in groups of two (FLEXGEN_TEST_CP_MERGE_PARTS). Outputs and gradients are poisoned first.
 *
 * The library is told from NCCL by its symbol flexgen_loopback_nccl: then
 * both ranks use device 0 and one GPU suffices. Skips (77) without NCCL
 * ($FLEXGEN_NCCL_LIB, else libnccl.so.2), or with NCCL and fewer than two
 * GPUs. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless the
 * environment says otherwise). */
#include "gpu_cases.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORLD 2

static int failures = 0;
/* Each rank's device: {0, 1}, or {0, 0} through the loopback. */
static int rank_device[WORLD];

typedef struct cp_case {
    const char *mod;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, s;
    fg_cp_layout layout;
    bool dlse; /* the backward also gets d loss / d lse */
    bool plan; /* forward and backward share one fg_cp_plan */
} cp_case;

static const cp_case cases[] = {
    {"causal", 64, FG_BF16, 1, 4, 2, 1000, FG_CP_ZIGZAG, true, true},
    {"causal", 64, FG_BF16, 1, 4, 2, 1000, FG_CP_CONTIGUOUS, false, false},
    {"noop", 128, FG_FP16, 2, 2, 2, 1536, FG_CP_CONTIGUOUS, false, true},
    {"sliding_window", 64, FG_BF16, 1, 4, 4, 2048, FG_CP_CONTIGUOUS, false, true},
    {"sliding_window", 64, FG_BF16, 1, 4, 4, 2048, FG_CP_ZIGZAG, true, false},
    {"document", 128, FG_BF16, 1, 2, 1, 1300, FG_CP_ZIGZAG, false, true},
    {"alibi", 64, FG_FP16, 1, 4, 4, 900, FG_CP_ZIGZAG, true, true},
    {"alibi", 128, FG_BF16, 1, 4, 2, 1000, FG_CP_ZIGZAG, false, false},
    {"softcap", 64, FG_BF16, 1, 2, 2, 777, FG_CP_CONTIGUOUS, true, true},
    {"flamingo", 64, FG_BF16, 1, 2, 2, 1100, FG_CP_CONTIGUOUS, false, false},
    {"jagged", 128, FG_FP16, 1, 2, 1, 1500, FG_CP_ZIGZAG, true, true},
    {"natten", 64, FG_BF16, 1, 2, 2, 1024, FG_CP_CONTIGUOUS, false, true},
    {"sasa", 64, FG_BF16, 1, 2, 2, 1024, FG_CP_ZIGZAG, false, false},
    {"dilated", 128, FG_BF16, 1, 2, 2, 1400, FG_CP_ZIGZAG, true, false},
    {"local_global", 64, FG_FP16, 1, 4, 2, 1300, FG_CP_CONTIGUOUS, false, true},
    {"prefix_lm", 64, FG_FP16, 1, 2, 2, 900, FG_CP_ZIGZAG, true, false},
};

/* ---- NCCL, for the communicators (the library itself takes them as given) */

typedef int (*comm_init_all_fn)(void **comms, int ndev, const int *devlist);
typedef int (*comm_destroy_fn)(void *comm);

static void *open_nccl(comm_init_all_fn *init, comm_destroy_fn *destroy) {
    const char *path = getenv("FLEXGEN_NCCL_LIB");
    void *lib = dlopen(path && *path ? path : "libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return NULL;
    *init = (comm_init_all_fn)dlsym(lib, "ncclCommInitAll");
    *destroy = (comm_destroy_fn)dlsym(lib, "ncclCommDestroy");
    if (!*init || !*destroy) {
        dlclose(lib);
        return NULL;
    }
    return lib;
}

/* ---- one rank --------------------------------------------------------------- */

typedef struct rank_job {
    fg_ctx *ctx;
    fg_mod *mod;
    fg_attention_args a;
    fg_cp_args cp;
    fg_attention_bwd_args b;
    fg_cp_bwd_args cpb;
    fg_cp_plan *plan;
    bool backward; /* which call rank_main makes */
    CUstream stream;
    fg_status st;
    char err[512];
    int64_t start[2], len[2];
    int nchunks;
    CUdeviceptr q, k, v, out, lse, dout, dlse, dq, dk, dv;
    fg_binding gbind[1]; /* a float buffer's gradient (ALiBi's slopes) */
    CUdeviceptr gdev;
    int ngrad;
    bool cpb_summed;     /* grads_summed: every rank the whole gradient */
    binds bb;
} rank_job;

static void *rank_main(void *p) {
    rank_job *j = p;
    if (fgi_cuda_ready(j->ctx) != FG_OK) { /* this thread's current context */
        j->st = FG_ERR_NO_DEVICE;
        snprintf(j->err, sizeof j->err, "fgi_cuda_ready: %s", fg_errmsg(j->ctx));
        return NULL;
    }
    j->st = j->backward ? fg_attention_backward_cp(j->ctx, j->mod, &j->cpb)
                        : fg_attention_forward_cp(j->ctx, j->mod, &j->cp);
    if (j->st != FG_OK) {
        snprintf(j->err, sizeof j->err, "%s: %s", fg_status_string(j->st), fg_errmsg(j->ctx));
        return NULL;
    }
    if (fgi_cu()->cuStreamSynchronize(j->stream) != CUDA_SUCCESS) {
        j->st = FG_ERR_CUDA;
        snprintf(j->err, sizeof j->err, "cuStreamSynchronize failed");
    }
    return NULL;
}

/* Rows of a [B, H, S, D] host tensor of `el`-byte elements gathered into
 * [B, H, rows, D] for the chunks (start, len), back to back (D = 1 for an
 * lse), or, with `back`, a local tensor's rows put at their global
 * positions. */
static void move_rows(bool back, void *global, void *local, size_t el, int B, int H, int S, int D,
                      const int64_t *start, const int64_t *len, int n) {
    int64_t rows = 0;
    for (int c = 0; c < n; c++) rows += len[c];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int64_t r = 0;
            for (int c = 0; c < n; c++)
                for (int64_t i = 0; i < len[c]; i++, r++) {
                    char *l = (char *)local + (((size_t)b * H + h) * rows + r) * D * el;
                    char *g = (char *)global + (((size_t)b * H + h) * S + start[c] + i) * D * el;
                    if (back) memcpy(g, l, (size_t)D * el);
                    else memcpy(l, g, (size_t)D * el);
                }
        }
}

/* A rank's rows of a global host tensor, uploaded. */
static CUdeviceptr upload_rows(const void *global, size_t el, int B, int H, int S, int D, const rank_job *j) {
    const size_t rows = (size_t)(j->len[0] + j->len[1]), bytes = (size_t)B * H * rows * D * el;
    void *l = malloc(bytes + 4);
    move_rows(false, (void *)global, l, el, B, H, S, D, j->start, j->len, j->nchunks);
    CUdeviceptr d = upload(l, bytes);
    free(l);
    return d;
}

/* A rank's device rows downloaded into their global positions. */
static void download_rows(void *global, CUdeviceptr dev, size_t el, int B, int H, int S, int D, const rank_job *j) {
    const size_t rows = (size_t)(j->len[0] + j->len[1]), bytes = (size_t)B * H * rows * D * el;
    void *l = malloc(bytes + 4);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(l, dev, bytes), CUDA_SUCCESS);
    move_rows(true, global, l, el, B, H, S, D, j->start, j->len, j->nchunks);
    free(l);
}

static CUdeviceptr poisoned(size_t bytes) {
    CUdeviceptr d;
    assert_int_equal(fgi_cu()->cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemsetD8(d, 0xff, bytes), CUDA_SUCCESS);
    return d;
}

/* Every rank's call in its own thread (NCCL needs them in flight together);
 * false, with the failures printed, when one failed. */
static bool run_ranks(rank_job jobs[WORLD], const char *name, const char *what) {
    pthread_t t[WORLD];
    for (int r = 0; r < WORLD; r++) assert_int_equal(pthread_create(&t[r], NULL, rank_main, &jobs[r]), 0);
    for (int r = 0; r < WORLD; r++) pthread_join(t[r], NULL);
    bool ok = true;
    for (int r = 0; r < WORLD; r++)
        if (jobs[r].st != FG_OK) {
            printf("FAIL %s: %s: rank %d: %s\n", name, what, r, jobs[r].err);
            ok = false;
        }
    return ok;
}

/* The backward of the case on every rank, from the forward's out and lse,
 * against the reference backward of the whole sequence. */
static void check_backward(rank_job jobs[WORLD], const cp_case *c, const char *name, const uint16_t *hq,
                           const uint16_t *hk, const uint16_t *hv) {
    const int B = c->b, D = c->d, S = c->s;
    const size_t nq = (size_t)B * c->hq * S * D, nkv = (size_t)B * c->hkv * S * D, nlse = (size_t)B * c->hq * S;
    uint16_t *hdo = random16(c->dtype, nq, true);
    float *hdlse = NULL;
    if (c->dlse) {
        hdlse = malloc(nlse * 4);
        uint16_t *r = random16(FG_BF16, nlse, true);
        for (size_t i = 0; i < nlse; i++) hdlse[i] = (float)from16(FG_BF16, r[i]);
        free(r);
    }
    for (int r = 0; r < WORLD; r++) {
        rank_job *j = &jobs[r];
        assert_int_equal(fgi_cuda_ready(j->ctx), FG_OK);
        const size_t rows = (size_t)(j->len[0] + j->len[1]);
        j->dout = upload_rows(hdo, 2, B, c->hq, S, D, j);
        j->dlse = hdlse ? upload_rows(hdlse, 4, B, c->hq, S, 1, j) : 0;
        j->dq = poisoned((size_t)B * c->hq * rows * D * 2);
        j->dk = poisoned((size_t)B * c->hkv * rows * D * 2);
        j->dv = poisoned((size_t)B * c->hkv * rows * D * 2);
        assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
        j->b = fg_attention_bwd_args_init();
        j->b.fwd = &j->a, j->b.dout = (const void *)(uintptr_t)j->dout;
        j->b.dq = (void *)(uintptr_t)j->dq, j->b.dk = (void *)(uintptr_t)j->dk, j->b.dv = (void *)(uintptr_t)j->dv;
        j->b.dlse = (const float *)(uintptr_t)j->dlse;
        /* every float buffer gets its gradient: each rank the whole one */
        for (int i = 0; i < j->bb.n && !j->ngrad; i++) {
            const fg_binding *hb = &j->bb.host[i];
            if (hb->kind != FG_PARAM_BUFFER || hb->type != FG_TYPE_FLOAT) continue;
            const int64_t len = hb->value.buffer.length;
            j->gdev = poisoned(4 * (size_t)len);
            j->gbind[0] = fg_bind_float_buffer(hb->name, (const float *)(uintptr_t)j->gdev, len);
            j->ngrad = 1;
        }
        j->b.grad_binds = j->gbind, j->b.ngrad_binds = (size_t)j->ngrad;
        j->cpb_summed = (c - cases) % 2 == 0; /* else each rank its own share */
        j->cpb = fg_cp_bwd_args_init();
        j->cpb.local = &j->b, j->cpb.comm = j->cp.comm, j->cpb.global_len = S, j->cpb.layout = c->layout;
        j->cpb.plan = j->plan;
        j->cpb.grads_summed = j->cpb_summed;
        j->backward = true;
    }
    bool ok = run_ranks(jobs, name, "backward");
    if (ok) {
        uint16_t *gq = malloc(nq * 2), *gk = malloc(nkv * 2), *gv = malloc(nkv * 2);
        for (int r = 0; r < WORLD; r++) {
            const rank_job *j = &jobs[r];
            assert_int_equal(fgi_cuda_ready(jobs[r].ctx), FG_OK);
            download_rows(gq, j->dq, 2, B, c->hq, S, D, j);
            download_rows(gk, j->dk, 2, B, c->hkv, S, D, j);
            download_rows(gv, j->dv, 2, B, c->hkv, S, D, j);
        }
        double *rq = malloc(nq * sizeof(double)), *rk = malloc(nkv * sizeof(double)), *rv = malloc(nkv * sizeof(double));
        fg_attention_args h = fg_attention_args_init();
        h.batch = B, h.heads_q = c->hq, h.heads_kv = c->hkv, h.q_len = h.kv_len = S, h.head_dim = D;
        h.dtype = c->dtype, h.q = hq, h.k = hk, h.v = hv;
        h.binds = jobs[0].bb.host, h.nbinds = (size_t)jobs[0].bb.n;
        float *unread_lse = calloc(nlse, 4);
        h.out = hdo, h.lse = unread_lse; /* present, as the checks ask; the reference recomputes both */
        fg_attention_bwd_args hb = fg_attention_bwd_args_init();
        hb.fwd = &h, hb.dout = hdo, hb.dlse = hdlse, hb.dq = rq, hb.dk = rk, hb.dv = rv;
        const int64_t glen = jobs[0].ngrad ? jobs[0].gbind[0].value.buffer.length : 0;
        double *rg = glen ? malloc(sizeof(double) * (size_t)glen) : NULL;
        fg_binding gref[1];
        if (glen) {
            gref[0] = fg_bind_float_buffer(jobs[0].gbind[0].name, (const float *)rg, glen);
            hb.grad_binds = gref, hb.ngrad_binds = 1;
        }
        const fg_status rst = fg_attention_reference_backward(jobs[0].ctx, jobs[0].mod, &hb);
        if (rst != FG_OK) printf("FAIL %s backward reference: %s\n", name, fg_errmsg(jobs[0].ctx));
        assert_int_equal(rst, FG_OK);
        free(unread_lse);
        long nonfinite = 0;
        /* the buffer's gradient: with grads_summed the whole on every rank,
         * else each rank's share, which add up to the whole */
        double eg = 0;
        if (glen) {
            double *total = calloc((size_t)glen, sizeof *total);
            float *got = malloc(4 * (size_t)glen);
            for (int r = 0; r < WORLD; r++) {
                assert_int_equal(fgi_cuda_ready(jobs[r].ctx), FG_OK);
                assert_int_equal(fgi_cu()->cuMemcpyDtoH(got, jobs[r].gdev, 4 * (size_t)glen), CUDA_SUCCESS);
                for (int64_t i = 0; i < glen; i++) {
                    if (!isfinite(got[i])) nonfinite++;
                    total[i] = jobs[0].cpb_summed ? got[i] : total[i] + got[i];
                }
                if (!jobs[0].cpb_summed && r + 1 < WORLD) continue;
                double num = 0, den = 0;
                for (int64_t i = 0; i < glen; i++) {
                    num += (total[i] - rg[i]) * (total[i] - rg[i]);
                    den += rg[i] * rg[i];
                }
                const double e = den > 0 ? sqrt(num / den) : sqrt(num);
                eg = e > eg ? e : eg;
            }
            free(total), free(got);
        }
        free(rg);
        const double eq = rel_err_dense16(c->dtype, gq, rq, nq, &nonfinite),
                     ek = rel_err_dense16(c->dtype, gk, rk, nkv, &nonfinite),
                     ev = rel_err_dense16(c->dtype, gv, rv, nkv, &nonfinite);
        const double tol = c->dtype == FG_BF16 ? 2e-2 : 5e-3;
        ok = eq <= tol && ek <= tol && ev <= tol && eg <= tol && nonfinite == 0;
        printf("%-4s %s backward%s: dq %.2e dk %.2e dv %.2e", ok ? "ok" : "FAIL", name, c->dlse ? " (+dlse)" : "",
               eq, ek, ev);
        if (glen) printf(" d%s %.2e (%s)", jobs[0].gbind[0].name, eg, jobs[0].cpb_summed ? "summed" : "shares");
        if (nonfinite) printf(", %ld non-finite", nonfinite);
        printf("\n");
        free(gq), free(gk), free(gv), free(rq), free(rk), free(rv);
    }
    failures += !ok;
    free(hdo), free(hdlse);
}

static void run_case(void *comms[WORLD], const cp_case *c) {
    char name[200];
    /* every other case on one compute stream (FG_OPT_CP_STREAMS); every
     * third merges its partials two at a time (the grouped merge that more
     * ranks than a merge's 16 parts need, through its test hook) */
    const int streams = (c - cases) % 2 ? 1 : 2;
    const bool grouped = (c - cases) % 3 == 0;
    if (grouped) setenv("FLEXGEN_TEST_CP_MERGE_PARTS", "2", 1);
    else unsetenv("FLEXGEN_TEST_CP_MERGE_PARTS");
    snprintf(name, sizeof name, "%s D=%d %s B=%d Hq=%d Hkv=%d S=%d %s%s, %d stream%s%s", c->mod, c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->s,
             c->layout == FG_CP_ZIGZAG ? "zig-zag" : "contiguous", c->plan ? " (plan)" : "", streams,
             streams > 1 ? "s" : "", grouped ? ", merged by twos" : "");
    const int B = c->b, D = c->d, S = c->s;
    const size_t nq = (size_t)B * c->hq * S * D, nkv = (size_t)B * c->hkv * S * D, nlse = (size_t)B * c->hq * S;
    uint16_t *hq = random16(c->dtype, nq, true), *hk = random16(c->dtype, nkv, true),
             *hv = random16(c->dtype, nkv, true);
    acase ac = {.mod = c->mod, .d = D, .dtype = c->dtype, .b = B, .hq = c->hq, .hkv = c->hkv, .q = S, .kv = S};

    rank_job jobs[WORLD];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < WORLD; r++) {
        rank_job *j = &jobs[r];
        assert_int_equal(fg_ctx_create(&j->ctx), FG_OK);
        assert_int_equal(fg_ctx_set_int(j->ctx, FG_OPT_DEVICE, rank_device[r]), FG_OK);
        assert_int_equal(fg_ctx_set_int(j->ctx, FG_OPT_CP_STREAMS, streams), FG_OK);
        assert_int_equal(fgi_cuda_ready(j->ctx), FG_OK); /* the rank's device's context current here */
        j->mod = tu_gallery_mod(j->ctx, c->mod);
        const uint64_t keep = rng;
        gallery_binds(c->mod, &ac, &j->bb); /* the same values on every rank */
        if (r + 1 < WORLD) rng = keep;
        assert_int_equal(fg_cp_shard_rows(c->layout, WORLD, r, S, j->start, j->len, &j->nchunks), FG_OK);
        const int rows = (int)(j->len[0] + j->len[1]);
        j->q = upload_rows(hq, 2, B, c->hq, S, D, j);
        j->k = upload_rows(hk, 2, B, c->hkv, S, D, j);
        j->v = upload_rows(hv, 2, B, c->hkv, S, D, j);
        j->out = poisoned((size_t)B * c->hq * rows * D * 2);
        j->lse = poisoned((size_t)B * c->hq * rows * 4);
        assert_int_equal(fgi_cu()->cuStreamCreate(&j->stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
        fg_attention_args *a = &j->a;
        *a = fg_attention_args_init();
        a->batch = B, a->heads_q = c->hq, a->heads_kv = c->hkv, a->q_len = a->kv_len = rows;
        a->head_dim = D, a->dtype = c->dtype;
        a->q = (const void *)(uintptr_t)j->q, a->k = (const void *)(uintptr_t)j->k;
        a->v = (const void *)(uintptr_t)j->v, a->out = (void *)(uintptr_t)j->out;
        a->lse = (float *)(uintptr_t)j->lse, a->binds = j->bb.dev, a->nbinds = (size_t)j->bb.n;
        a->stream = j->stream;
        j->cp = fg_cp_args_init();
        j->cp.local = a, j->cp.comm = comms[r], j->cp.global_len = S, j->cp.layout = c->layout;
        if (c->plan) {
            /* no communication: each rank makes its own */
            const fg_status st = fg_cp_plan_create(j->ctx, j->mod, &j->cp, &j->plan);
            if (st != FG_OK) fail_msg("%s: fg_cp_plan_create: %s", c->mod, fg_errmsg(j->ctx));
            j->cp.plan = j->plan;
        }
    }
    /* The ranks' rows back at their global positions. */
    uint16_t *gout = malloc(nq * 2);
    float *glse = malloc(nlse * 4);
    const bool ran = run_ranks(jobs, name, "forward");
    for (int r = 0; ran && r < WORLD; r++) {
        assert_int_equal(fgi_cuda_ready(jobs[r].ctx), FG_OK);
        download_rows(gout, jobs[r].out, 2, B, c->hq, S, D, &jobs[r]);
        download_rows(glse, jobs[r].lse, 4, B, c->hq, S, 1, &jobs[r]);
    }
    if (ran) {
        double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nlse);
        fg_attention_args h = fg_attention_args_init();
        h.batch = B, h.heads_q = c->hq, h.heads_kv = c->hkv, h.q_len = h.kv_len = S, h.head_dim = D;
        h.dtype = c->dtype, h.q = hq, h.k = hk, h.v = hv, h.out = gout;
        h.binds = jobs[0].bb.host, h.nbinds = (size_t)jobs[0].bb.n;
        assert_int_equal(fg_attention_reference(jobs[0].ctx, jobs[0].mod, &h, rout, rlse), FG_OK);
        const out_check oc = check_out(c->dtype, gout, glse, rout, rlse, nlse, D);
        printf("%-4s %s: rel %.2e lse %.2e\n", oc.ok ? "ok" : "FAIL", name, oc.rel, oc.lse_err);
        if (!oc.ok)
            printf("     nonfinite %ld, nonzero masked %ld, lse -inf mismatch %ld\n", oc.nonfinite, oc.bad_masked,
                   oc.lse_inf_mismatch);
        failures += !oc.ok;
        free(rout), free(rlse);
        if (oc.ok) check_backward(jobs, c, name, hq, hk, hv);
    } else {
        failures++;
    }
    fflush(stdout);
    for (int r = 0; r < WORLD; r++) {
        rank_job *j = &jobs[r];
        fgi_cuda_ready(j->ctx);
        fgi_cu()->cuStreamDestroy(j->stream);
        CUdeviceptr all[] = {j->q, j->k, j->v, j->out, j->lse, j->dout, j->dlse, j->dq, j->dk, j->dv, j->gdev};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]) fgi_cu()->cuMemFree(all[i]);
        fgi_cu()->cuCtxSynchronize();
        fg_cp_plan_destroy(j->plan);
        binds_free(&j->bb);
        fg_mod_destroy(j->mod);
        fg_ctx_destroy(j->ctx);
    }
    free(hq), free(hk), free(hv), free(gout), free(glse);
}

static void test_two_ranks(void **state) {
    void **comms = *state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(comms, &cases[i]);
    assert_int_equal(failures, 0);
}

int main(void) {
    tu_require_gpu();
    setvbuf(stdout, NULL, _IOLBF, 0);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    fg_ctx *ctx;
    int count = 0;
    if (fg_ctx_create(&ctx) != FG_OK || fgi_cuda_ready(ctx) != FG_OK ||
        fgi_cu()->cuDeviceGetCount(&count) != CUDA_SUCCESS) {
        printf("skipping: no CUDA device\n");
        return TU_MAIN_SKIP;
    }
    fg_ctx_destroy(ctx);
    comm_init_all_fn init;
    comm_destroy_fn destroy;
    void *lib = open_nccl(&init, &destroy);
    if (!lib) {
        printf("skipping: no NCCL (set FLEXGEN_NCCL_LIB to libnccl.so.2, or to the loopback "
               "libloopback_nccl.so for one GPU): %s\n", dlerror());
        return TU_MAIN_SKIP;
    }
    const bool loopback = dlsym(lib, "flexgen_loopback_nccl") != NULL;
    if (!loopback && count < WORLD) {
        printf("skipping: %d CUDA device(s), the test needs %d with NCCL (or the loopback communicator, "
               "libloopback_nccl.so, as FLEXGEN_NCCL_LIB, for one)\n", count, WORLD);
        dlclose(lib);
        return TU_MAIN_SKIP;
    }
    for (int r = 0; r < WORLD; r++) rank_device[r] = loopback ? 0 : r;
    if (loopback) printf("ranks 0 and 1 share GPU 0 through the loopback communicator\n");
    void *comms[WORLD] = {0};
    if (init(comms, WORLD, rank_device) != 0) {
        printf("FAIL: ncclCommInitAll\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test_prestate(test_two_ranks, comms)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int r = 0; r < WORLD; r++) destroy(comms[r]);
    return rc;
}
