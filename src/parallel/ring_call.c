/*
 * ring_call.c -- the parts of a sharded call the forward and the backward
 * share (ring_call.h), and fg_cp_shard_rows.
 */
#include "parallel/ring_call.h"

#include "base/growable.h"
#include "blockmask/blockmask.h"

#include <stdlib.h>
#include <string.h>

/* ---- shards ----------------------------------------------------------------------- */

fg_status fg_cp_shard_rows(fg_cp_layout layout, int world, int rank, int64_t len, int64_t starts[2],
                           int64_t lens[2], int *nchunks) {
    if (!starts || !lens || !nchunks || (layout != FG_CP_CONTIGUOUS && layout != FG_CP_ZIGZAG) || world < 1 ||
        world > FGI_RING_MAX_WORLD || rank < 0 || rank >= world)
        return FG_ERR_INVALID_ARGUMENT;
    if (len < 1 || len > INT32_MAX) return FG_ERR_SHAPE;
    fgi_ring_chunk c[FGI_RING_MAX_CHUNKS];
    fgi_ring_split(layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS, world, len, FGI_CP_BLOCK, rank,
                   c, nchunks);
    for (int i = 0; i < 2; i++) {
        starts[i] = i < *nchunks ? c[i].start : 0;
        lens[i] = i < *nchunks ? c[i].len : 0;
    }
    return FG_OK;
}

/* ---- the pair masks and their classes ---------------------------------------------- */

static void masks_free(fgi_ring_masks *pm) {
    if (pm->mask)
        for (int i = 0; i < pm->nchunks * pm->nchunks; i++) fg_block_mask_destroy(pm->mask[i]);
    free(pm->mask);
    free(pm->cls);
    pm->mask = NULL, pm->cls = NULL;
}

static int chunk_at(const fgi_ring_masks *pm, int64_t start, int64_t len) {
    for (int i = 0; i < pm->nchunks; i++)
        if (pm->start[i] == start && pm->len[i] == len) return i;
    return -1;
}

/* The class of a mask from its per-row counts: kv_num (partial blocks) and
 * full_kv_num, int32 [B][H][q_blocks] each. */
static fg_status classify(fg_ctx *ctx, fg_block_mask *m, fgi_ring_class *cls) {
    const fg_block_mask_desc *d = &m->desc;
    const int qb = (d->q_len + d->q_block - 1) / d->q_block, kb = (d->kv_len + d->kv_block - 1) / d->kv_block;
    const size_t rows = (size_t)d->batch * (size_t)d->heads * (size_t)qb;
    int32_t *counts = malloc(2 * rows * sizeof *counts);
    if (!counts) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (context parallel)");
    uint64_t partial = 0, full = 0;
    fg_status st = fgi_block_mask_device_array(ctx, m, FG_BM_KV_NUM_BLOCKS, &partial);
    if (st == FG_OK) st = fgi_block_mask_device_array(ctx, m, FG_BM_FULL_KV_NUM_BLOCKS, &full);
    if (st == FG_OK && fgi_cu()->cuMemcpyDtoH(counts, (CUdeviceptr)partial, rows * 4) != CUDA_SUCCESS)
        st = fgi_error(ctx, FG_ERR_CUDA, "cuMemcpyDtoH (block mask counts) failed");
    if (st == FG_OK && fgi_cu()->cuMemcpyDtoH(counts + rows, (CUdeviceptr)full, rows * 4) != CUDA_SUCCESS)
        st = fgi_error(ctx, FG_ERR_CUDA, "cuMemcpyDtoH (block mask counts) failed");
    if (st == FG_OK) {
        bool any = false, all_full = true;
        for (size_t r = 0; r < rows; r++) {
            any |= counts[r] > 0 || counts[rows + r] > 0;
            all_full &= counts[r] == 0 && counts[rows + r] == kb;
        }
        *cls = !any ? FGI_RING_EMPTY : all_full ? FGI_RING_FULL : FGI_RING_PARTIAL;
    }
    free(counts);
    return st;
}

