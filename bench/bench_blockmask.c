/* bench_blockmask.c -- how long a block mask takes to build.
 *
 * GPU: for each case the mask is built once (compile / cache load and
 * allocation), warmed up, then rebuilt in place many times on one stream.
 * Two figures per case, both from CUDA events:
 *   call   -- events around a single fg_block_mask_rebuild_gpu, median of
 *             many: what one rebuild costs on the stream, host submission
 *             gaps included;
 *   stream -- N rebuilds back to back between two events, divided by N:
 *             the device time when the host keeps the stream fed.
 * plus the host wall time of one rebuild call (median).
 * CPU: fg_block_mask_create for causal at S=8192 on this thread, median.
 *
 * The mods are those of the gallery (mods/causal.c, mods/sliding_window.c)
 * when FLEXGEN_SOURCE_ROOT points at the tree; the document mask is written
 * here because its batch layout (one document id row per batch entry) is
 * part of what is measured.
 *
 * Usage: bench_blockmask [--json FILE] [--iters N]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmask.h"
#include "cudrv.h"

#define SIG "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
static const char CAUSAL[] = SIG "{ return q_idx >= kv_idx; }\n";
static const char SLIDING[] = "int WINDOW = 1024;\n" SIG
                              "{ return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW; }\n";
/* doc holds batch rows of SEQ ids each. */
static const char DOCUMENT[] = "const int *doc;\nint SEQ = 8192;\n" SIG
                               "{ return doc[b * SEQ + q_idx] == doc[b * SEQ + kv_idx]; }\n";

typedef struct bench_case {
    const char *name, *gallery, *source;
    int batch, heads, seq;
} bench_case;

static const bench_case cases[] = {
    {"causal", "causal", CAUSAL, 1, 1, 8192},
    {"sliding_window", "sliding_window", SLIDING, 1, 1, 8192},
    {"document", NULL, DOCUMENT, 1, 1, 8192},
    {"causal", "causal", CAUSAL, 1, 1, 32768},
    {"sliding_window", "sliding_window", SLIDING, 1, 1, 32768},
    {"document", NULL, DOCUMENT, 1, 1, 32768},
    {"causal", "causal", CAUSAL, 4, 16, 8192},
    {"document", NULL, DOCUMENT, 4, 16, 8192},
};

typedef struct result {
    double call_ms, stream_ms, host_ms, first_ms;
    double sparsity;
} result;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static fg_mod *load_mod(fg_ctx *ctx, const bench_case *c) {
    fg_mod *mod = NULL;
    const char *root = getenv("FLEXGEN_SOURCE_ROOT");
    if (c->gallery && root) {
        char path[4096];
        snprintf(path, sizeof path, "%s/mods/%s.c", root, c->gallery);
        if (fg_mod_from_file(ctx, path, &mod) == FG_OK) return mod;
    }
    if (fg_mod_from_source(ctx, c->name, c->source, (size_t)-1, &mod) != FG_OK) return NULL;
    return mod;
}

/* Documents of random lengths in [64, 2048), a different layout per batch. */
static void documents(int32_t *doc, int batch, int seq, uint64_t seed) {
    uint64_t s = seed * 2654435761u + 1;
    for (int b = 0; b < batch; b++) {
        int id = 0, left = 0;
        for (int i = 0; i < seq; i++) {
            if (left == 0) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                left = 64 + (int)((s >> 33) % 1984);
                id++;
            }
            doc[(size_t)b * seq + i] = id;
            left--;
        }
    }
}

#define CHECK(call)                                                                         \
    do {                                                                                    \
        fg_status st_ = (call);                                                             \
        if (st_ != FG_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, fg_status_string(st_),   \
                    fg_errmsg(ctx));                                                        \
            return st_;                                                                     \
        }                                                                                   \
    } while (0)
#define CU(call)                                                                            \
    do {                                                                                    \
        CUresult r_ = (call);                                                               \
        if (r_ != CUDA_SUCCESS) {                                                           \
            fprintf(stderr, "%s:%d: CUDA error %d\n", __FILE__, __LINE__, (int)r_);         \
            return FG_ERR_CUDA;                                                             \
        }                                                                                   \
    } while (0)

