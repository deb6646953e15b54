/*
 * eval.c -- the CPU evaluator: a checked mod evaluated over a whole tile of
 * (q_idx, kv_idx) pairs, vector at a time.
 *
 * A 128 x 128 tile is 16384 evaluations of the same small tree. Walking the
 * tree once per pair would spend nearly all the time on dispatch, so the
 * walk happens once per chunk of lanes instead: every node evaluates into a
 * lane array (int32, float, or one byte per bool) with a tight loop over the
 * lanes, and its parent reads those arrays. Tiles larger than a chunk are cut
 * into chunks that follow each other in row-major lane order.
 *
 * C semantics are kept lane by lane. The difficult part is short-circuit:
 * in `i < n && buf[i]` the read must not happen on lanes where i >= n. Each
 * evaluation therefore runs under a selection, the list of lanes that C
 * would actually evaluate (a NULL list means "all lanes of the chunk", the
 * common case, which the loops special-case so that they vectorise). `&&`,
 * `||`, `?:` and the and/or composition of mask mods split the selection by
 * the value of their left side and evaluate the right side only on the lanes
 * that need it. Lanes outside the selection hold unspecified values that no
 * one reads. Locals are evaluated in order on the function's selection, as C
 * evaluates them unconditionally.
 *
 * Arithmetic follows the contract at the top of internal.h: ints wrap (done
 * in uint32), / and % truncate, floats are single precision computed in float
 * with libm's float functions, float -> int saturates with NaN -> 0. Errors
 * are reported, never executed: division or modulo by zero, INT_MIN / -1,
 * INT_MIN % -1, shift counts outside [0, 32) and buffer indices outside
 * [0, length) give FG_ERR_EVAL at the operator's (or buffer name's) offset,
 * naming the first offending lane's (b, h, q_idx, kv_idx). The loops only
 * raise a flag (computing with a harmless stand-in where the operation
 * itself could trap); when the flag is set the selection is scanned again
 * for the first bad lane, in row-major order. A left shift of a negative
 * value is not an error: it shifts the two's-complement bits, as the GPU
 * does; `>>` on a negative value shifts arithmetically. The builtins match
 * templates/common.cuh: abs(INT_MIN) is INT_MIN, float min / max are
 * fminf / fmaxf (a NaN operand loses), clamp(x, lo, hi) is
 * min(max(x, lo), hi), rsqrt is 1 / sqrtf, sigmoid 1 / (1 + expf(-x)).
 *
 * Scratch memory is a stack of lane-sized slabs owned by one call: a node
 * takes a slab for its result, its children take theirs above it and are
 * popped when the node is done, so the live slabs are bounded by about twice
 * the tree depth (which the checker limits). Slabs are allocated on first
 * use and all freed before the call returns; leaves that already have an
 * array (q_idx, kv_idx, score, locals) hand it out without a copy.
 */
#include "mod/front.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lanes per chunk. Long enough that the walk's dispatch is noise next to
 * the loops, short enough that a call's scratch (coordinates, locals, slabs)
 * stays around EV_SCRATCH_BYTES: below malloc's trim threshold the memory
 * is reused from one call to the next instead of being returned to the
 * kernel and faulted in again, which cost more than the evaluation itself.
 * Mods with many locals or deep trees get shorter chunks. */
#define EV_MAX_LANES 4096
#define EV_MIN_LANES 256
#define EV_SCRATCH_BYTES ((size_t)96 << 10)

/* The lanes an evaluation covers: idx[0..n) ascending, or all of 0..n when
 * idx is NULL. uint16 indices are enough for EV_MAX_LANES. */
typedef struct sel {
    const uint16_t *idx;
    int n;
} sel;

#define FOR_LANES(s, i, ...)                                          \
    do {                                                              \
        if (!(s).idx) {                                               \
            for (int i = 0; i < (s).n; i++) { __VA_ARGS__ }           \
        } else {                                                      \
            for (int k_ = 0; k_ < (s).n; k_++) {                      \
                int i = (s).idx[k_];                                  \
                __VA_ARGS__                                           \
            }                                                         \
        }                                                             \
    } while (0)

typedef struct ev {
    fg_ctx *ctx;
    const fg_mod *mod;
    const fgi_value *vals;
    int b, h;
    int cap;              /* lanes per slab                              */
    int n;                /* lanes in the current chunk                  */
    int32_t *q, *kv;      /* per-lane coordinates of the chunk           */
    const float *score;   /* score_mod input of the chunk (NULL: mask)   */
    const fgi_func *fn;   /* the function being evaluated (diagnostics)  */
    void **slabs;         /* scratch stack                               */
    int nslabs, top, slabs_cap;
    void **locals;        /* one lane array per local of the function    */
    int nlocals;
    fg_status status;     /* the error that stopped the walk             */
} ev;

