/*
 * ast.c -- the vocabulary of the typed tree that every stage shares: type
 * names, the canonical argument names, parameter lookup by name. It depends
 * on nothing but internal.h, so the checker, the printer, the bindings and
 * the emitter can all use it without calling each other.
 */
#include "mod/front.h"

#include <string.h>

const char *const fgi_canonical_arg_names[5] = {"b", "h", "q_idx", "kv_idx", "score"};

const char *fgi_type_name(fgi_type t) {
    switch (t) {
    case FGI_T_BOOL: return "bool";
    case FGI_T_INT: return "int";
    case FGI_T_FLOAT: return "float";
    default: return "none";
    }
}

int fgi_mod_find_param(const fg_mod *mod, const char *name) {
    if (!mod || !name) return -1;
    for (int i = 0; i < mod->nparams; i++)
        if (strcmp(mod->params[i].name, name) == 0) return i;
    return -1;
}

/* The float value of a tree made of float literals, + - * / and unary
 * signs (as the derivatives come out of src/mod/deriv.c, unfolded: 1.0f *
 * 2.0f), following locals; false for anything else. `depth` bounds the
 * walk. */
static bool const_float(const fgi_func *fn, const fgi_expr *e, int depth, float *out) {
    if (!e || depth > 64 || e->type != FGI_T_FLOAT) return false;
    float x, y;
    switch (e->kind) {
    case FGI_E_FLOAT_LIT: *out = e->lit.f; return true;
    case FGI_E_LOCAL:
        return e->index >= 0 && e->index < fn->nlocals && const_float(fn, fn->locals[e->index].init, depth + 1, out);
    case FGI_E_UNARY:
        if ((e->op != FGI_OP_NEG && e->op != FGI_OP_PLUS) || !const_float(fn, e->a, depth + 1, &x)) return false;
        *out = e->op == FGI_OP_NEG ? -x : x;
        return true;
    case FGI_E_BINARY:
        if (!const_float(fn, e->a, depth + 1, &x) || !const_float(fn, e->b, depth + 1, &y)) return false;
        switch (e->op) {
        case FGI_OP_ADD: *out = x + y; return true;
        case FGI_OP_SUB: *out = x - y; return true;
        case FGI_OP_MUL: *out = x * y; return true;
        case FGI_OP_DIV: *out = x / y; return true;
        default: return false;
        }
    default: return false;
    }
}

bool fgi_func_const_float(const fgi_func *fn, float *out) { return fn && const_float(fn, fn->ret, 0, out); }

bool fgi_mod_runs_score(const fg_mod *mod) { return mod->score && !fgi_score_is_identity(mod->score); }

bool fgi_score_is_identity(const fgi_func *fn) {
    if (!fn || fn->kind != FGI_FUNC_SCORE) return false;
    const fgi_expr *e = fn->ret;
    /* a local's chain ends: each local's initialiser refers only to
     * earlier locals */
    for (int steps = 0; e && steps <= fn->nlocals + 64; steps++) {
        if (e->kind == FGI_E_LOCAL && e->index >= 0 && e->index < fn->nlocals)
            e = fn->locals[e->index].init;
        else if (e->kind == FGI_E_UNARY && e->op == FGI_OP_PLUS)
            e = e->a;
        else if (e->kind == FGI_E_CAST && e->type == FGI_T_FLOAT && e->a && e->a->type == FGI_T_FLOAT)
            e = e->a;
        else
            return e->kind == FGI_E_ARG && e->op == FGI_ARG_SCORE;
    }
    return false;
}
