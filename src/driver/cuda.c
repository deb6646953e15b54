/*
 * cuda.c -- the CUDA Driver API, loaded with dlopen on first use.
 *
 * libflexgen never links libcuda. Everything that launches no kernel
 * (parsing, emitting, NVRTC, CPU block masks, the CPU reference) must work on
 * a machine with the toolkit but no driver, and every GPU call there must
 * come back as FG_ERR_NO_DEVICE with a message that says what is missing.
 *
 * Loading happens once per process (pthread_once): open libcuda.so.1 (the
 * name the driver installs; plain libcuda.so is the toolkit's link-time stub
 * and is tried last), look every entry point up, cuInit(0), count devices.
 * The outcome -- a table of function pointers or a failure message -- is
 * kept, so a second call on a machine without a driver fails the same way
 * without retrying. $FLEXGEN_LIBCUDA names another library to open (tests
 * use it to load the stub and see cuInit fail).
 *
 * Symbol names: cuda.h maps many functions to versioned symbols by macro
 * (cuMemAlloc -> cuMemAlloc_v2). Stringising the macro-expanded name
 * (FGI_STR) asks dlsym for exactly the symbol the header's prototype
 * describes, so the pointer type and the function always agree. The same
 * header would map some names to per-thread-default-stream variants (_ptds,
 * _ptsz) if CUDA_API_PER_THREAD_DEFAULT_STREAM were defined; flexgen uses
 * the legacy default stream, so that macro must stay undefined here and the
 * loader refuses any such name.
 *
 * Contexts: a caller that already has a CUDA context current (the CUDA
 * runtime, PyTorch) keeps it; flexgen adopts it and records its device.
 * Otherwise flexgen retains the device's primary context and makes it
 * current. Each device's primary context is also retained once for the
 * whole process ("pinned"): the kernel cache keeps modules loaded per
 * context, and a primary context whose last retain is released is torn
 * down, which would leave those modules dangling.
 */

#include "driver/cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "flexgen uses the legacy default stream: do not define CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

#define FGI_STR2(x) #x
#define FGI_STR(x) FGI_STR2(x)

/* Required entry points: every member of fgi_cu_api except the optional
 * ones below. The macro argument is expanded before stringising, so the
 * name is the versioned symbol. */
#define FGI_CU_REQUIRED(X)                                                                    \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)       \
    X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice)       \
    X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)           \
    X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree)   \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemcpyDtoD) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)  \
    X(cuMemsetD8) X(cuMemsetD32) X(cuMemsetD8Async) X(cuMemsetD32Async) X(cuStreamCreate)      \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuEventCreate) X(cuEventDestroy)               \
    X(cuEventRecord) X(cuEventSynchronize) X(cuEventElapsedTime) X(cuPointerGetAttribute)
#define FGI_CU_OPTIONAL(X)                                                                   \
    X(cuCtxGetId) X(cuTensorMapEncodeTiled) X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemPoolCreate) \
    X(cuMemPoolSetAttribute) X(cuMemAllocFromPoolAsync) X(cuStreamBeginCapture) X(cuStreamEndCapture) \
    X(cuStreamIsCapturing) X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphDestroy)       \
    X(cuGraphExecDestroy) X(cuGraphGetNodes) X(cuGraphNodeGetType) X(cuStreamWaitEvent)           \
    X(cuMemcpy2DAsync) X(cuFuncLoad) X(cuLaunchKernelEx) X(cuMemAllocHost) X(cuMemFreeHost)        \
    X(cuOccupancyMaxActiveClusters)

typedef struct fgi_cu_sym {
    const char *name;
    size_t offset;
} fgi_cu_sym;

#define FGI_CU_SYM(fn) {FGI_STR(fn), offsetof(fgi_cu_api, fn)},
static const fgi_cu_sym required_syms[] = {FGI_CU_REQUIRED(FGI_CU_SYM)};
static const fgi_cu_sym optional_syms[] = {FGI_CU_OPTIONAL(FGI_CU_SYM)};
#undef FGI_CU_SYM

