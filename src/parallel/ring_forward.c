/*
 * ring_forward.c -- fg_attention_forward_cp: the forward of self-attention
 * over a sequence sharded across the ranks of an NCCL communicator.
 *
 * One call, on every rank:
 *   1. the checks, NCCL (driver/nccl.c) and what the communicator says of
 *      itself (rank, size, device);
 *   2. a block mask for every (q chunk, kv chunk) pair of the whole
 *      sequence, built on the GPU at the pair's global offsets, and its
 *      class (empty, full, partial) from the per-row block counts, copied
 *      back after one synchronisation. Every rank builds all of them, not
 *      only its own: the transfer schedule depends on which ranks need each
 *      shard, and ranks that disagreed would leave a send without its
 *      receive;
 *   3. the plan (ring_plan.c) from those classes;
 *   4. workspace from the library's pool, on the caller's stream: two
 *      receive buffers for a K/V shard, a partial (out, lse) per computed
 *      pair and an lse per q chunk;
 *   5. the ring. Step s computes its pairs on the caller's stream
 *      (fg_attention_forward over the pair's rows, offsets and block mask,
 *      into the pair's partial) while a stream of this call's sends the held
 *      shard to rank r + 1 and receives the next from rank r - 1. Shards
 *      alternate between the two receive buffers (step 0 computes on the
 *      caller's own k and v), so events order exactly what shares memory:
 *        - the transfer of step s waits for the compute of step s - 1,
 *          which read the buffer it receives into;
 *        - the compute of step s waits for the transfer of step s - 1,
 *          which filled the buffer it reads;
 *        - the first transfer waits for the caller's stream up to the call
 *          (k, v written, workspace allocated), and the workspace is given
 *          back only after the last transfer;
 *   6. per q chunk, fg_attention_merge of its partials into the caller's
 *      out (and lse: merged into a contiguous scratch row per chunk, then
 *      copied to the chunk's rows of the caller's lse, whose rows are the
 *      rank's whole local length apart);
 *   7. the pair masks freed once the caller's stream has used them: a
 *      second synchronisation (a plan object kept across calls would save
 *      both, and the masks' allocations).
 * A q chunk whose pairs are all empty still gets one (empty) pair
 * computed, so its rows come out 0 with LSE -inf as in a single-GPU call.
 *
 * Partials are in the call's dtype, so each is rounded once before the
 * merge (fp32 partials would need an fp32 output from the kernels): the
 * merged result's error is that of one more rounding.
 */
#include "parallel/ring_plan.h"

#include "attention/attention.h"
#include "base/growable.h"
#include "blockmask/blockmask.h"
#include "driver/cudrv.h"
#include "driver/nccl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CP_BLOCK 128 /* the chunks' unit: the kernels' block */

/* ---- shards ----------------------------------------------------------------------- */

fg_status fg_cp_shard_rows(fg_cp_layout layout, int world, int rank, int64_t len, int64_t starts[2],
                           int64_t lens[2], int *nchunks) {
    if (!starts || !lens || !nchunks || (layout != FG_CP_CONTIGUOUS && layout != FG_CP_ZIGZAG) || world < 1 ||
        world > FGI_RING_MAX_WORLD || rank < 0 || rank >= world)
        return FG_ERR_INVALID_ARGUMENT;
    if (len < 1 || len > INT32_MAX) return FG_ERR_SHAPE;
    fgi_ring_chunk c[FGI_RING_MAX_CHUNKS];
    fgi_ring_split(layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS, world, len, CP_BLOCK, rank, c,
                   nchunks);
    for (int i = 0; i < 2; i++) {
        starts[i] = i < *nchunks ? c[i].start : 0;
        lens[i] = i < *nchunks ? c[i].len : 0;
    }
    return FG_OK;
}

/* ---- the pair masks and their classes ---------------------------------------------- */

/* Every chunk of the sequence, by global chunk number, and a block mask and
 * class per (q chunk, kv chunk). */
