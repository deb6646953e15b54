/*
 * core.c -- the pieces every module leans on: the context and its options,
 * error recording and the caret diagnostic, status strings, versions, the
 * arena, the growable string, bindings and the parameter-struct layout.
 *
 * Errors: each failing call records (status, message, offset, a copy of the
 * source text and file name) on the context and returns the status, so the
 * caller can render `file:line:col` with the source line and a caret later
 * without the mod object having to live that long.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include <math.h>
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

/* ---- context ----------------------------------------------------------- */

void fgi_cuda_state_free(struct fgi_cuda_state *s); /* cuda.c */

fg_status fg_ctx_create(fg_ctx **out) {
    if (!out) return FG_ERR_INVALID_ARGUMENT;
    *out = NULL;
    fg_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return FG_ERR_OUT_OF_MEMORY;
    ctx->offset = -1;
    ctx->device = 0;
    const char *dc = getenv("FLEXGEN_DISK_CACHE");
    ctx->disk_cache = !(dc && strcmp(dc, "0") == 0);
    const char *hk = getenv("FLEXGEN_HOPPER_KERNEL");
    ctx->hopper_kernel = !(hk && strcmp(hk, "0") == 0);
    ctx->cache_max_bytes = (int64_t)1 << 30;
    const char *mb = getenv("FLEXGEN_CACHE_MAX_BYTES");
    if (mb && *mb) {
        char *end;
        long long v = strtoll(mb, &end, 10);
        if (*end == 0 && v > 0) ctx->cache_max_bytes = v;
    }
    ctx->max_source = 64 * 1024;
    ctx->max_depth = 200;
    ctx->max_locals = 64;
    *out = ctx;
    return FG_OK;
}

void fg_ctx_destroy(fg_ctx *ctx) {
    if (!ctx) return;
    fgi_clear_error(ctx);
    free(ctx->compile_log);
    free(ctx->cache_dir);
    fgi_cuda_state_free(ctx->cuda);
    free(ctx);
}

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

/* ---- options ----------------------------------------------------------- */

fg_status fg_ctx_set_int(fg_ctx *ctx, fg_option opt, int64_t v) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_DEVICE:
        FGI_CHECK_ARG(ctx, v >= 0 && v < 1024, "device ordinal %lld out of range", (long long)v);
        ctx->device = (int)v;
        return FG_OK;
    case FG_OPT_DISK_CACHE:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "disk cache flag must be 0 or 1");
        ctx->disk_cache = (int)v;
        return FG_OK;
    case FG_OPT_HOPPER_KERNEL:
        FGI_CHECK_ARG(ctx, v == 0 || v == 1, "Hopper kernel flag must be 0 or 1");
        ctx->hopper_kernel = (int)v;
        return FG_OK;
    case FG_OPT_CACHE_MAX_BYTES:
        FGI_CHECK_ARG(ctx, v > 0, "cache size cap must be positive");
        ctx->cache_max_bytes = v;
        return FG_OK;
    case FG_OPT_MAX_SOURCE:
        FGI_CHECK_ARG(ctx, v >= 16 && v <= (1 << 24), "source limit out of range [16, 16M]");
        ctx->max_source = (int)v;
        return FG_OK;
    case FG_OPT_MAX_DEPTH:
        FGI_CHECK_ARG(ctx, v >= 4 && v <= 1000, "depth limit out of range [4, 1000]");
        ctx->max_depth = (int)v;
        return FG_OK;
    case FG_OPT_MAX_LOCALS:
        FGI_CHECK_ARG(ctx, v >= 0 && v <= 1024, "locals limit out of range [0, 1024]");
        ctx->max_locals = (int)v;
        return FG_OK;
    default:
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not an integer option", (int)opt);
    }
}

