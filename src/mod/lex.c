/*
 * lex.c -- the tokenizer of the mod language.
 *
 * A mod is a small C file, so the tokens are C's: names, integer and float
 * literals, operators and punctuation, with comments and whitespace skipped.
 * Every token keeps an offset and a length into the source, which is all the
 * parser and the diagnostics need; nothing is copied here.
 *
 * The tokenizer is also the first gate for things a mod may not contain.
 * String and character literals, octal and suffixed integers and every
 * preprocessor line except `#include <flexgen/mod.h>` stop here with a
 * status and the offset of the offending character. C keywords that the
 * subset does not use (for, struct, sizeof, asm...) and C++ keywords (the
 * emitted code is compiled as CUDA C++) become RESERVED tokens, so the parser
 * can say "'for' is not supported" instead of "unknown name 'for'".
 *
 * Integer literals are range-checked to int32; 2147483648 is let through
 * only so that the parser can turn `-2147483648` into INT_MIN. Float literals
 * are single precision whether or not they carry the `f` suffix (a mod has
 * no doubles), and one that overflows to infinity is an error: INFINITY is
 * spelled INFINITY.
 */
#include "mod/front.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lexer {
    fg_ctx *ctx;
    const char *filename;
    const char *src;
    size_t len;
    size_t pos;
    size_t begin; /* 3 when the text starts with a UTF-8 byte-order mark */
    fgi_token *toks;
    int ntoks, cap;
} lexer;

static const struct {
    const char *word;
    fgi_keyword kw;
} keywords[] = {
    {"int", FGI_KW_INT},       {"float", FGI_KW_FLOAT},       {"bool", FGI_KW_BOOL},
    {"const", FGI_KW_CONST},   {"return", FGI_KW_RETURN},     {"true", FGI_KW_TRUE},
    {"false", FGI_KW_FALSE},   {"INFINITY", FGI_KW_INFINITY}, {"NAN", FGI_KW_NAN},
};

/* C keywords outside the subset, GNU spellings, and C++ keywords. */
static const char *const reserved_words[] = {
    "auto", "break", "case", "char", "continue", "default", "do", "double", "else", "enum",
    "extern", "for", "goto", "if", "inline", "long", "register", "restrict", "short",
    "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
    "volatile", "while", "_Bool", "_Complex", "_Imaginary", "_Atomic", "_Alignas",
    "_Alignof", "_Generic", "_Noreturn", "_Static_assert", "_Thread_local", "asm",
    "__asm__", "__asm", "__attribute__", "__restrict", "__restrict__", "__inline",
    "__volatile__", "__typeof__", "typeof", "class", "new", "delete", "this", "template",
    "typename", "namespace", "operator", "virtual", "public", "private", "protected",
    "friend", "using", "try", "catch", "throw", "nullptr", "mutable", "explicit",
    "constexpr", "consteval", "constinit", "decltype", "static_cast", "reinterpret_cast",
    "const_cast", "dynamic_cast", "alignas", "alignof", "noexcept", "thread_local",
    "wchar_t", "char8_t", "char16_t", "char32_t", "export", "co_await", "co_yield",
    "co_return", "concept", "requires", "typeid", "static_assert", "and", "or", "not",
    "xor", "bitand", "bitor", "compl", "and_eq", "or_eq", "xor_eq", "not_eq",
};

/* Longest first, so that "<<=" wins over "<<" and "<". */
static const char *const puncts[] = {
    "<<=", ">>=", "...", "->", "++", "--", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=",
    "<<",  ">>",  "<=",  ">=", "==", "!=", "&&", "||", "##", "+",  "-",  "*",  "/",  "%",
    "<",   ">",   "=",   "!",  "~",  "&",  "|",  "^",  "?",  ":",  ";",  ",",  "(",  ")",
    "{",   "}",   "[",   "]",  ".",
};

