/*
 * kernel.c -- the fg_kernel object and what every attention-family launch
 * does with it, whatever the operation: forward (forward.c), and later the
 * backward's three kernels, split-KV decode and its merge.
 *
 * A kernel is made from one registry row (codegen/kernels.h) for one mod and
 * config: the cache hands back the module (compiling on a miss), every entry
 * point of the row is looked up in it, and the device is checked once for
 * what the row needs (compute capability, each entry point's shared memory).
 * A launch is then, for any operation:
 *   1. the operation's own argument checks (shapes against the kernel);
 *   2. fgi_kernel_check_context: CUDA ready, the kernel's context current;
 *   3. the operation fills its argument block (its .def file);
 *   4. fgi_kernel_pack_params: the mod's parameters resolved (fgi_bind) and
 *      packed into the by-value struct fg_mod_params the emitted code
 *      declares;
 *   5. fgi_kernel_run per entry point: cuLaunchKernel on the caller's stream
 *      with the grid the operation computes and the block size and shared
 *      memory the row's geometry gives.
 * Nothing here synchronises: errors the driver finds at launch come back as
 * FG_ERR_CUDA with its message; faults inside a kernel surface at the
 * caller's next synchronisation, as with any CUDA launch.
 */
#include "attention/attention.h"

#include "codegen/codegen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- making one ------------------------------------------------------------- */

static fg_status copy_params(fg_ctx *ctx, const fg_mod *mod, fg_mod *dst) {
    fgi_arena_init(&dst->arena);
    dst->name = fgi_arena_strdup(&dst->arena, mod->name ? mod->name : "mod");
    dst->nparams = mod->nparams;
    if (mod->nparams > 0) {
        dst->params = fgi_arena_alloc(&dst->arena, sizeof(fgi_param) * (size_t)mod->nparams);
        if (!dst->params) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (kernel)");
        for (int i = 0; i < mod->nparams; i++) {
            dst->params[i] = mod->params[i];
            dst->params[i].name = fgi_arena_strdup(&dst->arena, mod->params[i].name);
            if (!dst->params[i].name)
                return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (kernel)");
        }
    }
    if (!dst->name) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (kernel)");
    dst->hash = mod->hash;
    return FG_OK;
}

/* The device must be new enough for the row and give a block the shared
 * memory each entry point needs; a function's dynamic limit is raised past
 * 48 KB. */
static fg_status prepare_functions(fg_ctx *ctx, fg_kernel *k) {
    int major = 0, minor = 0;
    FGI_TRY(fgi_cuda_arch(ctx, &major, &minor));
    const int need = k->kernel->min_cc;
    if (major * 10 + minor < need)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "%s needs compute capability %d.%d or newer (device: %d.%d)",
                         k->kernel->what, need / 10, need % 10, major, minor);
    CUdevice dev;
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxGetDevice(&dev), "cuCtxGetDevice");
    int optin = 0;
    FGI_CU_TRY(ctx,
               fgi_cu()->cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                              dev),
               "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
    for (int i = 0; i < k->nentries; i++) {
        const size_t smem = k->geom[i].smem;
        if (smem > (size_t)optin)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "head dim %d needs %zu bytes of shared memory per block; the device allows %d",
                             k->config.head_dim, smem, optin);
        if (smem > 48 * 1024)
            FGI_CU_TRY(ctx,
                       fgi_cu()->cuFuncSetAttribute(k->fn[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                    (int)smem),
                       "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    }
    return FG_OK;
}

fg_status fgi_kernel_choose(fg_ctx *ctx, const fgi_kernel_entry *asked, const fg_kernel_config *config,
                            bool allow_hopper, const fgi_kernel_entry **row) {
    int major = 0, minor = 0;
    FGI_TRY(fgi_cuda_arch(ctx, &major, &minor));
    const bool hopper = major == 9 && minor == 0 && fgi_cu()->cuTensorMapEncodeTiled;
    *row = asked;
    if (asked->variant == FGI_VARIANT_SM90) {
        if (!hopper)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "the Hopper kernel needs compute capability 9.0 and a driver with "
                             "cuTensorMapEncodeTiled (device: %d.%d)",
                             major, minor);
        return FG_OK;
    }
    const fgi_kernel_entry *h = fgi_kernel_lookup(asked->op, FGI_VARIANT_SM90);
    if (allow_hopper && hopper && h && fgi_kernel_applies(h, config)) *row = h;
    return FG_OK;
}

