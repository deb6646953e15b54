/*
 * mod.c -- the public life of a mod: creation from a file, from source text
 * or from a bare expression, composition, introspection and destruction.
 *
 * A mod owns one arena. Everything it points to lives there: the AST, the
 * parameter table, the canonical text, and copies of the source text and
 * file name of every function, so diagnostics and the emitter's #line
 * directives keep working after the caller has freed its text. Destroying a
 * mod is freeing the arena.
 *
 * The expression form builds exactly what the file form builds: parameters
 * from the API declarations (in order, as if declared above the function),
 * one function whose body is `return <expr>;` with the canonical argument
 * names, checked by the same checker. That is why `q_idx >= kv_idx` through
 * fg_mod_from_expr and mods/causal.c print the same canonical text.
 *
 * Composition (fg_mod_and / fg_mod_or / fg_mod_combine) deep-copies the
 * inputs' checked trees into the new mod's arena. The parameter lists are
 * merged by name (first input's order, then the second's new names), and the
 * second input's PARAM and INDEX nodes are renumbered through a map as they
 * are copied. The inputs are never modified, so one mod can take part in
 * many compositions, from many threads.
 */
#include "mod/front.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- creation ----------------------------------------------------------- */

static fg_status new_mod(fg_ctx *ctx, fg_mod **out) {
    fg_mod *m = calloc(1, sizeof *m);
    if (!m) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory creating a mod");
    fgi_arena_init(&m->arena);
    *out = m;
    return FG_OK;
}

void fg_mod_destroy(fg_mod *mod) {
    if (!mod) return;
    fgi_arena_free(&mod->arena);
    free(mod);
}

static fg_status mod_oom(fg_ctx *ctx) {
    return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
}

/* "dir/sliding_window.c" -> "sliding_window" */
static char *base_name(fgi_arena *a, const char *path) {
    const char *s = strrchr(path, '/');
    s = s ? s + 1 : path;
    const char *dot = strrchr(s, '.');
    size_t n = dot && dot != s ? (size_t)(dot - s) : strlen(s);
    return fgi_arena_strndup(a, s, n);
}

fg_status fgi_mod_parse(fg_ctx *ctx, const char *filename, const char *text, size_t len,
                        fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, text && out, "fg_mod_from_source: text and out must not be NULL");
    *out = NULL;
    if (!filename) filename = "<source>";
    if (len > (size_t)ctx->max_source)
        return fgi_error(ctx, FG_ERR_LIMIT,
                         "%s: source is %zu bytes, more than the limit of %d (FG_OPT_MAX_SOURCE)",
                         filename, len, ctx->max_source);
    fg_mod *mod = NULL;
    FGI_TRY(new_mod(ctx, &mod));
    char *src = fgi_arena_strndup(&mod->arena, text, len);
    mod->filename = fgi_arena_strdup(&mod->arena, filename);
    mod->name = mod->filename ? base_name(&mod->arena, mod->filename) : NULL;
    if (!src || !mod->name) {
        fg_mod_destroy(mod);
        return mod_oom(ctx);
    }
    fgi_token *toks = NULL;
    int ntoks = 0;
    fg_status st = fgi_lex(ctx, mod->filename, src, len, &toks, &ntoks);
    if (st == FG_OK) st = fgi_parse_file(ctx, mod, mod->filename, src, len, toks, ntoks);
    free(toks);
    if (st == FG_OK) st = fgi_mod_finish(ctx, mod);
    if (st != FG_OK) {
        fg_mod_destroy(mod);
        return st;
    }
    *out = mod;
    return FG_OK;
}

fg_status fg_mod_from_source(fg_ctx *ctx, const char *name, const char *text, size_t len,
                             fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, text && out, "fg_mod_from_source: text and out must not be NULL");
    if (len == (size_t)-1) len = strlen(text);
    return fgi_mod_parse(ctx, name, text, len, out);
}

fg_status fg_mod_from_file(fg_ctx *ctx, const char *path, fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, path && out, "fg_mod_from_file: path and out must not be NULL");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return fgi_error(ctx, FG_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    /* Read at most one byte past the limit: enough to know it is too long. */
    size_t cap = (size_t)ctx->max_source + 1;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return mod_oom(ctx);
    }
    size_t n = fread(buf, 1, cap, f);
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (err) {
        free(buf);
        return fgi_error(ctx, FG_ERR_IO, "cannot read '%s': %s", path, strerror(err ? err : EIO));
    }
    if (n == cap) {
        free(buf);
        return fgi_error(ctx, FG_ERR_LIMIT,
                         "%s: the file is longer than the limit of %d bytes (FG_OPT_MAX_SOURCE)",
                         path, ctx->max_source);
    }
    fg_status st = fgi_mod_parse(ctx, path, buf, n, out);
    free(buf);
    return st;
}