/* ---- scratch ---------------------------------------------------------- */

static void *ev_oom(ev *E) {
    E->status = FG_ERR_OUT_OF_MEMORY;
    fgi_error(E->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory in the evaluator");
    return NULL;
}

static void *push(ev *E) {
    if (E->top == E->nslabs) {
        if (E->nslabs == E->slabs_cap) {
            int nc = E->slabs_cap ? 2 * E->slabs_cap : 16;
            void **ns = realloc(E->slabs, (size_t)nc * sizeof *ns);
            if (!ns) return ev_oom(E);
            E->slabs = ns;
            E->slabs_cap = nc;
        }
        void *s = malloc((size_t)E->cap * 4);
        if (!s) return ev_oom(E);
        E->slabs[E->nslabs++] = s;
    }
    return E->slabs[E->top++];
}

static void ev_free(ev *E) {
    for (int i = 0; i < E->nslabs; i++) free(E->slabs[i]);
    free(E->slabs);
    if (E->locals)
        for (int i = 0; i < E->nlocals; i++) free(E->locals[i]);
    free(E->locals);
    free(E->q);
    free(E->kv);
}

/* The sub-selection of `s` where the bool lanes `c` equal `want`. When that
 * is all of `s`, `s` itself (so a dense selection stays dense). */
static bool split(ev *E, sel s, const uint8_t *c, bool want, sel *out) {
    /* Counting first is cheap (it vectorises) and spares building the list
     * when every lane or none goes the same way, as in most tiles. */
    int m = 0;
    uint8_t w = want;
    FOR_LANES(s, i, { m += c[i] == w; });
    if (m == s.n) {
        *out = s;
        return true;
    }
    if (m == 0) {
        *out = (sel){NULL, 0};
        return true;
    }
    uint16_t *idx = push(E);
    if (!idx) return false;
    m = 0;
    FOR_LANES(s, i, {
        idx[m] = (uint16_t)i;
        m += c[i] == w;
    });
    *out = (sel){idx, m};
    return true;
}

static size_t type_size(fgi_type t) { return t == FGI_T_BOOL ? 1 : 4; }

static void copy_lanes(void *dst, const void *src, sel s, fgi_type t) {
    if (dst == src) return;
    if (!s.idx) {
        memcpy(dst, src, (size_t)s.n * type_size(t));
    } else if (t == FGI_T_BOOL) {
        FOR_LANES(s, i, { ((uint8_t *)dst)[i] = ((const uint8_t *)src)[i]; });
    } else {
        FOR_LANES(s, i, { ((int32_t *)dst)[i] = ((const int32_t *)src)[i]; });
    }
}

/* ---- errors ----------------------------------------------------------- */

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static void *lane_error(ev *E, const fgi_expr *e, int lane, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const fgi_func *fn = E->fn;
    E->status = FG_ERR_EVAL;
    fgi_error_at(E->ctx, FG_ERR_EVAL, fn ? fn->filename : NULL, fn ? fn->src : NULL, e->offset,
                 "%s at (b=%d, h=%d, q_idx=%d, kv_idx=%d)", what, E->b, E->h, E->q[lane],
                 E->kv[lane]);
    return NULL;
}

static void *internal_error(ev *E, const fgi_expr *e, const char *what) {
    const fgi_func *fn = E->fn;
    E->status = FG_ERR_EVAL;
    fgi_error_at(E->ctx, FG_ERR_EVAL, fn ? fn->filename : NULL, fn ? fn->src : NULL, e->offset,
                 "internal error: the evaluator met %s (kind %d, op %d, type %d)", what,
                 (int)e->kind, e->op, (int)e->type);
    return NULL;
}

/* ---- leaves ----------------------------------------------------------- */

static const void *eval(ev *E, const fgi_expr *e, sel s);

static const void *fill_int(ev *E, sel s, int32_t v) {
    int32_t *r = push(E);
    if (r) FOR_LANES(s, i, { r[i] = v; });
    return r;
}

static const void *fill_float(ev *E, sel s, float v) {
    float *r = push(E);
    if (r) FOR_LANES(s, i, { r[i] = v; });
    return r;
}

static const void *fill_bool(ev *E, sel s, bool v) {
    uint8_t *r = push(E);
    if (r) FOR_LANES(s, i, { r[i] = v; });
    return r;
}

static const void *eval_arg(ev *E, const fgi_expr *e, sel s) {
    switch (e->op) {
    case FGI_ARG_B: return fill_int(E, s, E->b);
    case FGI_ARG_H: return fill_int(E, s, E->h);
    case FGI_ARG_Q_IDX: return E->q;
    case FGI_ARG_KV_IDX: return E->kv;
    case FGI_ARG_SCORE:
        if (E->score) return E->score;
        return internal_error(E, e, "`score` outside a score_mod");
    default: return internal_error(E, e, "an unknown argument");
    }
}

static const void *eval_param(ev *E, const fgi_expr *e, sel s) {
    if (e->index < 0 || e->index >= E->mod->nparams) return internal_error(E, e, "a bad parameter");
    const fgi_value *v = &E->vals[e->index];
    if (e->type == FGI_T_FLOAT) return fill_float(E, s, v->scalar.f);
    return fill_int(E, s, v->scalar.i);
}

/* buf[i]: a gather, with the index clamped while the loop runs and the
 * first out-of-range lane reported afterwards. */
static const void *eval_index(ev *E, const fgi_expr *e, sel s) {
    if (e->index < 0 || e->index >= E->mod->nparams) return internal_error(E, e, "a bad buffer");
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const int32_t *ix = eval(E, e->a, s);
    if (!ix) return NULL;
    const fgi_value *v = &E->vals[e->index];
    int64_t len = v->length;
    int bad = 0;
#define GATHER(T)                                           \
    do {                                                    \
        const T *data = v->data;                            \
        T *rt = (T *)r;                                     \
        FOR_LANES(s, i, {                                   \
            int32_t k = ix[i];                              \
            int out = (k < 0) | ((int64_t)k >= len);        \
            bad |= out;                                     \
            rt[i] = data[out ? 0 : k];                      \
        });                                                 \
    } while (0)
    if (len <= 0 || !v->data) bad = s.n > 0;
    else if (e->type == FGI_T_FLOAT) GATHER(float);
    else GATHER(int32_t);
#undef GATHER
    if (bad) {
        FOR_LANES(s, i, {
            if (ix[i] < 0 || (int64_t)ix[i] >= len)
                return lane_error(E, e, i, "index %d out of bounds of buffer '%s' (length %lld)",
                                  ix[i], E->mod->params[e->index].name, (long long)len);
        });
    }
    E->top = mark;
    return r;
}

/* ---- unary operators and casts ---------------------------------------- */

static const void *eval_unary(ev *E, const fgi_expr *e, sel s) {
    if (e->op == FGI_OP_PLUS) return eval(E, e->a, s);
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const void *a = eval(E, e->a, s);
    if (!a) return NULL;
    const int32_t *ai = a;
    const float *af = a;
    const uint8_t *ab = a;
    int32_t *ri = r;
    float *rf = r;
    uint8_t *rb = r;
    switch (e->op) {
    case FGI_OP_NEG:
        if (e->type == FGI_T_FLOAT) FOR_LANES(s, i, { rf[i] = -af[i]; });
        else FOR_LANES(s, i, { ri[i] = (int32_t)(0u - (uint32_t)ai[i]); });
        break;
    case FGI_OP_NOT: FOR_LANES(s, i, { rb[i] = !ab[i]; }); break;
    case FGI_OP_BITNOT: FOR_LANES(s, i, { ri[i] = ~ai[i]; }); break;
    default: return internal_error(E, e, "an unknown unary operator");
    }
    E->top = mark;
    return r;
}

/* float -> int as CUDA's __float2int_rz: truncate, saturate, NaN -> 0. */
static inline int32_t f2i(float f) {
    if (f != f) return 0;
    if (f >= 2147483648.0f) return INT32_MAX;
    if (f <= -2147483648.0f) return INT32_MIN;
    return (int32_t)f;
}

static const void *eval_cast(ev *E, const fgi_expr *e, sel s) {
    fgi_type to = e->type, from = e->a->type;
    if (to == from) return eval(E, e->a, s);
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const void *a = eval(E, e->a, s);
    if (!a) return NULL;
    const int32_t *ai = a;
    const float *af = a;
    const uint8_t *ab = a;
    int32_t *ri = r;
    float *rf = r;
    uint8_t *rb = r;
    if (to == FGI_T_INT && from == FGI_T_FLOAT) FOR_LANES(s, i, { ri[i] = f2i(af[i]); });
    else if (to == FGI_T_INT && from == FGI_T_BOOL) FOR_LANES(s, i, { ri[i] = ab[i]; });
    else if (to == FGI_T_FLOAT && from == FGI_T_INT) FOR_LANES(s, i, { rf[i] = (float)ai[i]; });
    else if (to == FGI_T_FLOAT && from == FGI_T_BOOL) FOR_LANES(s, i, { rf[i] = ab[i]; });
    else if (to == FGI_T_BOOL && from == FGI_T_INT) FOR_LANES(s, i, { rb[i] = ai[i] != 0; });
    else if (to == FGI_T_BOOL && from == FGI_T_FLOAT) FOR_LANES(s, i, { rb[i] = af[i] != 0.0f; });
    else return internal_error(E, e, "a cast between unknown types");
    E->top = mark;
    return r;
}

/* ---- binary operators ------------------------------------------------- */

static const void *int_div_error(ev *E, const fgi_expr *e, sel s, const int32_t *x,
                                 const int32_t *y) {
    const char *op = e->op == FGI_OP_DIV ? "/" : "%";
    FOR_LANES(s, i, {
        if (y[i] == 0)
            return lane_error(E, e, i, "%s by zero (%d %s 0)",
                              e->op == FGI_OP_DIV ? "division" : "modulo", x[i], op);
        if (x[i] == INT32_MIN && y[i] == -1)
            return lane_error(E, e, i, "integer overflow in INT_MIN %s -1", op);
    });
    return internal_error(E, e, "a division error on no lane");
}

static const void *shift_error(ev *E, const fgi_expr *e, sel s, const int32_t *y) {
    FOR_LANES(s, i, {
        if ((uint32_t)y[i] >= 32)
            return lane_error(E, e, i, "shift count %d out of range [0, 32) in '%s'", y[i],
                              e->op == FGI_OP_SHL ? "<<" : ">>");
    });
    return internal_error(E, e, "a shift error on no lane");
}

/* x / d for a divisor d > 0 shared by every lane and dividends x >= 0,
 * the usual case (q_idx / W): a multiply by m = ceil(2^(31+l) / d), with
 * 2^l >= d, and a shift (Granlund and Montgomery 1994). For 31-bit x the
 * error m d - 2^(31+l) < d <= 2^l keeps the quotient exact, m fits in 32
 * bits, and the product in 63. Returns false when the lanes do not qualify. */
static bool magic_divide(sel s, const int32_t *x, const int32_t *y, bool mod, int32_t *r) {
    if (s.n == 0) return true;
    int32_t d = y[s.idx ? s.idx[0] : 0];
    if (d <= 0) return false;
    int ok = 1;
    FOR_LANES(s, i, { ok &= (y[i] == d) & (x[i] >= 0); });
    if (!ok) return false;
    int l = 0;
    while (((uint32_t)1 << l) < (uint32_t)d) l++;
    uint64_t m = ((((uint64_t)1) << (31 + l)) + (uint64_t)d - 1) / (uint64_t)d;
    int sh = 31 + l;
    if (mod)
        FOR_LANES(s, i, {
            uint32_t q = (uint32_t)(((uint64_t)(uint32_t)x[i] * m) >> sh);
            r[i] = (int32_t)((uint32_t)x[i] - q * (uint32_t)d);
        });
    else
        FOR_LANES(s, i, { r[i] = (int32_t)(((uint64_t)(uint32_t)x[i] * m) >> sh); });
    return true;
}

/* Arithmetic and bitwise operators on int lanes; false after an error. */
static bool int_arith(ev *E, const fgi_expr *e, sel s, const int32_t *x, const int32_t *y,
                      int32_t *r) {
    int bad = 0;
    switch (e->op) {
    case FGI_OP_ADD: FOR_LANES(s, i, { r[i] = (int32_t)((uint32_t)x[i] + (uint32_t)y[i]); }); break;
    case FGI_OP_SUB: FOR_LANES(s, i, { r[i] = (int32_t)((uint32_t)x[i] - (uint32_t)y[i]); }); break;
    case FGI_OP_MUL: FOR_LANES(s, i, { r[i] = (int32_t)((uint32_t)x[i] * (uint32_t)y[i]); }); break;
    case FGI_OP_DIV:
    case FGI_OP_MOD:
        /* Check first, then divide in double: for int32 operands the
         * truncated double quotient is exact (the rounding error,
         * < 2^-22 / |d|, never reaches the next integer, 1 / |d| away),
         * and the loop vectorises where idiv would not. */
        FOR_LANES(s, i, { bad |= (y[i] == 0) | ((x[i] == INT32_MIN) & (y[i] == -1)); });
        if (bad || magic_divide(s, x, y, e->op == FGI_OP_MOD, r)) break;
        if (e->op == FGI_OP_DIV)
            FOR_LANES(s, i, { r[i] = (int32_t)((double)x[i] / (double)y[i]); });
        else
            FOR_LANES(s, i, {
                int32_t q = (int32_t)((double)x[i] / (double)y[i]);
                r[i] = (int32_t)((uint32_t)x[i] - (uint32_t)q * (uint32_t)y[i]);
            });
        break;
    case FGI_OP_SHL:
        FOR_LANES(s, i, {
            bad |= (uint32_t)y[i] >= 32;
            r[i] = (int32_t)((uint32_t)x[i] << (y[i] & 31));
        });
        break;
    case FGI_OP_SHR:
        FOR_LANES(s, i, {
            bad |= (uint32_t)y[i] >= 32;
            int32_t a = x[i];
            int c = y[i] & 31;
            r[i] = a < 0 ? ~(~a >> c) : a >> c;
        });
        break;
    case FGI_OP_BAND: FOR_LANES(s, i, { r[i] = x[i] & y[i]; }); break;
    case FGI_OP_BOR: FOR_LANES(s, i, { r[i] = x[i] | y[i]; }); break;
    case FGI_OP_BXOR: FOR_LANES(s, i, { r[i] = x[i] ^ y[i]; }); break;
    default: internal_error(E, e, "an unknown int operator"); return false;
    }
    if (!bad) return true;
    if (e->op == FGI_OP_SHL || e->op == FGI_OP_SHR) shift_error(E, e, s, y);
    else int_div_error(E, e, s, x, y);
    return false;
}

static bool float_arith(ev *E, const fgi_expr *e, sel s, const float *x, const float *y, float *r) {
    switch (e->op) {
    case FGI_OP_ADD: FOR_LANES(s, i, { r[i] = x[i] + y[i]; }); return true;
    case FGI_OP_SUB: FOR_LANES(s, i, { r[i] = x[i] - y[i]; }); return true;
    case FGI_OP_MUL: FOR_LANES(s, i, { r[i] = x[i] * y[i]; }); return true;
    case FGI_OP_DIV: FOR_LANES(s, i, { r[i] = x[i] / y[i]; }); return true;
    default: internal_error(E, e, "an unknown float operator"); return false;
    }
}

#define COMPARE(T, x, y, r)                                                    \
    switch (e->op) {                                                           \
    case FGI_OP_LT: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] < ((const T *)y)[i]; }); break;  \
    case FGI_OP_LE: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] <= ((const T *)y)[i]; }); break; \
    case FGI_OP_GT: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] > ((const T *)y)[i]; }); break;  \
    case FGI_OP_GE: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] >= ((const T *)y)[i]; }); break; \
    case FGI_OP_EQ: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] == ((const T *)y)[i]; }); break; \
    case FGI_OP_NE: FOR_LANES(s, i, { r[i] = ((const T *)x)[i] != ((const T *)y)[i]; }); break; \
    default: internal_error(E, e, "an unknown comparison"); return false;    \
    }