/* ---- the process-wide loader ------------------------------------------- */

#define FGI_MAX_PINNED 64

static struct {
    pthread_once_t once;
    fg_status status;        /* FG_OK or FG_ERR_NO_DEVICE                   */
    char message[512];
    void *lib;
    fgi_cu_api api;
    int device_count;
    pthread_mutex_t pin_lock;
    CUcontext pinned[FGI_MAX_PINNED]; /* per device ordinal, NULL until used */
    CUmemoryPool ws_pool[FGI_MAX_PINNED]; /* the same; under pin_lock       */
} g = {.once = PTHREAD_ONCE_INIT, .pin_lock = PTHREAD_MUTEX_INITIALIZER};

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
static void load_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    g.status = FG_ERR_NO_DEVICE;
    vsnprintf(g.message, sizeof g.message, fmt, ap);
    va_end(ap);
}

/* Ask the driver for a result's name, tolerating a driver so broken that
 * cuGetErrorName itself is missing. */
static const char *result_name(CUresult r) {
    const char *s = NULL;
    if (g.api.cuGetErrorName && g.api.cuGetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
    return "CUDA_ERROR_UNKNOWN";
}

static const char *result_string(CUresult r) {
    const char *s = NULL;
    if (g.api.cuGetErrorString && g.api.cuGetErrorString(r, &s) == CUDA_SUCCESS && s) return s;
    return "unrecognised error code";
}

static void *open_library(void) {
    const char *forced = getenv("FLEXGEN_LIBCUDA");
    if (forced && *forced) {
        void *h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!h) load_fail("no CUDA driver: %s could not be opened (%s)", forced, dlerror());
        return h;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h) return h;
    char first[256];
    snprintf(first, sizeof first, "%s", dlerror());
    h = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) load_fail("no CUDA driver: libcuda.so.1 not found (%s)", first);
    return h;
}

static bool resolve(const fgi_cu_sym *syms, size_t n, bool required) {
    for (size_t i = 0; i < n; i++) {
        if (strstr(syms[i].name, "_ptds") || strstr(syms[i].name, "_ptsz")) {
            load_fail("internal error: %s is a per-thread-stream symbol", syms[i].name);
            return false;
        }
        void *fn = dlsym(g.lib, syms[i].name);
        if (!fn && required) {
            load_fail("no usable CUDA driver: libcuda lacks %s (driver too old?)", syms[i].name);
            return false;
        }
        memcpy((char *)&g.api + syms[i].offset, &fn, sizeof fn);
    }
    return true;
}

static void load_once(void) {
    g.status = FG_OK;
    g.lib = open_library();
    if (!g.lib) return;
    if (!resolve(required_syms, sizeof required_syms / sizeof required_syms[0], true) ||
        !resolve(optional_syms, sizeof optional_syms / sizeof optional_syms[0], false)) {
        memset(&g.api, 0, sizeof g.api);
        return;
    }
    CUresult r = g.api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        /* The stub cannot name its own errors; say what code 34 means. */
        char what[200];
        if (r == CUDA_ERROR_STUB_LIBRARY)
            snprintf(what, sizeof what, "CUDA_ERROR_STUB_LIBRARY: the toolkit's stub libcuda was "
                                        "loaded, no driver is installed");
        else
            snprintf(what, sizeof what, "error %d %s: %s", (int)r, result_name(r), result_string(r));
        load_fail("no CUDA device: cuInit failed (%s)", what);
        return;
    }
    int n = 0;
    r = g.api.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        load_fail("no CUDA device: the driver reports %s",
                  r == CUDA_SUCCESS ? "zero devices" : result_name(r));
        return;
    }
    g.device_count = n;
}

static fg_status ensure_loaded(fg_ctx *ctx) {
    pthread_once(&g.once, load_once);
    if (g.status != FG_OK) return fgi_error(ctx, g.status, "%s", g.message);
    return FG_OK;
}

