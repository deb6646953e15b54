/*
 * deriv.c -- d score_mod / d score and d score_mod / d buf[i], built as
 * checked trees from the checked tree of score_mod.
 *
 * Forward mode, one seed at a time. The derivative with respect to the
 * score is the tangent of the result when the score argument has tangent 1
 * and everything else tangent 0; the derivative with respect to one float
 * buffer read is the tangent when that read (that INDEX node) has tangent 1.
 * score_mod has one input per seed and one output, so forward mode costs one
 * pass per seed, and the tangent of a local is simply another local: the
 * derived function keeps every local of score_mod under its index and
 * appends one tangent local per float local whose tangent is not zero, in
 * order, so each tangent initialiser reads only values defined before it.
 *
 * Zero is structural. A node whose tangent is zero everywhere gets NULL, and
 * the rules below never build `0 * x`: besides the wasted work, 0 * inf is
 * NaN, and a score_mod that returns -inf for masked scores must still have a
 * finite derivative elsewhere. Ints and bools carry no tangent, so
 * comparisons, casts to int or bool, %, the bit operators and integer
 * arithmetic stop the chain (their derivative is 0, as in PyTorch, where such
 * values are not differentiable and contribute no gradient).
 *
 * The rules, for float values (ta is the tangent of a):
 *   a + b  ta + tb          a - b  ta - tb          -a  -ta
 *   a * b  ta * b + a * tb  a / b  (ta - a / b * tb) / b
 *   c ? a : b               c ? ta : tb   (the branch the value comes from)
 *   f(x, y, z)              sum over the arguments with a tangent of
 *                           f_k(x, y, z) * t_k, f_k the builtin's d_x / d_y /
 *                           d_z rule in builtins.def, with its kinks
 *                           (abs at 0, min/max ties ...) valued as PyTorch
 *                           autograd values them.
 * A rule is parsed once per derivation as an expression-form mod over float
 * parameters x, y, z and copied in with x, y, z replaced by the call's own
 * argument trees, which are shared, not copied: derived trees are read-only.
 * The new nodes take the position of the node they differentiate, so #line
 * directives and evaluator errors point into score_mod.
 */
#include "mod/deriv.h"
#include "mod/front.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct deriver {
    fg_ctx *ctx;
    const fg_mod *mod;
    const fgi_func *fn;       /* score_mod                                   */
    fgi_arena *ar;            /* the result's arena                          */
    fg_status st;             /* first error                                 */
    /* the seed: the score argument, or one INDEX node */
    bool seed_score;
    const fgi_expr *seed_node;
    /* the function being built */
    fgi_local *locals;
    int nlocals, cap;
    int *tangent_of;          /* per score_mod local: its tangent local, -1  */
    /* the builtins' rules, parsed on first use: rules[fn][k] */
    fg_mod *rules[FGI_FN_COUNT][3];
} deriver;

