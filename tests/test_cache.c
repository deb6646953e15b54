/*
 * test_cache.c -- the kernel cache, at the image level (no GPU needed).
 *
 * Each test gets a fresh temporary folder, an empty memory cache and zeroed
 * stats, and asks for cubins of tiny self-contained kernels. The stats say
 * what happened (memory hit, disk hit, compile, reject); the files on disk
 * are inspected and damaged directly to check that nothing unverified is
 * ever loaded.
 */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jit.h"

static const char kernel_src[] =
    "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] *= 2.0f; }\n";
static const char other_src[] =
    "extern \"C\" __global__ void k(float *x) { x[threadIdx.x] += 1.0f; }\n";
static const char broken_src[] = "extern \"C\" __global__ void k(float *x) { x[0] = nope; }\n";

typedef struct gen {
    const char *src;
    atomic_int calls;
} gen;

static fg_status gen_source(fg_ctx *ctx, void *arg, char **out) {
    gen *g = arg;
    atomic_fetch_add(&g->calls, 1);
    *out = strdup(g->src);
    return *out ? FG_OK : fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "oom");
}

static fg_status gen_fails(fg_ctx *ctx, void *arg, char **out) {
    (void)arg;
    *out = NULL;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "generator refuses");
}

static fgi_kernel_spec spec_for(const char *key, const char *name, gen *g) {
    fgi_kernel_spec s = {.key = key, .name = name, .entry = "k", .arch = "sm_90a",
                         .gen_source = gen_source, .gen_arg = g};
    return s;
}

/* ---- fixture: a temporary folder and a clean cache ---------------------- */

