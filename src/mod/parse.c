/*
 * parse.c -- recursive-descent parser of the mod language.
 *
 * One small function per grammar rule, the rule written above it. The
 * grammar is a strict subset of C (docs/mod-language.md has it in EBNF):
 *
 *   file     = { include | param | function } EOF
 *   param    = ["const"] ("int" | "float") NAME "=" ["-" | "+"] literal ";"
 *            | "const" ("int" | "float") "*" ["const"] NAME ";"
 *   function = "bool" "mask_mod" "(" "int" NAME "," "int" NAME ","
 *                                     "int" NAME "," "int" NAME ")" body
 *            | "float" "score_mod" "(" "float" NAME "," "int" NAME "," ... ")" body
 *   body     = "{" { local } "return" expr ";" "}"
 *   local    = ["const"] ("int" | "float" | "bool") NAME "=" expr ";"
 *
 * Binary operators go through one precedence table, as in Lua's parser:
 * `binary(limit)` reads a unary operand and then every operator that binds
 * tighter than `limit`, so a chain like 1+1+1+... is a loop, not a
 * recursion. Recursion happens only where the text nests (parentheses,
 * unary operators, casts, ?:, calls, indices); a depth counter turns nesting
 * beyond FG_OPT_MAX_DEPTH into FG_ERR_LIMIT before the C stack is at risk,
 * and every finished expression is measured so that no later tree walk
 * (checker, evaluator, emitter) meets a tree taller than the limit.
 *
 * Much of the code is about refusing C politely. The parser knows the C
 * constructs a user might try (assignment, ++, loops, if, pointer
 * dereference, address-of, member access, helper functions) and names them
 * in an FG_ERR_UNSUPPORTED message instead of a bare syntax error. Names are
 * not resolved here: identifiers become NAME nodes and each function goes
 * to the checker as soon as its closing brace is read, so it sees exactly
 * the parameters declared above it, as a C compiler would.
 */
#include "mod/front.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct parser {
    fg_ctx *ctx;
    fg_mod *mod;
    const char *filename;
    const char *src;
    size_t len;
    const fgi_token *toks;
    int ntoks;
    int pos;
    int depth;
} parser;

/* ---- token helpers ------------------------------------------------------ */

static const fgi_token *peek(const parser *p) { return &p->toks[p->pos]; }
static const fgi_token *peek_at(const parser *p, int ahead) {
    int i = p->pos + ahead;
    return &p->toks[i < p->ntoks ? i : p->ntoks - 1];
}
static const fgi_token *next(parser *p) {
    const fgi_token *t = &p->toks[p->pos];
    if (t->kind != FGI_TK_EOF) p->pos++;
    return t;
}
static bool is(const parser *p, const char *s) { return fgi_tok_is(peek(p), p->src, s); }
static bool is_kw(const fgi_token *t, fgi_keyword kw) {
    return t->kind == FGI_TK_KEYWORD && t->kw == kw;
}
static bool is_type_kw(const fgi_token *t) {
    return is_kw(t, FGI_KW_INT) || is_kw(t, FGI_KW_FLOAT) || is_kw(t, FGI_KW_BOOL);
}
static fgi_type type_of_kw(const fgi_token *t) {
    return is_kw(t, FGI_KW_INT) ? FGI_T_INT : is_kw(t, FGI_KW_FLOAT) ? FGI_T_FLOAT : FGI_T_BOOL;
}

