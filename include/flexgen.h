/*
 * flexgen.h -- the whole public API of libflexgen.
 *
 * flexgen brings PyTorch's FlexAttention to C and CUDA programs. A user writes
 * `mask_mod` / `score_mod` as small C snippets (the "mod language", see
 * docs/mod-language.md); flexgen parses and checks them, builds block-sparse
 * masks, splices the checked code into CUDA attention templates, compiles the
 * result at run time with NVRTC, loads it through the CUDA Driver API and caches
 * the kernel under a hash of the canonical mods and the configuration.
 *
 * Conventions (one rule for every function below):
 *  - Handles are opaque. Every `*_create` / `*_from_*` has a `*_destroy` that
 *    accepts NULL.
 *  - A function that can fail returns fg_status. On failure the context keeps
 *    the status, a message and, for errors in mod text, the byte offset of the
 *    offending token (fg_errmsg, fg_error_offset, fg_error_diagnostic).
 *  - Nothing aborts or exits on bad input: a NULL pointer, a bad snippet, a
 *    wrong shape, a missing GPU or a damaged cache file gives a status.
 *  - libcuda is loaded with dlopen on first use. Everything that launches no
 *    kernel works without a driver or GPU; GPU calls there return
 *    FG_ERR_NO_DEVICE.
 *  - Strings returned through `char **` are allocated by the library and must
 *    be released with fg_free. Strings returned as `const char *` belong to the
 *    object they came from and live as long as it (or until the next call on
 *    the context, for the error accessors).
 *  - A context is not shared between threads without external locking, except
 *    for its kernel cache, which is thread-safe: several contexts (one per
 *    thread) created over one fg_cache share compiled kernels.
 *  - Argument structs that may grow (fg_kernel_config, fg_block_mask_desc,
 *    fg_attention_args) end in `size_t struct_size`, which says the layout
 *    the caller was compiled with: sizeof of the struct in the caller's
 *    header, as the FG_..._INIT initialisers and the fg_..._init functions
 *    set it. 0 stands for the layout of version 0.1 (every field before
 *    struct_size), so a 0.1 initialiser, positional or designated, keeps its
 *    meaning. New fields are only ever added after struct_size, and the
 *    library reads a struct this way:
 *      - the fields the caller's size covers are taken as given, every field
 *        past it as zero (which always means "the default");
 *      - a struct larger than the library's own (a newer header, an older
 *        library) is taken when every byte past the library's layout is
 *        zero, and refused with FG_ERR_NOT_SUPPORTED when one is not: the
 *        caller asks for something this library cannot do;
 *      - a non-zero size smaller than the 0.1 layout, or over 4096 bytes,
 *        is FG_ERR_INVALID_ARGUMENT: a struct_size nobody set, mostly.
 *    So zero the whole struct before filling it (an initialiser, `= {0}` or
 *    memset): struct_size is read even when the fields are set one by one.
 *    A struct the library fills (fg_block_mask_get_desc) gets this header's
 *    layout with struct_size set, so it can be passed back as it is.
 */
#ifndef FLEXGEN_H
#define FLEXGEN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLEXGEN_BUILDING) && defined(__GNUC__)
#define FG_API __attribute__((visibility("default")))
#else
#define FG_API
#endif

/* ------------------------------------------------------------------------- */
/* Versions                                                                  */
/* ------------------------------------------------------------------------- */

#define FLEXGEN_VERSION_MAJOR 0
#define FLEXGEN_VERSION_MINOR 1
#define FLEXGEN_VERSION_PATCH 0
#define FLEXGEN_VERSION_NUMBER \
    (FLEXGEN_VERSION_MAJOR * 10000 + FLEXGEN_VERSION_MINOR * 100 + FLEXGEN_VERSION_PATCH)
#define FLEXGEN_VERSION_STRING "0.1.0"

/* The version of the library actually linked: FLEXGEN_VERSION_NUMBER of the
 * build, so a program can compare it with the header it was compiled with. */
FG_API int fg_version_number(void);
FG_API const char *fg_version_string(void);

/* ------------------------------------------------------------------------- */
/* Status codes                                                              */
/* ------------------------------------------------------------------------- */

/* Stable: values never change meaning; new codes are appended. */
typedef enum fg_status {
    FG_OK = 0,
    FG_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, bad option value, bad flag   */
    FG_ERR_OUT_OF_MEMORY = 2,    /* host allocation failed                     */
    FG_ERR_IO = 3,               /* a file could not be read or written        */
    /* The mod language (the offset of the offending token is recorded). */
    FG_ERR_SYNTAX = 10,       /* not valid mod-language syntax                  */
    FG_ERR_UNSUPPORTED = 11,  /* valid C, but outside the mod subset (loops,
                                 assignment, pointers, strings, preprocessor) */
    FG_ERR_NAME = 12,         /* unknown, duplicate or reserved name           */
    FG_ERR_TYPE = 13,         /* type error (e.g. % on float, bool buffer)     */
    FG_ERR_SIGNATURE = 14,    /* mask_mod / score_mod with the wrong signature */
    FG_ERR_ARITY = 15,        /* a builtin called with the wrong argument count*/
    FG_ERR_LIMIT = 16,        /* snippet length, nesting depth, local count    */
    FG_ERR_EVAL = 17,         /* run-time error in the CPU evaluator: division
                                 by zero, INT_MIN / -1, shift out of range,
                                 buffer index out of bounds                    */
    FG_ERR_UNBOUND = 18,      /* a buffer parameter was not bound / a binding
                                 names no parameter / wrong binding kind       */
    /* Shapes and objects. */
    FG_ERR_SHAPE = 20,        /* inconsistent sizes, strides or block sizes    */
    FG_ERR_NOT_SUPPORTED = 21,/* a valid configuration this build cannot run
                                 (e.g. a head dim over 256, fp32 inputs)        */
    FG_ERR_NOT_FOUND = 22,    /* a named object does not exist                 */
    /* Compilation, CUDA and the cache. */
    FG_ERR_COMPILE = 30,      /* NVRTC failed; the log is on the context       */
    FG_ERR_NO_DEVICE = 31,    /* no libcuda, no driver or no CUDA device       */
    FG_ERR_CUDA = 32,         /* a CUDA driver call failed; message has the
                                 driver's own error name and string            */
    FG_ERR_CACHE = 33,        /* the disk cache could not be used (a damaged
                                 file is not an error: it is recompiled)       */
    FG_ERR_TOLERANCE = 40     /* a check found results outside tolerance       */
} fg_status;

/* A static, human-readable name for a status ("FG_ERR_SYNTAX: syntax error"). */
FG_API const char *fg_status_string(fg_status status);

/* Release memory the library returned through a `char **` or `void **`. */
FG_API void fg_free(void *p);

/* ------------------------------------------------------------------------- */
/* Context                                                                   */
/* ------------------------------------------------------------------------- */

typedef struct fg_ctx fg_ctx;

/* Create a context. Never touches the GPU: CUDA is initialised lazily by the
 * first call that needs it. Returns FG_ERR_OUT_OF_MEMORY or FG_OK. */
FG_API fg_status fg_ctx_create(fg_ctx **out);
FG_API void fg_ctx_destroy(fg_ctx *ctx);

/* The last error recorded on ctx (FG_OK after a successful call that
 * cleared it). fg_errmsg never returns NULL; fg_error_offset returns the byte
 * offset of the offending token in the mod source, or -1. */
FG_API fg_status fg_errcode(const fg_ctx *ctx);
FG_API const char *fg_errmsg(const fg_ctx *ctx);
FG_API int64_t fg_error_offset(const fg_ctx *ctx);

/* A rendered diagnostic for the last error: for errors in mod text
 *     mods/causal.c:5:22: error: unknown name 'kv_ix' (did you mean 'kv_idx'?)
 *         return q_idx >= kv_ix;
 *                         ^~~~~
 * otherwise just the message. Owned by ctx, valid until the next call on it. */
FG_API const char *fg_error_diagnostic(fg_ctx *ctx);

/* The full NVRTC log of the last failed (or, when it produced warnings, last)
 * compilation on ctx, or "" when there is none. */
FG_API const char *fg_compile_log(const fg_ctx *ctx);

