/*
 * example_util.h -- what the examples need besides flexgen: device memory,
 * copies and timing through the CUDA Driver API, bf16 on the host, random
 * inputs, and a check of GPU rows against flexgen's CPU reference.
 *
 * flexgen never links libcuda: it opens it with dlopen on first use, so a
 * program that uses it starts on a machine with no driver. The examples keep
 * that property by opening libcuda.so.1 the same way here, with the few entry
 * points they need declared by hand (no cuda.h). So each example builds with
 * a plain
 *
 *     cc causal.c $(pkg-config --cflags --libs flexgen) -o causal
 *
 * and, where there is no driver or no GPU, does its CPU part, prints
 * "no CUDA device: skipping the GPU part" and exits 0.
 *
 * The CUDA context is device 0's primary context, made current here before
 * flexgen's first GPU call; flexgen adopts a context that is already current,
 * so the memory allocated here and the kernels flexgen launches live in the
 * same context.
 *
 * Header-only (static inline functions): copy it next to your own program.
 * Include it before any other header (it asks for POSIX clock_gettime).
 */
#ifndef FLEXGEN_EXAMPLE_UTIL_H
#define FLEXGEN_EXAMPLE_UTIL_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <flexgen.h>

/* ------------------------------------------------------------------------- */
/* The CUDA Driver API, the part the examples use                            */
/* ------------------------------------------------------------------------- */

typedef unsigned long long ex_dptr; /* CUdeviceptr */

typedef struct ex_cuda {
    int tried, ok;
    char why[200]; /* why the GPU part cannot run */
    void *lib;
    char device_name[256];
    int (*cuInit)(unsigned);
    int (*cuDeviceGetCount)(int *);
    int (*cuDeviceGet)(int *, int);
    int (*cuDeviceGetName)(char *, int, int);
    int (*cuDevicePrimaryCtxRetain)(void **, int);
    int (*cuCtxSetCurrent)(void *);
    int (*cuCtxSynchronize)(void);
    int (*cuGetErrorName)(int, const char **);
    int (*cuMemAlloc)(ex_dptr *, size_t);
    int (*cuMemFree)(ex_dptr);
    int (*cuMemcpyHtoD)(ex_dptr, const void *, size_t);
    int (*cuMemcpyDtoH)(void *, ex_dptr, size_t);
    int (*cuMemsetD8)(ex_dptr, unsigned char, size_t);
    int (*cuEventCreate)(void **, unsigned);
    int (*cuEventDestroy)(void *);
    int (*cuEventRecord)(void *, void *);
    int (*cuEventSynchronize)(void *);
    int (*cuEventElapsedTime)(float *, void *, void *);
    /* Streams and CUDA graphs (serving_loop --graph). Optional: NULL when
     * the driver lacks them (cuGraphInstantiateWithFlags: CUDA 11.4), and
     * only the program that uses them fails then. CUstream, CUgraph and
     * CUgraphExec are pointers; CUstreamCaptureMode is an enum (int). */
    int (*cuStreamCreate)(void **, unsigned);
    int (*cuStreamDestroy)(void *);
    int (*cuStreamSynchronize)(void *);
    int (*cuStreamBeginCapture)(void *, int);
    int (*cuStreamEndCapture)(void *, void **);
    int (*cuGraphInstantiate)(void **, void *, unsigned long long);
    int (*cuGraphLaunch)(void *, void *);
    int (*cuGraphExecDestroy)(void *);
    int (*cuGraphDestroy)(void *);
} ex_cuda;

/* cuda.h's values of the enums and flags above. */
#define EX_CU_STREAM_DEFAULT 0x0             /* CU_STREAM_DEFAULT: syncs with the legacy stream */
#define EX_CU_STREAM_CAPTURE_MODE_GLOBAL 0   /* CU_STREAM_CAPTURE_MODE_GLOBAL                   */
#define EX_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1

static ex_cuda ex_cu;

/* The exported names: cuda.h maps several functions to versioned symbols
 * (cuMemAlloc to cuMemAlloc_v2, cuStreamBeginCapture to
 * cuStreamBeginCapture_v2, cuGraphInstantiate to cuGraphInstantiateWithFlags
 * since CUDA 12), and with CUDA_API_PER_THREAD_DEFAULT_STREAM some to _ptsz /
 * _ptds variants; these are the legacy default stream's names, as in
 * flexgen. A missing optional entry point stays NULL. */