/* The token's text for a message, shortened and quoted. */
static const char *tok_text(const parser *p, const fgi_token *t, char *buf, size_t n) {
    if (t->kind == FGI_TK_EOF) {
        snprintf(buf, n, "end of input");
        return buf;
    }
    int len = t->length < 40 ? t->length : 40;
    snprintf(buf, n, "'%.*s%s'", len, p->src + t->offset, t->length > 40 ? "..." : "");
    return buf;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static fg_status fail(parser *p, fg_status st, int offset, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fgi_error_at(p->ctx, st, p->filename, p->src, offset, "%s", msg);
}

static fg_status unexpected(parser *p, const fgi_token *t) {
    char buf[64];
    return fail(p, FG_ERR_SYNTAX, t->offset, "unexpected symbol near %s",
                tok_text(p, t, buf, sizeof buf));
}

static fg_status expect(parser *p, const char *s, const char *where) {
    if (is(p, s)) {
        next(p);
        return FG_OK;
    }
    char buf[64];
    const fgi_token *t = peek(p);
    return fail(p, FG_ERR_SYNTAX, t->offset, "expected '%s' %s near %s", s, where,
                tok_text(p, t, buf, sizeof buf));
}

static char *tok_strdup(parser *p, const fgi_token *t) {
    return fgi_arena_strndup(&p->mod->arena, p->src + t->offset, (size_t)t->length);
}

static fg_status oom(parser *p) {
    return fgi_error(p->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory while parsing");
}

static fg_status new_node(parser *p, fgi_expr_kind kind, int op, const fgi_token *t,
                          fgi_expr **out) {
    fgi_expr *e = fgi_arena_alloc(&p->mod->arena, sizeof *e);
    if (!e) return oom(p);
    e->kind = kind;
    e->op = op;
    e->offset = t->offset;
    e->length = t->length;
    *out = e;
    return FG_OK;
}

/* Depth accounting for the places where the text nests. */
static fg_status enter(parser *p, const fgi_token *t) {
    if (++p->depth > p->ctx->max_depth)
        return fail(p, FG_ERR_LIMIT, t->offset,
                    "expression nested too deeply (more than %d levels; FG_OPT_MAX_DEPTH)",
                    p->ctx->max_depth);
    return FG_OK;
}
static void leave(parser *p) { p->depth--; }

/* Height of a tree, but never looking deeper than `limit` + 1 levels. */
static int height(const fgi_expr *e, int limit) {
    if (!e) return 0;
    if (limit < 0) return 1;
    int h = height(e->a, limit - 1);
    int hb = height(e->b, limit - 1);
    int hc = height(e->c, limit - 1);
    if (hb > h) h = hb;
    if (hc > h) h = hc;
    for (int i = 0; i < e->nargs; i++) {
        int ha = height(e->args[i], limit - 1);
        if (ha > h) h = ha;
    }
    return h + 1;
}

/* ---- expressions -------------------------------------------------------- */

static fg_status parse_expr(parser *p, fgi_expr **out);
static fg_status parse_unary(parser *p, fgi_expr **out);

static const struct binop {
    const char *text;
    fgi_op op;
    int prec;
} binops[] = {
    {"||", FGI_OP_LOR, 1},  {"&&", FGI_OP_LAND, 2}, {"|", FGI_OP_BOR, 3},
    {"^", FGI_OP_BXOR, 4},  {"&", FGI_OP_BAND, 5},  {"==", FGI_OP_EQ, 6},
    {"!=", FGI_OP_NE, 6},   {"<", FGI_OP_LT, 7},    {"<=", FGI_OP_LE, 7},
    {">", FGI_OP_GT, 7},    {">=", FGI_OP_GE, 7},   {"<<", FGI_OP_SHL, 8},
    {">>", FGI_OP_SHR, 8},  {"+", FGI_OP_ADD, 9},   {"-", FGI_OP_SUB, 9},
    {"*", FGI_OP_MUL, 10},  {"/", FGI_OP_DIV, 10},  {"%", FGI_OP_MOD, 10},
};

static const struct binop *binop_of(const parser *p, const fgi_token *t) {
    for (size_t i = 0; i < sizeof binops / sizeof binops[0]; i++)
        if (fgi_tok_is(t, p->src, binops[i].text)) return &binops[i];
    return NULL;
}

static bool is_assign_op(const parser *p, const fgi_token *t) {
    static const char *const ops[] = {"=",  "+=", "-=", "*=", "/=", "%=", "&=",
                                      "|=", "^=", "<<=", ">>=", "++", "--"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (fgi_tok_is(t, p->src, ops[i])) return true;
    return false;
}

static fg_status no_assign(parser *p, const fgi_token *t) {
    char buf[64];
    return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                "assignment %s is not supported in a mod (declare a new local instead)",
                tok_text(p, t, buf, sizeof buf));
}

static fg_status reserved_word(parser *p, const fgi_token *t) {
    char buf[64];
    tok_text(p, t, buf, sizeof buf);
    return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                "%s is not supported in a mod (a mod is parameters, local declarations "
                "and one return)",
                buf);
}

/* args = "(" [ expr { "," expr } ] ")" */
static fg_status parse_call_args(parser *p, fgi_expr *call) {
    next(p); /* ( */
    fgi_expr *args[8];
    int n = 0;
    if (!is(p, ")")) {
        for (;;) {
            fgi_expr *a;
            FGI_TRY(parse_expr(p, &a));
            if (n == 8)
                return fail(p, FG_ERR_ARITY, call->offset, "too many arguments in call to '%s'",
                            call->name);
            args[n++] = a;
            if (!is(p, ",")) break;
            next(p);
        }
    }
    FGI_TRY(expect(p, ")", "to close the call"));
    call->args = fgi_arena_alloc(&p->mod->arena, sizeof(fgi_expr *) * (size_t)(n ? n : 1));
    if (!call->args) return oom(p);
    memcpy(call->args, args, sizeof(fgi_expr *) * (size_t)n);
    call->nargs = n;
    return FG_OK;
}

/* primary = INT | FLOAT | "true" | "false" | "INFINITY" | "NAN"
 *         | NAME [ "(" args ")" ] | "(" expr ")" */
static fg_status parse_primary(parser *p, fgi_expr **out) {
    const fgi_token *t = peek(p);
    switch (t->kind) {
    case FGI_TK_INT:
        if (t->ival > 2147483647)
            return fail(p, FG_ERR_SYNTAX, t->offset,
                        "integer literal 2147483648 does not fit in a 32-bit int");
        next(p);
        FGI_TRY(new_node(p, FGI_E_INT_LIT, 0, t, out));
        (*out)->lit.i = (int32_t)t->ival;
        return FG_OK;
    case FGI_TK_FLOAT:
        next(p);
        FGI_TRY(new_node(p, FGI_E_FLOAT_LIT, 0, t, out));
        (*out)->lit.f = t->fval;
        return FG_OK;
    case FGI_TK_KEYWORD:
        if (is_kw(t, FGI_KW_TRUE) || is_kw(t, FGI_KW_FALSE)) {
            next(p);
            FGI_TRY(new_node(p, FGI_E_BOOL_LIT, 0, t, out));
            (*out)->lit.b = is_kw(t, FGI_KW_TRUE);
            return FG_OK;
        }
        if (is_kw(t, FGI_KW_INFINITY) || is_kw(t, FGI_KW_NAN)) {
            next(p);
            FGI_TRY(new_node(p, FGI_E_FLOAT_LIT, 0, t, out));
            (*out)->lit.f = is_kw(t, FGI_KW_INFINITY) ? (float)INFINITY : (float)NAN;
            return FG_OK;
        }
        return unexpected(p, t);
    case FGI_TK_IDENT:
        next(p);
        if (is(p, "(")) {
            FGI_TRY(new_node(p, FGI_E_CALL, -1, t, out));
            (*out)->name = tok_strdup(p, t);
            if (!(*out)->name) return oom(p);
            FGI_TRY(enter(p, t));
            FGI_TRY(parse_call_args(p, *out));
            leave(p);
            return FG_OK;
        }
        FGI_TRY(new_node(p, FGI_E_NAME, 0, t, out));
        (*out)->name = tok_strdup(p, t);
        return (*out)->name ? FG_OK : oom(p);
    case FGI_TK_RESERVED:
        return reserved_word(p, t);
    case FGI_TK_PUNCT:
        if (fgi_tok_is(t, p->src, "(")) {
            next(p);
            FGI_TRY(parse_expr(p, out));
            return expect(p, ")", "to close the parenthesis");
        }
        return unexpected(p, t);
    default:
        return unexpected(p, t);
    }
}

/* postfix = primary [ "[" expr "]" ]   (C's other postfix forms are refused) */
static fg_status parse_postfix(parser *p, fgi_expr **out) {
    FGI_TRY(parse_primary(p, out));
    for (;;) {
        const fgi_token *t = peek(p);
        if (fgi_tok_is(t, p->src, "[")) {
            next(p);
            fgi_expr *idx = NULL;
            FGI_TRY(new_node(p, FGI_E_INDEX, 0, t, &idx));
            if ((*out)->kind == FGI_E_NAME) {
                idx->offset = (*out)->offset;
                idx->length = (*out)->length;
                idx->name = (*out)->name;
            }
            idx->a = *out;
            FGI_TRY(enter(p, t));
            FGI_TRY(parse_expr(p, &idx->b));
            leave(p);
            FGI_TRY(expect(p, "]", "to close the index"));
            *out = idx;
        } else if (fgi_tok_is(t, p->src, "++") || fgi_tok_is(t, p->src, "--")) {
            return no_assign(p, t);
        } else if (fgi_tok_is(t, p->src, ".") || fgi_tok_is(t, p->src, "->")) {
            return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                        "member access '%.*s' is not supported in a mod", t->length,
                        p->src + t->offset);
        } else if (fgi_tok_is(t, p->src, "(")) {
            return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                        "only builtin functions can be called, by name");
        } else {
            return FG_OK;
        }
    }
}

