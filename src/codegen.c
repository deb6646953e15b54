/* codegen.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fg_generate_source(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config, char **source) {
    (void)mod;
    (void)config;
    (void)source;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/codegen.c: not implemented");
}

fg_status fg_compile(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config, fg_emit_kind kind, void **image, size_t *size) {
    (void)mod;
    (void)config;
    (void)kind;
    (void)image;
    (void)size;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/codegen.c: not implemented");
}