typedef struct fixture {
    char dir[256];
    fg_ctx *ctx;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    if (!f) return -1;
    snprintf(f->dir, sizeof f->dir, "/tmp/flexgen-test-cache-XXXXXX");
    if (!mkdtemp(f->dir) || fg_ctx_create(&f->ctx) != FG_OK) return -1;
    if (fg_ctx_set_string(f->ctx, FG_OPT_CACHE_DIR, f->dir) != FG_OK) return -1;
    fg_ctx_set_int(f->ctx, FG_OPT_DISK_CACHE, 1);
    fg_cache_forget_memory();
    fg_cache_reset_stats();
    *state = f;
    return 0;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[512];
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int teardown(void **state) {
    fixture *f = *state;
    fg_ctx_destroy(f->ctx);
    remove_tree(f->dir);
    free(f);
    fg_cache_forget_memory();
    return 0;
}

static fg_cache_stats stats(void) {
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    return s;
}

#define EXPECT_STATS(mem, disk, miss, rej)                \
    do {                                                  \
        fg_cache_stats s_ = stats();                      \
        assert_int_equal(s_.memory_hits, (mem));          \
        assert_int_equal(s_.disk_hits, (disk));           \
        assert_int_equal(s_.misses, (miss));              \
        assert_int_equal(s_.disk_rejects, (rej));         \
    } while (0)

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    size_t m = strlen(suffix);
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (de->d_name[0] != '.' && len >= m && strcmp(de->d_name + len - m, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

static bool file_exists(const char *p) { return access(p, F_OK) == 0; }

static char *path_of(fg_ctx *ctx, const fgi_kernel_spec *spec) {
    char *p = NULL;
    assert_int_equal(fgi_cache_file_path(ctx, spec, &p), FG_OK);
    return p;
}

/* A private copy of the cache's image, to compare after the cache is gone. */
static void *get_copy(fg_ctx *ctx, const fgi_kernel_spec *spec, size_t *n) {
    const void *img = NULL;
    fg_status st = fgi_cache_get_image(ctx, spec, &img, n);
    if (st != FG_OK) print_error("%s\n%s\n", fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    assert_true(*n > 4 && memcmp(img, "\x7f" "ELF", 4) == 0);
    void *copy = malloc(*n);
    assert_non_null(copy);
    memcpy(copy, img, *n);
    return copy;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- memory and disk basics --------------------------------------------- */

static void same_key_compiles_once(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    fgi_kernel_spec a = spec_for("same-key", "twice", &g);
    const void *i1, *i2;
    size_t n1, n2;
    assert_int_equal(fgi_cache_get_image(f->ctx, &a, &i1, &n1), FG_OK);
    assert_int_equal(fgi_cache_get_image(f->ctx, &a, &i2, &n2), FG_OK);
    assert_ptr_equal(i1, i2);
    assert_int_equal(n1, n2);
    assert_int_equal(atomic_load(&g.calls), 1);
    EXPECT_STATS(1, 0, 1, 0);
    assert_true(stats().compile_ms > 0);

    /* The file is named after the spec and holds the key's hash. */
    char *pa = path_of(f->ctx, &a);
    assert_true(file_exists(pa));
    assert_non_null(strstr(pa, "/twice-"));
    assert_non_null(strstr(pa, ".fgbin"));

    /* Another key: another compile, another file. */
    fgi_kernel_spec b = spec_for("other-key", "twice", &g);
    assert_int_equal(fgi_cache_get_image(f->ctx, &b, &i2, &n2), FG_OK);
    char *pb = path_of(f->ctx, &b);
    assert_string_not_equal(pa, pb);
    assert_true(file_exists(pb));
    assert_int_equal(count_files(f->dir, ".fgbin"), 2);
    EXPECT_STATS(1, 0, 2, 0);

    /* The arch is part of the key. */
    fgi_kernel_spec c = b;
    c.arch = "sm_80";
    assert_int_equal(fgi_cache_get_image(f->ctx, &c, &i2, &n2), FG_OK);
    EXPECT_STATS(1, 0, 3, 0);

    /* Memory forgotten, the file answers: a disk hit, same bytes. */
    void *before = get_copy(f->ctx, &a, &n1);
    fg_cache_forget_memory();
    void *after = get_copy(f->ctx, &a, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    EXPECT_STATS(2, 1, 3, 0);
    assert_int_equal(atomic_load(&g.calls), 3);
    free(before);
    free(after);
    free(pa);
    free(pb);
}

static void spec_errors(void **state) {
    fixture *f = *state;
    const void *img;
    size_t n;
    assert_int_equal(fgi_cache_get_image(f->ctx, NULL, &img, &n), FG_ERR_INVALID_ARGUMENT);
    fgi_kernel_spec s = {.key = NULL, .gen_source = gen_source};
    assert_int_equal(fgi_cache_get_image(f->ctx, &s, &img, &n), FG_ERR_INVALID_ARGUMENT);
    /* A generator's own error comes back unchanged and is not cached. */
    fgi_kernel_spec bad = {.key = "gen-fails", .name = "x", .entry = "k", .gen_source = gen_fails};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(fgi_cache_get_image(f->ctx, &bad, &img, &n), FG_ERR_NOT_SUPPORTED);
        assert_non_null(strstr(fg_errmsg(f->ctx), "generator refuses"));
    }
    assert_int_equal(count_files(f->dir, ".fgbin"), 0);
}

/* A failed compile is reported with its log and never cached: each retry
 * compiles again, and no file is written. */
static void failure_is_not_cached(void **state) {
    fixture *f = *state;
    gen g = {.src = broken_src};
    fgi_kernel_spec s = spec_for("broken", "broken", &g);
    const void *img;
    size_t n;
    for (int i = 1; i <= 2; i++) {
        assert_int_equal(fgi_cache_get_image(f->ctx, &s, &img, &n), FG_ERR_COMPILE);
        assert_non_null(strstr(fg_compile_log(f->ctx), "nope"));
        EXPECT_STATS(0, 0, i, 0);
    }
    assert_int_equal(atomic_load(&g.calls), 2);
    assert_int_equal(count_files(f->dir, ".fgbin"), 0);
}

/* ---- concurrency -------------------------------------------------------- */

#define NTHREADS 8

typedef struct worker {
    const char *dir;
    fgi_kernel_spec spec;
    pthread_barrier_t *start;
    fg_status st;
    const void *img;
    size_t n;
    char log_has_error;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) {
        w->st = FG_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, w->dir);
    pthread_barrier_wait(w->start);
    w->st = fgi_cache_get_image(ctx, &w->spec, &w->img, &w->n);
    w->log_has_error = strstr(fg_compile_log(ctx), "nope") != NULL;
    fg_ctx_destroy(ctx);
    return NULL;
}

static void run_workers(fixture *f, fgi_kernel_spec spec, worker *w) {
    pthread_barrier_t start;
    pthread_t t[NTHREADS];
    pthread_barrier_init(&start, NULL, NTHREADS);
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (worker){.dir = f->dir, .spec = spec, .start = &start};
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
}

static void threads_compile_once(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    worker w[NTHREADS];
    run_workers(f, spec_for("eight-threads", "threads", &g), w);
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(w[i].st, FG_OK);
        assert_ptr_equal(w[i].img, w[0].img);
        assert_int_equal(w[i].n, w[0].n);
    }
    assert_int_equal(atomic_load(&g.calls), 1);
    EXPECT_STATS(NTHREADS - 1, 0, 1, 0);
}

/* Everyone waiting on a failing compile gets the failure and its log. */
static void threads_share_failure(void **state) {
    fixture *f = *state;
    gen g = {.src = broken_src};
    worker w[NTHREADS];
    run_workers(f, spec_for("eight-broken", "broken", &g), w);
    for (int i = 0; i < NTHREADS; i++) {
        assert_int_equal(w[i].st, FG_ERR_COMPILE);
        assert_true(w[i].log_has_error);
    }
    /* Threads that arrived after the failure was unlinked compiled again;
     * none was handed a cached failure as success. */
    assert_true(atomic_load(&g.calls) >= 1);
    assert_int_equal(stats().misses, (uint64_t)atomic_load(&g.calls));
}

/* Two processes racing on one key in one folder both get a valid cubin and
 * leave one valid file, no temporary behind. */
static void processes_race_on_disk(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    fgi_kernel_spec s = spec_for("two-processes", "race", &g);
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            char c;
            close(go[1]);
            if (read(go[0], &c, 1) != 1) _exit(2);
            fg_ctx *ctx;
            if (fg_ctx_create(&ctx) != FG_OK) _exit(3);
            fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, f->dir);
            const void *img;
            size_t n;
            fg_status st = fgi_cache_get_image(ctx, &s, &img, &n);
            int ok = st == FG_OK && n > 4 && memcmp(img, "\x7f" "ELF", 4) == 0;
            fg_ctx_destroy(ctx);
            fg_cache_forget_memory();
            _exit(ok ? 0 : 1);
        }
    }
    close(go[0]);
    assert_int_equal(write(go[1], "gg", 2), 2); /* release both at once */
    close(go[1]);
    for (int i = 0; i < 2; i++) {
        int status = 0;
        assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    assert_int_equal(count_files(f->dir, ".fgbin"), 1);
    DIR *d = opendir(f->dir);
    struct dirent *de;
    while ((de = readdir(d))) assert_null(strstr(de->d_name, ".tmp."));
    closedir(d);
    /* This process finds the file and trusts it: a disk hit. */
    size_t n;
    void *img = get_copy(f->ctx, &s, &n);
    EXPECT_STATS(0, 1, 0, 0);
    free(img);
}

/* ---- damaged and foreign files ------------------------------------------ */

typedef void (*damage_fn)(const char *path, size_t key_len);

static void rewrite_byte(const char *path, long at, int xor_mask) {
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    if (at < 0) {
        fseek(fp, 0, SEEK_END);
        at += ftell(fp);
    }
    fseek(fp, at, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, at, SEEK_SET);
    fputc(c ^ xor_mask, fp);
    fclose(fp);
}

static void truncate_half(const char *p, size_t k) {
    (void)k;
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size / 2), 0);
}
static void truncate_last_byte(const char *p, size_t k) {
    (void)k;
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size - 1), 0);
}
static void truncate_to_header(const char *p, size_t k) {
    (void)k;
    assert_int_equal(truncate(p, 20), 0);
}
static void empty_file(const char *p, size_t k) {
    (void)k;
    assert_int_equal(truncate(p, 0), 0);
}
static void flip_image_bit(const char *p, size_t k) {
    (void)k;
    rewrite_byte(p, -17, 0x04);
}
static void flip_key_bit(const char *p, size_t k) { rewrite_byte(p, 40 + (long)k / 2, 0x01); }
static void flip_magic(const char *p, size_t k) {
    (void)k;
    rewrite_byte(p, 0, 0x20);
}
static void bump_version(const char *p, size_t k) {
    (void)k;
    rewrite_byte(p, 8, 0x40);
}
static void flip_checksum(const char *p, size_t k) {
    (void)k;
    rewrite_byte(p, 33, 0x80);
}
static void append_garbage(const char *p, size_t k) {
    (void)k;
    FILE *fp = fopen(p, "ab");
    assert_non_null(fp);
    fputs("trailing", fp);
    fclose(fp);
}
static void claim_longer_image(const char *p, size_t k) {
    (void)k;
    rewrite_byte(p, 24 + 5, 0x01); /* image length += 2^40 */
}

