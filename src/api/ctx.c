/*
 * ctx.c -- the public context: creation with the environment's defaults,
 * destruction (which releases the CUDA state the driver layer keeps on it),
 * and the options, set through one function each for ints and strings and
 * range-checked there. This is the top of the library: it may call any
 * module; no module calls it.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"
#include "driver/cudrv.h"
#include "codegen/kernels.h"
#include "jit/jit.h"

#include <stdlib.h>
#include <string.h>

/* The environment's decimal integer `name` when it is one in [lo, hi],
 * else `fallback`. */
static int64_t env_int(const char *name, int64_t lo, int64_t hi, int64_t fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    const long long v = strtoll(s, &end, 10);
    return *end == 0 && v >= lo && v <= hi ? (int64_t)v : fallback;
}

fg_status fg_ctx_create(fg_ctx **out) {
    if (!out) return FG_ERR_INVALID_ARGUMENT;
    *out = NULL;
    fg_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return FG_ERR_OUT_OF_MEMORY;
    ctx->offset = -1;
    ctx->device = 0;
    const char *dc = getenv("FLEXGEN_DISK_CACHE");
    ctx->disk_cache = !(dc && strcmp(dc, "0") == 0);
    const char *hk = getenv("FLEXGEN_HOPPER_KERNEL");
    ctx->hopper_kernel = !(hk && strcmp(hk, "0") == 0);
    const char *dk = getenv("FLEXGEN_DECODE_KERNEL");
    ctx->decode_kernel = dk && (strcmp(dk, "0") == 0 || strcmp(dk, "2") == 0) ? dk[0] - '0' : 1;
    const char *am = getenv("FLEXGEN_APPROX_MATH");
    ctx->approx_math = am && strcmp(am, "1") == 0;
    const char *cs = getenv("FLEXGEN_CP_STREAMS");
    ctx->cp_streams = cs && strcmp(cs, "1") == 0 ? 1 : 2;
    ctx->decode_splits = (int)env_int("FLEXGEN_DECODE_SPLITS", 0, FGI_DEC_MAX_SPLIT, 0);
    ctx->bwd_lead_tiles = (int)env_int("FLEXGEN_BWD_LEAD_TILES", -1, 65535, -1);
    ctx->bwd_head_pairs = (int)env_int("FLEXGEN_BWD_HEAD_PAIRS", -1, 1, -1);
    ctx->decode_head_pairs = (int)env_int("FLEXGEN_DECODE_HEAD_PAIRS", -1, 1, -1);
    ctx->bwd_tail_split = (int)env_int("FLEXGEN_BWD_TAIL_SPLIT", 0, 1, 1);
    ctx->decode_l2_prefetch = (int)env_int("FLEXGEN_DECODE_L2_PREFETCH", -1, 1, -1);
    ctx->cache_max_bytes = env_int("FLEXGEN_CACHE_MAX_BYTES", 1, INT64_MAX, (int64_t)1 << 30);
    ctx->max_source = 64 * 1024;
    ctx->max_depth = 200;
    ctx->max_locals = 64;
    *out = ctx;
    return FG_OK;
}

void fg_ctx_destroy(fg_ctx *ctx) {
    if (!ctx) return;
    fgi_clear_error(ctx);
    free(ctx->compile_log);
    free(ctx->cache_dir);
    fgi_cuda_state_free(ctx->cuda);
    free(ctx);
}

/* ---- options ----------------------------------------------------------- */

fg_status fg_ctx_set_int(fg_ctx *ctx, fg_option opt, int64_t v) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_DEVICE:
        FGI_CHECK_ARG(ctx, v >= 0 && v < 1024, "device ordinal %lld out of range", (long long)v);
        ctx->device = (int)v;
        return FG_OK;
    case FG_OPT_DISK_CACHE:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "disk cache flag must be 0 or 1");
        ctx->disk_cache = (int)v;
        return FG_OK;
    case FG_OPT_HOPPER_KERNEL:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "Hopper kernel flag must be 0 or 1");
        ctx->hopper_kernel = (int)v;
        return FG_OK;
    case FG_OPT_DECODE_KERNEL:
        FGI_CHECK_ARG(ctx, v >= 0 && v <= 2, "decode kernel option must be 0, 1 or 2");
        ctx->decode_kernel = (int)v;
        return FG_OK;
    case FG_OPT_APPROX_MATH:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "approximate math flag must be 0 or 1");
        ctx->approx_math = (int)v;
        return FG_OK;
    case FG_OPT_CP_STREAMS:
        FGI_CHECK_ARG(ctx, v == 1 || v == 2, "context-parallel compute streams must be 1 or 2");
        ctx->cp_streams = (int)v;
        return FG_OK;
    case FG_OPT_DECODE_SPLITS:
        FGI_CHECK_ARG(ctx, v >= 0 && v <= FGI_DEC_MAX_SPLIT, "decode split count %lld out of range [0, %d]",
                      (long long)v, FGI_DEC_MAX_SPLIT);
        ctx->decode_splits = (int)v;
        return FG_OK;
    case FG_OPT_BWD_LEAD_TILES:
        FGI_CHECK_ARG(ctx, v >= -1 && v <= 65535, "backward lead tile count %lld out of range [-1, 65535]",
                      (long long)v);
        ctx->bwd_lead_tiles = (int)v;
        return FG_OK;
    case FG_OPT_BWD_HEAD_PAIRS:
        FGI_CHECK_ARG(ctx, v >= -1 && v <= 1, "backward head pairs %lld must be -1, 0 or 1", (long long)v);
        ctx->bwd_head_pairs = (int)v;
        return FG_OK;
    case FG_OPT_DECODE_HEAD_PAIRS:
        FGI_CHECK_ARG(ctx, v >= -1 && v <= 1, "decode head pairs %lld must be -1, 0 or 1", (long long)v);
        ctx->decode_head_pairs = (int)v;
        return FG_OK;
    case FG_OPT_BWD_TAIL_SPLIT:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "backward tail split %lld must be 0 or 1", (long long)v);
        ctx->bwd_tail_split = (int)v;
        return FG_OK;
    case FG_OPT_DECODE_L2_PREFETCH:
        FGI_CHECK_ARG(ctx, v >= -1 && v <= 1, "decode L2 prefetch %lld must be -1, 0 or 1", (long long)v);
        ctx->decode_l2_prefetch = (int)v;
        return FG_OK;
    case FG_OPT_CACHE_MAX_BYTES:
        FGI_CHECK_ARG(ctx, v > 0, "cache size cap must be positive");
        ctx->cache_max_bytes = v;
        return FG_OK;
    case FG_OPT_MAX_SOURCE:
        FGI_CHECK_ARG(ctx, v >= 16 && v <= (1 << 24), "source limit out of range [16, 16M]");
        ctx->max_source = (int)v;
        return FG_OK;
    case FG_OPT_MAX_DEPTH:
        FGI_CHECK_ARG(ctx, v >= 4 && v <= 1000, "depth limit out of range [4, 1000]");
        ctx->max_depth = (int)v;
        return FG_OK;
    case FG_OPT_MAX_LOCALS:
        FGI_CHECK_ARG(ctx, v >= 0 && v <= 1024, "locals limit out of range [0, 1024]");
        ctx->max_locals = (int)v;
        return FG_OK;
    default:
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not an integer option", (int)opt);
    }
}

