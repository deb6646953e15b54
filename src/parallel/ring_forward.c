/*
 * ring_forward.c -- fg_attention_forward_cp: the forward of self-attention
 * over a sequence sharded across the ranks of an NCCL communicator.
 *
 * One call, on every rank:
 *   1. what every sharded call does first (ring_call.c): the checks, the
 *      communicator, the pair masks and their classes and the plan (or the
 *      caller's fg_cp_plan), a stream for NCCL;
 *   2. workspace from the library's pool, on the caller's stream: two
 *      receive buffers for a K/V shard, a partial (out, lse) per computed
 *      pair and an lse per q chunk;
 *   3. the ring. Step s computes its pairs on the caller's stream (those
 *      of the second q chunk on a side stream, FG_OPT_CP_STREAMS 2:
 *      fgi_ring_fork / fgi_ring_join_side around the step) with
 *      fg_attention_forward over the pair's rows, offsets and block mask,
 *      into the pair's partial, while the comm stream sends the held shard
 *      to rank r + 1 and receives the next from rank r - 1. Shards
 *      alternate between the two receive buffers (step 0 computes on the
 *      caller's own k and v), so events order exactly what shares memory:
 *        - the transfer of step s waits for the compute of step s - 1,
 *          which read the buffer it receives into;
 *        - the compute of step s waits for the transfer of step s - 1,
 *          which filled the buffer it reads;
 *        - the first transfer waits for the caller's stream up to the call
 *          (k, v written, workspace allocated), and the workspace is given
 *          back only after the last transfer;
 *   4. per q chunk, fg_attention_merge of its partials (in groups of 16
 *      where there are more, each group's result a part of the next) into
 *      the caller's out (and lse: merged into a contiguous scratch row per chunk, then
 *      copied to the chunk's rows of the caller's lse, whose rows are the
 *      rank's whole local length apart);
 *   5. closing the call (without a caller's plan, its second
 *      synchronisation, before the pair masks are freed).
 * A q chunk whose pairs are all empty still gets one (empty) pair
 * computed, so its rows come out 0 with LSE -inf as in a single-GPU call.
 *
 * Partials are in the call's dtype, so each is rounded once before the
 * merge (fp32 partials would need an fp32 output from the kernels): the
 * merged result's error is that of one more rounding.
 */
#include "parallel/ring_call.h"

#include "base/growable.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- the call ---------------------------------------------------------------------- */

/* One partial result: the pair computed at a step, and where its rows
 * start among the partials. */
typedef struct part {
    int step, pair;
    size_t row;
} part;

/* The forward's events, in the call's event array. */
enum { EV_STARTED, EV_COMPUTED0, EV_COMPUTED1, EV_RECEIVED0, EV_RECEIVED1, EV_COMM_DONE, NEVENTS };

typedef struct cp_call {
    fgi_ring_call r;
    fgi_attn_ws ws;
    CUdeviceptr kv_buf[2][2];   /* [buffer][k or v]                        */
    CUdeviceptr part_out, part_lse, chunk_lse;
    part *parts;                /* select_parts                             */
    int nparts;
    size_t part_rows_total;     /* the pairs' partials, then the scratch    */
    size_t scratch_row, scratch_rows; /* two scratch parts of scratch_rows
                                   rows from scratch_row (grouped merges)   */
    int group;                  /* parts per merge                          */
} cp_call;

/* The pairs this rank computes, in ring order, with the row of the
 * partials each one starts at: every non-empty pair, and for a q chunk
 * that has none (the mask hides all of its rows) one empty pair at step 0,
 * so those rows still come out 0 with LSE -inf. */
