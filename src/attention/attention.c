/*
 * attention.c -- the argument checks every attention entry point shares:
 * the GPU launchers (forward.c) and the CPU references (reference/).
 *
 * They look only at the struct the caller passed -- its size, the shapes,
 * the strides, the offsets -- never at where the tensors live, so the
 * references run them on host pointers and the launchers add the device's
 * own checks (alignment, the block mask's geometry against the kernel's
 * tiles) after them.
 */
#include "attention/attention.h"

#include "base/growable.h"
#include "blockmask/blockmask.h"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- argument checks shared with the reference ------------------------- */

fg_status fgi_attn_args_in(fg_ctx *ctx, const fg_attention_args *in, fg_attention_args *out) {
    return FGI_STRUCT_IN(ctx, fg_attention_args, in, out);
}

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

static bool all_zero(const int64_t st[4]) { return st[0] == 0 && st[1] == 0 && st[2] == 0 && st[3] == 0; }

/* Paged K/V: the table, a power-of-two page of 16 to 256 rows, enough
 * pages per sequence for kv_len, and k / v strides read as (page, head,
 * row in page), all zero meaning [num_pages, page_size, heads_kv, D]. */
fg_status fgi_attn_check_pages(fg_ctx *ctx, const fg_attention_args *a) {
    const int ps = a->page_size;
    if (ps < 16 || ps > 256 || (ps & (ps - 1)) != 0)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "page size %d: paged K/V takes powers of two in [16, 256]", ps);
    if (a->num_pages < 1 || a->max_pages < 1)
        return fgi_error(ctx, FG_ERR_SHAPE, "num_pages %d and max_pages %d must be >= 1", a->num_pages,
                         a->max_pages);
    return FG_OK;
}

static fg_status check_paged(fg_ctx *ctx, const fg_attention_args *a, fgi_attn_strides *st) {
    FGI_CHECK_ARG(ctx, a->block_table, "page_size, num_pages or max_pages given without a block table");
    FGI_TRY(fgi_attn_check_pages(ctx, a));
    const int ps = a->page_size;
    if ((int64_t)a->max_pages * ps < a->kv_len)
        return fgi_error(ctx, FG_ERR_SHAPE, "kv_len %d does not fit in max_pages %d pages of %d rows", a->kv_len,
                         a->max_pages, ps);
    const int64_t D = a->head_dim, row = (int64_t)a->heads_kv * D;
    if (all_zero(a->k_stride)) st->k[0] = ps * row, st->k[1] = D, st->k[2] = row;
    if (all_zero(a->v_stride)) st->v[0] = ps * row, st->v[1] = D, st->v[2] = row;
    return FG_OK;
}

fg_status fgi_attn_check_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a,
                              fgi_attn_strides *st) {
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    FGI_CHECK_ARG(ctx, a, "NULL attention arguments");
    fg_attention_args in;
    FGI_TRY(fgi_attn_args_in(ctx, a, &in));
    a = &in;
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
    if (a->block_table || a->page_size || a->num_pages || a->max_pages) FGI_TRY(check_paged(ctx, a, st));
    if (a->block_mask) {
        /* a mask describes the positions the mods see (fg_block_mask_desc) */
        const fg_block_mask_desc *d = &a->block_mask->desc;
        if ((!a->q_offsets && d->q_offset != a->q_offset) || d->kv_offset != a->kv_offset)
            return fgi_error(ctx, FG_ERR_SHAPE,
                             "the block mask was built for offsets %d / %d, the call has q_offset %d, "
                             "kv_offset %d",
                             d->q_offset, d->kv_offset, a->q_offset, a->kv_offset);
    }
    return FG_OK;
}

/* ---- the backward's checks ------------------------------------------------ */

