/*
 * front.h -- what the five files of the mod-language front end share among
 * themselves (lex.c parse.c check.c print.c mod.c). The rest of the library
 * sees only the typed AST in internal.h.
 *
 * The flow: mod.c copies the text into the mod's arena, lex.c turns it into
 * an array of tokens (offset + length into that copy), parse.c builds the
 * AST and hands every finished function to check.c, which resolves names,
 * types every node and inserts the implicit casts; print.c then prints the
 * canonical text that names the mod in the kernel cache.
 */
#ifndef FLEXGEN_FRONT_H
#define FLEXGEN_FRONT_H

#include "internal.h"

/* ---- tokens (lex.c) ------------------------------------------------------ */

typedef enum fgi_tok_kind {
    FGI_TK_EOF = 0,
    FGI_TK_IDENT,    /* a name                                               */
    FGI_TK_KEYWORD,  /* a word of the mod language: kw says which            */
    FGI_TK_RESERVED, /* a C / C++ keyword outside the subset (for, struct...) */
    FGI_TK_INT,      /* ival, 0 .. 2^31 (2^31 only valid after unary minus) */
    FGI_TK_FLOAT,    /* fval                                                 */
    FGI_TK_PUNCT,    /* operator or punctuation; compare with fgi_tok_is     */
    FGI_TK_INCLUDE   /* the one accepted preprocessor line                   */
} fgi_tok_kind;

typedef enum fgi_keyword {
    FGI_KW_NONE = 0,
    FGI_KW_INT, FGI_KW_FLOAT, FGI_KW_BOOL, FGI_KW_CONST, FGI_KW_RETURN,
    FGI_KW_TRUE, FGI_KW_FALSE, FGI_KW_INFINITY, FGI_KW_NAN
} fgi_keyword;

typedef struct fgi_token {
    fgi_tok_kind kind;
    fgi_keyword kw;
    int offset, length;
    int64_t ival;
    float fval;
} fgi_token;

/* Tokenize text[0, len) (text[len] must be NUL). On success *toks is a
 * malloc'd array of *ntoks tokens ending with FGI_TK_EOF; the caller frees
 * it. Errors are reported against `filename`. */
fg_status fgi_lex(fg_ctx *ctx, const char *filename, const char *text, size_t len,
                  fgi_token **toks, int *ntoks);
/* Whether `t` is the punctuator `s`. */
bool fgi_tok_is(const fgi_token *t, const char *src, const char *s);

/* ---- parser (parse.c) ---------------------------------------------------- */

/* Parse a whole mod file into `mod` (params, mask, score), checking each
 * function as soon as it is complete. `src` is the arena copy. */
fg_status fgi_parse_file(fg_ctx *ctx, fg_mod *mod, const char *filename, const char *src,
                         size_t len, const fgi_token *toks, int ntoks);
/* Parse a bare expression (the expression form) into fn->ret, unchecked. */
fg_status fgi_parse_expr(fg_ctx *ctx, fg_mod *mod, fgi_func *fn, const fgi_token *toks,
                         int ntoks);

/* ---- checker (check.c) --------------------------------------------------- */

/* Resolve and type one function; only the first `nparams` parameters of the
 * mod are visible to it (C's declare-before-use). */
fg_status fgi_check_func(fg_ctx *ctx, fg_mod *mod, fgi_func *fn, int nparams);
/* NULL when `name` may be used for a parameter, argument or local, else the
 * reason it may not. */
const char *fgi_name_reserved(const char *name);
/* The builtin called `name` (canonical or C spelling); *force_float is set
 * for C spellings that convert their arguments to float (fabsf, fminf...).
 * Returns -1 when there is none. */
int fgi_builtin_lookup(const char *name, bool *force_float);
/* Argument count of a builtin. */
int fgi_builtin_arity(fgi_builtin fn);
/* Levenshtein distance, capped: returns cap + 1 when larger. */
int fgi_edit_distance(const char *a, const char *b, int cap);

/* ---- printer (print.c) --------------------------------------------------- */

/* Append the canonical text of an expression. */
void fgi_print_expr(fgi_buf *out, const fg_mod *mod, const fgi_func *fn, const fgi_expr *e);

#endif /* FLEXGEN_FRONT_H */
