/* reference.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fg_attention_reference(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args, double *out, double *lse) {
    (void)mod;
    (void)args;
    (void)out;
    (void)lse;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/reference.c: not implemented");
}