static fg_status build_masks(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, int world,
                             fg_cp_layout layout, int64_t S, CUstream stream, fgi_ring_masks *pm) {
    memset(pm, 0, sizeof *pm);
    const fgi_ring_layout rl = layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS;
    for (int r = 0; r < world; r++) {
        fgi_ring_chunk c[FGI_RING_MAX_CHUNKS];
        int n = 0;
        fgi_ring_split(rl, world, S, FGI_CP_BLOCK, r, c, &n);
        for (int i = 0; i < n; i++) pm->start[c[i].index] = c[i].start, pm->len[c[i].index] = c[i].len;
        pm->nchunks += n;
    }
    const int C = pm->nchunks;
    pm->mask = calloc((size_t)C * C, sizeof *pm->mask);
    pm->cls = calloc((size_t)C * C, sizeof *pm->cls);
    if (!pm->mask || !pm->cls) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (context parallel)");
    bool uses_b = false, uses_h = false;
    if (mod->mask) fgi_bm_mask_uses(mod, &uses_b, &uses_h);
    for (int i = 0; i < C; i++)
        for (int j = 0; j < C; j++) {
            const int k = i * C + j;
            pm->cls[k] = FGI_RING_FULL;
            if (pm->len[i] == 0 || pm->len[j] == 0) pm->cls[k] = FGI_RING_EMPTY;
            if (!mod->mask || pm->cls[k] == FGI_RING_EMPTY) continue;
            fg_block_mask_desc desc = fg_block_mask_desc_init();
            desc.batch = uses_b ? a->batch : 1, desc.heads = uses_h ? a->heads_q : 1;
            desc.q_len = (int)pm->len[i], desc.kv_len = (int)pm->len[j];
            desc.q_block = desc.kv_block = FGI_CP_BLOCK;
            desc.q_offset = (int)pm->start[i], desc.kv_offset = (int)pm->start[j];
            FGI_TRY(fg_block_mask_create_gpu(ctx, mod, &desc, a->binds, a->nbinds, stream, &pm->mask[k]));
        }
    if (!mod->mask) return FG_OK;
    FGI_CU_TRY(ctx, fgi_cu()->cuStreamSynchronize(stream), "cuStreamSynchronize (pair masks)");
    for (int k = 0; k < C * C; k++)
        if (pm->mask[k]) FGI_TRY(classify(ctx, pm->mask[k], &pm->cls[k]));
    return FG_OK;
}

/* The planner's callback: the class found for the pair of chunks that
 * start there. */
static fg_status class_of(void *user, int64_t q_start, int64_t q_len, int64_t kv_start, int64_t kv_len,
                          fgi_ring_class *cls) {
    const fgi_ring_masks *pm = user;
    const int i = chunk_at(pm, q_start, q_len), j = chunk_at(pm, kv_start, kv_len);
    if (i < 0 || j < 0) return FG_ERR_INVALID_ARGUMENT;
    *cls = pm->cls[i * pm->nchunks + j];
    return FG_OK;
}

/* ---- opening and closing ------------------------------------------------------------ */

static fg_status check_desc(fg_ctx *ctx, const fgi_ring_call_desc *d, const fg_attention_args *a) {
    FGI_CHECK_ARG(ctx, d->comm, "NULL communicator (%s.comm)", d->what);
    if (d->layout != FG_CP_CONTIGUOUS && d->layout != FG_CP_ZIGZAG)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "%s.layout %d: FG_CP_CONTIGUOUS or FG_CP_ZIGZAG", d->what,
                         (int)d->layout);
    if (d->global_len < 1 || d->global_len > INT32_MAX)
        return fgi_error(ctx, FG_ERR_SHAPE, "global_len %lld: 1 .. 2^31-1 rows", (long long)d->global_len);
    if (a->q_offset || a->kv_offset || a->block_mask || a->kv_lens || a->q_offsets || a->block_table)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "a sharded call places its pairs itself: q_offset, kv_offset, block_mask, kv_lens, "
                         "q_offsets and block_table must be unset");
    if (a->q_len != a->kv_len)
        return fgi_error(ctx, FG_ERR_SHAPE, "q_len %d and kv_len %d: a shard of self-attention has as many of each",
                         a->q_len, a->kv_len);
    const int64_t Dn = a->head_dim;
    for (int t = 0; t < 2; t++) {
        const int64_t *st = t ? a->v_stride : a->k_stride;
        const bool zero = !st[0] && !st[1] && !st[2] && !st[3];
        const bool dense = st[3] <= 1 && st[2] == Dn && st[1] == a->kv_len * Dn && st[0] == a->heads_kv * st[1];
        if (!zero && !dense)
            return fgi_error(ctx, FG_ERR_SHAPE, "%s: a shard travels as it is, so it must be contiguous [B, Hkv, rows, D]",
                             t ? "v" : "k");
    }
    return FG_OK;
}