fg_status fgi_kernel_make(fg_ctx *ctx, const fg_mod *mod, const fgi_kernel_entry *row,
                          const fg_kernel_config *config, fg_kernel **out) {
    *out = NULL;
    fgi_codegen cg;
    FGI_TRY(fgi_codegen_init_kernel(ctx, mod, row, config, &cg));
    fg_kernel *k = calloc(1, sizeof *k);
    fg_status st = k ? FG_OK : fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (kernel)");
    if (st == FG_OK) {
        k->kernel = cg.kernel;
        k->config = cg.config;
        k->config.arch = NULL; /* cg's copy goes with it */
        for (int i = 0; i < FGI_KERNEL_MAX_ENTRIES && row->entries[i]; i++) {
            if (row->geometry) k->geom[i] = row->geometry(&k->config, mod, i);
            k->nentries = i + 1;
        }
        st = copy_params(ctx, mod, &k->params);
        const unsigned split_flags = fgi_kernel_split_flags(cg.kernel, &k->config);
        k->index_floats = (split_flags & FGI_SPLIT_INDEX_FLOATS) && fgi_split_casts_indices(mod);
        k->dist_floats = (split_flags & FGI_SPLIT_DIST_FLOATS) && fgi_split_casts_distance(mod);
    }
    if (st == FG_OK && (row->pieces & FGI_PIECE_GRAD)) {
        fgi_mod_grad g;
        st = fgi_mod_derive(ctx, mod, &g);
        if (st == FG_OK) {
            fgi_grad_layout_compute(&g, &k->grads);
            fgi_mod_grad_free(&g);
        }
    }
    for (int i = 0; st == FG_OK && i < k->nentries; i++) {
        fgi_kernel_spec spec = cg.spec;
        spec.entry = row->entries[i];
        st = fgi_cache_get_function(ctx, &spec, &k->fn[i]);
    }
    fgi_codegen_free(&cg);
    if (st == FG_OK) {
        CUcontext cu;
        st = fgi_cuda_current(ctx, &cu, &k->cu_id);
    }
    if (st == FG_OK) st = prepare_functions(ctx, k);
    if (st != FG_OK) {
        fg_kernel_release(k);
        return st;
    }
    *out = k;
    return FG_OK;
}

/* Kernels that read no mod (the merge, the partial sums) are still made
 * and cached per mod, like every other: they are made for the identity
 * score_mod, parsed once per process. */
static struct {
    pthread_once_t once;
    fg_mod *mod;
    fg_status status;
} identity = {PTHREAD_ONCE_INIT, NULL, FG_OK};

static void make_identity(void) {
    fg_ctx *ctx;
    identity.status = fg_ctx_create(&ctx);
    if (identity.status != FG_OK) return;
    identity.status = fg_mod_from_expr(ctx, FG_SCORE_MOD, "score", NULL, 0, &identity.mod);
    fg_ctx_destroy(ctx);
}

fg_status fgi_kernel_make_modless(fg_ctx *ctx, fgi_kernel_op op, fg_dtype dtype, fg_kernel **out) {
    *out = NULL;
    pthread_once(&identity.once, make_identity);
    if (identity.status != FG_OK)
        return fgi_error(ctx, identity.status, "the identity mod of the kernels without a mod could not be made");
    FGI_TRY(fgi_cuda_ready(ctx));
    fg_kernel_config cfg = fg_kernel_config_init();
    cfg.dtype = dtype;
    return fgi_kernel_make(ctx, identity.mod, fgi_kernel_lookup(op, FGI_VARIANT_PORTABLE), &cfg, out);
}

fg_kernel_kind fg_kernel_kind_of(const fg_kernel *k) { return k ? k->kernel->kind : (fg_kernel_kind)0; }

void fg_kernel_release(fg_kernel *k) {
    if (!k) return;
    fgi_arena_free(&k->params.arena);
    free(k);
}

/* ---- launching one ------------------------------------------------------------ */

fg_status fgi_kernel_check_context(fg_ctx *ctx, const fg_kernel *k) {
    FGI_TRY(fgi_cuda_ready(ctx));
    CUcontext cu;
    uint64_t id;
    FGI_TRY(fgi_cuda_current(ctx, &cu, &id));
    if (id != k->cu_id)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the kernel was loaded in another CUDA context than the current one");
    return FG_OK;
}