fg_status fgi_attn_bwd_args_in(fg_ctx *ctx, const fg_attention_bwd_args *in, fg_attention_bwd_args *out,
                               fg_attention_args *fwd) {
    FGI_CHECK_ARG(ctx, in, "NULL backward arguments");
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_attention_bwd_args, in, out));
    FGI_CHECK_ARG(ctx, out->fwd, "NULL forward arguments (fg_attention_bwd_args.fwd)");
    FGI_TRY(fgi_attn_args_in(ctx, out->fwd, fwd));
    out->fwd = fwd;
    return FG_OK;
}

fg_status fgi_attn_check_bwd_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *b,
                                  fgi_attn_strides *st, fgi_attn_bwd_strides *bst) {
    const fg_attention_args *a = b->fwd;
    FGI_TRY(fgi_attn_check_args(ctx, mod, a, st));
    if (a->kv_lens || a->q_offsets || a->block_table)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "the backward takes uniform lengths and contiguous K/V (no kv_lens, q_offsets or "
                         "block table)");
    FGI_CHECK_ARG(ctx, b->dout && b->dq && b->dk && b->dv, "NULL dout, dq, dk or dv");
    FGI_CHECK_ARG(ctx, b->grad_binds || b->ngrad_binds == 0, "NULL gradient bindings with a non-zero count");
    const int64_t D = a->head_dim;
    FGI_TRY(tensor_strides(ctx, "dout", b->dout_stride, a->heads_q, a->q_len, D, bst->dout));
    FGI_TRY(tensor_strides(ctx, "dq", b->dq_stride, a->heads_q, a->q_len, D, bst->dq));
    FGI_TRY(tensor_strides(ctx, "dk", b->dk_stride, a->heads_kv, a->kv_len, D, bst->dk));
    FGI_TRY(tensor_strides(ctx, "dv", b->dv_stride, a->heads_kv, a->kv_len, D, bst->dv));
    return FG_OK;
}

fg_status fgi_attn_grad_binds(fg_ctx *ctx, const fg_mod *mod, const fgi_grad_layout *L,
                              const fg_binding *binds, size_t nbinds, const fgi_value *bound,
                              const void *out[FGI_MAX_GRAD_BUFFERS], int64_t len[FGI_MAX_GRAD_BUFFERS]) {
    for (int k = 0; k < FGI_MAX_GRAD_BUFFERS; k++) out[k] = NULL, len[k] = 0;
    for (size_t i = 0; i < nbinds; i++) {
        const fg_binding *g = &binds[i];
        FGI_CHECK_ARG(ctx, g->name, "gradient binding %zu has a NULL name", i);
        int p = -1;
        for (int j = 0; j < mod->nparams; j++)
            if (strcmp(mod->params[j].name, g->name) == 0) p = j;
        if (p < 0)
            return fgi_error(ctx, FG_ERR_UNBOUND, "gradient binding '%s' names no parameter of the mod",
                             g->name);
        const fgi_param *pp = &mod->params[p];
        if (pp->kind != FG_PARAM_BUFFER || pp->type != FGI_T_FLOAT)
            return fgi_error(ctx, FG_ERR_UNBOUND,
                             "gradient binding '%s': only float buffers get gradients ('%s' is %s %s)",
                             g->name, g->name, pp->type == FGI_T_FLOAT ? "a float" : "an int",
                             pp->kind == FG_PARAM_BUFFER ? "buffer" : "scalar");
        int k = -1;
        for (int j = 0; j < L->n; j++)
            if (L->param[j] == p) k = j;
        if (k < 0)
            return fgi_error(ctx, FG_ERR_UNBOUND,
                             "gradient binding '%s': score_mod's value does not depend on '%s' (it is "
                             "read only by mask_mod, under a comparison or cast to int, or not at "
                             "all), so its gradient is zero",
                             g->name, g->name);
        if (out[k])
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "gradient binding '%s' given twice", g->name);
        if (g->kind != FG_PARAM_BUFFER || g->type != FG_TYPE_FLOAT)
            return fgi_error(ctx, FG_ERR_UNBOUND,
                             "gradient binding '%s' must be a float buffer binding (fg_bind_float_buffer)",
                             g->name);
        FGI_CHECK_ARG(ctx, g->value.buffer.data, "gradient binding '%s' has NULL data", g->name);
        if (g->value.buffer.length < bound[p].length)
            return fgi_error(ctx, FG_ERR_SHAPE,
                             "gradient binding '%s' has %lld elements; the buffer bound to '%s' has %lld",
                             g->name, (long long)g->value.buffer.length, g->name,
                             (long long)bound[p].length);
        out[k] = g->value.buffer.data;
        len[k] = bound[p].length;
    }
    return FG_OK;
}

