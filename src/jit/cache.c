/*
 * cache.c -- the kernel cache: memory, then disk, then NVRTC.
 *
 * Keys. The caller's spec key says what source will be generated; this file
 * appends how it will be built (arch, NVRTC version, the option string, the
 * cache format version). The result, the "full key", is the identity of a
 * cubin: two requests with equal full keys may share one binary.
 *
 * Memory. One process-wide hash table of entries, guarded by one mutex and
 * one condition variable. An entry is COMPILING, READY or FAILED. The first
 * request for a key inserts a COMPILING entry and builds the image without
 * holding the lock; later requests for that key find the entry and wait on
 * the condition variable, so N threads asking at once cause one compile. A
 * failed build is unlinked from the table at once (a retry builds again);
 * the threads that were waiting for it read the error and log kept on the
 * entry. Entries are reference counted only while a thread is inside a
 * request, so fg_cache_forget_memory can drop an entry another thread is
 * still reading; the last reader frees it.
 *
 * Loaded code. A READY entry keeps, per CUDA context (by the context's
 * unique id, since handles of destroyed contexts get reused), the module
 * loaded from its image and the functions looked up in it by name.
 *
 * Disk. One file per full key: "<name>-<16 hex of the key's hash>.fgbin"
 * holding a 40-byte header, the full key and the image:
 *
 *     0  magic "FLEXGEN\0"     8  format version (u32)   12  zero (u32)
 *     16 key length (u64)      24 image length (u64)     32  FNV-1a 64 of
 *                                                             key + image
 *
 * (host byte order). A file is used only if every field checks out and the
 * stored key equals the full key byte for byte -- so a damaged file, a file
 * from another build, or a hash collision is never loaded; it is counted as
 * a reject, recompiled and replaced. Writers create a temporary file in the
 * same folder and rename() it over the final name: readers see the old file
 * or the new one, never half of one, and two processes racing on a key both
 * end with a valid cubin (the later rename wins; both wrote the same bytes).
 * When a write pushes the folder past its size cap, the least recently used
 * files go first; a disk hit touches its file's mtime to mark the use.
 *
 * The disk cache is an optimisation: any I/O problem falls back to
 * compiling and never fails a request.
 */
#include "jit/jit.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define FGI_CACHE_FORMAT 1u
#define HEADER_SIZE 40
static const char magic[8] = {'F', 'L', 'E', 'X', 'G', 'E', 'N', 0};

/* ---- memory cache structures ------------------------------------------- */

typedef struct fn_rec {
    struct fn_rec *next;
    char *name;
    CUfunction fn;
} fn_rec;

typedef struct mod_rec {
    struct mod_rec *next;
    uint64_t ctx_id;
    CUcontext cu;
    CUmodule module;
    fn_rec *fns;
} mod_rec;

typedef enum { E_COMPILING, E_READY, E_FAILED } entry_state;

typedef struct entry {
    struct entry *next; /* bucket chain                                     */
    char *key;          /* full key                                         */
    uint64_t hash;
    entry_state state;
    bool linked;        /* in the table                                     */
    int refs;           /* threads inside a request holding this entry      */
    void *image;
    size_t size;
    mod_rec *mods;
    fg_status err;      /* FAILED: what the waiters report                  */
    char *errmsg, *errlog;
} entry;

static struct {
    pthread_mutex_t lock;
    pthread_cond_t done;
    entry **buckets;
    size_t nbuckets, count;
    fg_cache_stats stats;
    char **dirs; /* interned folder names handed out by fg_cache_dir */
    size_t ndirs;
} C = {.lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER};

/* ---- stats ------------------------------------------------------------- */

void fg_cache_get_stats(fg_cache_stats *stats) {
    if (!stats) return;
    pthread_mutex_lock(&C.lock);
    *stats = C.stats;
    pthread_mutex_unlock(&C.lock);
}

void fg_cache_reset_stats(void) {
    pthread_mutex_lock(&C.lock);
    memset(&C.stats, 0, sizeof C.stats);
    pthread_mutex_unlock(&C.lock);
}

static void count(uint64_t *counter, double *ms, double add_ms) {
    pthread_mutex_lock(&C.lock);
    if (counter) (*counter)++;
    if (ms) *ms += add_ms;
    pthread_mutex_unlock(&C.lock);
}

/* ---- the table (callers hold C.lock) ----------------------------------- */

