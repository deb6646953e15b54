/*
 * internal.h -- what the modules of libflexgen share and the public header
 * does not say: the context, the error helpers, the arena, the typed AST of
 * the mod language, and one section per module with the functions it offers
 * the others. Internal names start with fgi_ (functions, types) or FGI_.
 *
 * The AST contract (read this before touching lex/parse/check/eval/emit):
 *  - The parser builds nodes with kind FGI_E_NAME for identifiers and leaves
 *    `type` at FGI_T_NONE. The checker resolves every name into ARG / PARAM /
 *    LOCAL / INDEX, sets `type` on every node, and inserts explicit CAST nodes
 *    for every implicit conversion (int -> float promotion, bool -> int in
 *    arithmetic, int/float -> bool in conditions). After checking:
 *      ADD SUB MUL DIV        operands both INT or both FLOAT, result same
 *      MOD BAND BOR BXOR SHL SHR   operands INT, result INT
 *      LT LE GT GE EQ NE      operands same type (INT, FLOAT, or BOOL for EQ/NE),
 *                             result BOOL
 *      LAND LOR NOT           operands BOOL, result BOOL
 *      NEG                    INT or FLOAT;  BITNOT  INT
 *      COND                   a BOOL, b and c of the result type
 *      CAST                   to `type` from a->type (any of BOOL INT FLOAT)
 *      CALL                   args already converted to the builtin's types
 *      INDEX                  param = a buffer param, a = INT index; type is
 *                             the element type
 *    so the evaluator and the emitter never reason about promotion.
 *  - Semantics shared by the CPU evaluator and the emitted CUDA:
 *      int arithmetic wraps (two's complement); int / and % truncate toward
 *      zero; float ops are IEEE single precision; float -> int casts truncate
 *      and saturate, NaN -> 0 (CUDA __float2int_rz); bool -> int is 0/1.
 *      The evaluator reports division/modulo by zero, INT_MIN / -1,
 *      INT_MIN % -1, shifts by < 0 or >= 32, and buffer indices outside
 *      [0, length) as FG_ERR_EVAL at the node's offset. The GPU code cannot
 *      report: there x / 0 = 0, x % 0 = 0, INT_MIN / -1 = INT_MIN,
 *      INT_MIN % -1 = 0, shift counts are masked with & 31, and an
 *      out-of-range buffer read gives 0.
 *      && || ?: short-circuit: the unevaluated side is never evaluated (the
 *      evaluator masks lanes), so `i < n && buf[i]` is safe.
 */
#ifndef FLEXGEN_INTERNAL_H
#define FLEXGEN_INTERNAL_H

#include "flexgen.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------------------- */
/* Arena (base/base.c): bump allocation, freed all at once.                  */
/* ------------------------------------------------------------------------- */

typedef struct fgi_arena_chunk fgi_arena_chunk;
typedef struct fgi_arena {
    fgi_arena_chunk *head;
} fgi_arena;

void fgi_arena_init(fgi_arena *a);
void fgi_arena_free(fgi_arena *a);
/* Zeroed, 16-byte aligned; NULL only when out of memory. */
void *fgi_arena_alloc(fgi_arena *a, size_t size);
char *fgi_arena_strndup(fgi_arena *a, const char *s, size_t n);
char *fgi_arena_strdup(fgi_arena *a, const char *s);

/* ------------------------------------------------------------------------- */
/* Growable string (base/base.c)                                             */
/* ------------------------------------------------------------------------- */

typedef struct fgi_buf {
    char *data; /* NUL-terminated; NULL until the first append */
    size_t len, cap;
    bool oom;   /* set when an append failed; later appends do nothing */
} fgi_buf;

void fgi_buf_append(fgi_buf *b, const char *s, size_t n);
void fgi_buf_puts(fgi_buf *b, const char *s);
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void fgi_buf_printf(fgi_buf *b, const char *fmt, ...);
void fgi_buf_free(fgi_buf *b);
/* Hand the string to the caller (malloc'd, "" when empty); NULL on OOM. */
char *fgi_buf_take(fgi_buf *b);

/* ------------------------------------------------------------------------- */
/* Context (api/ctx.c) and errors (base/base.c)                              */
/* ------------------------------------------------------------------------- */

