/*
 * ring_backward.c -- fg_attention_backward_cp: the backward of
 * fg_attention_forward_cp over the same ring.
 *
 * Every pair (q chunk, kv chunk) the forward computed has a backward:
 * fg_attention_backward over the pair's rows with the forward's merged out
 * and lse (so P and delta are the whole sequence's, and no softmax state
 * crosses ranks), giving the pair's share of dQ (for the rank's q rows) and
 * of dK, dV (for the held shard's rows, which belong to another rank).
 *
 * The schedule is the forward's (ring_call.c: the same pair masks, plan,
 * skipped pairs and skipped transfers), with each shard's dK / dV
 * travelling beside its K / V as fp32 running sums:
 *
 *   step s at rank r, holding shard o = r - s:
 *     comm:    K/V group (as the forward): send K_o, V_o on, receive the
 *              next shard's (step s + 1's) K/V
 *     compute: the pairs' backward (into bf16/fp16 temporaries), each
 *              pair's dQ added to the rank's fp32 dQ sum at once (a
 *              step's second q chunk on a side stream, FG_OPT_CP_STREAMS
 *              2, each chunk's dQ staying on its own stream); then,
 *              once the running dK_o / dV_o from rank r - 1 are here,
 *              run_o += the pairs' dK / dV
 *     comm:    dK/dV group: run_o on to rank r + 1, or, after the shard's
 *              last use, straight home to rank o; receive the next
 *              shard's running sums from rank r - 1 (and, at the step
 *              rank r's own shard is last used elsewhere, its sums from
 *              that rank)
 *
 * So the K/V transfer of step s + 1 overlaps step s's compute as in the
 * forward, and the dK/dV transfer of step s overlaps step s + 1's pair
 * kernels: only the small adds of step s + 1 wait for it. Events order
 * what shares memory:
 *   - the pair kernels of step s wait for step s - 1's K/V group, which
 *     filled the buffer they read (KV_RECEIVED);
 *   - the K/V group of step s waits, before receiving into a buffer, for
 *     the pair kernels of step s - 1 that read it (KV_COMPUTED);
 *   - the adds of step s wait for step s - 1's dK/dV group, which brought
 *     the sums they add to (DKV_RECEIVED); the dK/dV group of step s waits
 *     for those adds before sending (DKV_READY); a receive into the other
 *     sum buffer follows, on the comm stream, the send of step s - 1 that
 *     read it;
 *   - the final stores wait for the home receive (HOME_RECEIVED), and the
 *     caller's stream for all of the comm stream's work before the
 *     workspace goes back.
 * NCCL groups are posted in the same order on every rank (K/V of step 0,
 * dK/dV of step 0, K/V of step 1, ...) and every send meets its receive in
 * the group of the same name and step, so no rank waits on a group its
 * peer posts later.
 *
 * Precision: each pair's gradients are rounded to the dtype once (the
 * backward kernels write it), then summed in fp32 and rounded once more
 * into the caller's dq, dk, dv. Gradients of buffer parameters (a learnt
 * bias table, ALiBi slopes) are exact: every pair adds its share to one
 * fixed-point sum per buffer (fgi_attention_backward_into_sums), with
 * grads_summed the ranks' sums are added by an int64 all-reduce, and the
 * sum is rounded to fp32 once; the result does not depend on the order of
 * anything.
 */
#include "parallel/partial_sum.h"
#include "parallel/ring_call.h"

#include "base/growable.h"

#include <stdlib.h>
#include <string.h>

enum {
    EV_STARTED,
    EV_KV_COMPUTED0,
    EV_KV_COMPUTED1,
    EV_KV_RECEIVED0,
    EV_KV_RECEIVED1,
    EV_DKV_READY0,
    EV_DKV_READY1,
    EV_DKV_RECEIVED0,
    EV_DKV_RECEIVED1,
    EV_HOME_RECEIVED,
    EV_GRADS_READY,
    EV_COMM_DONE,
    NEVENTS
};

