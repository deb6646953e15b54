/*
 * check.c -- name resolution and typing of the mod language.
 *
 * The parser leaves identifiers as NAME nodes and every type at NONE. The
 * checker walks one function at a time and rewrites the tree into the form
 * internal.h promises the evaluator and the emitter: every name resolved to
 * an argument, a parameter, a local or a buffer index; every node typed; and
 * every implicit conversion C would perform made explicit as a CAST node.
 * After this pass nobody downstream reasons about promotion: an ADD has two
 * INT or two FLOAT operands, a condition is BOOL, a builtin's arguments
 * already have the builtin's types.
 *
 * The conversions are C's usual arithmetic conversions restricted to three
 * types: bool becomes int in arithmetic, int becomes float when the other
 * side is float, and anything tested for truth becomes bool. The places
 * where C would silently do something surprising are errors instead: % and
 * the bit operators on float, a float buffer index, a float mask_mod result,
 * a buffer used as a value.
 *
 * A cast applied to a literal is folded into a literal of the target type
 * (with the same C semantics the evaluator uses), and a cast to the type the
 * operand already has disappears. So `score + 1` and `score + 1.0f`, or
 * `(int)q_idx` and `q_idx`, become the same tree, print the same canonical
 * text and share one compiled kernel. A unary minus on a literal is folded
 * too, and unary plus vanishes.
 *
 * Names: the function arguments go by the names the user gave them (mapped
 * to FGI_ARG_* by position), parameters are visible from their declaration
 * on, locals from the declaration after theirs. An unknown name gets a
 * "did you mean" when a visible name is within edit distance 2.
 */
#include "mod/front.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct checker {
    fg_ctx *ctx;
    fg_mod *mod;
    fgi_func *fn;
    int nparams; /* visible parameters */
    int nlocals; /* visible locals     */
} checker;

/* ---- names -------------------------------------------------------------- */

int fgi_edit_distance(const char *a, const char *b, int cap) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 64 || nb > 64) return cap + 1;
    if ((na > nb ? na - nb : nb - na) > (size_t)cap) return cap + 1;
    int row[65];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb] > cap ? cap + 1 : row[nb];
}