/* cast = "(" ("int" | "float" | "bool") ")" unary */
static fg_status parse_cast(parser *p, fgi_expr **out) {
    const fgi_token *open = next(p);
    const fgi_token *ty = next(p);
    if (is(p, "*"))
        return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset, "pointer casts are not supported");
    FGI_TRY(expect(p, ")", "after the cast type"));
    FGI_TRY(new_node(p, FGI_E_CAST, (int)type_of_kw(ty), open, out));
    return parse_unary(p, &(*out)->a);
}

/* unary = ("-" | "+" | "!" | "~") unary | cast | postfix */
static fg_status parse_unary(parser *p, fgi_expr **out) {
    const fgi_token *t = peek(p);
    static const struct {
        const char *text;
        fgi_op op;
    } unops[] = {{"-", FGI_OP_NEG}, {"+", FGI_OP_PLUS}, {"!", FGI_OP_NOT}, {"~", FGI_OP_BITNOT}};
    FGI_TRY(enter(p, t));
    for (size_t i = 0; i < sizeof unops / sizeof unops[0]; i++) {
        if (!fgi_tok_is(t, p->src, unops[i].text)) continue;
        next(p);
        const fgi_token *operand = peek(p);
        /* -2147483648 is INT_MIN, as a C programmer means it. */
        if (unops[i].op == FGI_OP_NEG && operand->kind == FGI_TK_INT &&
            operand->ival == 2147483648ll) {
            next(p);
            FGI_TRY(new_node(p, FGI_E_INT_LIT, 0, t, out));
            (*out)->length = operand->offset + operand->length - t->offset;
            (*out)->lit.i = INT32_MIN;
        } else {
            FGI_TRY(new_node(p, FGI_E_UNARY, unops[i].op, t, out));
            FGI_TRY(parse_unary(p, &(*out)->a));
        }
        leave(p);
        return FG_OK;
    }
    if (fgi_tok_is(t, p->src, "++") || fgi_tok_is(t, p->src, "--")) return no_assign(p, t);
    if (fgi_tok_is(t, p->src, "*"))
        return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                    "pointer dereference is not supported (index a buffer: buf[i])");
    if (fgi_tok_is(t, p->src, "&"))
        return fail(p, FG_ERR_UNSUPPORTED, t->offset, "taking an address ('&') is not supported");
    if (fgi_tok_is(t, p->src, "(") && is_type_kw(peek_at(p, 1))) {
        FGI_TRY(parse_cast(p, out));
    } else {
        FGI_TRY(parse_postfix(p, out));
    }
    leave(p);
    return FG_OK;
}