fg_status fg_ctx_get_int(const fg_ctx *ctx, fg_option opt, int64_t *v) {
    if (!ctx || !v) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_DEVICE: *v = ctx->device; return FG_OK;
    case FG_OPT_DISK_CACHE: *v = ctx->disk_cache; return FG_OK;
    case FG_OPT_HOPPER_KERNEL: *v = ctx->hopper_kernel; return FG_OK;
    case FG_OPT_DECODE_KERNEL: *v = ctx->decode_kernel; return FG_OK;
    case FG_OPT_APPROX_MATH: *v = ctx->approx_math; return FG_OK;
    case FG_OPT_CP_STREAMS: *v = ctx->cp_streams; return FG_OK;
    case FG_OPT_DECODE_SPLITS: *v = ctx->decode_splits; return FG_OK;
    case FG_OPT_BWD_LEAD_TILES: *v = ctx->bwd_lead_tiles; return FG_OK;
    case FG_OPT_BWD_HEAD_PAIRS: *v = ctx->bwd_head_pairs; return FG_OK;
    case FG_OPT_DECODE_HEAD_PAIRS: *v = ctx->decode_head_pairs; return FG_OK;
    case FG_OPT_BWD_TAIL_SPLIT: *v = ctx->bwd_tail_split; return FG_OK;
    case FG_OPT_DECODE_L2_PREFETCH: *v = ctx->decode_l2_prefetch; return FG_OK;
    case FG_OPT_CACHE_MAX_BYTES: *v = ctx->cache_max_bytes; return FG_OK;
    case FG_OPT_MAX_SOURCE: *v = ctx->max_source; return FG_OK;
    case FG_OPT_MAX_DEPTH: *v = ctx->max_depth; return FG_OK;
    case FG_OPT_MAX_LOCALS: *v = ctx->max_locals; return FG_OK;
    default: return FG_ERR_INVALID_ARGUMENT;
    }
}

static bool valid_arch(const char *s) {
    /* sm_XY or sm_XYa / compute_XY: digits after the prefix, optional 'a'. */
    const char *p;
    if (strncmp(s, "sm_", 3) == 0) p = s + 3;
    else if (strncmp(s, "compute_", 8) == 0) p = s + 8;
    else return false;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (digits < 2 || digits > 3) return false;
    if (*p == 'a' || *p == 'f') p++;
    return *p == 0;
}

fg_status fg_ctx_set_string(fg_ctx *ctx, fg_option opt, const char *v) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_ARCH:
        if (!v || !*v) {
            ctx->arch[0] = 0;
            return FG_OK;
        }
        FGI_CHECK_ARG(ctx, strlen(v) < sizeof ctx->arch && valid_arch(v),
                      "invalid arch '%s' (expected e.g. sm_80, sm_90a)", v);
        strcpy(ctx->arch, v);
        return FG_OK;
    case FG_OPT_CACHE_DIR: {
        char *d = NULL;
        if (v && *v) {
            d = strdup(v);
            if (!d) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
        }
        free(ctx->cache_dir);
        ctx->cache_dir = d;
        return FG_OK;
    }
    default:
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not a string option", (int)opt);
    }
}

fg_status fg_ctx_get_string(fg_ctx *ctx, fg_option opt, const char **v) {
    if (!ctx || !v) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_ARCH: *v = fgi_effective_arch(ctx); return FG_OK;
    case FG_OPT_CACHE_DIR: return fg_cache_dir(ctx, v);
    default: return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not a string option", (int)opt);
    }
}