/* Options, set through one function and range-checked. */
typedef enum fg_option {
    FG_OPT_DEVICE = 1,          /* int: CUDA device ordinal (default 0)        */
    FG_OPT_ARCH = 2,            /* string: NVRTC target, e.g. "sm_90a",
                                   "sm_80"; NULL or "" = the current device's
                                   (sm_90a on Hopper; "sm_90a" with no GPU)   */
    FG_OPT_CACHE_DIR = 3,       /* string: disk cache folder; NULL = default   */
    FG_OPT_DISK_CACHE = 4,      /* int: 0 off, 1 on (default 1 unless the
                                   environment has FLEXGEN_DISK_CACHE=0)       */
    FG_OPT_CACHE_MAX_BYTES = 5, /* int64: disk cache size cap, LRU eviction
                                   (default 1 GiB; FLEXGEN_CACHE_MAX_BYTES)    */
    FG_OPT_MAX_SOURCE = 6,      /* int: max mod source length in bytes (64 KiB)*/
    FG_OPT_MAX_DEPTH = 7,       /* int: max expression nesting depth (200)     */
    FG_OPT_MAX_LOCALS = 8,      /* int: max locals per function (64)           */
    FG_OPT_HOPPER_KERNEL = 9,   /* int: 1 lets fg_kernel_get, the forward and
                                   the backward pick the Hopper kernels on a
                                   compute capability 9.0 GPU where they
                                   apply, 0 keeps the portable ones (default
                                   1 unless the environment has
                                   FLEXGEN_HOPPER_KERNEL=0)                    */
    FG_OPT_DECODE_KERNEL = 10,  /* int: which forward kernel serves a call
                                   (fg_attention_forward,
                                   fg_attention_kernel_for): 1 the decode
                                   kernel for q_len up to FG_DECODE_MAX_Q,
                                   the forward kernel otherwise; 0 never
                                   the decode kernel; 2 the decode kernel
                                   wherever it applies, any q_len (default
                                   1, or FLEXGEN_DECODE_KERNEL). Ragged
                                   and paged calls follow the same rule;
                                   on the forward side they take the
                                   portable kernel                        */
    FG_OPT_APPROX_MATH = 11,    /* int: 1 makes the attention kernels of
                                   this context compute score_mod (and its
                                   derivative) with the GPU's approximate
                                   instructions, 0 with the accurate
                                   functions (default 0, or
                                   FLEXGEN_APPROX_MATH=1); see "Approximate
                                   math" below. It applies where a config's
                                   approx_math is 0: fg_attention_forward,
                                   _backward, fg_kernel_get, fg_compile ... */
    FG_OPT_CP_STREAMS = 12,     /* int: the compute streams a sharded call
                                   (fg_attention_forward_cp, _backward_cp)
                                   spreads each ring step's pairs over: 2
                                   (default) runs the pairs of a step's two
                                   q chunks side by side, so one pair's last
                                   wave of thread blocks overlaps the other's
                                   work; 1 runs them one after another on
                                   the caller's stream (FLEXGEN_CP_STREAMS=1) */
    FG_OPT_DECODE_SPLITS = 13,  /* int: how many thread blocks the decode
                                   kernel splits each KV walk over (a walk:
                                   a sequence's packed rows of one KV head):
                                   0 (default, or FLEXGEN_DECODE_SPLITS)
                                   chooses per call from the batch, the KV
                                   heads, the KV length and the SM count;
                                   N in [1, 128] asks for N, fewer where
                                   the walk has fewer than 2 N K/V tiles.
                                   FlashAttention's num_splits; the result
                                   is the same to rounding either way      */
    FG_OPT_BWD_LEAD_TILES = 14, /* int: the kv tiles of every (batch, kv
                                   head) the Hopper backward's dK/dV pass
                                   starts before all others: -1 (default,
                                   or FLEXGEN_BWD_LEAD_TILES) chooses per
                                   call from the block mask (see "The
                                   backward's tile order"); 0 keeps the
                                   grid order; N in [1, 65535] starts the
                                   first N (at most all tiles but one) first
                                   on the -lead kernel, with or without a
                                   mask. dK and dV are the same either way,
                                   dQ to the rounding of its atomics        */
    FG_OPT_BWD_HEAD_PAIRS = 15, /* int: whether the Hopper backward's dK/dV
                                   pass runs its kv heads in pairs (tile t
                                   of both, then t + 1; the -pairs kernel)
                                   where heads_kv is even and the -lead
                                   kernel is not taken: -1 (default, or
                                   FLEXGEN_BWD_HEAD_PAIRS) chooses per call
                                   from the block mask at head dim 128 for
                                   mods without a score_mod (see
                                   "The backward's tile order"); 0 never; 1
                                   always. Results as for
                                   FG_OPT_BWD_LEAD_TILES                    */
    FG_OPT_DECODE_HEAD_PAIRS = 16, /* int: whether the decode kernel at head
                                   dim 64 walks two KV heads at once (the
                                   -pairs kernel, config.head_pairs), which
                                   reads the pair's rows as one 256-byte
                                   row. It can where heads_kv is even, k's
                                   and v's head strides are the head dim
                                   (the paged [page, row, head, d] layout)
                                   and a block mask, if any, has one row
                                   for every head. -1 (default, or
                                   FLEXGEN_DECODE_HEAD_PAIRS): chosen per
                                   call, in pairs unless the call has a
                                   block mask and the mod's mask keeps only
                                   keys near the query (a sliding window:
                                   walks of a few tiles, faster one head a
                                   walk), judged once per mod from its
                                   mask at its parameters' defaults; 1
                                   wherever it can; 0 never. The result is
                                   the same to rounding either way          */
    FG_OPT_BWD_TAIL_SPLIT = 17, /* int: whether the Hopper backward's dK/dV
                                   pass splits the blocks of its last wave
                                   (a pass without a block mask whose block
                                   count is not a multiple of the SMs: its
                                   last blocks would run on alone) over the
                                   idle SMs, each piece walking a share of
                                   the block's q steps and adding its dK and
                                   dV into an fp32 accumulator in the
                                   workspace: 1 (default, or
                                   FLEXGEN_BWD_TAIL_SPLIT) where it applies,
                                   never in deterministic mode; 0 never.
                                   dK and dV to the rounding of the pieces'
                                   sums                                     */
    FG_OPT_DECODE_L2_PREFETCH = 18 /* int: whether the decode kernel's K/V
                                   copies ask the L2 to fetch the 256 bytes
                                   around each (cp.async .L2::256B): -1
                                   (default, or FLEXGEN_DECODE_L2_PREFETCH)
                                   chooses per device, yes where its DRAM
                                   delivers under 16 bytes per SM clock
                                   (an H100 SXM about 12.8) or cannot be
                                   asked, no above (an H200 about 18.8,
                                   where the prefetch made the L2 the
                                   limit); 0 never; 1
                                   always. Each choice is a compile of its
                                   own; results are the same either way     */
} fg_option;

/* The longest q_len the decode kernel serves by default (FG_OPT_DECODE_KERNEL
 * 1): up to it, a sequence's queries times its GQA group fill at most a few
 * 16-row tiles and the call is bound by reading K/V, which the decode kernel
 * does once per KV head across the whole GPU; past it, the forward kernel's
 * 128-row q tiles do more work per K/V byte. */
#define FG_DECODE_MAX_Q 16

/* Approximate math (FG_OPT_APPROX_MATH 1, or fg_kernel_config.approx_math
 * 1), opt-in for speed. By default a mod's float math is spelled with
 * CUDA's accurate functions and one IEEE rounding per operation, as the CPU
 * evaluator computes it. With approximate math score_mod -- and in the
 * backward its derivative -- computes these with the hardware's fast
 * instructions instead (inline PTX; bounds from the PTX ISA 9.1, section
 * "Floating Point Instructions"):
 *     tanh     tanh.approx.f32 (sm_75 and newer)  relative error 2^-11
 *     exp2     ex2.approx.f32                     2 ulp
 *     exp      ex2.approx.f32 of x * log2(e)      2^-22 + |x| 2^-23 relative
 *     log2     lg2.approx.f32                     2^-22 absolute for x in
 *     log      lg2.approx.f32 * ln 2              (0.5, 2), else 2^-21 relative
 *     sigmoid  1 / (1 + exp(-x)) of these         under 2^-16 relative
 *     rsqrt    rsqrt.approx.f32                   relative error 2^-22.9
 *     x / y    div.full.f32                       2 ulp over the full range
 * Everything else (+ - *, sqrt, pow, sin, cos, the int operations) is
 * computed as before, and mask_mod never changes: it decides which keys are
 * kept, and must agree with the block masks built from it on the CPU.
 * The largest bound, tanh's 2^-11, is fp16's unit roundoff and an eighth
 * of bf16's (2^-8): a score s moves by at most |s| 2^-11, its softmax
 * weight by that factor -- for |s| up to 8 less than the rounding of the
 * weights to bf16 that every kernel does before its P V product (for fp16,
 * |s| up to 1). The GPU tests hold approximate kernels to the accurate
 * ones' tolerances (tests/gpu_attention.c, gpu_attention_bwd.c: 1e-2 bf16,
 * 2e-3 fp16 relative on the output, 1e-3 (1 + |lse|) on the LSE, 2e-2 /
 * 5e-3 on the gradients). Give the forward and the backward of one call
 * the same setting: the backward recomputes the scores against the
 * forward's LSE. The kernels are compiled and cached apart from the
 * accurate ones (the key says "approx_math 1", the name ends in "-approx",
 * the source defines FG_APPROX_MATH 1). */