typedef struct bwd_call {
    fgi_ring_call r;
    const fg_attention_bwd_args *b; /* the shard's backward, library layout */
    fgi_attn_bwd_strides bs;
    fgi_attn_ws ws;
    int64_t chunk_rows;          /* the longest chunk: the temporaries' rows */
    CUdeviceptr kv_buf[2][2];    /* [buffer][k or v], the dtype              */
    CUdeviceptr run[2][2];       /* [buffer][dk or dv], fp32 running sums of
                                    the held shard, [B][Hkv][max_kv_rows][D] */
    CUdeviceptr home[2];         /* fp32 sums of the rank's own shard when
                                    they come back from another rank        */
    CUdeviceptr dq_sum;          /* fp32 [B][Hq][q_rows][D]                  */
    CUdeviceptr lse, dlse;       /* per q chunk, contiguous [B*Hq][len]      */
    CUdeviceptr t_dq[FGI_RING_MAX_CHUNKS]; /* a pair's dQ per q chunk (its
                                    stream's), the dtype                    */
    CUdeviceptr t_dk[FGI_RING_MAX_PAIRS], t_dv[FGI_RING_MAX_PAIRS];
    /* Buffer gradients: one fixed-point sum per gradient binding, added to
     * by every pair on either stream (integer sums: exact in any order),
     * summed across the ranks at the end, then rounded into the binding's
     * fp32 data. */
    int ngrads;
    CUdeviceptr gsum[FGI_MAX_GRAD_BUFFERS];
    int64_t glen[FGI_MAX_GRAD_BUFFERS];
    bool dq_started[FGI_RING_MAX_CHUNKS];
    int home_step, home_from;    /* the step and rank the own shard's sums
                                    come back at / from; 0: they never leave */
} bwd_call;

static const fgi_ring_rank *me(const bwd_call *c) { return &c->r.plan->ranks[c->r.who.rank]; }

static fg_status alloc_workspace(bwd_call *c) {
    const fg_attention_args *a = c->r.a;
    const fgi_ring_plan *p = c->r.plan;
    const size_t B = (size_t)a->batch, Hq = (size_t)a->heads_q, Hkv = (size_t)a->heads_kv, D = (size_t)a->head_dim;
    c->chunk_rows = 0;
    for (int i = 0; i < c->r.pm->nchunks; i++)
        if (c->r.pm->len[i] > c->chunk_rows) c->chunk_rows = c->r.pm->len[i];
    const size_t kv_rows = (size_t)p->max_kv_rows, q_rows = (size_t)a->q_len, own = (size_t)a->kv_len;
    const size_t shard = fgi_attn_ws_round(B * Hkv * kv_rows * D * 2);
    const size_t run = fgi_attn_ws_round(B * Hkv * kv_rows * D * 4);
    const size_t home = c->home_step > 0 ? fgi_attn_ws_round(B * Hkv * own * D * 4) : 0;
    const size_t dq = fgi_attn_ws_round(B * Hq * q_rows * D * 4);
    const size_t lse = fgi_attn_ws_round(B * Hq * q_rows * 4);
    const size_t dlse = c->b->dlse ? lse : 0;
    const size_t tq = fgi_attn_ws_round(B * Hq * (size_t)c->chunk_rows * D * 2);
    const size_t tkv = fgi_attn_ws_round(B * Hkv * (size_t)c->chunk_rows * D * 2);
    size_t sums = 0;
    for (int i = 0; i < c->ngrads; i++) sums += fgi_attn_ws_round((size_t)c->glen[i] * FGI_BWD_SUM_BYTES);
    const size_t total = 4 * shard + 4 * run + 2 * home + dq + lse + dlse + FGI_RING_MAX_CHUNKS * tq +
                         2 * FGI_RING_MAX_PAIRS * tkv + sums;
    FGI_TRY(fgi_attn_ws_alloc(c->r.ctx, &c->ws, total, c->r.stream));
    CUdeviceptr at = c->ws.base;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 2; t++) c->kv_buf[i][t] = at, at += shard;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < 2; t++) c->run[i][t] = at, at += run;
    for (int t = 0; t < 2; t++) c->home[t] = home ? at : 0, at += home;
    c->dq_sum = at, at += dq;
    c->lse = at, at += lse;
    c->dlse = dlse ? at : 0, at += dlse;
    for (int i = 0; i < FGI_RING_MAX_CHUNKS; i++) c->t_dq[i] = at, at += tq;
    for (int i = 0; i < FGI_RING_MAX_PAIRS; i++) c->t_dk[i] = at, at += tkv, c->t_dv[i] = at, at += tkv;
    for (int i = 0; i < c->ngrads; i++) {
        c->gsum[i] = at;
        const size_t bytes = (size_t)c->glen[i] * FGI_BWD_SUM_BYTES;
        FGI_CU_TRY(c->r.ctx, fgi_cu()->cuMemsetD8Async(at, 0, bytes, c->r.stream), "cuMemsetD8Async");
        at += fgi_attn_ws_round(bytes);
    }
    return FG_OK;
}