static fg_status select_parts(cp_call *c) {
    const fgi_ring_call *r = &c->r;
    const fgi_ring_rank *rk = &r->plan->ranks[r->who.rank];
    const int N = r->plan->world;
    c->parts = calloc((size_t)N * FGI_RING_MAX_PAIRS, sizeof *c->parts);
    if (!c->parts) return fgi_error(r->ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (context parallel)");
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
    /* A q chunk with more parts than one merge takes (FG_MERGE_MAX_PARTS,
     * or the test hook's smaller group) merges in groups, each group's
     * result a part of the next: two scratch parts of the longest chunk's
     * rows after the pairs' partials. */
    c->group = FG_MERGE_MAX_PARTS;
    const char *hook = getenv("FLEXGEN_TEST_CP_MERGE_PARTS"); /* tests: groups of 2.. parts */
    if (hook && atoi(hook) >= 2 && atoi(hook) < FG_MERGE_MAX_PARTS) c->group = atoi(hook);
    c->scratch_row = row;
    for (int qc = 0; qc < rk->nchunks; qc++) {
        int n = 0;
        for (int k = 0; k < c->nparts; k++) n += rk->steps[c->parts[k].step].pairs[c->parts[k].pair].q_chunk == qc;
        if (n > c->group && c->scratch_rows < (size_t)rk->q[qc].len) c->scratch_rows = (size_t)rk->q[qc].len;
    }
    c->part_rows_total = row + 2 * c->scratch_rows;
    return FG_OK;
}

static fg_status alloc_workspace(cp_call *c) {
    const fg_attention_args *a = c->r.a;
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, D = (size_t)a->head_dim;
    const size_t rows = c->part_rows_total;
    const size_t shard = (size_t)a->batch * (size_t)a->heads_kv * (size_t)c->r.plan->max_kv_rows * D * 2;
    const size_t chunk_rows = (size_t)c->r.plan->max_q_rows;
    const size_t off_out = 4 * fgi_attn_ws_round(shard), off_lse = off_out + fgi_attn_ws_round(bh * rows * D * 2),
                 off_chunk = off_lse + fgi_attn_ws_round(bh * rows * 4),
                 total = off_chunk + fgi_attn_ws_round(bh * chunk_rows * 4);
    FGI_TRY(fgi_attn_ws_alloc(c->r.ctx, &c->ws, total, c->r.stream));
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 2; t++) c->kv_buf[b][t] = c->ws.base + (CUdeviceptr)((2 * b + t) * fgi_attn_ws_round(shard));
    c->part_out = c->ws.base + off_out;
    c->part_lse = c->ws.base + off_lse;
    c->chunk_lse = c->ws.base + off_chunk;
    return FG_OK;
}

/* One pair's attention arguments, writing its partial (rows from `row` of
 * the partials). */
static void pair_call_args(cp_call *c, int s, const fgi_ring_pair *p, CUdeviceptr held_k, CUdeviceptr held_v,
                           int64_t held_rows, size_t row, fg_attention_args *out) {
    const fg_attention_args *a = c->r.a;
    const int64_t D = a->head_dim;
    fg_attention_args pa;
    fgi_ring_pair_args(&c->r, s, p, held_k, held_v, held_rows, &pa);
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, rows = (size_t)c->part_rows_total;
    /* The partials' outputs: the pairs' rows back to back in one
     * [B, Hq, rows, D] block; their LSEs, contiguous [B, Hq, q_len] each,
     * back to back. */
    pa.out = (void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * row * (size_t)D));
    const int64_t os[4] = {(int64_t)(rows * (size_t)a->heads_q * (size_t)D), (int64_t)(rows * (size_t)D), D, 1};
    memcpy(pa.out_stride, os, sizeof os);
    pa.lse = (float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * row * bh));
    pa.stream = fgi_ring_stream_of(&c->r, p->q_chunk);
    *out = pa;
}

/* One pair's attention into its partial. */
static fg_status compute_pair(cp_call *c, int s, const fgi_ring_pair *p, CUdeviceptr held_k, CUdeviceptr held_v,
                              int64_t held_rows, size_t row) {
    fg_attention_args pa;
    pair_call_args(c, s, p, held_k, held_v, held_rows, row, &pa);
    return fg_attention_forward(c->r.ctx, c->r.mod, &pa);
}

/* Every kernel the ring and the merges will launch, made and loaded before
 * the first transfer (fgi_ring_load_kernel_modless says why): the merge's
 * and the pairs'. The pairs' kernel depends on a pair's rows and block
 * mask (fgi_attn_forward_kernel_config), so each distinct configuration
 * among them is made once. */