struct fgi_cuda_state; /* cuda.c */

struct fg_ctx {
    /* last error */
    fg_status status;
    char message[1024];
    int64_t offset;           /* -1 when the error has no position         */
    char *err_source;         /* copy of the source the offset points into */
    size_t err_source_len;
    char *err_filename;       /* for diagnostics                           */
    char *diagnostic;         /* rendered on demand                        */
    char *compile_log;        /* last NVRTC log                            */
    /* options */
    int device;
    char arch[32];            /* "" = current device's                     */
    char *cache_dir;          /* NULL = default                            */
    int disk_cache;           /* 0/1                                       */
    int hopper_kernel;        /* 0/1: FG_OPT_HOPPER_KERNEL                 */
    int decode_kernel;        /* 0/1/2: FG_OPT_DECODE_KERNEL               */
    int approx_math;          /* 0/1: FG_OPT_APPROX_MATH                   */
    int cp_streams;           /* 1/2: FG_OPT_CP_STREAMS                    */
    int decode_splits;        /* 0 (chosen per call) or 1..128: FG_OPT_DECODE_SPLITS */
    int decode_head_pairs;    /* -1 (chosen per call), 0 or 1: FG_OPT_DECODE_HEAD_PAIRS */
    int bwd_lead_tiles;       /* -1 (chosen per call) or 0..65535: FG_OPT_BWD_LEAD_TILES */
    int bwd_head_pairs;       /* -1 (chosen per call), 0 or 1: FG_OPT_BWD_HEAD_PAIRS      */
    int bwd_tail_split;       /* 0 or 1: FG_OPT_BWD_TAIL_SPLIT                         */
    int decode_l2_prefetch;   /* -1 (chosen per device), 0 or 1: FG_OPT_DECODE_L2_PREFETCH */
    int64_t cache_max_bytes;
    int max_source, max_depth, max_locals;
    /* lazily initialised CUDA state (driver/cuda.c) */
    struct fgi_cuda_state *cuda;
};

/* Record an error and return its status. `offset` < 0: no position. The
 * source/filename (may be NULL) are copied for fg_error_diagnostic. */
#if defined(__GNUC__)
__attribute__((format(printf, 6, 7)))
#endif
fg_status fgi_error_at(fg_ctx *ctx, fg_status st, const char *filename, const char *source,
                       int64_t offset, const char *fmt, ...);
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
fg_status fgi_error(fg_ctx *ctx, fg_status st, const char *fmt, ...);
void fgi_clear_error(fg_ctx *ctx);
void fgi_set_compile_log(fg_ctx *ctx, const char *log);

/* Early-return helpers. */
#define FGI_CHECK_ARG(ctx, cond, ...)                                      \
    do {                                                                   \
        if (!(cond)) return fgi_error((ctx), FG_ERR_INVALID_ARGUMENT, __VA_ARGS__); \
    } while (0)
#define FGI_TRY(expr)                          \
    do {                                       \
        fg_status fgi_st_ = (expr);            \
        if (fgi_st_ != FG_OK) return fgi_st_;  \
    } while (0)

/* 64-bit FNV-1a, chainable (start with FGI_FNV_SEED). */
#define FGI_FNV_SEED 0xcbf29ce484222325ull
uint64_t fgi_fnv1a(uint64_t h, const void *data, size_t n);

/* Milliseconds from a monotonic clock. */
double fgi_now_ms(void);

/* 16-bit floats (half.c): widening is exact, narrowing rounds to nearest
 * even (fp16 with subnormals, inf past 65504); NaN stays NaN, sign kept. */
float fgi_bf16_to_float(uint16_t h);
uint16_t fgi_float_to_bf16(float f);
float fgi_fp16_to_float(uint16_t h);
uint16_t fgi_float_to_fp16(float f);

/* ------------------------------------------------------------------------- */
/* The AST of the mod language                                               */
/* ------------------------------------------------------------------------- */

typedef enum fgi_type { FGI_T_NONE = 0, FGI_T_BOOL = 1, FGI_T_INT = 2, FGI_T_FLOAT = 3 } fgi_type;

