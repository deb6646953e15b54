/*
 * print.c -- the canonical text of a mod.
 *
 * The kernel cache is keyed by a hash of this text, so it must be one text
 * per meaning: two mods that compute the same thing in the same way print
 * the same, and two that differ print differently. What is left out is
 * therefore as important as what is printed:
 *
 *  - whitespace, comments and redundant parentheses: the text is printed
 *    from the checked tree with the fewest parentheses C's precedence needs;
 *  - parameter default values: they are run-time kernel arguments, so
 *    changing one must not recompile;
 *  - the names the user chose for the function arguments and locals: the
 *    arguments print as b h q_idx kv_idx score, locals as l0 l1 ...
 *
 * What stays in: parameter names, kinds, types and order (they are the
 * layout of the kernel's parameter struct and the names bindings use), every
 * conversion the checker made explicit (printed as a C cast; casts of
 * literals were folded by the checker, so `score + 1` and `score + 1.0f`
 * print the same), and builtins under their canonical names (expf and exp
 * are one function). Composed masks print as their tree, `(A) && (B)`, each
 * leaf a body of its own.
 *
 * Literals print so that they read back to the same value: ints in decimal,
 * floats in the shortest form that round-trips through strtof, with an f
 * suffix; INFINITY and NAN by name.
 */
#include "mod/front.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- expressions -------------------------------------------------------- */

enum { PREC_COND = 1, PREC_UNARY = 12, PREC_PRIMARY = 13 };

static int binary_prec(int op) {
    switch (op) {
    case FGI_OP_LOR: return 2;
    case FGI_OP_LAND: return 3;
    case FGI_OP_BOR: return 4;
    case FGI_OP_BXOR: return 5;
    case FGI_OP_BAND: return 6;
    case FGI_OP_EQ: case FGI_OP_NE: return 7;
    case FGI_OP_LT: case FGI_OP_LE: case FGI_OP_GT: case FGI_OP_GE: return 8;
    case FGI_OP_SHL: case FGI_OP_SHR: return 9;
    case FGI_OP_ADD: case FGI_OP_SUB: return 10;
    default: return 11; /* * / % */
    }
}

static const char *op_str(int op) {
    switch (op) {
    case FGI_OP_NEG: return "-";
    case FGI_OP_PLUS: return "+";
    case FGI_OP_NOT: return "!";
    case FGI_OP_BITNOT: return "~";
    case FGI_OP_ADD: return "+";
    case FGI_OP_SUB: return "-";
    case FGI_OP_MUL: return "*";
    case FGI_OP_DIV: return "/";
    case FGI_OP_MOD: return "%";
    case FGI_OP_SHL: return "<<";
    case FGI_OP_SHR: return ">>";
    case FGI_OP_BAND: return "&";
    case FGI_OP_BOR: return "|";
    case FGI_OP_BXOR: return "^";
    case FGI_OP_LT: return "<";
    case FGI_OP_LE: return "<=";
    case FGI_OP_GT: return ">";
    case FGI_OP_GE: return ">=";
    case FGI_OP_EQ: return "==";
    case FGI_OP_NE: return "!=";
    case FGI_OP_LAND: return "&&";
    case FGI_OP_LOR: return "||";
    default: return "?";
    }
}

static int prec_of(const fgi_expr *e) {
    switch (e->kind) {
    case FGI_E_BINARY: return binary_prec(e->op);
    case FGI_E_COND: return PREC_COND;
    case FGI_E_UNARY:
    case FGI_E_CAST: return PREC_UNARY;
    case FGI_E_INT_LIT: return e->lit.i < 0 ? PREC_UNARY : PREC_PRIMARY;
    case FGI_E_FLOAT_LIT: return signbit(e->lit.f) ? PREC_UNARY : PREC_PRIMARY;
    default: return PREC_PRIMARY;
    }
}

/* The precedence an operand of binary `parent` must have to go without
 * parentheses. C's rules (`need`) are the minimum; on top of them the
 * combinations that C programmers misread and compilers warn about
 * (`a & b == c`, `a && b || c`, `a << b + c`...) are parenthesised too.
 * Arithmetic (except under a shift) and comparisons under && and || stay
 * bare. */