/* binary(limit) = unary { binop unary }, for binops binding tighter than limit */
static fg_status parse_binary(parser *p, int limit, fgi_expr **out) {
    FGI_TRY(parse_unary(p, out));
    for (;;) {
        const fgi_token *t = peek(p);
        if (is_assign_op(p, t)) return no_assign(p, t);
        const struct binop *bo = binop_of(p, t);
        if (!bo || bo->prec <= limit) return FG_OK;
        next(p);
        fgi_expr *e = NULL;
        FGI_TRY(new_node(p, FGI_E_BINARY, bo->op, t, &e));
        e->a = *out;
        FGI_TRY(parse_binary(p, bo->prec, &e->b));
        *out = e;
    }
}

/* cond = binary(0) [ "?" expr ":" cond ] */
static fg_status parse_cond(parser *p, fgi_expr **out) {
    FGI_TRY(parse_binary(p, 0, out));
    const fgi_token *t = peek(p);
    if (!fgi_tok_is(t, p->src, "?")) return FG_OK;
    next(p);
    fgi_expr *e = NULL;
    FGI_TRY(new_node(p, FGI_E_COND, 0, t, &e));
    e->a = *out;
    FGI_TRY(enter(p, t));
    FGI_TRY(parse_expr(p, &e->b));
    FGI_TRY(expect(p, ":", "in the conditional expression"));
    FGI_TRY(parse_cond(p, &e->c));
    leave(p);
    *out = e;
    return FG_OK;
}

/* expr = cond   (C's comma operator and assignments are not part of it) */
static fg_status parse_expr(parser *p, fgi_expr **out) {
    FGI_TRY(enter(p, peek(p)));
    FGI_TRY(parse_cond(p, out));
    leave(p);
    return FG_OK;
}

/* A whole expression, measured once it is built. */
static fg_status parse_full_expr(parser *p, fgi_expr **out) {
    const fgi_token *t = peek(p);
    FGI_TRY(parse_expr(p, out));
    if (height(*out, p->ctx->max_depth) > p->ctx->max_depth)
        return fail(p, FG_ERR_LIMIT, t->offset,
                    "expression nested too deeply (more than %d levels; FG_OPT_MAX_DEPTH)",
                    p->ctx->max_depth);
    return FG_OK;
}

/* ---- function bodies ---------------------------------------------------- */

