/*
 * base.c -- what every module of libflexgen leans on and nothing else: status
 * strings and versions, error recording and the caret diagnostic, the arena,
 * the growable string, hashing and the clock. It calls no other module, so
 * any module may call it.
 *
 * Errors: each failing call records (status, message, offset, a copy of the
 * source text and file name) on the context and returns the status, so the
 * caller can render `file:line:col` with the source line and a caret later
 * without the mod object having to live that long.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- versions and status strings -------------------------------------- */

int fg_version_number(void) { return FLEXGEN_VERSION_NUMBER; }
const char *fg_version_string(void) { return FLEXGEN_VERSION_STRING; }

const char *fg_status_string(fg_status st) {
    switch (st) {
    case FG_OK: return "FG_OK: success";
    case FG_ERR_INVALID_ARGUMENT: return "FG_ERR_INVALID_ARGUMENT: invalid argument";
    case FG_ERR_OUT_OF_MEMORY: return "FG_ERR_OUT_OF_MEMORY: out of memory";
    case FG_ERR_IO: return "FG_ERR_IO: input/output error";
    case FG_ERR_SYNTAX: return "FG_ERR_SYNTAX: syntax error";
    case FG_ERR_UNSUPPORTED: return "FG_ERR_UNSUPPORTED: outside the mod language";
    case FG_ERR_NAME: return "FG_ERR_NAME: name error";
    case FG_ERR_TYPE: return "FG_ERR_TYPE: type error";
    case FG_ERR_SIGNATURE: return "FG_ERR_SIGNATURE: wrong mod signature";
    case FG_ERR_ARITY: return "FG_ERR_ARITY: wrong number of arguments";
    case FG_ERR_LIMIT: return "FG_ERR_LIMIT: limit exceeded";
    case FG_ERR_EVAL: return "FG_ERR_EVAL: evaluation error";
    case FG_ERR_UNBOUND: return "FG_ERR_UNBOUND: parameter binding error";
    case FG_ERR_SHAPE: return "FG_ERR_SHAPE: shape error";
    case FG_ERR_NOT_SUPPORTED: return "FG_ERR_NOT_SUPPORTED: configuration not supported";
    case FG_ERR_NOT_FOUND: return "FG_ERR_NOT_FOUND: not found";
    case FG_ERR_COMPILE: return "FG_ERR_COMPILE: compilation failed";
    case FG_ERR_NO_DEVICE: return "FG_ERR_NO_DEVICE: no CUDA device";
    case FG_ERR_CUDA: return "FG_ERR_CUDA: CUDA driver error";
    case FG_ERR_CACHE: return "FG_ERR_CACHE: kernel cache error";
    case FG_ERR_TOLERANCE: return "FG_ERR_TOLERANCE: result outside tolerance";
    }
    return "FG_ERR_UNKNOWN: unknown status";
}

void fg_free(void *p) { free(p); }

/* ---- arena ------------------------------------------------------------ */

