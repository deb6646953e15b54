/*
 * attention.h -- the attention operations' shared inside: what the launchers
 * (kernel.c, forward.c), the CPU references (reference/) and the kernel
 * templates (templates/attention/) agree on.
 *
 *   - the forward kernels' argument block, defined once in abi.def for this
 *     header and for the templates (see there how); both sides assert its
 *     size;
 *   - the argument checks every entry point shares (attention.c);
 *   - the kernel object, fg_kernel, and what every attention-family launch
 *     does with it (kernel.c): make it from a registry row, check the CUDA
 *     context, bind and pack the mod's parameters, launch an entry point
 *     with the row's geometry. An operation (forward.c; later the backward,
 *     decode, the merge) adds its own argument block, grid and launch
 *     order on top.
 */
#ifndef FLEXGEN_ATTENTION_H
#define FLEXGEN_ATTENTION_H

#include "codegen/kernels.h"
#include "driver/cudrv.h"
#include "internal.h"
#include "mod/deriv.h"

/* The first kernel argument (fga_args in the template), row by row from
 * abi.def, which the template's copy is printed from as well. */
typedef uint64_t fgi_abi_u64;
typedef int64_t fgi_abi_i64;
typedef int32_t fgi_abi_i32;
typedef float fgi_abi_f32;
typedef struct fgi_attn_abi {
#define FGI_ABI_ROW(T, ...) fgi_abi_##T __VA_ARGS__;
#include "attention/abi.def"
} fgi_attn_abi;
_Static_assert(sizeof(fgi_attn_abi) == 320, "fgi_attn_abi must match fga_args");

/* The effective scale: args->scale, or 1/sqrt(head_dim) when it is 0. */
float fgi_attn_scale(const fg_attention_args *args);

/* The checks that do not depend on where the tensors live: the struct's
 * size (fgi_attn_args_in), dtype, head dim, sizes, GQA ratio, strides (last
 * 1, none negative), offsets that keep every index the mods see inside int,
 * the scale. `strides` receives the
 * effective (b, h, s) strides of q, k, v, out (contiguous BHSD when all four
 * of a tensor's strides are zero). */
typedef struct fgi_attn_strides {
    int64_t q[3], k[3], v[3], o[3];
} fgi_attn_strides;
fg_status fgi_attn_check_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                              fgi_attn_strides *strides);

/* The caller's fg_attention_args in this library's layout (flexgen.h,
 * Conventions: struct_size). Every public entry point that takes the struct
 * reads it through this once; fgi_attn_check_args checks it as well, so
 * the references, which read the caller's struct, refuse what the GPU
 * entry points refuse (every field they read is a 0.1 field, which every
 * accepted struct has where 0.1 put it). */
fg_status fgi_attn_args_in(fg_ctx *ctx, const fg_attention_args *in, fg_attention_args *out);

/* The first argument of the backward kernels, from abi_bwd.def as
 * fgi_attn_abi is from abi.def. */
typedef struct fgi_attn_bwd_abi {
#define FGI_ABI_ROW(T, ...) fgi_abi_##T __VA_ARGS__;
#include "attention/abi_bwd.def"
} fgi_attn_bwd_abi;
_Static_assert(sizeof(fgi_attn_bwd_abi) == 480, "fgi_attn_bwd_abi must match fgb_args");

/* The fields the forward's and the backward's argument blocks share (the
 * same names in abi.def and abi_bwd.def): `abi` points at either block, `a`
 * is the forward's fg_attention_args, `st` its effective strides. */
#define FGI_ATTN_ABI_FILL_COMMON(abi, a, st)                                          \
    do {                                                                             \
        (abi)->q = (uint64_t)(uintptr_t)(a)->q;                                      \
        (abi)->k = (uint64_t)(uintptr_t)(a)->k;                                      \
        (abi)->v = (uint64_t)(uintptr_t)(a)->v;                                      \
        (abi)->out = (uint64_t)(uintptr_t)(a)->out;                                  \
        (abi)->lse = (uint64_t)(uintptr_t)(a)->lse;                                  \
        memcpy((abi)->q_stride, (st)->q, sizeof (st)->q);                            \
        memcpy((abi)->k_stride, (st)->k, sizeof (st)->k);                            \
        memcpy((abi)->v_stride, (st)->v, sizeof (st)->v);                            \
        memcpy((abi)->o_stride, (st)->o, sizeof (st)->o);                            \
        (abi)->batch = (a)->batch;                                                   \
        (abi)->heads_q = (a)->heads_q;                                               \
        (abi)->heads_kv = (a)->heads_kv;                                             \
        (abi)->q_len = (a)->q_len;                                                   \
        (abi)->kv_len = (a)->kv_len;                                                 \
        (abi)->q_offset = (a)->q_offset;                                             \
        (abi)->kv_offset = (a)->kv_offset;                                           \
        (abi)->scale = fgi_attn_scale(a);                                            \
        (abi)->scale_log2 = (float)((double)(abi)->scale * 1.4426950408889634);      \
    } while (0)

