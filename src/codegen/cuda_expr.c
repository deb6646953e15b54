/*
 * cuda_expr.c -- one typed expression of a mod, spelled as CUDA.
 *
 * Both emitters print expressions through here: emit.c for fg_mask_mod /
 * fg_score_mod, emit_split.c for the hoisted values and the per-element rest
 * of the split functions. One printer means one spelling of every node kind,
 * so a value the split functions compute is computed by exactly the
 * operations fg_mask_mod / fg_score_mod use, with the same rounding.
 *
 * The spelling gives every operator the semantics of the mod language
 * rather than C++'s:
 *   - int + - * and unary - through the wrapping helpers of
 *     templates/common.cuh (fg_iadd ... fg_ineg), / and % through the total
 *     ones (x / 0 == 0, INT_MIN / -1 == INT_MIN), << >> with the count
 *     taken & 31 (fg_shl, fg_shr);
 *   - float + - * / through the _rn intrinsics (fg_fadd ...), never
 *     contracted into an FMA, so a score_mod rounds exactly like the CPU
 *     evaluator;
 *   - float -> int through __float2int_rz (fg_f2i: truncating, saturating,
 *     NaN -> 0); int or bool -> float and bool -> int as C casts; int or
 *     float -> bool as `x != 0`;
 *   - buffer reads through the bounds-checked loads fg_load_i32 /
 *     fg_load_f32 (an out-of-range index reads 0);
 *   - builtins by builtins.def's CUDA names, the accurate device functions
 *     and never the __expf-style intrinsics -- unless the printer is asked
 *     for approximate math (p->math, only ever for score_mod and its
 *     derivatives): then the builtins with a cuda_approx spelling take it
 *     and float / is fg_fdiv_approx (div.full), all from
 *     templates/approx_math.cuh, which the source then carries;
 *   - INT_MIN as FG_INT_MIN (the literal 2147483648 does not fit an int);
 *     floats in the shortest decimal that reads back to the same float,
 *     with an f, and inf / NaN by their bits, since NVRTC without headers
 *     has no <cmath> macros.
 * What C++ already gets right (comparisons, && || ?: with their
 * short-circuit, the bitwise operators, float negation, !) is printed as C.
 *
 * Two styles, and one hook:
 *   - FGI_CUDA_READABLE prints the fewest parentheses that keep the reading
 *     obvious: C's precedence, plus the ones a careful writer adds between
 *     mixed operators (a & (b == c), (a && b) || c). fg_mask_mod is the
 *     readable rendering of the mod and is printed so.
 *   - FGI_CUDA_PARENS wraps every operator, cast and number in parentheses
 *     (calls, names, true / false and FG_INT_MIN stand as they are): text
 *     only NVRTC reads, where a reader's convenience does not pay for the
 *     precedence reasoning.
 *   - `replace` is asked about every node before it is printed and may
 *     print something else in its place: emit_split.c names a value
 *     computed in another function (hd.fK_N ...) and a local held in a
 *     field so. A replacement is taken for a primary: it never gets
 *     parentheses of its own.
 */
#include "codegen/codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* C precedence of what is printed (not of the AST operator: a / b prints
 * as a call). Higher binds tighter. */
enum {
    P_NONE = 0, P_COND = 1, P_LOR = 2, P_LAND = 3, P_BOR = 4, P_BXOR = 5, P_BAND = 6,
    P_EQ = 7, P_REL = 8, P_UNARY = 12, P_PRIMARY = 13
};

static void fail(fgi_cuda_printer *p, const char *what, const fgi_expr *e) {
    if (!p->failure) {
        p->failure = what;
        p->failed_at = e;
    }
}

static bool parens(const fgi_cuda_printer *p) { return p->style == FGI_CUDA_PARENS; }

static bool approx(const fgi_cuda_printer *p) { return p->math == FGI_MATH_APPROX; }

/* ---- spellings ---------------------------------------------------------------- */

void fgi_emit_float(fgi_buf *out, float f) {
    if (isnan(f) || isinf(f)) {
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        fgi_buf_printf(out, "__int_as_float(0x%08x)", (unsigned)bits);
        return;
    }
    char s[48];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(s, sizeof s, "%.*g", digits, (double)f);
        if (strtof(s, NULL) == f && signbit(strtof(s, NULL)) == signbit(f)) break;
    }
    fgi_buf_puts(out, s);
    if (!strpbrk(s, ".e")) fgi_buf_puts(out, ".0");
    fgi_buf_puts(out, "f");
}