struct fgi_arena_chunk {
    fgi_arena_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void fgi_arena_init(fgi_arena *a) { a->head = NULL; }

void fgi_arena_free(fgi_arena *a) {
    fgi_arena_chunk *c = a->head;
    while (c) {
        fgi_arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
}

void *fgi_arena_alloc(fgi_arena *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    fgi_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < size) {
        size_t cap = size > 16384 ? size : 16384;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *fgi_arena_strndup(fgi_arena *a, const char *s, size_t n) {
    char *p = fgi_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *fgi_arena_strdup(fgi_arena *a, const char *s) { return fgi_arena_strndup(a, s, strlen(s)); }

/* ---- growable string --------------------------------------------------- */

void fgi_buf_append(fgi_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void fgi_buf_puts(fgi_buf *b, const char *s) { fgi_buf_append(b, s, strlen(s)); }

void fgi_buf_printf(fgi_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        fgi_buf_append(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    fgi_buf_append(b, big, (size_t)n);
    free(big);
}

void fgi_buf_free(fgi_buf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *fgi_buf_take(fgi_buf *b) {
    if (b->oom) {
        fgi_buf_free(b);
        return NULL;
    }
    char *s = b->data ? b->data : calloc(1, 1);
    memset(b, 0, sizeof *b);
    return s;
}

/* ---- hashing and time -------------------------------------------------- */

uint64_t fgi_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

double fgi_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- errors ------------------------------------------------------------ */

fg_status fg_errcode(const fg_ctx *ctx) { return ctx ? ctx->status : FG_ERR_INVALID_ARGUMENT; }
const char *fg_errmsg(const fg_ctx *ctx) { return ctx ? ctx->message : "no context"; }
int64_t fg_error_offset(const fg_ctx *ctx) { return ctx ? ctx->offset : -1; }
const char *fg_compile_log(const fg_ctx *ctx) {
    return ctx && ctx->compile_log ? ctx->compile_log : "";
}

void fgi_clear_error(fg_ctx *ctx) {
    ctx->status = FG_OK;
    ctx->message[0] = 0;
    ctx->offset = -1;
    free(ctx->err_source);
    free(ctx->err_filename);
    free(ctx->diagnostic);
    ctx->err_source = ctx->err_filename = ctx->diagnostic = NULL;
    ctx->err_source_len = 0;
}

void fgi_set_compile_log(fg_ctx *ctx, const char *log) {
    free(ctx->compile_log);
    ctx->compile_log = log ? strdup(log) : NULL;
}

static fg_status record(fg_ctx *ctx, fg_status st, const char *filename, const char *source,
                        int64_t offset, const char *fmt, va_list ap) {
    if (!ctx) return st;
    fgi_clear_error(ctx);
    ctx->status = st;
    vsnprintf(ctx->message, sizeof ctx->message, fmt, ap);
    ctx->offset = offset;
    if (source && offset >= 0) {
        size_t n = strlen(source);
        ctx->err_source = malloc(n + 1);
        if (ctx->err_source) {
            memcpy(ctx->err_source, source, n + 1);
            ctx->err_source_len = n;
        }
    }
    if (filename) ctx->err_filename = strdup(filename);
    return st;
}

fg_status fgi_error_at(fg_ctx *ctx, fg_status st, const char *filename, const char *source,
                       int64_t offset, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(ctx, st, filename, source, offset, fmt, ap);
    va_end(ap);
    return st;
}

fg_status fgi_error(fg_ctx *ctx, fg_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(ctx, st, NULL, NULL, -1, fmt, ap);
    va_end(ap);
    return st;
}

/* The caret diagnostic: find the line holding the offset, print it, and put
 * '^' under the offending column followed by '~' to the end of the token
 * (the token length is not recorded, so underline the identifier-like run). */
const char *fg_error_diagnostic(fg_ctx *ctx) {
    if (!ctx) return "no context";
    if (ctx->diagnostic) return ctx->diagnostic;
    fgi_buf b = {0};
    const char *fname = ctx->err_filename ? ctx->err_filename : "<source>";
    const char *src = ctx->err_source;
    if (src && ctx->offset >= 0 && (size_t)ctx->offset <= ctx->err_source_len) {
        size_t off = (size_t)ctx->offset;
        size_t line_start = off;
        while (line_start > 0 && src[line_start - 1] != '\n') line_start--;
        size_t line_end = off;
        while (line_end < ctx->err_source_len && src[line_end] != '\n') line_end++;
        int line = 1;
        for (size_t i = 0; i < line_start; i++) line += src[i] == '\n';
        size_t col = off - line_start + 1;
        fgi_buf_printf(&b, "%s:%d:%zu: error: %s\n", fname, line, col, ctx->message);
        fgi_buf_puts(&b, "    ");
        fgi_buf_append(&b, src + line_start, line_end - line_start);
        fgi_buf_puts(&b, "\n    ");
        for (size_t i = line_start; i < off; i++) fgi_buf_append(&b, src[i] == '\t' ? "\t" : " ", 1);
        fgi_buf_puts(&b, "^");
        size_t tok = off;
        if (tok < line_end && (src[tok] == '_' || (src[tok] >= 'a' && src[tok] <= 'z') ||
                               (src[tok] >= 'A' && src[tok] <= 'Z') ||
                               (src[tok] >= '0' && src[tok] <= '9'))) {
            tok++;
            while (tok < line_end && (src[tok] == '_' || (src[tok] >= 'a' && src[tok] <= 'z') ||
                                      (src[tok] >= 'A' && src[tok] <= 'Z') ||
                                      (src[tok] >= '0' && src[tok] <= '9') || src[tok] == '.')) {
                fgi_buf_puts(&b, "~");
                tok++;
            }
        }
        fgi_buf_puts(&b, "\n");
    } else if (ctx->err_filename) {
        fgi_buf_printf(&b, "%s: error: %s\n", fname, ctx->message);
    } else {
        fgi_buf_printf(&b, "error: %s\n", ctx->message);
    }
    ctx->diagnostic = fgi_buf_take(&b);
    return ctx->diagnostic ? ctx->diagnostic : ctx->message;
}
