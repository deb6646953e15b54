/*
 * nccl.c -- NCCL loaded with dlopen, for the K/V ring of context parallelism.
 *
 * Like libcuda (cuda.c), libnccl is never linked: a program that runs on one
 * GPU must not need it, and one that runs the ring must be able to use the
 * NCCL it already has (PyTorch's wheel, the system's libnccl2). So it is
 * opened by name on first use: $FLEXGEN_NCCL_LIB when set (the exact file),
 * else libnccl.so.2 (the runtime's soname), else libnccl.so (a development
 * install). Every entry point the ring needs is looked up by name, and
 * ncclGetVersion must say 2.7 or newer (ncclSend / ncclRecv).
 *
 * A failure is FG_ERR_NOT_SUPPORTED, not FG_ERR_NO_DEVICE: the GPU may be
 * fine; what is missing is a library this configuration (more than one
 * rank) needs, and the message names the file tried and what to do.
 *
 * The process-wide library is opened once (pthread_once) and its outcome
 * kept, as for libcuda. The opening itself is a plain function of the path
 * (fgi_nccl_lib_open), and the once-wrapper only calls it with NULL ("what
 * the environment says") and caches the result: tests open other files,
 * missing ones included, in the same process, and check the once-wrapper
 * by setting $FLEXGEN_NCCL_LIB before its first use.
 *
 * Types: NCCL's enums are ints and its communicator is a pointer; they are
 * declared in nccl.h with NCCL's documented values instead of including
 * NCCL's header, which a build machine need not have.
 */
#include "driver/nccl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FGI_NCCL_SYMS(X)                                                                    \
    X(ncclGetVersion) X(ncclGetErrorString) X(ncclCommCount) X(ncclCommUserRank)            \
    X(ncclCommCuDevice) X(ncclGroupStart) X(ncclGroupEnd) X(ncclSend) X(ncclRecv) X(ncclAllReduce)

typedef struct fgi_nccl_sym {
    const char *name;
    size_t offset;
} fgi_nccl_sym;

#define FGI_NCCL_SYM(fn) {#fn, offsetof(fgi_nccl_api, fn)},
static const fgi_nccl_sym syms[] = {FGI_NCCL_SYMS(FGI_NCCL_SYM)};
#undef FGI_NCCL_SYM

int fgi_nccl_version_normalise(int code) {
    /* 2.9 and later: 2 * 10000 + 9 * 100 + patch = 20900 and up; before:
     * 2 * 1000 + minor * 100 + patch, under 10000. */
    if (code >= 10000) return code;
    return (code / 1000) * 10000 + (code % 1000 / 100) * 100 + code % 100;
}

#define NOT_FOUND_HINT                                                                      \
    "install NCCL 2.7 or newer (the libnccl2 package, or the nvidia-nccl-cu12 wheel) and "   \
    "put its folder on LD_LIBRARY_PATH, or set FLEXGEN_NCCL_LIB to the library file"

/* Open `path` (or what the environment names) into lib; on failure leave
 * nothing open and write the reason into msg. */