const fgi_cu_api *fgi_cu(void) { return &g.api; }

fg_status fgi_cu_status(fg_ctx *ctx, CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return FG_OK;
    fg_status st = FG_ERR_CUDA;
    if (r == CUDA_ERROR_NO_DEVICE || r == CUDA_ERROR_NOT_INITIALIZED ||
        r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH || r == CUDA_ERROR_STUB_LIBRARY)
        st = FG_ERR_NO_DEVICE;
    return fgi_error(ctx, st, "%s: %s: %s", what ? what : "CUDA call", result_name(r),
                     result_string(r));
}

/* Retain `dev`'s primary context once for the process (see the essay). */
static fg_status pin_primary(fg_ctx *ctx, int ordinal, CUdevice dev) {
    if (ordinal < 0 || ordinal >= FGI_MAX_PINNED) return FG_OK;
    fg_status st = FG_OK;
    pthread_mutex_lock(&g.pin_lock);
    if (!g.pinned[ordinal]) {
        CUcontext c = NULL;
        CUresult r = g.api.cuDevicePrimaryCtxRetain(&c, dev);
        if (r == CUDA_SUCCESS) g.pinned[ordinal] = c;
        else st = fgi_cu_status(ctx, r, "cuDevicePrimaryCtxRetain");
    }
    pthread_mutex_unlock(&g.pin_lock);
    return st;
}

/* The library's own stream-ordered pool for a device, made on first use:
 * it keeps up to FGI_WS_POOL_KEEP bytes reserved when a stream
 * synchronises, where the device's default pool gives everything back.
 * A serving loop that synchronises every step would otherwise have each
 * decode call map its workspace afresh (~200 us of host time per call,
 * measured on the H100); and the application's own pool keeps its
 * settings. */
#define FGI_WS_POOL_KEEP ((cuuint64_t)64 << 20)

fg_status fgi_cuda_ws_pool(fg_ctx *ctx, CUmemoryPool *pool) {
    *pool = NULL;
    if (!g.api.cuMemPoolCreate || !g.api.cuMemPoolSetAttribute || !g.api.cuMemAllocFromPoolAsync) return FG_OK;
    CUdevice dev;
    FGI_CU_TRY(ctx, g.api.cuCtxGetDevice(&dev), "cuCtxGetDevice");
    if (dev < 0 || dev >= FGI_MAX_PINNED) return FG_OK;
    fg_status st = FG_OK;
    pthread_mutex_lock(&g.pin_lock);
    if (!g.ws_pool[dev]) {
        CUmemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev;
        CUmemoryPool p = NULL;
        CUresult r = g.api.cuMemPoolCreate(&p, &props);
        cuuint64_t keep = FGI_WS_POOL_KEEP;
        if (r == CUDA_SUCCESS) r = g.api.cuMemPoolSetAttribute(p, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
        if (r == CUDA_SUCCESS) g.ws_pool[dev] = p;
        else st = fgi_cu_status(ctx, r, "cuMemPoolCreate");
    }
    *pool = g.ws_pool[dev];
    pthread_mutex_unlock(&g.pin_lock);
    return st;
}

bool fgi_cuda_context_is_pinned(CUcontext cu) {
    if (!cu) return false;
    bool found = false;
    pthread_mutex_lock(&g.pin_lock);
    for (int i = 0; i < FGI_MAX_PINNED && !found; i++) found = g.pinned[i] == cu;
    pthread_mutex_unlock(&g.pin_lock);
    return found;
}

/* ---- per-context state -------------------------------------------------- */

struct fgi_cuda_state {
    bool have_device;  /* dev / cc / arch describe a device                 */
    int described;     /* ordinal described, or ADOPTED                     */
    int ordinal;       /* ordinal of the retained primary context           */
    CUdevice dev;
    int cc_major, cc_minor;
    int sm_count;      /* streaming multiprocessors                         */
    double dram_per_clock; /* peak DRAM bytes per SM clock, 0 unknown        */
    char arch[16];     /* "sm_90a"                                          */
    CUcontext retained;/* primary context retained by this ctx, or NULL     */
    CUdevice retained_dev;
};

static struct fgi_cuda_state *state_of(fg_ctx *ctx) {
    if (!ctx->cuda) {
        ctx->cuda = calloc(1, sizeof *ctx->cuda);
        if (ctx->cuda) ctx->cuda->ordinal = ctx->cuda->described = -1;
    }
    return ctx->cuda;
}

/* The target NVRTC should build for: the "a" variants on Hopper and
 * Blackwell unlock wgmma / tcgen05, which the kernels use. */
static void arch_for(int major, int minor, char *out, size_t n) {
    if ((major == 9 || major == 10) && minor == 0) snprintf(out, n, "sm_%d%da", major, minor);
    else snprintf(out, n, "sm_%d%d", major, minor);
}

#define ADOPTED (-2)

/* Peak DRAM bytes per SM clock cycle: memory clock (kHz) x 2 (double data
 * rate) x bus width (bits) / 8, over the SMs x their clock (kHz); 0 where
 * the driver does not say (the decode kernel's L2 prefetch choice,
 * fgi_dec_l2_prefetch_at, then keeps its default). */
static double dram_per_sm_clock(CUdevice dev, int sms) {
    int mem_khz = 0, bus_bits = 0, sm_khz = 0;
    if (g.api.cuDeviceGetAttribute(&mem_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, dev) != CUDA_SUCCESS ||
        g.api.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, dev) != CUDA_SUCCESS ||
        g.api.cuDeviceGetAttribute(&sm_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev) != CUDA_SUCCESS)
        return 0;
    if (mem_khz <= 0 || bus_bits <= 0 || sm_khz <= 0 || sms <= 0) return 0;
    return 2.0 * mem_khz * (bus_bits / 8.0) / ((double)sms * sm_khz);
}

