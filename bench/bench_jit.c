/*
 * bench_jit.c -- what a kernel costs to get: a cold NVRTC compile, a disk
 * cache hit (memory cache forgotten, file present), a memory cache hit, and
 * with a GPU the same for a loaded function (module load included).
 *
 *     bench_jit [rounds]        (default 9; medians are reported)
 *
 * Uses a fresh temporary cache folder and removes it afterwards. The kernel
 * is a small self-contained one: the attention kernel's compile time is
 * measured by the attention benchmarks.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jit.h"

static const char kernel_src[] =
    "extern \"C\" __global__ void k(float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] = x[i] * a + __expf(x[i]);\n"
    "}\n";

static fg_status gen(fg_ctx *ctx, void *arg, char **out) {
    (void)ctx;
    (void)arg;
    *out = strdup(kernel_src);
    return *out ? FG_OK : FG_ERR_OUT_OF_MEMORY;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[600];
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') {
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

static int fail(fg_ctx *ctx, const char *what) {
    fprintf(stderr, "bench_jit: %s: %s\n%s\n", what, fg_errmsg(ctx), fg_compile_log(ctx));
    return 1;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 9;
    if (rounds < 1 || rounds > 1000) rounds = 9;
    char dir[] = "/tmp/flexgen-bench-jit-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return 1;
    fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, dir);
    const char *arch = fgi_effective_arch(ctx);
    double *t = calloc((size_t)rounds, sizeof *t);
    char key[64];
    const void *img;
    size_t size = 0;
    int rc = 0;

    /* Cold: a new key each round, so every call compiles. */
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    for (int r = 0; r < rounds && !rc; r++) {
        snprintf(key, sizeof key, "bench cold %d %d", r, (int)getpid());
        fgi_kernel_spec s = {.key = key, .name = "bench", .entry = "k", .gen_source = gen};
        double t0 = fgi_now_ms();
        if (fgi_cache_get_image(ctx, &s, &img, &size) != FG_OK) rc = fail(ctx, "cold compile");
        t[r] = fgi_now_ms() - t0;
    }
    double cold_ms = rc ? 0 : median(t, rounds);

    /* Disk hit: the file exists, the memory cache is forgotten each round. */
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 1);
    fgi_kernel_spec s = {.key = "bench warm", .name = "bench", .entry = "k", .gen_source = gen};
    if (!rc && fgi_cache_get_image(ctx, &s, &img, &size) != FG_OK) rc = fail(ctx, "first compile");
    fg_cache_reset_stats();
    for (int r = 0; r < rounds && !rc; r++) {
        fg_cache_forget_memory();
        double t0 = fgi_now_ms();
        if (fgi_cache_get_image(ctx, &s, &img, &size) != FG_OK) rc = fail(ctx, "disk hit");
        t[r] = fgi_now_ms() - t0;
    }
    fg_cache_stats st;
    fg_cache_get_stats(&st);
    if (!rc && st.disk_hits != (uint64_t)rounds) {
        fprintf(stderr, "bench_jit: expected %d disk hits, got %llu\n", rounds,
                (unsigned long long)st.disk_hits);
        rc = 1;
    }
    double disk_ms = rc ? 0 : median(t, rounds);

    /* Memory hit: averaged over many calls. */
    const int calls = 200000;
    double t0 = fgi_now_ms();
    for (int i = 0; i < calls && !rc; i++)
        if (fgi_cache_get_image(ctx, &s, &img, &size) != FG_OK) rc = fail(ctx, "memory hit");
    double mem_us = (fgi_now_ms() - t0) * 1e3 / calls;

    printf("bench_jit: arch %s, NVRTC %s, cubin %zu bytes, %d rounds\n", arch, fgi_nvrtc_version(),
           size, rounds);
    printf("  cold compile (NVRTC)        %9.2f ms (median)\n", cold_ms);
    printf("  disk-cache hit              %9.3f ms (median)\n", disk_ms);
    printf("  memory-cache hit (image)    %9.3f us (mean of %d)\n", mem_us, calls);

    double fn_us = -1, load_ms = -1;
    if (!rc && fgi_cuda_ready(ctx) == FG_OK) {
        CUfunction f;
        for (int r = 0; r < rounds && !rc; r++) {
            fg_cache_forget_memory();
            double t1 = fgi_now_ms();
            if (fgi_cache_get_function(ctx, &s, &f) != FG_OK) rc = fail(ctx, "function");
            t[r] = fgi_now_ms() - t1;
        }
        load_ms = rc ? 0 : median(t, rounds);
        t0 = fgi_now_ms();
        for (int i = 0; i < calls && !rc; i++)
            if (fgi_cache_get_function(ctx, &s, &f) != FG_OK) rc = fail(ctx, "function hit");
        fn_us = (fgi_now_ms() - t0) * 1e3 / calls;
        printf("  disk hit + module load      %9.3f ms (median)\n", load_ms);
        printf("  memory-cache hit (function) %9.3f us (mean of %d)\n", fn_us, calls);
    } else if (!rc) {
        printf("  (no GPU: %s)\n", fg_errmsg(ctx));
    }
    printf("{\"bench\":\"jit\",\"arch\":\"%s\",\"nvrtc\":\"%s\",\"cold_compile_ms\":%.3f,"
           "\"disk_hit_ms\":%.4f,\"memory_hit_us\":%.4f,\"function_load_ms\":%.4f,"
           "\"function_hit_us\":%.4f}\n",
           arch, fgi_nvrtc_version(), cold_ms, disk_ms, mem_us, load_ms, fn_us);
    free(t);
    fg_ctx_destroy(ctx);
    fg_cache_forget_memory();
    remove_dir(dir);
    return rc;
}
