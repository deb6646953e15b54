/*
 * blockmask_gpu.c -- the GPU block-mask builder: fg_block_mask_create_gpu
 * and fg_block_mask_rebuild_gpu.
 *
 * The kernels come from templates/blockmask/blockmask.cuh with the mask's emitted
 * fg_mask_mod spliced in (the registry's block-mask row, FG_KERNEL_BLOCK_MASK);
 * both entry points live in one cached module, so the second lookup is a
 * memory hit.
 * A build is two launches on the caller's stream -- classify every tile
 * into a byte map, then compact rows and columns into the eight arrays --
 * with nothing in between that waits for the host. Scalar parameters and
 * buffer pointers travel in the by-value fg_mod_params argument, which is
 * why a document mask can be rebuilt each batch from new device buffers
 * with no compile and no allocation: rebuild only repacks that struct and
 * launches again into the memory the mask already owns. A mask that reads
 * neither b nor h is classified for one (b, h) and the compaction fans it
 * out (see blockmask.c).
 */
#include "blockmask/blockmask.h"
#include "codegen/codegen.h"

#include <stdlib.h>
#include <string.h>

#define BM_WARPS_PER_BLOCK 8 /* FG_BM_WARPS in the template */

typedef struct bm_kernels {
    CUfunction classify, compact;
} bm_kernels;

/* The spec for (mod, block sizes), kept in the mask. It is reused only for
 * the very mod object it was made for: the spec's source generator refers
 * to that object, and a caller passing the pointer vouches it is alive
 * (the hash guards against another mod at a recycled address). */
static fg_status mask_spec(fg_ctx *ctx, const fg_mod *mod, fg_block_mask *m, fgi_codegen **out) {
    if (m->cg && m->cg_mod == mod && m->cg_hash == mod->hash) {
        *out = m->cg;
        return FG_OK;
    }
    if (!m->cg && !(m->cg = calloc(1, sizeof *m->cg)))
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (block mask)");
    fgi_codegen_free(m->cg);
    m->cg_mod = NULL;
    fg_kernel_config cfg = fg_kernel_config_init();
    cfg.q_block = m->desc.q_block;
    cfg.kv_block = m->desc.kv_block;
    FGI_TRY(fgi_codegen_init_kernel(ctx, mod, fgi_kernel_lookup(FGI_KOP_BLOCK_MASK, FGI_VARIANT_PORTABLE),
                                    &cfg, m->cg));
    m->cg_mod = mod;
    m->cg_hash = mod->hash;
    *out = m->cg;
    return FG_OK;
}

static fg_status get_kernels(fg_ctx *ctx, const fg_mod *mod, fg_block_mask *m, bm_kernels *k) {
    fgi_codegen *cg = NULL;
    FGI_TRY(mask_spec(ctx, mod, m, &cg));
    fgi_kernel_spec spec = cg->spec;
    spec.entry = cg->kernel->entries[FGI_BM_CLASSIFY];
    FGI_TRY(fgi_cache_get_function(ctx, &spec, &k->classify));
    spec.entry = cg->kernel->entries[FGI_BM_COMPACT];
    return fgi_cache_get_function(ctx, &spec, &k->compact);
}

static unsigned grid_for(int64_t warps) {
    return (unsigned)((warps + BM_WARPS_PER_BLOCK - 1) / BM_WARPS_PER_BLOCK);
}

/* The word after the counts in the pinned copy: the sequence number of
 * the last build whose counts have landed. */
static uint32_t *counts_landed_word(const fg_block_mask *m) {
    const int64_t n = m->count[fgi_bm_slot(FG_BM_Q_NUM_BLOCKS)] + m->count[fgi_bm_slot(FG_BM_FULL_Q_NUM_BLOCKS)];
    return (uint32_t *)(m->counts_host + n);
}

/* Copy the transposed counts of the build just queued on `stream` into
 * the mask's pinned host memory behind it, then the build's sequence
 * number into the word after them (blockmask.h says who reads them and
 * how). Best effort: without the driver's pinned memory, inside a stream
 * capture (the copy would land only when the graph runs), or on any
 * failure here, the counts are simply not there and the build goes on.
 * The memory and the event are made at the first GPU build of the mask, so
 * a rebuild allocates nothing. */