/* The caller's lse (and dlse) rows of each q chunk, contiguous per chunk
 * as a pair's backward reads them: chunk qc at [B*Hq][its start]. */
static fg_status gather_lse(bwd_call *c) {
    const fg_attention_args *a = c->r.a;
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q;
    for (int qc = 0; qc < me(c)->nchunks; qc++) {
        const fgi_ring_chunk *ch = &me(c)->q[qc];
        const size_t w = (size_t)ch->len * 4, off = bh * (size_t)ch->local * 4;
        FGI_TRY(fgi_ring_copy_rows(&c->r, c->lse + off, w, (CUdeviceptr)(uintptr_t)(a->lse + ch->local),
                                   (size_t)a->q_len * 4, w, bh));
        if (c->dlse)
            FGI_TRY(fgi_ring_copy_rows(&c->r, c->dlse + off, w, (CUdeviceptr)(uintptr_t)(c->b->dlse + ch->local),
                                       (size_t)a->q_len * 4, w, bh));
    }
    return FG_OK;
}

/* Element strides (b, h, row) of a contiguous [B][H][rows][D] tensor. */
static void dense3(int64_t out[3], int heads, int64_t rows, int64_t D) {
    out[2] = D, out[1] = rows * D, out[0] = (int64_t)heads * rows * D;
}

static void dense4(int64_t out[4], int heads, int64_t rows, int64_t D) {
    dense3(out, heads, rows, D);
    out[3] = 1;
}

/* A sum over [B][heads][rows][D] in this call's dtype and stream. */
static fgi_sum_args sum_args(const bwd_call *c, int heads, int64_t rows) {
    fgi_sum_args s;
    memset(&s, 0, sizeof s);
    s.dtype = c->r.a->dtype;
    s.batch = c->r.a->batch, s.heads = heads, s.rows = (int)rows, s.head_dim = c->r.a->head_dim;
    s.stream = c->r.stream;
    return s;
}

/* Pair p of step s (held shard's k and v at hk, hv): its backward into the
 * temporaries of slot `slot`, and its dQ added to the rank's sum. */
static fg_status pair_backward(bwd_call *c, int s, const fgi_ring_pair *p, CUdeviceptr hk, CUdeviceptr hv,
                               int slot) {
    const fg_attention_args *a = c->r.a;
    const int64_t D = a->head_dim;
    const size_t bh = (size_t)a->batch * (size_t)a->heads_q;
    const fgi_ring_chunk *qch = &me(c)->q[p->q_chunk];
    fg_attention_args pa;
    fgi_ring_pair_args(&c->r, s, p, hk, hv, me(c)->steps[s].kv_rows, &pa);
    pa.lse = (float *)(uintptr_t)(c->lse + bh * (size_t)qch->local * 4); /* pairs cover whole chunks */
    pa.stream = fgi_ring_stream_of(&c->r, p->q_chunk);
    fg_attention_bwd_args pb = fg_attention_bwd_args_init();
    pb.fwd = &pa;
    const int64_t *ds = c->bs.dout;
    pb.dout = (const char *)c->b->dout + 2 * p->q_local * ds[2];
    const int64_t d4[4] = {ds[0], ds[1], ds[2], 1};
    memcpy(pb.dout_stride, d4, sizeof d4);
    pb.dq = (void *)(uintptr_t)c->t_dq[p->q_chunk];
    dense4(pb.dq_stride, a->heads_q, p->q_len, D);
    pb.dk = (void *)(uintptr_t)c->t_dk[slot];
    pb.dv = (void *)(uintptr_t)c->t_dv[slot];
    dense4(pb.dk_stride, a->heads_kv, p->kv_len, D);
    memcpy(pb.dv_stride, pb.dk_stride, sizeof pb.dk_stride);
    pb.dlse = c->dlse ? (const float *)(uintptr_t)(c->dlse + bh * (size_t)qch->local * 4) : NULL;
    pb.deterministic = c->b->deterministic;
    if (c->ngrads) {
        pb.grad_binds = c->b->grad_binds, pb.ngrad_binds = c->b->ngrad_binds;
        FGI_TRY(fgi_attention_backward_into_sums(c->r.ctx, c->r.mod, &pb, c->gsum));
    } else {
        FGI_TRY(fg_attention_backward(c->r.ctx, c->r.mod, &pb));
    }

    /* dQ of the q chunk's rows: sum += this pair's (pairs cover whole
     * chunks, so p->q_local is the chunk's first row) */
    fgi_sum_args sq = sum_args(c, a->heads_q, p->q_len);
    sq.nparts = 1, sq.parts[0] = pb.dq;
    dense3(sq.part_stride, a->heads_q, p->q_len, D);
    dense3(sq.acc_stride, a->heads_q, a->q_len, D);
    float *dst = (float *)(uintptr_t)(c->dq_sum + 4 * (size_t)p->q_local * (size_t)D);
    sq.acc_in = c->dq_started[p->q_chunk] ? dst : NULL;
    sq.acc_out = dst;
    sq.stream = pa.stream;
    c->dq_started[p->q_chunk] = true;
    return fgi_partial_sum(c->r.ctx, &sq);
}