static bool compare(ev *E, const fgi_expr *e, sel s, const void *x, const void *y, uint8_t *r) {
    switch (e->a->type) {
    case FGI_T_INT: COMPARE(int32_t, x, y, r); return true;
    case FGI_T_FLOAT: COMPARE(float, x, y, r); return true;
    case FGI_T_BOOL: COMPARE(uint8_t, x, y, r); return true;
    default: internal_error(E, e, "a comparison of untyped operands"); return false;
    }
}

/* a && b, a || b: b only on the lanes where a does not decide. */
static const void *eval_logic(ev *E, const fgi_expr *e, sel s) {
    uint8_t *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const uint8_t *a = eval(E, e->a, s);
    if (!a) return NULL;
    copy_lanes(r, a, s, FGI_T_BOOL);
    sel rest;
    if (!split(E, s, a, e->op == FGI_OP_LAND, &rest)) return NULL;
    if (rest.n > 0) {
        const uint8_t *b = eval(E, e->b, rest);
        if (!b) return NULL;
        copy_lanes(r, b, rest, FGI_T_BOOL);
    }
    E->top = mark;
    return r;
}

static const void *eval_binary(ev *E, const fgi_expr *e, sel s) {
    if (e->op == FGI_OP_LAND || e->op == FGI_OP_LOR) return eval_logic(E, e, s);
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const void *x = eval(E, e->a, s);
    if (!x) return NULL;
    const void *y = eval(E, e->b, s);
    if (!y) return NULL;
    bool ok;
    if (e->op >= FGI_OP_LT && e->op <= FGI_OP_NE) ok = compare(E, e, s, x, y, r);
    else if (e->type == FGI_T_FLOAT) ok = float_arith(E, e, s, x, y, r);
    else if (e->type == FGI_T_INT) ok = int_arith(E, e, s, x, y, r);
    else ok = internal_error(E, e, "arithmetic on a non-number") != NULL;
    if (!ok) return NULL;
    E->top = mark;
    return r;
}