static entry *table_find(const char *key, uint64_t hash) {
    if (!C.nbuckets) return NULL;
    for (entry *e = C.buckets[hash % C.nbuckets]; e; e = e->next)
        if (e->hash == hash && strcmp(e->key, key) == 0) return e;
    return NULL;
}

static bool table_grow(void) {
    size_t n = C.nbuckets ? C.nbuckets * 2 : 64;
    entry **b = calloc(n, sizeof *b);
    if (!b) return false;
    for (size_t i = 0; i < C.nbuckets; i++) {
        entry *e = C.buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = b[e->hash % n];
            b[e->hash % n] = e;
            e = next;
        }
    }
    free(C.buckets);
    C.buckets = b;
    C.nbuckets = n;
    return true;
}

static bool table_insert(entry *e) {
    if ((C.count + 1) * 4 > C.nbuckets * 3 && !table_grow() && !C.nbuckets) return false;
    size_t i = e->hash % C.nbuckets;
    e->next = C.buckets[i];
    C.buckets[i] = e;
    e->linked = true;
    C.count++;
    return true;
}

static void table_unlink(entry *e) {
    if (!e->linked) return;
    entry **pp = &C.buckets[e->hash % C.nbuckets];
    while (*pp != e) pp = &(*pp)->next;
    *pp = e->next;
    e->next = NULL;
    e->linked = false;
    C.count--;
}

/* Modules are unloaded only from contexts known to be alive (the pinned
 * primary contexts); a caller's own context may be gone by now, and the
 * driver frees a context's modules with it. */
static void free_entry(entry *e) {
    mod_rec *m = e->mods;
    while (m) {
        mod_rec *next = m->next;
        if (fgi_cu()->cuModuleUnload && fgi_cuda_context_is_pinned(m->cu))
            fgi_cu()->cuModuleUnload(m->module);
        fn_rec *f = m->fns;
        while (f) {
            fn_rec *fnext = f->next;
            free(f->name);
            free(f);
            f = fnext;
        }
        free(m);
        m = next;
    }
    free(e->key);
    free(e->image);
    free(e->errmsg);
    free(e->errlog);
    free(e);
}

static void entry_release(entry *e) {
    pthread_mutex_lock(&C.lock);
    if (--e->refs == 0 && !e->linked) free_entry(e);
    pthread_mutex_unlock(&C.lock);
}

void fg_cache_forget_memory(void) {
    pthread_mutex_lock(&C.lock);
    for (size_t i = 0; i < C.nbuckets; i++) {
        entry **pp = &C.buckets[i];
        while (*pp) {
            entry *e = *pp;
            /* A compile in flight belongs to its thread; it stays. */
            if (e->state == E_COMPILING) {
                pp = &e->next;
                continue;
            }
            *pp = e->next;
            e->next = NULL;
            e->linked = false;
            C.count--;
            if (e->refs == 0) free_entry(e);
        }
    }
    if (C.count == 0) {
        free(C.buckets);
        C.buckets = NULL;
        C.nbuckets = 0;
    }
    pthread_mutex_unlock(&C.lock);
}

/* ---- the folder --------------------------------------------------------- */

static char *join(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 2);
    if (!s) return NULL;
    memcpy(s, a, na);
    s[na] = '/';
    memcpy(s + na + 1, b, nb + 1);
    return s;
}