/* The block mask's geometry in either argument block (`m` an fg_block_mask
 * whose device arrays the caller has put in place). */
#define FGI_ATTN_ABI_FILL_BLOCK_MASK(abi, m)                                          \
    do {                                                                             \
        (abi)->has_block_mask = 1;                                                   \
        (abi)->bm_batch = (m)->desc.batch;                                           \
        (abi)->bm_heads = (m)->desc.heads;                                           \
        (abi)->bm_q_blocks = (m)->q_blocks;                                          \
        (abi)->bm_kv_blocks = (m)->kv_blocks;                                        \
        (abi)->bm_q_block = (m)->desc.q_block;                                       \
        (abi)->bm_kv_block = (m)->desc.kv_block;                                     \
    } while (0)

/* A launch's shared checks: fgi_attn_check_args against the kernel's
 * parameter declarations, and the call's dtype and head dim against the
 * ones the kernel was compiled for. */
fg_status fgi_attn_check_call(fg_ctx *ctx, const fg_kernel *k, const fg_attention_args *a, fgi_attn_strides *st);

/* What every forward-family kernel needs of its tensors: q, k and v moved
 * 16 bytes at a time (cp.async, their page or batch strides included), out
 * written two elements (4 bytes) at a time, lse 4-byte aligned. */
fg_status fgi_attn_check_io_aligned(fg_ctx *ctx, const fg_attention_args *a, const fgi_attn_strides *st);

/* The forward-family argument block's block-mask fields: the kv arrays on
 * the device (uploaded on first use) and the mask's geometry. The caller
 * has checked the mask against the call and its kernel's tiles. */
fg_status fgi_attn_abi_block_mask(fg_ctx *ctx, fg_block_mask *m, fgi_attn_abi *abi);

/* The argument block's per-sequence fields (kv_lens, q_offsets) and
 * paged ones (the block table, its page count and width, the page shift),
 * after checking that the int32 arrays are 4-byte aligned. The forward
 * and decode kernels read them alike (attention_common.cuh). */
fg_status fgi_attn_abi_seq(fg_ctx *ctx, const fg_attention_args *a, fgi_attn_abi *abi);

/* A paged call's page size (a power of two in [16, 256]) and page counts
 * (num_pages, max_pages >= 1). */
fg_status fgi_attn_check_pages(fg_ctx *ctx, const fg_attention_args *a);

/* Whether the call has per-sequence lengths or positions, or paged K/V. */
static inline bool fgi_attn_is_seq(const fg_attention_args *a) {
    return a->kv_lens || a->q_offsets || a->block_table;
}

/* Whether a 16-bit tensor can be moved `align` bytes at a time: the
 * pointer aligned to it and its (b, h, s) strides multiples of align / 2
 * elements. */
bool fgi_attn_aligned(const void *p, const int64_t st[3], unsigned align);
/* The same as a check: FG_ERR_SHAPE, saying which part is not. */
fg_status fgi_attn_check_aligned(fg_ctx *ctx, const char *name, const void *p, const int64_t st[3],
                                 unsigned align);

/* A [batch, heads, len, D] tensor with (b, h, s) strides `st` (elements) as
 * a TMA tensor map for the Hopper kernels: boxes of `box_rows` rows x 64
 * columns (one 128-byte swizzle line per row) that TMA copies into shared
 * memory in the swizzled layout wgmma reads; rows past len are zero-filled.
 * A layout TMA cannot describe is FG_ERR_NOT_SUPPORTED (the callers then
 * fall back to the portable kernels). */
fg_status fgi_attn_tensor_map(fg_ctx *ctx, CUtensorMap *map, fg_dtype dtype, const void *ptr, int head_dim, int len,
                              int heads, int batch, const int64_t st[3], int box_rows, const char *name);

/* Device memory for one call (the backward's delta and dQ accumulator, the
 * decode kernel's split parts), taken from and given back on the stream
 * to the library's memory pool on the device (fgi_cuda_ws_pool, which
 * keeps small workspaces mapped across synchronisations), or to the
 * device's default pool; a driver without cuMemAllocAsync gets cuMemAlloc
 * and a synchronised free. Needs fgi_cuda_ready. */
