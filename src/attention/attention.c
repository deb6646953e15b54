/*
 * attention.c -- the forward attention run API: fg_kernel_get,
 * fg_kernel_launch, fg_attention_forward.
 *
 * A launch is three steps, each with its own failure statuses:
 *   1. check the arguments against the kernel (dtype, head dim, shapes, GQA
 *      ratio, strides and the alignment cp.async needs, the block mask's
 *      geometry and broadcast, offsets that keep the mods' indices in int);
 *   2. resolve the mod's parameters (fgi_bind) and pack them into the
 *      by-value struct fg_mod_params the emitted code declares;
 *   3. fill the kernel's argument block (fgi_attn_abi, mirrored in the
 *      template) and cuLaunchKernel on the caller's stream.
 * Nothing here synchronises: errors found by the driver at launch come back
 * as FG_ERR_CUDA with the driver's message; faults inside the kernel surface
 * at the caller's next synchronisation, as with any CUDA launch.
 *
 * A fg_kernel keeps its own copy of the mod's parameter declarations (names,
 * kinds, types, defaults) so that binding at launch does not depend on the
 * mod object staying alive after fg_kernel_get. The CUfunction belongs to the
 * CUDA context that was current at fg_kernel_get; the kernel cache keeps the
 * module loaded for the life of the process.
 *
 * Variants: the portable kernel (templates/attention/attention_fwd.cuh, mma.sync,
 * sm_80 and newer) and the Hopper kernel (templates/attention/attention_fwd_sm90.cuh,
 * wgmma, sm_90a) share the entry signature and the argument block;
 * fg_kernel_get chooses between them (choose_kind) and the launch geometry
 * comes from the chosen one (fgi_attn_geometry).
 */
#include "attention/attention.h"

#include "blockmask/blockmask.h"
#include "codegen/codegen.h"
#include "driver/cudrv.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct fg_kernel {
    fg_mod params;      /* parameter declarations only (own arena)        */
    fg_kernel_kind kind; /* FG_KERNEL_ATTENTION_FWD or _SM90             */
    fg_dtype dtype;
    int head_dim;
    int q_block;        /* the configuration's: selects the tile height   */
    fgi_attn_geom geom; /* tile sizes, threads and shared memory          */
    CUfunction fn;
    uint64_t cu_id;     /* the CUDA context fn was loaded in              */
};

/* ---- argument checks shared with the reference ------------------------- */

float fgi_attn_scale(const fg_attention_args *args) {
    return args->scale != 0.f ? args->scale : 1.0f / sqrtf((float)args->head_dim);
}

/* Effective (b, h, s) strides of one tensor: all zero means contiguous with
 * dims [d0, d1, d2, D]. */
static fg_status tensor_strides(fg_ctx *ctx, const char *name, const int64_t in[4], int64_t d1,
                                int64_t d2, int64_t D, int64_t out[3]) {
    if (in[0] == 0 && in[1] == 0 && in[2] == 0 && in[3] == 0) {
        out[2] = D;
        out[1] = d2 * D;
        out[0] = d1 * d2 * D;
        return FG_OK;
    }
    if (in[3] != 1)
        return fgi_error(ctx, FG_ERR_SHAPE, "%s: the last (d) stride must be 1, got %lld", name,
                         (long long)in[3]);
    for (int i = 0; i < 3; i++) {
        if (in[i] < 0)
            return fgi_error(ctx, FG_ERR_SHAPE, "%s: negative stride %lld in dimension %d", name,
                             (long long)in[i], i);
        out[i] = in[i];
    }
    return FG_OK;
}

static bool index_range_ok(int len, int offset) {
    int64_t lo = offset, hi = (int64_t)offset + len - 1;
    return lo >= INT_MIN && hi <= INT_MAX;
}