fg_status fgi_kernel_pack_params(fg_ctx *ctx, const fg_kernel *k, const fg_binding *binds, size_t nbinds,
                                 fgi_param_blob *blob, fgi_value *bound) {
    fgi_value own[FGI_MAX_PARAMS];
    fgi_value *values = bound ? bound : own;
    FGI_TRY(fgi_bind(ctx, &k->params, binds, nbinds, values));
    fgi_param_layout layout;
    fgi_param_layout_compute(&k->params, &layout);
    fgi_param_pack(&k->params, &layout, values, blob->bytes);
    return FG_OK;
}

static fg_status launch_status(fg_ctx *ctx, const fg_kernel *k, int entry, CUresult r, const char *call) {
    if (r == CUDA_SUCCESS) return FG_OK;
    char what[96]; /* on the error path only: a launch is microseconds */
    snprintf(what, sizeof what, "%s(%s)", call, k->kernel->entries[entry]);
    return fgi_cu_status(ctx, r, what);
}

fg_status fgi_kernel_run(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], void **args,
                         void *stream) {
    const fgi_kernel_geom *g = &k->geom[entry];
    CUresult r = fgi_cu()->cuLaunchKernel(k->fn[entry], grid[0], grid[1], grid[2], (unsigned)g->threads, 1, 1,
                                          (unsigned)g->smem, (CUstream)stream, args, NULL);
    return launch_status(ctx, k, entry, r, "cuLaunchKernel");
}

/* A cuLaunchKernelEx configuration of entry geometry `g` over `grid` on
 * `stream` with the one attribute `attr`. */
static CUlaunchConfig launch_config(const fgi_kernel_geom *g, const unsigned grid[3], void *stream,
                                    CUlaunchAttribute *attr) {
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = grid[0], cfg.gridDimY = grid[1], cfg.gridDimZ = grid[2];
    cfg.blockDimX = (unsigned)g->threads, cfg.blockDimY = 1, cfg.blockDimZ = 1;
    cfg.sharedMemBytes = (unsigned)g->smem;
    cfg.hStream = (CUstream)stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

/* Thread block clusters of `n` blocks along x. */
static CUlaunchAttribute cluster_attr(int n) {
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = (unsigned)n, attr.value.clusterDim.y = 1, attr.value.clusterDim.z = 1;
    return attr;
}

int fgi_kernel_clusters(fg_ctx *ctx, fg_kernel *k, int entry, int n) {
    if (n < 2 || n > FGI_CLUSTER_MAX || entry < 0 || entry >= k->nentries) return 0;
    int have = atomic_load_explicit(&k->clusters[entry][n], memory_order_relaxed);
    if (have) return have - 1;
    int fit = 0, major = 0, bin = 0;
    if (fgi_cuda_arch(ctx, &major, NULL) == FG_OK && major >= 9 && fgi_cu()->cuLaunchKernelEx &&
        fgi_cu()->cuOccupancyMaxActiveClusters &&
        fgi_cu()->cuFuncGetAttribute(&bin, CU_FUNC_ATTRIBUTE_BINARY_VERSION, k->fn[entry]) == CUDA_SUCCESS &&
        bin >= 90) {
        CUlaunchAttribute attr = cluster_attr(n);
        const unsigned one[3] = {(unsigned)n, 1, 1};
        const CUlaunchConfig cfg = launch_config(&k->geom[entry], one, NULL, &attr);
        if (fgi_cu()->cuOccupancyMaxActiveClusters(&fit, k->fn[entry], &cfg) != CUDA_SUCCESS || fit < 0) fit = 0;
    }
    atomic_store_explicit(&k->clusters[entry][n], fit + 1, memory_order_relaxed);
    return fit;
}

fg_status fgi_kernel_run_cluster(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], int cluster_x,
                                 void **args, void *stream) {
    CUlaunchAttribute attr = cluster_attr(cluster_x);
    const CUlaunchConfig cfg = launch_config(&k->geom[entry], grid, stream, &attr);
    CUresult r = fgi_cu()->cuLaunchKernelEx(&cfg, k->fn[entry], args, NULL);
    return launch_status(ctx, k, entry, r, "cuLaunchKernelEx");
}

fg_status fgi_kernel_run_dependent(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], void **args,
                                   void *stream) {
    int major = 0;
    FGI_TRY(fgi_cuda_arch(ctx, &major, NULL));
    if (major < 9 || !fgi_cu()->cuLaunchKernelEx) return fgi_kernel_run(ctx, k, entry, grid, args, stream);
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    const CUlaunchConfig cfg = launch_config(&k->geom[entry], grid, stream, &attr);
    CUresult r = fgi_cu()->cuLaunchKernelEx(&cfg, k->fn[entry], args, NULL);
    return launch_status(ctx, k, entry, r, "cuLaunchKernelEx");
}