typedef enum fgi_expr_kind {
    FGI_E_INT_LIT = 1, /* lit.i                                              */
    FGI_E_FLOAT_LIT,   /* lit.f (INFINITY included)                          */
    FGI_E_BOOL_LIT,    /* lit.b (true / false)                               */
    FGI_E_NAME,        /* parser only: identifier `name`                     */
    FGI_E_ARG,         /* op = fgi_arg                                       */
    FGI_E_PARAM,       /* scalar parameter: index into mod->params           */
    FGI_E_LOCAL,       /* local: index into the function's locals            */
    FGI_E_INDEX,       /* buffer[a]: index = buffer param; parser: a = base
                          (a NAME node), b = index; checker: a = index,
                          b = NULL                                           */
    FGI_E_UNARY,       /* op = fgi_op, a                                     */
    FGI_E_BINARY,      /* op = fgi_op, a, b                                  */
    FGI_E_COND,        /* a ? b : c                                          */
    FGI_E_CAST,        /* (type) a; implicit conversions too after check    */
    FGI_E_CALL         /* op = fgi_builtin (parser: name), args[nargs]       */
} fgi_expr_kind;

typedef enum fgi_arg { FGI_ARG_B = 0, FGI_ARG_H, FGI_ARG_Q_IDX, FGI_ARG_KV_IDX, FGI_ARG_SCORE } fgi_arg;

typedef enum fgi_op {
    FGI_OP_NONE = 0,
    /* unary */
    FGI_OP_NEG, FGI_OP_PLUS, FGI_OP_NOT, FGI_OP_BITNOT,
    /* binary */
    FGI_OP_ADD, FGI_OP_SUB, FGI_OP_MUL, FGI_OP_DIV, FGI_OP_MOD,
    FGI_OP_SHL, FGI_OP_SHR, FGI_OP_BAND, FGI_OP_BOR, FGI_OP_BXOR,
    FGI_OP_LT, FGI_OP_LE, FGI_OP_GT, FGI_OP_GE, FGI_OP_EQ, FGI_OP_NE,
    FGI_OP_LAND, FGI_OP_LOR
} fgi_op;

/* The builtins, in the order of src/mod/builtins.def. */
typedef enum fgi_builtin {
#define FGI_BUILTIN(ID, ...) FGI_FN_##ID,
#include "mod/builtins.def"
    FGI_FN_COUNT
} fgi_builtin;

/* What builtins.def says of one builtin (fgi_builtin_get). */
typedef struct fgi_builtin_info {
    const char *name;       /* canonical spelling                              */
    int arity;
    bool generic;           /* an int version exists                           */
    const char *cuda_int;   /* CUDA function of the int version, or NULL       */
    const char *cuda_float; /* CUDA function of the float version              */
    const char *cuda_approx;/* the float version under approximate math
                               (FG_OPT_APPROX_MATH), or NULL: cuda_float      */
    bool costly;            /* a transcendental or a division: real work       */
    const char *deriv[3];   /* d/dx, d/dy, d/dz as mod-language expressions of
                               x, y, z ("" past the arity)                      */
} fgi_builtin_info;
/* NULL for a value that is no builtin. */
const fgi_builtin_info *fgi_builtin_get(int fn);

typedef struct fgi_expr fgi_expr;
struct fgi_expr {
    fgi_expr_kind kind;
    fgi_type type;       /* FGI_T_NONE until checked                         */
    int op;              /* fgi_op / fgi_arg / fgi_builtin                   */
    int index;           /* PARAM / LOCAL / INDEX                            */
    int offset, length;  /* the token that names this node (the operator for
                            unary/binary, the name for calls and indices,
                            the '(' of a cast); offsets into the func's src  */
    const char *name;    /* NAME and CALL (as written)                       */
    union {
        int32_t i;
        float f;
        bool b;
    } lit;
    fgi_expr *a, *b, *c;
    fgi_expr **args;
    int nargs;
};

typedef struct fgi_local {
    const char *name;
    fgi_type type;
    bool is_const;
    fgi_expr *init;
    int offset, length;  /* the name token */
} fgi_local;

typedef enum fgi_func_kind { FGI_FUNC_MASK = 1, FGI_FUNC_SCORE = 2 } fgi_func_kind;

