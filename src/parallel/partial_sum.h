/*
 * partial_sum.h -- fp32 sums of partial results (partial_sum.c, kernel
 * templates/parallel/partial_sum.cuh): what context parallelism's backward
 * adds its gradient contributions with.
 */
#ifndef FLEXGEN_PARTIAL_SUM_H
#define FLEXGEN_PARTIAL_SUM_H

#include "internal.h"

#define FGI_SUM_MAX_PARTS 4

/* x = acc_in + parts[0] + ... + parts[nparts - 1] over [batch][heads][rows]
 * [head_dim], into acc_out (fp32) and/or out (dtype). Strides are (b, h,
 * row) in elements with a d stride of 1; acc_in and acc_out share
 * acc_stride and may be the same memory; a NULL acc_in is zero. With no
 * part and no acc_in the outputs are zeroed. */
typedef struct fgi_sum_args {
    fg_dtype dtype;
    int batch, heads, rows, head_dim;
    int nparts;
    const void *parts[FGI_SUM_MAX_PARTS];
    int64_t part_stride[3];
    const float *acc_in;
    float *acc_out;
    int64_t acc_stride[3];
    void *out;
    int64_t out_stride[3];
    void *stream; /* CUstream */
} fgi_sum_args;

/* Queue the sum on a->stream. FG_ERR_SHAPE for an odd head dim or a
 * pointer or stride the kernel's paired accesses cannot take (fp32 rows
 * 8-byte aligned, dtype rows 4-byte aligned); FG_ERR_INVALID_ARGUMENT for
 * no output, a NULL part or too many parts. Nothing is queued for 0 rows. */
fg_status fgi_partial_sum(fg_ctx *ctx, const fgi_sum_args *a);

#endif
