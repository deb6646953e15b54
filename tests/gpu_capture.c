/* gpu_capture.c -- the calls a serving or training step makes, captured into
 * a CUDA graph with the driver's stream capture and replayed with new
 * device-side inputs, every replay checked against the CPU reference.
 *
 * What README.md ("CUDA graphs") promises, tested here:
 *   - a decode step (paged K/V, ragged lengths, per-sequence query
 *     positions, a block table, the split walk and its merge): captured once
 *     with the caller's workspace, then each replay sees new queries, a new
 *     cache, new lengths, new positions and a reshuffled table, written to
 *     the same device arrays before it;
 *   - the same step without a workspace of the caller's: the library's
 *     stream-ordered allocation becomes the graph's own allocation node;
 *   - a forward with its block mask rebuilt in place (document masking):
 *     fg_block_mask_rebuild_gpu and fg_attention_forward captured together,
 *     each replay with new document ids in the same device buffer, checked
 *     against a reference that evaluates the mask everywhere (a stale block
 *     mask would show);
 *   - a training step: forward (with lse) and backward with the caller's
 *     workspace, each replay with new q, k, v and dout.
 * The captured graphs are inspected: with the caller's workspace they hold
 * kernels (and the backward's memsets) only -- no allocation, no copy.
 * Outputs are poisoned (all-ones bits: NaN) on the stream before every
 * replay. FLEXGEN_TEST_QUICK=1 replays 10 times instead of 100. */
#include "gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cudrv.h"
#include "internal.h"

static int failures = 0;

static int replays(void) {
    const char *q = getenv("FLEXGEN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0 ? 10 : 100;
}

static void fill16(fg_dtype dt, uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = to16(dt, (float)normal());
}

static CUdeviceptr alloc_dev(size_t bytes) {
    CUdeviceptr p = 0;
    assert_int_equal(fgi_cu()->cuMemAlloc(&p, bytes), CUDA_SUCCESS);
    return p;
}

static void put(CUdeviceptr dst, const void *src, size_t bytes) {
    assert_int_equal(fgi_cu()->cuMemcpyHtoD(dst, src, bytes), CUDA_SUCCESS);
}

static void get(void *dst, CUdeviceptr src, size_t bytes) {
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(dst, src, bytes), CUDA_SUCCESS);
}

/* ---- capture ------------------------------------------------------------------- */

/* What a captured graph holds, by node type. */
typedef struct graph_nodes {
    int kernel, memset, memcpy, alloc, free, other;
} graph_nodes;