FG_API fg_status fg_ctx_set_int(fg_ctx *ctx, fg_option opt, int64_t value);
FG_API fg_status fg_ctx_set_string(fg_ctx *ctx, fg_option opt, const char *value);
FG_API fg_status fg_ctx_get_int(const fg_ctx *ctx, fg_option opt, int64_t *value);
/* The string value (for FG_OPT_ARCH: the effective arch; may initialise CUDA). */
FG_API fg_status fg_ctx_get_string(fg_ctx *ctx, fg_option opt, const char **value);

/* ------------------------------------------------------------------------- */
/* Mods                                                                      */
/* ------------------------------------------------------------------------- */

/* A checked mod: optionally a mask_mod, optionally a score_mod, and the
 * parameters they use. Immutable once created; may be shared between
 * contexts and threads. */
typedef struct fg_mod fg_mod;

typedef enum fg_type { FG_TYPE_BOOL = 1, FG_TYPE_INT = 2, FG_TYPE_FLOAT = 3 } fg_type;
typedef enum fg_param_kind { FG_PARAM_SCALAR = 1, FG_PARAM_BUFFER = 2 } fg_param_kind;

/* A parameter declared through the API (for the expression form). */
typedef struct fg_param_decl {
    const char *name;
    fg_param_kind kind;
    fg_type type;         /* FG_TYPE_INT or FG_TYPE_FLOAT (buffer: element) */
    double default_value; /* scalars: default (converted to the type)       */
} fg_param_decl;

/* Parse and check a mod file in the mod language. `filename` is used for
 * diagnostics and #line directives. */
FG_API fg_status fg_mod_from_file(fg_ctx *ctx, const char *path, fg_mod **out);
/* Same, from text in memory (`len` bytes, or strlen when len is (size_t)-1).
 * `name` (may be NULL: "<source>") appears in diagnostics. */
FG_API fg_status fg_mod_from_source(fg_ctx *ctx, const char *name, const char *text,
                                    size_t len, fg_mod **out);

typedef enum fg_mod_kind { FG_MASK_MOD = 1, FG_SCORE_MOD = 2 } fg_mod_kind;

/* The expression form: a bare expression that becomes the body of mask_mod
 * (a bool expression of b, h, q_idx, kv_idx) or score_mod (a float expression
 * of score, b, h, q_idx, kv_idx), with parameters declared through `params`.
 * Parses to the same AST, canonical text and hash as the file form. */
FG_API fg_status fg_mod_from_expr(fg_ctx *ctx, fg_mod_kind kind, const char *expr,
                                  const fg_param_decl *params, size_t nparams,
                                  fg_mod **out);

/* FlexAttention's and_masks / or_masks: a new mod whose mask_mod is
 * a(...) && b(...) (or ||), evaluated left to right with short-circuit, so b
 * is never evaluated where a already decides. Parameters with the same name
 * must have the same kind and type and are shared; otherwise FG_ERR_NAME.
 * Neither input may have a score_mod: FG_ERR_INVALID_ARGUMENT. */
FG_API fg_status fg_mod_and(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out);
FG_API fg_status fg_mod_or(fg_ctx *ctx, const fg_mod *a, const fg_mod *b, fg_mod **out);

/* A mod with the mask_mod of `mask_from` and the score_mod of `score_from`
 * (either may be NULL, not both), parameters merged as for fg_mod_and. This is
 * how `--mask FILE --score FILE` becomes one mod. */
FG_API fg_status fg_mod_combine(fg_ctx *ctx, const fg_mod *mask_from, const fg_mod *score_from,
                                fg_mod **out);

FG_API void fg_mod_destroy(fg_mod *mod);

FG_API int fg_mod_has_mask(const fg_mod *mod);
FG_API int fg_mod_has_score(const fg_mod *mod);
/* A readable name: the file's base name without extension ("sliding_window"),
 * "expr" for expressions, "a_and_b" for compositions. */
FG_API const char *fg_mod_name(const fg_mod *mod);

/* The canonical text: one normal text per meaning. Whitespace, comments,
 * redundant parentheses, parameter default values and the names the user gave
 * the function arguments and locals do not change it. */
FG_API const char *fg_mod_canonical(const fg_mod *mod);
/* A 64-bit hash of the canonical text (FNV-1a). */
FG_API uint64_t fg_mod_hash(const fg_mod *mod);

/* Parameter introspection, in declaration order. */
typedef struct fg_param_info {
    const char *name;
    fg_param_kind kind;
    fg_type type;         /* scalar type, or buffer element type */
    double default_value; /* scalars */
} fg_param_info;
FG_API size_t fg_mod_param_count(const fg_mod *mod);
FG_API fg_status fg_mod_param(const fg_mod *mod, size_t index, fg_param_info *info);

/* ------------------------------------------------------------------------- */
/* Bindings: values for a mod's parameters at run time                        */
/* ------------------------------------------------------------------------- */

/* Scalars not bound take their default. Buffers must be bound. For CPU calls
 * (evaluation, CPU block masks, the reference) buffers are host pointers; for
 * GPU calls, device pointers. `length` is in elements. Changing a value never
 * recompiles. */
typedef struct fg_binding {
    const char *name;
    fg_param_kind kind;
    union {
        int32_t i;       /* scalar int   */
        float f;         /* scalar float */
        struct {
            const void *data;
            int64_t length;
        } buffer;
    } value;
    fg_type type;        /* FG_TYPE_INT / FG_TYPE_FLOAT: scalar type, or
                            buffer element type; checked against the decl   */
} fg_binding;

/* Helpers that fill a binding. */
FG_API fg_binding fg_bind_int(const char *name, int32_t v);
FG_API fg_binding fg_bind_float(const char *name, float v);
FG_API fg_binding fg_bind_int_buffer(const char *name, const int32_t *data, int64_t length);
FG_API fg_binding fg_bind_float_buffer(const char *name, const float *data, int64_t length);

/* Evaluate a mod on the CPU over the tile [q0, q0+nq) x [kv0, kv0+nk) for
 * batch b and head h, vector at a time. mask: out[i*nk+j] is 0 or 1 (all 1
 * when the mod has no mask_mod). score: out[i*nk+j] = score_mod(in[i*nk+j],
 * ...) (a copy when it has no score_mod). Errors (FG_ERR_EVAL) name the
 * offending expression's offset. */
FG_API fg_status fg_mod_eval_mask(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds,
                                  size_t nbinds, int b, int h, int q0, int nq, int kv0, int nk,
                                  uint8_t *out);
FG_API fg_status fg_mod_eval_score(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds,
                                   size_t nbinds, int b, int h, int q0, int nq, int kv0, int nk,
                                   const float *in, float *out);

/* ------------------------------------------------------------------------- */
/* Code generation and compilation (no GPU needed)                           */
/* ------------------------------------------------------------------------- */

typedef enum fg_dtype { FG_BF16 = 1, FG_FP16 = 2 } fg_dtype;

typedef enum fg_kernel_kind {
    FG_KERNEL_ATTENTION_FWD = 1,     /* the forward attention kernel: the
                                        portable one (mma.sync, sm_80+);
                                        fg_kernel_get picks the Hopper one
                                        for it where that one applies     */
    FG_KERNEL_BLOCK_MASK = 2,        /* the GPU block-mask builder       */
    FG_KERNEL_ATTENTION_FWD_SM90 = 3,/* the Hopper forward kernel (wgmma,
                                        sm_90a only; head dim 64, 96,
                                        128, 192 or 256, q and kv blocks
                                        of 128 or more)                   */
    FG_KERNEL_ATTENTION_BWD = 4,     /* the backward attention kernels
                                        (portable, mma.sync, sm_80+): one
                                        module with the preprocess, dK/dV,
                                        dQ and conversion entry points;
                                        fg_kernel_get picks the Hopper one
                                        for it where that one applies     */
    FG_KERNEL_ATTENTION_BWD_SM90 = 5,/* the Hopper backward (its dK/dV
                                        pass on wgmma and TMA, sm_90a
                                        only; head dim 64 or 128, kv
                                        blocks of multiples of 128)       */
    FG_KERNEL_ATTENTION_DECODE = 6   /* the decode kernel (portable,
                                        sm_80+): few queries per sequence,
                                        the query heads of a KV head packed
                                        into one tile, the KV walk split
                                        over thread blocks and merged;
                                        ragged lengths and paged K/V; head
                                        dims 64, 128 and 256 (a call of
                                        16 or 32 takes the forward)       */
} fg_kernel_kind;