static inline int ex_cuda_lookup(void) {
    struct ex_cuda_sym { void **slot; const char *name; } syms[] = {
        {(void **)&ex_cu.cuInit, "cuInit"},
        {(void **)&ex_cu.cuDeviceGetCount, "cuDeviceGetCount"},
        {(void **)&ex_cu.cuDeviceGet, "cuDeviceGet"},
        {(void **)&ex_cu.cuDeviceGetName, "cuDeviceGetName"},
        {(void **)&ex_cu.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
        {(void **)&ex_cu.cuCtxSetCurrent, "cuCtxSetCurrent"},
        {(void **)&ex_cu.cuCtxSynchronize, "cuCtxSynchronize"},
        {(void **)&ex_cu.cuGetErrorName, "cuGetErrorName"},
        {(void **)&ex_cu.cuMemAlloc, "cuMemAlloc_v2"},
        {(void **)&ex_cu.cuMemFree, "cuMemFree_v2"},
        {(void **)&ex_cu.cuMemcpyHtoD, "cuMemcpyHtoD_v2"},
        {(void **)&ex_cu.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
        {(void **)&ex_cu.cuMemsetD8, "cuMemsetD8_v2"},
        {(void **)&ex_cu.cuEventCreate, "cuEventCreate"},
        {(void **)&ex_cu.cuEventDestroy, "cuEventDestroy_v2"},
        {(void **)&ex_cu.cuEventRecord, "cuEventRecord"},
        {(void **)&ex_cu.cuEventSynchronize, "cuEventSynchronize"},
        {(void **)&ex_cu.cuEventElapsedTime, "cuEventElapsedTime"},
    }, optional[] = {
        {(void **)&ex_cu.cuStreamCreate, "cuStreamCreate"},
        {(void **)&ex_cu.cuStreamDestroy, "cuStreamDestroy_v2"},
        {(void **)&ex_cu.cuStreamSynchronize, "cuStreamSynchronize"},
        {(void **)&ex_cu.cuStreamBeginCapture, "cuStreamBeginCapture_v2"},
        {(void **)&ex_cu.cuStreamEndCapture, "cuStreamEndCapture"},
        {(void **)&ex_cu.cuGraphInstantiate, "cuGraphInstantiateWithFlags"},
        {(void **)&ex_cu.cuGraphLaunch, "cuGraphLaunch"},
        {(void **)&ex_cu.cuGraphExecDestroy, "cuGraphExecDestroy"},
        {(void **)&ex_cu.cuGraphDestroy, "cuGraphDestroy"},
    };
    /* POSIX guarantees a data pointer can carry a function address. */
    for (size_t i = 0; i < sizeof optional / sizeof optional[0]; i++)
        *optional[i].slot = dlsym(ex_cu.lib, optional[i].name);
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(ex_cu.lib, syms[i].name);
        if (!*syms[i].slot) return 0;
    }
    return 1;
}

static inline const char *ex_cuda_error_name(int r) {
    const char *name = NULL;
    if (ex_cu.cuGetErrorName && ex_cu.cuGetErrorName(r, &name) == 0 && name) return name;
    return "CUDA error";
}

/* Open libcuda, find a device, make device 0's primary context current.
 * Returns 1 when the GPU part can run; otherwise 0, and ex_no_gpu says
 * why. Safe to call repeatedly. */
/* libcuda opened, its entry points looked up and cuInit called: the
 * number of devices, 0 when there is none or no driver (ex_cu.why says
 * why). No context is made. */
static inline int ex_gpu_count(void) {
    if (!ex_cu.lib) {
        ex_cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!ex_cu.lib) {
            snprintf(ex_cu.why, sizeof ex_cu.why, "libcuda.so.1 not found: no NVIDIA driver");
            return 0;
        }
        if (!ex_cuda_lookup()) {
            snprintf(ex_cu.why, sizeof ex_cu.why, "libcuda.so.1 lacks an entry point");
            dlclose(ex_cu.lib);
            ex_cu.lib = NULL;
            return 0;
        }
    }
    int count = 0;
    int r = ex_cu.cuInit(0);
    if (r == 0) r = ex_cu.cuDeviceGetCount(&count);
    if (r != 0 || count == 0) {
        snprintf(ex_cu.why, sizeof ex_cu.why, "%s, %d devices", r ? ex_cuda_error_name(r) : "cuInit ok", count);
        return 0;
    }
    return count;
}