static const struct {
    const char *what;
    damage_fn damage;
} damage_rows[] = {
    {"truncated to half", truncate_half},
    {"last byte missing", truncate_last_byte},
    {"shorter than the header", truncate_to_header},
    {"empty", empty_file},
    {"one bit flipped in the image", flip_image_bit},
    {"one bit flipped in the key", flip_key_bit},
    {"wrong magic", flip_magic},
    {"other format version", bump_version},
    {"checksum flipped", flip_checksum},
    {"bytes appended", append_garbage},
    {"image length too large", claim_longer_image},
};

static void damaged_files_are_recompiled(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    fgi_kernel_spec s = spec_for("damage", "damage", &g);
    size_t n0;
    void *fresh = get_copy(f->ctx, &s, &n0);
    char *path = path_of(f->ctx, &s);
    size_t key_len = strlen("damage");
    uint64_t rejects = 0, misses = 1;
    for (size_t i = 0; i < sizeof damage_rows / sizeof damage_rows[0]; i++) {
        damage_rows[i].damage(path, key_len);
        fg_cache_forget_memory();
        size_t n;
        void *img = get_copy(f->ctx, &s, &n);
        fg_cache_stats st = stats();
        if (st.disk_rejects != rejects + 1) print_error("row '%s' was not rejected\n", damage_rows[i].what);
        assert_int_equal(st.disk_rejects, ++rejects);
        assert_int_equal(st.misses, ++misses);
        assert_int_equal(n, n0);
        assert_memory_equal(img, fresh, n0);
        free(img);
        /* The file was replaced by a good one: the next load trusts it. */
        fg_cache_forget_memory();
        uint64_t hits = stats().disk_hits;
        img = get_copy(f->ctx, &s, &n);
        assert_int_equal(stats().disk_hits, hits + 1);
        free(img);
    }
    free(path);
    free(fresh);
}

