/*
 * partial_sum.c -- fgi_partial_sum: the argument block of the partial-sum
 * kernel (abi_sum.def, templates/parallel/partial_sum.cuh) and its launch.
 * The kernel reads no mod (fgi_kernel_make_modless).
 */
#include "parallel/partial_sum.h"

#include "attention/attention.h"

#include <string.h>

typedef struct fgi_sum_abi {
#define FGI_ABI_ROW(T, ...) fgi_abi_##T __VA_ARGS__;
#include "parallel/abi_sum.def"
} fgi_sum_abi;
_Static_assert(sizeof(fgi_sum_abi) == 152, "fgi_sum_abi must match fgs_args");

/* A tensor's pointer and (b, h, row) strides fit the kernel's accesses of
 * two adjacent elements of `elem` bytes. */
static fg_status check_paired(fg_ctx *ctx, const char *name, const void *p, const int64_t st[3], size_t elem) {
    const size_t align = 2 * elem;
    bool ok = (uintptr_t)p % align == 0;
    for (int i = 0; i < 3; i++) ok &= st[i] >= 0 && st[i] % 2 == 0;
    if (!ok)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "partial sum: %s must be %zu-byte aligned with even, non-negative strides", name, align);
    return FG_OK;
}

fg_status fgi_partial_sum(fg_ctx *ctx, const fgi_sum_args *a) {
    FGI_CHECK_ARG(ctx, a, "NULL partial-sum arguments");
    FGI_CHECK_ARG(ctx, a->dtype == FG_BF16 || a->dtype == FG_FP16, "dtype %d is not FG_BF16 or FG_FP16",
                  (int)a->dtype);
    FGI_CHECK_ARG(ctx, a->nparts >= 0 && a->nparts <= FGI_SUM_MAX_PARTS, "partial sum of %d parts: 0..%d",
                  a->nparts, FGI_SUM_MAX_PARTS);
    FGI_CHECK_ARG(ctx, a->acc_out || a->out, "partial sum without an output");
    if (a->batch < 1 || a->heads < 1 || a->rows < 0 || a->head_dim < 2 || a->head_dim % 2)
        return fgi_error(ctx, FG_ERR_SHAPE, "partial sum of %d x %d x %d x %d: the head dim must be even",
                         a->batch, a->heads, a->rows, a->head_dim);
    if (a->rows == 0) return FG_OK;
    fgi_sum_abi abi;
    memset(&abi, 0, sizeof abi);
    for (int i = 0; i < a->nparts; i++) {
        FGI_CHECK_ARG(ctx, a->parts[i], "partial sum: NULL part %d", i);
        FGI_TRY(check_paired(ctx, "a part", a->parts[i], a->part_stride, 2));
        abi.parts[i] = (uint64_t)(uintptr_t)a->parts[i];
    }
    if (a->acc_in) FGI_TRY(check_paired(ctx, "acc_in", a->acc_in, a->acc_stride, 4));
    if (a->acc_out) FGI_TRY(check_paired(ctx, "acc_out", a->acc_out, a->acc_stride, 4));
    if (a->out) FGI_TRY(check_paired(ctx, "out", a->out, a->out_stride, 2));
    abi.acc_in = (uint64_t)(uintptr_t)a->acc_in;
    abi.acc_out = (uint64_t)(uintptr_t)a->acc_out;
    abi.out = (uint64_t)(uintptr_t)a->out;
    memcpy(abi.part_stride, a->part_stride, sizeof abi.part_stride);
    memcpy(abi.acc_stride, a->acc_stride, sizeof abi.acc_stride);
    memcpy(abi.o_stride, a->out_stride, sizeof abi.o_stride);
    abi.batch = a->batch, abi.heads = a->heads, abi.rows = a->rows, abi.head_dim = a->head_dim;
    abi.nparts = a->nparts;
    const int64_t pairs = (int64_t)a->batch * a->heads * a->rows * (a->head_dim / 2);
    const fgi_kernel_geom g = fgi_kernel_lookup(FGI_KOP_PARTIAL_SUM, FGI_VARIANT_PORTABLE)->geometry(NULL, NULL, 0);
    if ((pairs + g.threads - 1) / g.threads > 0x7fffffff)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "%lld elements are too many for one partial sum",
                         (long long)pairs * 2);
    fg_kernel *k;
    FGI_TRY(fgi_kernel_make_modless(ctx, FGI_KOP_PARTIAL_SUM, a->dtype, &k));
    void *params[1] = {&abi};
    const unsigned grid[3] = {(unsigned)((pairs + g.threads - 1) / g.threads), 1, 1};
    fg_status s = fgi_kernel_check_context(ctx, k);
    if (s == FG_OK) s = fgi_kernel_run(ctx, k, 0, grid, params, a->stream);
    fg_kernel_release(k);
    return s;
}