/* c ? a : b: each side only on its own lanes. */
static const void *eval_cond(ev *E, const fgi_expr *e, sel s) {
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const uint8_t *c = eval(E, e->a, s);
    if (!c) return NULL;
    sel yes, no;
    if (!split(E, s, c, true, &yes) || !split(E, s, c, false, &no)) return NULL;
    if (yes.n > 0) {
        const void *v = eval(E, e->b, yes);
        if (!v) return NULL;
        copy_lanes(r, v, yes, e->type);
    }
    if (no.n > 0) {
        const void *v = eval(E, e->c, no);
        if (!v) return NULL;
        copy_lanes(r, v, no, e->type);
    }
    E->top = mark;
    return r;
}

/* ---- builtins --------------------------------------------------------- */

/* The int abs of the mod language: |INT_MIN| wraps to INT_MIN. */
static inline int32_t fgi_iabs(int32_t x) { return x < 0 ? (int32_t)(0u - (uint32_t)x) : x; }

/* Every builtin's float and int version, from the c_float / c_int columns of
 * builtins.def, applied lane by lane. */
static bool call_float(ev *E, const fgi_expr *e, sel s, const void *const *args, float *r) {
    const float *X = args[0], *Y = e->nargs > 1 ? args[1] : NULL, *Z = e->nargs > 2 ? args[2] : NULL;
    switch ((fgi_builtin)e->op) {
#define FGI_BUILTIN(ID, NAME, ARITY, GENERIC, C_INT, C_FLOAT, ...)                  \
    case FGI_FN_##ID:                                                               \
        FOR_LANES(s, i, {                                                           \
            const float x = X[i], y = ARITY > 1 ? Y[i] : 0.0f, z = ARITY > 2 ? Z[i] : 0.0f; \
            (void)y, (void)z;                                                       \
            r[i] = C_FLOAT;                                                         \
        });                                                                         \
        return true;
#include "builtins.def"
    default: internal_error(E, e, "an unknown float builtin"); return false;
    }
}