/* The statements C has and the mod language does not, named. */
static fg_status refuse_statement(parser *p) {
    const fgi_token *t = peek(p);
    if (t->kind == FGI_TK_RESERVED) return reserved_word(p, t);
    if (fgi_tok_is(t, p->src, "++") || fgi_tok_is(t, p->src, "--")) return no_assign(p, t);
    if (fgi_tok_is(t, p->src, "{"))
        return fail(p, FG_ERR_UNSUPPORTED, t->offset, "nested blocks are not supported");
    if (fgi_tok_is(t, p->src, "}"))
        return fail(p, FG_ERR_SYNTAX, t->offset, "missing return statement before '}'");
    if (t->kind == FGI_TK_IDENT) {
        const fgi_token *t2 = peek_at(p, 1);
        if (is_assign_op(p, t2))
            return fail(p, FG_ERR_UNSUPPORTED, t2->offset,
                        "assignment to '%.*s' is not supported in a mod (declare a new local "
                        "instead)",
                        t->length, p->src + t->offset);
        if (fgi_tok_is(t2, p->src, "[")) {
            /* buf[i] = ...: find out whether it is a store */
            fgi_expr *e = NULL;
            FGI_TRY(parse_postfix(p, &e));
            if (is_assign_op(p, peek(p)))
                return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset,
                            "buffers are read-only: assignment is not supported");
        }
        return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                    "expression statements are not supported (a body is local declarations "
                    "and one return)");
    }
    if (t->kind == FGI_TK_EOF)
        return fail(p, FG_ERR_SYNTAX, t->offset, "unexpected end of input in a function body");
    return unexpected(p, t);
}

/* local = ["const"] ("int" | "float" | "bool") NAME "=" expr ";" */
static fg_status parse_local(parser *p, fgi_func *fn, int *cap) {
    bool is_const = false;
    if (is_kw(peek(p), FGI_KW_CONST)) {
        next(p);
        is_const = true;
    }
    const fgi_token *ty = peek(p);
    if (!is_type_kw(ty)) {
        if (ty->kind == FGI_TK_RESERVED) return reserved_word(p, ty);
        return unexpected(p, ty);
    }
    next(p);
    if (is(p, "*"))
        return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset, "pointer locals are not supported");
    const fgi_token *name = peek(p);
    if (name->kind != FGI_TK_IDENT) {
        if (name->kind == FGI_TK_RESERVED || name->kind == FGI_TK_KEYWORD) {
            char buf[64];
            return fail(p, FG_ERR_NAME, name->offset, "%s is a reserved word",
                        tok_text(p, name, buf, sizeof buf));
        }
        return unexpected(p, name);
    }
    next(p);
    if (fn->nlocals >= p->ctx->max_locals)
        return fail(p, FG_ERR_LIMIT, name->offset,
                    "too many locals (more than %d; FG_OPT_MAX_LOCALS)", p->ctx->max_locals);
    if (is(p, "[") || is(p, "("))
        return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset,
                    "only scalar locals are supported (no arrays or functions)");
    if (!is(p, "="))
        return fail(p, FG_ERR_SYNTAX, peek(p)->offset,
                    "local '%.*s' needs an initial value ('= expr')", name->length,
                    p->src + name->offset);
    next(p);
    if (fn->nlocals == *cap) {
        int ncap = *cap ? *cap * 2 : 8;
        fgi_local *nl = fgi_arena_alloc(&p->mod->arena, sizeof *nl * (size_t)ncap);
        if (!nl) return oom(p);
        if (fn->nlocals) memcpy(nl, fn->locals, sizeof *nl * (size_t)fn->nlocals);
        fn->locals = nl;
        *cap = ncap;
    }
    fgi_local *l = &fn->locals[fn->nlocals];
    l->name = tok_strdup(p, name);
    if (!l->name) return oom(p);
    l->type = type_of_kw(ty);
    l->is_const = is_const;
    l->offset = name->offset;
    l->length = name->length;
    FGI_TRY(parse_full_expr(p, &l->init));
    fn->nlocals++;
    return expect(p, ";", "after the local declaration");
}

/* body = "{" { local } "return" expr ";" "}" */
static fg_status parse_body(parser *p, fgi_func *fn) {
    FGI_TRY(expect(p, "{", "to open the function body"));
    int cap = 0;
    for (;;) {
        const fgi_token *t = peek(p);
        if (is_kw(t, FGI_KW_RETURN)) break;
        if (is_kw(t, FGI_KW_CONST) || is_type_kw(t)) {
            FGI_TRY(parse_local(p, fn, &cap));
            continue;
        }
        return refuse_statement(p);
    }
    fn->ret_offset = next(p)->offset;
    if (is(p, ";"))
        return fail(p, FG_ERR_SYNTAX, peek(p)->offset, "return needs a value");
    FGI_TRY(parse_full_expr(p, &fn->ret));
    FGI_TRY(expect(p, ";", "after the return value"));
    const fgi_token *t = peek(p);
    if (fgi_tok_is(t, p->src, "}")) {
        next(p);
        return FG_OK;
    }
    if (t->kind == FGI_TK_EOF) return fail(p, FG_ERR_SYNTAX, t->offset, "expected '}' at end of input");
    char buf[64];
    return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                "code after the return statement is not supported (near %s)",
                tok_text(p, t, buf, sizeof buf));
}

