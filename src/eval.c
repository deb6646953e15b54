/* eval.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fgi_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h, int q0, int nq, int kv0, int nk, uint8_t *out) {
    (void)mod;
    (void)values;
    (void)b;
    (void)h;
    (void)q0;
    (void)nq;
    (void)kv0;
    (void)nk;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/eval.c: not implemented");
}

fg_status fgi_eval_score(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h, int q0, int nq, int kv0, int nk, const float *in, float *out) {
    (void)mod;
    (void)values;
    (void)b;
    (void)h;
    (void)q0;
    (void)nq;
    (void)kv0;
    (void)nk;
    (void)in;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/eval.c: not implemented");
}

fg_status fg_mod_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds, int b, int h, int q0, int nq, int kv0, int nk, uint8_t *out) {
    (void)mod;
    (void)binds;
    (void)nbinds;
    (void)b;
    (void)h;
    (void)q0;
    (void)nq;
    (void)kv0;
    (void)nk;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/eval.c: not implemented");
}

fg_status fg_mod_eval_score(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds, int b, int h, int q0, int nq, int kv0, int nk, const float *in, float *out) {
    (void)mod;
    (void)binds;
    (void)nbinds;
    (void)b;
    (void)h;
    (void)q0;
    (void)nq;
    (void)kv0;
    (void)nk;
    (void)in;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/eval.c: not implemented");
}