/* ---- the expression form ------------------------------------------------ */

static bool valid_identifier(const char *s) {
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

/* A name the lexer would not turn into a name (keywords, reserved words). */
static bool lexes_as_name(fg_ctx *ctx, const char *s) {
    fgi_token *toks = NULL;
    int n = 0;
    size_t len = strlen(s);
    /* lexing a valid identifier cannot fail except for memory */
    fg_status st = fgi_lex(ctx, "<param>", s, len, &toks, &n);
    bool ok = st == FG_OK && n == 2 && toks[0].kind == FGI_TK_IDENT;
    free(toks);
    return ok;
}

static fg_status add_api_param(fg_ctx *ctx, fg_mod *mod, const fg_param_decl *d, size_t i) {
    FGI_CHECK_ARG(ctx, d->name && valid_identifier(d->name),
                  "parameter %zu: name must be a C identifier", i);
    FGI_CHECK_ARG(ctx, strlen(d->name) <= 256, "parameter %zu: name too long", i);
    if (!lexes_as_name(ctx, d->name))
        return fgi_error(ctx, FG_ERR_NAME, "parameter '%s': the name is a reserved word", d->name);
    const char *why = fgi_name_reserved(d->name);
    if (why) return fgi_error(ctx, FG_ERR_NAME, "parameter '%s' is reserved: %s", d->name, why);
    for (int a = 0; a < 5; a++)
        if (strcmp(d->name, fgi_canonical_arg_names[a]) == 0)
            return fgi_error(ctx, FG_ERR_NAME,
                             "parameter '%s' has the name of an argument of the expression",
                             d->name);
    if (fgi_mod_find_param(mod, d->name) >= 0)
        return fgi_error(ctx, FG_ERR_NAME, "duplicate parameter '%s'", d->name);
    FGI_CHECK_ARG(ctx, d->kind == FG_PARAM_SCALAR || d->kind == FG_PARAM_BUFFER,
                  "parameter '%s': invalid kind %d", d->name, (int)d->kind);
    FGI_CHECK_ARG(ctx, d->type == FG_TYPE_INT || d->type == FG_TYPE_FLOAT,
                  "parameter '%s': type must be FG_TYPE_INT or FG_TYPE_FLOAT", d->name);
    fgi_param *p = &mod->params[mod->nparams];
    p->name = fgi_arena_strdup(&mod->arena, d->name);
    if (!p->name) return mod_oom(ctx);
    p->kind = d->kind;
    p->type = d->type == FG_TYPE_INT ? FGI_T_INT : FGI_T_FLOAT;
    p->offset = -1;
    if (d->kind == FG_PARAM_SCALAR && p->type == FGI_T_INT) {
        double v = d->default_value;
        FGI_CHECK_ARG(ctx, v == v && v >= -2147483648.0 && v <= 2147483647.0 && v == floor(v),
                      "parameter '%s': default %g is not a 32-bit integer", d->name, v);
        p->def.i = (int32_t)v;
    } else if (d->kind == FG_PARAM_SCALAR) {
        p->def.f = (float)d->default_value;
    }
    mod->nparams++;
    return FG_OK;
}

static fg_status build_expr_mod(fg_ctx *ctx, fg_mod *mod, fg_mod_kind kind, const char *expr,
                                const fg_param_decl *params, size_t nparams) {
    FGI_CHECK_ARG(ctx, nparams <= FGI_MAX_PARAMS, "too many parameters (%zu; at most %d)",
                  nparams, FGI_MAX_PARAMS);
    mod->params = fgi_arena_alloc(&mod->arena, sizeof(fgi_param) * (nparams ? nparams : 1));
    mod->name = fgi_arena_strdup(&mod->arena, "expr");
    mod->filename = fgi_arena_strdup(&mod->arena, "<expr>");
    fgi_func *fn = fgi_arena_alloc(&mod->arena, sizeof *fn);
    size_t len = strlen(expr);
    char *src = fgi_arena_strndup(&mod->arena, expr, len);
    if (!mod->params || !mod->name || !mod->filename || !fn || !src) return mod_oom(ctx);
    for (size_t i = 0; i < nparams; i++) FGI_TRY(add_api_param(ctx, mod, &params[i], i));
    if (len > (size_t)ctx->max_source)
        return fgi_error(ctx, FG_ERR_LIMIT,
                         "expression is %zu bytes, more than the limit of %d (FG_OPT_MAX_SOURCE)",
                         len, ctx->max_source);
    fn->kind = kind == FG_MASK_MOD ? FGI_FUNC_MASK : FGI_FUNC_SCORE;
    for (int i = 0; i < 5; i++) fn->arg_names[i] = fgi_canonical_arg_names[i];
    fn->src = src;
    fn->src_len = len;
    fn->filename = mod->filename;
    fgi_token *toks = NULL;
    int ntoks = 0;
    FGI_TRY(fgi_lex(ctx, fn->filename, src, len, &toks, &ntoks));
    fg_status st = fgi_parse_expr(ctx, mod, fn, toks, ntoks);
    free(toks);
    FGI_TRY(st);
    FGI_TRY(fgi_check_func(ctx, mod, fn, mod->nparams));
    if (fn->kind == FGI_FUNC_SCORE) {
        mod->score = fn;
    } else {
        mod->mask = fgi_arena_alloc(&mod->arena, sizeof *mod->mask);
        if (!mod->mask) return mod_oom(ctx);
        mod->mask->op = FGI_MASK_LEAF;
        mod->mask->func = fn;
    }
    return fgi_mod_finish(ctx, mod);
}

fg_status fg_mod_from_expr(fg_ctx *ctx, fg_mod_kind kind, const char *expr,
                           const fg_param_decl *params, size_t nparams, fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, expr && out, "fg_mod_from_expr: expr and out must not be NULL");
    FGI_CHECK_ARG(ctx, params || nparams == 0, "fg_mod_from_expr: params is NULL");
    FGI_CHECK_ARG(ctx, kind == FG_MASK_MOD || kind == FG_SCORE_MOD,
                  "fg_mod_from_expr: kind must be FG_MASK_MOD or FG_SCORE_MOD");
    *out = NULL;
    fg_mod *mod = NULL;
    FGI_TRY(new_mod(ctx, &mod));
    fg_status st = build_expr_mod(ctx, mod, kind, expr, params, nparams);
    if (st != FG_OK) {
        fg_mod_destroy(mod);
        return st;
    }
    *out = mod;
    return FG_OK;
}

