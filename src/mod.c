/* mod.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fgi_mod_parse(fg_ctx *ctx, const char *filename, const char *text, size_t len, fg_mod **out) {
    (void)filename;
    (void)text;
    (void)len;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fgi_mod_finish(fg_ctx *ctx, fg_mod *mod) {
    (void)mod;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

char *fgi_expr_canonical(const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    (void)mod;
    (void)fn;
    (void)e;
    return NULL;
}

int fgi_mod_find_param(const fg_mod *mod, const char *name) {
    (void)mod;
    (void)name;
    return -1;
}

const char *fgi_type_name(fgi_type t) {
    (void)t;
    return "?";
}

const char *fgi_builtin_name(fgi_builtin fn) {
    (void)fn;
    return "?";
}

fg_status fg_mod_from_file(fg_ctx *ctx, const char *path, fg_mod **out) {
    (void)path;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fg_mod_from_source(fg_ctx *ctx, const char *name, const char *text, size_t len, fg_mod **out) {
    (void)name;
    (void)text;
    (void)len;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fg_mod_from_expr(fg_ctx *ctx, fg_mod_kind kind, const char *expr, const fg_param_decl *params, size_t nparams, fg_mod **out) {
    (void)kind;
    (void)expr;
    (void)params;
    (void)nparams;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fg_mod_and(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out) {
    (void)a;
    (void)b;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fg_mod_or(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out) {
    (void)a;
    (void)b;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

fg_status fg_mod_combine(fg_ctx *ctx, const fg_mod *mask_from, const fg_mod *score_from, fg_mod **out) {
    (void)mask_from;
    (void)score_from;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/mod.c: not implemented");
}

void fg_mod_destroy(fg_mod *mod) {
    (void)mod;
}

int fg_mod_has_mask(const fg_mod *mod) {
    (void)mod;
    return 0;
}

int fg_mod_has_score(const fg_mod *mod) {
    (void)mod;
    return 0;
}

const char *fg_mod_name(const fg_mod *mod) {
    (void)mod;
    return "?";
}

const char *fg_mod_canonical(const fg_mod *mod) {
    (void)mod;
    return "";
}

uint64_t fg_mod_hash(const fg_mod *mod) {
    (void)mod;
    return 0;
}

size_t fg_mod_param_count(const fg_mod *mod) {
    (void)mod;
    return 0;
}

fg_status fg_mod_param(const fg_mod *mod, size_t index, fg_param_info *info) {
    (void)mod;
    (void)index;
    (void)info;
    return FG_ERR_NOT_SUPPORTED;
}