static fg_status open_lib(const char *path, fgi_nccl_lib *lib, char *msg, size_t n) {
    memset(lib, 0, sizeof *lib);
    const char *env = getenv("FLEXGEN_NCCL_LIB");
    bool from_env = !path && env && *env;
    if (from_env) path = env;
    if (path) {
        snprintf(lib->path, sizeof lib->path, "%s", path);
        lib->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib->handle) {
            const char *why = dlerror();
            if (from_env)
                snprintf(msg, n,
                         "NCCL could not be loaded: FLEXGEN_NCCL_LIB names %s, which could not be "
                         "opened (%s); point FLEXGEN_NCCL_LIB at NCCL's libnccl.so.2, or unset it to "
                         "search the default names",
                         path, why ? why : "no reason given");
            else
                snprintf(msg, n, "NCCL could not be loaded: %s could not be opened (%s); give the path of NCCL's libnccl.so.2",
                         path, why ? why : "no reason given");
            return FG_ERR_NOT_SUPPORTED;
        }
    } else {
        snprintf(lib->path, sizeof lib->path, "libnccl.so.2");
        lib->handle = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!lib->handle) {
            char first[256];
            const char *why = dlerror();
            snprintf(first, sizeof first, "%s", why ? why : "no reason given");
            snprintf(lib->path, sizeof lib->path, "libnccl.so");
            lib->handle = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
            if (!lib->handle) {
                snprintf(msg, n, "NCCL could not be loaded: neither libnccl.so.2 nor libnccl.so could be opened (%s); " NOT_FOUND_HINT,
                         first);
                return FG_ERR_NOT_SUPPORTED;
            }
        }
    }
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *fn = dlsym(lib->handle, syms[i].name);
        if (!fn) {
            snprintf(msg, n,
                     "NCCL could not be loaded: %s has no %s (not NCCL, or an NCCL older than 2.7); "
                     NOT_FOUND_HINT,
                     lib->path, syms[i].name);
            fgi_nccl_lib_close(lib);
            return FG_ERR_NOT_SUPPORTED;
        }
        memcpy((char *)&lib->api + syms[i].offset, &fn, sizeof fn);
    }
    int code = 0;
    fgi_nccl_result r = lib->api.ncclGetVersion(&code);
    if (r != FGI_NCCL_SUCCESS) {
        const char *s = lib->api.ncclGetErrorString(r);
        snprintf(msg, n, "NCCL could not be loaded: ncclGetVersion of %s failed (NCCL error %d: %s)", lib->path, r,
                 s ? s : "no text");
        fgi_nccl_lib_close(lib);
        return FG_ERR_NOT_SUPPORTED;
    }
    lib->version = fgi_nccl_version_normalise(code);
    if (lib->version < FGI_NCCL_MIN_VERSION) {
        snprintf(msg, n,
                 "NCCL could not be loaded: %s is NCCL %d.%d.%d, and the ring needs 2.7 or newer "
                 "(ncclSend / ncclRecv); " NOT_FOUND_HINT,
                 lib->path, lib->version / 10000, lib->version / 100 % 100, lib->version % 100);
        fgi_nccl_lib_close(lib);
        return FG_ERR_NOT_SUPPORTED;
    }
    return FG_OK;
}

fg_status fgi_nccl_lib_open(fg_ctx *ctx, const char *path, fgi_nccl_lib *lib) {
    FGI_CHECK_ARG(ctx, lib, "NULL NCCL library output");
    char msg[1024];
    fg_status st = open_lib(path, lib, msg, sizeof msg);
    if (st != FG_OK) return fgi_error(ctx, st, "%s", msg);
    return FG_OK;
}

void fgi_nccl_lib_close(fgi_nccl_lib *lib) {
    if (!lib) return;
    if (lib->handle) dlclose(lib->handle);
    memset(lib, 0, sizeof *lib);
}

/* ---- the process-wide library ------------------------------------------- */

static struct {
    pthread_once_t once;
    fg_status status;
    char message[1024];
    fgi_nccl_lib lib;
} g = {.once = PTHREAD_ONCE_INIT};

static void load_once(void) { g.status = open_lib(NULL, &g.lib, g.message, sizeof g.message); }

fg_status fgi_nccl_ready(fg_ctx *ctx, const fgi_nccl_lib **lib) {
    if (lib) *lib = NULL;
    pthread_once(&g.once, load_once);
    if (g.status != FG_OK) return fgi_error(ctx, g.status, "%s", g.message);
    if (lib) *lib = &g.lib;
    return FG_OK;
}

static fg_status resolve_lib(fg_ctx *ctx, const fgi_nccl_lib **lib) {
    if (*lib) return FG_OK;
    return fgi_nccl_ready(ctx, lib);
}