static fg_status run_case(fg_ctx *ctx, const bench_case *c, int iters, result *res) {
    const fgi_cu_api *cu = fgi_cu();
    fg_mod *mod = load_mod(ctx, c);
    if (!mod) return fg_errcode(ctx);
    fg_binding binds[2];
    size_t nb = 0;
    int32_t *doc = NULL;
    CUdeviceptr ddoc = 0;
    size_t n = (size_t)c->batch * c->seq;
    if (c->source == DOCUMENT) {
        doc = malloc(n * sizeof *doc);
        documents(doc, c->batch, c->seq, 1);
        CU(cu->cuMemAlloc(&ddoc, n * sizeof *doc));
        CU(cu->cuMemcpyHtoD(ddoc, doc, n * sizeof *doc));
        binds[nb++] = fg_bind_int_buffer("doc", (const int32_t *)(uintptr_t)ddoc, (int64_t)n);
        binds[nb++] = fg_bind_int("SEQ", c->seq);
    }
    fg_block_mask_desc d = {c->batch, c->heads, c->seq, c->seq, 128, 128};
    CUstream stream;
    CUevent e0, e1;
    CU(cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU(cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CU(cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));

    double t0 = fgi_now_ms();
    fg_block_mask *m = NULL;
    CHECK(fg_block_mask_create_gpu(ctx, mod, &d, binds, nb, stream, &m));
    CU(cu->cuStreamSynchronize(stream));
    res->first_ms = fgi_now_ms() - t0;
    for (int i = 0; i < 20; i++) CHECK(fg_block_mask_rebuild_gpu(ctx, m, mod, binds, nb, stream));
    CU(cu->cuStreamSynchronize(stream));

    double *call = malloc(sizeof *call * (size_t)iters), *host = malloc(sizeof *host * (size_t)iters);
    for (int i = 0; i < iters; i++) {
        CU(cu->cuEventRecord(e0, stream));
        double h0 = fgi_now_ms();
        CHECK(fg_block_mask_rebuild_gpu(ctx, m, mod, binds, nb, stream));
        host[i] = fgi_now_ms() - h0;
        CU(cu->cuEventRecord(e1, stream));
        CU(cu->cuEventSynchronize(e1));
        float ms;
        CU(cu->cuEventElapsedTime(&ms, e0, e1));
        call[i] = ms;
    }
    res->call_ms = median(call, iters);
    res->host_ms = median(host, iters);
    double streams[5];
    for (int r = 0; r < 5; r++) {
        CU(cu->cuEventRecord(e0, stream));
        for (int i = 0; i < iters; i++) CHECK(fg_block_mask_rebuild_gpu(ctx, m, mod, binds, nb, stream));
        CU(cu->cuEventRecord(e1, stream));
        CU(cu->cuEventSynchronize(e1));
        float ms;
        CU(cu->cuEventElapsedTime(&ms, e0, e1));
        streams[r] = ms / iters;
    }
    res->stream_ms = median(streams, 5);
    CHECK(fg_block_mask_download(ctx, m));
    CHECK(fg_block_mask_sparsity(m, &res->sparsity));

    free(call);
    free(host);
    fg_block_mask_destroy(m);
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    cu->cuStreamDestroy(stream);
    if (ddoc) cu->cuMemFree(ddoc);
    free(doc);
    fg_mod_destroy(mod);
    return FG_OK;
}

static fg_status cpu_causal(fg_ctx *ctx, double *ms_out) {
    fg_mod *mod = load_mod(ctx, &cases[0]);
    if (!mod) return fg_errcode(ctx);
    fg_block_mask_desc d = {1, 1, 8192, 8192, 128, 128};
    double t[3];
    for (int r = 0; r < 3; r++) {
        fg_block_mask *m = NULL;
        double t0 = fgi_now_ms();
        CHECK(fg_block_mask_create(ctx, mod, &d, NULL, 0, &m));
        t[r] = fgi_now_ms() - t0;
        fg_block_mask_destroy(m);
    }
    *ms_out = median(t, 3);
    fg_mod_destroy(mod);
    return FG_OK;
}

int main(int argc, char **argv) {
    const char *json_path = NULL;
    int iters = 200;
    bool cpu_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-only")) cpu_only = true;
        else {
            fprintf(stderr, "usage: %s [--json FILE] [--iters N] [--cpu-only]\n", argv[0]);
            return 2;
        }
    }
    if (iters < 1) iters = 1;
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return 1;
    double cpu_ms = 0;
    if (cpu_causal(ctx, &cpu_ms) != FG_OK) return 1;

    const size_t ncases = sizeof cases / sizeof cases[0];
    result res[sizeof cases / sizeof cases[0]];
    memset(res, 0, sizeof res);
    bool gpu = !cpu_only && fgi_cuda_ready(ctx) == FG_OK;
    char devname[256] = "none";
    if (gpu) {
        CUdevice dev;
        fgi_cu()->cuCtxGetDevice(&dev);
        fgi_cu()->cuDeviceGetName(devname, sizeof devname, dev);
        for (size_t i = 0; i < ncases; i++)
            if (run_case(ctx, &cases[i], iters, &res[i]) != FG_OK) return 1;
    }

    printf("block-mask build time, device: %s, blocks 128x128, %d iterations\n", devname, iters);
    printf("%-16s %3s %3s %6s %9s %11s %11s %11s %11s\n", "mask", "B", "H", "S", "sparsity",
           "call ms", "stream ms", "host ms", "first ms");
    for (size_t i = 0; gpu && i < ncases; i++)
        printf("%-16s %3d %3d %6d %8.2f%% %11.4f %11.4f %11.4f %11.2f\n", cases[i].name,
               cases[i].batch, cases[i].heads, cases[i].seq, 100 * res[i].sparsity, res[i].call_ms,
               res[i].stream_ms, res[i].host_ms, res[i].first_ms);
    printf("CPU builder, causal S=8192 (one thread): %.1f ms\n", cpu_ms);

    FILE *jf = json_path ? fopen(json_path, "w") : stdout;
    if (!jf) return 1;
    fprintf(jf, "{\"device\": \"%s\", \"iters\": %d, \"cpu_causal_8192_ms\": %.3f, \"gpu\": [", devname,
            iters, cpu_ms);
    for (size_t i = 0; gpu && i < ncases; i++)
        fprintf(jf,
                "%s\n  {\"mask\": \"%s\", \"batch\": %d, \"heads\": %d, \"seq\": %d, \"sparsity\": %.6f, "
                "\"call_ms\": %.5f, \"stream_ms\": %.5f, \"host_ms\": %.5f, \"first_ms\": %.3f}",
                i ? "," : "", cases[i].name, cases[i].batch, cases[i].heads, cases[i].seq,
                res[i].sparsity, res[i].call_ms, res[i].stream_ms, res[i].host_ms, res[i].first_ms);
    fprintf(jf, "]}\n");
    if (json_path) fclose(jf);
    fg_ctx_destroy(ctx);
    return 0;
}
