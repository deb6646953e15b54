/* cuda.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fgi_cuda_ready(fg_ctx *ctx) {
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/cuda.c: not implemented");
}

fg_status fgi_cuda_arch(fg_ctx *ctx, int *major, int *minor) {
    (void)major;
    (void)minor;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/cuda.c: not implemented");
}

void fgi_cuda_state_free(struct fgi_cuda_state *s) {
    (void)s;
}

const char *fgi_effective_arch(fg_ctx *ctx) {
    (void)ctx;
    return "sm_90a";
}