/* ---- results -------------------------------------------------------------- */

fg_status fgi_nccl_status(fg_ctx *ctx, const fgi_nccl_lib *lib, fgi_nccl_result r, const char *what) {
    if (r == FGI_NCCL_SUCCESS) return FG_OK;
    if (!lib) {
        /* a result from the process-wide library: it is loaded by now */
        pthread_once(&g.once, load_once);
        if (g.status == FG_OK) lib = &g.lib;
    }
    const char *text = lib && lib->api.ncclGetErrorString ? lib->api.ncclGetErrorString(r) : NULL;
    fg_status st = r == FGI_NCCL_INVALID_ARGUMENT || r == FGI_NCCL_INVALID_USAGE ? FG_ERR_INVALID_ARGUMENT
                                                                                 : FG_ERR_CUDA;
    return fgi_error(ctx, st, "%s: NCCL error %d: %s", what ? what : "NCCL call", r,
                     text ? text : "unrecognised NCCL result");
}

#define NCCL_TRY(ctx, lib, call, what)                                         \
    do {                                                                       \
        fgi_nccl_result fgi_nr_ = (call);                                      \
        if (fgi_nr_ != FGI_NCCL_SUCCESS) return fgi_nccl_status((ctx), (lib), fgi_nr_, (what)); \
    } while (0)

fg_status fgi_nccl_dtype_of(fg_ctx *ctx, fg_dtype dtype, fgi_nccl_dtype *out) {
    FGI_CHECK_ARG(ctx, out, "NULL output");
    switch (dtype) {
    case FG_BF16: *out = FGI_NCCL_BFLOAT16; return FG_OK;
    case FG_FP16: *out = FGI_NCCL_FLOAT16; return FG_OK;
    }
    return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "dtype %d is neither FG_BF16 nor FG_FP16", (int)dtype);
}

/* ---- communicators and the ring step ----------------------------------- */

fg_status fgi_nccl_comm_info_get(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm,
                                 fgi_nccl_comm_info *info) {
    FGI_CHECK_ARG(ctx, comm && info, "NULL NCCL communicator or output");
    FGI_TRY(resolve_lib(ctx, &lib));
    fgi_nccl_comm c = (fgi_nccl_comm)comm;
    fgi_nccl_comm_info got = {-1, 0, -1};
    NCCL_TRY(ctx, lib, lib->api.ncclCommCount(c, &got.size), "ncclCommCount");
    NCCL_TRY(ctx, lib, lib->api.ncclCommUserRank(c, &got.rank), "ncclCommUserRank");
    NCCL_TRY(ctx, lib, lib->api.ncclCommCuDevice(c, &got.device), "ncclCommCuDevice");
    if (got.size < 1 || got.rank < 0 || got.rank >= got.size)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "NCCL communicator reports rank %d of %d", got.rank,
                         got.size);
    *info = got;
    return FG_OK;
}