/* A file whose stored key is another key's (what a 64-bit hash collision
 * would look like) is rejected, not loaded. */
static void foreign_key_is_rejected(void **state) {
    fixture *f = *state;
    gen ga = {.src = kernel_src}, gb = {.src = other_src};
    fgi_kernel_spec a = spec_for("collide-a", "same", &ga);
    fgi_kernel_spec b = spec_for("collide-b", "same", &gb);
    size_t na, nb;
    void *ia = get_copy(f->ctx, &a, &na);
    void *ib = get_copy(f->ctx, &b, &nb);
    assert_true(na != nb || memcmp(ia, ib, na) != 0);
    char *pa = path_of(f->ctx, &a), *pb = path_of(f->ctx, &b);
    assert_int_equal(rename(pa, pb), 0);
    fg_cache_forget_memory();
    fg_cache_reset_stats();
    size_t n;
    void *got = get_copy(f->ctx, &b, &n);
    EXPECT_STATS(0, 0, 1, 1);
    assert_int_equal(n, nb);
    assert_memory_equal(got, ib, nb);
    free(got);
    free(ia);
    free(ib);
    free(pa);
    free(pb);
}

/* ---- switches, limits, folders ------------------------------------------ */

static void disk_cache_off_writes_nothing(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    fgi_kernel_spec s = spec_for("disk-off", "off", &g);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/never", f->dir);
    assert_int_equal(fg_ctx_set_string(f->ctx, FG_OPT_CACHE_DIR, sub), FG_OK);
    assert_int_equal(fg_ctx_set_int(f->ctx, FG_OPT_DISK_CACHE, 0), FG_OK);
    size_t n;
    free(get_copy(f->ctx, &s, &n));
    fg_cache_forget_memory();
    free(get_copy(f->ctx, &s, &n));
    EXPECT_STATS(0, 0, 2, 0);
    assert_false(file_exists(sub));

    /* The environment switch gives new contexts the same default. */
    setenv("FLEXGEN_DISK_CACHE", "0", 1);
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    unsetenv("FLEXGEN_DISK_CACHE");
    int64_t on = -1;
    assert_int_equal(fg_ctx_get_int(ctx, FG_OPT_DISK_CACHE, &on), FG_OK);
    assert_int_equal(on, 0);
    fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, sub);
    fg_cache_forget_memory();
    free(get_copy(ctx, &s, &n));
    assert_false(file_exists(sub));
    fg_ctx_destroy(ctx);
}