static const char *nonempty_env(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* Option, $FLEXGEN_CACHE_DIR, $XDG_CACHE_HOME/flexgen, ~/.cache/flexgen.
 * Records nothing on ctx (the request path must not leave errors behind);
 * returns NULL when no folder can be named or memory runs out. */
static char *resolve_dir(const fg_ctx *ctx) {
    if (ctx->cache_dir && *ctx->cache_dir) return strdup(ctx->cache_dir);
    return fgi_cache_default_folder();
}

char *fgi_cache_default_folder(void) {
    const char *v = nonempty_env("FLEXGEN_CACHE_DIR");
    if (v) return strdup(v);
    if ((v = nonempty_env("XDG_CACHE_HOME"))) return join(v, "flexgen");
    const char *home = nonempty_env("HOME");
    if (!home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw && pw->pw_dir && *pw->pw_dir ? pw->pw_dir : NULL;
    }
    return home ? join(home, ".cache/flexgen") : NULL;
}

/* fg_cache_dir hands out a const string that must outlive the call: keep
 * one copy of each distinct folder for the life of the process (a process
 * sees a handful). */
static const char *intern_dir(const char *dir) {
    const char *out = NULL;
    pthread_mutex_lock(&C.lock);
    for (size_t i = 0; i < C.ndirs && !out; i++)
        if (strcmp(C.dirs[i], dir) == 0) out = C.dirs[i];
    if (!out) {
        char **grown = realloc(C.dirs, (C.ndirs + 1) * sizeof *grown);
        char *copy = strdup(dir);
        if (grown) C.dirs = grown;
        if (grown && copy) {
            C.dirs[C.ndirs++] = copy;
            out = copy;
        } else {
            free(copy);
        }
    }
    pthread_mutex_unlock(&C.lock);
    return out;
}

fg_status fg_cache_dir(fg_ctx *ctx, const char **dir) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, dir, "NULL output");
    *dir = NULL;
    char *d = resolve_dir(ctx);
    if (!d)
        return fgi_error(ctx, FG_ERR_CACHE,
                         "no cache folder: set FG_OPT_CACHE_DIR, FLEXGEN_CACHE_DIR, XDG_CACHE_HOME or HOME");
    *dir = intern_dir(d);
    free(d);
    if (!*dir) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    return FG_OK;
}

/* mkdir -p with mode 0700: kernels are private to their user. */
bool fgi_cache_make_dirs(const char *dir) {
    char *p = strdup(dir);
    if (!p) return false;
    bool ok = true;
    for (char *s = p + 1; ok; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0700) != 0 && errno != EEXIST) ok = false;
        *s = c;
        if (!c) break;
    }
    free(p);
    struct stat st;
    return ok && stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_cache_file(const char *name) {
    size_t n = strlen(name), ext = strlen(".fgbin");
    return n > ext && strcmp(name + n - ext, ".fgbin") == 0 && name[0] != '.';
}

/* "<readable name>-<16 hex>.fgbin"; the name keeps [A-Za-z0-9._-] only. */
static char *file_name_for(const char *name, uint64_t hash) {
    char clean[65];
    size_t n = 0;
    for (const char *p = name && *name ? name : "kernel"; *p && n < sizeof clean - 1; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        clean[n++] = ok ? c : '_';
    }
    clean[n] = 0;
    if (clean[0] == '.') clean[0] = '_';
    char *s = malloc(n + 32);
    if (s) snprintf(s, n + 32, "%s-%016llx.fgbin", clean, (unsigned long long)hash);
    return s;
}

/* ---- file I/O ----------------------------------------------------------- */

static bool read_full(int fd, void *buf, size_t n, off_t at) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        at += r;
        n -= (size_t)r;
    }
    return true;
}

static bool write_full(int fd, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= (size_t)r;
    }
    return true;
}

static uint64_t checksum(const char *key, size_t key_len, const void *image, size_t size) {
    return fgi_fnv1a(fgi_fnv1a(FGI_FNV_SEED, key, key_len), image, size);
}

typedef enum { DISK_MISSING, DISK_OK, DISK_REJECT } disk_result;

static disk_result verify_header(const unsigned char *h, size_t key_len, uint64_t file_size,
                                 uint64_t *image_len, uint64_t *sum) {
    uint32_t version;
    uint64_t stored_key_len;
    memcpy(&version, h + 8, 4);
    memcpy(&stored_key_len, h + 16, 8);
    memcpy(image_len, h + 24, 8);
    memcpy(sum, h + 32, 8);
    if (memcmp(h, magic, sizeof magic) != 0 || version != FGI_CACHE_FORMAT) return DISK_REJECT;
    if (stored_key_len != key_len || *image_len == 0) return DISK_REJECT;
    if (*image_len > file_size || file_size - HEADER_SIZE - key_len != *image_len) return DISK_REJECT;
    return DISK_OK;
}

/* Read and verify one file. A missing or unreadable file is MISSING (not the
 * file's fault); anything that contradicts the header or the key is REJECT. */
