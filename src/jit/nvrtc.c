/*
 * nvrtc.c -- CUDA source to PTX or cubin with NVRTC, no GPU needed.
 *
 * The generated source is self-contained: it includes no header (the
 * templates' common part defines the few types and intrinsics the kernels
 * use), so a compile reads nothing from disk and gives the same binary on
 * every machine with the same NVRTC. That is what lets the options and the
 * NVRTC version stand in for "how it was built" in the cache key.
 *
 * The option set is fixed and short:
 *   -std=c++17          the templates use if constexpr and constexpr helpers;
 *   -default-device     helper functions without __device__ are device code;
 *   --gpu-architecture  sm_XY[a] for a cubin, compute_XY[a] for PTX.
 * Deliberately absent: --use_fast_math. It would flush denormals, swap in
 * approximate division and square roots and turn expf into ex2.approx
 * everywhere, including inside user score_mods (an ALiBi slope, a soft-cap
 * tanh), where the user wrote exact arithmetic. The kernels call the fast
 * intrinsics explicitly where the online softmax can afford them.
 * -lineinfo is also off: it is debugging metadata that does not change
 * speed but makes every cubin larger.
 *
 * The log is always fetched: on failure it is the diagnosis (the #line
 * directives make it point at the user's mod file), on success it carries
 * warnings, which are kept on the context too.
 */
#include "jit/jit.h"

#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The fixed options, and the same list as one string for the cache key. */
#define FGI_NVRTC_STD "-std=c++17"
#define FGI_NVRTC_DEVICE "-default-device"
static const char options_text[] = FGI_NVRTC_STD " " FGI_NVRTC_DEVICE;

const char *fgi_nvrtc_options_text(void) { return options_text; }

static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static char version_text[32] = "unknown";

static void read_version(void) {
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) == NVRTC_SUCCESS)
        snprintf(version_text, sizeof version_text, "%d.%d", major, minor);
}

const char *fgi_nvrtc_version(void) {
    pthread_once(&version_once, read_version);
    return version_text;
}

/* "sm_90a" -> "compute_90a" for PTX, "compute_80" -> "sm_80" for a cubin:
 * the caller names a machine, the kind decides which spelling NVRTC needs. */
static bool target_option(const char *arch, fg_emit_kind kind, char *out, size_t n) {
    const char *digits;
    if (strncmp(arch, "sm_", 3) == 0) digits = arch + 3;
    else if (strncmp(arch, "compute_", 8) == 0) digits = arch + 8;
    else return false;
    if (!*digits || strlen(digits) > 8) return false;
    for (const char *p = digits; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == 'a' || *p == 'f')) return false;
    snprintf(out, n, "--gpu-architecture=%s%s", kind == FG_EMIT_PTX ? "compute_" : "sm_", digits);
    return true;
}

static char *fetch_log(nvrtcProgram prog) {
    size_t n = 0;
    if (nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0) return NULL;
    char *log = malloc(n + 1);
    if (!log) return NULL;
    if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[n] = 0;
    /* NVRTC's empty log is "\0"; treat it as no log. */
    if (!log[0]) {
        free(log);
        return NULL;
    }
    return log;
}

/* The first line of the log that mentions an error, for the one-line
 * message; the whole log stays available through fg_compile_log. */
static void first_error_line(const char *log, char *out, size_t n) {
    out[0] = 0;
    if (!log) return;
    const char *hit = strstr(log, "error");
    if (!hit) hit = log;
    const char *start = hit;
    while (start > log && start[-1] != '\n') start--;
    const char *end = strchr(start, '\n');
    size_t len = end ? (size_t)(end - start) : strlen(start);
    if (len >= n) len = n - 1;
    memcpy(out, start, len);
    out[len] = 0;
}