/* ---- composition -------------------------------------------------------- */

typedef struct copier {
    fg_ctx *ctx;
    fg_mod *dst;
    int map[FGI_MAX_PARAMS]; /* source param index -> destination index */
} copier;

static fgi_expr *copy_expr(copier *cp, const fgi_expr *e) {
    if (!e) return NULL;
    fgi_expr *n = fgi_arena_alloc(&cp->dst->arena, sizeof *n);
    if (!n) return NULL;
    *n = *e;
    if (e->name && !(n->name = fgi_arena_strdup(&cp->dst->arena, e->name))) return NULL;
    if (e->kind == FGI_E_PARAM || e->kind == FGI_E_INDEX) n->index = cp->map[e->index];
    if ((e->a && !(n->a = copy_expr(cp, e->a))) || (e->b && !(n->b = copy_expr(cp, e->b))) ||
        (e->c && !(n->c = copy_expr(cp, e->c))))
        return NULL;
    if (e->nargs) {
        n->args = fgi_arena_alloc(&cp->dst->arena, sizeof(fgi_expr *) * (size_t)e->nargs);
        if (!n->args) return NULL;
        for (int i = 0; i < e->nargs; i++)
            if (!(n->args[i] = copy_expr(cp, e->args[i]))) return NULL;
    }
    return n;
}