/* ---- top level ----------------------------------------------------------- */

static fg_status check_new_name(parser *p, const fgi_token *name, int nargs,
                                const char *const *args) {
    char *s = tok_strdup(p, name);
    if (!s) return oom(p);
    const char *why = fgi_name_reserved(s);
    if (why) return fail(p, FG_ERR_NAME, name->offset, "'%s' is reserved: %s", s, why);
    for (int i = 0; i < nargs; i++)
        if (strcmp(args[i], s) == 0)
            return fail(p, FG_ERR_NAME, name->offset, "duplicate argument name '%s'", s);
    if (args && fgi_mod_find_param(p->mod, s) >= 0)
        return fail(p, FG_ERR_NAME, name->offset,
                    "argument '%s' has the name of a parameter", s);
    return FG_OK;
}

/* signature = "(" type NAME { "," type NAME } ")" with the exact types */
static fg_status parse_signature(parser *p, fgi_func *fn, const char *fname) {
    static const fgi_type mask_types[] = {FGI_T_INT, FGI_T_INT, FGI_T_INT, FGI_T_INT};
    static const fgi_type score_types[] = {FGI_T_FLOAT, FGI_T_INT, FGI_T_INT, FGI_T_INT,
                                           FGI_T_INT};
    bool score = fn->kind == FGI_FUNC_SCORE;
    const fgi_type *want = score ? score_types : mask_types;
    int n = score ? 5 : 4;
    const char *usage = score ? "float score_mod(float score, int b, int h, int q_idx, int kv_idx)"
                              : "bool mask_mod(int b, int h, int q_idx, int kv_idx)";
    const char *names[5] = {0};
    FGI_TRY(expect(p, "(", "after the function name"));
    for (int i = 0; i < n; i++) {
        const fgi_token *t = peek(p);
        if (i > 0) {
            if (!fgi_tok_is(t, p->src, ","))
                return fail(p, FG_ERR_SIGNATURE, t->offset, "%s takes %d arguments: %s", fname,
                            n, usage);
            next(p);
            t = peek(p);
        }
        if (!is_type_kw(t) || type_of_kw(t) != want[i])
            return fail(p, FG_ERR_SIGNATURE, t->offset,
                        "argument %d of %s must be %s: the signature is %s", i + 1, fname,
                        fgi_type_name(want[i]), usage);
        next(p);
        const fgi_token *name = peek(p);
        if (name->kind != FGI_TK_IDENT)
            return fail(p, FG_ERR_SIGNATURE, name->offset,
                        "argument %d of %s needs a name: the signature is %s", i + 1, fname,
                        usage);
        FGI_TRY(check_new_name(p, name, i, names));
        next(p);
        names[i] = tok_strdup(p, name);
        if (!names[i]) return oom(p);
    }
    if (!is(p, ")"))
        return fail(p, FG_ERR_SIGNATURE, peek(p)->offset, "%s takes %d arguments: %s", fname, n,
                    usage);
    next(p);
    /* fgi_arg order: b h q_idx kv_idx score; the text has score first. */
    for (int i = 0; i < 4; i++) fn->arg_names[i] = names[score ? i + 1 : i];
    if (score) fn->arg_names[FGI_ARG_SCORE] = names[0];
    return FG_OK;
}