static int operand_prec(const fgi_expr *parent, const fgi_expr *child, int need) {
    if (child->kind != FGI_E_BINARY) return need;
    int pc = binary_prec(child->op), pp = binary_prec(parent->op);
    bool arith = pc >= 10 && pp != 9; /* not under a shift */
    bool compare = pc == 7 || pc == 8;
    bool logical_parent = parent->op == FGI_OP_LAND || parent->op == FGI_OP_LOR;
    if (pc == pp || (pc > pp && (arith || (compare && logical_parent)))) return need;
    return PREC_PRIMARY;
}

static void print_float(fgi_buf *out, float f) {
    if (isnan(f)) {
        fgi_buf_puts(out, "NAN");
        return;
    }
    if (isinf(f)) {
        fgi_buf_puts(out, f < 0 ? "-INFINITY" : "INFINITY");
        return;
    }
    char s[48];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(s, sizeof s, "%.*g", digits, (double)f);
        if (strtof(s, NULL) == f) break;
    }
    /* 3e+01 reads worse than 30: prefer positional notation when short */
    if (strchr(s, 'e')) {
        char t[48];
        for (int decimals = 0; decimals <= 12; decimals++) {
            snprintf(t, sizeof t, "%.*f", decimals, (double)f);
            if (strtof(t, NULL) == f) {
                if (strlen(t) <= 16) memcpy(s, t, strlen(t) + 1);
                break;
            }
        }
    }
    fgi_buf_puts(out, s);
    if (!strpbrk(s, ".e")) fgi_buf_puts(out, ".0");
    fgi_buf_puts(out, "f");
}

static void print_at(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e,
                     int min_prec);

static void print_name(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    switch (e->kind) {
    case FGI_E_ARG:
        fgi_buf_puts(out, e->op >= 0 && e->op < 5 ? fgi_canonical_arg_names[e->op] : "?");
        break;
    case FGI_E_PARAM:
        fgi_buf_puts(out, mod && e->index < mod->nparams ? mod->params[e->index].name : "?");
        break;
    case FGI_E_LOCAL: fgi_buf_printf(out, "l%d", e->index); break;
    default: fgi_buf_puts(out, e->name ? e->name : "?"); break;
    }
    (void)fn;
}

static void print_args(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    fgi_buf_puts(out, "(");
    for (int i = 0; i < e->nargs; i++) {
        if (i) fgi_buf_puts(out, ", ");
        print_at(out, mod, fn, e->args[i], PREC_COND);
    }
    fgi_buf_puts(out, ")");
}

static void print_node(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    switch (e->kind) {
    case FGI_E_INT_LIT:
        if (e->lit.i == INT32_MIN)
            fgi_buf_puts(out, "(-2147483647 - 1)");
        else
            fgi_buf_printf(out, "%d", (int)e->lit.i);
        break;
    case FGI_E_FLOAT_LIT: print_float(out, e->lit.f); break;
    case FGI_E_BOOL_LIT: fgi_buf_puts(out, e->lit.b ? "true" : "false"); break;
    case FGI_E_NAME:
    case FGI_E_ARG:
    case FGI_E_PARAM:
    case FGI_E_LOCAL: print_name(out, mod, fn, e); break;
    case FGI_E_INDEX:
        if (e->b) { /* unchecked: a = base, b = index */
            print_at(out, mod, fn, e->a, PREC_PRIMARY);
            fgi_buf_puts(out, "[");
            print_at(out, mod, fn, e->b, 0);
        } else {
            fgi_buf_puts(out, mod && e->index < mod->nparams ? mod->params[e->index].name : "?");
            fgi_buf_puts(out, "[");
            print_at(out, mod, fn, e->a, 0);
        }
        fgi_buf_puts(out, "]");
        break;
    case FGI_E_UNARY:
        fgi_buf_puts(out, op_str(e->op));
        /* "- -x" and "--x" differ; keep a space between two signs */
        if (e->a && (e->a->kind == FGI_E_UNARY || prec_of(e->a) == PREC_UNARY) &&
            e->a->kind != FGI_E_CAST)
            fgi_buf_puts(out, " ");
        print_at(out, mod, fn, e->a, PREC_UNARY);
        break;
    case FGI_E_BINARY: {
        int p = binary_prec(e->op);
        print_at(out, mod, fn, e->a, operand_prec(e, e->a, p));
        fgi_buf_printf(out, " %s ", op_str(e->op));
        print_at(out, mod, fn, e->b, operand_prec(e, e->b, p + 1));
        break;
    }
    case FGI_E_COND:
        print_at(out, mod, fn, e->a, PREC_COND + 1);
        fgi_buf_puts(out, " ? ");
        print_at(out, mod, fn, e->b, 0);
        fgi_buf_puts(out, " : ");
        print_at(out, mod, fn, e->c, PREC_COND);
        break;
    case FGI_E_CAST:
        fgi_buf_printf(out, "(%s)", fgi_type_name(e->type ? e->type : (fgi_type)e->op));
        print_at(out, mod, fn, e->a, PREC_UNARY);
        break;
    case FGI_E_CALL:
        fgi_buf_puts(out, e->type ? fgi_builtin_name((fgi_builtin)e->op) : e->name);
        print_args(out, mod, fn, e);
        break;
    }
}