static void queue_counts(fg_block_mask *m, CUstream stream) {
    const fgi_cu_api *cu = fgi_cu();
    m->counts_queued = false;
    if (!cu->cuMemAllocHost || !cu->cuMemFreeHost) return;
    if (cu->cuStreamIsCapturing) {
        CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
        if (cu->cuStreamIsCapturing(stream, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE) return;
    }
    const int qn = fgi_bm_slot(FG_BM_Q_NUM_BLOCKS), fqn = fgi_bm_slot(FG_BM_FULL_Q_NUM_BLOCKS);
    const size_t qn_bytes = (size_t)m->count[qn] * sizeof(int32_t);
    const size_t fqn_bytes = (size_t)m->count[fqn] * sizeof(int32_t);
    if (!m->counts_host) {
        void *p = NULL;
        if (cu->cuMemAllocHost(&p, qn_bytes + fqn_bytes + sizeof(uint32_t)) != CUDA_SUCCESS) return;
        m->counts_host = p;
        counts_landed_word(m)[0] = 0;
    }
    if (!m->counts_event) {
        CUevent e = NULL;
        if (cu->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return;
        m->counts_event = e;
    }
    const uint32_t seq = m->counts_seq + 1 ? m->counts_seq + 1 : 1; /* never 0, the word's first value */
    /* pinned memory is addressable by the device under unified addressing:
     * the memset writes the word through that address */
    if (cu->cuMemcpyDtoHAsync(m->counts_host, (CUdeviceptr)m->device[qn], qn_bytes, stream) != CUDA_SUCCESS ||
        cu->cuMemcpyDtoHAsync(m->counts_host + m->count[qn], (CUdeviceptr)m->device[fqn], fqn_bytes, stream) !=
            CUDA_SUCCESS ||
        cu->cuMemsetD32Async((CUdeviceptr)(uintptr_t)counts_landed_word(m), seq, 1, stream) != CUDA_SUCCESS ||
        cu->cuEventRecord((CUevent)m->counts_event, stream) != CUDA_SUCCESS)
        return;
    m->counts_seq = seq;
    m->counts_queued = true;
}

bool fgi_block_mask_counts(const fg_block_mask *mask, const int32_t **q_num, const int32_t **full_q_num) {
    if (mask->host_valid) {
        *q_num = mask->host[fgi_bm_slot(FG_BM_Q_NUM_BLOCKS)];
        *full_q_num = mask->host[fgi_bm_slot(FG_BM_FULL_Q_NUM_BLOCKS)];
        return true;
    }
    if (!mask->counts_queued) return false;
    /* The copies and the memset run in order on one stream: the word holds
     * this build's number only once both copies have landed. The acquire
     * keeps the counts' reads after the word's. */
    if (__atomic_load_n(counts_landed_word(mask), __ATOMIC_ACQUIRE) != mask->counts_seq) return false;
    *q_num = mask->counts_host;
    *full_q_num = mask->counts_host + mask->count[fgi_bm_slot(FG_BM_Q_NUM_BLOCKS)];
    return true;
}

/* Queue the two kernels for mask m with the given parameter values. */
static fg_status launch(fg_ctx *ctx, const fg_mod *mod, const bm_kernels *k, fg_block_mask *m,
                        const fgi_value *values, CUstream stream) {
    fgi_param_layout layout;
    fgi_param_layout_compute(mod, &layout);
    /* The kernel takes fg_mod_params by value; the driver copies
     * layout.size bytes from here, so 8-byte alignment is all it needs. */
    uint64_t blob[(FGI_PARAM_BLOB_MAX + 7) / 8];
    if (layout.size > sizeof blob)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "parameter struct of %zu bytes is too large",
                         layout.size);
    fgi_param_pack(mod, &layout, values, blob);

    const fg_block_mask_desc *d = &m->desc;
    bool uses_b, uses_h;
    fgi_bm_mask_uses(mod, &uses_b, &uses_h);
    int B = d->batch, H = d->heads, QB = m->q_blocks, KB = m->kv_blocks;
    int per_b = uses_b, per_h = uses_h;
    int cb = per_b ? B : 1, ch = per_h ? H : 1; /* the (b, h) classified */
    int q_len = d->q_len, kv_len = d->kv_len, q_off = d->q_offset, kv_off = d->kv_offset;
    CUdeviceptr tiles = (CUdeviceptr)m->tiles;
    void *classify_args[] = {blob, &cb, &ch, &q_len, &kv_len, &q_off, &kv_off, &QB, &KB, &tiles};
    int64_t classified = (int64_t)cb * ch * QB * KB;
    FGI_CU_TRY(ctx,
               fgi_cu()->cuLaunchKernel(k->classify, grid_for(classified), 1, 1,
                                        BM_WARPS_PER_BLOCK * 32, 1, 1, 0, stream, classify_args,
                                        NULL),
               "cuLaunchKernel (block mask classify)");

    CUdeviceptr a[FGI_BM_NARRAYS];
    for (int i = 0; i < FGI_BM_NARRAYS; i++) a[i] = (CUdeviceptr)m->device[i];
    void *compact_args[] = {&B, &H, &per_b, &per_h, &QB, &KB, &tiles, &a[0], &a[1],
                            &a[2], &a[3], &a[4], &a[5], &a[6], &a[7]};
    int64_t lists = (int64_t)B * H * (QB + KB);
    FGI_CU_TRY(ctx,
               fgi_cu()->cuLaunchKernel(k->compact, grid_for(lists), 1, 1,
                                        BM_WARPS_PER_BLOCK * 32, 1, 1, 0, stream, compact_args,
                                        NULL),
               "cuLaunchKernel (block mask compact)");
    m->device_valid = true;
    m->host_valid = false;
    queue_counts(m, stream);
    return FG_OK;
}

static fg_status alloc_tiles(fg_ctx *ctx, fg_block_mask *m) {
    if (m->tiles) return FG_OK;
    CUdeviceptr p = 0;
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&p, (size_t)m->count[1]), "cuMemAlloc (tile map)");
    m->tiles = (uint64_t)p;
    return FG_OK;
}