static bool call_int(ev *E, const fgi_expr *e, sel s, const void *const *args, int32_t *r) {
    const int32_t *X = args[0], *Y = e->nargs > 1 ? args[1] : NULL,
                  *Z = e->nargs > 2 ? args[2] : NULL;
    switch ((fgi_builtin)e->op) {
#define FGI_BUILTIN(ID, NAME, ARITY, GENERIC, C_INT, ...)                           \
    case FGI_FN_##ID:                                                               \
        if (!GENERIC) break;                                                        \
        FOR_LANES(s, i, {                                                           \
            const int32_t x = X[i], y = ARITY > 1 ? Y[i] : 0, z = ARITY > 2 ? Z[i] : 0; \
            (void)x, (void)y, (void)z;                                              \
            r[i] = C_INT;                                                           \
        });                                                                         \
        return true;
#include "builtins.def"
    default: break;
    }
    internal_error(E, e, "an int overload of a float-only builtin");
    return false;
}

static const void *eval_call(ev *E, const fgi_expr *e, sel s) {
    if (e->op < 0 || e->op >= FGI_FN_COUNT || e->nargs != fgi_builtin_arity((fgi_builtin)e->op))
        return internal_error(E, e, "a builtin call of the wrong shape");
    void *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    const void *args[3] = {NULL, NULL, NULL};
    for (int k = 0; k < e->nargs; k++) {
        if (e->args[k]->type != e->type) return internal_error(E, e, "an unconverted argument");
        if (!(args[k] = eval(E, e->args[k], s))) return NULL;
    }
    bool ok;
    if (e->type == FGI_T_FLOAT) ok = call_float(E, e, s, args, r);
    else if (e->type == FGI_T_INT) ok = call_int(E, e, s, args, r);
    else ok = internal_error(E, e, "a builtin of a non-number type") != NULL;
    if (!ok) return NULL;
    E->top = mark;
    return r;
}

