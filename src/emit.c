/* emit.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fgi_emit_mod(fg_ctx *ctx, const fg_mod *mod, fgi_buf *out) {
    (void)mod;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/emit.c: not implemented");
}