static disk_result disk_load(const char *path, const char *key, void **image, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return DISK_MISSING;
    size_t key_len = strlen(key);
    struct stat st;
    unsigned char h[HEADER_SIZE];
    uint64_t image_len = 0, sum = 0;
    disk_result res = DISK_REJECT;
    char *stored_key = NULL;
    void *img = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        res = DISK_MISSING;
        goto out;
    }
    if ((uint64_t)st.st_size < HEADER_SIZE + (uint64_t)key_len || !read_full(fd, h, HEADER_SIZE, 0))
        goto out;
    if (verify_header(h, key_len, (uint64_t)st.st_size, &image_len, &sum) != DISK_OK) goto out;
    stored_key = malloc(key_len + 1);
    img = malloc((size_t)image_len);
    if (!stored_key || !img) {
        res = DISK_MISSING;
        goto out;
    }
    if (!read_full(fd, stored_key, key_len, HEADER_SIZE) ||
        !read_full(fd, img, (size_t)image_len, HEADER_SIZE + (off_t)key_len))
        goto out;
    if (memcmp(stored_key, key, key_len) != 0) goto out;
    if (checksum(stored_key, key_len, img, (size_t)image_len) != sum) goto out;
    futimens(fd, NULL); /* LRU: this file was just used */
    *image = img;
    *size = (size_t)image_len;
    img = NULL;
    res = DISK_OK;
out:
    free(stored_key);
    free(img);
    close(fd);
    return res;
}

typedef struct file_info {
    char *name;
    uint64_t size;
    struct timespec mtime;
} file_info;

static void free_files(file_info *f, size_t n) {
    for (size_t i = 0; i < n; i++) free(f[i].name);
    free(f);
}

/* Every cache file in `dir`; false when the folder cannot be read (a
 * missing folder is an empty list). */
static bool scan_dir(const char *dir, file_info **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT;
    file_info *files = NULL;
    size_t n = 0, cap = 0;
    bool ok = true;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        if (!is_cache_file(de->d_name)) continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            file_info *g = realloc(files, cap * sizeof *g);
            if (!g) {
                ok = false;
                break;
            }
            files = g;
        }
        files[n].name = strdup(de->d_name);
        files[n].size = (uint64_t)st.st_size;
        files[n].mtime = st.st_mtim;
        if (!files[n].name) ok = false;
        else n++;
    }
    closedir(d);
    if (!ok) {
        free_files(files, n);
        return false;
    }
    *out = files;
    *n_out = n;
    return true;
}

static int older_first(const void *a, const void *b) {
    const file_info *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Bring the folder under `cap` bytes, least recently used first, sparing
 * the file just written (`keep`): a cap smaller than one kernel must not
 * make the cache useless for that kernel. */
static void evict(const char *dir, int64_t cap, const char *keep) {
    file_info *files;
    size_t n;
    if (!scan_dir(dir, &files, &n)) return;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += files[i].size;
    if (total > (uint64_t)cap) {
        qsort(files, n, sizeof *files, older_first);
        for (size_t i = 0; i < n && total > (uint64_t)cap; i++) {
            if (strcmp(files[i].name, keep) == 0) continue;
            char *p = join(dir, files[i].name);
            if (p && unlink(p) == 0) total -= files[i].size;
            free(p);
        }
    }
    free_files(files, n);
}

/* Temporary file in the same folder, then rename: atomic on POSIX. */
static bool disk_store(const char *dir, const char *fname, const char *key, const void *image,
                       size_t size) {
    if (!fgi_cache_make_dirs(dir)) return false;
    char *path = join(dir, fname);
    size_t n = path ? strlen(path) : 0;
    char *tmp = path ? malloc(n + 16) : NULL;
    bool ok = false;
    if (!tmp) goto out;
    snprintf(tmp, n + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) goto out;
    size_t key_len = strlen(key);
    unsigned char h[HEADER_SIZE] = {0};
    uint32_t version = FGI_CACHE_FORMAT;
    uint64_t kl = key_len, il = size, sum = checksum(key, key_len, image, size);
    memcpy(h, magic, sizeof magic);
    memcpy(h + 8, &version, 4);
    memcpy(h + 16, &kl, 8);
    memcpy(h + 24, &il, 8);
    memcpy(h + 32, &sum, 8);
    ok = write_full(fd, h, sizeof h) && write_full(fd, key, key_len) && write_full(fd, image, size);
    if (close(fd) != 0) ok = false;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) unlink(tmp);
out:
    free(tmp);
    free(path);
    return ok;
}

/* ---- building an image -------------------------------------------------- */