typedef struct fgi_attn_ws {
    CUdeviceptr base;
    bool async;
} fgi_attn_ws;
fg_status fgi_attn_ws_alloc(fg_ctx *ctx, fgi_attn_ws *w, size_t bytes, void *stream);
fg_status fgi_attn_ws_free(fg_ctx *ctx, fgi_attn_ws *w, void *stream);
/* A call's workspace of `bytes` at *base: the caller's (`caller`,
 * `caller_size` from the public arguments) when it is large enough, else
 * from the pool through `w` (fgi_attn_ws_free gives back only that). A
 * caller's workspace that is not 256-byte aligned is FG_ERR_SHAPE whether
 * or not the call needs one, so the mistake shows on the first call. With
 * the caller's workspace the call allocates nothing, which is what stream
 * capture into a CUDA graph wants. */
fg_status fgi_attn_ws_take(fg_ctx *ctx, fgi_attn_ws *w, const void *caller, size_t caller_size, size_t bytes,
                           void *stream, CUdeviceptr *base);
/* The workspace of a call on a forward kernel: the Hopper forward's tile
 * counter (an int zeroed before the launch; the portable forward uses
 * none), one aligned part. */
#define FGI_FWD_WORKSPACE_BYTES 256
/* A workspace part's size rounded up to 256 bytes, so the next part is
 * aligned for any access. */
static inline size_t fgi_attn_ws_round(size_t n) { return (n + 255) & ~(size_t)255; }

/* fg_kernel_get's inside (forward.c): `allow_hopper` false keeps the
 * portable row. */
fg_status fgi_attn_kernel_get(fg_ctx *ctx, const fg_mod *mod, const fg_kernel_config *config,
                              bool allow_hopper, fg_kernel **out);

/* The caller's fg_attention_bwd_args and the forward arguments it points at,
 * both in this library's layout: out->fwd points at *fwd. */
fg_status fgi_attn_bwd_args_in(fg_ctx *ctx, const fg_attention_bwd_args *in, fg_attention_bwd_args *out,
                               fg_attention_args *fwd);

/* The backward with its buffer gradients added to fixed-point sums the
 * caller owns and zeroes (sums[i] for args->grad_binds[i]:
 * FGI_BWD_SUM_BYTES per element of the binding's buffer), not rounded to
 * fp32: sums of integers, so any number of calls on any streams add up
 * exactly and in any order (context parallelism's pairs, and its ranks
 * through an int64 all-reduce). The bindings' data are not written.
 * fgi_attention_backward_sums_to_float then rounds a sum into fp32, with
 * the backward kernel of (mod, dtype, head_dim). */
#define FGI_BWD_SUM_BYTES 32 /* four int64 limbs (FGB_FIXED_LIMBS) */
/* fgi_attn_grad_binds for a backward call without a kernel (the CPU
 * reference, the sharded backward): b->fwd's parameters bound and the
 * mod's gradient layout derived first, into *L. */
fg_status fgi_attn_resolve_grads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *b, fgi_grad_layout *L,
                                 const void *out[FGI_MAX_GRAD_BUFFERS], int64_t len[FGI_MAX_GRAD_BUFFERS]);
fg_status fgi_attention_backward_into_sums(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *args,
                                           const CUdeviceptr *sums);
fg_status fgi_attention_backward_sums_to_float(fg_ctx *ctx, const fg_mod *mod, fg_dtype dtype, int head_dim,
                                               CUdeviceptr sums, float *out, int64_t n, void *stream);

/* The backward's checks besides the forward's (fgi_attn_check_args on
 * b->fwd): dout, dq, dk and dv given, their strides (effective ones in
 * `bst`), the gradient bindings' pointer. */
typedef struct fgi_attn_bwd_strides {
    int64_t dout[3], dq[3], dk[3], dv[3];
} fgi_attn_bwd_strides;
fg_status fgi_attn_check_bwd_args(fg_ctx *ctx, const fg_mod *mod, const fg_attention_bwd_args *b,
                                  fgi_attn_strides *st, fgi_attn_bwd_strides *bst);

/* The gradient bindings of a backward call resolved against the mod's
 * gradient layout `L`: out[k] receives the data pointer of the binding for
 * layout entry k (NULL: not wanted) and len[k] its length. A binding must
 * name a float buffer parameter score_mod's value depends on (in L), be a
 * float buffer binding with non-NULL data, at least `bound[param].length`
 * long, and not repeat a name: FG_ERR_UNBOUND, FG_ERR_SHAPE or
 * FG_ERR_INVALID_ARGUMENT otherwise. */