bool fgi_attn_aligned(const void *p, const int64_t st[3], unsigned align) {
    const unsigned elems = align / 2;
    return (uintptr_t)p % align == 0 && st[0] % elems == 0 && st[1] % elems == 0 && st[2] % elems == 0;
}

fg_status fgi_attn_check_aligned(fg_ctx *ctx, const char *name, const void *p, const int64_t st[3],
                                 unsigned align) {
    if (fgi_attn_aligned(p, st, align)) return FG_OK;
    const unsigned elems = align / 2;
    if ((uintptr_t)p % align != 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "%s: the pointer must be %u-byte aligned", name, align);
    for (int d = 0; d < 3; d++)
        if (st[d] % elems != 0)
            return fgi_error(ctx, FG_ERR_SHAPE, "%s: stride %lld of dimension %d must be a multiple of %u elements",
                             name, (long long)st[d], d, elems);
    return FG_OK;
}

fg_status fgi_attn_abi_block_mask(fg_ctx *ctx, fg_block_mask *m, fgi_attn_abi *abi) {
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_NUM_BLOCKS, &abi->kv_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_KV_INDICES, &abi->kv_idx));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_NUM_BLOCKS, &abi->full_num));
    FGI_TRY(fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_INDICES, &abi->full_idx));
    FGI_ATTN_ABI_FILL_BLOCK_MASK(abi, m);
    return FG_OK;
}

fg_status fgi_attn_abi_seq(fg_ctx *ctx, const fg_attention_args *a, fgi_attn_abi *abi) {
    const void *arrays[3] = {a->kv_lens, a->q_offsets, a->block_table};
    for (int i = 0; i < 3; i++)
        if ((uintptr_t)arrays[i] % 4 != 0)
            return fgi_error(ctx, FG_ERR_SHAPE, "kv_lens, q_offsets and block_table must be 4-byte aligned");
    abi->kv_lens = (uint64_t)(uintptr_t)a->kv_lens;
    abi->q_offsets = (uint64_t)(uintptr_t)a->q_offsets;
    if (a->block_table) {
        abi->paged = 1;
        abi->block_table = (uint64_t)(uintptr_t)a->block_table;
        abi->num_pages = a->num_pages;
        abi->max_pages = a->max_pages;
        abi->page_shift = 0;
        while ((1 << abi->page_shift) < a->page_size) abi->page_shift++;
    }
    return FG_OK;
}

fg_status fgi_attn_check_call(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a, fgi_attn_strides *st) {
    FGI_TRY(fgi_attn_check_args(ctx, &k->params, a, st));
    if (a->dtype != k->config.dtype || a->head_dim != k->config.head_dim)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the kernel was compiled for %s, head dim %d; the call has %s, head dim %d",
                         k->config.dtype == FG_FP16 ? "fp16" : "bf16", k->config.head_dim,
                         a->dtype == FG_FP16 ? "fp16" : "bf16", a->head_dim);
    return FG_OK;
}

fg_status fgi_attn_check_io_aligned(fg_ctx *ctx, const fg_attention_args *a, const fgi_attn_strides *st) {
    FGI_TRY(fgi_attn_check_aligned(ctx, "q", a->q, st->q, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "k", a->k, st->k, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "v", a->v, st->v, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "out", a->out, st->o, 4));
    if (a->lse && (uintptr_t)a->lse % 4 != 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "lse: the pointer must be 4-byte aligned");
    return FG_OK;
}