static bool is_arith(int op) {
    return op == FGI_OP_ADD || op == FGI_OP_SUB || op == FGI_OP_MUL || op == FGI_OP_DIV ||
           op == FGI_OP_MOD || op == FGI_OP_SHL || op == FGI_OP_SHR;
}

const char *fgi_emit_infix(int op) {
    switch (op) {
    case FGI_OP_LOR: return "||";
    case FGI_OP_LAND: return "&&";
    case FGI_OP_BOR: return "|";
    case FGI_OP_BXOR: return "^";
    case FGI_OP_BAND: return "&";
    case FGI_OP_EQ: return "==";
    case FGI_OP_NE: return "!=";
    case FGI_OP_LT: return "<";
    case FGI_OP_LE: return "<=";
    case FGI_OP_GT: return ">";
    case FGI_OP_GE: return ">=";
    default: return NULL;
    }
}

const char *fgi_emit_arith_fn(int op, fgi_type t) {
    bool f = t == FGI_T_FLOAT;
    switch (op) {
    case FGI_OP_ADD: return f ? "fg_fadd" : "fg_iadd";
    case FGI_OP_SUB: return f ? "fg_fsub" : "fg_isub";
    case FGI_OP_MUL: return f ? "fg_fmul" : "fg_imul";
    case FGI_OP_DIV: return f ? "fg_fdiv" : "fg_idiv";
    case FGI_OP_MOD: return f ? NULL : "fg_imod";
    case FGI_OP_SHL: return f ? NULL : "fg_shl";
    case FGI_OP_SHR: return f ? NULL : "fg_shr";
    default: return NULL;
    }
}

const char *fgi_emit_builtin_fn(int fn, fgi_type t) {
    const fgi_builtin_info *bi = fgi_builtin_get(fn);
    if (!bi) return NULL;
    return t == FGI_T_INT ? bi->cuda_int : t == FGI_T_FLOAT ? bi->cuda_float : NULL;
}

const char *fgi_emit_ctype(fgi_type t) {
    return t == FGI_T_BOOL ? "bool" : t == FGI_T_INT ? "int" : "float";
}

/* ---- precedence of the readable style ------------------------------------------ */

static int infix_prec(int op) {
    switch (op) {
    case FGI_OP_LOR: return P_LOR;
    case FGI_OP_LAND: return P_LAND;
    case FGI_OP_BOR: return P_BOR;
    case FGI_OP_BXOR: return P_BXOR;
    case FGI_OP_BAND: return P_BAND;
    case FGI_OP_EQ: case FGI_OP_NE: return P_EQ;
    case FGI_OP_LT: case FGI_OP_LE: case FGI_OP_GT: case FGI_OP_GE: return P_REL;
    default: return P_PRIMARY; /* arithmetic prints as a call */
    }
}

/* Skip nodes that print as nothing: unary plus and same-type casts. */
static const fgi_expr *transparent(const fgi_expr *e) {
    while (e && ((e->kind == FGI_E_UNARY && e->op == FGI_OP_PLUS) ||
                 (e->kind == FGI_E_CAST && e->a && e->a->type == e->type)))
        e = e->a;
    return e;
}

/* The precedence of e's printed form. */
static int printed_prec(const fgi_expr *e) {
    e = transparent(e);
    if (!e) return P_PRIMARY;
    switch (e->kind) {
    case FGI_E_INT_LIT: return e->lit.i < 0 && e->lit.i != INT32_MIN ? P_UNARY : P_PRIMARY;
    case FGI_E_FLOAT_LIT: return !isnan(e->lit.f) && !isinf(e->lit.f) && signbit(e->lit.f) ? P_UNARY : P_PRIMARY;
    case FGI_E_UNARY: return e->op == FGI_OP_NEG && e->type == FGI_T_INT ? P_PRIMARY : P_UNARY;
    case FGI_E_BINARY: return infix_prec(e->op);
    case FGI_E_COND: return P_COND;
    case FGI_E_CAST:
        if (e->type == FGI_T_BOOL) return P_EQ;                      /* x != 0     */
        if (e->type == FGI_T_INT && e->a->type == FGI_T_FLOAT) return P_PRIMARY; /* fg_f2i */
        return P_UNARY;                                              /* (float)x  */
    default: return P_PRIMARY;
    }
}

static bool is_infix(const fgi_expr *e) {
    e = transparent(e);
    return e && e->kind == FGI_E_BINARY && infix_prec(e->op) < P_PRIMARY;
}

/* ---- nodes ---------------------------------------------------------------------- */

static void print_node(fgi_cuda_printer *p, const fgi_expr *e);

/* e as an operand that needs precedence `min` in the readable style; the
 * fully parenthesised style ignores `min` (each node brackets itself). */