static fg_status open_streams(fgi_ring_call *c, int nevents) {
    const fgi_cu_api *cu = fgi_cu();
    if (!cu->cuStreamWaitEvent || !cu->cuMemcpy2DAsync)
        return fgi_error(c->ctx, FG_ERR_NOT_SUPPORTED, "the CUDA driver lacks cuStreamWaitEvent or cuMemcpy2DAsync");
    FGI_CU_TRY(c->ctx, cu->cuStreamCreate(&c->comm_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (c->ctx->cp_streams == 2) {
        FGI_CU_TRY(c->ctx, cu->cuStreamCreate(&c->side_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
        FGI_CU_TRY(c->ctx, cu->cuEventCreate(&c->fork, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
        FGI_CU_TRY(c->ctx, cu->cuEventCreate(&c->join, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    }
    for (; c->nev < nevents; c->nev++)
        FGI_CU_TRY(c->ctx, cu->cuEventCreate(&c->ev[c->nev], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    return FG_OK;
}

/* Step 1 of the header's list, shared by a call and fg_cp_plan_create:
 * the checks, NCCL, the communicator, the sequence's length against the
 * ranks and the shard's, then CUDA (the checks that need no device come
 * first, so they answer the same on any machine). */
static fg_status open_comm(fg_ctx *ctx, const fg_attention_args *a, const fgi_ring_call_desc *d,
                           const fgi_nccl_lib **nccl, fgi_nccl_comm_info *who) {
    FGI_TRY(check_desc(ctx, d, a));
    FGI_TRY(fgi_nccl_ready(ctx, nccl));
    FGI_TRY(fgi_nccl_comm_info_get(ctx, *nccl, d->comm, who));
    if (who->size > FGI_RING_MAX_WORLD)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "a communicator of %d ranks: context parallelism takes 1 to %d",
                         who->size, FGI_RING_MAX_WORLD);
    /* Every rank must hold rows: a rank with none would fail its own
     * checks alone while the others started the ring and waited for it.
     * The rule reads only what every rank passes alike. */
    const int64_t units = (d->global_len + FGI_CP_BLOCK - 1) / FGI_CP_BLOCK;
    const int chunks = d->layout == FG_CP_ZIGZAG ? 2 * who->size : who->size;
    if (units < chunks)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "global_len %lld is %lld units of %d rows, fewer than the %d chunks of %d ranks under this "
                         "layout: every chunk needs a unit (at least %lld rows)",
                         (long long)d->global_len, (long long)units, FGI_CP_BLOCK, chunks, who->size,
                         (long long)(chunks - 1) * FGI_CP_BLOCK + 1);
    int64_t starts[2], lens[2];
    int n = 0;
    FGI_TRY(fg_cp_shard_rows(d->layout, who->size, who->rank, d->global_len, starts, lens, &n));
    if (lens[0] + lens[1] != a->q_len)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "rank %d of %d holds %lld rows of %lld under this layout (fg_cp_shard_rows); the shard has %d",
                         who->rank, who->size, (long long)(lens[0] + lens[1]), (long long)d->global_len, a->q_len);
    FGI_TRY(fgi_cuda_ready(ctx));
    if (who->device != ctx->device)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "the communicator's rank %d is on device %d, the context on %d",
                         who->rank, who->device, ctx->device);
    return FG_OK;
}

static void plan_free(fg_cp_plan *p) {
    if (!p) return;
    fgi_ring_plan_destroy(p->plan);
    masks_free(&p->pm);
    free(p);
}

/* Steps 2 and 3: the pair masks on `stream` (one synchronisation) and the
 * plan, for the rank `who` says. */
static fg_status plan_build(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, const fgi_ring_call_desc *d,
                            const fgi_nccl_comm_info *who, CUstream stream, fg_cp_plan **out) {
    *out = NULL;
    fg_cp_plan *p = calloc(1, sizeof *p);
    if (!p) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (context parallel)");
    p->world = who->size, p->rank = who->rank, p->device = who->device;
    p->global_len = d->global_len, p->layout = d->layout, p->mod_hash = fg_mod_hash(mod);
    p->batch = a->batch, p->heads_q = a->heads_q;
    fg_status s = build_masks(ctx, mod, a, who->size, d->layout, d->global_len, stream, &p->pm);
    if (s == FG_OK) {
        fgi_ring_desc rd = {0};
        rd.world = who->size, rd.q_len = rd.kv_len = d->global_len;
        rd.layout = d->layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS;
        rd.align = FGI_CP_BLOCK, rd.pair_class = class_of, rd.user = &p->pm;
        s = fgi_ring_plan_create(ctx, &rd, &p->plan);
    }
    if (s != FG_OK) {
        /* the masks' builds may still be queued on the stream */
        if (p->pm.mask) fgi_cu()->cuStreamSynchronize(stream);
        plan_free(p);
        return s;
    }
    *out = p;
    return FG_OK;
}

/* A caller's plan against the call it is given to. */
static fg_status check_plan(fg_ctx *ctx, const fg_cp_plan *p, const fg_mod *mod, const fg_attention_args *a,
                            const fgi_ring_call_desc *d, const fgi_nccl_comm_info *who) {
    const char *what = p->world != who->size || p->rank != who->rank ? "communicator rank and size"
                       : p->device != who->device                     ? "device"
                       : p->global_len != d->global_len               ? "global length"
                       : p->layout != d->layout                       ? "layout"
                       : p->mod_hash != fg_mod_hash(mod)              ? "mod"
                       : p->batch != a->batch || p->heads_q != a->heads_q ? "batch and query heads"
                                                                      : NULL;
    if (!what) return FG_OK;
    return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                     "%s.plan was made for another %s than this call's (rank %d of %d, device %d, %lld rows, "
                     "layout %d, batch %d, %d query heads)",
                     d->what, what, p->rank, p->world, p->device, (long long)p->global_len, (int)p->layout, p->batch,
                     p->heads_q);
}

fg_status fgi_ring_call_open(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a,
                             const fgi_attn_strides *st, const fgi_ring_call_desc *d, fgi_ring_call *c) {
    memset(c, 0, sizeof *c);
    c->ctx = ctx, c->mod = mod, c->a = a, c->st = *st, c->comm = d->comm, c->stream = (CUstream)a->stream;
    if (d->nevents < 0 || d->nevents > FGI_RING_MAX_EVENTS)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "a sharded call asked for %d events", d->nevents);
    FGI_TRY(open_comm(ctx, a, d, &c->nccl, &c->who));
    const fg_cp_plan *p = d->plan;
    if (p) FGI_TRY(check_plan(ctx, p, mod, a, d, &c->who));
    else FGI_TRY(plan_build(ctx, mod, a, d, &c->who, c->stream, &c->own));
    if (!p) p = c->own;
    c->plan = p->plan, c->pm = &p->pm;
    fg_status s = open_streams(c, d->nevents);
    if (s != FG_OK) fgi_ring_call_close(c);
    return s;
}

void fgi_ring_call_close(fgi_ring_call *c) {
    const fgi_cu_api *cu = fgi_cu();
    /* The pair masks are read by kernels still queued on the caller's
     * stream, and freeing device memory does not wait for them. */
    bool masks = false;
    for (int i = 0; c->own && c->own->pm.mask && i < c->own->pm.nchunks * c->own->pm.nchunks; i++)
        masks |= c->own->pm.mask[i] != NULL;
    if (masks) {
        cu->cuStreamSynchronize(c->stream);
        if (c->side_stream) cu->cuStreamSynchronize(c->side_stream); /* after an error, not joined */
    }
    for (int i = 0; i < c->nev; i++) cu->cuEventDestroy(c->ev[i]);
    c->nev = 0;
    if (c->comm_stream) cu->cuStreamDestroy(c->comm_stream); /* its work still completes */
    if (c->side_stream) cu->cuStreamDestroy(c->side_stream);
    if (c->fork) cu->cuEventDestroy(c->fork);
    if (c->join) cu->cuEventDestroy(c->join);
    c->comm_stream = c->side_stream = NULL;
    c->fork = c->join = NULL;
    plan_free(c->own);
    c->own = NULL, c->plan = NULL, c->pm = NULL;
}

fg_status fg_cp_plan_create(fg_ctx *ctx, const fg_mod *mod, const fg_cp_args *args, fg_cp_plan **out) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args && out, "NULL mod, arguments or output");
    *out = NULL;
    fg_cp_args cp;
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_cp_args, args, &cp));
    FGI_CHECK_ARG(ctx, cp.local, "NULL local shard (fg_cp_args.local)");
    FGI_CHECK_ARG(ctx, !cp.plan, "fg_cp_plan_create takes the arguments of a call without a plan");
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, cp.local, &a));
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, mod, &a, &st));
    const fgi_ring_call_desc d = {cp.comm, cp.global_len, cp.layout, NULL, "fg_cp_args", 0};
    const fgi_nccl_lib *nccl;
    fgi_nccl_comm_info who;
    FGI_TRY(open_comm(ctx, &a, &d, &nccl, &who));
    fg_cp_plan *p;
    FGI_TRY(plan_build(ctx, mod, &a, &d, &who, (CUstream)a.stream, &p));
    /* the masks' builds are done (plan_build synchronised after them when
     * the mod has a mask_mod, and there is nothing to build otherwise) */
    *out = p;
    return FG_OK;
}