static char *make_full_key(const fgi_kernel_spec *spec, const char *arch) {
    fgi_buf b = {0};
    fgi_buf_puts(&b, spec->key);
    fgi_buf_printf(&b, "\narch=%s\nnvrtc=%s\noptions=%s\nformat=%u\n", arch, fgi_nvrtc_version(),
                   fgi_nvrtc_options_text(), FGI_CACHE_FORMAT);
    return fgi_buf_take(&b);
}

static fg_status compile_spec(fg_ctx *ctx, const fgi_kernel_spec *spec, const char *arch,
                              void **image, size_t *size) {
    char *src = NULL;
    fg_status st = spec->gen_source(ctx, spec->gen_arg, &src);
    if (st == FG_OK && !src) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "no source generated");
    if (st != FG_OK) {
        free(src);
        return st;
    }
    double t0 = fgi_now_ms();
    st = fgi_nvrtc_compile(ctx, src, spec->name, arch, FG_EMIT_CUBIN, image, size, NULL);
    double dt = fgi_now_ms() - t0;
    free(src);
    count(&C.stats.misses, &C.stats.compile_ms, dt);
    return st;
}

/* Disk, then NVRTC (no lock held). */
static fg_status build_image(fg_ctx *ctx, const fgi_kernel_spec *spec, const char *arch,
                             const char *key, uint64_t hash, void **image, size_t *size) {
    char *dir = ctx->disk_cache ? resolve_dir(ctx) : NULL;
    char *fname = dir ? file_name_for(spec->name, hash) : NULL;
    char *path = fname ? join(dir, fname) : NULL;
    fg_status st = FG_OK;
    if (path) {
        double t0 = fgi_now_ms();
        disk_result r = disk_load(path, key, image, size);
        if (r == DISK_OK) {
            count(&C.stats.disk_hits, &C.stats.load_ms, fgi_now_ms() - t0);
            goto out;
        }
        if (r == DISK_REJECT) count(&C.stats.disk_rejects, NULL, 0);
    }
    st = compile_spec(ctx, spec, arch, image, size);
    if (st == FG_OK && path && disk_store(dir, fname, key, *image, *size))
        evict(dir, ctx->cache_max_bytes, fname);
out:
    free(path);
    free(fname);
    free(dir);
    return st;
}

/* Copy a failed build's error onto the entry for the threads waiting on it. */
static void keep_failure(entry *e, fg_ctx *ctx, fg_status st) {
    e->state = E_FAILED;
    e->err = st;
    e->errmsg = strdup(fg_errmsg(ctx));
    e->errlog = strdup(fg_compile_log(ctx));
}

static fg_status report_failure(fg_ctx *ctx, const entry *e) {
    if (e->errlog && *e->errlog) fgi_set_compile_log(ctx, e->errlog);
    return fgi_error(ctx, e->err, "%s", e->errmsg ? e->errmsg : "kernel build failed");
}

/* The first thread for a key: build, publish, wake the waiters. Returns
 * with C.lock held. */
static fg_status produce(fg_ctx *ctx, const fgi_kernel_spec *spec, const char *arch, entry *e) {
    pthread_mutex_unlock(&C.lock);
    void *image = NULL;
    size_t size = 0;
    fg_status st = build_image(ctx, spec, arch, e->key, e->hash, &image, &size);
    pthread_mutex_lock(&C.lock);
    if (st == FG_OK) {
        e->image = image;
        e->size = size;
        e->state = E_READY;
    } else {
        keep_failure(e, ctx, st);
        table_unlink(e);
    }
    pthread_cond_broadcast(&C.done);
    return st;
}

static fg_status new_entry(fg_ctx *ctx, char *key, uint64_t hash, entry **out) {
    entry *e = calloc(1, sizeof *e);
    if (!e) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    e->key = key;
    e->hash = hash;
    e->state = E_COMPILING;
    e->refs = 1;
    if (!table_insert(e)) {
        free(e);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    }
    *out = e;
    return FG_OK;
}

