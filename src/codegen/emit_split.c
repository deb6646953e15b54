/*
 * emit_split.c -- the mods again, split by what each part depends on, so the
 * attention kernel computes a part once per row, once per column or once per
 * (batch, head) instead of once per score.
 *
 * FlexAttention gets this for free from Triton's broadcasting: in
 * `q_idx // W == kv_idx // W`, q_idx is a column vector and kv_idx a row
 * vector, so each division runs once per row or column of the tile. Here a
 * thread of the mma.sync kernel owns a few rows for the whole sweep and two
 * columns per n8 fragment of each tile, so the same saving comes from
 * splitting every mod into
 *   - a head part: the largest subexpressions that read only b, h and
 *     parameters (`KERNEL / 2`, `slopes[h]`), computed once per thread;
 *   - a row part: those that read q_idx (and maybe b, h) but not kv_idx,
 *     computed once per q row the thread owns;
 *   - a column part: those that read kv_idx but not q_idx, computed once per
 *     kv column the thread owns in a tile;
 *   - the rest, evaluated per element with the hoisted values read back
 *     from the three structs.
 * A local whose initialiser falls in one class is hoisted whole.
 *
 * Why this is exact. Only whole subexpressions move; each is printed by the
 * printer emit.c uses (cuda_expr.c: fg_iadd, __fmul_rn-based fg_fmul, the
 * bounds-checked loads ...), in the same order, so every value is computed
 * by the same operations with the same rounding. Moving a subexpression out
 * of the side of && / || / ?: that would not have been taken evaluates it
 * speculatively; that is safe because every operation of the emitted CUDA
 * is total (x / 0 == 0, an out-of-range load gives 0; see internal.h), and
 * the value is used only where the original would have used it.
 *
 * One rewrite, asked for with FGI_SPLIT_INDEX_FLOATS: `(float)(kv_idx -
 * q_idx)` (either order; ALiBi's and relative biases' distance) becomes
 * `(float)kv_idx - (float)q_idx`, the first a column part and the second
 * a row part, so a score costs one FADD where it cost an IADD and an
 * int-to-float conversion. The same float while both indices lie in
 * [-2^24, 2^24]: each converts exactly, and the FADD rounds the exact
 * difference as the conversion does. A kernel emitted so refuses
 * launches with indices beyond (fgi_split_casts_indices, the launch's
 * check against FGI_SPLIT_INDEX_FLOAT_MAX), unless the forward takes the
 * score_mod by diagonals, where the casts print as written.
 *
 * Expressions print in that printer's fully parenthesised style (the text
 * is read by NVRTC, the readable rendering of the mod is fg_mask_mod's),
 * through a hook that names each hoisted value hd.fK_N, r.fK_N or c.fK_N:
 * leaf K of the mask (or the score_mod), value N. The init functions fill a
 * struct named like the one the split function reads, so one hook serves
 * all four functions. Under approximate math (fgi_math) the score_mod's
 * parts take the fast spellings and the mask's stay accurate, as in
 * emit.c, so the split functions still give what fg_score_mod and
 * fg_mask_mod give. The output is part of every attention kernel's
 * source: bump FGI_CODEGEN_VERSION (source.c) when it changes.
 */
#include "codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a node reads, as a set of the mod arguments. */
enum { D_B = 1, D_H = 2, D_Q = 4, D_KV = 8, D_SCORE = 16 };

/* Where a value can be computed. */
typedef enum { C_HEAD = 0, C_ROW = 1, C_COL = 2, C_ELEM = 3, C_DIAG = 4 } split_class;

/* The struct each class is read from (C_DIAG: the score_mod by diagonals,
 * fg_score_diag; per-element values are not held in a struct). */
static const char *const class_var[5] = {"hd", "r", "c", NULL, "dg"};

#define MAX_FIELDS 256

typedef struct field {
    const fgi_expr *e; /* the hoisted expression, or NULL for a local    */
    int local;         /* local index when e == NULL                      */
    split_class cls;
    int num;           /* N in fK_N                                       */
} field;

typedef struct splitter {
    fg_ctx *ctx;
    const fg_mod *mod;
    fgi_buf *out;
    fg_status st;
    /* the function being split */
    const fgi_func *fn;
    int leaf;
    unsigned *local_deps; /* per local: what its initialiser reads       */
    int *local_field;     /* per local: the field holding it, or -1      */
    int cap_locals;
    field fields[MAX_FIELDS];
    int nfields;
    int next_num;
    split_class at;  /* the class being printed (print_expr)       */
    bool costly[5]; /* per class: some leaf's part of it does costly work */
    bool reads[5];  /* per class: some leaf's part of it reads a buffer    */
    bool calls_elem; /* the per-element rest divides or calls a costly builtin */
    fgi_math score_math; /* score_mod's float math (the mask's: accurate) */
    fgi_math math;       /* that of the kind being printed            */
    unsigned flags;      /* FGI_SPLIT_*                                  */
    bool dist;           /* printing the distance form (fg_mask_dist,
                            fg_score_diag_init, fg_score_dist)           */
    bool diag;           /* the score_mod is split by diagonals too      */
    bool dist_floats;    /* printing its diagonal part with FGI_SPLIT_DIST_FLOATS */
    bool fold;           /* printing the tile's folded form (fg_mask_fold) */
    const fgi_expr *fold_skip; /* the atom being printed as itself there */
    /* The atoms of the leaf being split (the mask folded over a tile). */
    struct {
        const fgi_expr *e;
        const fgi_expr *ix; /* its index side */
        int form;           /* index_form */
    } atoms[MAX_FIELDS];
    int natoms;
    bool fold_bad;   /* some leaf does not fold (emit_fold)           */
    bool fold_apart; /* some atom reads q_idx or kv_idx alone         */
    bool fold_rest;  /* some difference is read outside the atoms     */
    int fold_atoms;  /* the atoms of every leaf                       */
    /* The index casts rewritten (FGI_SPLIT_INDEX_FLOATS) in the function
     * being split: the cast, and the fields of (float)kv_idx and
     * (float)q_idx, made of the nodes in `conv`. */
    struct {
        const fgi_expr *cast;
        int col, row;
        bool kv_first; /* (float)(kv_idx - q_idx), else (q_idx - kv_idx) */
    } casts[MAX_FIELDS / 2];
    int ncasts;
    fgi_expr conv[MAX_FIELDS];
} splitter;

static void fail(splitter *sp, const char *what) {
    if (sp->st == FG_OK)
        sp->st = fgi_error(sp->ctx, FG_ERR_INVALID_ARGUMENT, "cannot split the mod: %s", what);
}

/* ---- dependency analysis ------------------------------------------------------ */

static unsigned deps_of(const splitter *sp, const fgi_expr *e) {
    if (!e) return 0;
    switch (e->kind) {
    case FGI_E_ARG:
        return e->op >= 0 && e->op < 5 ? 1u << e->op : 0;
    case FGI_E_LOCAL:
        /* Locals are classified in order, so a later one is never read. */
        return e->index >= 0 && e->index < sp->fn->nlocals ? sp->local_deps[e->index] : 0;
    default: break;
    }
    unsigned d = deps_of(sp, e->a) | deps_of(sp, e->b) | deps_of(sp, e->c);
    for (int i = 0; i < e->nargs; i++) d |= deps_of(sp, e->args[i]);
    return d;
}