void fg_cp_plan_destroy(fg_cp_plan *plan) { plan_free(plan); }

/* ---- pairs and the K/V step --------------------------------------------------------- */

void fgi_ring_pair_chunks(const fgi_ring_call *c, int s, const fgi_ring_pair *p, int *qc, int *kc) {
    const fgi_ring_rank *me = &c->plan->ranks[c->who.rank];
    const fgi_ring_rank *src = &c->plan->ranks[me->steps[s].kv_source];
    *qc = me->q[p->q_chunk].index;
    *kc = src->kv[p->kv_chunk].index;
}

void fgi_ring_pair_args(const fgi_ring_call *c, int s, const fgi_ring_pair *p, CUdeviceptr held_k,
                        CUdeviceptr held_v, int64_t held_rows, fg_attention_args *pa) {
    const fg_attention_args *a = c->a;
    const int64_t D = a->head_dim;
    *pa = *a;
    const int64_t *qs = c->st.q, *os = c->st.o;
    pa->q = (const char *)a->q + 2 * p->q_local * qs[2];
    const int64_t q4[4] = {qs[0], qs[1], qs[2], 1};
    memcpy(pa->q_stride, q4, sizeof q4);
    if (a->out) {
        pa->out = (char *)a->out + 2 * p->q_local * os[2];
        const int64_t o4[4] = {os[0], os[1], os[2], 1};
        memcpy(pa->out_stride, o4, sizeof o4);
    }
    pa->lse = NULL;
    pa->q_len = (int)p->q_len, pa->kv_len = (int)p->kv_len;
    pa->k = (const void *)(uintptr_t)(held_k + (CUdeviceptr)(2 * p->kv_local * D));
    pa->v = (const void *)(uintptr_t)(held_v + (CUdeviceptr)(2 * p->kv_local * D));
    const int64_t ks[4] = {(int64_t)a->heads_kv * held_rows * D, held_rows * D, D, 1};
    memcpy(pa->k_stride, ks, sizeof ks), memcpy(pa->v_stride, ks, sizeof ks);
    pa->q_offset = (int)p->q_offset, pa->kv_offset = (int)p->kv_offset;
    int qc, kc;
    fgi_ring_pair_chunks(c, s, p, &qc, &kc);
    pa->block_mask = c->pm->mask[qc * c->pm->nchunks + kc];
    pa->stream = c->stream;
}