/* ---- the walk --------------------------------------------------------- */

static const void *eval(ev *E, const fgi_expr *e, sel s) {
    switch (e->kind) {
    case FGI_E_INT_LIT: return fill_int(E, s, e->lit.i);
    case FGI_E_FLOAT_LIT: return fill_float(E, s, e->lit.f);
    case FGI_E_BOOL_LIT: return fill_bool(E, s, e->lit.b);
    case FGI_E_ARG: return eval_arg(E, e, s);
    case FGI_E_PARAM: return eval_param(E, e, s);
    case FGI_E_LOCAL:
        if (e->index < 0 || !E->fn || e->index >= E->fn->nlocals || !E->locals[e->index])
            return internal_error(E, e, "a local read before its declaration");
        return E->locals[e->index];
    case FGI_E_INDEX: return eval_index(E, e, s);
    case FGI_E_UNARY: return eval_unary(E, e, s);
    case FGI_E_BINARY: return eval_binary(E, e, s);
    case FGI_E_COND: return eval_cond(E, e, s);
    case FGI_E_CAST: return eval_cast(E, e, s);
    case FGI_E_CALL: return eval_call(E, e, s);
    case FGI_E_NAME: return internal_error(E, e, "an unresolved name");
    }
    return internal_error(E, e, "an unknown node");
}

/* A function body: its locals in order, then the return expression. The
 * result is valid until the next function is evaluated (it may live in a
 * local's array). */
static const void *eval_func(ev *E, const fgi_func *fn, sel s) {
    E->fn = fn;
    for (int j = 0; j < fn->nlocals; j++) {
        if (!E->locals[j] && !(E->locals[j] = malloc((size_t)E->cap * 4))) return ev_oom(E);
        int mark = E->top;
        const void *v = eval(E, fn->locals[j].init, s);
        if (!v) return NULL;
        copy_lanes(E->locals[j], v, s, fn->locals[j].type);
        E->top = mark;
    }
    return eval(E, fn->ret, s);
}