/* Every kernel the ring and what follows it launch, made and loaded
 * before the first transfer (fgi_ring_load_kernel_modless says why): the
 * pairs' backward, one module for all its passes, as fg_attention_backward
 * chooses it (where the Hopper one refuses a pair, the portable one is
 * still made inside the ring), and the partial sums. */
static fg_status load_kernels(bwd_call *c) {
    const fg_kernel_config cfg = fgi_attn_bwd_config(c->r.a->dtype, c->r.a->head_dim);
    fg_kernel *k;
    FGI_TRY(fg_kernel_get(c->r.ctx, c->r.mod, &cfg, &k));
    fg_kernel_release(k);
    return fgi_ring_load_kernel_modless(&c->r, FGI_KOP_PARTIAL_SUM);
}

/* After step s's pairs: the held shard's running dK / dV += its pairs'
 * contributions, per kv chunk of the shard. Into run[s % 2] (on top of the
 * received sums from step 1 on), or, for the rank's own shard when it
 * never travels, straight into the caller's dk, dv. */
static fg_status add_dkv(bwd_call *c, int s, const int slot_of[FGI_RING_MAX_PAIRS]) {
    const fg_attention_args *a = c->r.a;
    const fgi_ring_step *st = &me(c)->steps[s];
    const int64_t D = a->head_dim, held = st->kv_rows;
    const bool final_here = !st->send && st->kv_source == c->r.who.rank;
    const fgi_ring_rank *src = &c->r.plan->ranks[st->kv_source];
    for (int j = 0; j < src->nchunks; j++) {
        const fgi_ring_chunk *kch = &src->kv[j];
        if (kch->len == 0) continue;
        const void *dk_parts[2], *dv_parts[2];
        int n = 0;
        for (int i = 0; i < st->npairs; i++)
            if (slot_of[i] >= 0 && st->pairs[i].kv_chunk == j) {
                dk_parts[n] = (const void *)(uintptr_t)c->t_dk[slot_of[i]];
                dv_parts[n] = (const void *)(uintptr_t)c->t_dv[slot_of[i]];
                n++;
            }
        /* from step 1 on, a chunk nobody here touched already holds its sum */
        if (n == 0 && s >= 1) continue;
        for (int t = 0; t < 2; t++) {
            fgi_sum_args sk = sum_args(c, a->heads_kv, kch->len);
            sk.nparts = n;
            for (int i = 0; i < n; i++) sk.parts[i] = t ? dv_parts[i] : dk_parts[i];
            dense3(sk.part_stride, a->heads_kv, kch->len, D);
            if (final_here) {
                const int64_t *os = t ? c->bs.dv : c->bs.dk;
                sk.out = (char *)(t ? c->b->dv : c->b->dk) + 2 * kch->local * os[2];
                memcpy(sk.out_stride, os, sizeof sk.out_stride);
            } else {
                float *dst = (float *)(uintptr_t)(c->run[s % 2][t] + 4 * (size_t)kch->local * (size_t)D);
                dense3(sk.acc_stride, a->heads_kv, held, D);
                sk.acc_in = s >= 1 ? dst : NULL;
                sk.acc_out = dst;
            }
            FGI_TRY(fgi_partial_sum(c->r.ctx, &sk));
        }
    }
    return FG_OK;
}