fg_status fgi_ring_kv_transfer(fgi_ring_call *c, int s, CUdeviceptr held_k, CUdeviceptr held_v, int64_t held_rows,
                               CUdeviceptr recv_k, CUdeviceptr recv_v, CUevent free_event, CUevent arrived_event) {
    const fgi_ring_step *st = &c->plan->ranks[c->who.rank].steps[s];
    if (!st->send && !st->recv) return FG_OK;
    const fg_attention_args *a = c->a;
    const size_t row_bytes = (size_t)a->batch * (size_t)a->heads_kv * (size_t)a->head_dim * 2;
    if (st->recv && free_event)
        FGI_CU_TRY(c->ctx, fgi_cu()->cuStreamWaitEvent(c->comm_stream, free_event, 0), "cuStreamWaitEvent");
    fgi_nccl_transfer t;
    memset(&t, 0, sizeof t);
    t.next = (c->who.rank + 1) % c->who.size;
    t.prev = (c->who.rank + c->who.size - 1) % c->who.size;
    if (st->send) {
        t.nsend = 2;
        t.send_buf[0] = (const void *)(uintptr_t)held_k, t.send_buf[1] = (const void *)(uintptr_t)held_v;
        t.send_bytes[0] = t.send_bytes[1] = row_bytes * (size_t)held_rows;
    }
    if (st->recv) {
        const int64_t rows = c->plan->ranks[c->who.rank].steps[s + 1].kv_rows;
        t.nrecv = 2;
        t.recv_buf[0] = (void *)(uintptr_t)recv_k, t.recv_buf[1] = (void *)(uintptr_t)recv_v;
        t.recv_bytes[0] = t.recv_bytes[1] = row_bytes * (size_t)rows;
    }
    FGI_TRY(fgi_nccl_ring_exchange(c->ctx, c->nccl, c->comm, &t, c->comm_stream));
    if (st->recv) FGI_CU_TRY(c->ctx, fgi_cu()->cuEventRecord(arrived_event, c->comm_stream), "cuEventRecord");
    return FG_OK;
}