fg_status fgi_attn_check_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a,
                              fgi_attn_strides *st) {
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    FGI_CHECK_ARG(ctx, a, "NULL attention arguments");
    FGI_CHECK_ARG(ctx, a->dtype == FG_BF16 || a->dtype == FG_FP16,
                  "dtype %d is not FG_BF16 or FG_FP16", (int)a->dtype);
    if (a->head_dim < 16 || a->head_dim > 256 || a->head_dim % 16 != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d: supported are multiples of 16 in [16, 256]", a->head_dim);
    if (a->batch < 1 || a->heads_q < 1 || a->heads_kv < 1 || a->q_len < 1 || a->kv_len < 1)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "batch %d, heads_q %d, heads_kv %d, q_len %d, kv_len %d: each must be >= 1",
                         a->batch, a->heads_q, a->heads_kv, a->q_len, a->kv_len);
    if (a->heads_q % a->heads_kv != 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "heads_q %d is not a multiple of heads_kv %d",
                         a->heads_q, a->heads_kv);
    FGI_CHECK_ARG(ctx, a->q && a->k && a->v && a->out, "NULL q, k, v or out");
    FGI_CHECK_ARG(ctx, a->binds || a->nbinds == 0, "NULL bindings with a non-zero count");
    FGI_CHECK_ARG(ctx, isfinite(a->scale), "the scale must be finite");
    if (!index_range_ok(a->q_len, a->q_offset) || !index_range_ok(a->kv_len, a->kv_offset))
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "q_offset %d / kv_offset %d push the mods' indices past the int range",
                         a->q_offset, a->kv_offset);
    const int64_t D = a->head_dim;
    FGI_TRY(tensor_strides(ctx, "q", a->q_stride, a->heads_q, a->q_len, D, st->q));
    FGI_TRY(tensor_strides(ctx, "k", a->k_stride, a->heads_kv, a->kv_len, D, st->k));
    FGI_TRY(tensor_strides(ctx, "v", a->v_stride, a->heads_kv, a->kv_len, D, st->v));
    FGI_TRY(tensor_strides(ctx, "out", a->out_stride, a->heads_q, a->q_len, D, st->o));
    return FG_OK;
}

/* ---- device-side checks --------------------------------------------------- */

/* cp.async moves 16-byte chunks of q, k and v rows; out is written two
 * elements (4 bytes) at a time. */
static fg_status check_alignment(fg_ctx *ctx, const fg_attention_args *a, const fgi_attn_strides *st) {
    struct {
        const char *name;
        const void *p;
        const int64_t *s;
        unsigned align;
    } t[4] = {{"q", a->q, st->q, 16}, {"k", a->k, st->k, 16}, {"v", a->v, st->v, 16},
              {"out", a->out, st->o, 4}};
    for (int i = 0; i < 4; i++) {
        unsigned elems = t[i].align / 2;
        if ((uintptr_t)t[i].p % t[i].align != 0)
            return fgi_error(ctx, FG_ERR_SHAPE, "%s: the pointer must be %u-byte aligned", t[i].name,
                             t[i].align);
        for (int d = 0; d < 3; d++)
            if (t[i].s[d] % elems != 0)
                return fgi_error(ctx, FG_ERR_SHAPE,
                                 "%s: stride %lld of dimension %d must be a multiple of %u elements",
                                 t[i].name, (long long)t[i].s[d], d, elems);
    }
    if (a->lse && (uintptr_t)a->lse % 4 != 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "lse: the pointer must be 4-byte aligned");
    return FG_OK;
}

static fg_status block_mask_args(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a,
                                 fgi_attn_abi *abi) {
    fg_block_mask *m = (fg_block_mask *)a->block_mask; /* uploading is a cache fill */
    const fg_block_mask_desc *d = &m->desc;
    const int bm = k->geom.block_m, bn = k->geom.block_n;
    if (d->q_block % bm != 0 || d->kv_block % bn != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "block mask blocks %d x %d: this %s kernel (head dim %d, configured for q "
                         "blocks of %d) needs q blocks that are multiples of %d and kv blocks "
                         "multiples of %d; smaller blocks need a kernel configured with them",
                         d->q_block, d->kv_block,
                         k->kind == FG_KERNEL_ATTENTION_FWD_SM90 ? "Hopper" : "portable",
                         k->head_dim, k->q_block, bm, bn);
    FGI_TRY(fgi_block_mask_check(ctx, m, a->batch, a->heads_q, a->q_len, a->kv_len, d->q_block,
                                 d->kv_block));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_NUM_BLOCKS, &abi->kv_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_INDICES, &abi->kv_idx));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_NUM_BLOCKS, &abi->full_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_INDICES, &abi->full_idx));
    abi->has_block_mask = 1;
    abi->bm_batch = d->batch;
    abi->bm_heads = d->heads;
    abi->bm_q_blocks = m->q_blocks;
    abi->bm_kv_blocks = m->kv_blocks;
    abi->bm_q_block = d->q_block;
    abi->bm_kv_block = d->kv_block;
    return FG_OK;
}