/* One mask_mod or score_mod body. `src` / `filename` are the text the
 * offsets point into (owned by the mod's arena) so that composed mods keep
 * each part's own positions for diagnostics and #line. */
typedef struct fgi_func {
    fgi_func_kind kind;
    const char *arg_names[5];   /* as the user named them, in fgi_arg order  */
    fgi_local *locals;
    int nlocals;
    fgi_expr *ret;
    int offset;                 /* the function name                         */
    int ret_offset;             /* the `return` keyword                      */
    const char *src;
    size_t src_len;
    const char *filename;
} fgi_func;

typedef enum fgi_mask_op { FGI_MASK_LEAF = 1, FGI_MASK_AND, FGI_MASK_OR } fgi_mask_op;
typedef struct fgi_mask_node fgi_mask_node;
struct fgi_mask_node {
    fgi_mask_op op;
    fgi_func *func;            /* LEAF */
    fgi_mask_node *a, *b;      /* AND / OR */
};

typedef struct fgi_param {
    const char *name;
    fg_param_kind kind;        /* FG_PARAM_SCALAR / FG_PARAM_BUFFER           */
    fgi_type type;             /* FGI_T_INT / FGI_T_FLOAT (buffer: element)  */
    union {
        int32_t i;
        float f;
    } def;                     /* scalars                                    */
    int offset;                /* the name token, -1 when declared by API    */
    bool divisor;              /* a scalar some `/` or `%` of its own type
                                  divides by: the kernels get it prepared
                                  on the host too, an int's magic numbers,
                                  a float's reciprocal
                                  (fgi_mod_mark_divisors)                   */
} fgi_param;

/* Whether the kernels get p's reciprocal (a float divisor, fg_rcp_NAME,
 * for fg_fdiv_by) rather than an int divisor's magic numbers (fg_div_NAME). */
static inline bool fgi_param_has_rcp(const fgi_param *p) { return p->divisor && p->type == FGI_T_FLOAT; }

struct fg_mod {
    fgi_arena arena;
    const char *name;          /* readable name                              */
    const char *filename;      /* the main file (diagnostics)                */
    fgi_param *params;
    int nparams;
    fgi_mask_node *mask;       /* NULL: no mask_mod                          */
    fgi_func *score;           /* NULL: no score_mod                         */
    const char *canonical;     /* set by fgi_mod_finish                      */
    uint64_t hash;
    /* fgi_mask_is_local's answer (blockmask/blockmask.h), judged on first use (a mod is otherwise
     * immutable once made; threads that judge it at once store the same
     * answer): 0 not yet, 1 local, 2 not */
    atomic_int mask_reach;
};

/* ------------------------------------------------------------------------- */
/* Front end: mod/ (lex.c parse.c check.c print.c mod.c ast.c builtins.c)  */
/* ------------------------------------------------------------------------- */

/* Parse + check `text` into a new mod (the whole fg_mod_from_source). */
fg_status fgi_mod_parse(fg_ctx *ctx, const char *filename, const char *text, size_t len,
                        fg_mod **out);
/* Canonical text of a mod, allocated in its arena, and its hash; marks the
 * divisor parameters (fgi_mod_mark_divisors); called once when a mod is
 * created. */
fg_status fgi_mod_finish(fg_ctx *ctx, fg_mod *mod);
/* Set params[i].divisor for each scalar parameter that is the right
 * operand of an int `/` or `%` or a float `/` of its type (through unary
 * plus or a same-type cast). */
void fgi_mod_mark_divisors(fg_mod *mod);
/* The parameter an int `/` or `%` or a float `/` node divides by, as
 * fgi_mod_mark_divisors sees it, or -1 (another node, or a divisor that is
 * no scalar of the node's type). */
int fgi_divisor_param(const fg_mod *mod, const fgi_expr *e);
/* The canonical text of one expression (for tests and the emitter's comments);
 * malloc'd, the caller frees it (NULL on OOM). */
char *fgi_expr_canonical(const fg_mod *mod, const fgi_func *fn, const fgi_expr *e);
/* Index of a parameter by name, or -1. */
int fgi_mod_find_param(const fg_mod *mod, const char *name);
/* Whether a score_mod returns its score unchanged (`return score;`, also
 * through locals, unary plus and float-to-float casts): the kernels then
 * treat the mod as having none (FG_HAS_SCORE_MOD 0), which saves a multiply
 * per score and takes the scale into the exponential's multiplier. */