static void oom(deriver *d) {
    if (d->st == FG_OK) d->st = fgi_error(d->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory deriving score_mod");
}

/* ---- node constructors (typed as the checker would type them) ---------- */

static fgi_expr *node(deriver *d, fgi_expr_kind kind, fgi_type type, const fgi_expr *at) {
    fgi_expr *e = fgi_arena_alloc(d->ar, sizeof *e);
    if (!e) {
        oom(d);
        return NULL;
    }
    e->kind = kind;
    e->type = type;
    e->offset = at ? at->offset : d->fn->ret_offset;
    e->length = at ? at->length : 0;
    return e;
}

static fgi_expr *flit(deriver *d, float v, const fgi_expr *at) {
    fgi_expr *e = node(d, FGI_E_FLOAT_LIT, FGI_T_FLOAT, at);
    if (e) e->lit.f = v;
    return e;
}

static fgi_expr *bin(deriver *d, fgi_op op, fgi_expr *a, fgi_expr *b, const fgi_expr *at) {
    if (!a || !b) return NULL;
    fgi_expr *e = node(d, FGI_E_BINARY, FGI_T_FLOAT, at);
    if (!e) return NULL;
    e->op = op;
    e->a = a;
    e->b = b;
    return e;
}

static fgi_expr *neg(deriver *d, fgi_expr *a, const fgi_expr *at) {
    if (!a) return NULL;
    fgi_expr *e = node(d, FGI_E_UNARY, FGI_T_FLOAT, at);
    if (!e) return NULL;
    e->op = FGI_OP_NEG;
    e->a = a;
    return e;
}

/* ta + tb with structural zeros. */
static fgi_expr *sum(deriver *d, fgi_expr *ta, fgi_expr *tb, const fgi_expr *at) {
    if (!ta) return tb;
    if (!tb) return ta;
    return bin(d, FGI_OP_ADD, ta, tb, at);
}

/* ---- the builtins' rules ---------------------------------------------------- */

/* Copy a checked rule tree into the result, x / y / z replaced by args. */
static fgi_expr *instantiate(deriver *d, const fgi_expr *r, fgi_expr *const *args, int nargs,
                             const fgi_expr *at) {
    if (!r || d->st != FG_OK) return NULL;
    if (r->kind == FGI_E_PARAM) {
        if (r->index < 0 || r->index >= nargs) {
            if (d->st == FG_OK)
                d->st = fgi_error(d->ctx, FG_ERR_INVALID_ARGUMENT,
                                  "a derivative rule reads an argument the builtin does not have");
            return NULL;
        }
        return args[r->index];
    }
    fgi_expr *e = node(d, r->kind, r->type, at);
    if (!e) return NULL;
    e->op = r->op;
    e->index = r->index;
    e->lit = r->lit;
    if (r->a && !(e->a = instantiate(d, r->a, args, nargs, at))) return NULL;
    if (r->b && !(e->b = instantiate(d, r->b, args, nargs, at))) return NULL;
    if (r->c && !(e->c = instantiate(d, r->c, args, nargs, at))) return NULL;
    if (r->nargs) {
        e->args = fgi_arena_alloc(d->ar, sizeof(fgi_expr *) * (size_t)r->nargs);
        if (!e->args) {
            oom(d);
            return NULL;
        }
        e->nargs = r->nargs;
        for (int i = 0; i < r->nargs; i++)
            if (!(e->args[i] = instantiate(d, r->args[i], args, nargs, at))) return NULL;
    }
    return e;
}

/* d f / d arg k of builtin `fn`, at the call's arguments. */
static fgi_expr *rule(deriver *d, int fn, int k, fgi_expr *const *args, int nargs,
                      const fgi_expr *at) {
    const fgi_builtin_info *bi = fgi_builtin_get(fn);
    if (!bi || k >= bi->arity || !bi->deriv[k] || !*bi->deriv[k]) {
        if (d->st == FG_OK)
            d->st = fgi_error(d->ctx, FG_ERR_INVALID_ARGUMENT, "builtin %d has no derivative rule %d", fn, k);
        return NULL;
    }
    if (!d->rules[fn][k]) {
        static const fg_param_decl xyz[3] = {{"x", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0},
                                             {"y", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0},
                                             {"z", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 0.0}};
        fg_status st = fg_mod_from_expr(d->ctx, FG_SCORE_MOD, bi->deriv[k], xyz, 3, &d->rules[fn][k]);
        if (st != FG_OK) {
            if (d->st == FG_OK)
                d->st = fgi_error(d->ctx, st, "the derivative rule of %s does not parse: %s", bi->name,
                                  bi->deriv[k]);
            return NULL;
        }
    }
    return instantiate(d, d->rules[fn][k]->score->ret, args, nargs, at);
}

/* ---- tangents ------------------------------------------------------------------ */

static fgi_expr *tangent(deriver *d, const fgi_expr *e);

static fgi_expr *local_ref(deriver *d, int index, const fgi_expr *at) {
    fgi_expr *e = node(d, FGI_E_LOCAL, FGI_T_FLOAT, at);
    if (e) e->index = index;
    return e;
}

static fgi_expr *tangent_binary(deriver *d, const fgi_expr *e) {
    fgi_expr *a = (fgi_expr *)e->a, *b = (fgi_expr *)e->b;
    fgi_expr *ta = tangent(d, a), *tb = tangent(d, b);
    if (!ta && !tb) return NULL;
    switch ((fgi_op)e->op) {
    case FGI_OP_ADD: return sum(d, ta, tb, e);
    case FGI_OP_SUB: return tb ? (ta ? bin(d, FGI_OP_SUB, ta, tb, e) : neg(d, tb, e)) : ta;
    case FGI_OP_MUL:
        return sum(d, ta ? bin(d, FGI_OP_MUL, ta, b, e) : NULL, tb ? bin(d, FGI_OP_MUL, a, tb, e) : NULL, e);
    case FGI_OP_DIV: {
        /* (ta - a / b * tb) / b: one division by b, as PyTorch's div_backward */
        fgi_expr *num = tb ? bin(d, FGI_OP_MUL, (fgi_expr *)e, tb, e) : NULL;
        num = num ? (ta ? bin(d, FGI_OP_SUB, ta, num, e) : neg(d, num, e)) : ta;
        return bin(d, FGI_OP_DIV, num, b, e);
    }
    default: return NULL; /* comparisons and logic give bools: no tangent */
    }
}

static fgi_expr *tangent_call(deriver *d, const fgi_expr *e) {
    fgi_expr *t = NULL;
    for (int k = 0; k < e->nargs && d->st == FG_OK; k++) {
        fgi_expr *tk = tangent(d, e->args[k]);
        if (!tk) continue;
        fgi_expr *dk = rule(d, e->op, k, e->args, e->nargs, e);
        t = sum(d, t, bin(d, FGI_OP_MUL, dk, tk, e), e);
    }
    return t;
}

static fgi_expr *tangent(deriver *d, const fgi_expr *e) {
    if (!e || d->st != FG_OK || e->type != FGI_T_FLOAT) return NULL;
    switch (e->kind) {
    case FGI_E_ARG:
        return d->seed_score && e->op == FGI_ARG_SCORE ? flit(d, 1.0f, e) : NULL;
    case FGI_E_INDEX:
        return e == d->seed_node ? flit(d, 1.0f, e) : NULL;
    case FGI_E_LOCAL: {
        int t = e->index >= 0 && e->index < d->fn->nlocals ? d->tangent_of[e->index] : -1;
        return t >= 0 ? local_ref(d, t, e) : NULL;
    }
    case FGI_E_UNARY:
        if (e->op == FGI_OP_PLUS) return tangent(d, e->a);
        if (e->op == FGI_OP_NEG) return neg(d, tangent(d, e->a), e);
        return NULL;
    case FGI_E_BINARY: return tangent_binary(d, e);
    case FGI_E_COND: {
        fgi_expr *tb = tangent(d, e->b), *tc = tangent(d, e->c);
        if (!tb && !tc) return NULL;
        fgi_expr *c = node(d, FGI_E_COND, FGI_T_FLOAT, e);
        if (!c) return NULL;
        c->a = e->a;
        c->b = tb ? tb : flit(d, 0.0f, e);
        c->c = tc ? tc : flit(d, 0.0f, e);
        return c->b && c->c ? c : NULL;
    }
    case FGI_E_CAST:
        /* to float from int or bool: a constant as far as the seed goes */
        return e->a && e->a->type == FGI_T_FLOAT ? tangent(d, e->a) : NULL;
    case FGI_E_CALL: return tangent_call(d, e);
    default: return NULL; /* literals, scalar parameters */
    }
}

/* ---- functions ------------------------------------------------------------------ */

static int add_local(deriver *d, const fgi_local *like, fgi_type type, fgi_expr *init) {
    if (d->nlocals == d->cap) {
        int cap = d->cap ? d->cap * 2 : 16;
        fgi_local *n = fgi_arena_alloc(d->ar, sizeof *n * (size_t)cap);
        if (!n) {
            oom(d);
            return -1;
        }
        if (d->nlocals) memcpy(n, d->locals, sizeof *n * (size_t)d->nlocals);
        d->locals = n;
        d->cap = cap;
    }
    fgi_local *l = &d->locals[d->nlocals];
    *l = *like;
    l->type = type;
    l->is_const = true;
    l->init = init;
    return d->nlocals++;
}

/* A function like score_mod with score_mod's locals and returning `ret`;
 * NULL: with the tangent locals of the current seed, returning the tangent of
 * score_mod's result (0 when that is zero). */
static fgi_func *build(deriver *d, fgi_expr *ret) {
    const fgi_func *fn = d->fn;
    d->locals = NULL;
    d->nlocals = d->cap = 0;
    for (int i = 0; i < fn->nlocals; i++) add_local(d, &fn->locals[i], fn->locals[i].type, fn->locals[i].init);
    for (int i = 0; i < fn->nlocals && d->st == FG_OK && !ret; i++) {
        d->tangent_of[i] = -1;
        fgi_expr *t = tangent(d, fn->locals[i].init);
        if (!t) continue;
        fgi_local like = fn->locals[i];
        if (like.name) {
            size_t n = strlen(like.name) + 3;
            char *name = fgi_arena_alloc(d->ar, n);
            if (!name) {
                oom(d);
                return NULL;
            }
            snprintf(name, n, "d_%s", like.name);
            like.name = name;
        }
        d->tangent_of[i] = add_local(d, &like, FGI_T_FLOAT, t);
    }
    if (!ret) ret = tangent(d, fn->ret);
    if (!ret) ret = flit(d, 0.0f, fn->ret);
    fgi_func *out = fgi_arena_alloc(d->ar, sizeof *out);
    if (!out || d->st != FG_OK || !ret) {
        if (!out) oom(d);
        return NULL;
    }
    *out = *fn;
    out->locals = d->locals;
    out->nlocals = d->nlocals;
    out->ret = ret;
    return out;
}

/* The float buffer reads of score_mod, in evaluation order (locals first). */
static void collect_sites(const fg_mod *mod, const fgi_expr *e, const fgi_expr **sites, int *n, int cap) {
    if (!e) return;
    collect_sites(mod, e->a, sites, n, cap);
    collect_sites(mod, e->b, sites, n, cap);
    collect_sites(mod, e->c, sites, n, cap);
    for (int i = 0; i < e->nargs; i++) collect_sites(mod, e->args[i], sites, n, cap);
    if (e->kind == FGI_E_INDEX && e->type == FGI_T_FLOAT && *n < cap) sites[(*n)++] = e;
}

void fgi_grad_layout_compute(const fgi_mod_grad *g, fgi_grad_layout *layout) {
    memset(layout, 0, sizeof *layout);
    bool used[FGI_MAX_PARAMS] = {0};
    for (int k = 0; k < g->nsites; k++)
        if (g->sites[k].param >= 0 && g->sites[k].param < FGI_MAX_PARAMS) used[g->sites[k].param] = true;
    for (int i = 0; i < FGI_MAX_PARAMS && layout->n < FGI_MAX_GRAD_BUFFERS; i++)
        if (used[i]) {
            layout->param[layout->n] = i;
            layout->offset[layout->n] = (size_t)layout->n * 16;
            layout->n++;
        }
    layout->size = ((size_t)layout->n * 16 + 4 + 7) & ~(size_t)7;
}

void fgi_mod_grad_free(fgi_mod_grad *g) {
    if (!g) return;
    fgi_arena_free(&g->arena);
    memset(g, 0, sizeof *g);
}

#define MAX_SITES 64

fg_status fgi_mod_derive(fg_ctx *ctx, const fg_mod *mod, fgi_mod_grad *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output");
    memset(out, 0, sizeof *out);
    fgi_arena_init(&out->arena);
    const fgi_func *fn = mod->score;
    if (!fn) return FG_OK;
    deriver d;
    memset(&d, 0, sizeof d);
    d.ctx = ctx;
    d.mod = mod;
    d.fn = fn;
    d.ar = &out->arena;
    d.tangent_of = fn->nlocals ? fgi_arena_alloc(d.ar, sizeof(int) * (size_t)fn->nlocals) : NULL;
    if (fn->nlocals && !d.tangent_of) oom(&d);

    d.seed_score = true;
    if (d.st == FG_OK) out->d_score = build(&d, NULL);
    d.seed_score = false;

    const fgi_expr *reads[MAX_SITES];
    int nreads = 0;
    for (int i = 0; i < fn->nlocals; i++) collect_sites(mod, fn->locals[i].init, reads, &nreads, MAX_SITES);
    collect_sites(mod, fn->ret, reads, &nreads, MAX_SITES);
    if (nreads == MAX_SITES && d.st == FG_OK)
        d.st = fgi_error(ctx, FG_ERR_LIMIT, "score_mod reads float buffers in more than %d places",
                         MAX_SITES - 1);
    if (nreads > 0 && d.st == FG_OK) {
        out->sites = fgi_arena_alloc(d.ar, sizeof *out->sites * (size_t)nreads);
        if (!out->sites) oom(&d);
    }
    for (int i = 0; i < nreads && d.st == FG_OK; i++) {
        d.seed_node = reads[i];
        fgi_func *grad = build(&d, NULL);
        if (!grad || d.st != FG_OK) break;
        /* A read the result does not depend on (under a comparison, say). */
        if (grad->ret->kind == FGI_E_FLOAT_LIT && grad->ret->lit.f == 0.0f) continue;
        fgi_grad_site *s = &out->sites[out->nsites];
        s->param = reads[i]->index;
        s->grad = grad;
        /* The index: score_mod's locals and the read's own index expression. */
        s->index = build(&d, (fgi_expr *)reads[i]->a);
        if (!s->index) break;
        out->nsites++;
    }
    d.seed_node = NULL;
    for (int f = 0; f < FGI_FN_COUNT; f++)
        for (int k = 0; k < 3; k++) fg_mod_destroy(d.rules[f][k]);
    if (d.st != FG_OK) {
        fg_status st = d.st;
        fgi_mod_grad_free(out);
        return st;
    }
    return FG_OK;
}