static void print_at(fgi_cuda_printer *p, const fgi_expr *e, int min) {
    if (!e || p->failure || e->type == FGI_T_NONE) {
        fail(p, "an untyped expression", e);
        return;
    }
    if (p->replace && p->replace(p->user, p->out, e)) return;
    bool paren = !parens(p) && printed_prec(e) < min;
    if (paren) fgi_buf_puts(p->out, "(");
    print_node(p, e);
    if (paren) fgi_buf_puts(p->out, ")");
}

/* An operand of infix `op`: besides C's precedence, mixed operators get
 * parentheses (a & (b == c), (a && b) || c), as a careful writer adds them;
 * comparisons inside && / || read fine without. */
static void print_operand(fgi_cuda_printer *p, int op, const fgi_expr *x, bool right) {
    int prec = infix_prec(op);
    int min = right ? prec + 1 : prec;
    const fgi_expr *t = transparent(x);
    if (is_infix(t) && t->op != op) {
        bool cmp_in_logic = (op == FGI_OP_LAND || op == FGI_OP_LOR) && infix_prec(t->op) >= P_EQ;
        if (!cmp_in_logic) min = P_PRIMARY;
    }
    print_at(p, x, min);
}

static void print_call(fgi_cuda_printer *p, const char *name, const fgi_expr *const *args, int nargs) {
    fgi_buf_printf(p->out, "%s(", name);
    for (int i = 0; i < nargs; i++) {
        if (i) fgi_buf_puts(p->out, ", ");
        print_at(p, args[i], P_COND);
    }
    fgi_buf_puts(p->out, ")");
}

/* Whether the printer's hook prints e as something else (a value hoisted
 * out of the element loop); asked without printing. */
static bool replaced_by_hook(fgi_cuda_printer *p, const fgi_expr *e) {
    if (!p->replace) return false;
    fgi_buf scratch = {0};
    const bool replaced = p->replace(p->user, &scratch, e);
    fgi_buf_free(&scratch);
    return replaced;
}

/* Whether printing e reads a buffer here: a part the printer replaces (a
 * value hoisted out of the element loop) reads nothing where it is used. */
static bool reads_buffer(fgi_cuda_printer *p, const fgi_expr *e) {
    if (!e) return false;
    if (replaced_by_hook(p, e)) return false;
    if (e->kind == FGI_E_INDEX) return true;
    for (int i = 0; i < e->nargs; i++)
        if (reads_buffer(p, e->args[i])) return true;
    return reads_buffer(p, e->a) || reads_buffer(p, e->b) || reads_buffer(p, e->c);
}

/* The `x % P` of `x % P == 0` (either side, != too) when P is an int
 * divisor parameter (*div) and the printer does not replace that node
 * with a hoisted value; NULL otherwise. */
static const fgi_expr *divisibility_test(fgi_cuda_printer *p, const fgi_expr *e, const fgi_param **div) {
    if (e->op != FGI_OP_EQ && e->op != FGI_OP_NE) return NULL;
    const fgi_expr *a = transparent(e->a), *b = transparent(e->b);
    if (a && a->kind == FGI_E_INT_LIT) {
        const fgi_expr *t = a;
        a = b, b = t;
    }
    if (!a || !b || b->kind != FGI_E_INT_LIT || b->lit.i != 0 || a->kind != FGI_E_BINARY || a->op != FGI_OP_MOD)
        return NULL;
    const int d = fgi_divisor_param(p->mod, a);
    if (d < 0 || !p->mod->params[d].divisor || p->mod->params[d].type != FGI_T_INT) return NULL;
    if (replaced_by_hook(p, a)) return NULL;
    *div = &p->mod->params[d];
    return a;
}