fg_status fgi_ring_join(fgi_ring_call *c, CUevent ev, bool caller_waits_for_comm) {
    const fgi_cu_api *cu = fgi_cu();
    CUstream from = caller_waits_for_comm ? c->comm_stream : c->stream;
    CUstream to = caller_waits_for_comm ? c->stream : c->comm_stream;
    FGI_CU_TRY(c->ctx, cu->cuEventRecord(ev, from), "cuEventRecord");
    FGI_CU_TRY(c->ctx, cu->cuStreamWaitEvent(to, ev, 0), "cuStreamWaitEvent");
    return FG_OK;
}

fg_status fgi_ring_copy_rows(fgi_ring_call *c, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch,
                             size_t width, size_t height) {
    if (width == 0 || height == 0) return FG_OK;
    CUDA_MEMCPY2D cp;
    memset(&cp, 0, sizeof cp);
    cp.srcMemoryType = cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    cp.srcDevice = src;
    cp.srcPitch = src_pitch;
    cp.dstDevice = dst;
    cp.dstPitch = dst_pitch;
    cp.WidthInBytes = width;
    cp.Height = height;
    FGI_CU_TRY(c->ctx, fgi_cu()->cuMemcpy2DAsync(&cp, c->stream), "cuMemcpy2DAsync");
    return FG_OK;
}

fg_status fgi_ring_load_kernel_modless(fgi_ring_call *c, fgi_kernel_op op) {
    fg_kernel *k;
    FGI_TRY(fgi_kernel_make_modless(c->ctx, op, c->a->dtype, &k));
    fg_kernel_release(k);
    return FG_OK;
}

fg_status fgi_ring_fork(fgi_ring_call *c) {
    if (!c->side_stream) return FG_OK;
    FGI_CU_TRY(c->ctx, fgi_cu()->cuEventRecord(c->fork, c->stream), "cuEventRecord");
    FGI_CU_TRY(c->ctx, fgi_cu()->cuStreamWaitEvent(c->side_stream, c->fork, 0), "cuStreamWaitEvent");
    return FG_OK;
}

fg_status fgi_ring_join_side(fgi_ring_call *c) {
    if (!c->side_stream) return FG_OK;
    FGI_CU_TRY(c->ctx, fgi_cu()->cuEventRecord(c->join, c->side_stream), "cuEventRecord");
    FGI_CU_TRY(c->ctx, fgi_cu()->cuStreamWaitEvent(c->stream, c->join, 0), "cuStreamWaitEvent");
    return FG_OK;
}

CUstream fgi_ring_stream_of(const fgi_ring_call *c, int qc) {
    return qc == 1 && c->side_stream ? c->side_stream : c->stream;
}

void fgi_ring_drain(fgi_ring_call *c) {
    if (c->comm_stream) fgi_cu()->cuStreamSynchronize(c->comm_stream);
    if (c->side_stream) fgi_cu()->cuStreamSynchronize(c->side_stream);
}
