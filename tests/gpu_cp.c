/* gpu_cp.c -- fg_attention_forward_cp on two GPUs of one machine against
 * the CPU reference of the whole sequence.
 *
 * One communicator per GPU from ncclCommInitAll, one thread per rank (NCCL
 * needs the ranks' calls in flight together), each with its own context,
 * stream and shard; everything else (inputs, uploads, the reference) runs
 * on the main thread. For gallery mods, both layouts, lengths that cut
 * evenly and lengths that do not, the ranks' out and lse rows, put back at
 * their global positions, must meet the forward's tolerances
 * (check_out: 1e-2 relative in bf16, 2e-3 in fp16; LSE 1e-3; -inf and 0
 * exactly where every key is masked). Outputs are poisoned first.
 *
 * Skips (77) without two GPUs or without NCCL ($FLEXGEN_NCCL_LIB, else
 * libnccl.so.2). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless
 * the environment says otherwise). */
#include "gpu_cases.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORLD 2

static int failures = 0;

typedef struct cp_case {
    const char *mod;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, s;
    fg_cp_layout layout;
} cp_case;

static const cp_case cases[] = {
    {"causal", 64, FG_BF16, 1, 4, 2, 1000, FG_CP_ZIGZAG},
    {"causal", 64, FG_BF16, 1, 4, 2, 1000, FG_CP_CONTIGUOUS},
    {"noop", 128, FG_FP16, 2, 2, 2, 1536, FG_CP_CONTIGUOUS},
    {"sliding_window", 64, FG_BF16, 1, 4, 4, 2048, FG_CP_CONTIGUOUS},
    {"sliding_window", 64, FG_BF16, 1, 4, 4, 2048, FG_CP_ZIGZAG},
    {"document", 128, FG_BF16, 1, 2, 1, 1300, FG_CP_ZIGZAG},
    {"prefix_lm", 64, FG_FP16, 1, 2, 2, 900, FG_CP_ZIGZAG},
    {"alibi", 128, FG_BF16, 1, 4, 2, 1000, FG_CP_ZIGZAG},
    {"softcap", 64, FG_BF16, 1, 2, 2, 777, FG_CP_CONTIGUOUS},
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
    CUstream stream;
    fg_status st;
    char err[512];
    int64_t start[2], len[2];
    int nchunks;
    CUdeviceptr q, k, v, out, lse;
    binds bb;
} rank_job;

static void *rank_main(void *p) {
    rank_job *j = p;
    j->st = fg_attention_forward_cp(j->ctx, j->mod, &j->cp);
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

/* Rows of a [B, H, S, D] host tensor gathered into [B, H, rows, D] for the
 * chunks (start, len), back to back. */
static uint16_t *gather(const uint16_t *x, int B, int H, int S, int D, const int64_t *start, const int64_t *len,
                        int n) {
    int64_t rows = 0;
    for (int c = 0; c < n; c++) rows += len[c];
    uint16_t *y = malloc((size_t)B * H * (size_t)rows * D * 2 + 2);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int64_t r = 0;
            for (int c = 0; c < n; c++)
                for (int64_t i = 0; i < len[c]; i++, r++)
                    memcpy(y + (((size_t)b * H + h) * rows + r) * D, x + (((size_t)b * H + h) * S + start[c] + i) * D,
                           (size_t)D * 2);
        }
    return y;
}