static fg_status load_kernels(cp_call *c) {
    const fgi_ring_rank *rk = &c->r.plan->ranks[c->r.who.rank];
    const CUdeviceptr k = (CUdeviceptr)(uintptr_t)c->r.a->k, v = (CUdeviceptr)(uintptr_t)c->r.a->v;
    fg_kernel_config made[4];
    int nmade = 0;
    for (int i = 0; i < c->nparts; i++) {
        const fgi_ring_step *st = &rk->steps[c->parts[i].step];
        fg_attention_args pa;
        pair_call_args(c, c->parts[i].step, &st->pairs[c->parts[i].pair], k, v, st->kv_rows, c->parts[i].row, &pa);
        const fg_kernel_config cfg = fgi_attn_forward_kernel_config(c->r.ctx, c->r.mod, &pa);
        bool seen = false; /* the rest of the configuration is the call's */
        for (int j = 0; j < nmade && !seen; j++)
            seen = made[j].kind == cfg.kind && made[j].q_block == cfg.q_block && made[j].kv_block == cfg.kv_block &&
                   made[j].ragged == cfg.ragged;
        if (seen) continue;
        if (nmade < (int)(sizeof made / sizeof made[0])) made[nmade++] = cfg;
        fg_kernel *kern;
        FGI_TRY(fg_kernel_get(c->r.ctx, c->r.mod, &cfg, &kern));
        fg_kernel_release(kern);
    }
    return fgi_ring_load_kernel_modless(&c->r, FGI_KOP_ATTENTION_MERGE);
}

static fg_status run_ring(cp_call *c) {
    fgi_ring_call *r = &c->r;
    const fgi_cu_api *cu = fgi_cu();
    const fgi_ring_rank *rk = &r->plan->ranks[r->who.rank];
    const int N = r->plan->world;
    FGI_TRY(fgi_ring_join(r, r->ev[EV_STARTED], false));
    int next = 0; /* the next of c->parts */
    for (int s = 0; s < N; s++) {
        const fgi_ring_step *st = &rk->steps[s];
        const int buf = s % 2, into = (s + 1) % 2;
        const CUdeviceptr hk = s == 0 ? (CUdeviceptr)(uintptr_t)r->a->k : c->kv_buf[buf][0];
        const CUdeviceptr hv = s == 0 ? (CUdeviceptr)(uintptr_t)r->a->v : c->kv_buf[buf][1];
        /* a rank may pass on or take a shard at a step it has nothing
         * to compute at (it sends only what it holds); the buffer it
         * receives into was last read by step s - 1's compute (step 0
         * computed on the caller's k and v) */
        FGI_TRY(fgi_ring_kv_transfer(r, s, hk, hv, st->kv_rows, c->kv_buf[into][0], c->kv_buf[into][1],
                                     s >= 2 ? r->ev[EV_COMPUTED0 + into] : NULL, r->ev[EV_RECEIVED0 + into]));
        if (next == c->nparts || c->parts[next].step != s) continue;
        if (s >= 1)
            FGI_CU_TRY(r->ctx, cu->cuStreamWaitEvent(r->stream, r->ev[EV_RECEIVED0 + buf], 0), "cuStreamWaitEvent");
        FGI_TRY(fgi_ring_fork(r));
        for (; next < c->nparts && c->parts[next].step == s; next++)
            FGI_TRY(compute_pair(c, s, &st->pairs[c->parts[next].pair], hk, hv, st->kv_rows, c->parts[next].row));
        FGI_TRY(fgi_ring_join_side(r));
        if (s >= 1) FGI_CU_TRY(r->ctx, cu->cuEventRecord(r->ev[EV_COMPUTED0 + buf], r->stream), "cuEventRecord");
    }
    return fgi_ring_join(r, r->ev[EV_COMM_DONE], true);
}