static fg_status describe_device(fg_ctx *ctx, struct fgi_cuda_state *s, CUdevice dev, int described) {
    int major = 0, minor = 0;
    FGI_CU_TRY(ctx, g.api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
               "cuDeviceGetAttribute(compute capability)");
    FGI_CU_TRY(ctx, g.api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
               "cuDeviceGetAttribute(compute capability)");
    int sms = 0;
    FGI_CU_TRY(ctx, g.api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
               "cuDeviceGetAttribute(multiprocessor count)");
    s->dev = dev;
    s->cc_major = major;
    s->cc_minor = minor;
    s->sm_count = sms;
    s->dram_per_clock = dram_per_sm_clock(dev, sms);
    arch_for(major, minor, s->arch, sizeof s->arch);
    s->have_device = true;
    s->described = described;
    return FG_OK;
}

/* The caller's own context is used as it is. It is not pinned: retaining a
 * primary context the caller does not use would create one (and its
 * memory) for nothing; modules in it are simply left to the driver. */
static fg_status adopt_current(fg_ctx *ctx, struct fgi_cuda_state *s) {
    CUdevice dev;
    FGI_CU_TRY(ctx, g.api.cuCtxGetDevice(&dev), "cuCtxGetDevice");
    if (!s->have_device || s->dev != dev || s->described != ADOPTED)
        FGI_TRY(describe_device(ctx, s, dev, ADOPTED));
    return FG_OK;
}

static void release_retained(struct fgi_cuda_state *s) {
    if (s->retained) g.api.cuDevicePrimaryCtxRelease(s->retained_dev);
    s->retained = NULL;
}