/* ---- tensor maps for the Hopper kernels ----------------------------------- */

fg_status fgi_attn_tensor_map(fg_ctx *ctx, CUtensorMap *map, fg_dtype dtype, const void *ptr, int head_dim, int len,
                              int heads, int batch, const int64_t st[3], int box_rows, const char *name) {
    cuuint64_t dims[4] = {(cuuint64_t)head_dim, (cuuint64_t)len, (cuuint64_t)heads, (cuuint64_t)batch};
    cuuint64_t strides[3] = {(cuuint64_t)st[2] * 2, (cuuint64_t)st[1] * 2, (cuuint64_t)st[0] * 2};
    /* A dimension of extent 1 is never stepped over; give it a stride the
     * encoder accepts whatever the caller passed (0, say). */
    cuuint64_t natural = (cuuint64_t)head_dim * 2;
    for (int i = 0; i < 3; i++) {
        if (dims[i + 1] == 1) strides[i] = natural;
        natural = strides[i] * dims[i + 1];
    }
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, elem[4] = {1, 1, 1, 1};
    CUresult r = fgi_cu()->cuTensorMapEncodeTiled(
        map, dtype == FG_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
        (void *)ptr, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL;
        fgi_cu()->cuGetErrorString(r, &msg);
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                         "%s: the Hopper kernels cannot describe this tensor to TMA (strides %lld, %lld, "
                         "%lld elements): %s; the portable kernels (FG_OPT_HOPPER_KERNEL 0) take it",
                         name, (long long)st[0], (long long)st[1], (long long)st[2], msg ? msg : "error");
    }
    return FG_OK;
}

/* ---- workspace ------------------------------------------------------------- */

fg_status fgi_attn_ws_alloc(fg_ctx *ctx, fgi_attn_ws *w, size_t bytes, void *stream) {
    w->base = 0;
    w->async = fgi_cu()->cuMemAllocAsync && fgi_cu()->cuMemFreeAsync;
    if (bytes == 0) return FG_OK;
    CUmemoryPool pool = NULL;
    if (w->async) FGI_TRY(fgi_cuda_ws_pool(ctx, &pool));
    if (pool) {
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAllocFromPoolAsync(&w->base, bytes, pool, (CUstream)stream),
                   "cuMemAllocFromPoolAsync");
    } else if (w->async) {
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAllocAsync(&w->base, bytes, (CUstream)stream), "cuMemAllocAsync");
    } else {
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&w->base, bytes), "cuMemAlloc");
    }
    return FG_OK;
}

fg_status fgi_attn_ws_take(fg_ctx *ctx, fgi_attn_ws *w, const void *caller, size_t caller_size, size_t bytes,
                           void *stream, CUdeviceptr *base) {
    w->base = 0;
    w->async = false;
    *base = 0;
    if (caller && (uintptr_t)caller % 256 != 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "the workspace must be 256-byte aligned (cuMemAlloc's alignment)");
    if (bytes == 0) return FG_OK;
    if (caller && caller_size >= bytes) {
        *base = (CUdeviceptr)(uintptr_t)caller;
        return FG_OK;
    }
    FGI_TRY(fgi_attn_ws_alloc(ctx, w, bytes, stream));
    *base = w->base;
    return FG_OK;
}

fg_status fgi_attn_ws_free(fg_ctx *ctx, fgi_attn_ws *w, void *stream) {
    if (!w->base) return FG_OK;
    CUdeviceptr p = w->base;
    w->base = 0;
    if (w->async) {
        FGI_CU_TRY(ctx, fgi_cu()->cuMemFreeAsync(p, (CUstream)stream), "cuMemFreeAsync");
    } else {
        FGI_CU_TRY(ctx, fgi_cu()->cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemFree(p), "cuMemFree");
    }
    return FG_OK;
}
