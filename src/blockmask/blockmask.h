/*
 * blockmask.h -- the inside of fg_block_mask, for the kernels that consume
 * block masks (attention.c) and for the builders (blockmask.c,
 * blockmask_gpu.c).
 *
 * One block mask is eight int32 arrays in FlexAttention's layout (see
 * fg_block_mask_array in flexgen.h). They are kept as one contiguous block
 * of memory, on the host and/or on the device, in the order of the enum:
 *
 *   KV_NUM_BLOCKS       [B][H][QB]        partial kv blocks per q block
 *   KV_INDICES          [B][H][QB][KB]    their kv block indices, ascending
 *   FULL_KV_NUM_BLOCKS  [B][H][QB]
 *   FULL_KV_INDICES     [B][H][QB][KB]
 *   Q_NUM_BLOCKS        [B][H][KB]        the transposes (backward pass)
 *   Q_INDICES           [B][H][KB][QB]
 *   FULL_Q_NUM_BLOCKS   [B][H][KB]
 *   FULL_Q_INDICES      [B][H][KB][QB]
 *
 * with B = desc.batch, H = desc.heads (1 = broadcast over the attention's
 * batch / heads), QB = ceil(q_len / q_block), KB = ceil(kv_len / kv_block).
 * Entries of an index row past its count are 0.
 *
 * A consumer at (b, h, qb) of the attention reads
 *     mb = (B == 1 ? 0 : b), mh = (H == 1 ? 0 : h),
 *     row = (mb * H + mh) * QB + qb,
 * kv_num_blocks[row] partial blocks kv_indices[row * KB + i] (mask_mod must
 * be evaluated inside, and positions past kv_len / q_len masked) and
 * full_kv_num_blocks[row] full blocks full_kv_indices[row * KB + i] (no
 * mask_mod; positions past the lengths still masked by the kernel).
 */
#ifndef FLEXGEN_BLOCKMASK_H
#define FLEXGEN_BLOCKMASK_H

#include "internal.h"

#define FGI_BM_NARRAYS 8

struct fg_block_mask {
    fg_block_mask_desc desc;  /* block sizes filled in (never 0)               */
    int q_blocks, kv_blocks;  /* QB, KB                                        */
    int64_t count[FGI_BM_NARRAYS];  /* elements per array, in enum order - 1 */
    int64_t offset[FGI_BM_NARRAYS]; /* element offset of each array in the
                                       contiguous block                       */
    int64_t total;            /* elements in all eight arrays                  */

    /* Host copy: one malloc'd block; host[i] points into it. */
    int32_t *host_block;
    int32_t *host[FGI_BM_NARRAYS];
    bool host_valid;

    /* Device copy: one cuMemAlloc'd block; device[i] points into it. The
     * pointers are CUdeviceptr values (kept as uint64_t so this header does
     * not need cuda.h). `tiles` is the GPU builder's scratch: one byte per
     * (b, h, q block, kv block) tile, 0 empty / 1 partial / 2 full. */
    uint64_t device_block;
    uint64_t device[FGI_BM_NARRAYS];
    bool device_valid;
    uint64_t tiles;
    int cu_device;            /* the device ordinal the memory belongs to     */
    /* The transposed counts of the last GPU build (Q_NUM_BLOCKS then
     * FULL_Q_NUM_BLOCKS, then one word), copied into pinned host memory
     * behind the build on its stream; a memset then writes counts_seq into
     * that last word, so the host sees the copy landed by reading it, with
     * no driver call (an event query is not allowed while another stream
     * is being captured into a graph). The backward orders its dK/dV pass
     * by them (attention/bwd_order.c) once they have landed and never waits
     * for them: a mask built on the GPU and not downloaded would otherwise
     * leave it grid order. counts_queued: a copy of the current device
     * arrays was queued (not for a build captured into a graph, nor where
     * the driver has no pinned memory); counts_event, recorded after it,
     * is what freeing the memory waits for. */
    int32_t *counts_host;
    void *counts_event;       /* CUevent                                      */
    uint32_t counts_seq;
    bool counts_queued;