static CUstream new_stream(void) {
    const fgi_cu_api *cu = fgi_cu();
    assert_non_null(cu->cuStreamBeginCapture);
    assert_non_null(cu->cuGraphInstantiateWithFlags);
    CUstream s;
    /* A blocking stream: it waits for the synchronous uploads the test
     * makes on the legacy stream between replays. */
    assert_int_equal(cu->cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    return s;
}

static void begin(CUstream s) {
    /* Global mode: any call in the process that is unsafe during a capture
     * (a synchronous allocation, copy or synchronisation) fails it. */
    assert_int_equal(fgi_cu()->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
}

/* End the capture on `s` (also after a failed call, so the stream is not
 * left capturing), count the graph's nodes and instantiate it. */
static CUgraphExec end(CUstream s, fg_status call, fg_ctx *ctx, const char *name, graph_nodes *n) {
    const fgi_cu_api *cu = fgi_cu();
    CUgraph g = NULL;
    CUresult r = cu->cuStreamEndCapture(s, &g);
    if (call != FG_OK) print_error("%s: captured call: %s: %s\n", name, fg_status_string(call), fg_errmsg(ctx));
    assert_int_equal(call, FG_OK);
    assert_int_equal(r, CUDA_SUCCESS);
    size_t count = 0;
    assert_int_equal(cu->cuGraphGetNodes(g, NULL, &count), CUDA_SUCCESS);
    CUgraphNode *nodes = calloc(count ? count : 1, sizeof *nodes);
    assert_int_equal(cu->cuGraphGetNodes(g, nodes, &count), CUDA_SUCCESS);
    memset(n, 0, sizeof *n);
    for (size_t i = 0; i < count; i++) {
        CUgraphNodeType t;
        assert_int_equal(cu->cuGraphNodeGetType(nodes[i], &t), CUDA_SUCCESS);
        switch (t) {
        case CU_GRAPH_NODE_TYPE_KERNEL: n->kernel++; break;
        case CU_GRAPH_NODE_TYPE_MEMSET: n->memset++; break;
        case CU_GRAPH_NODE_TYPE_MEMCPY: n->memcpy++; break;
        case CU_GRAPH_NODE_TYPE_MEM_ALLOC: n->alloc++; break;
        case CU_GRAPH_NODE_TYPE_MEM_FREE: n->free++; break;
        default: n->other++; break;
        }
    }
    free(nodes);
    CUgraphExec exec = NULL;
    assert_int_equal(cu->cuGraphInstantiateWithFlags(&exec, g, 0), CUDA_SUCCESS);
    assert_int_equal(cu->cuGraphDestroy(g), CUDA_SUCCESS);
    printf("     %s: graph of %d kernels, %d memsets, %d copies, %d allocations, %d frees, %d other\n", name,
           n->kernel, n->memset, n->memcpy, n->alloc, n->free, n->other);
    return exec;
}

static void free_dev(const CUdeviceptr *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) fgi_cu()->cuMemFree(p[i]);
}

static void replay(CUgraphExec exec, CUstream s) {
    assert_int_equal(fgi_cu()->cuGraphLaunch(exec, s), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuStreamSynchronize(s), CUDA_SUCCESS);
}

static void poison(CUdeviceptr p, size_t bytes, CUstream s) {
    assert_int_equal(fgi_cu()->cuMemsetD8Async(p, 0xff, bytes, s), CUDA_SUCCESS);
}

/* Summary of one case's replays: the worst of each measure. */
typedef struct worst {
    double rel, lse;
    int bad;
} worst;

static void note(worst *w, const out_check *c, const char *name, int i) {
    if (c->rel > w->rel) w->rel = c->rel;
    if (c->lse_err > w->lse) w->lse = c->lse_err;
    if (!c->ok) {
        w->bad++;
        printf("     %s replay %d: rel %.2e lse %.2e nonfinite %ld nonzero masked %ld lse -inf mismatch %ld\n", name,
               i, c->rel, c->lse_err, c->nonfinite, c->bad_masked, c->lse_inf_mismatch);
    }
}

static void verdict(const char *name, const worst *w, bool graph_ok, int n) {
    const bool ok = w->bad == 0 && graph_ok;
    printf("%-4s %s: %d replays, worst rel %.2e lse %.2e, %d failed%s\n", ok ? "ok" : "FAIL", name, n, w->rel,
           w->lse, w->bad, graph_ok ? "" : ", graph not as expected");
    fflush(stdout);
    if (!ok) failures++;
}

static fg_ctx *gpu_ctx(void) {
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    return ctx;
}

/* The end of a test: its context gone, no case failed. */
static void done(fg_ctx *ctx) {
    fg_ctx_destroy(ctx);
    assert_int_equal(failures, 0);
}

/* ---- a decode step ------------------------------------------------------------- */

typedef struct dstep {
    const char *mod;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, q, kv, page; /* kv: the longest a sequence may be */
    bool own_workspace;          /* false: the library's pool, in the graph */
} dstep;

static const dstep dsteps[] = {
    {"sliding_window", 128, FG_BF16, 4, 8, 2, 1, 300, 16, true},
    {"alibi", 64, FG_FP16, 3, 8, 1, 4, 520, 64, true},
    {"softcap", 128, FG_BF16, 4, 4, 4, 2, 260, 32, false},
    {"causal", 256, FG_BF16, 2, 4, 1, 16, 700, 128, true},
};

/* New lengths (one sequence may be empty, one at the longest), positions
 * at the end of each sequence, and a shuffled table. */
static void draw_paging(const dstep *c, int num_pages, int max_pages, int32_t *lens, int32_t *qoff, int32_t *table) {
    for (int b = 0; b < c->b; b++) lens[b] = 1 + (int)(tu_rand_u64(&rng) % (uint64_t)c->kv);
    const int longest = (int)(tu_rand_u64(&rng) % (uint64_t)c->b), empty = (longest + 1) % c->b;
    lens[longest] = c->kv;
    if (c->b > 1 && tu_rand_u64(&rng) % 3 == 0) lens[empty] = 0;
    for (int b = 0; b < c->b; b++) qoff[b] = lens[b] - c->q > 0 ? lens[b] - c->q : 0;
    int *perm = malloc(sizeof *perm * (size_t)num_pages);
    for (int i = 0; i < num_pages; i++) perm[i] = i;
    for (int i = num_pages - 1; i > 0; i--) {
        int j = (int)(tu_rand_u64(&rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int next = 0;
    for (int b = 0; b < c->b; b++)
        for (int i = 0; i < max_pages; i++)
            table[b * max_pages + i] = i < (lens[b] + c->page - 1) / c->page ? perm[next++] : -1;
    free(perm);
}

static void decode_case(fg_ctx *ctx, const dstep *c) {
    char name[200];
    snprintf(name, sizeof name, "decode %s D=%d %s B=%d Hq=%d Hkv=%d Q=%d KV<=%d page=%d %s", c->mod, c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->q, c->kv, c->page,
             c->own_workspace ? "caller's workspace" : "pool workspace");
    fg_mod *mod = tu_gallery_mod(ctx, c->mod);
    acase ac = {.mod = c->mod, .d = c->d, .dtype = c->dtype, .b = c->b, .hq = c->hq, .hkv = c->hkv,
                .q = c->q, .kv = c->kv, .q_offset = c->kv};
    binds bb;
    gallery_binds(c->mod, &ac, &bb);
    const int B = c->b, D = c->d, max_pages = (c->kv + c->page - 1) / c->page, num_pages = B * max_pages + 3;
    const size_t nq = (size_t)B * c->hq * c->q * D, nlse = (size_t)B * c->hq * c->q;
    const size_t nkv = (size_t)num_pages * c->page * c->hkv * D, ntab = (size_t)B * max_pages;
    uint16_t *hq = random16(c->dtype, nq, true), *hk = random16(c->dtype, nkv, true),
             *hv = random16(c->dtype, nkv, false), *gout = malloc(nq * 2);
    int32_t *lens = malloc(sizeof *lens * (size_t)B), *qoff = malloc(sizeof *qoff * (size_t)B),
            *table = malloc(sizeof *table * ntab);
    float *glse = malloc(nlse * 4);
    double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nlse);
    CUdeviceptr dq = alloc_dev(nq * 2), dk = alloc_dev(nkv * 2), dv = alloc_dev(nkv * 2), dout = alloc_dev(nq * 2),
                dlse = alloc_dev(nlse * 4), dlens = alloc_dev(4 * (size_t)B), dqoff = alloc_dev(4 * (size_t)B),
                dtable = alloc_dev(4 * ntab), dws = 0;

    fg_attention_args a = fg_attention_args_init();
    a.batch = B, a.heads_q = c->hq, a.heads_kv = c->hkv, a.q_len = c->q, a.kv_len = c->kv;
    a.head_dim = D, a.dtype = c->dtype;
    a.page_size = c->page, a.num_pages = num_pages, a.max_pages = max_pages;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.kv_lens = (const int32_t *)(uintptr_t)dlens, a.q_offsets = (const int32_t *)(uintptr_t)dqoff;
    a.block_table = (const int32_t *)(uintptr_t)dtable;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n;
    CUstream s = new_stream();
    a.stream = s;
    size_t ws = 0;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &ws), FG_OK);
    if (c->own_workspace && ws) {
        dws = alloc_dev(ws);
        a.workspace = (void *)(uintptr_t)dws, a.workspace_size = ws;
    }

    /* One ordinary call first: the kernel compiled and cached, the pool
     * made; nothing of that may happen inside the capture. */
    draw_paging(c, num_pages, max_pages, lens, qoff, table);
    put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2);
    put(dlens, lens, 4 * (size_t)B), put(dqoff, qoff, 4 * (size_t)B), put(dtable, table, 4 * ntab);
    fg_status st = fg_attention_forward(ctx, mod, &a);
    if (st != FG_OK) print_error("%s: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    assert_int_equal(fgi_cu()->cuStreamSynchronize(s), CUDA_SUCCESS);

    /* A split walk is the walk and the merge, or on a Hopper GPU with 2 to
     * 8 splits one launch of clusters that merge their own (the
     * workspace then unused, nothing taken from the pool). */
    fg_kernel *k = NULL;
    assert_int_equal(fg_attention_kernel_for(ctx, mod, &a, &k), FG_OK);
    bool clustered = false;
    assert_int_equal(fgi_attn_decode_clustered(ctx, &a, k, &clustered), FG_OK);
    fg_kernel_release(k);
    const bool merge = ws && !clustered;
    graph_nodes n;
    begin(s);
    st = fg_attention_forward(ctx, mod, &a);
    CUgraphExec exec = end(s, st, ctx, name, &n);
    const bool pooled = merge && !c->own_workspace;
    const bool graph_ok = n.kernel == (merge ? 2 : 1) && n.memcpy == 0 && n.memset == 0 && n.other == 0 &&
                          n.alloc == (pooled ? 1 : 0) && n.free == (pooled ? 1 : 0);
    if (clustered) printf("     %s: the walk's splits merge in their clusters\n", name);
    if (c->own_workspace && !ws) printf("     %s: no split at this shape: no workspace to give\n", name);

    worst w = {0};
    const int N = replays();
    fg_attention_args h = a;
    h.q = hq, h.k = hk, h.v = hv, h.binds = bb.host;
    h.kv_lens = lens, h.q_offsets = qoff, h.block_table = table;
    h.stream = NULL, h.workspace = NULL, h.workspace_size = 0;
    for (int i = 0; i < N; i++) {
        draw_paging(c, num_pages, max_pages, lens, qoff, table);
        fill16(c->dtype, hq, nq), fill16(c->dtype, hk, nkv), fill16(c->dtype, hv, nkv);
        put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2);
        put(dlens, lens, 4 * (size_t)B), put(dqoff, qoff, 4 * (size_t)B), put(dtable, table, 4 * ntab);
        poison(dout, nq * 2, s), poison(dlse, nlse * 4, s);
        replay(exec, s);
        get(gout, dout, nq * 2), get(glse, dlse, nlse * 4);
        st = fg_attention_reference(ctx, mod, &h, rout, rlse);
        if (st != FG_OK) print_error("%s: reference: %s\n", name, fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
        const out_check oc = check_out(c->dtype, gout, glse, rout, rlse, nlse, D);
        note(&w, &oc, name, i);
    }
    verdict(name, &w, graph_ok, N);

    assert_int_equal(fgi_cu()->cuGraphExecDestroy(exec), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuStreamDestroy(s), CUDA_SUCCESS);
    const CUdeviceptr all[] = {dq, dk, dv, dout, dlse, dlens, dqoff, dtable, dws};
    free_dev(all, sizeof all / sizeof all[0]);
    free(hq), free(hk), free(hv), free(gout), free(glse), free(rout), free(rlse), free(lens), free(qoff), free(table);
    binds_free(&bb);
    fg_mod_destroy(mod);
}

static void test_decode(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    for (size_t i = 0; i < sizeof dsteps / sizeof dsteps[0]; i++) decode_case(ctx, &dsteps[i]);
    done(ctx);
}

/* ---- a forward with its block mask rebuilt -------------------------------------- */

typedef struct fstep {
    int d;
    fg_dtype dtype;
    int b, hq, hkv, s;
} fstep;

static const fstep fsteps[] = {
    {128, FG_BF16, 2, 4, 2, 640},
    {64, FG_FP16, 1, 2, 2, 1000},
};

static void rebuild_case(fg_ctx *ctx, const fstep *c) {
    char name[160];
    snprintf(name, sizeof name, "forward + block mask rebuild, document D=%d %s B=%d Hq=%d Hkv=%d S=%d", c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->s);
    fg_mod *mod = tu_gallery_mod(ctx, "document");
    acase ac = {.mod = "document", .d = c->d, .dtype = c->dtype, .b = c->b, .hq = c->hq, .hkv = c->hkv,
                .q = c->s, .kv = c->s};
    binds bb;
    gallery_binds("document", &ac, &bb);
    assert_int_equal(bb.n, 1);
    int32_t *doc = bb.mem[0]; /* host ids; bb.dmem[0] the device buffer the calls read */
    const int D = c->d;
    const size_t nq = (size_t)c->b * c->hq * c->s * D, nkv = (size_t)c->b * c->hkv * c->s * D;
    const size_t nlse = (size_t)c->b * c->hq * c->s;
    uint16_t *hq = random16(c->dtype, nq, true), *hk = random16(c->dtype, nkv, true),
             *hv = random16(c->dtype, nkv, false), *gout = malloc(nq * 2);
    float *glse = malloc(nlse * 4);
    double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nlse);
    CUdeviceptr dq = alloc_dev(nq * 2), dk = alloc_dev(nkv * 2), dv = alloc_dev(nkv * 2), dout = alloc_dev(nq * 2),
                dlse = alloc_dev(nlse * 4);
    put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2);
    CUstream s = new_stream();

    /* The mask is made once (its device memory with it), on the GPU. */
    fg_block_mask_desc desc = fg_block_mask_desc_init();
    desc.batch = 1, desc.heads = 1, desc.q_len = c->s, desc.kv_len = c->s;
    fg_block_mask *bm = NULL;
    fg_status st = fg_block_mask_create_gpu(ctx, mod, &desc, bb.dev, (size_t)bb.n, s, &bm);
    if (st != FG_OK) print_error("%s: block mask: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    fg_attention_args a = fg_attention_args_init();
    a.batch = c->b, a.heads_q = c->hq, a.heads_kv = c->hkv, a.q_len = a.kv_len = c->s;
    a.head_dim = D, a.dtype = c->dtype, a.block_mask = bm;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n, a.stream = s;
    /* The caller's workspace (the Hopper forward's tile counter, zeroed by
     * a memset node before its kernel): nothing allocated in the graph. */
    size_t ws = 0;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &ws), FG_OK);
    const CUdeviceptr dws = ws ? alloc_dev(ws) : 0;
    a.workspace = (void *)(uintptr_t)dws, a.workspace_size = ws;
    fg_kernel *fk = NULL;
    assert_int_equal(fg_attention_kernel_for(ctx, mod, &a, &fk), FG_OK);
    const int counters = fg_kernel_kind_of(fk) == FG_KERNEL_ATTENTION_FWD_SM90;
    fg_kernel_release(fk);
    st = fg_attention_forward(ctx, mod, &a);
    if (st != FG_OK) print_error("%s: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    assert_int_equal(fgi_cu()->cuStreamSynchronize(s), CUDA_SUCCESS);

    graph_nodes n;
    begin(s);
    st = fg_block_mask_rebuild_gpu(ctx, bm, mod, bb.dev, (size_t)bb.n, s);
    if (st == FG_OK) st = fg_attention_forward(ctx, mod, &a);
    CUgraphExec exec = end(s, st, ctx, name, &n);
    const bool graph_ok = n.kernel == 3 && n.memcpy == 0 && n.memset == counters && n.alloc == 0 &&
                          n.free == 0 && n.other == 0;

    worst w = {0};
    const int N = replays();
    fg_attention_args h = a;
    h.q = hq, h.k = hk, h.v = hv, h.binds = bb.host;
    h.block_mask = NULL; /* the reference evaluates the mask everywhere */
    h.stream = NULL, h.workspace = NULL, h.workspace_size = 0;
    for (int i = 0; i < N; i++) {
        /* new documents, some long enough to span blocks, in the same buffer */
        int32_t *fresh = documents(c->s, 1 + (int)(tu_rand_u64(&rng) % (uint64_t)(c->s / 2)));
        memcpy(doc, fresh, sizeof *doc * (size_t)c->s);
        free(fresh);
        put(bb.dmem[0], doc, sizeof *doc * (size_t)c->s);
        fill16(c->dtype, hq, nq), fill16(c->dtype, hk, nkv), fill16(c->dtype, hv, nkv);
        put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2);
        poison(dout, nq * 2, s), poison(dlse, nlse * 4, s);
        replay(exec, s);
        get(gout, dout, nq * 2), get(glse, dlse, nlse * 4);
        st = fg_attention_reference(ctx, mod, &h, rout, rlse);
        assert_int_equal(st, FG_OK);
        const out_check oc = check_out(c->dtype, gout, glse, rout, rlse, nlse, D);
        note(&w, &oc, name, i);
    }
    verdict(name, &w, graph_ok, N);

    assert_int_equal(fgi_cu()->cuGraphExecDestroy(exec), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuStreamDestroy(s), CUDA_SUCCESS);
    const CUdeviceptr all[] = {dq, dk, dv, dout, dlse, dws};
    free_dev(all, sizeof all / sizeof all[0]);
    free(hq), free(hk), free(hv), free(gout), free(glse), free(rout), free(rlse);
    fg_block_mask_destroy(bm);
    binds_free(&bb);
    fg_mod_destroy(mod);
}