/* The dK/dV group of step s on the comm stream (fgi_ring_sum_msgs). */
static fg_status dkv_transfer(bwd_call *c, int s, bool added) {
    fgi_ring_call *r = &c->r;
    const fg_attention_args *a = r->a;
    const size_t row_bytes = (size_t)a->batch * (size_t)a->heads_kv * (size_t)a->head_dim * 4;
    fgi_ring_msg msgs[FGI_RING_MAX_MSGS];
    const int nmsg = fgi_ring_sum_msgs(r->plan, r->who.rank, s, msgs);
    if (nmsg == 0) return FG_OK;
    _Static_assert(2 * FGI_RING_MAX_MSGS <= FGI_NCCL_MAX_OPS, "a dK/dV step fits one group");
    fgi_nccl_op ops[FGI_NCCL_MAX_OPS];
    int n = 0;
    bool next = false, mine = false;
    for (int i = 0; i < nmsg; i++) {
        const fgi_ring_msg *m = &msgs[i];
        for (int t = 0; t < 2; t++) {
            CUdeviceptr buf = c->run[s % 2][t]; /* the held shard's sums */
            if (m->kind == FGI_RING_SUM_NEXT) buf = c->run[(s + 1) % 2][t];
            if (m->kind == FGI_RING_SUM_MINE) buf = c->home[t];
            ops[n++] = (fgi_nccl_op){m->send, m->peer, (void *)(uintptr_t)buf, row_bytes * (size_t)m->rows};
        }
        next |= m->kind == FGI_RING_SUM_NEXT;
        mine |= m->kind == FGI_RING_SUM_MINE;
    }
    if (added)
        FGI_CU_TRY(r->ctx, fgi_cu()->cuStreamWaitEvent(r->comm_stream, r->ev[EV_DKV_READY0 + s % 2], 0),
                   "cuStreamWaitEvent");
    FGI_TRY(fgi_nccl_group(r->ctx, r->nccl, r->comm, ops, n, r->comm_stream));
    if (next)
        FGI_CU_TRY(r->ctx, fgi_cu()->cuEventRecord(r->ev[EV_DKV_RECEIVED0 + (s + 1) % 2], r->comm_stream),
                   "cuEventRecord");
    if (mine) FGI_CU_TRY(r->ctx, fgi_cu()->cuEventRecord(r->ev[EV_HOME_RECEIVED], r->comm_stream), "cuEventRecord");
    return FG_OK;
}

static fg_status run_ring(bwd_call *c) {
    fgi_ring_call *r = &c->r;
    const fgi_cu_api *cu = fgi_cu();
    const int N = r->plan->world;
    FGI_TRY(fgi_ring_join(r, r->ev[EV_STARTED], false));
    for (int s = 0; s < N; s++) {
        const fgi_ring_step *st = &me(c)->steps[s];
        const int buf = s % 2, into = (s + 1) % 2;
        const CUdeviceptr hk = s == 0 ? (CUdeviceptr)(uintptr_t)r->a->k : c->kv_buf[buf][0];
        const CUdeviceptr hv = s == 0 ? (CUdeviceptr)(uintptr_t)r->a->v : c->kv_buf[buf][1];
        FGI_TRY(fgi_ring_kv_transfer(r, s, hk, hv, st->kv_rows, c->kv_buf[into][0], c->kv_buf[into][1],
                                     s >= 2 ? r->ev[EV_KV_COMPUTED0 + into] : NULL, r->ev[EV_KV_RECEIVED0 + into]));
        bool added = false;
        if (st->holds) {
            int slot_of[FGI_RING_MAX_PAIRS], slots = 0;
            for (int i = 0; i < st->npairs; i++) slot_of[i] = st->pairs[i].cls == FGI_RING_EMPTY ? -1 : slots++;
            if (slots > 0 && s >= 1)
                FGI_CU_TRY(r->ctx, cu->cuStreamWaitEvent(r->stream, r->ev[EV_KV_RECEIVED0 + buf], 0),
                           "cuStreamWaitEvent");
            FGI_TRY(fgi_ring_fork(r));
            for (int i = 0; i < st->npairs; i++)
                if (slot_of[i] >= 0) FGI_TRY(pair_backward(c, s, &st->pairs[i], hk, hv, slot_of[i]));
            FGI_TRY(fgi_ring_join_side(r));
            if (slots > 0 && s >= 1)
                FGI_CU_TRY(r->ctx, cu->cuEventRecord(r->ev[EV_KV_COMPUTED0 + buf], r->stream), "cuEventRecord");
            /* the sums this step adds to (or, at step 0, starts) */
            if (slots > 0 || s == 0) {
                if (s >= 1)
                    FGI_CU_TRY(r->ctx, cu->cuStreamWaitEvent(r->stream, r->ev[EV_DKV_RECEIVED0 + buf], 0),
                               "cuStreamWaitEvent");
                FGI_TRY(add_dkv(c, s, slot_of));
                FGI_CU_TRY(r->ctx, cu->cuEventRecord(r->ev[EV_DKV_READY0 + buf], r->stream), "cuEventRecord");
                added = true;
            }
        }
        FGI_TRY(dkv_transfer(c, s, added));
    }
    return FG_OK;
}