fg_status fg_ctx_get_int(const fg_ctx *ctx, fg_option opt, int64_t *v) {
    if (!ctx || !v) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_DEVICE: *v = ctx->device; return FG_OK;
    case FG_OPT_DISK_CACHE: *v = ctx->disk_cache; return FG_OK;
    case FG_OPT_HOPPER_KERNEL: *v = ctx->hopper_kernel; return FG_OK;
    case FG_OPT_CACHE_MAX_BYTES: *v = ctx->cache_max_bytes; return FG_OK;
    case FG_OPT_MAX_SOURCE: *v = ctx->max_source; return FG_OK;
    case FG_OPT_MAX_DEPTH: *v = ctx->max_depth; return FG_OK;
    case FG_OPT_MAX_LOCALS: *v = ctx->max_locals; return FG_OK;
    default: return FG_ERR_INVALID_ARGUMENT;
    }
}

static bool valid_arch(const char *s) {
    /* sm_XY or sm_XYa / compute_XY: digits after the prefix, optional 'a'. */
    const char *p;
    if (strncmp(s, "sm_", 3) == 0) p = s + 3;
    else if (strncmp(s, "compute_", 8) == 0) p = s + 8;
    else return false;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (digits < 2 || digits > 3) return false;
    if (*p == 'a' || *p == 'f') p++;
    return *p == 0;
}

fg_status fg_ctx_set_string(fg_ctx *ctx, fg_option opt, const char *v) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_ARCH:
        if (!v || !*v) {
            ctx->arch[0] = 0;
            return FG_OK;
        }
        FGI_CHECK_ARG(ctx, strlen(v) < sizeof ctx->arch && valid_arch(v),
                      "invalid arch '%s' (expected e.g. sm_80, sm_90a)", v);
        strcpy(ctx->arch, v);
        return FG_OK;
    case FG_OPT_CACHE_DIR: {
        char *d = NULL;
        if (v && *v) {
            d = strdup(v);
            if (!d) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory");
        }
        free(ctx->cache_dir);
        ctx->cache_dir = d;
        return FG_OK;
    }
    default:
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not a string option", (int)opt);
    }
}

fg_status fg_ctx_get_string(fg_ctx *ctx, fg_option opt, const char **v) {
    if (!ctx || !v) return FG_ERR_INVALID_ARGUMENT;
    switch (opt) {
    case FG_OPT_ARCH: *v = fgi_effective_arch(ctx); return FG_OK;
    case FG_OPT_CACHE_DIR: return fg_cache_dir(ctx, v);
    default: return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "option %d is not a string option", (int)opt);
    }
}

/* ---- bindings ---------------------------------------------------------- */

fg_binding fg_bind_int(const char *name, int32_t v) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_SCALAR;
    b.type = FG_TYPE_INT;
    b.value.i = v;
    return b;
}

fg_binding fg_bind_float(const char *name, float v) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_SCALAR;
    b.type = FG_TYPE_FLOAT;
    b.value.f = v;
    return b;
}

fg_binding fg_bind_int_buffer(const char *name, const int32_t *data, int64_t length) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_BUFFER;
    b.type = FG_TYPE_INT;
    b.value.buffer.data = data;
    b.value.buffer.length = length;
    return b;
}

fg_binding fg_bind_float_buffer(const char *name, const float *data, int64_t length) {
    fg_binding b = fg_bind_int_buffer(name, NULL, length);
    b.type = FG_TYPE_FLOAT;
    b.value.buffer.data = data;
    return b;
}

static fgi_type public_to_internal(fg_type t) {
    switch (t) {
    case FG_TYPE_BOOL: return FGI_T_BOOL;
    case FG_TYPE_INT: return FGI_T_INT;
    case FG_TYPE_FLOAT: return FGI_T_FLOAT;
    }
    return FGI_T_NONE;
}

/* A scalar binding may give an int for a float parameter (converted) but not
 * a float for an int parameter (that would silently truncate). */