static bool is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }
static bool is_hex(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static fg_status lex_error(lexer *lx, fg_status st, size_t at, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fgi_error_at(lx->ctx, st, lx->filename, lx->src, (int64_t)at, "%s", msg);
}

bool fgi_tok_is(const fgi_token *t, const char *src, const char *s) {
    size_t n = strlen(s);
    return t->kind == FGI_TK_PUNCT && (size_t)t->length == n &&
           memcmp(src + t->offset, s, n) == 0;
}

static fg_status push(lexer *lx, fgi_tok_kind kind, size_t start, size_t end, fgi_token **out) {
    if (lx->ntoks == lx->cap) {
        int ncap = lx->cap ? lx->cap * 2 : 64;
        fgi_token *nt = realloc(lx->toks, (size_t)ncap * sizeof *nt);
        if (!nt) return fgi_error(lx->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory while tokenizing");
        lx->toks = nt;
        lx->cap = ncap;
    }
    fgi_token *t = &lx->toks[lx->ntoks++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->offset = (int)start;
    t->length = (int)(end - start);
    if (out) *out = t;
    return FG_OK;
}

/* Block and line comments. A line comment that ends in a backslash would
 * swallow the next line in C; the mod language refuses it rather than
 * disagree with a C compiler about what the text means. */
static fg_status skip_comment(lexer *lx, bool *skipped) {
    const char *s = lx->src;
    size_t p = lx->pos;
    *skipped = false;
    if (p + 1 >= lx->len || s[p] != '/') return FG_OK;
    if (s[p + 1] == '/') {
        size_t e = p + 2;
        while (e < lx->len && s[e] != '\n') e++;
        size_t last = e;
        while (last > p + 2 && (s[last - 1] == '\r')) last--;
        if (last > p + 2 && s[last - 1] == '\\')
            return lex_error(lx, FG_ERR_UNSUPPORTED, last - 1,
                             "line continuation '\\' at the end of a comment is not supported");
        lx->pos = e;
        *skipped = true;
    } else if (s[p + 1] == '*') {
        size_t e = p + 2;
        while (e + 1 < lx->len && !(s[e] == '*' && s[e + 1] == '/')) e++;
        if (e + 1 >= lx->len) return lex_error(lx, FG_ERR_SYNTAX, p, "unterminated comment");
        lx->pos = e + 2;
        *skipped = true;
    }
    return FG_OK;
}

/* Whether `p` is the first non-blank character of its line. */
static bool at_line_start(const lexer *lx, size_t p) {
    while (p > lx->begin) {
        char c = lx->src[p - 1];
        if (c == '\n') return true;
        if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
        p--;
    }
    return true;
}

static size_t skip_blanks(const lexer *lx, size_t p) {
    while (p < lx->len && (lx->src[p] == ' ' || lx->src[p] == '\t')) p++;
    return p;
}

static bool match_at(const lexer *lx, size_t p, const char *s) {
    size_t n = strlen(s);
    return p + n <= lx->len && memcmp(lx->src + p, s, n) == 0;
}

/* `#include <flexgen/mod.h>` alone on its line (a comment may follow). */
static fg_status lex_directive(lexer *lx) {
    size_t start = lx->pos;
    if (!at_line_start(lx, start))
        return lex_error(lx, FG_ERR_SYNTAX, start, "unexpected character %s", "'#'");
    size_t p = skip_blanks(lx, start + 1);
    size_t word = p;
    while (p < lx->len && is_alnum(lx->src[p])) p++;
    char name[24] = "#";
    size_t wn = p - word < sizeof name - 2 ? p - word : sizeof name - 2;
    memcpy(name + 1, lx->src + word, wn);
    name[wn + 1] = '\0';
    bool ok = strcmp(name, "#include") == 0;
    if (ok) {
        p = skip_blanks(lx, p);
        ok = match_at(lx, p, "<flexgen/mod.h>");
        p += 15;
    }
    size_t end = p;
    if (ok) {
        p = skip_blanks(lx, p);
        ok = p >= lx->len || lx->src[p] == '\n' || lx->src[p] == '\r' ||
             match_at(lx, p, "//") || match_at(lx, p, "/*");
    }
    if (!ok) {
        if (strcmp(name, "#include") == 0)
            return lex_error(lx, FG_ERR_UNSUPPORTED, start,
                             "'%s' of anything but <flexgen/mod.h> is not supported", name);
        return lex_error(lx, FG_ERR_UNSUPPORTED, start,
                         "preprocessor directive '%s' is not supported (a mod may only "
                         "#include <flexgen/mod.h>)",
                         name);
    }
    FGI_TRY(push(lx, FGI_TK_INCLUDE, start, end, NULL));
    lx->pos = end;
    return FG_OK;
}

static fg_status lex_word(lexer *lx) {
    size_t start = lx->pos, p = start;
    while (p < lx->len && is_alnum(lx->src[p])) p++;
    fgi_token *t = NULL;
    FGI_TRY(push(lx, FGI_TK_IDENT, start, p, &t));
    size_t n = p - start;
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (strlen(keywords[i].word) == n && memcmp(keywords[i].word, lx->src + start, n) == 0) {
            t->kind = FGI_TK_KEYWORD;
            t->kw = keywords[i].kw;
        }
    for (size_t i = 0; i < sizeof reserved_words / sizeof reserved_words[0]; i++)
        if (strlen(reserved_words[i]) == n && memcmp(reserved_words[i], lx->src + start, n) == 0)
            t->kind = FGI_TK_RESERVED;
    lx->pos = p;
    return FG_OK;
}

static fg_status bad_suffix(lexer *lx, size_t p) {
    char word[32];
    size_t e = p;
    while (e < lx->len && is_alnum(lx->src[e]) && e - p < sizeof word - 1) e++;
    memcpy(word, lx->src + p, e - p);
    word[e - p] = '\0';
    return lex_error(lx, FG_ERR_SYNTAX, p, "invalid suffix '%s' on a number", word);
}

static fg_status lex_float(lexer *lx, size_t start, size_t p) {
    /* p is past the mantissa and exponent; strtof reads the same text. */
    char *end = NULL;
    errno = 0;
    float v = strtof(lx->src + start, &end);
    if (end != lx->src + p) return lex_error(lx, FG_ERR_SYNTAX, start, "malformed float literal");
    if (isinf(v)) return lex_error(lx, FG_ERR_SYNTAX, start, "float literal out of range");
    if (p < lx->len && (lx->src[p] == 'f' || lx->src[p] == 'F')) p++;
    if (p < lx->len && is_alnum(lx->src[p])) return bad_suffix(lx, p);
    fgi_token *t = NULL;
    FGI_TRY(push(lx, FGI_TK_FLOAT, start, p, &t));
    t->fval = v;
    lx->pos = p;
    return FG_OK;
}

static fg_status lex_int(lexer *lx, size_t start, size_t p, int base) {
    int64_t v = 0;
    for (size_t i = start + (base == 16 ? 2 : 0); i < p; i++) {
        char c = lx->src[i];
        int d = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
        v = v * base + d;
        if (v > 2147483648ll)
            return lex_error(lx, FG_ERR_SYNTAX, start, "integer literal does not fit in a 32-bit int");
    }
    if (p < lx->len && is_alnum(lx->src[p])) return bad_suffix(lx, p);
    fgi_token *t = NULL;
    FGI_TRY(push(lx, FGI_TK_INT, start, p, &t));
    t->ival = v;
    lx->pos = p;
    return FG_OK;
}

/* decimal | 0x hex | digits [. digits] [e [+-] digits] [f] | . digits ... */
static fg_status lex_number(lexer *lx) {
    const char *s = lx->src;
    size_t start = lx->pos, p = start;
    if (s[p] == '0' && p + 1 < lx->len && (s[p + 1] == 'x' || s[p + 1] == 'X')) {
        p += 2;
        size_t digits = p;
        while (p < lx->len && is_hex(s[p])) p++;
        if (p == digits) return lex_error(lx, FG_ERR_SYNTAX, start, "malformed hex literal");
        if (p < lx->len && (s[p] == '.' || s[p] == 'p' || s[p] == 'P'))
            return lex_error(lx, FG_ERR_UNSUPPORTED, start, "hex float literals are not supported");
        return lex_int(lx, start, p, 16);
    }
    bool is_float = false;
    while (p < lx->len && is_digit(s[p])) p++;
    if (p < lx->len && s[p] == '.') {
        is_float = true;
        p++;
        while (p < lx->len && is_digit(s[p])) p++;
    }
    if (p < lx->len && (s[p] == 'e' || s[p] == 'E')) {
        size_t q = p + 1;
        if (q < lx->len && (s[q] == '+' || s[q] == '-')) q++;
        if (q < lx->len && is_digit(s[q])) {
            is_float = true;
            p = q;
            while (p < lx->len && is_digit(s[p])) p++;
        }
    }
    if (is_float) return lex_float(lx, start, p);
    if (s[start] == '0' && p - start > 1)
        return lex_error(lx, FG_ERR_UNSUPPORTED, start,
                         "octal literals are not supported (write the number in decimal)");
    return lex_int(lx, start, p, 10);
}

static fg_status lex_punct(lexer *lx) {
    for (size_t i = 0; i < sizeof puncts / sizeof puncts[0]; i++) {
        if (match_at(lx, lx->pos, puncts[i])) {
            size_t n = strlen(puncts[i]);
            FGI_TRY(push(lx, FGI_TK_PUNCT, lx->pos, lx->pos + n, NULL));
            lx->pos += n;
            return FG_OK;
        }
    }
    unsigned char c = (unsigned char)lx->src[lx->pos];
    char shown[16];
    if (c >= 0x21 && c < 0x7f)
        snprintf(shown, sizeof shown, "'%c'", c);
    else
        snprintf(shown, sizeof shown, "byte 0x%02X", c);
    return lex_error(lx, FG_ERR_SYNTAX, lx->pos, "unexpected character %s", shown);
}

static fg_status lex_one(lexer *lx) {
    char c = lx->src[lx->pos];
    if (is_alpha(c)) return lex_word(lx);
    if (is_digit(c) || (c == '.' && lx->pos + 1 < lx->len && is_digit(lx->src[lx->pos + 1])))
        return lex_number(lx);
    if (c == '"' || c == '\'')
        return lex_error(lx, FG_ERR_UNSUPPORTED, lx->pos, "%s literals are not supported",
                         c == '"' ? "string" : "character");
    if (c == '#') return lex_directive(lx);
    return lex_punct(lx);
}

fg_status fgi_lex(fg_ctx *ctx, const char *filename, const char *text, size_t len,
                  fgi_token **toks, int *ntoks) {
    lexer lx = {ctx, filename, text, len, 0, 0, NULL, 0, 0};
    /* editors on some systems start files with a byte-order mark */
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) lx.pos = lx.begin = 3;
    fg_status st = FG_OK;
    while (st == FG_OK) {
        while (lx.pos < len && is_space(text[lx.pos])) lx.pos++;
        if (lx.pos >= len) break;
        bool skipped;
        st = skip_comment(&lx, &skipped);
        if (st != FG_OK || skipped) continue;
        st = lex_one(&lx);
    }
    if (st == FG_OK) st = push(&lx, FGI_TK_EOF, len, len, NULL);
    if (st != FG_OK) {
        free(lx.toks);
        return st;
    }
    *toks = lx.toks;
    *ntoks = lx.ntoks;
    return FG_OK;
}