static fgi_func *copy_func(copier *cp, const fgi_func *f) {
    fgi_arena *a = &cp->dst->arena;
    fgi_func *n = fgi_arena_alloc(a, sizeof *n);
    if (!n) return NULL;
    *n = *f;
    for (int i = 0; i < 5; i++)
        if (f->arg_names[i] && !(n->arg_names[i] = fgi_arena_strdup(a, f->arg_names[i])))
            return NULL;
    n->src = fgi_arena_strndup(a, f->src, f->src_len);
    n->filename = fgi_arena_strdup(a, f->filename);
    n->locals = f->nlocals ? fgi_arena_alloc(a, sizeof(fgi_local) * (size_t)f->nlocals) : NULL;
    if (!n->src || !n->filename || (f->nlocals && !n->locals)) return NULL;
    for (int i = 0; i < f->nlocals; i++) {
        n->locals[i] = f->locals[i];
        n->locals[i].name = fgi_arena_strdup(a, f->locals[i].name);
        n->locals[i].init = copy_expr(cp, f->locals[i].init);
        if (!n->locals[i].name || !n->locals[i].init) return NULL;
    }
    n->ret = copy_expr(cp, f->ret);
    return n->ret ? n : NULL;
}

static fgi_mask_node *copy_mask(copier *cp, const fgi_mask_node *m) {
    fgi_mask_node *n = fgi_arena_alloc(&cp->dst->arena, sizeof *n);
    if (!n) return NULL;
    n->op = m->op;
    if (m->op == FGI_MASK_LEAF) return (n->func = copy_func(cp, m->func)) ? n : NULL;
    n->a = copy_mask(cp, m->a);
    n->b = copy_mask(cp, m->b);
    return n->a && n->b ? n : NULL;
}

/* Add `src`'s parameters to dst (sharing same-named ones) and fill the map. */
static fg_status merge_params(copier *cp, const fg_mod *src) {
    fg_mod *dst = cp->dst;
    for (int i = 0; i < src->nparams; i++) {
        const fgi_param *p = &src->params[i];
        int j = fgi_mod_find_param(dst, p->name);
        if (j >= 0) {
            const fgi_param *q = &dst->params[j];
            if (q->kind != p->kind || q->type != p->type)
                return fgi_error(cp->ctx, FG_ERR_NAME,
                                 "parameter '%s' is %s %s in '%s' but %s %s in '%s'", p->name,
                                 q->kind == FG_PARAM_BUFFER ? "a buffer of" : "a scalar",
                                 fgi_type_name(q->type), dst->name,
                                 p->kind == FG_PARAM_BUFFER ? "a buffer of" : "a scalar",
                                 fgi_type_name(p->type), src->name);
            cp->map[i] = j;
            continue;
        }
        if (dst->nparams >= FGI_MAX_PARAMS)
            return fgi_error(cp->ctx, FG_ERR_LIMIT, "too many parameters (more than %d)",
                             FGI_MAX_PARAMS);
        fgi_param *n = &dst->params[dst->nparams];
        *n = *p;
        n->name = fgi_arena_strdup(&dst->arena, p->name);
        if (!n->name) return mod_oom(cp->ctx);
        cp->map[i] = dst->nparams++;
    }
    return FG_OK;
}

/* Build `out` from the mask of `ma` and/or the score of `sc`, combining two
 * masks with `op` when both ma and mb are given. */
static fg_status compose(fg_ctx *ctx, const fg_mod *ma, const fg_mod *mb, fgi_mask_op op,
                         const fg_mod *sc, const char *name, fg_mod *out) {
    const fg_mod *inputs[3] = {ma, mb, sc};
    out->params = fgi_arena_alloc(&out->arena, sizeof(fgi_param) * FGI_MAX_PARAMS);
    out->name = fgi_arena_strdup(&out->arena, name);
    out->filename = fgi_arena_strdup(&out->arena, ma ? ma->filename : sc->filename);
    if (!out->params || !out->name || !out->filename) return mod_oom(ctx);
    fgi_mask_node *parts[2] = {NULL, NULL};
    for (int k = 0; k < 3; k++) {
        if (!inputs[k]) continue;
        copier cp = {ctx, out, {0}};
        FGI_TRY(merge_params(&cp, inputs[k]));
        if (k < 2 && !(parts[k] = copy_mask(&cp, inputs[k]->mask))) return mod_oom(ctx);
        if (k == 2 && !(out->score = copy_func(&cp, sc->score))) return mod_oom(ctx);
    }
    if (parts[0] && parts[1]) {
        fgi_mask_node *n = fgi_arena_alloc(&out->arena, sizeof *n);
        if (!n) return mod_oom(ctx);
        n->op = op;
        n->a = parts[0];
        n->b = parts[1];
        out->mask = n;
    } else {
        out->mask = parts[0];
    }
    return fgi_mod_finish(ctx, out);
}