/* Everything that selects a compiled kernel besides the mods. Growable
 * (see Conventions): FG_KERNEL_CONFIG_INIT or fg_kernel_config_init(), or
 * a 0.1 initialiser with struct_size left 0. */
typedef struct fg_kernel_config {
    fg_kernel_kind kind;
    fg_dtype dtype;      /* attention: input dtype (default FG_BF16)        */
    int head_dim;        /* attention: head dim of q/k/v (default 128)      */
    int q_block;         /* block-mask block sizes (default 128)            */
    int kv_block;
    const char *arch;    /* NULL: the context's arch                        */
    size_t struct_size;  /* sizeof(fg_kernel_config), or 0 for the 0.1
                            layout; fields after it arrive in later versions */
    /* Since 0.2. FG_KERNEL_ATTENTION_FWD only: 1 makes the kernel that
     * serves calls with kv_lens, q_offsets or a block table (and the rest;
     * its own compile, so that the plain kernel carries none of that
     * code); 0 the plain one, which refuses such calls. The Hopper forward
     * has no such form; other kinds ignore it. fg_attention_kernel_for
     * sets it from the call. */
    int ragged;
    /* Since 0.2. The attention kinds (forward, Hopper forward, backward,
     * decode): 1 asks for approximate math in score_mod (see "Approximate
     * math" above; its own compile, named -approx), 0 for the context's
     * FG_OPT_APPROX_MATH, as arch NULL asks for the context's arch; other
     * values are FG_ERR_INVALID_ARGUMENT. The block-mask builder, which
     * runs mask_mod only, ignores it. */
    int approx_math;
    /* Since 0.2. FG_KERNEL_ATTENTION_BWD (its Hopper kernel) only: 1 makes
     * the backward whose dK/dV pass can start the first kv tiles of every
     * (batch, kv head) before all the others (its own compile, named
     * -lead), for block masks whose first keys every query sees (global
     * tokens, attention sinks): launched in grid order, the last heads'
     * heavy first tiles would run on alone at the end. 0 the plain one.
     * fg_attention_backward sets it from the block mask (see "The
     * backward's tile order" below); other kinds ignore it. */
    int lead_first;
    /* Since 0.2. FG_KERNEL_ATTENTION_BWD (its Hopper kernel) only: 1 makes
     * the backward whose dK/dV pass runs the kv heads in pairs, tile t of
     * both heads before tile t + 1 (its own compile, named -pairs), for
     * block masks whose kv tiles grow lighter along the kv axis (causal,
     * prefixes): launched in grid order, the last head's heavy first tile
     * would run on alone at the end. It serves calls with an even number
     * of kv heads. 0 the plain one; lead_first and head_pairs together are
     * FG_ERR_INVALID_ARGUMENT. fg_attention_backward sets it from the
     * block mask. FG_KERNEL_ATTENTION_DECODE at head dim 64 (other head
     * dims: FG_ERR_NOT_SUPPORTED): 1 makes the decode kernel that walks
     * two KV heads at once, reading their rows as one (its own compile,
     * named -pairs); it serves calls with an even number of kv heads whose
     * k and v head strides are 64 (FG_OPT_DECODE_HEAD_PAIRS). Other kinds
     * ignore it. */
    int head_pairs;
    /* Since 0.2. FG_KERNEL_ATTENTION_FWD's Hopper kernel only: 1 makes the
     * kernel for calls without a block mask, which at head dim 128, for a
     * mod without a mask_mod, walks K and V in tiles of 176 rows instead of
     * 128 (fewer, longer steps for the same work; its own compile, named
     * -dense). It refuses block masks (FG_ERR_NOT_SUPPORTED: their blocks
     * are 128 keys). Where it would change nothing (other head dims, a mod
     * with a mask_mod, the portable kernel) the plain kernel is made.
     * fg_attention_forward sets it for calls without a block mask; other
     * kinds ignore it. Values other than 0 and 1 are
     * FG_ERR_INVALID_ARGUMENT. */
    int dense;
} fg_kernel_config;

#ifdef __cplusplus
#define FG_KERNEL_CONFIG_INIT fg_kernel_config_init()
#else
#define FG_KERNEL_CONFIG_INIT {.struct_size = sizeof(fg_kernel_config)}
#endif
/* Every field zero (the defaults), struct_size set. */
static inline fg_kernel_config fg_kernel_config_init(void) {
    fg_kernel_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    return c;
}

/* The complete, self-contained CUDA source of the kernel for `mod` under
 * `config` (what `flexgen --mask FILE` prints). */
FG_API fg_status fg_generate_source(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                                    char **source);

typedef enum fg_emit_kind { FG_EMIT_PTX = 1, FG_EMIT_CUBIN = 2 } fg_emit_kind;
/* Compile the generated source with NVRTC for the config's arch. On
 * FG_ERR_COMPILE the log is in fg_compile_log. */
FG_API fg_status fg_compile(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                            fg_emit_kind kind, void **image, size_t *size);

/* ------------------------------------------------------------------------- */
/* Kernel cache                                                              */
/* ------------------------------------------------------------------------- */

typedef struct fg_cache_stats {
    uint64_t memory_hits;   /* found loaded in memory                       */
    uint64_t disk_hits;     /* loaded from a verified disk file             */
    uint64_t misses;        /* compiled                                     */
    uint64_t disk_rejects;  /* damaged / foreign disk files recompiled      */
    double compile_ms;      /* total NVRTC time                             */
    double load_ms;         /* total disk read + module load time           */
} fg_cache_stats;

/* Stats of the process-wide kernel cache (all contexts share it). */
FG_API void fg_cache_get_stats(fg_cache_stats *stats);
FG_API void fg_cache_reset_stats(void);
/* The disk cache folder in effect for ctx (option, $FLEXGEN_CACHE_DIR,
 * $XDG_CACHE_HOME/flexgen, ~/.cache/flexgen). */
FG_API fg_status fg_cache_dir(fg_ctx *ctx, const char **dir);
/* Remove every cache file in the folder; `removed` may be NULL. */
FG_API fg_status fg_cache_clear(fg_ctx *ctx, size_t *removed);
/* Drop every kernel from the in-memory cache (for tests and benchmarks). */
FG_API void fg_cache_forget_memory(void);

/* ------------------------------------------------------------------------- */
/* Block masks                                                               */
/* ------------------------------------------------------------------------- */

/* FlexAttention's BlockMask. Blocks of q_block x kv_block. For each (b, h,
 * q block): `kv_num_blocks` partial blocks (the mask is evaluated inside)
 * listed ascending in `kv_indices`, and `full_kv_num_blocks` full blocks (no
 * mask evaluation) in `full_kv_indices`; empty blocks are absent. The q_*
 * arrays are the transpose (per kv block, the q blocks) for the backward pass.
 * batch or heads of 1 broadcast over the attention's B / H.
 *
 * Classification of a block that holds positions past q_len or kv_len: only
 * in-range positions count. A block is full when the mask is true at every
 * in-range position, empty when false at every one, partial otherwise. The
 * kernels always mask positions past the lengths themselves. Index entries
 * past a row's count are 0. The mod sees b in [0, batch) and h in [0, heads)
 * (so b = h = 0 when broadcasting). */
typedef struct fg_block_mask fg_block_mask;

/* The shape of a block mask. Growable (see Conventions):
 * FG_BLOCK_MASK_DESC_INIT or fg_block_mask_desc_init(), or a 0.1
 * initialiser with struct_size left 0. */