bool fgi_score_is_identity(const fgi_func *fn);
/* Whether the kernels run `mod`'s score_mod (FG_HAS_SCORE_MOD 1): it has
 * one and it is not the identity. */
bool fgi_mod_runs_score(const fg_mod *mod);
/* Whether fn returns a constant float (literals and + - * / of them,
 * through locals), and its value. */
bool fgi_func_const_float(const fgi_func *fn, float *out);
const char *fgi_type_name(fgi_type t);
const char *fgi_builtin_name(fgi_builtin fn);
/* The arguments' names, in fgi_arg order: the canonical text and the
 * emitted CUDA both print them (ast.c). */
extern const char *const fgi_canonical_arg_names[5];

/* ------------------------------------------------------------------------- */
/* Bound parameter values (mod/bind.c)                                       */
/* ------------------------------------------------------------------------- */

typedef struct fgi_value {
    union {
        int32_t i;
        float f;
    } scalar;
    const void *data;          /* buffers: host or device pointer            */
    int64_t length;            /* buffers: elements                          */
} fgi_value;

/* Resolve bindings against mod->params (defaults for unbound scalars;
 * FG_ERR_UNBOUND for unbound buffers, unknown names, or a kind / type that
 * does not match). `values` has mod->nparams entries. */
fg_status fgi_bind(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                   fgi_value *values);

/* The by-value parameter struct the emitted CUDA declares (struct
 * fg_mod_params) and the host fills for a launch. Layout, in declaration
 * order: a scalar is 4 bytes (int32 / float, align 4); a buffer is a pointer
 * (8 bytes, align 8) followed by its length as int64 (align 8). Then a
 * trailing int32 `fg_pad` so the struct is never empty; size rounded up to 8.
 * `offsets` receives, per param, the offset of its value (buffers: of the
 * pointer; the length is at offset + 8). */
/* The kernels' fg_mod_params: each parameter at offsets[i] in declaration
 * order (a scalar 4 bytes, a buffer its pointer and length, 16 bytes
 * aligned to 8), then for each divisor parameter at div_offsets[i] its
 * fg_divisor (an int: 28 bytes, the magic numbers of fgi_divisor_of) or
 * its reciprocal (a float: 4 bytes, 1 / value rounded to nearest), then an
 * int of padding, the size rounded up to 8. */
typedef struct fgi_param_layout {
    size_t size;
    size_t offsets[256];
    size_t div_offsets[256];
} fgi_param_layout;
#define FGI_MAX_PARAMS 256
/* The largest fg_mod_params: every parameter a divisor scalar (4 + 28
 * bytes), or every one a buffer (16), plus the padding. */
#define FGI_PARAM_BLOB_MAX (FGI_MAX_PARAMS * 32 + 16)

/* Division by a run-time divisor d strength-reduced on the host, as
 * fg_divisor in templates/common.cuh: for n = |a| <= 2^31,
 * n / |d| == (n * m) >> shift (64-bit product), with m = ceil(2^(31+l) / |d|)
 * and shift = 31 + l, l = ceil(log2 |d|); the quotient then takes the sign
 * of a * d. d == 0 is stored as 1 with `zero` set (a / 0 is 0, a % 0 is 0,
 * as fg_idiv / fg_imod define them). For the test a % d == 0
 * (fg_divides_by): with |d| = o 2^rot, o odd, inv = o^-1 mod 2^32 and
 * bound = 2 floor((2^31 - 1) / |d|) (o > 1) or 2^(32-rot) - 1 (o = 1), a
 * is a multiple of d exactly when rotr(a inv + (bound >> 1) 2^rot mod
 * 2^32, rot) <= bound, for the signed a as it is (fgi_divisor_of says
 * why); d == 0, 1 and -1 (a % d is 0) have bound 2^32 - 1, so the test
 * always holds. */