static void test_rebuild(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    for (size_t i = 0; i < sizeof fsteps / sizeof fsteps[0]; i++) rebuild_case(ctx, &fsteps[i]);
    done(ctx);
}

/* ---- a training step: forward and backward ---------------------------------------- */

typedef struct tstep {
    const char *mod;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, s;
    int deterministic;
} tstep;

static const tstep tsteps[] = {
    {"causal", 128, FG_BF16, 2, 2, 2, 160, 0},
    {"softcap", 64, FG_BF16, 1, 4, 2, 200, 0},
    {"sliding_window", 64, FG_FP16, 1, 2, 1, 130, 1},
};

static void train_case(fg_ctx *ctx, const tstep *c) {
    char name[160];
    snprintf(name, sizeof name, "train step %s D=%d %s B=%d Hq=%d Hkv=%d S=%d%s", c->mod, c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->s,
             c->deterministic ? " deterministic" : "");
    fg_mod *mod = tu_gallery_mod(ctx, c->mod);
    acase ac = {.mod = c->mod, .d = c->d, .dtype = c->dtype, .b = c->b, .hq = c->hq, .hkv = c->hkv,
                .q = c->s, .kv = c->s};
    binds bb;
    gallery_binds(c->mod, &ac, &bb);
    const int D = c->d;
    const size_t nq = (size_t)c->b * c->hq * c->s * D, nkv = (size_t)c->b * c->hkv * c->s * D;
    const size_t nlse = (size_t)c->b * c->hq * c->s;
    uint16_t *hq = random16(c->dtype, nq, true), *hk = random16(c->dtype, nkv, true),
             *hv = random16(c->dtype, nkv, false), *hdo = random16(c->dtype, nq, true);
    uint16_t *gout = malloc(nq * 2), *gdq = malloc(nq * 2), *gdk = malloc(nkv * 2), *gdv = malloc(nkv * 2);
    float *glse = malloc(nlse * 4);
    double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nlse);
    double *rdq = malloc(sizeof(double) * nq), *rdk = malloc(sizeof(double) * nkv), *rdv = malloc(sizeof(double) * nkv);
    CUdeviceptr dq = alloc_dev(nq * 2), dk = alloc_dev(nkv * 2), dv = alloc_dev(nkv * 2), dout = alloc_dev(nq * 2),
                dlse = alloc_dev(nlse * 4), ddo = alloc_dev(nq * 2), gq = alloc_dev(nq * 2), gk = alloc_dev(nkv * 2),
                gv = alloc_dev(nkv * 2), dws = 0;
    put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2), put(ddo, hdo, nq * 2);
    CUstream s = new_stream();

    fg_attention_args a = fg_attention_args_init();
    a.batch = c->b, a.heads_q = c->hq, a.heads_kv = c->hkv, a.q_len = a.kv_len = c->s;
    a.head_dim = D, a.dtype = c->dtype;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n, a.stream = s;
    fg_attention_bwd_args b = fg_attention_bwd_args_init();
    b.fwd = &a, b.dout = (const void *)(uintptr_t)ddo;
    b.dq = (void *)(uintptr_t)gq, b.dk = (void *)(uintptr_t)gk, b.dv = (void *)(uintptr_t)gv;
    b.deterministic = c->deterministic;
    size_t ws = 0;
    fg_status st = fg_attention_backward_workspace_size(ctx, mod, &b, &ws);
    if (st != FG_OK) print_error("%s: workspace size: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    assert_true(ws > 0);
    /* One workspace for both calls (they run in stream order): the
     * forward's (the Hopper forward's tile counter) and the backward's. */
    size_t fws = 0;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &fws), FG_OK);
    if (fws > ws) ws = fws;
    dws = alloc_dev(ws);
    b.workspace = a.workspace = (void *)(uintptr_t)dws, b.workspace_size = a.workspace_size = ws;

    st = fg_attention_forward(ctx, mod, &a);
    if (st == FG_OK) st = fg_attention_backward(ctx, mod, &b);
    if (st != FG_OK) print_error("%s: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    assert_int_equal(fgi_cu()->cuStreamSynchronize(s), CUDA_SUCCESS);

    graph_nodes n;
    begin(s);
    st = fg_attention_forward(ctx, mod, &a);
    if (st == FG_OK) st = fg_attention_backward(ctx, mod, &b);
    CUgraphExec exec = end(s, st, ctx, name, &n);
    const bool graph_ok = n.kernel >= 4 && n.memcpy == 0 && n.alloc == 0 && n.free == 0 && n.other == 0;

    worst w = {0};
    const int N = replays();
    fg_attention_args h = a;
    h.q = hq, h.k = hk, h.v = hv, h.binds = bb.host, h.stream = NULL, h.workspace = NULL, h.workspace_size = 0;
    h.out = hq; /* not read by the reference */
    fg_attention_bwd_args hb = b;
    hb.fwd = &h, hb.dout = hdo, hb.dq = rdq, hb.dk = rdk, hb.dv = rdv, hb.workspace = NULL, hb.workspace_size = 0;
    const double tol = c->dtype == FG_BF16 ? 2e-2 : 5e-3;
    for (int i = 0; i < N; i++) {
        fill16(c->dtype, hq, nq), fill16(c->dtype, hk, nkv), fill16(c->dtype, hv, nkv), fill16(c->dtype, hdo, nq);
        put(dq, hq, nq * 2), put(dk, hk, nkv * 2), put(dv, hv, nkv * 2), put(ddo, hdo, nq * 2);
        poison(dout, nq * 2, s), poison(dlse, nlse * 4, s);
        poison(gq, nq * 2, s), poison(gk, nkv * 2, s), poison(gv, nkv * 2, s);
        replay(exec, s);
        get(gout, dout, nq * 2), get(glse, dlse, nlse * 4);
        get(gdq, gq, nq * 2), get(gdk, gk, nkv * 2), get(gdv, gv, nkv * 2);
        assert_int_equal(fg_attention_reference(ctx, mod, &h, rout, rlse), FG_OK);
        assert_int_equal(fg_attention_reference_backward(ctx, mod, &hb), FG_OK);
        out_check oc = check_out(c->dtype, gout, glse, rout, rlse, nlse, D);
        long nonfinite = 0;
        const double eq = rel_err_dense16(c->dtype, gdq, rdq, nq, &nonfinite),
                     ek = rel_err_dense16(c->dtype, gdk, rdk, nkv, &nonfinite),
                     ev = rel_err_dense16(c->dtype, gdv, rdv, nkv, &nonfinite);
        if (eq > tol || ek > tol || ev > tol || nonfinite) {
            printf("     %s replay %d: dq %.2e dk %.2e dv %.2e nonfinite %ld\n", name, i, eq, ek, ev, nonfinite);
            oc.ok = false;
        }
        const double eg = fmax(eq, fmax(ek, ev));
        if (eg > oc.rel) oc.rel = eg; /* the summary's worst: out or a gradient */
        note(&w, &oc, name, i);
    }
    verdict(name, &w, graph_ok, N);

    assert_int_equal(fgi_cu()->cuGraphExecDestroy(exec), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuStreamDestroy(s), CUDA_SUCCESS);
    const CUdeviceptr all[] = {dq, dk, dv, dout, dlse, ddo, gq, gk, gv, dws};
    free_dev(all, sizeof all / sizeof all[0]);
    free(hq), free(hk), free(hv), free(hdo), free(gout), free(gdq), free(gdk), free(gdv), free(glse);
    free(rout), free(rlse), free(rdq), free(rdk), free(rdv);
    binds_free(&bb);
    fg_mod_destroy(mod);
}

static void test_train(void **state) {
    (void)state;
    fg_ctx *ctx = gpu_ctx();
    for (size_t i = 0; i < sizeof tsteps / sizeof tsteps[0]; i++) train_case(ctx, &tsteps[i]);
    done(ctx);
}

int main(void) {
    tu_require_gpu();
    setvbuf(stdout, NULL, _IOLBF, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_rebuild),
        cmocka_unit_test(test_train),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