typedef struct pair_masks {
    int nchunks;                       /* C: world, or 2 * world            */
    int64_t start[2 * FGI_RING_MAX_WORLD], len[2 * FGI_RING_MAX_WORLD];
    fg_block_mask **mask;              /* [C * C], NULL: no mask_mod or a 0-row side */
    fgi_ring_class *cls;               /* [C * C]                           */
} pair_masks;

static void pair_masks_free(pair_masks *pm) {
    if (pm->mask)
        for (int i = 0; i < pm->nchunks * pm->nchunks; i++) fg_block_mask_destroy(pm->mask[i]);
    free(pm->mask);
    free(pm->cls);
}

static int chunk_at(const pair_masks *pm, int64_t start, int64_t len) {
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

static fg_status build_pair_masks(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a, int world,
                                  fg_cp_layout layout, int64_t S, CUstream stream, pair_masks *pm) {
    memset(pm, 0, sizeof *pm);
    const fgi_ring_layout rl = layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS;
    for (int r = 0; r < world; r++) {
        fgi_ring_chunk c[FGI_RING_MAX_CHUNKS];
        int n = 0;
        fgi_ring_split(rl, world, S, CP_BLOCK, r, c, &n);
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
            desc.q_block = desc.kv_block = CP_BLOCK;
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
    const pair_masks *pm = user;
    const int i = chunk_at(pm, q_start, q_len), j = chunk_at(pm, kv_start, kv_len);
    if (i < 0 || j < 0) return FG_ERR_INVALID_ARGUMENT;
    *cls = pm->cls[i * pm->nchunks + j];
    return FG_OK;
}

/* ---- the call ---------------------------------------------------------------------- */

/* One partial result: the pair computed at a step, and where its rows
 * start among the partials. */
typedef struct part {
    int step, pair;
    size_t row;
} part;

typedef struct cp_call {
    fg_ctx *ctx;
    const fg_mod *mod;
    const fg_attention_args *a; /* the rank's shard                          */
    fgi_attn_strides st;        /* its element strides, checked              */
    const fgi_nccl_lib *nccl;
    void *comm;
    fgi_nccl_comm_info who;
    fgi_ring_plan *plan;
    pair_masks pm;
    CUstream stream, comm_stream;
    CUevent started, computed[2], received[2], comm_done;
    fgi_attn_ws ws;
    CUdeviceptr kv_buf[2][2];   /* [buffer][k or v]                        */
    CUdeviceptr part_out, part_lse, chunk_lse;
    part *parts;                /* select_parts                             */
    int nparts;
    size_t part_rows_total;
} cp_call;

static fg_status check_args(fg_ctx *ctx, const fg_cp_args *cp, const fg_attention_args *a) {
    FGI_CHECK_ARG(ctx, cp->comm, "NULL communicator (fg_cp_args.comm)");
    if (cp->layout != FG_CP_CONTIGUOUS && cp->layout != FG_CP_ZIGZAG)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "fg_cp_args.layout %d: FG_CP_CONTIGUOUS or FG_CP_ZIGZAG",
                         (int)cp->layout);
    if (cp->global_len < 1 || cp->global_len > INT32_MAX)
        return fgi_error(ctx, FG_ERR_SHAPE, "global_len %lld: 1 .. 2^31-1 rows", (long long)cp->global_len);
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

static fg_status setup_streams(cp_call *c) {
    const fgi_cu_api *cu = fgi_cu();
    if (!cu->cuStreamWaitEvent || !cu->cuMemcpy2DAsync)
        return fgi_error(c->ctx, FG_ERR_NOT_SUPPORTED, "the CUDA driver lacks cuStreamWaitEvent or cuMemcpy2DAsync");
    FGI_CU_TRY(c->ctx, cu->cuStreamCreate(&c->comm_stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CUevent *evs[] = {&c->started, &c->computed[0], &c->computed[1], &c->received[0], &c->received[1],
                      &c->comm_done};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        FGI_CU_TRY(c->ctx, cu->cuEventCreate(evs[i], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    return FG_OK;
}

static void teardown(cp_call *c) {
    const fgi_cu_api *cu = fgi_cu();
    /* The pair masks are read by kernels still queued on the caller's
     * stream, and freeing device memory does not wait for them. */
    if (c->pm.mask) cu->cuStreamSynchronize(c->stream);
    CUevent evs[] = {c->started, c->computed[0], c->computed[1], c->received[0], c->received[1], c->comm_done};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (evs[i]) cu->cuEventDestroy(evs[i]);
    if (c->comm_stream) cu->cuStreamDestroy(c->comm_stream); /* its work still completes */
    fgi_ring_plan_destroy(c->plan);
    pair_masks_free(&c->pm);
    free(c->parts);
}

/* The pairs this rank computes, in ring order, with the row of the
 * partials each one starts at: every non-empty pair, and for a q chunk
 * that has none (the mask hides all of its rows) one empty pair at step 0,
 * so those rows still come out 0 with LSE -inf. */
static fg_status select_parts(cp_call *c) {
    const fgi_ring_rank *rk = &c->plan->ranks[c->who.rank];
    const int N = c->plan->world;
    c->parts = calloc((size_t)N * FGI_RING_MAX_PAIRS, sizeof *c->parts);
    if (!c->parts) return fgi_error(c->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (context parallel)");
    bool has[FGI_RING_MAX_CHUNKS] = {false}, fallback[FGI_RING_MAX_CHUNKS] = {false};
    for (int s = 0; s < N; s++)
        for (int i = 0; i < rk->steps[s].npairs; i++)
            if (rk->steps[s].pairs[i].cls != FGI_RING_EMPTY) has[rk->steps[s].pairs[i].q_chunk] = true;
    size_t row = 0;
    for (int s = 0; s < N; s++)
        for (int i = 0; i < rk->steps[s].npairs; i++) {
            const fgi_ring_pair *p = &rk->steps[s].pairs[i];
            bool take = p->cls != FGI_RING_EMPTY;
            if (!take && s == 0 && !has[p->q_chunk] && !fallback[p->q_chunk] && p->q_len > 0 && p->kv_len > 0)
                take = fallback[p->q_chunk] = true;
            if (!take) continue;
            c->parts[c->nparts++] = (part){s, i, row};
            row += (size_t)p->q_len;
        }
    c->part_rows_total = row;
    return FG_OK;
}

static fg_status alloc_workspace(cp_call *c) {
    const fg_attention_args *a = c->a;
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, D = (size_t)a->head_dim;
    const size_t rows = c->part_rows_total;
    const size_t shard = (size_t)a->batch * (size_t)a->heads_kv * (size_t)c->plan->max_kv_rows * D * 2;
    const size_t chunk_rows = (size_t)c->plan->max_q_rows;
    const size_t off_out = 4 * fgi_attn_ws_round(shard), off_lse = off_out + fgi_attn_ws_round(bh * rows * D * 2),
                 off_chunk = off_lse + fgi_attn_ws_round(bh * rows * 4),
                 total = off_chunk + fgi_attn_ws_round(bh * chunk_rows * 4);
    FGI_TRY(fgi_attn_ws_alloc(c->ctx, &c->ws, total, c->stream));
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 2; t++) c->kv_buf[b][t] = c->ws.base + (CUdeviceptr)((2 * b + t) * fgi_attn_ws_round(shard));
    c->part_out = c->ws.base + off_out;
    c->part_lse = c->ws.base + off_lse;
    c->chunk_lse = c->ws.base + off_chunk;
    return FG_OK;
}

/* The transfer during step s on the comm stream. */
static fg_status transfer(cp_call *c, int s, CUdeviceptr held_k, CUdeviceptr held_v, int64_t held_rows) {
    const fgi_ring_step *st = &c->plan->ranks[c->who.rank].steps[s];
    if (!st->send && !st->recv) return FG_OK;
    const fg_attention_args *a = c->a;
    const size_t row_bytes = (size_t)a->batch * (size_t)a->heads_kv * (size_t)a->head_dim * 2;
    const int into = (s + 1) % 2;
    /* the buffer it receives into was last read by step s - 1's compute
     * (step 0 computed on the caller's k and v) */
    if (s >= 2 && st->recv) FGI_CU_TRY(c->ctx, fgi_cu()->cuStreamWaitEvent(c->comm_stream, c->computed[into], 0),
                                       "cuStreamWaitEvent");
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
        t.recv_buf[0] = (void *)(uintptr_t)c->kv_buf[into][0], t.recv_buf[1] = (void *)(uintptr_t)c->kv_buf[into][1];
        t.recv_bytes[0] = t.recv_bytes[1] = row_bytes * (size_t)rows;
    }
    FGI_TRY(fgi_nccl_ring_exchange(c->ctx, c->nccl, c->comm, &t, c->comm_stream));
    if (st->recv) FGI_CU_TRY(c->ctx, fgi_cu()->cuEventRecord(c->received[into], c->comm_stream), "cuEventRecord");
    return FG_OK;
}

/* One pair's attention into its partial (rows from `row` of the partials). */
static fg_status compute_pair(cp_call *c, const fgi_ring_pair *p, CUdeviceptr held_k, CUdeviceptr held_v,
                              int64_t held_rows, size_t row, const pair_masks *pm, int qc_global, int kc_global) {
    const fg_attention_args *a = c->a;
    const int64_t D = a->head_dim;
    fg_attention_args pa = *a;
    const int64_t *qs = c->st.q;
    pa.q = (const char *)a->q + 2 * p->q_local * qs[2];
    const int64_t q4[4] = {qs[0], qs[1], qs[2], 1};
    memcpy(pa.q_stride, q4, sizeof q4);
    pa.q_len = (int)p->q_len, pa.kv_len = (int)p->kv_len;
    pa.k = (const void *)(uintptr_t)(held_k + (CUdeviceptr)(2 * p->kv_local * D));
    pa.v = (const void *)(uintptr_t)(held_v + (CUdeviceptr)(2 * p->kv_local * D));
    const int64_t ks[4] = {(int64_t)a->heads_kv * held_rows * D, held_rows * D, D, 1};
    memcpy(pa.k_stride, ks, sizeof ks), memcpy(pa.v_stride, ks, sizeof ks);
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, rows = (size_t)c->part_rows_total;
    /* The partials' outputs: the pairs' rows back to back in one
     * [B, Hq, rows, D] block; their LSEs, contiguous [B, Hq, q_len] each,
     * back to back. */
    pa.out = (void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * row * (size_t)D));
    const int64_t os[4] = {(int64_t)(rows * (size_t)a->heads_q * (size_t)D), (int64_t)(rows * (size_t)D), D, 1};
    memcpy(pa.out_stride, os, sizeof os);
    pa.lse = (float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * row * bh));
    pa.q_offset = (int)p->q_offset, pa.kv_offset = (int)p->kv_offset;
    pa.block_mask = pm->mask[qc_global * pm->nchunks + kc_global];
    pa.stream = c->stream;
    return fg_attention_forward(c->ctx, c->mod, &pa);
}

/* The global chunk numbers of pair p at step s of this rank. */
static void pair_chunks(const cp_call *c, int s, const fgi_ring_pair *p, int *qc, int *kc) {
    const fgi_ring_rank *me = &c->plan->ranks[c->who.rank];
    const fgi_ring_rank *src = &c->plan->ranks[me->steps[s].kv_source];
    *qc = me->q[p->q_chunk].index;
    *kc = src->kv[p->kv_chunk].index;
}

static fg_status run_ring(cp_call *c) {
    const fgi_cu_api *cu = fgi_cu();
    const fgi_ring_rank *rk = &c->plan->ranks[c->who.rank];
    const int N = c->plan->world;
    FGI_CU_TRY(c->ctx, cu->cuEventRecord(c->started, c->stream), "cuEventRecord");
    FGI_CU_TRY(c->ctx, cu->cuStreamWaitEvent(c->comm_stream, c->started, 0), "cuStreamWaitEvent");
    int next = 0; /* the next of c->parts */
    for (int s = 0; s < N; s++) {
        const fgi_ring_step *st = &rk->steps[s];
        const int buf = s % 2;
        const CUdeviceptr hk = s == 0 ? (CUdeviceptr)(uintptr_t)c->a->k : c->kv_buf[buf][0];
        const CUdeviceptr hv = s == 0 ? (CUdeviceptr)(uintptr_t)c->a->v : c->kv_buf[buf][1];
        /* a rank may pass on or take a shard at a step it has nothing
         * to compute at (it sends only what it holds) */
        FGI_TRY(transfer(c, s, hk, hv, st->kv_rows));
        if (next == c->nparts || c->parts[next].step != s) continue;
        if (s >= 1) FGI_CU_TRY(c->ctx, cu->cuStreamWaitEvent(c->stream, c->received[buf], 0), "cuStreamWaitEvent");
        for (; next < c->nparts && c->parts[next].step == s; next++) {
            const fgi_ring_pair *p = &st->pairs[c->parts[next].pair];
            int qc, kc;
            pair_chunks(c, s, p, &qc, &kc);
            FGI_TRY(compute_pair(c, p, hk, hv, st->kv_rows, c->parts[next].row, &c->pm, qc, kc));
        }
        if (s >= 1) FGI_CU_TRY(c->ctx, cu->cuEventRecord(c->computed[buf], c->stream), "cuEventRecord");
    }
    FGI_CU_TRY(c->ctx, cu->cuEventRecord(c->comm_done, c->comm_stream), "cuEventRecord");
    FGI_CU_TRY(c->ctx, cu->cuStreamWaitEvent(c->stream, c->comm_done, 0), "cuStreamWaitEvent");
    return FG_OK;
}

/* Merge each q chunk's partials into the caller's out (and lse). */
static fg_status merge_chunks(cp_call *c) {
    const fg_attention_args *a = c->a;
    const fgi_ring_rank *rk = &c->plan->ranks[c->who.rank];
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, rows = c->part_rows_total, D = (size_t)a->head_dim;
    const int64_t *os = c->st.o;
    for (int qc = 0; qc < rk->nchunks; qc++) {
        const fgi_ring_chunk *ch = &rk->q[qc];
        if (ch->len == 0) continue;
        fg_merge_args m = fg_merge_args_init();
        m.batch = a->batch, m.heads = a->heads_q, m.q_len = (int)ch->len, m.head_dim = a->head_dim;
        m.dtype = a->dtype;
        for (int k = 0; k < c->nparts; k++) {
            const part *pt = &c->parts[k];
            if (rk->steps[pt->step].pairs[pt->pair].q_chunk != qc) continue;
            if (m.nparts == FG_MERGE_MAX_PARTS)
                return fgi_error(c->ctx, FG_ERR_NOT_SUPPORTED, "more than %d partial results for one chunk",
                                 FG_MERGE_MAX_PARTS);
            m.outs[m.nparts] = (const void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * pt->row * D));
            m.lses[m.nparts] = (const float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * pt->row * bh));
            m.nparts++;
        }
        const int64_t ps[4] = {(int64_t)(rows * (size_t)a->heads_q * D), (int64_t)(rows * D), (int64_t)D, 1};
        memcpy(m.part_stride, ps, sizeof ps);
        m.out = (char *)a->out + 2 * ch->local * os[2];
        const int64_t o4[4] = {os[0], os[1], os[2], 1};
        memcpy(m.out_stride, o4, sizeof o4);
        m.lse = a->lse ? (float *)(uintptr_t)c->chunk_lse : NULL;
        m.stream = c->stream;
        FGI_TRY(fg_attention_merge(c->ctx, &m));
        if (!a->lse) continue;
        /* the chunk's [B*Hq][len] LSE rows into the caller's [B*Hq][q_len] */
        CUDA_MEMCPY2D cp;
        memset(&cp, 0, sizeof cp);
        cp.srcMemoryType = cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        cp.srcDevice = c->chunk_lse;
        cp.srcPitch = (size_t)ch->len * 4;
        cp.dstDevice = (CUdeviceptr)(uintptr_t)(a->lse + ch->local);
        cp.dstPitch = (size_t)a->q_len * 4;
        cp.WidthInBytes = (size_t)ch->len * 4;
        cp.Height = bh;
        FGI_CU_TRY(c->ctx, fgi_cu()->cuMemcpy2DAsync(&cp, c->stream), "cuMemcpy2DAsync (lse)");
    }
    return FG_OK;
}

fg_status fg_attention_forward_cp(fg_ctx *ctx, const fg_mod *mod, const fg_cp_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args, "NULL mod or arguments");
    fg_cp_args cp;
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_cp_args, args, &cp));
    FGI_CHECK_ARG(ctx, cp.local, "NULL local shard (fg_cp_args.local)");
    fg_attention_args a;
    FGI_TRY(fgi_attn_args_in(ctx, cp.local, &a));
    cp_call c;
    memset(&c, 0, sizeof c);
    FGI_TRY(fgi_attn_check_args(ctx, mod, &a, &c.st));
    FGI_TRY(check_args(ctx, &cp, &a));
    c.ctx = ctx, c.mod = mod, c.a = &a, c.comm = cp.comm, c.stream = (CUstream)a.stream;
    FGI_TRY(fgi_nccl_ready(ctx, &c.nccl));
    FGI_TRY(fgi_nccl_comm_info_get(ctx, c.nccl, cp.comm, &c.who));
    FGI_TRY(fgi_cuda_ready(ctx));
    if (c.who.device != ctx->device)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "the communicator's rank %d is on device %d, the context on %d",
                         c.who.rank, c.who.device, ctx->device);
    int64_t starts[2], lens[2];
    int n = 0;
    FGI_TRY(fg_cp_shard_rows(cp.layout, c.who.size, c.who.rank, cp.global_len, starts, lens, &n));
    if (lens[0] + lens[1] != a.q_len)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "rank %d of %d holds %lld rows of %lld under this layout (fg_cp_shard_rows); the shard has %d",
                         c.who.rank, c.who.size, (long long)(lens[0] + lens[1]), (long long)cp.global_len, a.q_len);

    fg_status s = build_pair_masks(ctx, mod, &a, c.who.size, cp.layout, cp.global_len, c.stream, &c.pm);
    if (s == FG_OK) {
        fgi_ring_desc d = {0};
        d.world = c.who.size, d.q_len = d.kv_len = cp.global_len;
        d.layout = cp.layout == FG_CP_ZIGZAG ? FGI_RING_ZIGZAG : FGI_RING_CONTIGUOUS;
        d.align = CP_BLOCK, d.pair_class = class_of, d.user = &c.pm;
        s = fgi_ring_plan_create(ctx, &d, &c.plan);
    }
    if (s == FG_OK) s = select_parts(&c);
    if (s == FG_OK) s = setup_streams(&c);
    if (s == FG_OK) s = alloc_workspace(&c);
    if (s != FG_OK) {
        teardown(&c);
        return s;
    }
    s = run_ring(&c);
    if (s == FG_OK) s = merge_chunks(&c);
    /* The workspace goes back on the caller's stream after the last
     * transfer (run_ring made the stream wait for it); on an error before
     * that, after synchronising the comm stream. */
    if (s != FG_OK && c.comm_stream) fgi_cu()->cuStreamSynchronize(c.comm_stream);
    fg_status f = fgi_attn_ws_free(ctx, &c.ws, c.stream);
    teardown(&c);
    return s != FG_OK ? s : f;
}