/* and/or composition of mask mods, short-circuit like && and ||. */
static const uint8_t *eval_mask_node(ev *E, const fgi_mask_node *m, sel s) {
    uint8_t *r = push(E);
    if (!r) return NULL;
    int mark = E->top;
    if (m->op == FGI_MASK_LEAF) {
        const uint8_t *v = eval_func(E, m->func, s);
        if (!v) return NULL;
        copy_lanes(r, v, s, FGI_T_BOOL);
    } else {
        const uint8_t *a = eval_mask_node(E, m->a, s);
        if (!a) return NULL;
        copy_lanes(r, a, s, FGI_T_BOOL);
        sel rest;
        if (!split(E, s, a, m->op == FGI_MASK_AND, &rest)) return NULL;
        if (rest.n > 0) {
            const uint8_t *b = eval_mask_node(E, m->b, rest);
            if (!b) return NULL;
            copy_lanes(r, b, rest, FGI_T_BOOL);
        }
    }
    E->top = mark;
    return r;
}

/* ---- setup ------------------------------------------------------------ */

static int expr_depth(const fgi_expr *e) {
    if (!e) return 0;
    int d = 0;
    const fgi_expr *kids[3] = {e->a, e->b, e->c};
    for (int k = 0; k < 3; k++) {
        int x = expr_depth(kids[k]);
        if (x > d) d = x;
    }
    for (int k = 0; k < e->nargs; k++) {
        int x = expr_depth(e->args[k]);
        if (x > d) d = x;
    }
    return d + 1;
}

static int func_depth(const fgi_func *fn, int *max_locals) {
    int d = expr_depth(fn->ret);
    for (int j = 0; j < fn->nlocals; j++) {
        int x = expr_depth(fn->locals[j].init);
        if (x > d) d = x;
    }
    if (fn->nlocals > *max_locals) *max_locals = fn->nlocals;
    return d;
}

static int mask_depth(const fgi_mask_node *m, int *max_locals) {
    if (m->op == FGI_MASK_LEAF) return func_depth(m->func, max_locals) + 1;
    int a = mask_depth(m->a, max_locals), b = mask_depth(m->b, max_locals);
    return (a > b ? a : b) + 1;
}

static fg_status check_tile(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int q0,
                            int nq, int kv0, int nk) {
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    FGI_CHECK_ARG(ctx, values || mod->nparams == 0, "NULL parameter values");
    FGI_CHECK_ARG(ctx, nq >= 0 && nk >= 0, "negative tile size %d x %d", nq, nk);
    FGI_CHECK_ARG(ctx, (int64_t)q0 + nq - 1 <= INT32_MAX && (int64_t)kv0 + nk - 1 <= INT32_MAX,
                  "tile [%d, +%d) x [%d, +%d) overflows int", q0, nq, kv0, nk);
    return FG_OK;
}

static fg_status ev_init(ev *E, fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b,
                         int h, int depth, int max_locals, int64_t total) {
    memset(E, 0, sizeof *E);
    E->ctx = ctx;
    E->mod = mod;
    E->vals = values;
    E->b = b;
    E->h = h;
    /* lane arrays: q, kv, the locals, and about one slab per level */
    size_t arrays = 2 + (size_t)max_locals + (size_t)depth;
    int cap = EV_MAX_LANES;
    while (cap > EV_MIN_LANES && (size_t)cap * 4 * arrays > EV_SCRATCH_BYTES) cap /= 2;
    if (total < cap) cap = (int)total;
    E->cap = cap;
    E->q = malloc((size_t)cap * sizeof *E->q);
    E->kv = malloc((size_t)cap * sizeof *E->kv);
    E->nlocals = max_locals;
    E->locals = calloc((size_t)(max_locals > 0 ? max_locals : 1), sizeof *E->locals);
    if (!E->q || !E->kv || !E->locals) {
        ev_free(E);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory in the evaluator");
    }
    return FG_OK;
}

/* Coordinates of lanes [first, first + n) of the tile, row by row. */
static void set_chunk(ev *E, int q0, int kv0, int nk, int64_t first, int n) {
    int64_t row = first / nk;
    int col = (int)(first % nk);
    E->n = n;
    E->top = 0;
    for (int i = 0; i < n;) {
        int run = nk - col < n - i ? nk - col : n - i;
        int32_t q = (int32_t)(q0 + row);
        int32_t k = (int32_t)(kv0 + col);
        for (int j = 0; j < run; j++) {
            E->q[i + j] = q;
            E->kv[i + j] = k + j;
        }
        i += run;
        col = 0;
        row++;
    }
}