static fg_status create_gpu(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *norm,
                            const fgi_value *values, CUstream stream, fg_block_mask **out) {
    bm_kernels k;
    fg_block_mask *m;
    FGI_TRY(fgi_bm_new(ctx, norm, &m));
    /* kernels first: a compile error leaves no device memory behind */
    fg_status st = get_kernels(ctx, mod, m, &k);
    if (st == FG_OK) st = fgi_bm_alloc_device(ctx, m);
    if (st == FG_OK) st = alloc_tiles(ctx, m);
    if (st == FG_OK) st = launch(ctx, mod, &k, m, values, stream);
    if (st != FG_OK) {
        fg_block_mask_destroy(m);
        return st;
    }
    m->mod_hash = mod->hash;
    *out = m;
    return FG_OK;
}

fg_status fg_block_mask_create_gpu(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc,
                                   const fg_binding *binds, size_t nbinds, void *stream,
                                   fg_block_mask **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    fg_block_mask_desc norm;
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bm_create_args(ctx, mod, desc, binds, nbinds, out, &norm, values));
    FGI_TRY(fgi_cuda_ready(ctx));
    FGI_TRY(create_gpu(ctx, mod, &norm, values, (CUstream)stream, out));
    fgi_clear_error(ctx);
    return FG_OK;
}

fg_status fg_block_mask_rebuild_gpu(fg_ctx *ctx, fg_block_mask *mask, const fg_mod *mod,
                                    const fg_binding *binds, size_t nbinds, void *stream) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mask && mod, "NULL block mask or mod");
    fgi_value values[FGI_MAX_PARAMS];
    FGI_TRY(fgi_bind(ctx, mod, binds, nbinds, values));
    FGI_TRY(fgi_cuda_ready(ctx));
    if (mask->device_block && mask->cu_device != ctx->device)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "block mask lives on device %d, the context uses device %d",
                         mask->cu_device, ctx->device);
    bm_kernels k;
    FGI_TRY(get_kernels(ctx, mod, mask, &k));
    /* A mask made on the host gets its device memory once, here; a mask
     * made by fg_block_mask_create_gpu already has it. */
    FGI_TRY(fgi_bm_alloc_device(ctx, mask));
    FGI_TRY(alloc_tiles(ctx, mask));
    FGI_TRY(launch(ctx, mod, &k, mask, values, (CUstream)stream));
    mask->mod_hash = mod->hash;
    fgi_clear_error(ctx);
    return FG_OK;
}
