/*
 * jit.h -- NVRTC compilation (nvrtc.c) and the kernel cache (cache.c).
 *
 * A kernel is asked for by a spec: the caller's key (the canonical text of
 * everything that selects the generated source: canonical mods, template
 * name and a hash of its text, dtype, head dim, block sizes, feature flags)
 * plus a callback that generates the source, called only on a miss. The
 * cache completes the key with the arch, the NVRTC version, the compile
 * options and the cache format version, then looks in memory, then on disk,
 * then compiles. Thread-safe: concurrent requests for one key compile once;
 * the others wait for that compile.
 */
#ifndef FLEXGEN_JIT_H
#define FLEXGEN_JIT_H

#include "driver/cudrv.h"
#include "internal.h"

typedef fg_status (*fgi_source_fn)(fg_ctx *ctx, void *arg, char **source /* malloc'd */);

typedef struct fgi_kernel_spec {
    const char *key;        /* canonical selection text (see above)         */
    const char *name;       /* readable, for file names: "attention_fwd-causal" */
    const char *entry;      /* extern "C" __global__ function to load       */
    const char *arch;       /* NULL: fgi_effective_arch(ctx)                */
    fgi_source_fn gen_source;
    void *gen_arg;
} fgi_kernel_spec;

/* NVRTC: compile `source` for `arch` to PTX or cubin (no GPU needed). The
 * options are the canonical set (-std=c++17, --gpu-architecture, -lineinfo
 * off, fast-math off, ...). On failure: FG_ERR_COMPILE, log on ctx. `image`
 * is malloc'd. `log` (may be NULL) receives the malloc'd log. */
fg_status fgi_nvrtc_compile(fg_ctx *ctx, const char *source, const char *name, const char *arch,
                            fg_emit_kind kind, void **image, size_t *size, char **log);
/* The same with ptxas's report in the log ("--ptxas-options=-v": registers,
 * spills, and its performance notes such as C7514, a serialised wgmma
 * pipeline). For tests and tuning: cached kernels never use it. */
fg_status fgi_nvrtc_compile_verbose(fg_ctx *ctx, const char *source, const char *name, const char *arch,
                                    fg_emit_kind kind, void **image, size_t *size, char **log);
/* "13.0" style version string of the NVRTC linked in. */
const char *fgi_nvrtc_version(void);
/* Whether compiles go through flexgen's private NVRTC instance (nvrtc.c
 * says why). */
bool fgi_nvrtc_private(void);
/* The compile options as one canonical string (part of every cache key). */
const char *fgi_nvrtc_options_text(void);

/* The cubin for a spec: memory cache, then disk cache, then NVRTC. The
 * returned image is owned by the cache and lives until
 * fg_cache_forget_memory. Works without a GPU. */
fg_status fgi_cache_get_image(fg_ctx *ctx, const fgi_kernel_spec *spec, const void **image,
                              size_t *size);

/* The loaded function for a spec in ctx's CUDA context (loads the image's
 * module once per CUDA context and keeps it). Needs a GPU. */
fg_status fgi_cache_get_function(fg_ctx *ctx, const fgi_kernel_spec *spec, CUfunction *fn);

/* The disk cache file a spec maps to under ctx's folder and arch
 * ("<dir>/<name>-<16 hex>.fgbin"), malloc'd; for tests and tools. */
fg_status fgi_cache_file_path(fg_ctx *ctx, const fgi_kernel_spec *spec, char **path);
/* The cache folder without a context's option ($FLEXGEN_CACHE_DIR,
 * $XDG_CACHE_HOME/flexgen, ~/.cache/flexgen), malloc'd; NULL if none. */
char *fgi_cache_default_folder(void);
/* mkdir -p, mode 0700; whether the folder exists afterwards. */
bool fgi_cache_make_dirs(const char *dir);

/* One disk cache file, as `flexgen cache list` shows it. */
typedef struct fgi_cache_file {
    const char *name;   /* file name inside the folder */
    uint64_t size;      /* bytes                       */
    int64_t mtime;      /* seconds since the epoch; last use (hits touch it) */
} fgi_cache_file;
typedef void (*fgi_cache_list_fn)(void *arg, const fgi_cache_file *file);
/* Call `fn` for every cache file in ctx's folder, most recently used first.
 * A folder that does not exist yet lists nothing. FG_ERR_CACHE when the
 * folder cannot be determined or read. */
fg_status fgi_cache_list(fg_ctx *ctx, fgi_cache_list_fn fn, void *arg);

#endif
