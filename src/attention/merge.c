/*
 * merge.c -- fg_attention_merge: partial attention results merged by their
 * log-sum-exps (templates/attention/attention_merge.cuh).
 *
 * The merge kernel reads no mod (fgi_kernel_make_modless); its argument
 * block comes from abi_merge.def like the attention kernels'.
 */
#include "attention/attention.h"

#include "base/growable.h"

#include <string.h>

typedef struct fgi_attn_merge_abi {
#define FGI_ABI_ROW(T, ...) fgi_abi_##T __VA_ARGS__;
#include "attention/abi_merge.def"
} fgi_attn_merge_abi;
_Static_assert(sizeof(fgi_attn_merge_abi) == 344, "fgi_attn_merge_abi must match fgm_args");
_Static_assert(FG_MERGE_MAX_PARTS == 16, "abi_merge.def holds 16 parts");

static fg_status part_strides(fg_ctx *ctx, const char *name, const int64_t in[4], const fg_merge_args *a,
                              int64_t out[3]) {
    if (in[0] == 0 && in[1] == 0 && in[2] == 0 && in[3] == 0) {
        out[2] = a->head_dim;
        out[1] = (int64_t)a->q_len * a->head_dim;
        out[0] = (int64_t)a->heads * out[1];
        return FG_OK;
    }
    if (in[3] != 1 || in[0] < 0 || in[1] < 0 || in[2] < 0)
        return fgi_error(ctx, FG_ERR_SHAPE, "%s: strides must be non-negative with a d stride of 1", name);
    memcpy(out, in, 3 * sizeof *out);
    return FG_OK;
}

fg_status fg_attention_merge(fg_ctx *ctx, const fg_merge_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, args, "NULL merge arguments");
    fg_merge_args a;
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_merge_args, args, &a));
    FGI_CHECK_ARG(ctx, a.dtype == FG_BF16 || a.dtype == FG_FP16, "dtype %d is not FG_BF16 or FG_FP16",
                  (int)a.dtype);
    if (a.batch < 1 || a.heads < 1 || a.q_len < 1 || a.head_dim < 1 || a.head_dim > 1024)
        return fgi_error(ctx, FG_ERR_SHAPE, "batch %d, heads %d, q_len %d must be >= 1 and head_dim %d in [1, 1024]",
                         a.batch, a.heads, a.q_len, a.head_dim);
    if (a.nparts < 1 || a.nparts > FG_MERGE_MAX_PARTS)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "nparts %d: a merge takes 1 to %d parts", a.nparts,
                         FG_MERGE_MAX_PARTS);
    FGI_CHECK_ARG(ctx, a.out, "NULL out");
    fgi_attn_merge_abi abi;
    memset(&abi, 0, sizeof abi);
    for (int i = 0; i < a.nparts; i++) {
        FGI_CHECK_ARG(ctx, a.outs[i] && a.lses[i], "NULL output or LSE of part %d", i);
        if ((uintptr_t)a.outs[i] % 2 || (uintptr_t)a.lses[i] % 4)
            return fgi_error(ctx, FG_ERR_SHAPE, "part %d: outputs must be 2-byte and LSEs 4-byte aligned", i);
        if (a.lse && (const float *)a.lse == a.lses[i])
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "lse is part %d's LSE: every thread of a row reads it while one writes", i);
        abi.outs[i] = (uint64_t)(uintptr_t)a.outs[i];
        abi.lses[i] = (uint64_t)(uintptr_t)a.lses[i];
    }
    if ((uintptr_t)a.out % 2 || (uintptr_t)a.lse % 4)
        return fgi_error(ctx, FG_ERR_SHAPE, "out must be 2-byte and lse 4-byte aligned");
    FGI_TRY(part_strides(ctx, "part_stride", a.part_stride, &a, abi.part_stride));
    FGI_TRY(part_strides(ctx, "out_stride", a.out_stride, &a, abi.o_stride));
    abi.out = (uint64_t)(uintptr_t)a.out;
    abi.lse = (uint64_t)(uintptr_t)a.lse;
    abi.batch = a.batch, abi.heads = a.heads, abi.q_len = a.q_len, abi.head_dim = a.head_dim;
    abi.nparts = a.nparts;
    const int64_t elems = (int64_t)a.batch * a.heads * a.q_len * a.head_dim;
    if ((elems + 127) / 128 > 0x7fffffff)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "%lld elements are too many for one merge", (long long)elems);

    fg_kernel *k;
    FGI_TRY(fgi_kernel_make_modless(ctx, FGI_KOP_ATTENTION_MERGE, a.dtype, &k));
    void *params[1] = {&abi};
    const unsigned grid[3] = {(unsigned)((elems + 127) / 128), 1, 1};
    fg_status s = fgi_kernel_check_context(ctx, k);
    if (s == FG_OK) s = fgi_kernel_run(ctx, k, 0, grid, params, a.stream);
    fg_kernel_release(k);
    return s;
}
