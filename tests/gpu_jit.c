/*
 * gpu_jit.c -- the JIT end to end on a real device: NVRTC cubin, cache,
 * module load through the dlopen'd driver, launch, and the result read
 * back and checked on the host.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"

/* Two entry points in one module, like the block-mask builder. */
static const char two_kernels[] =
    "extern \"C\" __global__ void scale(float *x, float a, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] *= a;\n"
    "}\n"
    "extern \"C\" __global__ void add_index(float *x, int n) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) x[i] += (float)i;\n"
    "}\n";

static fg_status gen(fg_ctx *ctx, void *arg, char **out) {
    (void)ctx;
    *out = strdup(arg);
    return *out ? FG_OK : FG_ERR_OUT_OF_MEMORY;
}

static fgi_kernel_spec spec_entry(const char *entry, const char *arch) {
    fgi_kernel_spec s = {.key = "gpu_jit two kernels", .name = "gpu_jit", .entry = entry,
                         .arch = arch, .gen_source = gen, .gen_arg = (void *)two_kernels};
    return s;
}

#define N 1000

static void check_ok(fg_ctx *ctx, fg_status st) {
    if (st != FG_OK) print_error("%s: %s\n%s\n", fg_status_string(st), fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
}

/* scale by a, then add the index: x[i] = i * a + i for x[i] = i. */
static fg_status run_both(fg_ctx *ctx, float a, float *host) {
    CUfunction scale, add;
    fgi_kernel_spec s1 = spec_entry("scale", NULL), s2 = spec_entry("add_index", NULL);
    FGI_TRY(fgi_cache_get_function(ctx, &s1, &scale));
    FGI_TRY(fgi_cache_get_function(ctx, &s2, &add));
    if (scale == add) return fgi_error(ctx, FG_ERR_CUDA, "two entries gave one function");
    const fgi_cu_api *cu = fgi_cu();
    CUdeviceptr d;
    for (int i = 0; i < N; i++) host[i] = (float)i;
    FGI_CU_TRY(ctx, cu->cuMemAlloc(&d, N * sizeof(float)), "cuMemAlloc");
    int n = N;
    void *args1[] = {&d, &a, &n};
    void *args2[] = {&d, &n};
    CUresult r = cu->cuMemcpyHtoD(d, host, N * sizeof(float));
    if (r == CUDA_SUCCESS) r = cu->cuLaunchKernel(scale, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args1, NULL);
    if (r == CUDA_SUCCESS) r = cu->cuLaunchKernel(add, (N + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args2, NULL);
    if (r == CUDA_SUCCESS) r = cu->cuCtxSynchronize();
    if (r == CUDA_SUCCESS) r = cu->cuMemcpyDtoH(host, d, N * sizeof(float));
    cu->cuMemFree(d);
    return fgi_cu_status(ctx, r, "launch");
}

static void check_values(const float *host, float a) {
    for (int i = 0; i < N; i++) assert_float_equal(host[i], (float)i * a + (float)i, 0.0f);
}

static void load_and_launch(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_ctx_set_int(ctx, FG_OPT_DISK_CACHE, 0);
    fg_cache_forget_memory();
    fg_cache_reset_stats();
    int major = 0, minor = 0;
    check_ok(ctx, fgi_cuda_arch(ctx, &major, &minor));
    printf("device cc %d.%d, arch %s, NVRTC %s\n", major, minor, fgi_effective_arch(ctx),
           fgi_nvrtc_version());
    static float host[N];
    check_ok(ctx, run_both(ctx, 3.0f, host));
    check_values(host, 3.0f);
    /* Same functions again: memory hits, one compile in all. */
    check_ok(ctx, run_both(ctx, -0.5f, host));
    check_values(host, -0.5f);
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.memory_hits, 3);
    printf("compile %.1f ms, module load %.2f ms\n", s.compile_ms, s.load_ms);
    /* Forgetting the memory cache unloads and reloads cleanly. */
    fg_cache_forget_memory();
    check_ok(ctx, run_both(ctx, 2.0f, host));
    check_values(host, 2.0f);
    fg_ctx_destroy(ctx);
}

/* A function looked up twice is the same handle (loaded once). */
static void function_is_loaded_once(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fgi_kernel_spec s = spec_entry("scale", NULL);
    CUfunction a, b;
    check_ok(ctx, fgi_cache_get_function(ctx, &s, &a));
    check_ok(ctx, fgi_cache_get_function(ctx, &s, &b));
    assert_ptr_equal(a, b);
    /* A missing entry point is FG_ERR_NOT_FOUND, naming it. */
    fgi_kernel_spec missing = spec_entry("no_such_kernel", NULL);
    assert_int_equal(fgi_cache_get_function(ctx, &missing, &a), FG_ERR_NOT_FOUND);
    assert_non_null(strstr(fg_errmsg(ctx), "no_such_kernel"));
    fg_ctx_destroy(ctx);
}

/* A cubin for another machine is refused by the driver, with its own
 * error name in the message. */
static void wrong_arch_is_a_cuda_error(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    int major = 0;
    check_ok(ctx, fgi_cuda_arch(ctx, &major, NULL));
    const char *other = major == 8 ? "sm_90a" : "sm_80";
    fgi_kernel_spec s = spec_entry("scale", other);
    CUfunction f;
    fg_status st = fgi_cache_get_function(ctx, &s, &f);
    assert_int_equal(st, FG_ERR_CUDA);
    printf("%s -> %s\n", other, fg_errmsg(ctx));
    assert_non_null(strstr(fg_errmsg(ctx), "cuModuleLoadData: CUDA_ERROR_"));
    fg_ctx_destroy(ctx);
}

/* Contexts on several threads share the compiled module. */
static void *thread_main(void *arg) {
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return (void *)1;
    float host[N];
    float a = (float)(intptr_t)arg;
    fg_status st = run_both(ctx, a, host);
    if (st != FG_OK) fprintf(stderr, "thread: %s\n", fg_errmsg(ctx));
    int bad = st != FG_OK;
    for (int i = 0; i < N && !bad; i++) bad = host[i] != (float)i * a + (float)i;
    fg_ctx_destroy(ctx);
    return (void *)(intptr_t)bad;
}

static void threads_launch(void **state) {
    (void)state;
    fg_cache_forget_memory();
    fg_cache_reset_stats();
    pthread_t t[4];
    for (intptr_t i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, thread_main, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        assert_null(bad);
    }
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    assert_int_equal(s.misses + s.disk_hits, 1);
}

int main(void) {
    tu_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(load_and_launch),
        cmocka_unit_test(function_is_loaded_once),
        cmocka_unit_test(wrong_arch_is_a_cuda_error),
        cmocka_unit_test(threads_launch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