/* An unusable folder (a regular file stands where it should be) never fails
 * a request: the kernel is compiled and served from memory. */
static void unusable_folder_falls_back(void **state) {
    fixture *f = *state;
    char blocker[300];
    snprintf(blocker, sizeof blocker, "%s/blocker", f->dir);
    FILE *fp = fopen(blocker, "w");
    assert_non_null(fp);
    fclose(fp);
    char sub[320];
    snprintf(sub, sizeof sub, "%s/inside", blocker);
    fg_ctx_set_string(f->ctx, FG_OPT_CACHE_DIR, sub);
    gen g = {.src = kernel_src};
    fgi_kernel_spec s = spec_for("unusable", "unusable", &g);
    size_t n;
    free(get_copy(f->ctx, &s, &n));
    EXPECT_STATS(0, 0, 1, 0);
    size_t removed = 99;
    assert_int_equal(fg_cache_clear(f->ctx, &removed), FG_ERR_CACHE);
}

static off_t file_size(const char *p) {
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    return st.st_size;
}

/* Least recently used goes first; a disk hit counts as a use. */
static void lru_eviction(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    fgi_kernel_spec a = spec_for("lru-A", "lru", &g), b = spec_for("lru-B", "lru", &g),
                    c = spec_for("lru-C", "lru", &g);
    char *pa = path_of(f->ctx, &a), *pb = path_of(f->ctx, &b), *pc = path_of(f->ctx, &c);
    size_t n;
    free(get_copy(f->ctx, &a, &n));
    off_t one = file_size(pa); /* equal keys lengths: every file this size */
    sleep_ms(30);              /* file times move in scheduler ticks */
    free(get_copy(f->ctx, &b, &n));
    sleep_ms(30);
    fg_cache_forget_memory();
    free(get_copy(f->ctx, &a, &n)); /* touches A: now B is the oldest */
    sleep_ms(30);
    assert_int_equal(fg_ctx_set_int(f->ctx, FG_OPT_CACHE_MAX_BYTES, 3 * one - 1), FG_OK);
    free(get_copy(f->ctx, &c, &n));
    assert_true(file_exists(pa));
    assert_false(file_exists(pb));
    assert_true(file_exists(pc));
    /* A cap below one file keeps only the newest. */
    assert_int_equal(fg_ctx_set_int(f->ctx, FG_OPT_CACHE_MAX_BYTES, 1), FG_OK);
    free(get_copy(f->ctx, &b, &n));
    assert_int_equal(count_files(f->dir, ".fgbin"), 1);
    assert_true(file_exists(pb));
    free(pa);
    free(pb);
    free(pc);
}

typedef struct listing {
    int n;
    uint64_t bytes;
} listing;

static void on_file(void *arg, const fgi_cache_file *file) {
    listing *l = arg;
    l->n++;
    l->bytes += file->size;
    assert_non_null(strstr(file->name, ".fgbin"));
    assert_true(file->mtime > 0);
}