static void print_binary(fgi_cuda_printer *p, const fgi_expr *e) {
    const fgi_param *by = NULL;
    const fgi_expr *mod = divisibility_test(p, e, &by);
    if (mod) {
        /* x % P == 0 as one multiply, a rotate and a compare on the host's
         * numbers (fg_divides_by), not as the remainder's multiply-high,
         * sign fix-up, multiply and subtract */
        fgi_buf_puts(p->out, e->op == FGI_OP_NE ? "!fg_divides_by(" : "fg_divides_by(");
        print_at(p, mod->a, P_NONE);
        fgi_buf_printf(p->out, ", p.fg_div_%s)", by->name);
        return;
    }
    const int d = fgi_divisor_param(p->mod, e);
    const fgi_param *div = d >= 0 && p->mod->params[d].divisor ? &p->mod->params[d] : NULL;
    if (div && fgi_param_has_rcp(div) && !approx(p)) {
        /* by the host's reciprocal, without the IEEE division's per-element
         * branch and with its quotient (fg_fdiv_by in templates/common.cuh
         * says where): fg_fdiv_by(a, p.NAME, p.fg_rcp_NAME) */
        fgi_buf_puts(p->out, "fg_fdiv_by(");
        print_at(p, e->a, P_NONE);
        fgi_buf_printf(p->out, ", p.%s, p.fg_rcp_%s)", div->name, div->name);
        return;
    }
    if (div && div->type == FGI_T_INT) { /* by the host's magic numbers: fg_idiv_by(a, p.fg_div_NAME) */
        fgi_buf_puts(p->out, e->op == FGI_OP_DIV ? "fg_idiv_by(" : "fg_imod_by(");
        print_at(p, e->a, P_NONE);
        fgi_buf_printf(p->out, ", p.fg_div_%s)", div->name);
        return;
    }
    if (is_arith(e->op)) {
        const char *name = fgi_emit_arith_fn(e->op, e->a ? e->a->type : FGI_T_NONE);
        if (name && approx(p) && e->op == FGI_OP_DIV && e->a && e->a->type == FGI_T_FLOAT) name = "fg_fdiv_approx";
        if (!name || !e->a || !e->b || e->a->type != e->b->type) {
            fail(p, "an arithmetic operator on mismatched or non-number operands", e);
            return;
        }
        const fgi_expr *args[2] = {e->a, e->b};
        print_call(p, name, args, 2);
        return;
    }
    const char *s = fgi_emit_infix(e->op);
    /* && and || between bools evaluate both sides (fg_and / fg_or, whose
     * arguments are evaluated before the call) when the right one reads no
     * buffer: every mod expression is total and free of side effects
     * (division is made total), so the value is the same, and the element
     * loop stays straight-line code instead of a divergent branch per
     * element. A buffer read stays behind its guard, which may save the
     * memory access; a value hoisted out of the loop reads nothing there.
     * (Spelt `a & b`, the same idea cost instructions where both sides are
     * hoisted bools: C's & works on ints.) */
    if ((e->op == FGI_OP_LAND || e->op == FGI_OP_LOR) && e->a && e->b && e->a->type == FGI_T_BOOL &&
        e->b->type == FGI_T_BOOL && !reads_buffer(p, e->b)) {
        const fgi_expr *args[2] = {e->a, e->b};
        print_call(p, e->op == FGI_OP_LAND ? "fg_and" : "fg_or", args, 2);
        return;
    }
    if (!s || !e->a || !e->b) {
        fail(p, "an unknown binary operator", e);
        return;
    }
    if (parens(p)) fgi_buf_puts(p->out, "(");
    print_operand(p, e->op, e->a, false);
    fgi_buf_printf(p->out, " %s ", s);
    print_operand(p, e->op, e->b, true);
    if (parens(p)) fgi_buf_puts(p->out, ")");
}

static void print_unary(fgi_cuda_printer *p, const fgi_expr *e) {
    const char *sign;
    switch (e->op) {
    case FGI_OP_PLUS: print_at(p, e->a, P_NONE); return;
    case FGI_OP_NEG:
        if (e->type == FGI_T_INT) {
            const fgi_expr *args[1] = {e->a};
            print_call(p, "fg_ineg", args, 1);
            return;
        }
        sign = "-";
        break;
    case FGI_OP_NOT: sign = "!"; break;
    case FGI_OP_BITNOT: sign = "~"; break;
    default: fail(p, "an unknown unary operator", e); return;
    }
    if (parens(p)) fgi_buf_puts(p->out, "(");
    fgi_buf_puts(p->out, sign);
    /* A primary operand only: "- -x" must never print as "--x". */
    print_at(p, e->a, P_PRIMARY);
    if (parens(p)) fgi_buf_puts(p->out, ")");
}

static void print_cast(fgi_cuda_printer *p, const fgi_expr *e) {
    fgi_type to = e->type, from = e->a->type;
    if (parens(p)) fgi_buf_puts(p->out, "(");
    if (to == from) {
        print_at(p, e->a, P_NONE);
    } else if (to == FGI_T_BOOL && (from == FGI_T_INT || from == FGI_T_FLOAT)) {
        print_at(p, e->a, P_REL);
        fgi_buf_puts(p->out, from == FGI_T_INT ? " != 0" : " != 0.0f");
    } else if (to == FGI_T_INT && from == FGI_T_FLOAT) {
        const fgi_expr *args[1] = {e->a};
        print_call(p, "fg_f2i", args, 1);
    } else if ((to == FGI_T_INT && from == FGI_T_BOOL) ||
               (to == FGI_T_FLOAT && (from == FGI_T_INT || from == FGI_T_BOOL))) {
        fgi_buf_printf(p->out, "(%s)", fgi_emit_ctype(to));
        print_at(p, e->a, P_PRIMARY);
    } else {
        fail(p, "a cast between unknown types", e);
    }
    if (parens(p)) fgi_buf_puts(p->out, ")");
}