typedef struct fgi_divisor {
    uint32_t m, shift;
    int32_t d, zero;
    uint32_t inv, rot, bound;
} fgi_divisor;
fgi_divisor fgi_divisor_of(int32_t d);
void fgi_param_layout_compute(const fg_mod *mod, fgi_param_layout *layout);
/* Write values into `blob` (layout.size bytes) per the layout. */
void fgi_param_pack(const fg_mod *mod, const fgi_param_layout *layout, const fgi_value *values,
                    void *blob);

/* ------------------------------------------------------------------------- */
/* Evaluator (eval.c)                                                        */
/* ------------------------------------------------------------------------- */

/* Vector-at-a-time evaluation over the tile [q0, q0+nq) x [kv0, kv0+nk):
 * lane i*nk+j is (q0+i, kv0+j). One walk of the tree per tile (internally
 * chunked when the tile is larger than the evaluator's vector). Values are
 * host values (buffers point to host memory). Errors: FG_ERR_EVAL at the
 * offending node's offset, with the lane's (q_idx, kv_idx) in the message. */
fg_status fgi_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h,
                        int q0, int nq, int kv0, int nk, uint8_t *out);
fg_status fgi_eval_score(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int b, int h,
                         int q0, int nq, int kv0, int nk, const float *in, float *out);
/* Any score-shaped function of the mod (score_mod, or a derivative of it
 * from deriv.h) over the tile, with the scores `in`; `out` receives float or
 * int32 lanes as fn returns float or int. */
fg_status fgi_eval_func(fg_ctx *ctx, const fg_mod *mod, const fgi_func *fn, const fgi_value *values,
                        int b, int h, int q0, int nq, int kv0, int nk, const float *in, void *out);

/* ------------------------------------------------------------------------- */
/* Emitters (codegen/emit.c, emit_split.c, cuda_expr.c)                     */
/* ------------------------------------------------------------------------- */

/* How the emitters spell score_mod's float math, and its derivatives'
 * (mask_mod's is always accurate: it must keep the keys a block mask built
 * on the CPU keeps). ACCURATE: what the CPU evaluator computes, one IEEE
 * rounding per operation (templates/common.cuh). APPROX: the kernels'
 * FG_APPROX_MATH: builtins.def's cuda_approx spellings and float division
 * through fg_fdiv_approx (templates/approx_math.cuh); flexgen.h lists the
 * error bounds. */
typedef enum fgi_math { FGI_MATH_ACCURATE = 0, FGI_MATH_APPROX = 1 } fgi_math;

/* Append the CUDA for a mod: `struct fg_mod_params`, `fg_mask_mod`,
 * `fg_score_mod` (identity / always-true when absent), FG_HAS_MASK_MOD and
 * FG_HAS_SCORE_MOD, with #line directives back to the mod's files. */
fg_status fgi_emit_mod(fg_ctx *ctx, const fg_mod *mod, fgi_buf *out);
/* The same for a source NVRTC will know as `generated_name` (codegen.h's
 * fgi_emit_mod_named), with score_mod's float math spelled as `math` says. */
fg_status fgi_emit_mod_math(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_math math,
                            fgi_buf *out);
/* The spellings of codegen/cuda_expr.c, the one printer both emitters use,
 * so that the split functions compute each value with exactly the same
 * operations:
 * the helper of an arithmetic operator by operand type (NULL: none), the
 * infix text of a comparison / logical / bitwise operator (NULL: none), the
 * CUDA function of a builtin by result type, a C type name, and a float
 * literal (shortest round-trip digits with an f; inf/NaN by their bits). */
const char *fgi_emit_arith_fn(int op, fgi_type t);
const char *fgi_emit_infix(int op);
const char *fgi_emit_builtin_fn(int fn, fgi_type t);
const char *fgi_emit_ctype(fgi_type t);
void fgi_emit_float(fgi_buf *out, float f);
/* Append the mods split by dependency (emit_split.c): fg_mask_head / _row /
 * _col with their _init functions and fg_mask_split, the same for score_mod,
 * and FG_HAS_SPLIT_MODS; for the attention kernel, after fgi_emit_mod. */
fg_status fgi_emit_split(fg_ctx *ctx, const fg_mod *mod, fgi_buf *out);
/* The same with score_mod's float math spelled as `math` says and the
 * rewrites `flags` asks for (FGI_SPLIT_*). */