static void run_case(void *comms[WORLD], const cp_case *c) {
    char name[200];
    snprintf(name, sizeof name, "%s D=%d %s B=%d Hq=%d Hkv=%d S=%d %s", c->mod, c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->s,
             c->layout == FG_CP_ZIGZAG ? "zig-zag" : "contiguous");
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
        assert_int_equal(fg_ctx_set_int(j->ctx, FG_OPT_DEVICE, r), FG_OK);
        assert_int_equal(fgi_cuda_ready(j->ctx), FG_OK); /* device r's context current here */
        j->mod = tu_gallery_mod(j->ctx, c->mod);
        const uint64_t keep = rng;
        gallery_binds(c->mod, &ac, &j->bb); /* the same values on every rank */
        if (r + 1 < WORLD) rng = keep;
        assert_int_equal(fg_cp_shard_rows(c->layout, WORLD, r, S, j->start, j->len, &j->nchunks), FG_OK);
        const int rows = (int)(j->len[0] + j->len[1]);
        uint16_t *lq = gather(hq, B, c->hq, S, D, j->start, j->len, j->nchunks);
        uint16_t *lk = gather(hk, B, c->hkv, S, D, j->start, j->len, j->nchunks);
        uint16_t *lv = gather(hv, B, c->hkv, S, D, j->start, j->len, j->nchunks);
        const size_t lnq = (size_t)B * c->hq * rows * D, lnkv = (size_t)B * c->hkv * rows * D;
        j->q = upload(lq, lnq * 2), j->k = upload(lk, lnkv * 2), j->v = upload(lv, lnkv * 2);
        free(lq), free(lk), free(lv);
        assert_int_equal(fgi_cu()->cuMemAlloc(&j->out, lnq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemAlloc(&j->lse, (size_t)B * c->hq * rows * 4), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(j->out, 0xff, lnq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(j->lse, 0xff, (size_t)B * c->hq * rows * 4), CUDA_SUCCESS);
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
    }
    pthread_t t[WORLD];
    for (int r = 0; r < WORLD; r++) assert_int_equal(pthread_create(&t[r], NULL, rank_main, &jobs[r]), 0);
    for (int r = 0; r < WORLD; r++) pthread_join(t[r], NULL);

    /* The ranks' rows back at their global positions. */
    uint16_t *gout = malloc(nq * 2);
    float *glse = malloc(nlse * 4);
    bool ran = true;
    for (int r = 0; r < WORLD; r++) {
        rank_job *j = &jobs[r];
        if (j->st != FG_OK) {
            printf("FAIL %s: rank %d: %s\n", name, r, j->err);
            ran = false;
            continue;
        }
        assert_int_equal(fgi_cuda_ready(j->ctx), FG_OK);
        const int rows = (int)(j->len[0] + j->len[1]);
        uint16_t *lo = malloc((size_t)B * c->hq * rows * D * 2);
        float *ll = malloc((size_t)B * c->hq * rows * 4);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(lo, j->out, (size_t)B * c->hq * rows * D * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(ll, j->lse, (size_t)B * c->hq * rows * 4), CUDA_SUCCESS);
        for (int bh = 0; bh < B * c->hq; bh++) {
            int64_t lr = 0;
            for (int ch = 0; ch < j->nchunks; ch++)
                for (int64_t i = 0; i < j->len[ch]; i++, lr++) {
                    const int64_t g = j->start[ch] + i;
                    memcpy(gout + ((size_t)bh * S + g) * D, lo + ((size_t)bh * rows + lr) * D, (size_t)D * 2);
                    glse[(size_t)bh * S + g] = ll[(size_t)bh * rows + lr];
                }
        }
        free(lo), free(ll);
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
    } else {
        failures++;
    }
    fflush(stdout);
    for (int r = 0; r < WORLD; r++) {
        rank_job *j = &jobs[r];
        fgi_cuda_ready(j->ctx);
        fgi_cu()->cuStreamDestroy(j->stream);
        CUdeviceptr all[] = {j->q, j->k, j->v, j->out, j->lse};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fgi_cu()->cuMemFree(all[i]);
        binds_free(&j->bb);
        fg_mod_destroy(j->mod);
        fg_ctx_destroy(j->ctx);
    }
    free(hq), free(hk), free(hv), free(gout), free(glse);
}

static void test_two_gpus(void **state) {
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
        fgi_cu()->cuDeviceGetCount(&count) != CUDA_SUCCESS || count < WORLD) {
        printf("skipping: %d CUDA device(s), the test needs %d\n", count, WORLD);
        return TU_MAIN_SKIP;
    }
    fg_ctx_destroy(ctx);
    comm_init_all_fn init;
    comm_destroy_fn destroy;
    void *lib = open_nccl(&init, &destroy);
    if (!lib) {
        printf("skipping: no NCCL (set FLEXGEN_NCCL_LIB to libnccl.so.2): %s\n", dlerror());
        return TU_MAIN_SKIP;
    }
    void *comms[WORLD] = {0};
    const int devs[WORLD] = {0, 1};
    if (init(comms, WORLD, devs) != 0) {
        printf("FAIL: ncclCommInitAll\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test_prestate(test_two_gpus, comms)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int r = 0; r < WORLD; r++) destroy(comms[r]);
    return rc;
}