typedef struct fg_block_mask_desc {
    int batch, heads;     /* 1 = broadcast                                 */
    int q_len, kv_len;
    int q_block, kv_block;/* 0 = 128                                       */
    size_t struct_size;   /* sizeof(fg_block_mask_desc), or 0 for the 0.1
                             layout                                        */
    /* Since 0.2: the positions the mask is built for, as the attention
     * call's q_offset and kv_offset: the mod sees q_idx = q_offset + i and
     * kv_idx = kv_offset + j for the mask's row i and column j (a decode
     * step's queries at the end of the sequence, a chunk of a prefill).
     * An attention call takes a mask whose offsets are its own (with
     * per-sequence q_offsets it cannot check them: the mask's rows are then
     * the caller's promise). */
    int q_offset, kv_offset;
} fg_block_mask_desc;

#ifdef __cplusplus
#define FG_BLOCK_MASK_DESC_INIT fg_block_mask_desc_init()
#else
#define FG_BLOCK_MASK_DESC_INIT {.struct_size = sizeof(fg_block_mask_desc)}
#endif
/* Every field zero, struct_size set. */
static inline fg_block_mask_desc fg_block_mask_desc_init(void) {
    fg_block_mask_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    return d;
}

typedef enum fg_block_mask_array {
    FG_BM_KV_NUM_BLOCKS = 1,      /* int32 [B][H][q_blocks]               */
    FG_BM_KV_INDICES = 2,         /* int32 [B][H][q_blocks][kv_blocks]    */
    FG_BM_FULL_KV_NUM_BLOCKS = 3, /* int32 [B][H][q_blocks]               */
    FG_BM_FULL_KV_INDICES = 4,    /* int32 [B][H][q_blocks][kv_blocks]    */
    FG_BM_Q_NUM_BLOCKS = 5,       /* int32 [B][H][kv_blocks]              */
    FG_BM_Q_INDICES = 6,          /* int32 [B][H][kv_blocks][q_blocks]    */
    FG_BM_FULL_Q_NUM_BLOCKS = 7,  /* int32 [B][H][kv_blocks]              */
    FG_BM_FULL_Q_INDICES = 8      /* int32 [B][H][kv_blocks][q_blocks]    */
} fg_block_mask_array;

/* Build on the CPU with the evaluator (buffers bound to host memory). */
FG_API fg_status fg_block_mask_create(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc,
                                      const fg_binding *binds, size_t nbinds, fg_block_mask **out);
/* Build on the GPU with a generated kernel (buffers bound to device memory).
 * The result lives on the device (download it to read it on the host).
 * `stream` is a CUstream (NULL: the default stream); the call does not
 * synchronise. */
FG_API fg_status fg_block_mask_create_gpu(fg_ctx *ctx, const fg_mod *mod,
                                          const fg_block_mask_desc *desc, const fg_binding *binds,
                                          size_t nbinds, void *stream, fg_block_mask **out);
/* Rebuild an existing block mask in place on the GPU for new parameter /
 * buffer values (or another mask mod of the same shape): no compile once the
 * kernel is cached, no host sync, and no allocation for a mask made by
 * fg_block_mask_create_gpu (a host-made mask gets its device memory on the
 * first rebuild). The host arrays become stale: download to read them. */
FG_API fg_status fg_block_mask_rebuild_gpu(fg_ctx *ctx, fg_block_mask *mask, const fg_mod *mod,
                                           const fg_binding *binds, size_t nbinds, void *stream);
/* Like BlockMask.from_kv_blocks: from host arrays of partial and (optional,
 * may be NULL) full blocks; the q_* arrays are derived. Indices are checked. */
FG_API fg_status fg_block_mask_from_kv_blocks(fg_ctx *ctx, const fg_block_mask_desc *desc,
                                              const int32_t *kv_num_blocks, const int32_t *kv_indices,
                                              const int32_t *full_kv_num_blocks,
                                              const int32_t *full_kv_indices, fg_block_mask **out);
FG_API void fg_block_mask_destroy(fg_block_mask *mask);

/* The mask's shape with its block sizes filled in; struct_size is set to
 * sizeof(fg_block_mask_desc). */
FG_API fg_status fg_block_mask_get_desc(const fg_block_mask *mask, fg_block_mask_desc *desc);
/* Copy host arrays to the device / device arrays to the host (synchronous). */
FG_API fg_status fg_block_mask_upload(fg_ctx *ctx, fg_block_mask *mask);
FG_API fg_status fg_block_mask_download(fg_ctx *ctx, fg_block_mask *mask);
/* One array: host pointer (NULL when not on the host), device pointer (0 when
 * not on the device), and its dims (4 entries; the 3-D ones set dims[3]=1). */
FG_API fg_status fg_block_mask_array_get(const fg_block_mask *mask, fg_block_mask_array which,
                                         const int32_t **host, uint64_t *device, int64_t dims[4]);
/* Fraction of (b, h, q block, kv block) tiles that are empty, in [0, 1]
 * (FlexAttention's sparsity() / 100). Needs the host arrays. */
FG_API fg_status fg_block_mask_sparsity(const fg_block_mask *mask, double *sparsity);
/* A text picture like BlockMask.__str__: '#' full, '+' partial, '.' empty,
 * one row per q block, downsampled to at most max_cols columns / max_rows rows
 * (0: 64 / 32), for each (b, h) up to a few. */
FG_API fg_status fg_block_mask_picture(const fg_block_mask *mask, int max_rows, int max_cols,
                                       char **text);

/* ------------------------------------------------------------------------- */
/* Attention                                                                 */
/* ------------------------------------------------------------------------- */

/* One attention call. q: [B, Hq, Q_LEN, D], k and v: [B, Hkv, KV_LEN, D],
 * out: [B, Hq, Q_LEN, D], lse: [B, Hq, Q_LEN] float32 (natural log; may be
 * NULL). Strides are in elements for the index order (b, h, s, d); the last
 * must be 1; all zero means contiguous BHSD. BSHD works by strides.
 * Hq must be a multiple of Hkv (GQA / MQA). q, k and v: 16-byte aligned
 * pointers and strides (FG_ERR_SHAPE otherwise); out and lse: 4-byte
 * aligned, out 16-byte aligned where the Hopper forward is to store it by
 * TMA (fg_attention_forward otherwise runs the portable kernel).
 * Growable (see Conventions):
 * FG_ATTENTION_ARGS_INIT or fg_attention_args_init(), or `= {0}` with
 * struct_size left 0 as in 0.1. */
typedef struct fg_attention_args {
    int batch, heads_q, heads_kv, q_len, kv_len, head_dim;
    fg_dtype dtype;
    const void *q, *k, *v;
    void *out;
    float *lse;
    int64_t q_stride[4], k_stride[4], v_stride[4], out_stride[4];
    float scale;                     /* 0: 1/sqrt(head_dim)                 */
    int q_offset, kv_offset;         /* added to the indices the mods see  */
    const fg_block_mask *block_mask; /* NULL: dense (mask_mod everywhere)  */
    const fg_binding *binds;
    size_t nbinds;
    void *stream;                    /* CUstream; NULL: default stream    */
    size_t struct_size;              /* sizeof(fg_attention_args), or 0 for
                                        the 0.1 layout                     */
    /* Since 0.2: ragged batches and paged K/V (all zero: not used). Every
     * array here is device memory read by the kernel at run time, so
     * changing its contents never recompiles and a replayed CUDA graph
     * sees the new values.
     *  - kv_lens: int32 [batch], sequence b's KV length (clamped into
     *    [0, kv_len]; 0 gives output 0 and LSE -inf); keys past it are
     *    masked and never read. NULL: kv_len for every sequence.
     *  - q_offsets: int32 [batch], sequence b's q_offset (query i sees
     *    q_idx = q_offsets[b] + i); NULL: q_offset for every sequence.
     *    The caller keeps q_offsets[b] + q_len inside int.
     *  - block_table: int32 [batch][max_pages], paged K/V: key j of
     *    sequence b is row j % page_size of page block_table[b][j /
     *    page_size]. k and v are then [num_pages, page_size, heads_kv,
     *    head_dim] (the layout of vLLM and FlashInfer) and their strides
     *    are read as (page, head, row in page, d); all zero means that
     *    layout, contiguous. page_size is a power of two in [16, 256];
     *    kv_len (the longest sequence) at most max_pages * page_size. A
     *    table entry outside [0, num_pages) is never dereferenced: its
     *    keys are masked as if past the length (fg_block_table_check
     *    finds such entries).
     * The decode kernel and the portable forward kernel read them (a
     * prefill or a chunk of one into a paged cache runs on the latter);
     * the Hopper forward and the backward do not. */
    const int32_t *kv_lens;
    const int32_t *q_offsets;
    const int32_t *block_table;
    int page_size, num_pages, max_pages;
    /* Since 0.2: device memory the call may use as its workspace (the
     * decode kernel's split parts, the Hopper forward's tile counter),
     * 256-byte aligned, workspace_size bytes; fg_attention_workspace_size
     * says how much a call uses. NULL
     * or too small: the call takes its workspace from the library's
     * stream-ordered pool on the device and gives it back on the stream.
     * A workspace of the caller's saves that allocation's host time on
     * every call and keeps a captured CUDA graph free of allocations. It
     * is used in stream order: calls running at once on different
     * streams need one each. */
    void *workspace;
    size_t workspace_size;
} fg_attention_args;