static void print_at(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e,
                     int min_prec) {
    if (!e) {
        fgi_buf_puts(out, "?");
        return;
    }
    bool paren = prec_of(e) < min_prec;
    if (paren) fgi_buf_puts(out, "(");
    print_node(out, mod, fn, e);
    if (paren) fgi_buf_puts(out, ")");
}

void fgi_print_expr(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    print_at(out, mod, fn, e, 0);
}

char *fgi_expr_canonical(const fg_mod *mod, const fgi_func *fn, const fgi_expr *e) {
    fgi_buf b = {0};
    fgi_print_expr(&b, mod, fn, e);
    return fgi_buf_take(&b);
}

/* ---- the whole mod ------------------------------------------------------ */

static void print_body(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, int indent) {
    fgi_buf_puts(out, "{\n");
    for (int i = 0; i < fn->nlocals; i++) {
        fgi_buf_printf(out, "%*s%s l%d = ", indent + 4, "", fgi_type_name(fn->locals[i].type), i);
        fgi_print_expr(out, mod, fn, fn->locals[i].init);
        fgi_buf_puts(out, ";\n");
    }
    fgi_buf_printf(out, "%*sreturn ", indent + 4, "");
    fgi_print_expr(out, mod, fn, fn->ret);
    fgi_buf_printf(out, ";\n%*s}", indent, "");
}

static void print_mask(fgi_buf *out, const fg_mod *mod, const fgi_mask_node *n, int indent) {
    if (n->op == FGI_MASK_LEAF) {
        print_body(out, mod, n->func, indent);
        return;
    }
    fgi_buf_puts(out, "(");
    print_mask(out, mod, n->a, indent + 4);
    fgi_buf_printf(out, ") %s (", n->op == FGI_MASK_AND ? "&&" : "||");
    print_mask(out, mod, n->b, indent + 4);
    fgi_buf_puts(out, ")");
}

static void print_params(fgi_buf *out, const fg_mod *mod) {
    for (int i = 0; i < mod->nparams; i++) {
        const fgi_param *p = &mod->params[i];
        if (p->kind == FG_PARAM_BUFFER)
            fgi_buf_printf(out, "const %s *%s;\n", fgi_type_name(p->type), p->name);
        else
            fgi_buf_printf(out, "%s %s;\n", fgi_type_name(p->type), p->name);
    }
}

fg_status fgi_mod_finish(fg_ctx *ctx, fg_mod *mod) {
    fgi_buf b = {0};
    print_params(&b, mod);
    if (mod->mask) {
        fgi_buf_puts(&b, "bool mask_mod(int b, int h, int q_idx, int kv_idx) ");
        print_mask(&b, mod, mod->mask, 0);
        fgi_buf_puts(&b, "\n");
    }
    if (mod->score) {
        fgi_buf_puts(&b, "float score_mod(float score, int b, int h, int q_idx, int kv_idx) ");
        print_body(&b, mod, mod->score, 0);
        fgi_buf_puts(&b, "\n");
    }
    if (b.oom || !b.data) {
        fgi_buf_free(&b);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory printing the canonical form");
    }
    char *text = fgi_arena_strndup(&mod->arena, b.data, b.len);
    size_t len = b.len;
    fgi_buf_free(&b);
    if (!text) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory printing the canonical form");
    mod->canonical = text;
    mod->hash = fgi_fnv1a(FGI_FNV_SEED, text, len);
    fgi_mod_mark_divisors(mod);
    return FG_OK;
}