fg_status fgi_bind(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                   fgi_value *values) {
    FGI_CHECK_ARG(ctx, mod && values, "NULL mod or values");
    FGI_CHECK_ARG(ctx, binds || nbinds == 0, "NULL bindings with a non-zero count");
    bool bound[FGI_MAX_PARAMS] = {0};
    for (int i = 0; i < mod->nparams; i++) {
        memset(&values[i], 0, sizeof values[i]);
        if (mod->params[i].kind == FG_PARAM_SCALAR) values[i].scalar.i = mod->params[i].def.i;
    }
    for (size_t k = 0; k < nbinds; k++) {
        const fg_binding *bd = &binds[k];
        if (!bd->name) return fgi_error(ctx, FG_ERR_UNBOUND, "binding %zu has no name", k);
        int i = fgi_mod_find_param(mod, bd->name);
        if (i < 0)
            return fgi_error(ctx, FG_ERR_UNBOUND, "binding '%s' names no parameter of mod '%s'",
                             bd->name, mod->name ? mod->name : "?");
        const fgi_param *p = &mod->params[i];
        if (bound[i]) return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' bound twice", p->name);
        bound[i] = true;
        if (bd->kind != p->kind)
            return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is a %s, bound as a %s", p->name,
                             p->kind == FG_PARAM_BUFFER ? "buffer" : "scalar",
                             bd->kind == FG_PARAM_BUFFER ? "buffer" : "scalar");
        fgi_type bt = public_to_internal(bd->type);
        if (p->kind == FG_PARAM_BUFFER) {
            if (bt != p->type)
                return fgi_error(ctx, FG_ERR_UNBOUND, "buffer '%s' holds %s, bound with %s elements",
                                 p->name, fgi_type_name(p->type), fgi_type_name(bt));
            if (bd->value.buffer.length < 0 || (bd->value.buffer.length > 0 && !bd->value.buffer.data))
                return fgi_error(ctx, FG_ERR_UNBOUND, "buffer '%s' bound with a NULL pointer or negative length",
                                 p->name);
            values[i].data = bd->value.buffer.data;
            values[i].length = bd->value.buffer.length;
        } else if (p->type == FGI_T_INT) {
            if (bt != FGI_T_INT)
                return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is an int, bound with a %s",
                                 p->name, fgi_type_name(bt));
            values[i].scalar.i = bd->value.i;
        } else {
            if (bt == FGI_T_INT) values[i].scalar.f = (float)bd->value.i;
            else if (bt == FGI_T_FLOAT) values[i].scalar.f = bd->value.f;
            else return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is a float, bound with a %s",
                                  p->name, fgi_type_name(bt));
        }
    }
    for (int i = 0; i < mod->nparams; i++)
        if (mod->params[i].kind == FG_PARAM_BUFFER && !bound[i])
            return fgi_error(ctx, FG_ERR_UNBOUND, "buffer parameter '%s' is not bound", mod->params[i].name);
    return FG_OK;
}

/* ---- parameter struct layout ------------------------------------------ */

void fgi_param_layout_compute(const fg_mod *mod, fgi_param_layout *layout) {
    size_t off = 0;
    for (int i = 0; i < mod->nparams && i < FGI_MAX_PARAMS; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER) {
            off = (off + 7) & ~(size_t)7;
            layout->offsets[i] = off;
            off += 16;
        } else {
            layout->offsets[i] = off;
            off += 4;
        }
    }
    off += 4; /* fg_pad */
    layout->size = (off + 7) & ~(size_t)7;
}

void fgi_param_pack(const fg_mod *mod, const fgi_param_layout *layout, const fgi_value *values,
                    void *blob) {
    unsigned char *p = blob;
    memset(p, 0, layout->size);
    for (int i = 0; i < mod->nparams && i < FGI_MAX_PARAMS; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER) {
            uint64_t ptr = (uint64_t)(uintptr_t)values[i].data;
            int64_t len = values[i].length;
            memcpy(p + layout->offsets[i], &ptr, 8);
            memcpy(p + layout->offsets[i] + 8, &len, 8);
        } else {
            memcpy(p + layout->offsets[i], &values[i].scalar, 4);
        }
    }
}