/* ---- the kernel object -------------------------------------------------- */

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

/* The device must run sm_80 code and give a block the shared memory the
 * kernel needs; the function's dynamic limit is raised past 48 KB. */
static fg_status prepare_function(fg_ctx *ctx, fg_kernel *k) {
    int major = 0, minor = 0;
    FGI_TRY(fgi_cuda_arch(ctx, &major, &minor));
    if (major < 8)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "the forward kernel needs compute capability 8.0 or newer (device: %d.%d)",
                         major, minor);
    CUdevice dev;
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxGetDevice(&dev), "cuCtxGetDevice");
    int optin = 0;
    FGI_CU_TRY(ctx,
               fgi_cu()->cuDeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                              dev),
               "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
    const size_t smem = k->geom.smem;
    if (smem > (size_t)optin)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "head dim %d needs %zu bytes of shared memory per block; the device allows %d",
                         k->head_dim, smem, optin);
    if (smem > 48 * 1024)
        FGI_CU_TRY(ctx,
                   fgi_cu()->cuFuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                (int)smem),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    return FG_OK;
}

/* Which forward kernel serves `cfg` on the current device. Asked for the
 * forward kernel, the Hopper one is taken on compute capability 9.0 where it
 * applies (fgi_codegen_sm90_applies) when `allow_hopper`; asked for the
 * Hopper kernel by name, the device must be a 9.0 one. */
static fg_status choose_kind(fg_ctx *ctx, fg_kernel_config *cfg, bool allow_hopper) {
    int major = 0, minor = 0;
    FGI_TRY(fgi_cuda_arch(ctx, &major, &minor));
    const bool hopper = major == 9 && minor == 0 && fgi_cu()->cuTensorMapEncodeTiled;
    if (cfg->kind == FG_KERNEL_ATTENTION_FWD_SM90) {
        if (!hopper)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "the Hopper kernel needs compute capability 9.0 and a driver with "
                             "cuTensorMapEncodeTiled (device: %d.%d)",
                             major, minor);
        return FG_OK;
    }
    if (allow_hopper && hopper && fgi_codegen_sm90_applies(cfg)) cfg->kind = FG_KERNEL_ATTENTION_FWD_SM90;
    return FG_OK;
}

static fg_status kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                            bool allow_hopper, fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output pointer");
    *out = NULL;
    fg_kernel_config cfg;
    if (config) {
        cfg = *config;
        FGI_CHECK_ARG(ctx, cfg.kind == FG_KERNEL_ATTENTION_FWD || cfg.kind == FG_KERNEL_ATTENTION_FWD_SM90,
                      "fg_kernel_get makes attention kernels (kind FG_KERNEL_ATTENTION_FWD or "
                      "FG_KERNEL_ATTENTION_FWD_SM90), got kind %d",
                      (int)cfg.kind);
    } else {
        memset(&cfg, 0, sizeof cfg);
        cfg.kind = FG_KERNEL_ATTENTION_FWD;
    }
    FGI_TRY(fgi_cuda_ready(ctx));
    FGI_TRY(choose_kind(ctx, &cfg, allow_hopper));

    fgi_codegen cg;
    FGI_TRY(fgi_codegen_init(ctx, mod, &cfg, &cg));
    cg.spec.entry = "fg_attention_fwd";
    fg_kernel *k = calloc(1, sizeof *k);
    fg_status st = k ? FG_OK : fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (kernel)");
    if (st == FG_OK) {
        k->kind = cg.config.kind;
        k->dtype = cg.config.dtype;
        k->head_dim = cg.config.head_dim;
        k->q_block = cg.config.q_block;
        k->geom = fgi_attn_geometry(k->kind, k->head_dim, k->q_block);
        st = copy_params(ctx, mod, &k->params);
    }
    if (st == FG_OK) st = fgi_cache_get_function(ctx, &cg.spec, &k->fn);
    fgi_codegen_free(&cg);
    if (st == FG_OK) {
        CUcontext cu;
        st = fgi_cuda_current(ctx, &cu, &k->cu_id);
    }
    if (st == FG_OK) st = prepare_function(ctx, k);
    if (st != FG_OK) {
        fg_kernel_release(k);
        return st;
    }
    *out = k;
    return FG_OK;
}

