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
 *
 * A private NVRTC. NVRTC keeps state from one compile to the next within a
 * process: with NVRTC 13.0, after a compile with -Ofc=mid or -Ofc=max the
 * next compile of the same source with the same options gives another
 * cubin, and -Ofc=0 does not undo it. Inside a PyTorch process flexgen
 * shares the NVRTC it was linked against with PyTorch's libraries; a
 * compile of theirs once turned flexgen's Hopper backward into a cubin
 * with 512 bytes of stack that ran 4x slower, which the disk cache then
 * kept under the usual key. So compiles go through an instance of their
 * own: a copy of the same library file (its state lives in that file's
 * image, one per loaded object), kept in the cache folder as
 * nvrtc/libnvrtc-<hash of the file's path, size, time, inode>.so and
 * loaded with dlopen beside the original: the dynamic loader shares an
 * object only with a load of the same path or the same file, so the copy
 * is a second instance (the builtins library they load is one, and holds
 * no such state). The copy is made once per NVRTC file and machine (109
 * MB for NVRTC 13.0), on the first compile. Where it cannot be made or
 * loaded, or does not compile an empty kernel, or $FLEXGEN_PRIVATE_NVRTC
 * is 0, the linked instance serves (fgi_nvrtc_private tells which).
 */
#include "jit/jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The fixed options, and the same list as one string for the cache key. */
#define FGI_NVRTC_STD "-std=c++17"
#define FGI_NVRTC_DEVICE "-default-device"
static const char options_text[] = FGI_NVRTC_STD " " FGI_NVRTC_DEVICE;

const char *fgi_nvrtc_options_text(void) { return options_text; }

/* The NVRTC entry points this file calls, as X(field, symbol), and the
 * table of them: the private instance's, or the linked ones. */
#define NVRTC_ENTRY_POINTS(X)                                                                     \
    X(create, nvrtcCreateProgram)                                                                 \
    X(destroy, nvrtcDestroyProgram)                                                               \
    X(compile, nvrtcCompileProgram)                                                               \
    X(log_size, nvrtcGetProgramLogSize)                                                           \
    X(log, nvrtcGetProgramLog)                                                                    \
    X(ptx_size, nvrtcGetPTXSize)                                                                  \
    X(ptx, nvrtcGetPTX)                                                                           \
    X(cubin_size, nvrtcGetCUBINSize)                                                              \
    X(cubin, nvrtcGetCUBIN)                                                                       \
    X(error_string, nvrtcGetErrorString)

#define NVRTC_FIELD(field, symbol) __typeof__(&symbol) field;
static struct {
    pthread_once_t once;
    bool is_private;
    NVRTC_ENTRY_POINTS(NVRTC_FIELD)
} api = {.once = PTHREAD_ONCE_INIT};

/* Room for a path and a suffix of ours (PATH_MAX is 4096 on Linux). */
enum { PATH_ROOM = 4096 + 64 };

/* `src` copied to `dst` through a temporary file in dst's folder and a
 * rename, so that a reader sees the whole copy or none. */
static bool copy_file(const char *src, const char *dst) {
    char tmp[PATH_ROOM];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dst, (long)getpid()) >= (int)sizeof tmp) return false;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return false;
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    bool ok = out >= 0;
    static char buf[1 << 16]; /* one caller at a time: under load_api's once */
    for (ssize_t n; ok && (n = read(in, buf, sizeof buf)) != 0;) {
        if (n < 0) ok = false;
        for (ssize_t off = 0; ok && off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w <= 0) ok = false;
            else off += w;
        }
    }
    close(in);
    if (out >= 0 && close(out) != 0) ok = false;
    if (ok && rename(tmp, dst) != 0) ok = false;
    if (!ok) unlink(tmp);
    return ok;
}

/* The private copy of `linked`, the linked NVRTC's file: its path
 * (malloc'd), made if missing; NULL where it cannot be. */
static char *private_copy(const char *linked) {
    struct stat st;
    if (stat(linked, &st) != 0) return NULL;
    char *root = fgi_cache_default_folder();
    if (!root) return NULL;
    char key[PATH_ROOM + 64];
    snprintf(key, sizeof key, "%s\n%lld\n%lld\n%llu", linked, (long long)st.st_size,
             (long long)st.st_mtime, (unsigned long long)st.st_ino);
    const uint64_t h = fgi_fnv1a(FGI_FNV_SEED, key, strlen(key));
    char *path = malloc(strlen(root) + 64);
    if (path) sprintf(path, "%s/nvrtc", root);
    const bool dir_ok = path && fgi_cache_make_dirs(path);
    free(root);
    if (!dir_ok) {
        free(path);
        return NULL;
    }
    sprintf(path + strlen(path), "/libnvrtc-%016llx.so", (unsigned long long)h);
    struct stat cs;
    if ((stat(path, &cs) != 0 || cs.st_size != st.st_size) && !copy_file(linked, path)) {
        free(path);
        return NULL;
    }
    return path;
}