/* Merge each q chunk's partials into the caller's out (and lse). */
static fg_status merge_chunks(cp_call *c) {
    const fgi_ring_call *r = &c->r;
    const fg_attention_args *a = r->a;
    const fgi_ring_rank *rk = &r->plan->ranks[r->who.rank];
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q, rows = c->part_rows_total, D = (size_t)a->head_dim;
    const int64_t *os = r->st.o;
    for (int qc = 0; qc < rk->nchunks; qc++) {
        const fgi_ring_chunk *ch = &rk->q[qc];
        if (ch->len == 0) continue;
        const int64_t ps[4] = {(int64_t)(rows * (size_t)a->heads_q * D), (int64_t)(rows * D), (int64_t)D, 1};
        const int64_t o4[4] = {os[0], os[1], os[2], 1};
        int k = 0, stage = 0;
        size_t acc = SIZE_MAX; /* the row of the previous group's result */
        for (;;) {
            fg_merge_args m = fg_merge_args_init();
            m.batch = a->batch, m.heads = a->heads_q, m.q_len = (int)ch->len, m.head_dim = a->head_dim;
            m.dtype = a->dtype;
            memcpy(m.part_stride, ps, sizeof ps);
            m.stream = r->stream;
            if (acc != SIZE_MAX) {
                m.outs[0] = (const void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * acc * D));
                m.lses[0] = (const float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * acc * bh));
                m.nparts = 1;
            }
            for (; k < c->nparts && m.nparts < c->group; k++) {
                const part *pt = &c->parts[k];
                if (rk->steps[pt->step].pairs[pt->pair].q_chunk != qc) continue;
                m.outs[m.nparts] = (const void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * pt->row * D));
                m.lses[m.nparts] = (const float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * pt->row * bh));
                m.nparts++;
            }
            bool more = false; /* another part of this chunk left */
            for (int j = k; j < c->nparts && !more; j++)
                more = rk->steps[c->parts[j].step].pairs[c->parts[j].pair].q_chunk == qc;
            if (!more) {
                m.out = (char *)a->out + 2 * ch->local * os[2];
                memcpy(m.out_stride, o4, sizeof o4);
                m.lse = a->lse ? (float *)(uintptr_t)c->chunk_lse : NULL;
                FGI_TRY(fg_attention_merge(r->ctx, &m));
                break;
            }
            /* a group's result: the next group's first part (its LSE kept
             * too, and never in the buffer this merge reads) */
            const size_t into = c->scratch_row + (size_t)stage * c->scratch_rows;
            m.out = (void *)(uintptr_t)(c->part_out + (CUdeviceptr)(2 * into * D));
            memcpy(m.out_stride, ps, sizeof ps);
            m.lse = (float *)(uintptr_t)(c->part_lse + (CUdeviceptr)(4 * into * bh));
            FGI_TRY(fg_attention_merge(r->ctx, &m));
            acc = into, stage ^= 1;
        }
        if (!a->lse) continue;
        /* the chunk's [B*Hq][len] LSE rows into the caller's [B*Hq][q_len] */
        FGI_TRY(fgi_ring_copy_rows(&c->r, (CUdeviceptr)(uintptr_t)(a->lse + ch->local), (size_t)a->q_len * 4,
                                   c->chunk_lse, (size_t)ch->len * 4, (size_t)ch->len * 4, bh));
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
    fgi_attn_strides st;
    FGI_TRY(fgi_attn_check_args(ctx, mod, &a, &st));
    /* What the pairs' kernels and the merge need, checked on every rank
     * before the ring: a rank failing inside it alone would leave its
     * peers waiting. */
    FGI_TRY(fgi_attn_check_aligned(ctx, "q", a.q, st.q, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "k", a.k, st.k, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "v", a.v, st.v, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "out", a.out, st.o, 2));
    if ((uintptr_t)a.lse % 4) return fgi_error(ctx, FG_ERR_SHAPE, "lse must be 4-byte aligned");
    cp_call c;
    memset(&c, 0, sizeof c);
    const fgi_ring_call_desc d = {cp.comm, cp.global_len, cp.layout, cp.plan, "fg_cp_args", NEVENTS};
    FGI_TRY(fgi_ring_call_open(ctx, mod, &a, &st, &d, &c.r));
    fg_status s = select_parts(&c);
    if (s == FG_OK) s = alloc_workspace(&c);
    if (s == FG_OK) s = load_kernels(&c);
    if (s == FG_OK) s = run_ring(&c);
    if (s == FG_OK) s = merge_chunks(&c);
    /* The workspace goes back on the caller's stream after the last
     * transfer (run_ring made the stream wait for it); on an error before
     * that, after draining the call's own streams. */
    if (s != FG_OK) fgi_ring_drain(&c.r);
    fg_status f = c.ws.base ? fgi_attn_ws_free(ctx, &c.ws, c.r.stream) : FG_OK;
    fgi_ring_call_close(&c.r);
    free(c.parts);
    return s != FG_OK ? s : f;
}