static fg_status compose_new(fg_ctx *ctx, const fg_mod *ma, const fg_mod *mb, fgi_mask_op op,
                             const fg_mod *sc, fg_mod **out) {
    char name[256];
    if (ma && mb)
        snprintf(name, sizeof name, "%s_%s_%s", ma->name, op == FGI_MASK_AND ? "and" : "or",
                 mb->name);
    else if (ma && sc)
        snprintf(name, sizeof name, "%s_with_%s", ma->name, sc->name);
    else
        snprintf(name, sizeof name, "%s", ma ? ma->name : sc->name);
    fg_mod *m = NULL;
    FGI_TRY(new_mod(ctx, &m));
    fg_status st = compose(ctx, ma, mb, op, sc, name, m);
    if (st != FG_OK) {
        fg_mod_destroy(m);
        return st;
    }
    *out = m;
    return FG_OK;
}

/* Height of a composition tree; the tree walks of the printer, evaluator
 * and emitter recurse over it, so it is bounded like expression nesting. */
static int mask_height(const fgi_mask_node *n) {
    if (n->op == FGI_MASK_LEAF) return 1;
    int ha = mask_height(n->a), hb = mask_height(n->b);
    return 1 + (ha > hb ? ha : hb);
}

static fg_status mask_op(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fgi_mask_op op,
                         fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, a && b && out, "mask composition: a, b and out must not be NULL");
    *out = NULL;
    FGI_CHECK_ARG(ctx, a->mask && b->mask, "mask composition: both inputs need a mask_mod");
    FGI_CHECK_ARG(ctx, !a->score && !b->score,
                  "mask composition: inputs may not have a score_mod (use fg_mod_combine)");
    int ha = mask_height(a->mask), hb = mask_height(b->mask);
    if (1 + (ha > hb ? ha : hb) > ctx->max_depth)
        return fgi_error(ctx, FG_ERR_LIMIT,
                         "mask composition nested too deeply (more than %d levels; "
                         "FG_OPT_MAX_DEPTH)",
                         ctx->max_depth);
    return compose_new(ctx, a, b, op, NULL, out);
}

fg_status fg_mod_and(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out) {
    return mask_op(ctx, a, b, FGI_MASK_AND, out);
}

fg_status fg_mod_or(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out) {
    return mask_op(ctx, a, b, FGI_MASK_OR, out);
}

fg_status fg_mod_combine(fg_ctx *ctx, const fg_mod *mask_from, const fg_mod *score_from,
                         fg_mod **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, out, "fg_mod_combine: out must not be NULL");
    *out = NULL;
    FGI_CHECK_ARG(ctx, mask_from || score_from, "fg_mod_combine: both inputs are NULL");
    FGI_CHECK_ARG(ctx, !mask_from || mask_from->mask, "fg_mod_combine: mask_from has no mask_mod");
    FGI_CHECK_ARG(ctx, !score_from || score_from->score,
                  "fg_mod_combine: score_from has no score_mod");
    return compose_new(ctx, mask_from, NULL, FGI_MASK_LEAF, score_from, out);
}

/* ---- accessors ---------------------------------------------------------- */

int fg_mod_has_mask(const fg_mod *mod) { return mod && mod->mask; }
int fg_mod_has_score(const fg_mod *mod) { return mod && mod->score; }
const char *fg_mod_name(const fg_mod *mod) { return mod && mod->name ? mod->name : ""; }
const char *fg_mod_canonical(const fg_mod *mod) {
    return mod && mod->canonical ? mod->canonical : "";
}
uint64_t fg_mod_hash(const fg_mod *mod) { return mod ? mod->hash : 0; }
size_t fg_mod_param_count(const fg_mod *mod) { return mod ? (size_t)mod->nparams : 0; }

fg_status fg_mod_param(const fg_mod *mod, size_t index, fg_param_info *info) {
    if (!mod || !info || index >= (size_t)mod->nparams) return FG_ERR_INVALID_ARGUMENT;
    const fgi_param *p = &mod->params[index];
    info->name = p->name;
    info->kind = p->kind;
    info->type = p->type == FGI_T_INT ? FG_TYPE_INT : FG_TYPE_FLOAT;
    info->default_value = p->kind == FG_PARAM_BUFFER ? 0.0
                        : p->type == FGI_T_INT       ? (double)p->def.i
                                                     : (double)p->def.f;
    return FG_OK;
}