/* NVRTC opens its builtins library by name at its first compile; the
 * copy's folder has none, so the one beside `linked` is loaded first (a
 * later open by that name finds it loaded). */
static void preload_builtins(const char *linked) {
    int major = 0, minor = 0;
    if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return;
    const char *slash = strrchr(linked, '/');
    char path[PATH_ROOM];
    const int dir = slash ? (int)(slash - linked) : 0;
    if (snprintf(path, sizeof path, "%.*s%slibnvrtc-builtins.so.%d.%d", dir, linked, slash ? "/" : "", major,
                 minor) < (int)sizeof path)
        (void)dlopen(path, RTLD_NOW | RTLD_LOCAL); /* kept for the process */
}

static bool load_private(void) {
    const char *off = getenv("FLEXGEN_PRIVATE_NVRTC");
    if (off && strcmp(off, "0") == 0) return false;
    Dl_info info;
    if (!dladdr((void *)nvrtcCompileProgram, &info) || !info.dli_fname) return false;
    char *path = private_copy(info.dli_fname);
    if (!path) return false;
    preload_builtins(info.dli_fname);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    free(path);
    if (!h) return false;
    void *f;
    /* dlsym's object pointer to a function pointer: POSIX guarantees the
     * conversion; memcpy spells it without a cast C11 frowns on */
#define NVRTC_PRIVATE(field, symbol)                                                              \
    if (!(f = dlsym(h, #symbol))) {                                                                \
        dlclose(h);                                                                                \
        return false;                                                                              \
    }                                                                                              \
    memcpy(&api.field, &f, sizeof f);
    NVRTC_ENTRY_POINTS(NVRTC_PRIVATE)
    /* It must compile too (its builtins library found): an empty kernel
     * to PTX, once per process, before the first real compile. */
    nvrtcProgram prog;
    if (api.create(&prog, "extern \"C\" __global__ void probe() {}\n", "probe.cu", 0, NULL, NULL) !=
        NVRTC_SUCCESS) {
        dlclose(h);
        return false;
    }
    const char *opts[] = {"--gpu-architecture=compute_80"};
    const bool ok = api.compile(prog, 1, opts) == NVRTC_SUCCESS;
    api.destroy(&prog);
    if (!ok) dlclose(h);
    return ok;
}

static void load_api(void) {
    api.is_private = load_private();
    if (api.is_private) return;
#define NVRTC_LINKED(field, symbol) api.field = symbol;
    NVRTC_ENTRY_POINTS(NVRTC_LINKED)
}

bool fgi_nvrtc_private(void) {
    pthread_once(&api.once, load_api);
    return api.is_private;
}

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
    if (api.log_size(prog, &n) != NVRTC_SUCCESS || n == 0) return NULL;
    char *log = malloc(n + 1);
    if (!log) return NULL;
    if (api.log(prog, log) != NVRTC_SUCCESS) {
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
    nvrtcResult r = kind == FG_EMIT_PTX ? api.ptx_size(prog, &n) : api.cubin_size(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0)
        return fgi_error(ctx, FG_ERR_COMPILE, "NVRTC produced no %s: %s",
                         kind == FG_EMIT_PTX ? "PTX" : "cubin", api.error_string(r));
    char *buf = malloc(n);
    if (!buf) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (%zu-byte image)", n);
    r = kind == FG_EMIT_PTX ? api.ptx(prog, buf) : api.cubin(prog, buf);
    if (r != NVRTC_SUCCESS) {
        free(buf);
        return fgi_error(ctx, FG_ERR_COMPILE, "NVRTC: %s", api.error_string(r));
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
    nvrtcResult r = api.compile(prog, nopts, opts);
    char *log = fetch_log(prog);
    fg_status st = FG_OK;
    if (r != NVRTC_SUCCESS) {
        char first[400];
        first_error_line(log, first, sizeof first);
        fgi_set_compile_log(ctx, log ? log : api.error_string(r));
        st = fgi_error(ctx, FG_ERR_COMPILE, "NVRTC could not compile %s for %s (%s): %s", name,
                       target + strlen("--gpu-architecture="), api.error_string(r),
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
    pthread_once(&api.once, load_api);
    if (!arch || !*arch) arch = fgi_effective_arch(ctx);
    char target[64];
    FGI_CHECK_ARG(ctx, target_option(arch, kind, target, sizeof target),
                  "invalid arch '%s' (expected e.g. sm_80, sm_90a)", arch);
    char file[160];
    snprintf(file, sizeof file, "%s.cu", name && *name ? name : "flexgen");
    nvrtcProgram prog;
    nvrtcResult r = api.create(&prog, source, file, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return fgi_error(ctx, r == NVRTC_ERROR_OUT_OF_MEMORY ? FG_ERR_OUT_OF_MEMORY : FG_ERR_COMPILE,
                         "nvrtcCreateProgram: %s", api.error_string(r));
    fg_status st = compile_program(ctx, prog, file, target, verbose, kind, image, size, log);
    api.destroy(&prog);
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