#ifdef __cplusplus
#define FG_ATTENTION_ARGS_INIT fg_attention_args_init()
#else
#define FG_ATTENTION_ARGS_INIT {.struct_size = sizeof(fg_attention_args)}
#endif
/* Every field zero (dense, default scale, default stream), struct_size set. */
static inline fg_attention_args fg_attention_args_init(void) {
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    return a;
}

/* A compiled attention kernel for one mod and configuration, fetched once
 * (from the cache, compiling on a miss) and launched many times: the forward
 * (kind FG_KERNEL_ATTENTION_FWD or _SM90, fg_kernel_launch) or the backward
 * (FG_KERNEL_ATTENTION_BWD or _SM90, fg_kernel_launch_backward). */
typedef struct fg_kernel fg_kernel;
FG_API fg_status fg_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                               fg_kernel **out);
FG_API void fg_kernel_release(fg_kernel *kernel);
/* Which kernel fg_kernel_get chose: FG_KERNEL_ATTENTION_FWD (the portable
 * one) or FG_KERNEL_ATTENTION_FWD_SM90, FG_KERNEL_ATTENTION_BWD or
 * FG_KERNEL_ATTENTION_BWD_SM90; 0 for NULL. */
FG_API fg_kernel_kind fg_kernel_kind_of(const fg_kernel *kernel);

/* Run the forward pass on the GPU (device pointers). Asynchronous on the
 * stream. Uses fg_attention_kernel_for internally (a memory-cache hit after
 * the first). Where the Hopper kernel cannot take a call it runs the
 * portable one: a layout its tensor maps cannot describe, and a mod
 * computing (float)(kv_idx - q_idx) (ALiBi's distance) past 2^24, where the
 * Hopper kernel's float arithmetic for that cast is no longer the cast's
 * (its fg_kernel_launch returns FG_ERR_NOT_SUPPORTED): at head dim 128, an
 * index past 2^24 in magnitude when a mask reading q_idx and kv_idx apart
 * stands beside the score_mod (the kernel computes the cast per score as
 * (float)kv_idx - (float)q_idx); at head dims 64 and 192, a distance
 * q_idx - kv_idx past 2^24 (with 256 of margin) when none does (the kernel
 * counts a float distance up by one a diagonal). */
FG_API fg_status fg_attention_forward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args);
/* The kernel fg_attention_forward runs for `args` (the shapes, dtype,
 * paging and block mask count; pointers may be NULL): the decode kernel
 * (FG_KERNEL_ATTENTION_DECODE) or a forward one, as FG_OPT_DECODE_KERNEL
 * and FG_OPT_HOPPER_KERNEL say, and a forward one for a block mask the
 * decode kernel cannot walk (grouped query heads with a mask per head) or
 * a head dim it does not take (16, 32). Fetched once, it serves every call of
 * the same configuration through fg_kernel_launch, whatever the lengths,
 * batch, offsets or page table. */
FG_API fg_status fg_attention_kernel_for(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                         fg_kernel **out);
/* The workspace (bytes) fg_attention_forward may use for `args` (shapes,
 * dtype, head dim and paging; pointers may be NULL): the decode kernel's
 * split parts, B * Hq * q_len * splits * (head_dim + 1) floats rounded up,
 * 0 when it does not split its walk (on a Hopper GPU a walk of 2 to 8
 * splits merges them among its thread block cluster and leaves the
 * workspace unused); 256 bytes when the call runs on a forward kernel (the
 * Hopper forward's tile counter).
 * The split count follows the batch, the heads, kv_len and the GPU, so a
 * serving loop sizes its workspace for the largest of its calls (more
 * sequences need fewer splits). */
FG_API fg_status fg_attention_workspace_size(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                             size_t *bytes);
/* Launch a forward-family kernel (FG_KERNEL_ATTENTION_FWD, _FWD_SM90 or
 * _DECODE). The decode kernel splits long KV walks over thread blocks and
 * takes fp32 workspace for their parts, B * Hq * q_len * splits *
 * (head_dim + 1) floats, stream-ordered from a memory pool of the
 * library's on the device (cuMemAllocFromPoolAsync; it keeps up to 64 MiB
 * mapped between calls, so a step costs no mapping), given back on the
 * stream. */
FG_API fg_status fg_kernel_launch(fg_ctx *ctx, fg_kernel *kernel, const fg_attention_args *args);

/* ---- merging partial results ---- */

/* The most parts one fg_attention_merge call takes (merge more by merging
 * merged results). */
#define FG_MERGE_MAX_PARTS 16

/* Partial results of attention for the same queries over disjoint sets of
 * keys -- a shared prefix and each sequence's own suffix (cascade
 * attention), the shards of a sequence on several GPUs -- each an output
 * normalised over its own keys with that normalisation's log-sum-exp
 * (what fg_attention_forward writes to out and lse), merged exactly into
 * the attention over all of them: out = sum_i e^(lse_i - M) out_i / sum_i
 * e^(lse_i - M), LSE = M + log sum_i e^(lse_i - M), M the largest lse_i.
 * A part with LSE -inf weighs nothing; a row whose parts all have it gets
 * output 0 and LSE -inf.
 *   outs[i]: [batch, heads, q_len, head_dim] in dtype, every part with the
 *            strides part_stride (elements, (b, h, s, d); all zero:
 *            contiguous), device memory;
 *   lses[i]: [batch, heads, q_len] float32, natural log, contiguous;
 *   out, out_stride: the result (it may be one of the parts, with the same
 *            strides); lse: its LSE, or NULL (it must not be one of lses).
 * Asynchronous on the stream; no workspace. Growable (see Conventions):
 * FG_MERGE_ARGS_INIT or fg_merge_args_init(). */
typedef struct fg_merge_args {
    int batch, heads, q_len, head_dim;
    fg_dtype dtype;
    int nparts;
    const void *outs[FG_MERGE_MAX_PARTS];
    const float *lses[FG_MERGE_MAX_PARTS];
    int64_t part_stride[4];
    void *out;
    float *lse;
    int64_t out_stride[4];
    void *stream;
    size_t struct_size;
} fg_merge_args;

#ifdef __cplusplus
#define FG_MERGE_ARGS_INIT fg_merge_args_init()
#else
#define FG_MERGE_ARGS_INIT {.struct_size = sizeof(fg_merge_args)}
#endif
static inline fg_merge_args fg_merge_args_init(void) {
    fg_merge_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    return a;
}

FG_API fg_status fg_attention_merge(fg_ctx *ctx, const fg_merge_args *args);

/* Check a block table on the host before a paged call: every entry a
 * sequence uses (the first ceil(len / page_size) of row b, len its KV
 * length from `kv_lens`, a host array, or kv_len when NULL) must be in
 * [0, num_pages). The first bad entry is reported as FG_ERR_SHAPE with its
 * sequence, position and value. `args` gives the shapes and paging
 * (block_table and kv_lens there are ignored). */
FG_API fg_status fg_block_table_check(fg_ctx *ctx, const fg_attention_args *args, const int32_t *block_table,
                                      const int32_t *kv_lens);

/* ---- the backward pass ---- */