static split_class class_of(unsigned d) {
    if ((d & D_SCORE) || ((d & D_Q) && (d & D_KV))) return C_ELEM;
    if (d & D_KV) return C_COL;
    if (d & D_Q) return C_ROW;
    return C_HEAD;
}

/* e without the unary pluses and casts to its own type around it. */
static const fgi_expr *bare(const fgi_expr *e) {
    while (e && ((e->kind == FGI_E_UNARY && e->op == FGI_OP_PLUS) ||
                 (e->kind == FGI_E_CAST && e->a && e->a->type == e->type)))
        e = e->a;
    return e;
}

/* Nodes that cost nothing to recompute: hoisting them only spends registers. */
static bool is_cheap(const fgi_expr *e) {
    e = bare(e);
    return !e || e->kind == FGI_E_INT_LIT || e->kind == FGI_E_FLOAT_LIT ||
           e->kind == FGI_E_BOOL_LIT || e->kind == FGI_E_ARG || e->kind == FGI_E_PARAM ||
           e->kind == FGI_E_LOCAL;
}

/* ---- questions about every node ------------------------------------------------- */

/* What a question answers at a node: this is it, look no further here, or
 * look at its operands. */
typedef enum { LOOK_ON, LOOK_HIT, LOOK_SKIP } look_step;
typedef look_step (*look_fn)(const fgi_expr *e);

/* Whether `look` hits a node of e, of a function (its locals and result)
 * or of any leaf of a mask tree. */
static bool expr_any(const fgi_expr *e, look_fn look) {
    if (!e) return false;
    const look_step st = look(e);
    if (st != LOOK_ON) return st == LOOK_HIT;
    if (expr_any(e->a, look) || expr_any(e->b, look) || expr_any(e->c, look)) return true;
    for (int i = 0; i < e->nargs; i++)
        if (expr_any(e->args[i], look)) return true;
    return false;
}
static bool fn_any(const fgi_func *fn, look_fn look) {
    if (!fn) return false;
    for (int i = 0; i < fn->nlocals; i++)
        if (expr_any(fn->locals[i].init, look)) return true;
    return expr_any(fn->ret, look);
}
static bool mask_any(const fgi_mask_node *n, look_fn look) {
    if (!n) return false;
    if (n->op == FGI_MASK_LEAF) return fn_any(n->func, look);
    return mask_any(n->a, look) || mask_any(n->b, look);
}

/* ---- collecting the hoisted values -------------------------------------------- */

/* The new field's index, or -1 when the table is full: that value then
 * stays where it is, computed per element, which is slower but the same. */
static int add_field(splitter *sp, const fgi_expr *e, int local, split_class cls) {
    if (sp->nfields >= MAX_FIELDS) return -1;
    field *f = &sp->fields[sp->nfields];
    f->e = e;
    f->local = local;
    f->cls = cls;
    f->num = sp->next_num++;
    return sp->nfields++;
}

/* What a field holds: its expression, or its local's initialiser. */
static const fgi_expr *field_value(const splitter *sp, const field *f) {
    return f->e ? f->e : sp->fn->locals[f->local].init;
}

static const field *field_of_expr(const splitter *sp, const fgi_expr *e) {
    for (int i = 0; i < sp->nfields; i++)
        if (sp->fields[i].e == e) return &sp->fields[i];
    return NULL;
}

static void collect(splitter *sp, const fgi_expr *e, split_class outer);

/* Whether e is (float)(kv_idx - q_idx) or (float)(q_idx - kv_idx) on the
 * arguments themselves; *kv_first says which. */
static bool is_index_cast(const fgi_expr *e, bool *kv_first) {
    if (!e || e->kind != FGI_E_CAST || e->type != FGI_T_FLOAT || !e->a || e->a->type != FGI_T_INT) return false;
    const fgi_expr *d = e->a;
    if (d->kind != FGI_E_BINARY || d->op != FGI_OP_SUB || !d->a || !d->b) return false;
    if (d->a->kind != FGI_E_ARG || d->b->kind != FGI_E_ARG) return false;
    if (d->a->op == FGI_ARG_KV_IDX && d->b->op == FGI_ARG_Q_IDX) *kv_first = true;
    else if (d->a->op == FGI_ARG_Q_IDX && d->b->op == FGI_ARG_KV_IDX) *kv_first = false;
    else return false;
    return true;
}

/* The rewrite of an index cast (emit_split.c's header): (float)kv_idx as a
 * column part and (float)q_idx as a row part, the cast printed as their
 * difference. false where the tables are full (the cast stays as it is). */
static bool rewrite_index_cast(splitter *sp, const fgi_expr *e) {
    bool kv_first;
    if (!(sp->flags & FGI_SPLIT_INDEX_FLOATS) || !is_index_cast(e, &kv_first)) return false;
    if (sp->ncasts >= (int)(sizeof sp->casts / sizeof sp->casts[0]) || sp->nfields + 2 > MAX_FIELDS) return false;
    const fgi_expr *kv = kv_first ? e->a->a : e->a->b, *q = kv_first ? e->a->b : e->a->a;
    fgi_expr *ck = &sp->conv[2 * sp->ncasts], *cq = ck + 1;
    *ck = *e; /* a cast to float of the bare argument */
    ck->a = (fgi_expr *)kv;
    *cq = *e;
    cq->a = (fgi_expr *)q;
    const int col = add_field(sp, ck, -1, C_COL), row = add_field(sp, cq, -1, C_ROW);
    sp->casts[sp->ncasts].cast = e;
    sp->casts[sp->ncasts].col = col;
    sp->casts[sp->ncasts].row = row;
    sp->casts[sp->ncasts].kv_first = kv_first;
    sp->ncasts++;
    return true;
}

static int index_cast_of(const splitter *sp, const fgi_expr *e) {
    for (int i = 0; i < sp->ncasts; i++)
        if (sp->casts[i].cast == e) return i;
    return -1;
}

static void collect_children(splitter *sp, const fgi_expr *e, split_class outer) {
    collect(sp, e->a, outer);
    collect(sp, e->b, outer);
    collect(sp, e->c, outer);
    for (int i = 0; i < e->nargs; i++) collect(sp, e->args[i], outer);
}

/* Hoist the maximal subexpressions of e whose class is cheaper than
 * `outer` (the class of the place e is computed in). Children first, so a
 * value is always defined before the one that reads it. */
static void collect(splitter *sp, const fgi_expr *e, split_class outer) {
    if (!e || sp->st != FG_OK) return;
    split_class cls = class_of(deps_of(sp, e));
    if (cls == C_ELEM && rewrite_index_cast(sp, e)) return;
    if (cls == outer || cls == C_ELEM || is_cheap(e)) {
        collect_children(sp, e, outer);
        return;
    }
    /* A head value inside a row / column value is hoisted further still. */
    collect_children(sp, e, cls);
    add_field(sp, e, -1, cls);
}