fg_status fgi_attn_grad_binds(fg_ctx *ctx, const fg_mod *mod, const fgi_grad_layout *L,
                              const fg_binding *binds, size_t nbinds, const fgi_value *bound,
                              const void *out[FGI_MAX_GRAD_BUFFERS], int64_t len[FGI_MAX_GRAD_BUFFERS]);

/* ---- the decode path (decode.c) ---------------------------------------------- */

/* Whether fg_attention_forward runs `a` (checked, in this library's
 * layout) on the decode kernel, as FG_OPT_DECODE_KERNEL says. */
bool fgi_attn_takes_decode(const fg_ctx *ctx, const fg_attention_args *a);
/* A decode launch of `a` on kernel k (its row the decode row): the
 * argument block, the entry point for the packed rows, the split count
 * and its workspace, the walk and the merge. FG_ERR_NOT_SUPPORTED for a
 * block mask the decode tiles cannot walk (fg_attention_forward then
 * takes the forward kernel for contiguous K/V). */
fg_status fgi_attn_decode_launch(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a);
/* Whether the decode tiles can walk `a`'s block mask (true without one):
 * fg_attention_forward and fg_attention_kernel_for take the forward
 * kernel for a call whose mask they cannot. */
bool fgi_attn_decode_walks(const fg_attention_args *a);
/* Whether the decode kernel at head dim 64 walks `a` over KV heads in
 * pairs (config.head_pairs): the heads are even in number with their k
 * and v rows side by side, the pairs' tiles can walk the block mask, and
 * the context asks for it (FG_OPT_DECODE_HEAD_PAIRS 1) or leaves the
 * choice (-1) and the walks are not short: no block mask, or one of a
 * mod (`mod`, may be NULL) whose mask is not local (fgi_mask_is_local). */
bool fgi_attn_decode_pairs(const fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a);
/* The workspace a decode launch of `a` (checked) by the kernel of `cfg`
 * may use, in bytes: its parts, 0 when its walk is not split. (Whether the
 * GPU merges a walk's splits in clusters, which then leave it unused, does
 * not change the size: a caller sizes it from the shapes alone.) */
fg_status fgi_attn_decode_workspace(fg_ctx *ctx, const fg_attention_args *a, const fg_kernel_config *cfg,
                                    size_t *bytes);
/* Whether a decode launch of `a` (checked) on decode kernel k runs its
 * walk's splits as thread block clusters that merge them: one launch, the
 * workspace unused. */
fg_status fgi_attn_decode_clustered(fg_ctx *ctx, const fg_attention_args *a, fg_kernel *k, bool *clustered);

/* ---- the kernel object (kernel.c) ----------------------------------------- */

/* A compiled attention-family kernel: one registry row for one mod and
 * config, every entry point of the row loaded in the CUDA context that was
 * current when it was made. It keeps its own copy of the mod's parameter
 * declarations (names, kinds, types, defaults), so binding at launch does
 * not depend on the mod object staying alive; the kernel cache keeps the
 * module loaded for the life of the process. */
struct fg_kernel {
    const fgi_kernel_entry *kernel;  /* its registry row                   */
    fg_kernel_config config;         /* defaults filled in; arch not kept  */
    fg_mod params;                   /* parameter declarations only (own
                                        arena)                             */
    int nentries;                    /* the row's entry points, in order   */
    CUfunction fn[FGI_KERNEL_MAX_ENTRIES];
    fgi_kernel_geom geom[FGI_KERNEL_MAX_ENTRIES];
    uint64_t cu_id;                  /* the CUDA context fn was loaded in  */
    fgi_grad_layout grads;           /* a row with FGI_PIECE_GRAD: the
                                        struct fg_mod_grads it takes       */
    bool index_floats;               /* its split computes the mod's
                                        (float)(kv_idx - q_idx) as a
                                        difference of floats
                                        (FGI_SPLIT_INDEX_FLOATS): launches
                                        check their indices                */
    bool dist_floats;                /* its split computes the score_mod's
                                        (float)(q_idx - kv_idx) from the
                                        tile's float distance
                                        (FGI_SPLIT_DIST_FLOATS)           */
    /* Per entry point and cluster size n (2..FGI_CLUSTER_MAX): how many
     * clusters of n of its blocks fit on the GPU at once, plus one (0: not
     * asked yet; 1: none, or the entry's code cannot run as a cluster),
     * asked once (fgi_kernel_clusters). Atomic: a kernel may be launched
     * from several threads. */
    _Atomic int clusters[FGI_KERNEL_MAX_ENTRIES][FGI_CLUSTER_MAX + 1];
};