static fg_status make_primary_current(fg_ctx *ctx, struct fgi_cuda_state *s) {
    if (ctx->device >= g.device_count)
        return fgi_error(ctx, FG_ERR_NO_DEVICE, "no CUDA device %d (the driver reports %d)",
                         ctx->device, g.device_count);
    if (!s->retained || s->ordinal != ctx->device) {
        release_retained(s);
        CUdevice dev;
        FGI_CU_TRY(ctx, g.api.cuDeviceGet(&dev, ctx->device), "cuDeviceGet");
        FGI_TRY(pin_primary(ctx, ctx->device, dev));
        CUcontext c;
        FGI_CU_TRY(ctx, g.api.cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
        s->retained = c;
        s->retained_dev = dev;
        s->ordinal = ctx->device;
    }
    if (!s->have_device || s->described != ctx->device)
        FGI_TRY(describe_device(ctx, s, s->retained_dev, ctx->device));
    FGI_CU_TRY(ctx, g.api.cuCtxSetCurrent(s->retained), "cuCtxSetCurrent");
    return FG_OK;
}

fg_status fgi_cuda_ready(fg_ctx *ctx) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_TRY(ensure_loaded(ctx));
    struct fgi_cuda_state *s = state_of(ctx);
    if (!s) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    CUcontext cur = NULL;
    FGI_CU_TRY(ctx, g.api.cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
    if (cur && cur != s->retained) return adopt_current(ctx, s);
    if (cur && s->ordinal == ctx->device) return FG_OK;
    return make_primary_current(ctx, s);
}

fg_status fgi_cuda_current(fg_ctx *ctx, CUcontext *cu, uint64_t *id) {
    FGI_TRY(fgi_cuda_ready(ctx));
    CUcontext c = NULL;
    FGI_CU_TRY(ctx, g.api.cuCtxGetCurrent(&c), "cuCtxGetCurrent");
    unsigned long long cid = (unsigned long long)(uintptr_t)c;
    if (g.api.cuCtxGetId) FGI_CU_TRY(ctx, g.api.cuCtxGetId(c, &cid), "cuCtxGetId");
    if (cu) *cu = c;
    if (id) *id = cid;
    return FG_OK;
}

fg_status fgi_cuda_arch(fg_ctx *ctx, int *major, int *minor) {
    FGI_TRY(fgi_cuda_ready(ctx));
    if (major) *major = ctx->cuda->cc_major;
    if (minor) *minor = ctx->cuda->cc_minor;
    return FG_OK;
}

fg_status fgi_cuda_sm_count(fg_ctx *ctx, int *count) {
    FGI_TRY(fgi_cuda_ready(ctx));
    *count = ctx->cuda->sm_count > 0 ? ctx->cuda->sm_count : 1;
    return FG_OK;
}

/* ctx's device described (cached in its state), or NULL where there is no
 * usable one. Never records an error: a failed query must not overwrite
 * the caller's last error, so the description is made with a NULL
 * context. */
static const struct fgi_cuda_state *described(fg_ctx *ctx) {
    struct fgi_cuda_state *s = ctx->cuda;
    if (s && s->have_device && (s->described == ADOPTED || s->described == ctx->device)) return s;
    pthread_once(&g.once, load_once);
    if (g.status != FG_OK || ctx->device >= g.device_count) return NULL;
    s = state_of(ctx);
    CUdevice dev;
    if (!s || g.api.cuDeviceGet(&dev, ctx->device) != CUDA_SUCCESS) return NULL;
    if (describe_device(NULL, s, dev, ctx->device) != FG_OK) return NULL;
    return s;
}

/* Never fails and never records an error: with no usable device the answer
 * is the default target, so compiling works on a machine without a GPU. */
const char *fgi_effective_arch(fg_ctx *ctx) {
    static const char fallback[] = "sm_90a";
    if (!ctx) return fallback;
    if (ctx->arch[0]) return ctx->arch;
    const struct fgi_cuda_state *s = described(ctx);
    return s ? s->arch : fallback;
}

double fgi_cuda_dram_per_sm_clock(fg_ctx *ctx) {
    const struct fgi_cuda_state *s = ctx ? described(ctx) : NULL;
    return s ? s->dram_per_clock : 0;
}

void fgi_cuda_state_free(struct fgi_cuda_state *s) {
    if (!s) return;
    release_retained(s);
    free(s);
}