/* A READY entry for the spec, with a reference the caller releases. */
static fg_status acquire(fg_ctx *ctx, const fgi_kernel_spec *spec, entry **out) {
    FGI_CHECK_ARG(ctx, spec && spec->key && spec->gen_source, "incomplete kernel spec");
    const char *arch = spec->arch && *spec->arch ? spec->arch : fgi_effective_arch(ctx);
    char *key = make_full_key(spec, arch);
    if (!key) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    uint64_t hash = fgi_fnv1a(FGI_FNV_SEED, key, strlen(key));
    fg_status st = FG_OK;
    pthread_mutex_lock(&C.lock);
    entry *e = table_find(key, hash);
    if (!e) {
        st = new_entry(ctx, key, hash, &e);
        if (st != FG_OK) {
            e = NULL;
        } else {
            key = NULL; /* the entry owns it */
            st = produce(ctx, spec, arch, e);
        }
    } else {
        /* Waiting for another thread's build also counts as a memory hit:
         * this request compiled nothing. */
        e->refs++;
        while (e->state == E_COMPILING) pthread_cond_wait(&C.done, &C.lock);
        if (e->state == E_FAILED) st = report_failure(ctx, e);
        else C.stats.memory_hits++;
    }
    if (st != FG_OK && e && --e->refs == 0 && !e->linked) free_entry(e);
    pthread_mutex_unlock(&C.lock);
    free(key);
    *out = st == FG_OK ? e : NULL;
    return st;
}

fg_status fgi_cache_get_image(fg_ctx *ctx, const fgi_kernel_spec *spec, const void **image,
                              size_t *size) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, image && size, "NULL output");
    entry *e;
    FGI_TRY(acquire(ctx, spec, &e));
    *image = e->image;
    *size = e->size;
    entry_release(e);
    return FG_OK;
}

/* ---- loaded functions ----------------------------------------------------- */

static mod_rec *find_module(entry *e, uint64_t ctx_id) {
    for (mod_rec *m = e->mods; m; m = m->next)
        if (m->ctx_id == ctx_id) return m;
    return NULL;
}

/* Load outside the lock (it takes milliseconds), then publish; a thread
 * that lost the race unloads its copy. Returns with C.lock held. */
static fg_status load_module(fg_ctx *ctx, entry *e, CUcontext cu, uint64_t ctx_id, mod_rec **out) {
    double t0 = fgi_now_ms();
    CUmodule module;
    CUresult r = fgi_cu()->cuModuleLoadData(&module, e->image);
    double dt = fgi_now_ms() - t0;
    pthread_mutex_lock(&C.lock);
    if (r != CUDA_SUCCESS) return fgi_cu_status(ctx, r, "cuModuleLoadData");
    C.stats.load_ms += dt;
    mod_rec *m = find_module(e, ctx_id);
    if (m) {
        fgi_cu()->cuModuleUnload(module);
    } else {
        m = calloc(1, sizeof *m);
        if (!m) {
            fgi_cu()->cuModuleUnload(module);
            return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
        }
        m->ctx_id = ctx_id;
        m->cu = cu;
        m->module = module;
        m->next = e->mods;
        e->mods = m;
    }
    *out = m;
    return FG_OK;
}

/* Under C.lock. *fresh: the function was not looked up before. */
static fg_status find_function(fg_ctx *ctx, mod_rec *m, const char *name, CUfunction *fn, bool *fresh) {
    *fresh = false;
    for (fn_rec *f = m->fns; f; f = f->next)
        if (strcmp(f->name, name) == 0) {
            *fn = f->fn;
            return FG_OK;
        }
    CUfunction got;
    CUresult r = fgi_cu()->cuModuleGetFunction(&got, m->module, name);
    if (r != CUDA_SUCCESS) {
        char why[512];
        fgi_cu_status(ctx, r, "cuModuleGetFunction");
        snprintf(why, sizeof why, "%s", fg_errmsg(ctx));
        return fgi_error(ctx, r == CUDA_ERROR_NOT_FOUND ? FG_ERR_NOT_FOUND : FG_ERR_CUDA,
                         "kernel '%s' not found in the module: %s", name, why);
    }
    fn_rec *f = calloc(1, sizeof *f);
    char *copy = strdup(name);
    if (!f || !copy) {
        free(f);
        free(copy);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    }
    f->name = copy;
    f->fn = got;
    f->next = m->fns;
    m->fns = f;
    *fn = got;
    *fresh = true;
    return FG_OK;
}