const char *fgi_name_reserved(const char *name) {
    static const char *const cuda_names[] = {"threadIdx", "blockIdx", "blockDim", "gridDim",
                                             "warpSize", "mask_mod", "score_mod"};
    if (strncmp(name, "fg_", 3) == 0 || strncmp(name, "FG_", 3) == 0)
        return "names starting with fg_ or FG_ belong to flexgen";
    if (strncmp(name, "__", 2) == 0) return "names starting with __ belong to the compiler";
    for (size_t i = 0; i < sizeof cuda_names / sizeof cuda_names[0]; i++)
        if (strcmp(name, cuda_names[i]) == 0) return "the name is used by the generated CUDA";
    bool ff;
    if (fgi_builtin_lookup(name, &ff) >= 0) return "it is the name of a builtin function";
    return NULL;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static fg_status fail(checker *c, fg_status st, int offset, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fgi_error_at(c->ctx, st, c->fn->filename, c->fn->src, offset, "%s", msg);
}

static fg_status oom(checker *c) {
    return fgi_error(c->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory while checking");
}

static int nargs_of(const checker *c) { return c->fn->kind == FGI_FUNC_SCORE ? 5 : 4; }

/* The closest visible name, for "did you mean". */
static const char *suggest(const checker *c, const char *name) {
    const char *best = NULL;
    int best_d = 3;
    size_t n = strlen(name);
    for (int i = 0; i < c->nlocals; i++) {
        int d = fgi_edit_distance(name, c->fn->locals[i].name, 2);
        if (d < best_d) best_d = d, best = c->fn->locals[i].name;
    }
    for (int i = 0; i < nargs_of(c); i++) {
        int d = fgi_edit_distance(name, c->fn->arg_names[i], 2);
        if (d < best_d) best_d = d, best = c->fn->arg_names[i];
    }
    for (int i = 0; i < c->nparams; i++) {
        int d = fgi_edit_distance(name, c->mod->params[i].name, 2);
        if (d < best_d) best_d = d, best = c->mod->params[i].name;
    }
    return best && (size_t)best_d < n ? best : NULL;
}

static fg_status unknown_name(checker *c, const fgi_expr *e) {
    for (int i = c->nlocals; i < c->fn->nlocals; i++)
        if (strcmp(c->fn->locals[i].name, e->name) == 0)
            return fail(c, FG_ERR_NAME, e->offset, "'%s' is used before its declaration",
                        e->name);
    for (int i = c->nparams; i < c->mod->nparams; i++)
        if (strcmp(c->mod->params[i].name, e->name) == 0)
            return fail(c, FG_ERR_NAME, e->offset,
                        "parameter '%s' is used before its declaration", e->name);
    if (c->fn->kind == FGI_FUNC_MASK && strcmp(e->name, "score") == 0)
        return fail(c, FG_ERR_NAME, e->offset,
                    "unknown name 'score' (the score is only available in score_mod)");
    const char *s = suggest(c, e->name);
    if (s)
        return fail(c, FG_ERR_NAME, e->offset, "unknown name '%s' (did you mean '%s'?)", e->name,
                    s);
    return fail(c, FG_ERR_NAME, e->offset, "unknown name '%s'", e->name);
}

/* Which kind of thing `name` is: returns the expression kind and index. */
static fgi_expr_kind lookup(const checker *c, const char *name, int *index) {
    for (int i = 0; i < c->nlocals; i++)
        if (strcmp(c->fn->locals[i].name, name) == 0) {
            *index = i;
            return FGI_E_LOCAL;
        }
    for (int i = 0; i < nargs_of(c); i++)
        if (strcmp(c->fn->arg_names[i], name) == 0) {
            *index = i;
            return FGI_E_ARG;
        }
    for (int i = 0; i < c->nparams; i++)
        if (strcmp(c->mod->params[i].name, name) == 0) {
            *index = i;
            return c->mod->params[i].kind == FG_PARAM_BUFFER ? FGI_E_INDEX : FGI_E_PARAM;
        }
    return FGI_E_NAME;
}

/* ---- conversions -------------------------------------------------------- */

static bool is_literal(const fgi_expr *e) {
    return e->kind == FGI_E_INT_LIT || e->kind == FGI_E_FLOAT_LIT || e->kind == FGI_E_BOOL_LIT;
}

/* float -> int as the evaluator and CUDA's __float2int_rz do it. */
static int32_t float_to_int(float f) {
    if (f != f) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f <= -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

/* Turn literal `e` into a literal of type `to`, in place. */
static void fold_literal(fgi_expr *e, fgi_type to) {
    double v = e->kind == FGI_E_INT_LIT ? (double)e->lit.i
             : e->kind == FGI_E_FLOAT_LIT ? (double)e->lit.f
                                          : (double)e->lit.b;
    if (to == FGI_T_BOOL) {
        bool b = e->kind == FGI_E_FLOAT_LIT ? e->lit.f != 0.0f || e->lit.f != e->lit.f : v != 0;
        e->kind = FGI_E_BOOL_LIT;
        e->lit.b = b;
    } else if (to == FGI_T_INT) {
        int32_t i = e->kind == FGI_E_FLOAT_LIT ? float_to_int(e->lit.f)
                  : e->kind == FGI_E_INT_LIT   ? e->lit.i
                                               : (int32_t)e->lit.b;
        e->kind = FGI_E_INT_LIT;
        e->lit.i = i;
    } else {
        float f = e->kind == FGI_E_FLOAT_LIT ? e->lit.f
                : e->kind == FGI_E_INT_LIT   ? (float)e->lit.i
                                             : (float)e->lit.b;
        e->kind = FGI_E_FLOAT_LIT;
        e->lit.f = f;
    }
    e->type = to;
}

/* Make *pe have type `to`, wrapping it in a CAST (or folding a literal). */
static fg_status convert(checker *c, fgi_expr **pe, fgi_type to) {
    fgi_expr *e = *pe;
    if (e->type == to) return FG_OK;
    if (is_literal(e)) {
        fold_literal(e, to);
        return FG_OK;
    }
    fgi_expr *cast = fgi_arena_alloc(&c->mod->arena, sizeof *cast);
    if (!cast) return oom(c);
    cast->kind = FGI_E_CAST;
    cast->type = to;
    cast->op = (int)to;
    cast->offset = e->offset;
    cast->length = e->length;
    cast->a = e;
    *pe = cast;
    return FG_OK;
}

/* Arithmetic operand: bool counts as int. */
static fg_status to_arith(checker *c, fgi_expr **pe) {
    return (*pe)->type == FGI_T_BOOL ? convert(c, pe, FGI_T_INT) : FG_OK;
}

/* C's usual arithmetic conversions on two operands. */
static fg_status balance(checker *c, fgi_expr **pa, fgi_expr **pb) {
    FGI_TRY(to_arith(c, pa));
    FGI_TRY(to_arith(c, pb));
    if ((*pa)->type == FGI_T_FLOAT || (*pb)->type == FGI_T_FLOAT) {
        FGI_TRY(convert(c, pa, FGI_T_FLOAT));
        FGI_TRY(convert(c, pb, FGI_T_FLOAT));
    }
    return FG_OK;
}

static const char *op_text(int op) {
    static const char *const t[] = {
        [FGI_OP_NEG] = "-",   [FGI_OP_PLUS] = "+",  [FGI_OP_NOT] = "!",  [FGI_OP_BITNOT] = "~",
        [FGI_OP_ADD] = "+",   [FGI_OP_SUB] = "-",   [FGI_OP_MUL] = "*",  [FGI_OP_DIV] = "/",
        [FGI_OP_MOD] = "%",   [FGI_OP_SHL] = "<<",  [FGI_OP_SHR] = ">>", [FGI_OP_BAND] = "&",
        [FGI_OP_BOR] = "|",   [FGI_OP_BXOR] = "^",  [FGI_OP_LT] = "<",   [FGI_OP_LE] = "<=",
        [FGI_OP_GT] = ">",    [FGI_OP_GE] = ">=",   [FGI_OP_EQ] = "==",  [FGI_OP_NE] = "!=",
        [FGI_OP_LAND] = "&&", [FGI_OP_LOR] = "||",
    };
    return op > 0 && op <= FGI_OP_LOR ? t[op] : "?";
}

/* ---- expressions -------------------------------------------------------- */

static fg_status check_expr(checker *c, fgi_expr **pe);

static fg_status check_name(checker *c, fgi_expr *e, bool in_arith) {
    int index = 0;
    fgi_expr_kind k = lookup(c, e->name, &index);
    switch (k) {
    case FGI_E_LOCAL:
        e->kind = FGI_E_LOCAL;
        e->index = index;
        e->type = c->fn->locals[index].type;
        return FG_OK;
    case FGI_E_ARG:
        e->kind = FGI_E_ARG;
        e->op = index;
        e->type = index == FGI_ARG_SCORE ? FGI_T_FLOAT : FGI_T_INT;
        return FG_OK;
    case FGI_E_PARAM:
        e->kind = FGI_E_PARAM;
        e->index = index;
        e->type = c->mod->params[index].type;
        return FG_OK;
    case FGI_E_INDEX:
        if (in_arith)
            return fail(c, FG_ERR_UNSUPPORTED, e->offset,
                        "pointer arithmetic on buffer '%s' is not supported (index it: %s[i])",
                        e->name, e->name);
        return fail(c, FG_ERR_TYPE, e->offset,
                    "buffer '%s' cannot be used as a value (index it: %s[i])", e->name, e->name);
    default:
        return unknown_name(c, e);
    }
}

static fg_status check_index(checker *c, fgi_expr *e) {
    fgi_expr *base = e->a;
    if (base->kind != FGI_E_NAME)
        return fail(c, FG_ERR_TYPE, e->offset, "only a buffer parameter can be indexed");
    int index = 0;
    fgi_expr_kind k = lookup(c, base->name, &index);
    if (k == FGI_E_NAME) return unknown_name(c, base);
    if (k != FGI_E_INDEX)
        return fail(c, FG_ERR_TYPE, base->offset, "'%s' is not a buffer and cannot be indexed",
                    base->name);
    FGI_TRY(check_expr(c, &e->b));
    FGI_TRY(to_arith(c, &e->b));
    if (e->b->type != FGI_T_INT)
        return fail(c, FG_ERR_TYPE, e->b->offset, "the index of buffer '%s' must be int, not %s",
                    base->name, fgi_type_name(e->b->type));
    e->index = index;
    e->a = e->b;
    e->b = NULL;
    e->type = c->mod->params[index].type;
    return FG_OK;
}

static fg_status check_call(checker *c, fgi_expr *e) {
    bool force_float;
    int fn = fgi_builtin_lookup(e->name, &force_float);
    if (fn < 0) {
        const char *best = NULL;
        int best_d = 3;
        for (int i = 0; i < FGI_FN_COUNT; i++) {
            const char *name = fgi_builtin_get(i)->name;
            int d = fgi_edit_distance(e->name, name, 2);
            if (d < best_d) best_d = d, best = name;
        }
        if (best && (size_t)best_d < strlen(e->name))
            return fail(c, FG_ERR_UNSUPPORTED, e->offset,
                        "call to '%s' is not allowed (did you mean '%s'?)", e->name, best);
        return fail(c, FG_ERR_UNSUPPORTED, e->offset,
                    "call to '%s' is not allowed: only the builtin functions can be called",
                    e->name);
    }
    const fgi_builtin_info *bi = fgi_builtin_get(fn);
    if (e->nargs != bi->arity)
        return fail(c, FG_ERR_ARITY, e->offset, "'%s' takes %d argument%s, not %d", e->name,
                    bi->arity, bi->arity == 1 ? "" : "s", e->nargs);
    bool any_float = force_float || !bi->generic;
    for (int i = 0; i < e->nargs; i++) {
        FGI_TRY(check_expr(c, &e->args[i]));
        FGI_TRY(to_arith(c, &e->args[i]));
        if (e->args[i]->type == FGI_T_FLOAT) any_float = true;
    }
    fgi_type t = any_float ? FGI_T_FLOAT : FGI_T_INT;
    for (int i = 0; i < e->nargs; i++) FGI_TRY(convert(c, &e->args[i], t));
    e->op = fn;
    e->type = t;
    return FG_OK;
}

static fg_status check_unary(checker *c, fgi_expr **pe) {
    fgi_expr *e = *pe;
    FGI_TRY(check_expr(c, &e->a));
    switch ((fgi_op)e->op) {
    case FGI_OP_NOT:
        FGI_TRY(convert(c, &e->a, FGI_T_BOOL));
        e->type = FGI_T_BOOL;
        return FG_OK;
    case FGI_OP_BITNOT:
        FGI_TRY(to_arith(c, &e->a));
        if (e->a->type != FGI_T_INT)
            return fail(c, FG_ERR_TYPE, e->offset, "'~' needs an int operand, not float");
        e->type = FGI_T_INT;
        return FG_OK;
    case FGI_OP_PLUS:
        FGI_TRY(to_arith(c, &e->a));
        *pe = e->a;
        return FG_OK;
    default: /* NEG */
        FGI_TRY(to_arith(c, &e->a));
        e->type = e->a->type;
        if (e->a->kind == FGI_E_INT_LIT) {
            fgi_expr *lit = e->a;
            lit->lit.i = (int32_t)(0u - (uint32_t)lit->lit.i);
            lit->offset = e->offset;
            *pe = lit;
        } else if (e->a->kind == FGI_E_FLOAT_LIT) {
            fgi_expr *lit = e->a;
            lit->lit.f = -lit->lit.f;
            lit->offset = e->offset;
            *pe = lit;
        }
        return FG_OK;
    }
}

static bool is_buffer_name(const checker *c, const fgi_expr *e) {
    int index;
    return e->kind == FGI_E_NAME && lookup(c, e->name, &index) == FGI_E_INDEX;
}

static fg_status check_binary(checker *c, fgi_expr *e) {
    fgi_op op = (fgi_op)e->op;
    bool arith = op == FGI_OP_ADD || op == FGI_OP_SUB;
    if (arith && is_buffer_name(c, e->a)) return check_name(c, e->a, true);
    if (arith && is_buffer_name(c, e->b)) return check_name(c, e->b, true);
    FGI_TRY(check_expr(c, &e->a));
    FGI_TRY(check_expr(c, &e->b));
    switch (op) {
    case FGI_OP_LAND:
    case FGI_OP_LOR:
        FGI_TRY(convert(c, &e->a, FGI_T_BOOL));
        FGI_TRY(convert(c, &e->b, FGI_T_BOOL));
        e->type = FGI_T_BOOL;
        return FG_OK;
    case FGI_OP_EQ:
    case FGI_OP_NE:
        if (e->a->type == FGI_T_BOOL && e->b->type == FGI_T_BOOL) {
            e->type = FGI_T_BOOL;
            return FG_OK;
        }
        /* fall through */
    case FGI_OP_LT:
    case FGI_OP_LE:
    case FGI_OP_GT:
    case FGI_OP_GE:
        FGI_TRY(balance(c, &e->a, &e->b));
        e->type = FGI_T_BOOL;
        return FG_OK;
    case FGI_OP_MOD:
    case FGI_OP_SHL:
    case FGI_OP_SHR:
    case FGI_OP_BAND:
    case FGI_OP_BOR:
    case FGI_OP_BXOR:
        FGI_TRY(to_arith(c, &e->a));
        FGI_TRY(to_arith(c, &e->b));
        if (e->a->type == FGI_T_FLOAT || e->b->type == FGI_T_FLOAT)
            return fail(c, FG_ERR_TYPE, e->offset, "'%s' needs int operands, not float%s",
                        op_text(op), op == FGI_OP_MOD ? " (use fmod)" : "");
        e->type = FGI_T_INT;
        return FG_OK;
    default: /* + - * / */
        FGI_TRY(balance(c, &e->a, &e->b));
        e->type = e->a->type;
        return FG_OK;
    }
}

static fg_status check_cond(checker *c, fgi_expr *e) {
    FGI_TRY(check_expr(c, &e->a));
    FGI_TRY(convert(c, &e->a, FGI_T_BOOL));
    FGI_TRY(check_expr(c, &e->b));
    FGI_TRY(check_expr(c, &e->c));
    if (e->b->type == FGI_T_BOOL && e->c->type == FGI_T_BOOL) {
        e->type = FGI_T_BOOL;
        return FG_OK;
    }
    FGI_TRY(balance(c, &e->b, &e->c));
    e->type = e->b->type;
    return FG_OK;
}

static fg_status check_cast(checker *c, fgi_expr **pe) {
    fgi_expr *e = *pe;
    fgi_type to = (fgi_type)e->op;
    FGI_TRY(check_expr(c, &e->a));
    /* an explicit cast is just a conversion we were asked for */
    *pe = e->a;
    return convert(c, pe, to);
}

static fg_status check_expr(checker *c, fgi_expr **pe) {
    fgi_expr *e = *pe;
    switch (e->kind) {
    case FGI_E_INT_LIT: e->type = FGI_T_INT; return FG_OK;
    case FGI_E_FLOAT_LIT: e->type = FGI_T_FLOAT; return FG_OK;
    case FGI_E_BOOL_LIT: e->type = FGI_T_BOOL; return FG_OK;
    case FGI_E_NAME: return check_name(c, e, false);
    case FGI_E_INDEX: return check_index(c, e);
    case FGI_E_CALL: return check_call(c, e);
    case FGI_E_UNARY: return check_unary(c, pe);
    case FGI_E_BINARY: return check_binary(c, e);
    case FGI_E_COND: return check_cond(c, e);
    case FGI_E_CAST: return check_cast(c, pe);
    default:
        /* already resolved (ARG / PARAM / LOCAL): the tree was checked before */
        return fail(c, FG_ERR_INVALID_ARGUMENT, e->offset, "expression checked twice");
    }
}

/* ---- functions ---------------------------------------------------------- */

static fg_status check_local_name(checker *c, const fgi_local *l) {
    const char *why = fgi_name_reserved(l->name);
    if (why) return fail(c, FG_ERR_NAME, l->offset, "'%s' is reserved: %s", l->name, why);
    int index;
    fgi_expr_kind k = lookup(c, l->name, &index);
    if (k == FGI_E_LOCAL)
        return fail(c, FG_ERR_NAME, l->offset, "duplicate local '%s'", l->name);
    if (k == FGI_E_ARG)
        return fail(c, FG_ERR_NAME, l->offset, "local '%s' has the name of an argument",
                    l->name);
    if (k != FGI_E_NAME)
        return fail(c, FG_ERR_NAME, l->offset, "local '%s' has the name of a parameter",
                    l->name);
    return FG_OK;
}

static fg_status check_return(checker *c) {
    fgi_func *fn = c->fn;
    FGI_TRY(check_expr(c, &fn->ret));
    if (fn->kind == FGI_FUNC_MASK) {
        if (fn->ret->type == FGI_T_FLOAT)
            return fail(c, FG_ERR_TYPE, fn->ret->offset,
                        "mask_mod must return bool, not float (compare the value instead)");
        return convert(c, &fn->ret, FGI_T_BOOL);
    }
    return convert(c, &fn->ret, FGI_T_FLOAT);
}

fg_status fgi_check_func(fg_ctx *ctx, fg_mod *mod, fgi_func *fn, int nparams) {
    checker c = {ctx, mod, fn, nparams, 0};
    for (int i = 0; i < fn->nlocals; i++) {
        fgi_local *l = &fn->locals[i];
        FGI_TRY(check_local_name(&c, l));
        FGI_TRY(check_expr(&c, &l->init));
        FGI_TRY(convert(&c, &l->init, l->type));
        c.nlocals = i + 1;
    }
    return check_return(&c);
}
