/* attention.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fg_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config, fg_kernel **out) {
    (void)mod;
    (void)config;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/attention.c: not implemented");
}

void fg_kernel_release(fg_kernel *kernel) {
    (void)kernel;
}

fg_status fg_attention_forward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args) {
    (void)mod;
    (void)args;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/attention.c: not implemented");
}

fg_status fg_kernel_launch(fg_ctx *ctx, fg_kernel *kernel, const fg_attention_args *args) {
    (void)kernel;
    (void)args;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/attention.c: not implemented");
}