fg_status fgi_cache_get_function(fg_ctx *ctx, const fgi_kernel_spec *spec, CUfunction *fn) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, fn && spec && spec->entry && *spec->entry, "NULL output or entry name");
    CUcontext cu;
    uint64_t ctx_id;
    FGI_TRY(fgi_cuda_current(ctx, &cu, &ctx_id));
    entry *e;
    FGI_TRY(acquire(ctx, spec, &e));
    pthread_mutex_lock(&C.lock);
    mod_rec *m = find_module(e, ctx_id);
    fg_status st = FG_OK;
    if (!m) {
        pthread_mutex_unlock(&C.lock);
        st = load_module(ctx, e, cu, ctx_id, &m);
    }
    bool fresh = false;
    if (st == FG_OK) st = find_function(ctx, m, spec->entry, fn, &fresh);
    /* A function looked up for the first time is loaded now, not at its
     * first launch: under the driver's lazy loading that launch would load
     * it, and loading waits for the device's queued work while holding a
     * lock the driver's other calls take. Where that work is an NCCL kernel
     * waiting for a peer driven by another thread of this process (context
     * parallelism with a thread per GPU), the peer's next call waits for the
     * lock and neither ever finishes. Outside C.lock, as a module's load:
     * it waits for the device, and the peer's lookups must not wait for it.
     * A driver without cuFuncLoad loads at the first launch, as before. */
    if (st == FG_OK && fresh && fgi_cu()->cuFuncLoad) {
        pthread_mutex_unlock(&C.lock);
        const CUresult r = fgi_cu()->cuFuncLoad(*fn);
        if (r != CUDA_SUCCESS) st = fgi_cu_status(ctx, r, "cuFuncLoad");
        pthread_mutex_lock(&C.lock);
    }
    if (--e->refs == 0 && !e->linked) free_entry(e);
    pthread_mutex_unlock(&C.lock);
    return st;
}

/* ---- files -------------------------------------------------------------- */

fg_status fgi_cache_file_path(fg_ctx *ctx, const fgi_kernel_spec *spec, char **path) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, spec && spec->key && path, "NULL spec or output");
    *path = NULL;
    const char *arch = spec->arch && *spec->arch ? spec->arch : fgi_effective_arch(ctx);
    char *key = make_full_key(spec, arch);
    char *dir = resolve_dir(ctx);
    char *fname = key ? file_name_for(spec->name, fgi_fnv1a(FGI_FNV_SEED, key, strlen(key))) : NULL;
    if (dir && fname) *path = join(dir, fname);
    fg_status st = FG_OK;
    if (!dir) st = fgi_error(ctx, FG_ERR_CACHE, "no cache folder");
    else if (!*path) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
    free(key);
    free(dir);
    free(fname);
    return st;
}

static int newer_first(const void *a, const void *b) { return older_first(b, a); }

fg_status fgi_cache_list(fg_ctx *ctx, fgi_cache_list_fn fn, void *arg) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, fn, "NULL callback");
    char *dir = resolve_dir(ctx);
    if (!dir) return fgi_error(ctx, FG_ERR_CACHE, "no cache folder");
    file_info *files;
    size_t n;
    bool ok = scan_dir(dir, &files, &n);
    fg_status st = FG_OK;
    if (!ok) {
        st = fgi_error(ctx, FG_ERR_CACHE, "cannot read cache folder %s: %s", dir, strerror(errno));
    } else {
        if (n > 1) qsort(files, n, sizeof *files, newer_first);
        for (size_t i = 0; i < n; i++) {
            fgi_cache_file f = {files[i].name, files[i].size, (int64_t)files[i].mtime.tv_sec};
            fn(arg, &f);
        }
        free_files(files, n);
    }
    free(dir);
    return st;
}

fg_status fg_cache_clear(fg_ctx *ctx, size_t *removed) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    if (removed) *removed = 0;
    char *dir = resolve_dir(ctx);
    if (!dir) return fgi_error(ctx, FG_ERR_CACHE, "no cache folder");
    file_info *files;
    size_t n;
    fg_status st = FG_OK;
    if (!scan_dir(dir, &files, &n)) {
        st = fgi_error(ctx, FG_ERR_CACHE, "cannot read cache folder %s: %s", dir, strerror(errno));
        free(dir);
        return st;
    }
    size_t gone = 0;
    for (size_t i = 0; i < n && st == FG_OK; i++) {
        char *p = join(dir, files[i].name);
        if (!p) st = fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
        else if (unlink(p) == 0 || errno == ENOENT) gone++;
        else st = fgi_error(ctx, FG_ERR_CACHE, "cannot remove %s: %s", p, strerror(errno));
        free(p);
    }
    free_files(files, n);
    free(dir);
    if (removed) *removed = gone;
    return st;
}