/* How many clusters of `n` blocks (2..FGI_CLUSTER_MAX, the portable
 * cluster size) of entry point `entry` fit on the GPU at once: 0 where the
 * device, the driver or the entry's compiled code (for an arch before
 * sm_90) cannot launch it as clusters. */
int fgi_kernel_clusters(fg_ctx *ctx, fg_kernel *k, int entry, int n);
/* A launch of `entry` whose blocks form clusters of `cluster_x` along x. */
fg_status fgi_kernel_run_cluster(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], int cluster_x,
                                 void **args, void *stream);

/* The row of `asked`'s operation that serves `config` on this device
 * (needs fgi_cuda_ready). Asked for a Hopper row, the device must be
 * compute capability 9.0 with a driver that has cuTensorMapEncodeTiled
 * (FG_ERR_NOT_SUPPORTED otherwise); asked for the portable row, the
 * operation's Hopper row is taken instead when `allow_hopper`, the device
 * is such a one and the Hopper row takes `config` (fgi_kernel_applies). */
fg_status fgi_kernel_choose(fg_ctx *ctx, const fgi_kernel_entry *asked, const fg_kernel_config *config,
                            bool allow_hopper, const fgi_kernel_entry **row);

/* Make a kernel of registry row `row` for `mod` under `config` (the cache
 * compiles on a miss), load every entry point in the current CUDA context,
 * and check that the device runs it: its compute capability, and the
 * shared memory each entry point's geometry needs (the function's dynamic
 * limit is raised past 48 KB). Needs fgi_cuda_ready. *out is released with
 * fg_kernel_release. */
fg_status fgi_kernel_make(fg_ctx *ctx, const fg_mod *mod, const fgi_kernel_entry *row,
                          const fg_kernel_config *config, fg_kernel **out);

/* A kernel of operation `op` (portable row) that reads no mod (the merge,
 * the partial sums), for inputs of `dtype`: made for an identity mod kept
 * for the process. Needs nothing ready (it readies CUDA). */
fg_status fgi_kernel_make_modless(fg_ctx *ctx, fgi_kernel_op op, fg_dtype dtype, fg_kernel **out);

/* The configuration fg_attention_backward asks fg_kernel_get for (the
 * Hopper backward where it applies, else the portable one). */
fg_kernel_config fgi_attn_bwd_config(fg_dtype dtype, int head_dim);

/* The configuration fg_attention_forward asks fg_kernel_get for, for
 * arguments already in this library's layout: the decode kernel where the
 * call takes it and it takes the head dim and the block mask, else the
 * forward kernel (its ragged form for per-sequence lengths, positions or
 * paged K/V). The mod's mask picks the decode walk (fgi_attn_decode_pairs). */
fg_kernel_config fgi_attn_forward_kernel_config(const fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a);

/* What every launch checks before touching the device: CUDA is ready and
 * the current CUDA context is the one the kernel was loaded in. */
fg_status fgi_kernel_check_context(fg_ctx *ctx, const fg_kernel *k);

/* The by-value struct fg_mod_params the emitted code declares, packed. */
typedef struct fgi_param_blob {
    _Alignas(16) unsigned char bytes[FGI_PARAM_BLOB_MAX];
} fgi_param_blob;

/* Resolve the mod's parameters from `binds` (fgi_bind: defaults for
 * unbound scalars, FG_ERR_UNBOUND for a missing buffer or a wrong binding)
 * and pack them into `blob`; `bound` (FGI_MAX_PARAMS entries, may be NULL)
 * receives the resolved values. */
fg_status fgi_kernel_pack_params(fg_ctx *ctx, const fg_kernel *k, const fg_binding *binds, size_t nbinds,
                                 fgi_param_blob *blob, fgi_value *bound);

/* Queue entry point `entry` of k on `stream` (a CUstream; NULL: the default
 * stream) over `grid`, with the block size and dynamic shared memory of the
 * entry's geometry and `args` as the kernel's argument pointers. A driver
 * error is FG_ERR_CUDA, "cuLaunchKernel(<entry name>): ...". */
fg_status fgi_kernel_run(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], void **args,
                         void *stream);

/* fgi_kernel_run for an entry point that calls fga_grid_wait before it
 * reads what the launch before it on `stream` wrote: on compute
 * capability 9.0 with a driver that has cuLaunchKernelEx it is queued as
 * a programmatic dependent launch, so its blocks take the SMs that launch
 * frees (and do their own set-up) without waiting for the launch gap;
 * elsewhere an ordinary launch, where fga_grid_wait does nothing. */
fg_status fgi_kernel_run_dependent(fg_ctx *ctx, const fg_kernel *k, int entry, const unsigned grid[3], void **args,
                                   void *stream);

#endif