fg_status fgi_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h,
                        int q0, int nq, int kv0, int nk, uint8_t *out) {
    FGI_TRY(check_tile(ctx, mod, values, q0, nq, kv0, nk));
    FGI_CHECK_ARG(ctx, out || nq == 0 || nk == 0, "NULL output");
    int64_t total = (int64_t)nq * nk;
    if (total == 0) return FG_OK;
    if (!mod->mask) {
        memset(out, 1, (size_t)total);
        return FG_OK;
    }
    int max_locals = 0;
    int depth = mask_depth(mod->mask, &max_locals);
    ev E;
    FGI_TRY(ev_init(&E, ctx, mod, values, b, h, depth, max_locals, total));
    fg_status st = FG_OK;
    for (int64_t first = 0; first < total; first += E.cap) {
        int n = total - first < E.cap ? (int)(total - first) : E.cap;
        set_chunk(&E, q0, kv0, nk, first, n);
        const uint8_t *r = eval_mask_node(&E, mod->mask, (sel){NULL, n});
        if (!r) {
            st = E.status;
            break;
        }
        memcpy(out + first, r, (size_t)n);
    }
    ev_free(&E);
    return st;
}

fg_status fgi_eval_func(fg_ctx *ctx, const fg_mod *mod, const fgi_func *fn, const fgi_value *values,
                        int b, int h, int q0, int nq, int kv0, int nk, const float *in, void *out) {
    FGI_TRY(check_tile(ctx, mod, values, q0, nq, kv0, nk));
    FGI_CHECK_ARG(ctx, fn && fn->ret && (fn->ret->type == FGI_T_FLOAT || fn->ret->type == FGI_T_INT),
                  "a function of the mod that returns float or int");
    FGI_CHECK_ARG(ctx, (in && out) || nq == 0 || nk == 0, "NULL input scores or output");
    int64_t total = (int64_t)nq * nk;
    if (total == 0) return FG_OK;
    int max_locals = 0;
    int depth = func_depth(fn, &max_locals);
    ev E;
    FGI_TRY(ev_init(&E, ctx, mod, values, b, h, depth, max_locals, total));
    fg_status st = FG_OK;
    const size_t width = 4; /* float and int32 lanes */
    for (int64_t first = 0; first < total; first += E.cap) {
        int n = total - first < E.cap ? (int)(total - first) : E.cap;
        set_chunk(&E, q0, kv0, nk, first, n);
        E.score = in + first;
        const void *r = eval_func(&E, fn, (sel){NULL, n});
        if (!r) {
            st = E.status;
            break;
        }
        /* memmove: `in` may be `out`, and r may be `in` (return score;). */
        memmove((char *)out + (size_t)first * width, r, (size_t)n * width);
    }
    ev_free(&E);
    return st;
}

fg_status fgi_eval_score(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h,
                         int q0, int nq, int kv0, int nk, const float *in, float *out) {
    if (mod && !mod->score) {
        FGI_TRY(check_tile(ctx, mod, values, q0, nq, kv0, nk));
        FGI_CHECK_ARG(ctx, (in && out) || nq == 0 || nk == 0, "NULL input or output scores");
        if (in != out && nq > 0 && nk > 0) memmove(out, in, (size_t)nq * (size_t)nk * sizeof *out);
        return FG_OK;
    }
    return fgi_eval_func(ctx, mod, mod ? mod->score : NULL, values, b, h, q0, nq, kv0, nk, in, out);
}

/* ---- public entry points ---------------------------------------------- */

static fg_status bind_values(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds,
                             size_t nbinds, fgi_value **values) {
    *values = calloc((size_t)(mod->nparams > 0 ? mod->nparams : 1), sizeof **values);
    if (!*values) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory binding parameters");
    fg_status st = fgi_bind(ctx, mod, binds, nbinds, *values);
    if (st != FG_OK) {
        free(*values);
        *values = NULL;
    }
    return st;
}

fg_status fg_mod_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                           int b, int h, int q0, int nq, int kv0, int nk, uint8_t *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    fgi_value *values;
    FGI_TRY(bind_values(ctx, mod, binds, nbinds, &values));
    fg_status st = fgi_eval_mask(ctx, mod, values, b, h, q0, nq, kv0, nk, out);
    free(values);
    if (st == FG_OK) fgi_clear_error(ctx);
    return st;
}

fg_status fg_mod_eval_score(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                            int b, int h, int q0, int nq, int kv0, int nk, const float *in,
                            float *out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod, "NULL mod");
    fgi_value *values;
    FGI_TRY(bind_values(ctx, mod, binds, nbinds, &values));
    fg_status st = fgi_eval_score(ctx, mod, values, b, h, q0, nq, kv0, nk, in, out);
    free(values);
    if (st == FG_OK) fgi_clear_error(ctx);
    return st;
}