/* dq from its fp32 sum, per q chunk (zeros where no pair touched it), and
 * dk, dv from the sums that came home. */
static fg_status store(bwd_call *c) {
    fgi_ring_call *r = &c->r;
    const fg_attention_args *a = r->a;
    const int64_t D = a->head_dim;
    for (int qc = 0; qc < me(c)->nchunks; qc++) {
        const fgi_ring_chunk *ch = &me(c)->q[qc];
        fgi_sum_args sq = sum_args(c, a->heads_q, ch->len);
        dense3(sq.acc_stride, a->heads_q, a->q_len, D);
        sq.acc_in = c->dq_started[qc] ? (const float *)(uintptr_t)(c->dq_sum + 4 * (size_t)ch->local * (size_t)D)
                                      : NULL;
        sq.out = (char *)c->b->dq + 2 * ch->local * c->bs.dq[2];
        memcpy(sq.out_stride, c->bs.dq, sizeof sq.out_stride);
        FGI_TRY(fgi_partial_sum(r->ctx, &sq));
    }
    if (c->home_step == 0) return FG_OK; /* stored at step 0 (add_dkv) */
    FGI_CU_TRY(r->ctx, fgi_cu()->cuStreamWaitEvent(r->stream, r->ev[EV_HOME_RECEIVED], 0), "cuStreamWaitEvent");
    for (int t = 0; t < 2; t++) {
        fgi_sum_args sk = sum_args(c, a->heads_kv, a->kv_len);
        dense3(sk.acc_stride, a->heads_kv, a->kv_len, D);
        sk.acc_in = (const float *)(uintptr_t)c->home[t];
        sk.out = t ? c->b->dv : c->b->dk;
        memcpy(sk.out_stride, t ? c->bs.dv : c->bs.dk, sizeof sk.out_stride);
        FGI_TRY(fgi_partial_sum(r->ctx, &sk));
    }
    return FG_OK;
}

/* The gradient bindings against the mod, before the ring (every rank
 * alike): each names a float buffer score_mod reads, once, with room for
 * the buffer bound to it; its length is the bound buffer's. */
static fg_status resolve_grads(fg_ctx *ctx, const fg_mod *mod, bwd_call *c) {
    const fg_attention_bwd_args *b = c->b;
    if (b->ngrad_binds > FGI_MAX_GRAD_BUFFERS)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "%zu gradient bindings: at most %d", b->ngrad_binds,
                         FGI_MAX_GRAD_BUFFERS);
    c->ngrads = (int)b->ngrad_binds;
    if (!c->ngrads) return FG_OK;
    fgi_grad_layout L;
    const void *out[FGI_MAX_GRAD_BUFFERS];
    int64_t len[FGI_MAX_GRAD_BUFFERS];
    FGI_TRY(fgi_attn_resolve_grads(ctx, mod, b, &L, out, len));
    for (int i = 0; i < c->ngrads; i++)
        for (int k = 0; k < L.n; k++)
            if (strcmp(mod->params[L.param[k]].name, b->grad_binds[i].name) == 0) c->glen[i] = len[k];
    return FG_OK;
}

/* After the ring, with grads_summed: the ranks' sums added together (an
 * int64 all-reduce on the comm stream, once the caller's stream has added
 * its last share), for fgi_ring_join and then finish_grads. Without it
 * each rank keeps its own share: the gradient of its copy. */
static fg_status reduce_grads(bwd_call *c, CUevent ev, bool summed) {
    if (!summed || !c->ngrads || c->r.who.size == 1) return FG_OK;
    FGI_TRY(fgi_ring_join(&c->r, ev, false));
    void *bufs[FGI_MAX_GRAD_BUFFERS];
    size_t counts[FGI_MAX_GRAD_BUFFERS];
    for (int i = 0; i < c->ngrads; i++)
        bufs[i] = (void *)(uintptr_t)c->gsum[i], counts[i] = (size_t)c->glen[i] * (FGI_BWD_SUM_BYTES / 8);
    return fgi_nccl_sum_i64(c->r.ctx, c->r.nccl, c->r.comm, bufs, counts, c->ngrads, c->r.comm_stream);
}