static inline int ex_gpu_open(void) {
    if (ex_cu.tried) return ex_cu.ok;
    ex_cu.tried = 1;
    if (ex_gpu_count() == 0) return 0;
    int dev = 0, r;
    void *cuctx = NULL;
    r = ex_cu.cuDeviceGet(&dev, 0);
    if (r == 0) r = ex_cu.cuDevicePrimaryCtxRetain(&cuctx, dev);
    if (r == 0) r = ex_cu.cuCtxSetCurrent(cuctx);
    if (r != 0) {
        snprintf(ex_cu.why, sizeof ex_cu.why, "device 0: %s", ex_cuda_error_name(r));
        return 0;
    }
    if (ex_cu.cuDeviceGetName(ex_cu.device_name, (int)sizeof ex_cu.device_name, dev) != 0)
        strcpy(ex_cu.device_name, "device 0");
    ex_cu.ok = 1;
    return 1;
}

static inline void ex_no_gpu(void) {
    if (ex_cu.why[0])
        printf("no CUDA device: skipping the GPU part (%s)\n", ex_cu.why);
    else
        printf("no CUDA device: skipping the GPU part\n");
}

static inline int ex_cu_ok(int r, const char *what) {
    if (r == 0) return 1;
    fprintf(stderr, "%s: %s\n", what, ex_cuda_error_name(r));
    return 0;
}