fg_status fg_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                        fg_kernel **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    return kernel_get(ctx, mod, config, ctx->hopper_kernel != 0, out);
}

fg_kernel_kind fg_kernel_kind_of(const fg_kernel *k) { return k ? k->kind : (fg_kernel_kind)0; }

void fg_kernel_release(fg_kernel *k) {
    if (!k) return;
    fgi_arena_free(&k->params.arena);
    free(k);
}

/* ---- launch ----------------------------------------------------------- */

static void fill_abi(const fg_kernel *k, const fg_attention_args *a, const fgi_attn_strides *st,
                     fgi_attn_abi *abi) {
    abi->q = (uint64_t)(uintptr_t)a->q;
    abi->k = (uint64_t)(uintptr_t)a->k;
    abi->v = (uint64_t)(uintptr_t)a->v;
    abi->out = (uint64_t)(uintptr_t)a->out;
    abi->lse = (uint64_t)(uintptr_t)a->lse;
    memcpy(abi->q_stride, st->q, sizeof st->q);
    memcpy(abi->k_stride, st->k, sizeof st->k);
    memcpy(abi->v_stride, st->v, sizeof st->v);
    memcpy(abi->o_stride, st->o, sizeof st->o);
    abi->batch = a->batch;
    abi->heads_q = a->heads_q;
    abi->heads_kv = a->heads_kv;
    abi->q_len = a->q_len;
    abi->kv_len = a->kv_len;
    abi->q_offset = a->q_offset;
    abi->kv_offset = a->kv_offset;
    abi->scale = fgi_attn_scale(a);
    abi->scale_log2 = (float)((double)abi->scale * 1.4426950408889634);
    abi->q_tiles = (a->q_len + k->geom.block_m - 1) / k->geom.block_m;
}

/* The Hopper kernel's third argument: q, k and v as [batch, heads, len, D]
 * tensor maps with the caller's strides, boxes of 128 rows x 64 columns
 * (one 128-byte swizzle line per row) that TMA copies into shared memory in
 * the swizzled layout wgmma reads. Rows past len are zero-filled. */
typedef struct hopper_maps {
    CUtensorMap q, k, v;
} hopper_maps;

static fg_status encode_map(fg_ctx *ctx, CUtensorMap *map, fg_dtype dtype, const void *ptr, int head_dim,
                            int len, int heads, int batch, const int64_t st[3], const char *name) {
    cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)len, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3] = {(cuuint64_t)st[2] * 2, (cuuint64_t)st[1] * 2, (cuuint64_t)st[0] * 2};
    /* A dimension of extent 1 is never stepped over; give it a stride the
     * encoder accepts whatever the caller passed (0, say). */
    cuuint64_t natural = (cuuint64_t)head_dim * 2;
    for (int i = 0; i < 3; i++) {
        if (dims[i + 1] == 1) strides[i] = natural;
        natural = strides[i] * dims[i + 1];
    }
    cuuint32_t box[4] = {64, 128, 1, 1}, elem[4] = {1, 1, 1, 1};
    CUresult r = fgi_cu()->cuTensorMapEncodeTiled(
        map, dtype == FG_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
        (void *)ptr, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL;
        fgi_cu()->cuGetErrorString(r, &msg);
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "%s: the Hopper kernel cannot describe this tensor to TMA (strides %lld, %lld, "
                         "%lld elements): %s; the portable kernel (FG_OPT_HOPPER_KERNEL 0) takes it",
                         name, (long long)st[0], (long long)st[1], (long long)st[2], msg ? msg : "error");
    }
    return FG_OK;
}