/* function = type ("mask_mod" | "score_mod") signature body */
static fg_status parse_function(parser *p, const fgi_token *ret_type, const fgi_token *name) {
    size_t n = (size_t)name->length;
    bool is_mask = n == 8 && memcmp(p->src + name->offset, "mask_mod", 8) == 0;
    bool is_score = n == 9 && memcmp(p->src + name->offset, "score_mod", 9) == 0;
    if (!is_mask && !is_score)
        return fail(p, FG_ERR_UNSUPPORTED, name->offset,
                    "function '%.*s' is not supported: a mod defines only mask_mod and/or "
                    "score_mod",
                    name->length, p->src + name->offset);
    const char *fname = is_mask ? "mask_mod" : "score_mod";
    fgi_type want = is_mask ? FGI_T_BOOL : FGI_T_FLOAT;
    if (!is_type_kw(ret_type) || type_of_kw(ret_type) != want)
        return fail(p, FG_ERR_SIGNATURE, ret_type->offset, "%s must return %s", fname,
                    fgi_type_name(want));
    if ((is_mask && p->mod->mask) || (is_score && p->mod->score))
        return fail(p, FG_ERR_SIGNATURE, name->offset, "%s is defined twice", fname);
    fgi_func *fn = fgi_arena_alloc(&p->mod->arena, sizeof *fn);
    if (!fn) return oom(p);
    fn->kind = is_mask ? FGI_FUNC_MASK : FGI_FUNC_SCORE;
    fn->offset = name->offset;
    fn->src = p->src;
    fn->src_len = p->len;
    fn->filename = p->filename;
    FGI_TRY(parse_signature(p, fn, fname));
    if (is(p, ";"))
        return fail(p, FG_ERR_SYNTAX, peek(p)->offset, "%s needs a body, not just a declaration",
                    fname);
    FGI_TRY(parse_body(p, fn));
    FGI_TRY(fgi_check_func(p->ctx, p->mod, fn, p->mod->nparams));
    if (is_score) {
        p->mod->score = fn;
        return FG_OK;
    }
    fgi_mask_node *leaf = fgi_arena_alloc(&p->mod->arena, sizeof *leaf);
    if (!leaf) return oom(p);
    leaf->op = FGI_MASK_LEAF;
    leaf->func = fn;
    p->mod->mask = leaf;
    return FG_OK;
}

static fg_status add_param(parser *p, const fgi_token *name, fg_param_kind kind, fgi_type type,
                           fgi_param **out) {
    FGI_TRY(check_new_name(p, name, 0, NULL));
    char *s = tok_strdup(p, name);
    if (!s) return oom(p);
    if (fgi_mod_find_param(p->mod, s) >= 0)
        return fail(p, FG_ERR_NAME, name->offset, "duplicate parameter '%s'", s);
    if (p->mod->nparams >= FGI_MAX_PARAMS)
        return fail(p, FG_ERR_LIMIT, name->offset, "too many parameters (more than %d)",
                    FGI_MAX_PARAMS);
    int n = p->mod->nparams;
    if (n == 0 || (n >= 4 && (n & (n - 1)) == 0)) { /* capacity 4, 8, 16, ... */
        fgi_param *np = fgi_arena_alloc(&p->mod->arena, sizeof *np * (size_t)(n ? 2 * n : 4));
        if (!np) return oom(p);
        if (n) memcpy(np, p->mod->params, sizeof *np * (size_t)n);
        p->mod->params = np;
    }
    fgi_param *prm = &p->mod->params[n];
    prm->name = s;
    prm->kind = kind;
    prm->type = type;
    prm->offset = name->offset;
    *out = prm;
    return FG_OK;
}

/* default = ["-" | "+"] (INT | FLOAT | "INFINITY" | "NAN") */
static fg_status parse_default(parser *p, fgi_param *prm) {
    bool neg = false;
    if (is(p, "-") || is(p, "+")) neg = fgi_tok_is(next(p), p->src, "-");
    const fgi_token *t = peek(p);
    bool is_int = t->kind == FGI_TK_INT;
    bool is_flt = t->kind == FGI_TK_FLOAT || is_kw(t, FGI_KW_INFINITY) || is_kw(t, FGI_KW_NAN);
    if (!is_int && !is_flt) {
        char buf[64];
        return fail(p, FG_ERR_UNSUPPORTED, t->offset,
                    "the default of parameter '%s' must be a number literal, not %s", prm->name,
                    tok_text(p, t, buf, sizeof buf));
    }
    next(p);
    if (prm->type == FGI_T_INT) {
        if (!is_int)
            return fail(p, FG_ERR_TYPE, t->offset,
                        "the default of int parameter '%s' must be an integer literal",
                        prm->name);
        int64_t v = neg ? -t->ival : t->ival;
        if (v > INT32_MAX)
            return fail(p, FG_ERR_SYNTAX, t->offset,
                        "integer literal 2147483648 does not fit in a 32-bit int");
        prm->def.i = (int32_t)v;
    } else {
        float v = is_int ? (float)t->ival
                 : is_kw(t, FGI_KW_INFINITY) ? (float)INFINITY
                 : is_kw(t, FGI_KW_NAN)      ? (float)NAN
                                             : t->fval;
        prm->def.f = neg ? -v : v;
    }
    return FG_OK;
}

/* param = ["const"] ("int" | "float") NAME "=" default ";"
 *       | "const" ("int" | "float") "*" ["const"] NAME ";" */