/* Device memory; 0 on failure (message printed). */
static inline ex_dptr ex_alloc(size_t bytes) {
    ex_dptr p = 0;
    if (!ex_cu_ok(ex_cu.cuMemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc")) return 0;
    return p;
}
static inline void ex_free(ex_dptr p) {
    if (p) ex_cu.cuMemFree(p);
}
static inline int ex_upload(ex_dptr dst, const void *src, size_t bytes) {
    return ex_cu_ok(ex_cu.cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}
static inline int ex_download(void *dst, ex_dptr src, size_t bytes) {
    return ex_cu_ok(ex_cu.cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}
/* Fill with one byte value: 0xFF makes every bf16, fp16 and float a NaN, so
 * an output the kernel forgot to write cannot pass for a result. */
static inline int ex_poison(ex_dptr dst, size_t bytes) {
    return ex_cu_ok(ex_cu.cuMemsetD8(dst, 0xFF, bytes), "cuMemsetD8");
}
static inline int ex_sync(void) { return ex_cu_ok(ex_cu.cuCtxSynchronize(), "cuCtxSynchronize"); }
/* A device pointer as flexgen's argument structs take it. */
static inline void *ex_ptr(ex_dptr p) { return (void *)(uintptr_t)p; }

/* The stream-capture entry points, all found (see ex_cuda_lookup). */
static inline int ex_cuda_has_graphs(void) {
    return ex_cu.cuStreamCreate && ex_cu.cuStreamDestroy && ex_cu.cuStreamSynchronize &&
           ex_cu.cuStreamBeginCapture && ex_cu.cuStreamEndCapture && ex_cu.cuGraphInstantiate &&
           ex_cu.cuGraphLaunch && ex_cu.cuGraphExecDestroy && ex_cu.cuGraphDestroy;
}

/* GPU time between two events on the default stream. */
typedef struct ex_timer {
    void *start, *stop;
} ex_timer;
static inline int ex_timer_create(ex_timer *t) {
    t->start = t->stop = NULL;
    return ex_cu_ok(ex_cu.cuEventCreate(&t->start, 0), "cuEventCreate") &&
           ex_cu_ok(ex_cu.cuEventCreate(&t->stop, 0), "cuEventCreate");
}
static inline void ex_timer_destroy(ex_timer *t) {
    if (t->start) ex_cu.cuEventDestroy(t->start);
    if (t->stop) ex_cu.cuEventDestroy(t->stop);
    t->start = t->stop = NULL;
}
static inline void ex_timer_begin(ex_timer *t) { ex_cu.cuEventRecord(t->start, NULL); }
/* Milliseconds since ex_timer_begin (waits for the GPU); -1 on error. */
static inline double ex_timer_end(ex_timer *t) {
    float ms = -1.0f;
    ex_cu.cuEventRecord(t->stop, NULL);
    if (!ex_cu_ok(ex_cu.cuEventSynchronize(t->stop), "cuEventSynchronize")) return -1.0;
    if (!ex_cu_ok(ex_cu.cuEventElapsedTime(&ms, t->start, t->stop), "cuEventElapsedTime"))
        return -1.0;
    return ms;
}

/* Wall-clock milliseconds (host side: compile times, launch overhead). */
static inline double ex_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ------------------------------------------------------------------------- */
/* flexgen statuses                                                          */
/* ------------------------------------------------------------------------- */

/* Print what went wrong (with the caret diagnostic for errors in mod text)
 * and return the example's exit status: a missing GPU is not a failure of
 * the example, so FG_ERR_NO_DEVICE gives 0 after the usual line. */
static inline int ex_report(fg_ctx *ctx, fg_status st, const char *what) {
    if (st == FG_ERR_NO_DEVICE) {
        if (ctx) snprintf(ex_cu.why, sizeof ex_cu.why, "%s", fg_errmsg(ctx));
        ex_no_gpu();
        return 0;
    }
    fprintf(stderr, "%s failed: %s\n", what, fg_status_string(st));
    if (ctx) {
        fprintf(stderr, "%s\n", fg_error_diagnostic(ctx));
        if (st == FG_ERR_COMPILE) fprintf(stderr, "%s\n", fg_compile_log(ctx));
    }
    return 1;
}

/* Run a flexgen call; on failure report it, set `rc` and jump to `done`. */
#define EX_TRY(ctx, call)                                     \
    do {                                                      \
        fg_status ex_st_ = (call);                            \
        if (ex_st_ != FG_OK) {                                \
            rc = ex_report((ctx), ex_st_, #call);             \
            goto done;                                        \
        }                                                     \
    } while (0)

/* Same for a condition that the example checks itself. */
#define EX_REQUIRE(cond, ...)                                 \
    do {                                                      \
        if (!(cond)) {                                        \
            fprintf(stderr, __VA_ARGS__);                     \
            fputc('\n', stderr);                              \
            rc = 1;                                           \
            goto done;                                        \
        }                                                     \
    } while (0)

/* ------------------------------------------------------------------------- */
/* Host data                                                                 */
/* ------------------------------------------------------------------------- */

/* bf16 is the top half of a float; round to nearest even, keep NaN a NaN. */
static inline uint16_t ex_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float ex_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* xorshift64*: the same inputs on every run and every machine. */
static inline double ex_uniform(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (double)((x * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}

/* n bf16 values uniform in [-1, 1); NULL when out of memory. */
static inline uint16_t *ex_random_bf16(size_t n, uint64_t *state) {
    uint16_t *p = malloc(n * sizeof *p);
    if (!p) return NULL;
    for (size_t i = 0; i < n; i++) p[i] = ex_bf16((float)(2.0 * ex_uniform(state) - 1.0));
    return p;
}

/* Sum of the values and of their magnitudes: a number a person can compare
 * between runs, and a count of the values that are not finite. */
typedef struct ex_checksum {
    double sum, abs_sum;
    size_t nonfinite;
} ex_checksum;
static inline ex_checksum ex_checksum_bf16(const uint16_t *p, size_t n) {
    ex_checksum c = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        double v = ex_float(p[i]);
        if (!isfinite(v)) {
            c.nonfinite++;
            continue;
        }
        c.sum += v;
        c.abs_sum += fabs(v);
    }
    return c;
}

/* ------------------------------------------------------------------------- */
/* Checking GPU rows against the CPU reference                               */
/* ------------------------------------------------------------------------- */

/* Strides in elements for (b, h, s, d); all zero in the args means
 * contiguous [B][H][S][D]. */
static inline void ex_strides(const int64_t given[4], int heads, int len, int dim, int64_t s[4]) {
    if (!given[0] && !given[1] && !given[2] && !given[3]) {
        s[3] = 1;
        s[2] = dim;
        s[1] = (int64_t)len * dim;
        s[0] = (int64_t)heads * len * dim;
    } else {
        memcpy(s, given, 4 * sizeof s[0]);
    }
}

typedef struct ex_error {
    double out_rel;  /* ||out - ref|| / ||ref|| over the rows compared          */
    double lse_max;  /* max |lse - ref| / (1 + |ref|)                           */
    size_t nonfinite;/* non-finite GPU outputs among them (rows masked entirely
                        have LSE -inf on both sides and do not count)           */
} ex_error;

/* Tolerances of the bf16 forward (the library's own GPU tests use these). */
#define EX_BF16_OUT_TOL 1e-2
#define EX_LSE_TOL 1e-3

static inline int ex_error_ok(const ex_error *e) {
    return e->out_rel <= EX_BF16_OUT_TOL && e->lse_max <= EX_LSE_TOL && e->nonfinite == 0;
}

/* Compare rows [row0, row0 + rows) of every (b, h) of a bf16 GPU result with
 * fg_attention_reference. `host` is the GPU call's arguments with host
 * copies of q, k and v in place of the device pointers (same strides) and
 * `binds` bound to host memory; `out` (with host->out_stride) and `lse`
 * (contiguous [B][Hq][Q_LEN]) are the downloaded results. The reference runs
 * on just those rows: it sees them through a shifted q pointer and a larger
 * q_offset, so the mods see the same indices the GPU saw. */
static inline fg_status ex_compare_rows(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *host,
                                 const fg_binding *binds, size_t nbinds, const uint16_t *out,
                                 const float *lse, int row0, int rows, ex_error *err) {
    int B = host->batch, H = host->heads_q, D = host->head_dim, Q = host->q_len;
    int64_t qs[4], os[4];
    ex_strides(host->q_stride, H, Q, D, qs);
    ex_strides(host->out_stride, H, Q, D, os);

    fg_attention_args r = *host;
    r.q = (const uint16_t *)host->q + (int64_t)row0 * qs[2];
    memcpy(r.q_stride, qs, sizeof qs);
    r.q_len = rows;
    r.q_offset = host->q_offset + row0;
    r.block_mask = NULL; /* dense: the reference evaluates mask_mod everywhere */
    r.binds = binds;
    r.nbinds = nbinds;
    r.lse = NULL;
    r.stream = NULL;

    size_t n = (size_t)B * H * rows;
    double *ref = malloc(n * D * sizeof *ref), *ref_lse = malloc(n * sizeof *ref_lse);
    r.out = ref; /* the reference writes to `ref`; it checks that out is set */
    fg_status st = FG_ERR_OUT_OF_MEMORY;
    if (ref && ref_lse) st = fg_attention_reference(ctx, mod, &r, ref, ref_lse);
    if (st == FG_OK) {
        double diff2 = 0, ref2 = 0;
        memset(err, 0, sizeof *err);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < rows; i++) {
                    size_t row = ((size_t)b * H + h) * rows + i;
                    const uint16_t *o = out + b * os[0] + h * os[1] + (row0 + i) * os[2];
                    for (int d = 0; d < D; d++) {
                        double g = ex_float(o[d]), x = ref[row * D + d];
                        if (!isfinite(g)) err->nonfinite++;
                        diff2 += (g - x) * (g - x);
                        ref2 += x * x;
                    }
                    double gl = lse[((size_t)b * H + h) * Q + row0 + i], xl = ref_lse[row];
                    double e = (isinf(gl) && isinf(xl) && (gl < 0) == (xl < 0))
                                   ? 0.0 : fabs(gl - xl) / (1.0 + fabs(xl));
                    if (!(e <= err->lse_max)) err->lse_max = e; /* NaN sticks */
                }
        /* All rows masked: both sides are zero, the error is zero. */
        err->out_rel = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    }
    free(ref);
    free(ref_lse);
    return st;
}

/* The larger of two errors, for reporting several slices as one. */
static inline void ex_error_merge(ex_error *into, const ex_error *e) {
    if (!(e->out_rel <= into->out_rel)) into->out_rel = e->out_rel;
    if (!(e->lse_max <= into->lse_max)) into->lse_max = e->lse_max;
    into->nonfinite += e->nonfinite;
}

/* Forward FLOPs the way FlexAttention counts them: 4 * B * H * Q * KV * D
 * times the fraction of blocks that are not empty. */
static inline double ex_tflops(const fg_attention_args *a, double density, double ms) {
    double flops = 4.0 * a->batch * a->heads_q * (double)a->q_len * a->kv_len * a->head_dim * density;
    return ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0;
}

#endif