/* The backward of one attention call: d loss / d q, k, v (and the float
 * buffers score_mod reads) from d loss / d out. `fwd` is the forward call's
 * arguments as they were (shapes, strides, q, k, v, out, scale, offsets,
 * block mask, binds, stream); its lse is required: the backward reuses the
 * forward's log-sum-exp instead of recomputing it. dout has out's shape and
 * dtype; dq, dk and dv have q's, k's and v's shapes and the dtype, and are
 * written, not accumulated (dk and dv summed over the query heads of a GQA
 * group). Strides as in fg_attention_args (all zero: contiguous BHSD).
 *
 * Buffer gradients: for each float buffer parameter of score_mod whose
 * gradient is wanted, a float buffer binding (fg_bind_float_buffer) of the
 * parameter's name whose data is a device fp32 array of at least the bound
 * buffer's length; it receives d loss / d buf[i], overwritten like dq. A
 * binding that names an int buffer, a scalar or a buffer score_mod's value
 * does not depend on is FG_ERR_UNBOUND (nothing could be written there).
 *
 * Determinism: dQ is summed over kv tiles. By default it goes through fp32
 * atomics (one pass over K/V), so its last bits may differ from run to run;
 * deterministic = 1 computes dQ in a pass of its own over the kv tiles of
 * each q tile (no atomics; the S and dP products are computed twice) and is
 * bit-reproducible. Buffer gradients are bit-reproducible in both modes:
 * each thread's partial sums, in double and in a fixed order, are added
 * exactly into a fixed-point accumulator (integer atomics commute; parts
 * below 2^-64 in magnitude are dropped, the sum is kept within +-2^63),
 * rounded to fp32 once. (Those gradients cancel heavily -- ALiBi's slope
 * gradient is sum ds (kv - q) with ds summing to zero along each row -- so
 * an fp32 sum's order would decide their digits.)
 *
 * The backward's tile order: the Hopper kernel's dK/dV pass is a grid of
 * blocks, one per (kv tile of 128 rows, kv head, batch), which the GPU
 * starts in grid order. Under a block mask, the call weighs those blocks
 * from the mask's transposed counts; where every head's first kv tiles are
 * heavy enough that grid order would leave them running alone at the end
 * (keys every query sees: global tokens, attention sinks; by its estimate
 * a tenth of the pass or more), it runs the -lead kernel
 * (fg_kernel_config.lead_first), which starts those tiles first. The
 * counts are the host arrays of a mask built on the CPU or downloaded;
 * a GPU build (fg_block_mask_create_gpu, fg_block_mask_rebuild_gpu) also
 * copies them to pinned host memory behind itself on its stream, and the
 * call uses that copy once it has landed. The call never waits for it:
 * until then, and for a build captured into a graph, it keeps the grid
 * order. FG_OPT_BWD_LEAD_TILES overrides the choice. Otherwise, at head
 * dim 128, for a mod without a score_mod (with one, the -pairs compile
 * measured slower than its order gains) and an even number of kv heads,
 * where the heads' tiles grow lighter along the kv axis (causal, prefix
 * masks: the last head's first tile would otherwise outlast the rest of
 * the pass) and the estimate shortens by half a percent or more, it runs
 * the -pairs kernel (fg_kernel_config.head_pairs), tile t of two heads
 * before tile t + 1 (FG_OPT_BWD_HEAD_PAIRS overrides). Inside a block,
 * the q tiles are visited in the transposed row's order, except where a
 * kv tile's row has the same counts as its left neighbour's (no block
 * mask, or kv blocks that many queries share alike, as flamingo's images):
 * such a block starts at item (tile % items), so that neighbours with the same
 * q tiles add into each one's dQ at different times. Without a block mask,
 * where the blocks' count leaves a last wave that fills under half the SMs
 * (4096 blocks on 132 SMs: 31 waves and 4 blocks), the -lead kernel splits
 * each block of that wave into SMs / tail pieces, each walking a share of
 * the block's q steps and adding its dK and dV into an fp32 accumulator in
 * the workspace (FG_OPT_BWD_TAIL_SPLIT; never in deterministic mode). dK and dV do not
 * depend on the order beyond the rounding of their fp32 sums; the
 * deterministic mode stays bit-reproducible.
 *
 * The library needs fp32 workspace of about (B * Hq * Q_LEN) * (D + 1)
 * floats (D + 1 without deterministic, 1 with it; 2 more per row on the
 * Hopper kernel) and 32 bytes per buffer-gradient element;
 * fg_attention_backward_workspace_size says exactly. The caller's
 * (`workspace`, since 0.2) when it is large enough, else it is taken from
 * the library's stream-ordered pool and given back on the stream. Growable
 * (see Conventions): FG_ATTENTION_BWD_ARGS_INIT or
 * fg_attention_bwd_args_init(). */
typedef struct fg_attention_bwd_args {
    const fg_attention_args *fwd;
    const void *dout;
    void *dq, *dk, *dv;
    int64_t dout_stride[4], dq_stride[4], dk_stride[4], dv_stride[4];
    const fg_binding *grad_binds;
    size_t ngrad_binds;
    int deterministic;
    size_t struct_size; /* sizeof(fg_attention_bwd_args); 0 means the layout
                           of the version that introduced it (every field
                           before struct_size)                             */
    /* Since 0.2: device memory the call may use as its workspace,
     * 256-byte aligned, workspace_size bytes (as fg_attention_args'). With
     * one of its own the call allocates nothing, as a CUDA graph capture
     * or a training loop that never allocates wants. */
    void *workspace;
    size_t workspace_size;
    /* Since 0.2: d loss / d lse, fp32 [B][Hq][Q_LEN] contiguous, for a loss
     * that also reads the forward's log-sum-exp (NULL: zero). Since
     * d lse_i / d s_ij = P_ij, it enters as dS_ij = P_ij (dP_ij - delta_i +
     * dlse_i); a fully masked row (lse -inf) ignores its entry. */
    const float *dlse;
} fg_attention_bwd_args;

#ifdef __cplusplus
#define FG_ATTENTION_BWD_ARGS_INIT fg_attention_bwd_args_init()
#else
#define FG_ATTENTION_BWD_ARGS_INIT {.struct_size = sizeof(fg_attention_bwd_args)}
#endif
static inline fg_attention_bwd_args fg_attention_bwd_args_init(void) {
    fg_attention_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    return a;
}

/* Run the backward pass on the GPU (device pointers), asynchronous on
 * fwd->stream. fg_kernel_launch_backward takes a kernel from fg_kernel_get
 * with kind FG_KERNEL_ATTENTION_BWD (fetched once, launched many times). */
FG_API fg_status fg_attention_backward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args);
FG_API fg_status fg_kernel_launch_backward(fg_ctx *ctx, fg_kernel *kernel, const fg_attention_bwd_args *args);
/* The kernel fg_attention_backward runs for `args` (checked as for the
 * call; nothing is launched), for fg_kernel_launch_backward: the Hopper
 * one where it applies, its -lead form where the block mask asks for it
 * (see "The backward's tile order"), else the portable one. Release it
 * with fg_kernel_release. A -lead kernel weighs each launch's block mask
 * again; the plain kernels keep the grid order. */
FG_API fg_status fg_attention_backward_kernel_for(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                                  fg_kernel **out);
/* The workspace (bytes) fg_attention_backward uses for `args`, given as
 * for the call (checked the same way; no memory is read): it depends on
 * the shapes, deterministic, the gradient bindings and the kernel the call
 * runs, which is fetched (compiled if it is not cached yet). */
FG_API fg_status fg_attention_backward_workspace_size(fg_ctx *ctx, const fg_mod *mod,
                                                      const fg_attention_bwd_args *args, size_t *bytes);

/* The CPU reference backward in float64, with host pointers: fwd's q, k, v
 * (its out and lse are not read: the reference recomputes the forward),
 * dout in the dtype, dlse (if any) fp32; dq, dk, dv as double arrays,
 * contiguous BHSD; each
 * gradient binding's data a double array of the buffer's length. Also
 * checks what fg_attention_backward checks. Like fg_attention_reference it
 * runs on up to one thread a core, in units of one (batch, KV head), with
 * the same result, bit for bit, on any number of cores. */
FG_API fg_status fg_attention_reference_backward(fg_ctx *ctx, const fg_mod *mod,
                                                 const fg_attention_bwd_args *args);

/* The CPU reference: same arguments with host pointers (q/k/v in args->dtype,
 * out as double [B, Hq, Q_LEN, D] contiguous, lse as double [B, Hq, Q_LEN]
 * or NULL), float64 accumulation, the mods through the evaluator. The
 * (batch, head) pairs run on up to one thread a core (32 at most), started
 * and joined inside the call; the result is bit for bit the same on any
 * number of cores. */
FG_API fg_status fg_attention_reference(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                        double *out, double *lse);

/* ---- context parallelism: one sequence over several GPUs ---- */