static fg_status parse_param(parser *p, bool is_const, const fgi_token *ty) {
    bool buffer = is(p, "*");
    if (buffer) {
        const fgi_token *star = next(p);
        if (!is_const)
            return fail(p, FG_ERR_UNSUPPORTED, star->offset,
                        "buffers are read-only: declare them 'const %.*s *name;'", ty->length,
                        p->src + ty->offset);
        if (is(p, "*"))
            return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset,
                        "pointers to pointers are not supported");
        if (is_kw(peek(p), FGI_KW_CONST)) next(p);
    }
    const fgi_token *name = peek(p);
    if (name->kind != FGI_TK_IDENT) {
        char buf[64];
        if (name->kind == FGI_TK_RESERVED || name->kind == FGI_TK_KEYWORD)
            return fail(p, FG_ERR_NAME, name->offset, "%s is a reserved word",
                        tok_text(p, name, buf, sizeof buf));
        return unexpected(p, name);
    }
    next(p);
    if (is(p, "(")) {
        if (is_const || buffer)
            return fail(p, FG_ERR_SIGNATURE, ty->offset,
                        "'%.*s' must return plain bool or float", name->length,
                        p->src + name->offset);
        return parse_function(p, ty, name);
    }
    fgi_param *prm = NULL;
    if (is_kw(ty, FGI_KW_BOOL))
        return fail(p, FG_ERR_TYPE, ty->offset,
                    "%s parameters must be int or float, not bool", buffer ? "buffer" : "scalar");
    FGI_TRY(add_param(p, name, buffer ? FG_PARAM_BUFFER : FG_PARAM_SCALAR, type_of_kw(ty), &prm));
    if (is(p, "["))
        return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset,
                    "array parameters are not supported (use a buffer: const %.*s *%s;)",
                    ty->length, p->src + ty->offset, prm->name);
    if (!buffer) {
        if (!is(p, "="))
            return fail(p, FG_ERR_SYNTAX, peek(p)->offset,
                        "parameter '%s' needs a default value (%.*s %s = ...;)", prm->name,
                        ty->length, p->src + ty->offset, prm->name);
        next(p);
        FGI_TRY(parse_default(p, prm));
    } else if (is(p, "=")) {
        return fail(p, FG_ERR_UNSUPPORTED, peek(p)->offset,
                    "buffer '%s' is bound at run time and takes no initializer", prm->name);
    }
    p->mod->nparams++;
    return expect(p, ";", "after the declaration");
}

/* item = include | param | function */
static fg_status parse_item(parser *p) {
    const fgi_token *t = peek(p);
    if (t->kind == FGI_TK_INCLUDE) {
        next(p);
        return FG_OK;
    }
    bool is_const = false;
    if (is_kw(t, FGI_KW_CONST)) {
        next(p);
        is_const = true;
        t = peek(p);
    }
    if (is_type_kw(t)) {
        next(p);
        return parse_param(p, is_const, t);
    }
    if (t->kind == FGI_TK_RESERVED) return reserved_word(p, t);
    if (t->kind == FGI_TK_IDENT && fgi_tok_is(peek_at(p, 1), p->src, "("))
        return fail(p, FG_ERR_SYNTAX, t->offset,
                    "'%.*s' needs a return type (bool mask_mod / float score_mod)", t->length,
                    p->src + t->offset);
    char buf[64];
    return fail(p, FG_ERR_SYNTAX, t->offset,
                "unexpected symbol near %s outside a function (expected a parameter, "
                "mask_mod or score_mod)",
                tok_text(p, t, buf, sizeof buf));
}

fg_status fgi_parse_file(fg_ctx *ctx, fg_mod *mod, const char *filename, const char *src,
                         size_t len, const fgi_token *toks, int ntoks) {
    parser p = {ctx, mod, filename, src, len, toks, ntoks, 0, 0};
    while (peek(&p)->kind != FGI_TK_EOF) FGI_TRY(parse_item(&p));
    if (!mod->mask && !mod->score)
        return fail(&p, FG_ERR_SIGNATURE, (int)len,
                    "a mod must define mask_mod or score_mod (or both)");
    return FG_OK;
}

fg_status fgi_parse_expr(fg_ctx *ctx, fg_mod *mod, fgi_func *fn, const fgi_token *toks,
                         int ntoks) {
    parser p = {ctx, mod, fn->filename, fn->src, fn->src_len, toks, ntoks, 0, 0};
    if (peek(&p)->kind == FGI_TK_EOF) return fail(&p, FG_ERR_SYNTAX, 0, "empty expression");
    FGI_TRY(parse_full_expr(&p, &fn->ret));
    const fgi_token *t = peek(&p);
    if (t->kind == FGI_TK_EOF) return FG_OK;
    if (fgi_tok_is(t, p.src, ";"))
        return fail(&p, FG_ERR_SYNTAX, t->offset,
                    "the expression form takes one expression, without ';'");
    return unexpected(&p, t);
}