/* Classify the function's locals and collect every hoisted value. */
static void analyse(splitter *sp, const fgi_func *fn, int leaf) {
    sp->fn = fn;
    sp->leaf = leaf;
    sp->nfields = 0;
    sp->next_num = 0;
    sp->ncasts = 0;
    if (fn->nlocals > sp->cap_locals) {
        free(sp->local_deps);
        free(sp->local_field);
        sp->local_deps = calloc((size_t)fn->nlocals, sizeof *sp->local_deps);
        sp->local_field = calloc((size_t)fn->nlocals, sizeof *sp->local_field);
        sp->cap_locals = sp->local_deps && sp->local_field ? fn->nlocals : 0;
        if (!sp->cap_locals) {
            if (sp->st == FG_OK)
                sp->st = fgi_error(sp->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory splitting the mod");
            return;
        }
    }
    for (int i = 0; i < fn->nlocals && sp->st == FG_OK; i++) {
        const fgi_local *l = &fn->locals[i];
        sp->local_deps[i] = deps_of(sp, l->init);
        sp->local_field[i] = -1;
        split_class cls = class_of(sp->local_deps[i]);
        if (cls == C_ELEM) {
            collect(sp, l->init, C_ELEM);
        } else {
            collect(sp, l->init, cls);
            sp->local_field[i] = add_field(sp, NULL, i, cls);
            /* Not hoisted after all: it exists only in the per-element
             * function, so nothing that reads it may be hoisted either. */
            if (sp->local_field[i] < 0) sp->local_deps[i] |= D_Q | D_KV;
        }
    }
    collect(sp, fn->ret, C_ELEM);
}

/* ---- the distance form ---------------------------------------------------------- */

/* A mask that reads q_idx and kv_idx only through their distance d =
 * q_idx - kv_idx (causal, a sliding or dilated window) has the same value
 * all along a diagonal of the score matrix. A thread's fragment of a tile
 * lies on fewer diagonals than it has elements (34 for 64 in an m16 x
 * n128 fragment), so the kernel makes it once per diagonal:
 * fg_mask_dist(p, hd, b, h, fg_dist) is the mask with every `q_idx -
 * kv_idx` printed as fg_dist, `kv_idx - q_idx` as its negation, and every
 * comparison of the two as the same comparison of fg_dist with 0. Exact:
 * indices lie in [0, 2^31), so the difference never wraps and q OP kv is
 * (q - kv) OP 0. */

/* Whether e is one of the nodes printed through fg_dist: a difference or a
 * comparison of q_idx and kv_idx themselves; *kv_first says which comes
 * first. */
static bool is_dist_node(const fgi_expr *e, bool *kv_first) {
    if (!e || e->kind != FGI_E_BINARY || !e->a || !e->b) return false;
    if (e->op != FGI_OP_SUB && !(e->op >= FGI_OP_LT && e->op <= FGI_OP_NE)) return false;
    if (e->a->kind != FGI_E_ARG || e->b->kind != FGI_E_ARG) return false;
    if (e->a->op == FGI_ARG_Q_IDX && e->b->op == FGI_ARG_KV_IDX) *kv_first = false;
    else if (e->a->op == FGI_ARG_KV_IDX && e->b->op == FGI_ARG_Q_IDX) *kv_first = true;
    else return false;
    return true;
}

/* Whether a node reads q_idx or kv_idx other than through a distance node. */
static look_step index_apart(const fgi_expr *e) {
    bool kv_first;
    if (is_dist_node(e, &kv_first)) return LOOK_SKIP;
    if (e->kind == FGI_E_ARG && (e->op == FGI_ARG_Q_IDX || e->op == FGI_ARG_KV_IDX)) return LOOK_HIT;
    return LOOK_ON;
}

/* A distance node as the distance form prints it. */
static void put_dist_node(fgi_buf *out, const fgi_expr *e, bool kv_first) {
    if (e->op == FGI_OP_SUB)
        fgi_buf_puts(out, kv_first ? "fg_isub(0, fg_dist)" : "fg_dist");
    else
        fgi_buf_printf(out, kv_first ? "(0 %s fg_dist)" : "(fg_dist %s 0)", fgi_emit_infix(e->op));
}

/* ---- the mask folded over a tile ------------------------------------------------ */

/* A comparison (<, <=, >, >=) of ints whose one side is an index form
 * (q_idx, kv_idx, q_idx - kv_idx, kv_idx - q_idx, or a local holding a
 * difference) and whose other side reads neither index (a parameter, a
 * head's value) is monotone in that form: over a tile's box of rows [q_lo,
 * q_hi] and columns [kv_lo, kv_hi] it has one value everywhere when it has
 * the same value at the form's two ends. Call such a comparison an atom;
 * a comparison of the indices themselves (kv_idx <= q_idx) is one too, of
 * the distance against 0.
 *
 * A mask whose every read of an index apart from a difference lies in an
 * atom (local_global's `kv_idx < GLOBAL`, prefix_lm's `kv_idx < PREFIX`;
 * every mask of the distance) folds: per tile, fg_mask_tile_init makes
 * each atom's value at one end and tells whether the atoms are the same
 * over the box (2: all of them; 1: those of q_idx or kv_idx alone; 0:
 * not). Where the atoms of q_idx and kv_idx alone are the same, the mask
 * over the tile is a function of the distance, fg_mask_fold<false>: those
 * atoms read as the tile's values, the rest as in fg_mask_dist, so the
 * kernel can make it once per diagonal; where all are,
 * fg_mask_fold<true> reads every atom as the tile's value and what is
 * left (dilated's divisibility test) runs per diagonal. Exact: a value
 * the same over the box is the value at every position in it. */

typedef enum { IX_NONE, IX_Q, IX_KV, IX_DIST, IX_NDIST } index_form;

static bool replace_hoisted(void *user, fgi_buf *out, const fgi_expr *e);
static void print_expr(splitter *sp, const fgi_expr *e, split_class at);

/* The index form e is, seeing through a local that holds a difference. */
static index_form index_form_of(const splitter *sp, const fgi_expr *e) {
    e = bare(e);
    if (!e || e->type != FGI_T_INT) return IX_NONE;
    if (e->kind == FGI_E_LOCAL && e->index >= 0 && e->index < sp->fn->nlocals) {
        const index_form f = index_form_of(sp, sp->fn->locals[e->index].init);
        return f == IX_DIST || f == IX_NDIST ? f : IX_NONE;
    }
    if (e->kind == FGI_E_ARG) return e->op == FGI_ARG_Q_IDX ? IX_Q : e->op == FGI_ARG_KV_IDX ? IX_KV : IX_NONE;
    bool kv_first;
    if (e->op == FGI_OP_SUB && is_dist_node(e, &kv_first)) return kv_first ? IX_NDIST : IX_DIST;
    return IX_NONE;
}

/* Whether e is an atom; its index side and form. */
static bool is_atom(const splitter *sp, const fgi_expr *e, const fgi_expr **ix, index_form *form) {
    if (!e || e->kind != FGI_E_BINARY || e->op < FGI_OP_LT || e->op > FGI_OP_GE || !e->a || !e->b) return false;
    bool kv_first;
    if (is_dist_node(e, &kv_first)) { /* q OP kv: (q - kv) OP 0 */
        *ix = NULL;
        *form = IX_DIST;
        return true;
    }
    if (e->a->type != FGI_T_INT || e->b->type != FGI_T_INT) return false;
    const unsigned idx = D_Q | D_KV | D_SCORE;
    for (int side = 0; side < 2; side++) {
        const fgi_expr *x = side ? e->b : e->a, *other = side ? e->a : e->b;
        const index_form f = index_form_of(sp, x);
        if (f != IX_NONE && !(deps_of(sp, other) & idx)) {
            *ix = x;
            *form = f;
            return true;
        }
    }
    return false;
}

/* Whether atom k reads q_idx or kv_idx alone (not the distance). */
static bool atom_apart(const splitter *sp, int k) {
    return sp->atoms[k].form == IX_Q || sp->atoms[k].form == IX_KV;
}

static int atom_index(const splitter *sp, const fgi_expr *e) {
    for (int i = 0; i < sp->natoms; i++)
        if (sp->atoms[i].e == e) return i;
    return -1;
}

/* Collects the atoms of e; false where e reads an index apart from atoms
 * and differences (the mask does not fold). */
static bool collect_atoms(splitter *sp, const fgi_expr *e) {
    if (!e) return true;
    const fgi_expr *ix;
    index_form form;
    if (is_atom(sp, e, &ix, &form)) {
        if (atom_index(sp, e) < 0) {
            if (sp->natoms >= MAX_FIELDS) return false;
            sp->atoms[sp->natoms].e = e;
            sp->atoms[sp->natoms].ix = ix;
            sp->atoms[sp->natoms].form = form;
            sp->natoms++;
        }
        return true;
    }
    bool kv_first;
    if (is_dist_node(e, &kv_first)) {
        sp->fold_rest = true;
        return true;
    }
    if (e->kind == FGI_E_ARG && (e->op == FGI_ARG_Q_IDX || e->op == FGI_ARG_KV_IDX)) return false;
    bool ok = collect_atoms(sp, e->a) && collect_atoms(sp, e->b) && collect_atoms(sp, e->c);
    for (int i = 0; ok && i < e->nargs; i++) ok = collect_atoms(sp, e->args[i]);
    return ok;
}

/* After analyse(): the leaf's atoms; false where it does not fold. */
static bool analyse_atoms(splitter *sp) {
    sp->natoms = 0;
    for (int i = 0; i < sp->fn->nlocals; i++)
        if (!collect_atoms(sp, sp->fn->locals[i].init)) return false;
    return collect_atoms(sp, sp->fn->ret);
}

/* An atom as the folded form prints it: the tile's value, which for an
 * atom of the distance only U asks for. */
static void put_atom(splitter *sp, fgi_buf *out, int k) {
    const fgi_expr *e = sp->atoms[k].e;
    if (atom_apart(sp, k)) {
        fgi_buf_printf(out, "t.a%d_%d", sp->leaf, k);
        return;
    }
    fgi_buf_printf(out, "(U ? t.a%d_%d : ", sp->leaf, k);
    bool kv_first;
    if (is_dist_node(e, &kv_first)) {
        put_dist_node(out, e, kv_first);
    } else { /* the atom as itself, its operands through the hook */
        sp->fold_skip = e;
        fgi_cuda_printer p = {.out = out, .mod = sp->mod, .fn = sp->fn, .style = FGI_CUDA_PARENS,
                              .replace = replace_hoisted, .user = sp, .math = sp->math};
        fgi_cuda_print_expr(&p, e);
        if (p.failure) fail(sp, p.failure);
    }
    fgi_buf_puts(out, ")");
}

/* The statements of fg_mask_tile_init for atom k: its value at both ends
 * of its index form over the box. */
static void print_atom_ends(splitter *sp, int k) {
    static const char *const lo[] = {"", "q_lo", "kv_lo", "q_lo - kv_hi", "kv_lo - q_hi"};
    static const char *const hi[] = {"", "q_hi", "kv_hi", "q_hi - kv_lo", "kv_hi - q_lo"};
    const fgi_expr *e = sp->atoms[k].e, *ix = sp->atoms[k].ix;
    const int form = sp->atoms[k].form;
    fgi_buf *out = sp->out;
    for (int end = 0; end < 2; end++) {
        fgi_buf_printf(out, "    fg_e = %s;\n    %s = ", end ? hi[form] : lo[form], end ? "fg_z" : "fg_a");
        bool kv_first;
        if (!ix && is_dist_node(e, &kv_first)) {
            fgi_buf_printf(out, kv_first ? "(0 %s fg_e)" : "(fg_e %s 0)", fgi_emit_infix(e->op));
        } else {
            const bool left = ix == e->a;
            fgi_buf_puts(out, "(");
            if (left) fgi_buf_puts(out, "fg_e");
            else print_expr(sp, e->a, C_ELEM);
            fgi_buf_printf(out, " %s ", fgi_emit_infix(e->op));
            if (left) print_expr(sp, e->b, C_ELEM);
            else fgi_buf_puts(out, "fg_e");
            fgi_buf_puts(out, ")");
        }
        fgi_buf_puts(out, ";\n");
    }
    fgi_buf_printf(out, "    t.a%d_%d = fg_a;\n    if (fg_a != fg_z) fg_u = %s;\n", sp->leaf, k,
                   atom_apart(sp, k) ? "0" : "min(fg_u, 1)");
}

/* ---- the score_mod by diagonals ------------------------------------------------- */

/* A score_mod that reads q_idx and kv_idx only through distance nodes
 * (ALiBi's slopes[h] * (float)(kv_idx - q_idx), a relative bias
 * bias[q_idx - kv_idx + R]) is split once more, for the forward's tiles:
 * its largest subexpressions that read the distance but not `score` are
 * the same all along a diagonal, so the kernel makes them once per
 * diagonal of a thread's fragment (fg_score_diag_init(p, hd, b, h,
 * fg_dist), into struct fg_score_diag) and only the rest per score
 * (fg_score_dist(p, hd, score, b, h, fg_dist, dg): ALiBi's FADD). The
 * same nodes print in the same order, so the values are fg_score_mod's
 * bit for bit. */

static look_step dist_node(const fgi_expr *e) {
    bool kv_first;
    return is_dist_node(e, &kv_first) ? LOOK_HIT : LOOK_ON;
}

static bool score_by_diagonals(const fgi_func *fn) {
    return fn && fn_any(fn, dist_node) && !fn_any(fn, index_apart);
}

/* Whether the forward makes `mod`'s score_mod by diagonals (FG_SCORE_DIST
 * beside no mask or a mask of the distance: FGA_SCORE_DIST_TILES), so that
 * only its distance forms, never its element form, run there. */
static bool score_taken_by_diagonals(const fg_mod *mod) {
    return score_by_diagonals(mod->score) && !mask_any(mod->mask, index_apart);
}

/* Hoist the largest subexpressions of a per-element value that read the
 * indices (through distance nodes) and not the score. */
static void collect_diag(splitter *sp, const fgi_expr *e) {
    if (!e || sp->st != FG_OK) return;
    const unsigned d = deps_of(sp, e);
    if (class_of(d) != C_ELEM) return; /* a head part: hoisted already */
    if (!(d & D_SCORE) && !is_cheap(e)) {
        add_field(sp, e, -1, C_DIAG);
        return;
    }
    collect_diag(sp, e->a);
    collect_diag(sp, e->b);
    collect_diag(sp, e->c);
    for (int i = 0; i < e->nargs; i++) collect_diag(sp, e->args[i]);
}

/* After analyse(): the per-diagonal values of the score_mod. A local that
 * does not read the score is one of them whole. A value the full tables
 * leave out stays per score (fg_score_dist has fg_dist for it). */
static void analyse_diag(splitter *sp) {
    const fgi_func *fn = sp->fn;
    for (int i = 0; i < fn->nlocals && sp->st == FG_OK; i++) {
        if (sp->local_field[i] >= 0) continue;
        if (sp->local_deps[i] & D_SCORE) collect_diag(sp, fn->locals[i].init);
        else sp->local_field[i] = add_field(sp, NULL, i, C_DIAG);
    }
    collect_diag(sp, fn->ret);
}

/* The score_mod as `score + Y` (either order), Y not reading the score and
 * no local left per score: Y, else NULL. The forward then makes the scale's
 * product and that addition one fma where the scale is a power of two
 * (FG_SCORE_ADDS, fga_tile_score_dist): the product is exact there, so the
 * fma rounds once where the FADD did. */
static const fgi_expr *score_addend(const splitter *sp) {
    const fgi_expr *e = bare(sp->fn->ret);
    for (int i = 0; i < sp->fn->nlocals; i++)
        if (sp->local_field[i] < 0) return NULL;
    if (!e || e->kind != FGI_E_BINARY || e->op != FGI_OP_ADD || e->type != FGI_T_FLOAT) return NULL;
    const fgi_expr *a = bare(e->a), *b = bare(e->b);
    const bool a_score = a && a->kind == FGI_E_ARG && a->op == FGI_ARG_SCORE;
    const bool b_score = b && b->kind == FGI_E_ARG && b->op == FGI_ARG_SCORE;
    const fgi_expr *y = a_score ? e->b : b_score ? e->a : NULL;
    if (!y || y->type != FGI_T_FLOAT || (deps_of(sp, y) & D_SCORE)) return NULL;
    return y;
}

/* ---- printing ------------------------------------------------------------------ */

static void put_field_name(const splitter *sp, fgi_buf *out, const field *f) {
    fgi_buf_printf(out, "%s.f%d_%d", class_var[f->cls], sp->leaf, f->num);
}

/* The hook of the printer: a value hoisted to a class other than the one
 * being computed (sp->at) is read from its struct, and a local held in a
 * field is always read from there. */
static bool replace_hoisted(void *user, fgi_buf *out, const fgi_expr *e) {
    splitter *sp = user;
    if (sp->fold) { /* the folded form: atoms from the tile, no row or column parts */
        if (e == sp->fold_skip) {
            sp->fold_skip = NULL;
            return false;
        }
        const int k = atom_index(sp, e);
        if (k >= 0) {
            put_atom(sp, out, k);
            return true;
        }
        const field *hf = field_of_expr(sp, e);
        if (hf && hf->cls != C_HEAD) return false;
        if (e->kind == FGI_E_LOCAL && e->index >= 0 && e->index < sp->fn->nlocals && sp->local_field[e->index] >= 0 &&
            sp->fields[sp->local_field[e->index]].cls != C_HEAD)
            return false; /* declared in the body (print_elem_body) */
    }
    const field *f = field_of_expr(sp, e);
    if (f && f->cls != sp->at) {
        put_field_name(sp, out, f);
        return true;
    }
    bool kv_first;
    if (sp->dist_floats && is_index_cast(e, &kv_first)) { /* (float)(q - kv) is the float distance */
        fgi_buf_puts(out, kv_first ? "(-fg_dist_f)" : "fg_dist_f");
        return true;
    }
    if (sp->dist && is_dist_node(e, &kv_first)) {
        put_dist_node(out, e, kv_first);
        return true;
    }
    /* (the distance form keeps index casts as written: its argument is
     * the distance, not the indices) */
    const int ic = sp->at == C_ELEM && !sp->dist ? index_cast_of(sp, e) : -1;
    if (ic >= 0) { /* (float)(kv_idx - q_idx) as c.x - r.y */
        const field *c = &sp->fields[sp->casts[ic].col], *r = &sp->fields[sp->casts[ic].row];
        fgi_buf_puts(out, "fg_fsub(");
        put_field_name(sp, out, sp->casts[ic].kv_first ? c : r);
        fgi_buf_puts(out, ", ");
        put_field_name(sp, out, sp->casts[ic].kv_first ? r : c);
        fgi_buf_puts(out, ")");
        return true;
    }
    if (e->kind == FGI_E_LOCAL && e->index >= 0 && e->index < sp->fn->nlocals &&
        sp->local_field[e->index] >= 0) {
        put_field_name(sp, out, &sp->fields[sp->local_field[e->index]]);
        return true;
    }
    return false;
}

/* e as computed in a function of class `at`, fully parenthesised. */
static void print_expr(splitter *sp, const fgi_expr *e, split_class at) {
    if (sp->st != FG_OK) return;
    sp->at = at;
    fgi_cuda_printer p = {.out = sp->out, .mod = sp->mod, .fn = sp->fn, .style = FGI_CUDA_PARENS,
                          .replace = replace_hoisted, .user = sp, .math = sp->math};
    fgi_cuda_print_expr(&p, e);
    if (p.failure) fail(sp, p.failure);
}

/* Which costly work is_costly asks about: any; buffer reads only; or
 * divisions, remainders and costly builtin calls only (the work a branch
 * per score would skip where the mask drops the score). */
typedef enum { COST_ANY, COST_READS, COST_CALLS } cost_kind;

/* Whether computing `e` as a value of class `at` does costly work itself
 * (of the kind `kind`): a buffer read, a division or remainder, an
 * int-to-float conversion, or a call of a builtin that builtins.def marks
 * costly. Values of other classes it uses are computed elsewhere, and a
 * local held in a field of its own class is judged as that field. */
static bool is_costly(const splitter *sp, const fgi_expr *e, split_class at, cost_kind kind) {
    if (!e) return false;
    const field *f = field_of_expr(sp, e);
    if (f && f->cls != at) return false;
    if (at == C_ELEM && index_cast_of(sp, e) >= 0) return false; /* one FADD */
    const bool reads_only = kind == COST_READS;
    switch (e->kind) {
    case FGI_E_INDEX:
        if (kind != COST_CALLS) return true;
        break;
    case FGI_E_BINARY:
        if (!reads_only && (e->op == FGI_OP_DIV || e->op == FGI_OP_MOD)) return true;
        break;
    case FGI_E_CALL:
        if (!reads_only && fgi_builtin_get(e->op) && fgi_builtin_get(e->op)->costly) return true;
        for (int i = 0; i < e->nargs; i++)
            if (is_costly(sp, e->args[i], at, kind)) return true;
        return false;
    case FGI_E_LOCAL: return false;
    case FGI_E_CAST:
        /* int to float per score (ALiBi's bias: an IMAD.IADD and an
         * I2FP on sm_90, attention_notes v42). Measured at D=64: two
         * consumers with it beat three (attention_notes.md v20). */
        if (kind == COST_ANY && e->type == FGI_T_FLOAT && e->a && e->a->type == FGI_T_INT) return true;
        break;
    default: break;
    }
    return is_costly(sp, e->a, at, kind) || is_costly(sp, e->b, at, kind) || is_costly(sp, e->c, at, kind);
}

/* Records which parts (row, column, the per-element rest) do costly work. */
static void note_cost(splitter *sp) {
    for (int i = 0; i < sp->nfields; i++) {
        const field *f = &sp->fields[i];
        if (f->cls != C_ROW && f->cls != C_COL) continue;
        if (is_costly(sp, field_value(sp, f), f->cls, COST_ANY)) sp->costly[f->cls] = true;
        if (is_costly(sp, field_value(sp, f), f->cls, COST_READS)) sp->reads[f->cls] = true;
    }
    for (int i = 0; i < sp->fn->nlocals; i++) {
        if (sp->local_field[i] >= 0) continue;
        if (is_costly(sp, sp->fn->locals[i].init, C_ELEM, COST_ANY)) sp->costly[C_ELEM] = true;
        if (is_costly(sp, sp->fn->locals[i].init, C_ELEM, COST_CALLS)) sp->calls_elem = true;
    }
    if (is_costly(sp, sp->fn->ret, C_ELEM, COST_ANY)) sp->costly[C_ELEM] = true;
    if (is_costly(sp, sp->fn->ret, C_ELEM, COST_CALLS)) sp->calls_elem = true;
}

/* The struct members of one class. */
static void print_members(splitter *sp, split_class cls) {
    for (int i = 0; i < sp->nfields; i++) {
        const field *f = &sp->fields[i];
        if (f->cls != cls) continue;
        fgi_type t = f->e ? f->e->type : sp->fn->locals[f->local].type;
        fgi_buf_printf(sp->out, "    %s f%d_%d;", fgi_emit_ctype(t), sp->leaf, f->num);
        if (!f->e && sp->fn->locals[f->local].name)
            fgi_buf_printf(sp->out, " /* %s */", sp->fn->locals[f->local].name);
        fgi_buf_puts(sp->out, "\n");
    }
}

/* The statements that fill the values of one class, in dependency order. */
static void print_fills(splitter *sp, split_class cls) {
    for (int i = 0; i < sp->nfields && sp->st == FG_OK; i++) {
        const field *f = &sp->fields[i];
        if (f->cls != cls) continue;
        fgi_buf_puts(sp->out, "    ");
        put_field_name(sp, sp->out, f);
        fgi_buf_puts(sp->out, " = ");
        print_expr(sp, field_value(sp, f), cls);
        fgi_buf_puts(sp->out, ";\n");
    }
}

/* The per-element rest: the locals left, then the result. */
static void print_elem_body(splitter *sp) {
    const fgi_func *fn = sp->fn;
    for (int i = 0; i < fn->nlocals && sp->st == FG_OK; i++) {
        /* (the folded form has the head parts only) */
        if (sp->local_field[i] >= 0 && (!sp->fold || sp->fields[sp->local_field[i]].cls == C_HEAD)) continue;
        fgi_buf_printf(sp->out, "    const %s l%d = ", fgi_emit_ctype(fn->locals[i].type), i);
        print_expr(sp, fn->locals[i].init, C_ELEM);
        fgi_buf_puts(sp->out, ";\n");
    }
    fgi_buf_puts(sp->out, "    return ");
    print_expr(sp, fn->ret, C_ELEM);
    fgi_buf_puts(sp->out, ";\n");
}

/* `print` with the distance nodes printed through fg_dist (the distance
 * forms: fg_mask_dist, fg_score_diag_init, fg_score_dist). */
static void print_as_dist(splitter *sp, void (*print)(splitter *sp)) {
    sp->dist = true;
    print(sp);
    sp->dist = false;
}
/* the diagonal fills, their distance a float where FGI_SPLIT_DIST_FLOATS asks */
static void print_diag_fills(splitter *sp) {
    sp->dist_floats = (sp->flags & FGI_SPLIT_DIST_FLOATS) != 0;
    print_fills(sp, C_DIAG);
    sp->dist_floats = false;
}

/* ---- the functions of one mod ---------------------------------------------------- */

/* The functions of one kind ("mask" / "score") are generated in four passes
 * over the same leaves (struct members, then each init function, then the
 * per-element functions); each pass re-runs the analysis of the leaf. */
typedef enum { PASS_MEMBERS_HEAD, PASS_MEMBERS_ROW, PASS_MEMBERS_COL, PASS_FILL_HEAD,
               PASS_FILL_ROW, PASS_FILL_COL, PASS_ELEM, PASS_DIST, PASS_COST,
               PASS_MEMBERS_DIAG, PASS_FILL_DIAG, PASS_SCORE_DIST, PASS_SCORE_ADDEND,
               PASS_FOLD_CHECK, PASS_MEMBERS_TILE, PASS_FILL_TILE, PASS_FOLD } pass;

static void leaf_pass(splitter *sp, const fgi_func *fn, int leaf, pass ps, const char *kind) {
    analyse(sp, fn, leaf);
    /* the per-element cost of a score_mod split by diagonals is that of
     * what stays per score */
    const bool by_diag = ps >= PASS_MEMBERS_DIAG || (ps == PASS_COST && sp->diag);
    if (sp->st == FG_OK && by_diag) analyse_diag(sp);
    if (sp->st != FG_OK) return;
    if (ps >= PASS_FOLD_CHECK && !analyse_atoms(sp)) {
        sp->fold_bad = true;
        return;
    }
    switch (ps) {
    case PASS_FOLD_CHECK:
        sp->fold_atoms += sp->natoms;
        for (int k = 0; k < sp->natoms; k++)
            if (atom_apart(sp, k)) sp->fold_apart = true;
        return;
    case PASS_MEMBERS_TILE:
        for (int k = 0; k < sp->natoms; k++) fgi_buf_printf(sp->out, "    bool a%d_%d;\n", leaf, k);
        return;
    case PASS_FILL_TILE:
        for (int k = 0; k < sp->natoms && sp->st == FG_OK; k++) print_atom_ends(sp, k);
        return;
    case PASS_FOLD:
        fgi_buf_printf(sp->out,
                       "template <bool U>\n__device__ __forceinline__ bool fg_mask_fold%d(const fg_mod_params &p, "
                       "const fg_mask_head &hd, int b, int h, int fg_dist, const fg_mask_tile &t) {\n",
                       leaf);
        sp->fold = true;
        print_as_dist(sp, print_elem_body);
        sp->fold = false;
        fgi_buf_puts(sp->out, "}\n\n");
        return;
    case PASS_MEMBERS_DIAG: print_members(sp, C_DIAG); return;
    case PASS_SCORE_ADDEND: {
        const fgi_expr *y = score_addend(sp);
        if (!y) {
            fgi_buf_puts(sp->out, "#define FG_SCORE_ADDS 0\n");
            return;
        }
        fgi_buf_puts(sp->out, "#define FG_SCORE_ADDS 1\n__device__ __forceinline__ float fg_score_addend(const "
                              "fg_mod_params &p, const fg_score_head &hd, int b, int h, int fg_dist, "
                              "const fg_score_diag &dg) {\n    return ");
        sp->dist = true;
        print_expr(sp, y, C_ELEM);
        sp->dist = false;
        fgi_buf_puts(sp->out, ";\n}\n");
        return;
    }
    case PASS_FILL_DIAG: print_as_dist(sp, print_diag_fills); return;
    case PASS_SCORE_DIST:
        fgi_buf_puts(sp->out, "__device__ __forceinline__ float fg_score_dist(const fg_mod_params &p, "
                              "const fg_score_head &hd, float score, int b, int h, int fg_dist, "
                              "const fg_score_diag &dg) {\n");
        print_as_dist(sp, print_elem_body);
        fgi_buf_puts(sp->out, "}\n\n");
        return;
    case PASS_MEMBERS_HEAD: print_members(sp, C_HEAD); return;
    case PASS_MEMBERS_ROW: print_members(sp, C_ROW); return;
    case PASS_MEMBERS_COL: print_members(sp, C_COL); return;
    case PASS_FILL_HEAD: print_fills(sp, C_HEAD); return;
    case PASS_FILL_ROW: print_fills(sp, C_ROW); return;
    case PASS_FILL_COL: print_fills(sp, C_COL); return;
    case PASS_COST: note_cost(sp); return;
    case PASS_ELEM:
        fgi_buf_printf(sp->out,
                       "__device__ __forceinline__ %s fg_%s_split%d(const fg_mod_params &p, "
                       "const fg_%s_head &hd, %sint b, int h, int q_idx, int kv_idx, "
                       "const fg_%s_row &r, const fg_%s_col &c) {\n",
                       fn->kind == FGI_FUNC_MASK ? "bool" : "float", kind, leaf, kind,
                       fn->kind == FGI_FUNC_MASK ? "" : "float score, ", kind, kind);
        print_elem_body(sp);
        fgi_buf_puts(sp->out, "}\n\n");
        return;
    case PASS_DIST:
        fgi_buf_printf(sp->out,
                       "__device__ __forceinline__ bool fg_mask_dist%d(const fg_mod_params &p, "
                       "const fg_mask_head &hd, int b, int h, int fg_dist) {\n",
                       leaf);
        print_as_dist(sp, print_elem_body);
        fgi_buf_puts(sp->out, "}\n\n");
        return;
    }
}

static void mask_leaves(splitter *sp, const fgi_mask_node *n, int *next, pass ps) {
    if (!n || sp->st != FG_OK) return;
    if (n->op == FGI_MASK_LEAF) {
        if (!n->func) fail(sp, "a mask leaf without a function");
        else leaf_pass(sp, n->func, (*next)++, ps, "mask");
        return;
    }
    mask_leaves(sp, n->a, next, ps);
    mask_leaves(sp, n->b, next, ps);
}

static void for_each_leaf(splitter *sp, bool mask, pass ps) {
    int next = 0;
    if (mask) mask_leaves(sp, sp->mod->mask, &next, ps);
    else if (sp->mod->score) leaf_pass(sp, sp->mod->score, 0, ps, "score");
}

/* Whether the score_mod's per-element part (what stays per score once the
 * head, row and column parts are hoisted) does costly work. */
static bool score_elem_costly(splitter *sp) {
    /* by diagonals only where the forward takes them, so that the cost
     * judged here is the cost of the loop the forward runs */
    sp->diag = score_taken_by_diagonals(sp->mod);
    memset(sp->costly, 0, sizeof sp->costly);
    sp->calls_elem = false;
    for_each_leaf(sp, false, PASS_COST);
    return sp->st == FG_OK && sp->costly[C_ELEM];
}

/* The && / || of the leaves' split functions (or, `dist`, their distance
 * forms), as fg_mask_mod combines them. */
typedef enum { TREE_SPLIT, TREE_DIST, TREE_FOLD } tree_form;
static void print_mask_tree(splitter *sp, const fgi_mask_node *n, int *next, tree_form form) {
    if (n->op == FGI_MASK_LEAF) {
        if (form == TREE_DIST) fgi_buf_printf(sp->out, "fg_mask_dist%d(p, hd, b, h, fg_dist)", (*next)++);
        else if (form == TREE_FOLD) fgi_buf_printf(sp->out, "fg_mask_fold%d<U>(p, hd, b, h, fg_dist, t)", (*next)++);
        else fgi_buf_printf(sp->out, "fg_mask_split%d(p, hd, b, h, q_idx, kv_idx, r, c)", (*next)++);
        return;
    }
    fgi_buf_puts(sp->out, "(");
    print_mask_tree(sp, n->a, next, form);
    fgi_buf_puts(sp->out, n->op == FGI_MASK_AND ? " && " : " || ");
    print_mask_tree(sp, n->b, next, form);
    fgi_buf_puts(sp->out, ")");
}

/* The mask folded over a tile (the section "the mask folded over a tile"):
 * FG_MASK_TILE, struct fg_mask_tile, fg_mask_tile_init and fg_mask_fold<U>,
 * where the mask folds and has an atom. */
static void emit_fold(splitter *sp) {
    fgi_buf *out = sp->out;
    sp->fold_bad = sp->fold_apart = sp->fold_rest = false;
    sp->fold_atoms = 0;
    if (sp->mod->mask) for_each_leaf(sp, true, PASS_FOLD_CHECK);
    /* Worth it where a tile's atoms can leave the mask of the distance
     * (an atom of q_idx or kv_idx alone), or leave work per diagonal once
     * they are all the same over the box (dilated's divisibility test).
     * A mask of the distance made of atoms alone (causal, sliding_window)
     * gains nothing: its partial tiles are the ones its atoms cross; nor
     * does one without atoms (`abs(q_idx - kv_idx) < W`). */
    const bool fold = sp->mod->mask && !sp->fold_bad && sp->fold_atoms > 0 && (sp->fold_apart || sp->fold_rest) &&
                      sp->st == FG_OK;
    fgi_buf_printf(out, "#define FG_MASK_TILE %d\n", fold ? 1 : 0);
    if (!fold) return;
    fgi_buf_puts(out, "struct fg_mask_tile {\n");
    for_each_leaf(sp, true, PASS_MEMBERS_TILE);
    fgi_buf_puts(out, "};\n/* The atoms over rows [q_lo, q_hi] x columns [kv_lo, kv_hi] (indices in range):\n"
                      " * 2 when each is the same over the box, 1 when those of q_idx or kv_idx\n"
                      " * alone are, else 0; t holds each one's value at one end. */\n"
                      "__device__ __forceinline__ int fg_mask_tile_init(const fg_mod_params &p, "
                      "const fg_mask_head &hd, int b, int h, int q_lo, int q_hi, int kv_lo, int kv_hi, "
                      "fg_mask_tile &t) {\n    int fg_u = 2, fg_e;\n    bool fg_a, fg_z;\n");
    for_each_leaf(sp, true, PASS_FILL_TILE);
    fgi_buf_puts(out, "    return fg_u;\n}\n");
    for_each_leaf(sp, true, PASS_FOLD);
    fgi_buf_puts(out, "template <bool U>\n__device__ __forceinline__ bool fg_mask_fold(const fg_mod_params &p, "
                      "const fg_mask_head &hd, int b, int h, int fg_dist, const fg_mask_tile &t) {\n    return ");
    int next = 0;
    print_mask_tree(sp, sp->mod->mask, &next, TREE_FOLD);
    fgi_buf_puts(out, ";\n}\n\n");
}

static void emit_kind(splitter *sp, bool mask) {
    const char *k = mask ? "mask" : "score";
    fgi_buf *out = sp->out;
    sp->math = mask ? FGI_MATH_ACCURATE : sp->score_math;
    static const char *const cls_name[3] = {"head", "row", "col"};
    static const char *const idx_arg[3] = {"", ", int q_idx", ", int kv_idx"};
    for (int cls = 0; cls < 3; cls++) {
        fgi_buf_printf(out, "struct fg_%s_%s {\n", k, cls_name[cls]);
        for_each_leaf(sp, mask, (pass)(PASS_MEMBERS_HEAD + cls));
        fgi_buf_puts(out, "};\n");
    }
    if (mask) {
        /* A kernel may compute a row or column part once per row or column
         * and share it (through shared memory, or registers filled before
         * the element loop) instead of once per element; that pays only
         * when the part is costly to compute. */
        memset(sp->costly, 0, sizeof sp->costly);
        memset(sp->reads, 0, sizeof sp->reads);
        for_each_leaf(sp, true, PASS_COST);
        fgi_buf_printf(out, "#define FG_MASK_ROW_COSTLY %d\n#define FG_MASK_COL_COSTLY %d\n",
                       sp->costly[C_ROW] ? 1 : 0, sp->costly[C_COL] ? 1 : 0);
        /* A column part that reads a buffer waits for memory: the Hopper
         * forward reads it a tile ahead (FGH_COLS_AHEAD). */
        fgi_buf_printf(out, "#define FG_MASK_COL_READS %d\n", sp->reads[C_COL] ? 1 : 0);
        /* What stays per element is costly (dilated's remainder): the
         * Hopper backward then makes a mask of the distance once per
         * diagonal (a cheap one, causal's comparison, it makes in place). */
        fgi_buf_printf(out, "#define FG_MASK_ELEM_COSTLY %d\n", sp->costly[C_ELEM] ? 1 : 0);
    } else {
        /* Costly work per score needs registers: the Hopper forward keeps
         * fewer, larger consumers for it (fgi_split_score_elem_costly). */
        fgi_buf_printf(out, "#define FG_SCORE_ELEM_COSTLY %d\n", score_elem_costly(sp) ? 1 : 0);
        /* Of that, work a branch per score would skip where the mask drops
         * the score (a division, a costly call): the forward then makes
         * score_mod at every position of a partial tile and masks by
         * diagonals (FGA_DIST_TILES). */
        fgi_buf_printf(out, "#define FG_SCORE_ELEM_CALLS %d\n", sp->st == FG_OK && sp->calls_elem ? 1 : 0);
    }
    for (int cls = 0; cls < 3; cls++) {
        fgi_buf_printf(out,
                       "__device__ __forceinline__ fg_%s_%s fg_%s_%s_init(const fg_mod_params &p%s, "
                       "int b, int h%s) {\n    fg_%s_%s %s;\n",
                       k, cls_name[cls], k, cls_name[cls],
                       cls == C_HEAD ? "" : mask ? ", const fg_mask_head &hd" : ", const fg_score_head &hd",
                       idx_arg[cls], k, cls_name[cls], class_var[cls]);
        for_each_leaf(sp, mask, (pass)(PASS_FILL_HEAD + cls));
        fgi_buf_printf(out, "    return %s;\n}\n", class_var[cls]);
    }
    fgi_buf_puts(out, "\n");
    for_each_leaf(sp, mask, PASS_ELEM);
    if (mask) {
        fgi_buf_puts(out, "__device__ __forceinline__ bool fg_mask_split(const fg_mod_params &p, "
                          "const fg_mask_head &hd, int b, int h, int q_idx, int kv_idx, "
                          "const fg_mask_row &r, const fg_mask_col &c) {\n    return ");
        if (sp->mod->mask) {
            int next = 0;
            print_mask_tree(sp, sp->mod->mask, &next, TREE_SPLIT);
        } else {
            fgi_buf_puts(out, "true");
        }
    } else {
        fgi_buf_puts(out, "__device__ __forceinline__ float fg_score_split(const fg_mod_params &p, "
                          "const fg_score_head &hd, float score, int b, int h, int q_idx, "
                          "int kv_idx, const fg_score_row &r, const fg_score_col &c) {\n    return ");
        fgi_buf_puts(out, sp->mod->score
                              ? "fg_score_split0(p, hd, score, b, h, q_idx, kv_idx, r, c)"
                              : "score");
    }
    fgi_buf_puts(out, ";\n}\n\n");
    if (!mask) {
        fgi_buf_printf(out, "#define FG_SCORE_DIST %d\n", sp->diag ? 1 : 0);
        if (sp->diag) {
            fgi_buf_puts(out, "struct fg_score_diag {\n");
            for_each_leaf(sp, false, PASS_MEMBERS_DIAG);
            fgi_buf_puts(out, "};\n__device__ __forceinline__ fg_score_diag fg_score_diag_init(const "
                              "fg_mod_params &p, const fg_score_head &hd, int b, int h, int fg_dist, "
                              "float fg_dist_f) {\n"
                              "    fg_score_diag dg;\n");
            for_each_leaf(sp, false, PASS_FILL_DIAG);
            fgi_buf_puts(out, "    return dg;\n}\n");
            for_each_leaf(sp, false, PASS_SCORE_DIST);
            for_each_leaf(sp, false, PASS_SCORE_ADDEND);
        }
    }
    if (mask) {
        const bool dist = sp->mod->mask && !mask_any(sp->mod->mask, index_apart);
        fgi_buf_printf(out, "#define FG_MASK_DIST %d\n", dist ? 1 : 0);
        if (dist) {
            for_each_leaf(sp, true, PASS_DIST);
            fgi_buf_puts(out, "__device__ __forceinline__ bool fg_mask_dist(const fg_mod_params &p, "
                              "const fg_mask_head &hd, int b, int h, int fg_dist) {\n    return ");
            int next = 0;
            print_mask_tree(sp, sp->mod->mask, &next, TREE_DIST);
            fgi_buf_puts(out, ";\n}\n\n");
        }
        emit_fold(sp);
    }
}

fg_status fgi_emit_split_math(fg_ctx *ctx, const fg_mod *mod, fgi_math math, unsigned flags, fgi_buf *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && out, "NULL mod or output buffer");
    splitter *sp = calloc(1, sizeof *sp);
    if (!sp) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory splitting the mod");
    sp->ctx = ctx;
    sp->mod = mod;
    sp->out = out;
    sp->score_math = math;
    sp->flags = flags;
    fgi_buf_puts(out,
                 "/* ---- the mods split by dependency (emit_split.c): the kernel computes\n"
                 " * the head part once per (b, h), the row part once per q row and the\n"
                 " * column part once per kv column; fg_mask_split / fg_score_split give\n"
                 " * bit for bit what fg_mask_mod / fg_score_mod give. */\n"
                 "#define FG_HAS_SPLIT_MODS 1\n");
    emit_kind(sp, true);
    if (sp->st == FG_OK) emit_kind(sp, false);
    fg_status st = sp->st;
    free(sp->local_deps);
    free(sp->local_field);
    free(sp);
    if (st != FG_OK) return st;
    if (out->oom) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory splitting the mod");
    return FG_OK;
}