    /* The hash of the mod the arrays were built from (0: from_kv_blocks). */
    uint64_t mod_hash;
    /* The GPU builder's kernel spec for `cg_mod` (owned; NULL until the
     * first GPU build). Making one hashes the templates, which costs more
     * than a whole build, so a rebuild with the same mod reuses it. */
    struct fgi_codegen *cg;
    const fg_mod *cg_mod;
    uint64_t cg_hash;
};

/* Whether the mod's mask_mod keeps only keys near a late query (a sliding
 * window, with a few leading keys at most), judged by sampling it at its
 * parameters' defaults (reach.c says how, and what for) on the first call,
 * then remembered in the mod: at most FGI_LOCAL_NEAR_BLOCKS blocks of 128
 * keys among the 16384 up to the query and FGI_LOCAL_FIRST_BLOCKS among
 * the sequence's first 1024. false without a mask_mod, with buffer
 * parameters, or where evaluating it fails. */
#define FGI_LOCAL_NEAR_BLOCKS 16
#define FGI_LOCAL_FIRST_BLOCKS 2
bool fgi_mask_is_local(const fg_mod *mod);

/* Array `which` (fg_block_mask_array) as a 0-based slot. */
static inline int fgi_bm_slot(fg_block_mask_array which) { return (int)which - 1; }

/* Check that `mask` can serve an attention call of batch x heads with the
 * given lengths and block sizes: its B is 1 or batch, its H is 1 or heads
 * (for GQA pass heads_q: the mask is per query head), q_len / kv_len and the
 * block sizes equal. FG_ERR_SHAPE with a message naming the mismatch. */
fg_status fgi_block_mask_check(fg_ctx *ctx, const fg_block_mask *mask, int batch, int heads,
                               int q_len, int kv_len, int q_block, int kv_block);

/* Make sure the mask's arrays are on the device (uploading the host copy
 * when needed; needs fgi_cuda_ready) and return the device pointer of one
 * array. */
fg_status fgi_block_mask_device_array(fg_ctx *ctx, fg_block_mask *mask, fg_block_mask_array which,
                                      uint64_t *ptr);

/* The transposed counts, Q_NUM_BLOCKS and FULL_Q_NUM_BLOCKS, on the host
 * without waiting for the GPU: the host arrays where valid, else the copy
 * behind the last GPU build once it has landed. false when neither is
 * there yet (the caller goes without them). */
bool fgi_block_mask_counts(const fg_block_mask *mask, const int32_t **q_num, const int32_t **full_q_num);

/* ---- shared between blockmask.c (host) and blockmask_gpu.c (device) ---- */

/* Validate desc, fill defaults into *norm and compute the geometry. */
fg_status fgi_bm_normalise(fg_ctx *ctx, const fg_block_mask_desc *desc, fg_block_mask_desc *norm);
/* The common start of fg_block_mask_create and fg_block_mask_create_gpu:
 * NULL checks (clearing *out), the normalised shape, the bound values. */
fg_status fgi_bm_create_args(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc,
                             const fg_binding *binds, size_t nbinds, fg_block_mask **out,
                             fg_block_mask_desc *norm, fgi_value *values);
/* A new block mask with the geometry of a normalised desc and no storage. */
fg_status fgi_bm_new(fg_ctx *ctx, const fg_block_mask_desc *norm, fg_block_mask **out);
/* Allocate the host block (zeroed) if not there yet. */
fg_status fgi_bm_alloc_host(fg_ctx *ctx, fg_block_mask *m);
/* Allocate the device block (not zeroed) if not there yet; needs
 * fgi_cuda_ready. */
fg_status fgi_bm_alloc_device(fg_ctx *ctx, fg_block_mask *m);
/* Whether the mod's mask_mod reads b / h at all. When it does not, every
 * batch entry / head has the same block mask: the builders classify the
 * tiles of one and copy the lists to the others. */
void fgi_bm_mask_uses(const fg_mod *mod, bool *uses_b, bool *uses_h);
/* Free the device memory of m (needs no ready context: best effort). */
void fgi_bm_free_device(fg_block_mask *m);

#endif