static fg_status fetch_image(fg_ctx *ctx, nvrtcProgram prog, fg_emit_kind kind, void **image,
                             size_t *size) {
    size_t n = 0;
    nvrtcResult r = kind == FG_EMIT_PTX ? nvrtcGetPTXSize(prog, &n) : nvrtcGetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0)
        return fgi_error(ctx, FG_ERR_COMPILE, "NVRTC produced no %s: %s",
                         kind == FG_EMIT_PTX ? "PTX" : "cubin", nvrtcGetErrorString(r));
    char *buf = malloc(n);
    if (!buf) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (%zu-byte image)", n);
    r = kind == FG_EMIT_PTX ? nvrtcGetPTX(prog, buf) : nvrtcGetCUBIN(prog, buf);
    if (r != NVRTC_SUCCESS) {
        free(buf);
        return fgi_error(ctx, FG_ERR_COMPILE, "NVRTC: %s", nvrtcGetErrorString(r));
    }
    *image = buf;
    *size = n;
    return FG_OK;
}

/* Runs with `prog` created; the caller destroys it whatever happens. */
static fg_status compile_program(fg_ctx *ctx, nvrtcProgram prog, const char *name,
                                 const char *target, bool verbose, fg_emit_kind kind, void **image,
                                 size_t *size, char **log_out) {
    const char *opts[] = {FGI_NVRTC_STD, FGI_NVRTC_DEVICE, target, "--ptxas-options=-v"};
    const int nopts = (int)(sizeof opts / sizeof opts[0]) - (verbose ? 0 : 1);
    nvrtcResult r = nvrtcCompileProgram(prog, nopts, opts);
    char *log = fetch_log(prog);
    fg_status st = FG_OK;
    if (r != NVRTC_SUCCESS) {
        char first[400];
        first_error_line(log, first, sizeof first);
        fgi_set_compile_log(ctx, log ? log : nvrtcGetErrorString(r));
        st = fgi_error(ctx, FG_ERR_COMPILE, "NVRTC could not compile %s for %s (%s): %s", name,
                       target + strlen("--gpu-architecture="), nvrtcGetErrorString(r),
                       first[0] ? first : "no log");
    } else {
        if (log) fgi_set_compile_log(ctx, log);
        st = fetch_image(ctx, prog, kind, image, size);
    }
    if (log_out) *log_out = log;
    else free(log);
    return st;
}

static fg_status nvrtc_compile(fg_ctx *ctx, const char *source, const char *name, const char *arch,
                               bool verbose, fg_emit_kind kind, void **image, size_t *size, char **log) {
    FGI_CHECK_ARG(ctx, source && image && size, "NULL source or output");
    FGI_CHECK_ARG(ctx, kind == FG_EMIT_PTX || kind == FG_EMIT_CUBIN, "unknown output kind %d",
                  (int)kind);
    *image = NULL;
    *size = 0;
    if (log) *log = NULL;
    if (!arch || !*arch) arch = fgi_effective_arch(ctx);
    char target[64];
    FGI_CHECK_ARG(ctx, target_option(arch, kind, target, sizeof target),
                  "invalid arch '%s' (expected e.g. sm_80, sm_90a)", arch);
    char file[160];
    snprintf(file, sizeof file, "%s.cu", name && *name ? name : "flexgen");
    nvrtcProgram prog;
    nvrtcResult r = nvrtcCreateProgram(&prog, source, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return fgi_error(ctx, r == NVRTC_ERROR_OUT_OF_MEMORY ? FG_ERR_OUT_OF_MEMORY : FG_ERR_COMPILE,
                         "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
    fg_status st = compile_program(ctx, prog, file, target, verbose, kind, image, size, log);
    nvrtcDestroyProgram(&prog);
    return st;
}

fg_status fgi_nvrtc_compile(fg_ctx *ctx, const char *source, const char *name, const char *arch,
                            fg_emit_kind kind, void **image, size_t *size, char **log) {
    return nvrtc_compile(ctx, source, name, arch, false, kind, image, size, log);
}

fg_status fgi_nvrtc_compile_verbose(fg_ctx *ctx, const char *source, const char *name, const char *arch,
                                    fg_emit_kind kind, void **image, size_t *size, char **log) {
    return nvrtc_compile(ctx, source, name, arch, true, kind, image, size, log);
}