fg_status fgi_nccl_group(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm, const fgi_nccl_op *ops, int nops,
                         void *stream) {
    FGI_CHECK_ARG(ctx, comm && (ops || nops == 0), "NULL NCCL communicator or ops");
    FGI_CHECK_ARG(ctx, nops >= 0 && nops <= FGI_NCCL_MAX_OPS, "NCCL group of %d ops: 0..%d", nops,
                  FGI_NCCL_MAX_OPS);
    bool any = false;
    for (int i = 0; i < nops; i++) {
        FGI_CHECK_ARG(ctx, ops[i].buf || !ops[i].bytes, "ring transfer: %s buffer %d is NULL",
                      ops[i].send ? "send" : "receive", i);
        any |= ops[i].bytes > 0;
    }
    if (!any) return FG_OK;
    FGI_TRY(resolve_lib(ctx, &lib));
    fgi_nccl_comm c = (fgi_nccl_comm)comm;
    NCCL_TRY(ctx, lib, lib->api.ncclGroupStart(), "ncclGroupStart");
    /* The group must be closed whatever happens inside it; the first error
     * is the one reported. Ops of 0 bytes are skipped on both ends (both
     * sizes come from the same plan). Bytes go as ncclUint8. */
    fgi_nccl_result first = FGI_NCCL_SUCCESS;
    const char *what = NULL;
    for (int i = 0; i < nops && first == FGI_NCCL_SUCCESS; i++) {
        const fgi_nccl_op *o = &ops[i];
        if (!o->bytes) continue;
        if (o->send) {
            first = lib->api.ncclSend(o->buf, o->bytes, FGI_NCCL_UINT8, o->peer, c, stream);
            what = "ncclSend";
        } else {
            first = lib->api.ncclRecv(o->buf, o->bytes, FGI_NCCL_UINT8, o->peer, c, stream);
            what = "ncclRecv";
        }
    }
    fgi_nccl_result end = lib->api.ncclGroupEnd();
    if (first != FGI_NCCL_SUCCESS) return fgi_nccl_status(ctx, lib, first, what);
    NCCL_TRY(ctx, lib, end, "ncclGroupEnd");
    return FG_OK;
}

fg_status fgi_nccl_ring_exchange(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm,
                                 const fgi_nccl_transfer *t, void *stream) {
    FGI_CHECK_ARG(ctx, comm && t, "NULL NCCL communicator or transfer");
    FGI_CHECK_ARG(ctx, t->nsend >= 0 && t->nsend <= FGI_NCCL_MAX_BUFS && t->nrecv >= 0 &&
                           t->nrecv <= FGI_NCCL_MAX_BUFS,
                  "ring transfer of %d sends and %d receives: each must be in 0..%d", t->nsend, t->nrecv,
                  FGI_NCCL_MAX_BUFS);
    _Static_assert(2 * FGI_NCCL_MAX_BUFS <= FGI_NCCL_MAX_OPS, "a ring step fits one group");
    fgi_nccl_op ops[FGI_NCCL_MAX_OPS];
    int n = 0;
    for (int i = 0; i < t->nsend; i++)
        ops[n++] = (fgi_nccl_op){true, t->next, (void *)(uintptr_t)t->send_buf[i], t->send_bytes[i]};
    for (int i = 0; i < t->nrecv; i++) ops[n++] = (fgi_nccl_op){false, t->prev, t->recv_buf[i], t->recv_bytes[i]};
    return fgi_nccl_group(ctx, lib, comm, ops, n, stream);
}

fg_status fgi_nccl_sum_i64(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm, void *const bufs[], const size_t counts[],
                           int n, void *stream) {
    FGI_CHECK_ARG(ctx, comm && (bufs || n == 0) && n >= 0, "NULL NCCL communicator or buffers");
    bool any = false;
    for (int i = 0; i < n; i++) {
        FGI_CHECK_ARG(ctx, bufs[i] || !counts[i], "all-reduce: buffer %d is NULL", i);
        any |= counts[i] > 0;
    }
    if (!any) return FG_OK;
    FGI_TRY(resolve_lib(ctx, &lib));
    fgi_nccl_comm c = (fgi_nccl_comm)comm;
    NCCL_TRY(ctx, lib, lib->api.ncclGroupStart(), "ncclGroupStart");
    fgi_nccl_result first = FGI_NCCL_SUCCESS;
    for (int i = 0; i < n && first == FGI_NCCL_SUCCESS; i++)
        if (counts[i]) first = lib->api.ncclAllReduce(bufs[i], bufs[i], counts[i], FGI_NCCL_INT64, FGI_NCCL_SUM, c, stream);
    fgi_nccl_result end = lib->api.ncclGroupEnd();
    if (first != FGI_NCCL_SUCCESS) return fgi_nccl_status(ctx, lib, first, "ncclAllReduce");
    NCCL_TRY(ctx, lib, end, "ncclGroupEnd");
    return FG_OK;
}