static void print_index(fgi_cuda_printer *p, const fgi_expr *e) {
    const fg_mod *mod = p->mod;
    if (!mod || e->index < 0 || e->index >= mod->nparams ||
        mod->params[e->index].kind != FG_PARAM_BUFFER || !e->a || e->b) {
        fail(p, "an index into something that is not a buffer parameter", e);
        return;
    }
    const fgi_param *prm = &mod->params[e->index];
    fgi_buf_printf(p->out, "%s(p.%s, p.fg_len_%s, ",
                   prm->type == FGI_T_FLOAT ? "fg_load_f32" : "fg_load_i32", prm->name, prm->name);
    print_at(p, e->a, P_COND);
    fgi_buf_puts(p->out, ")");
}

static void print_name(fgi_cuda_printer *p, const fgi_expr *e) {
    switch (e->kind) {
    case FGI_E_ARG:
        if (e->op < 0 || e->op >= 5) break;
        fgi_buf_puts(p->out, fgi_canonical_arg_names[e->op]);
        return;
    case FGI_E_PARAM:
        if (!p->mod || e->index < 0 || e->index >= p->mod->nparams ||
            p->mod->params[e->index].kind != FG_PARAM_SCALAR)
            break;
        fgi_buf_printf(p->out, "p.%s", p->mod->params[e->index].name);
        return;
    case FGI_E_LOCAL:
        if (e->index < 0 || (p->fn && e->index >= p->fn->nlocals)) break;
        fgi_buf_printf(p->out, "l%d", e->index);
        return;
    default: break;
    }
    fail(p, "an unresolved name", e);
}

static void print_node(fgi_cuda_printer *p, const fgi_expr *e) {
    switch (e->kind) {
    case FGI_E_INT_LIT:
        if (e->lit.i == INT32_MIN) fgi_buf_puts(p->out, "FG_INT_MIN");
        else fgi_buf_printf(p->out, parens(p) ? "(%d)" : "%d", (int)e->lit.i);
        return;
    case FGI_E_FLOAT_LIT:
        /* bracketed, a negative value never merges with an operator before it */
        if (parens(p)) fgi_buf_puts(p->out, "(");
        fgi_emit_float(p->out, e->lit.f);
        if (parens(p)) fgi_buf_puts(p->out, ")");
        return;
    case FGI_E_BOOL_LIT: fgi_buf_puts(p->out, e->lit.b ? "true" : "false"); return;
    case FGI_E_ARG:
    case FGI_E_PARAM:
    case FGI_E_LOCAL: print_name(p, e); return;
    case FGI_E_INDEX: print_index(p, e); return;
    case FGI_E_UNARY: print_unary(p, e); return;
    case FGI_E_BINARY: print_binary(p, e); return;
    case FGI_E_COND:
        if (parens(p)) fgi_buf_puts(p->out, "(");
        print_at(p, e->a, P_COND + 1);
        fgi_buf_puts(p->out, " ? ");
        print_at(p, e->b, P_COND + 1);
        fgi_buf_puts(p->out, " : ");
        print_at(p, e->c, P_COND + 1);
        if (parens(p)) fgi_buf_puts(p->out, ")");
        return;
    case FGI_E_CAST:
        if (!e->a) break;
        print_cast(p, e);
        return;
    case FGI_E_CALL: {
        const char *name = fgi_emit_builtin_fn(e->op, e->type);
        if (!name) break;
        if (approx(p) && e->type == FGI_T_FLOAT && fgi_builtin_get(e->op)->cuda_approx)
            name = fgi_builtin_get(e->op)->cuda_approx;
        for (int i = 0; i < e->nargs; i++)
            if (!e->args[i] || e->args[i]->type != e->type) {
                fail(p, "a builtin call with unconverted arguments", e);
                return;
            }
        print_call(p, name, (const fgi_expr *const *)e->args, e->nargs);
        return;
    }
    case FGI_E_NAME: break;
    }
    fail(p, "an expression", e);
}

void fgi_cuda_print_expr(fgi_cuda_printer *p, const fgi_expr *e) {
    print_at(p, e, P_NONE);
}