bool fgi_split_score_elem_costly(const fg_mod *mod) {
    if (!mod || !mod->score) return false;
    splitter *sp = calloc(1, sizeof *sp);
    if (!sp) return false;
    sp->mod = mod; /* no ctx: a failure only answers false */
    const bool costly = score_elem_costly(sp);
    free(sp->local_deps);
    free(sp->local_field);
    free(sp);
    return costly;
}

fg_status fgi_emit_split(fg_ctx *ctx, const fg_mod *mod, fgi_buf *out) {
    return fgi_emit_split_math(ctx, mod, FGI_MATH_ACCURATE, 0, out);
}

/* Whether a node is a cast FGI_SPLIT_INDEX_FLOATS rewrites. */
static look_step index_cast(const fgi_expr *e) {
    bool kv_first;
    return is_index_cast(e, &kv_first) ? LOOK_HIT : LOOK_ON;
}

bool fgi_split_casts_indices(const fg_mod *mod) {
    /* a score_mod the forward takes by diagonals prints its casts as
     * written there (the rewrite is in its element form only) */
    return mod && (mask_any(mod->mask, index_cast) ||
                   (!score_taken_by_diagonals(mod) && fn_any(mod->score, index_cast)));
}

bool fgi_split_casts_distance(const fg_mod *mod) {
    return mod && score_taken_by_diagonals(mod) && fn_any(mod->score, index_cast);
}