/* Each sum rounded into its binding's fp32 data, on the caller's stream. */
static fg_status finish_grads(bwd_call *c) {
    for (int i = 0; i < c->ngrads; i++)
        FGI_TRY(fgi_attention_backward_sums_to_float(c->r.ctx, c->r.mod, c->r.a->dtype, c->r.a->head_dim, c->gsum[i],
                                                     (float *)c->b->grad_binds[i].value.buffer.data, c->glen[i],
                                                     c->r.stream));
    return FG_OK;
}

fg_status fg_attention_backward_cp(fg_ctx *ctx, const fg_mod *mod, const fg_cp_bwd_args *args) {
    if (!ctx) return FG_ERR_INVALID_ARGUMENT;
    FGI_CHECK_ARG(ctx, mod && args, "NULL mod or arguments");
    fg_cp_bwd_args cp;
    FGI_TRY(FGI_STRUCT_IN(ctx, fg_cp_bwd_args, args, &cp));
    FGI_CHECK_ARG(ctx, cp.local, "NULL local shard (fg_cp_bwd_args.local)");
    fg_attention_bwd_args b;
    fg_attention_args a;
    FGI_TRY(fgi_attn_bwd_args_in(ctx, cp.local, &b, &a));
    fgi_attn_strides st;
    bwd_call c;
    memset(&c, 0, sizeof c);
    FGI_TRY(fgi_attn_check_bwd_args(ctx, mod, &b, &st, &c.bs));
    FGI_CHECK_ARG(ctx, a.lse, "the backward needs the forward's lse (fg_attention_args.lse is NULL)");
    FGI_CHECK_ARG(ctx, a.out, "the backward needs the forward's out (fg_attention_args.out is NULL)");
    if (b.workspace || b.workspace_size)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "the sharded backward takes its workspace from the pool: workspace must be unset");
    if ((uintptr_t)a.lse % 4 || (b.dlse && (uintptr_t)b.dlse % 4))
        return fgi_error(ctx, FG_ERR_SHAPE, "lse and dlse must be 4-byte aligned");
    /* What the pairs' backward and the sums need of the caller's buffers,
     * checked on every rank before the ring: a rank failing inside it
     * alone would leave its peers waiting. */
    FGI_TRY(fgi_attn_check_aligned(ctx, "q", a.q, st.q, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "k", a.k, st.k, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "v", a.v, st.v, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dout", b.dout, c.bs.dout, 16));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dq", b.dq, c.bs.dq, 4));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dk", b.dk, c.bs.dk, 4));
    FGI_TRY(fgi_attn_check_aligned(ctx, "dv", b.dv, c.bs.dv, 4));
    c.b = &b;
    FGI_TRY(resolve_grads(ctx, mod, &c));
    const fgi_ring_call_desc d = {cp.comm, cp.global_len, cp.layout, cp.plan, "fg_cp_bwd_args", NEVENTS};
    FGI_TRY(fgi_ring_call_open(ctx, mod, &a, &st, &d, &c.r));
    fgi_ring_home(c.r.plan, c.r.who.rank, &c.home_step, &c.home_from);
    fg_status s = alloc_workspace(&c);
    if (s == FG_OK) s = load_kernels(&c);
    if (s == FG_OK) s = gather_lse(&c);
    if (s == FG_OK) s = run_ring(&c);
    if (s == FG_OK) s = store(&c);
    if (s == FG_OK) s = reduce_grads(&c, c.r.ev[EV_GRADS_READY], cp.grads_summed != 0);
    /* The caller's stream waits for every transfer before the workspace
     * goes back on it; on an error, the call's own streams are drained
     * first. */
    if (s == FG_OK) s = fgi_ring_join(&c.r, c.r.ev[EV_COMM_DONE], true);
    if (s == FG_OK) s = finish_grads(&c);
    if (s != FG_OK) fgi_ring_drain(&c.r);
    fg_status f = c.ws.base ? fgi_attn_ws_free(ctx, &c.ws, c.r.stream) : FG_OK;
    fgi_ring_call_close(&c.r);
    return s != FG_OK ? s : f;
}