static fg_status encode_maps(fg_ctx *ctx, const fg_attention_args *a, const fgi_attn_strides *st,
                             hopper_maps *m) {
    FGI_TRY(encode_map(ctx, &m->q, a->dtype, a->q, a->head_dim, a->q_len, a->heads_q, a->batch, st->q, "q"));
    FGI_TRY(encode_map(ctx, &m->k, a->dtype, a->k, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->k, "k"));
    FGI_TRY(encode_map(ctx, &m->v, a->dtype, a->v, a->head_dim, a->kv_len, a->heads_kv, a->batch, st->v, "v"));
    return FG_OK;
}

fg_status fg_kernel_launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, k, "NULL kernel");
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, &k->params, a, &st));
    if (a->dtype != k->dtype || a->head_dim != k->head_dim)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the kernel was compiled for %s, head dim %d; the call has %s, head dim %d",
                         k->dtype == FG_FP16 ? "fp16" : "bf16", k->head_dim,
                         a->dtype == FG_FP16 ? "fp16" : "bf16", a->head_dim);
    if (a->heads_q > 65535 || a->batch > 65535)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "heads_q %d and batch %d must be <= 65535",
                         a->heads_q, a->batch);
    FGI_TRY(check_alignment(ctx, a, &st));
    FGI_TRY(fgi_cuda_ready(ctx));
    CUcontext cu;
    uint64_t id;
    FGI_TRY(fgi_cuda_current(ctx, &cu, &id));
    if (id != k->cu_id)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the kernel was loaded in another CUDA context than the current one");

    fgi_attn_abi abi;
    memset(&abi, 0, sizeof abi);
    fill_abi(k, a, &st, &abi);
    if (a->block_mask) FGI_TRY(block_mask_args(ctx, k, a, &abi));

    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bind(ctx, &k->params, a->binds, a->nbinds, values));
    fgi_param_layout layout;
    fgi_param_layout_compute(&k->params, &layout);
    _Alignas(16) unsigned char blob[FGI_MAX_PARAMS * 16 + 16];
    fgi_param_pack(&k->params, &layout, values, blob);

    hopper_maps maps; /* 64-byte aligned, as CUtensorMap is */
    if (k->kind == FG_KERNEL_ATTENTION_FWD_SM90) FGI_TRY(encode_maps(ctx, a, &st, &maps));
    void *params[3] = {&abi, blob, &maps};
    FGI_CU_TRY(ctx,
               fgi_cu()->cuLaunchKernel(k->fn, (unsigned)abi.q_tiles, (unsigned)a->heads_q,
                                        (unsigned)a->batch, (unsigned)k->geom.threads, 1, 1,
                                        (unsigned)k->geom.smem, (CUstream)a->stream, params, NULL),
               "cuLaunchKernel(fg_attention_fwd)");
    return FG_OK;
}

fg_status fg_attention_forward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args, "NULL mod or arguments");
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, mod, args, &st));
    fg_kernel_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = FG_KERNEL_ATTENTION_FWD;
    cfg.dtype = args->dtype;
    cfg.head_dim = args->head_dim;
    /* The kernels read the block mask's geometry at run time; the tile
     * height depends only on whether q blocks are under 128 rows, and
     * blocks under 128 in either direction keep the portable kernel, so
     * a few configurations serve every block size. */
    const fg_block_mask_desc *bm = args->block_mask ? &args->block_mask->desc : NULL;
    cfg.q_block = bm && bm->q_block < 128 ? 64 : 128;
    cfg.kv_block = bm && bm->kv_block < 128 ? 64 : 128;
    fg_kernel *k;
    FGI_TRY(fg_kernel_get(ctx, mod, &cfg, &k));
    fg_status s = fg_kernel_launch(ctx, k, args);
    const bool retry = s == FG_ERR_NOT_SUPPORTED && k->kind == FG_KERNEL_ATTENTION_FWD_SM90;
    fg_kernel_release(k);
    if (retry) {
        /* A layout TMA cannot describe: the portable kernel takes any
         * layout the argument checks accept. */
        s = kernel_get(ctx, mod, &cfg, false, &k);
        if (s != FG_OK) return s;
        s = fg_kernel_launch(ctx, k, args);
        fg_kernel_release(k);
    }
    return s;
}