/* How a sequence of S rows is cut across the N ranks of a communicator.
 * CONTIGUOUS: rank r holds the r-th of N consecutive chunks. ZIGZAG: the
 * sequence is cut into 2N chunks and rank r holds chunks r and 2N-1-r, back
 * to back in its buffers; under causal-like masks (work growing along the
 * diagonal) every rank then does the same work at every ring step, which
 * contiguous chunks do not (rank N-1 would do 2N-1 times rank 0's work).
 * Chunks are cut in units of 128 rows (the kernels' block), the first
 * ones taking a unit more when they do not divide evenly. Contiguous is the
 * right choice for masks whose work per row is even (no mask, windows
 * shorter than a chunk, short documents); docs/context_parallel.md. */
typedef enum fg_cp_layout { FG_CP_CONTIGUOUS = 1, FG_CP_ZIGZAG = 2 } fg_cp_layout;

/* The global rows rank `rank` of `world` holds of a sequence of `len` rows:
 * starts[i], lens[i] for its *nchunks (1, or 2 under zig-zag) chunks, in
 * the order they sit in its buffers. FG_ERR_INVALID_ARGUMENT for a world
 * outside 1..64, a rank outside it, an unknown layout or NULL outputs;
 * FG_ERR_SHAPE for len outside 1..2^31-1. */
FG_API fg_status fg_cp_shard_rows(fg_cp_layout layout, int world, int rank, int64_t len, int64_t starts[2],
                                  int64_t lens[2], int *nchunks);

/* The forward of self-attention over a sequence sharded across the ranks
 * of an NCCL communicator (ring attention). Every rank calls it with its
 * own shard; `local` describes that shard as a plain call would: q, k, v,
 * out (and lse, optional) of its rows only (q_len = kv_len = the rank's
 * rows, fg_cp_shard_rows), shapes, dtype, scale, binds and stream. The mods
 * see global positions. Buffer parameters (document ids) cover the whole
 * sequence and hold the same values on every rank. k and v must be
 * contiguous [B, Hkv, rows, D] (they travel round the ring as they are);
 * q, out may have any strides the forward takes; q_offset, kv_offset,
 * block_mask, kv_lens, q_offsets and block_table must be unset (the
 * library places each pair itself and builds its block masks). Every
 * chunk must hold rows: global_len at least (C - 1) * 128 + 1 for C
 * chunks (N ranks, 2N under zig-zag), FG_ERR_SHAPE otherwise. Every
 * rank checks all of this before its first transfer, from what every rank
 * passes alike, so a mistake made on every rank fails on every rank.
 *
 * What it does: K/V shards travel round the ring (NCCL send / receive on a
 * stream of the library's, ordered against the caller's stream by events)
 * while each step's (q chunk, kv chunk) pairs compute on the caller's
 * stream; pairs the mask leaves empty are skipped, and so is any transfer
 * of a shard past the last rank that needs it; the partial results merge
 * by their log-sum-exps (fg_attention_merge, in groups of 16 where a q
 * chunk has more parts; exact but for the rounding of each part, and of
 * each group's result, to the dtype). The pairs' classes
 * come from block masks of every chunk pair of the sequence, built on the
 * GPU at each call, so every rank reaches the same schedule: the call
 * synchronises with the host twice (after building the masks, and before
 * freeing them), unless it is given a plan made once (fg_cp_plan_create).
 * `comm` is the application's ncclComm_t, on the context's device; the
 * call's transfers run on a stream of the library's, so no other NCCL work
 * may use that communicator until the caller's stream has passed the call
 * (one communicator must not run two operations at once): give context
 * parallelism a communicator of its own, or order the rest after the
 * call. libnccl is opened with dlopen ($FLEXGEN_NCCL_LIB, else
 * libnccl.so.2): without it FG_ERR_NOT_SUPPORTED. Growable (see
 * Conventions): FG_CP_ARGS_INIT or fg_cp_args_init(). */
typedef struct fg_cp_plan fg_cp_plan;

typedef struct fg_cp_args {
    const fg_attention_args *local;
    void *comm;             /* ncclComm_t                                   */
    int64_t global_len;     /* S, the whole sequence's rows                 */
    fg_cp_layout layout;
    const fg_cp_plan *plan; /* NULL: the call builds its schedule itself    */
    size_t struct_size;     /* sizeof(fg_cp_args); 0 means the layout of the
                               version that introduced it                   */
} fg_cp_args;

#ifdef __cplusplus
#define FG_CP_ARGS_INIT fg_cp_args_init()
#else
#define FG_CP_ARGS_INIT {.struct_size = sizeof(fg_cp_args)}
#endif
static inline fg_cp_args fg_cp_args_init(void) {
    fg_cp_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    return a;
}

FG_API fg_status fg_attention_forward_cp(fg_ctx *ctx, const fg_mod *mod, const fg_cp_args *args);

/* A sharded call's schedule kept across calls: the block masks of every
 * chunk pair and the plan made from them, which a call without a plan
 * builds itself (GPU mask builds and two host synchronisations per call).
 * Made from the same arguments a call takes (its `plan` field unset) and
 * given to calls through fg_cp_args.plan / fg_cp_bwd_args.plan, a plan
 * makes the forward and the backward synchronise with the host not at all;
 * a training step's forward and backward share one. A call with a plan
 * checks that it was made for the same mod, communicator rank and size,
 * device, global length, layout, batch and query heads
 * (FG_ERR_INVALID_ARGUMENT otherwise); the values of the mod's parameters
 * and buffers are the caller's promise: make a new plan when they change
 * (new document ids). Destroy it after the calls that used it have
 * finished on their streams. */
FG_API fg_status fg_cp_plan_create(fg_ctx *ctx, const fg_mod *mod, const fg_cp_args *args, fg_cp_plan **out);
FG_API void fg_cp_plan_destroy(fg_cp_plan *plan);

/* The backward of fg_attention_forward_cp: every rank calls it with its
 * own shard. `local` is the shard's backward as a plain call would take
 * it: local->fwd as given to the forward (q, k, v, and out and lse as the
 * sharded forward wrote them: the merged results, lse required), dout,
 * dq, dk, dv of the rank's rows, dlse (optional), deterministic and the
 * gradient bindings of buffer parameters (every rank the same bindings).
 * A buffer is a parameter every rank holds a copy of, and each rank's
 * binding receives the gradient of that rank's copy: the share of the
 * rank's own q rows, exact; the ranks' shares add up to the whole
 * sequence's gradient, which is what the all-reduce a data-parallel step
 * applies to every replicated parameter makes of them. With
 * grads_summed 1 the call adds them itself (an exact int64 all-reduce) and
 * every rank receives the whole. Not taken: a caller's workspace
 * (FG_ERR_INVALID_ARGUMENT).
 *
 * What it does: the forward's schedule again (the same pair masks, plan
 * and skipping), with each held shard's dK and dV travelling beside its
 * K and V as fp32 running sums: at each step a rank adds its pairs'
 * contributions to the sums it received and passes them on; after the
 * shard's last use they go straight back to the rank that owns it, which
 * rounds them into dk, dv once. dQ stays home and sums over the steps in
 * fp32. Each pair's gradients come from fg_attention_backward with the
 * merged lse, so nothing of the softmax is recomputed across ranks; each
 * pair's contribution is rounded to the dtype once before it is summed
 * (the backward kernels write the dtype). The K/V transfer of step s + 1
 * runs while step s computes, the dK/dV transfer of step s while step
 * s + 1 computes. Synchronises with the host as the forward does, not at
 * all with a plan (fg_cp_plan_create: the forward's serves).
 * Growable: FG_CP_BWD_ARGS_INIT or fg_cp_bwd_args_init(). */
typedef struct fg_cp_bwd_args {
    const fg_attention_bwd_args *local;
    void *comm;             /* ncclComm_t                                   */
    int64_t global_len;     /* S, the whole sequence's rows                 */
    fg_cp_layout layout;    /* the forward's                                */
    const fg_cp_plan *plan; /* NULL: the call builds its schedule itself    */
    int grads_summed;       /* 1: buffer gradients summed across the ranks  */
    size_t struct_size;     /* sizeof(fg_cp_bwd_args); 0 means the layout of
                               the version that introduced it             */
} fg_cp_bwd_args;

#ifdef __cplusplus
#define FG_CP_BWD_ARGS_INIT fg_cp_bwd_args_init()
#else
#define FG_CP_BWD_ARGS_INIT {.struct_size = sizeof(fg_cp_bwd_args)}
#endif
static inline fg_cp_bwd_args fg_cp_bwd_args_init(void) {
    fg_cp_bwd_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    return a;
}

FG_API fg_status fg_attention_backward_cp(fg_ctx *ctx, const fg_mod *mod, const fg_cp_bwd_args *args);

#ifdef __cplusplus
}
#endif
#endif /* FLEXGEN_H */