enum {
    /* (float)(kv_idx - q_idx) as a column part less a row part: exact
     * while every index lies in [-FGI_SPLIT_INDEX_FLOAT_MAX,
     * FGI_SPLIT_INDEX_FLOAT_MAX] */
    FGI_SPLIT_INDEX_FLOATS = 1u << 0,
    /* in the score_mod's part made per diagonal (FG_SCORE_DIST), (float)(q_idx
     * - kv_idx) as the kernel's float distance fg_dist_f, made by one FADD
     * a diagonal from the tile's: exact while every distance the kernel
     * forms lies in [-FGI_SPLIT_INDEX_FLOAT_MAX, FGI_SPLIT_INDEX_FLOAT_MAX] */
    FGI_SPLIT_DIST_FLOATS = 1u << 1
};
#define FGI_SPLIT_INDEX_FLOAT_MAX (1ll << 24) /* every int up to it in magnitude is a float */
fg_status fgi_emit_split_math(fg_ctx *ctx, const fg_mod *mod, fgi_math math, unsigned flags, fgi_buf *out);
/* Whether `mod` has a cast FGI_SPLIT_INDEX_FLOATS rewrites in a form the
 * forward runs (not in a score_mod it makes by diagonals). */
bool fgi_split_casts_indices(const fg_mod *mod);
/* Whether `mod` has a cast FGI_SPLIT_DIST_FLOATS rewrites (in a score_mod
 * the forward makes by diagonals). */
bool fgi_split_casts_distance(const fg_mod *mod);
/* Whether score_mod's per-element part (what stays per score once its
 * head, row and column parts are hoisted) does costly work: a division, a
 * buffer read, a transcendental; the split source says the same as
 * FG_SCORE_ELEM_COSTLY. false for a NULL mod or one without score_mod. */
bool fgi_split_score_elem_costly(const fg_mod *mod);
/* Append the derivatives of score_mod for the backward kernels (emit.c, from
 * mod/deriv.c's trees): struct fg_mod_grads, fg_score_grad, per float buffer
 * read fg_grad_indexK / fg_grad_valueK, and fg_accumulate_grads; #line
 * directives end with the generated file `generated_name` (NULL:
 * "flexgen.cu"). */
fg_status fgi_emit_grad(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_buf *out);
/* The same with the float math spelled as `math` says. */
fg_status fgi_emit_grad_math(fg_ctx *ctx, const fg_mod *mod, const char *generated_name, fgi_math math,
                             fgi_buf *out);

/* Embedded templates (generated at build time from templates/\*.cuh). */
typedef struct fgi_template {
    const char *name;   /* file name, e.g. "attention_fwd.cuh" */
    const char *text;
} fgi_template;
const fgi_template *fgi_template_find(const char *name);
extern const fgi_template fgi_templates[];
extern const size_t fgi_template_count;

/* ------------------------------------------------------------------------- */
/* CUDA driver (driver/cuda.c): libcuda through dlopen                       */
/* ------------------------------------------------------------------------- */

/* Make sure libcuda is loaded, cuInit done, and ctx's device's primary context
 * is current on this thread. FG_ERR_NO_DEVICE when there is no libcuda, no
 * driver or no device. */
fg_status fgi_cuda_ready(fg_ctx *ctx);
/* The compute capability of ctx's device (needs fgi_cuda_ready). */
fg_status fgi_cuda_arch(fg_ctx *ctx, int *major, int *minor);
/* The number of SMs of ctx's device (needs fgi_cuda_ready). */
fg_status fgi_cuda_sm_count(fg_ctx *ctx, int *count);
/* The peak DRAM bytes ctx's device delivers per SM clock cycle (memory
 * clock x 2 x bus width, over the SMs x their clock), or 0 where there is
 * no device or it does not say. Never fails and never records an error,
 * as fgi_effective_arch. */
double fgi_cuda_dram_per_sm_clock(fg_ctx *ctx);

/* ------------------------------------------------------------------------- */
/* JIT and cache (jit/nvrtc.c, jit/cache.c)                                 */
/* ------------------------------------------------------------------------- */

/* The arch to compile for ("sm_90a"...): option, else the device's, else
 * "sm_90a". */
const char *fgi_effective_arch(fg_ctx *ctx);

#endif /* FLEXGEN_INTERNAL_H */