static void list_and_clear(void **state) {
    fixture *f = *state;
    gen g = {.src = kernel_src};
    const char *keys[] = {"list-1", "list-2", "list-3"};
    size_t n;
    for (int i = 0; i < 3; i++) {
        fgi_kernel_spec s = spec_for(keys[i], "list", &g);
        free(get_copy(f->ctx, &s, &n));
    }
    listing l = {0};
    assert_int_equal(fgi_cache_list(f->ctx, on_file, &l), FG_OK);
    assert_int_equal(l.n, 3);
    assert_true(l.bytes > 3 * n);
    size_t removed = 0;
    assert_int_equal(fg_cache_clear(f->ctx, &removed), FG_OK);
    assert_int_equal(removed, 3);
    assert_int_equal(count_files(f->dir, ".fgbin"), 0);
    assert_int_equal(fg_cache_clear(f->ctx, NULL), FG_OK);
    /* A folder that does not exist yet is empty, not an error. */
    char sub[300];
    snprintf(sub, sizeof sub, "%s/not-yet", f->dir);
    fg_ctx_set_string(f->ctx, FG_OPT_CACHE_DIR, sub);
    l = (listing){0};
    assert_int_equal(fgi_cache_list(f->ctx, on_file, &l), FG_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(fg_cache_clear(f->ctx, &removed), FG_OK);
    assert_int_equal(removed, 0);
}

/* Option > $FLEXGEN_CACHE_DIR > $XDG_CACHE_HOME/flexgen > $HOME/.cache/flexgen. */
static void folder_precedence(void **state) {
    fixture *f = *state;
    const char *names[] = {"FLEXGEN_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v ? strdup(v) : NULL;
    }
    static const struct {
        const char *option, *flexgen, *xdg, *home, *want;
    } rows[] = {
        {"/opt/o", "/env/f", "/env/x", "/home/u", "/opt/o"},
        {NULL, "/env/f", "/env/x", "/home/u", "/env/f"},
        {NULL, "", "/env/x", "/home/u", "/env/x/flexgen"},
        {NULL, NULL, "/env/x", "/home/u", "/env/x/flexgen"},
        {NULL, NULL, NULL, "/home/u", "/home/u/.cache/flexgen"},
        {NULL, NULL, "", "/home/u", "/home/u/.cache/flexgen"},
    };
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const char *vals[] = {rows[i].flexgen, rows[i].xdg, rows[i].home};
        for (int k = 0; k < 3; k++) {
            if (vals[k]) setenv(names[k], vals[k], 1);
            else unsetenv(names[k]);
        }
        assert_int_equal(fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, rows[i].option), FG_OK);
        const char *dir = NULL;
        assert_int_equal(fg_cache_dir(ctx, &dir), FG_OK);
        assert_string_equal(dir, rows[i].want);
        const char *opt = NULL;
        assert_int_equal(fg_ctx_get_string(ctx, FG_OPT_CACHE_DIR, &opt), FG_OK);
        assert_string_equal(opt, rows[i].want);
    }
    fg_ctx_destroy(ctx);
    for (int i = 0; i < 3; i++) {
        if (saved[i]) setenv(names[i], saved[i], 1);
        else unsetenv(names[i]);
        free(saved[i]);
    }
    /* The folder the fixture set is still what the fixture's ctx uses. */
    const char *dir = NULL;
    assert_int_equal(fg_cache_dir(f->ctx, &dir), FG_OK);
    assert_string_equal(dir, f->dir);
}

/* The folder is created on first write, private to the user. */
static void folder_created_private(void **state) {
    fixture *f = *state;
    char sub[300];
    snprintf(sub, sizeof sub, "%s/a/b/c", f->dir);
    fg_ctx_set_string(f->ctx, FG_OPT_CACHE_DIR, sub);
    gen g = {.src = kernel_src};
    fgi_kernel_spec s = spec_for("nested", "nested", &g);
    size_t n;
    free(get_copy(f->ctx, &s, &n));
    struct stat st;
    assert_int_equal(stat(sub, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_int_equal(count_files(sub, ".fgbin"), 1);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(same_key_compiles_once),
        T(spec_errors),
        T(failure_is_not_cached),
        T(threads_compile_once),
        T(threads_share_failure),
        T(processes_race_on_disk),
        T(damaged_files_are_recompiled),
        T(foreign_key_is_rejected),
        T(disk_cache_off_writes_nothing),
        T(unusable_folder_falls_back),
        T(lru_eviction),
        T(list_and_clear),
        T(folder_precedence),
        T(folder_created_private),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
