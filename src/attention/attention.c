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
    return FG_OK;
}
