/*
 * ring_plan.c -- the shard planner of context parallelism (ring attention).
 *
 * The ring. N ranks each hold a shard of the sequence: some rows of q and
 * the same rows of K and V. Attention needs every q row against every K/V
 * row, so the K/V shards travel round a ring while the q shards stay put:
 * at step s (0..N-1) rank r holds the K/V shard that started on rank
 * (r - s) mod N (its own at step 0) and computes its q rows against it;
 * during the step it passes that shard on to rank r + 1 and takes the next
 * one from rank r - 1. After N steps every rank has met every shard once,
 * and its partial results (one (out, lse) per step, normalised over that
 * step's keys) merge exactly by their log-sum-exps (fg_attention_merge).
 * Each step's transfer runs under the step's compute, so the ring costs
 * max(compute, transfer) per step rather than their sum.
 *
 * Offsets. A rank computes with local buffers, but the mods must see global
 * positions: every (q chunk, kv chunk) pair is an attention call with
 * q_offset / kv_offset set to the chunks' global starts, and its block mask
 * is built for the same offsets.
 *
 * Layouts. Contiguous: rank r holds the r-th of N consecutive chunks. Under
 * a causal mask that is lopsided: chunk r attends to r whole chunks and half
 * of its own, so rank 0 does 1/2 chunk-pair of work and rank N-1 does
 * N - 1/2, and since every step waits for the slowest rank the ring runs at
 * the speed of the last one. Zig-zag cuts the sequence into 2N chunks and
 * gives rank r chunks r and 2N-1-r, an early one and its mirror image at
 * the end: chunk r does r + 1/2 chunk-pairs of causal work and chunk
 * 2N-1-r does 2N-1-r + 1/2, so every rank does 2N. It is balanced step by
 * step too: at step s > 0 rank r holds shard o = (r - s) mod N; if o < r
 * both its q chunks lie after kv chunk o and before kv chunk 2N-1-o, if
 * o > r its late q chunk lies after both kv chunks and its early one before
 * both -- either way exactly two full chunk-pairs; at step 0 it does two
 * half ones (the diagonals) and a full one. The same reasoning helps every
 * mask whose work per row grows with the row's position (causal, prefix LM,
 * windows longer than a chunk). Masks with even work per row (no mask,
 * short windows, short documents) gain nothing from it, and contiguous
 * chunks keep each call one long run of rows with fewer, larger pairs.
 *
 * Uneven lengths. A length L cut into C chunks (C = N, or 2N for zig-zag)
 * gives the first L % C chunks one row more: chunk c starts at
 * c * (L / C) + min(c, L % C). Under zig-zag rank r's two chunks then differ
 * from any other rank's by at most one row in total. A sequence shorter
 * than C has chunks of 0 rows; their pairs are EMPTY and the plan handles
 * them like any other empty pair. The q and K/V sequences are cut the same
 * way, each by its own length (cross attention: q_len != kv_len). With an
 * alignment A (the kernels' block size) the same rule cuts units of A rows
 * instead of rows, the last unit holding what is left: every chunk then
 * starts on a block boundary, so no chunk but the last ends in a ragged
 * block (an unaligned chunk wastes up to a block of work at each end) and a
 * pair's block mask is a slice of the rank's mask over the whole kv length.
 *
 * Classes. A pair is EMPTY (skip it), FULL (compute without evaluating the
 * mask) or PARTIAL. The caller decides through a callback, so the planner
 * needs neither a GPU nor a mod: fgi_ring_class_causal from the ranges,
 * fgi_ring_class_mod from any mod through a CPU block mask; a GPU caller
 * can classify from GPU-built block masks. Each distinct (q chunk, kv chunk)
 * pair is classified once.
 *
 * Transfer skipping. The shard that starts on rank o visits ranks o, o+1,
 * ... at steps 0, 1, ...; let last(o) be the last step at which the rank
 * holding it has a non-EMPTY pair with it (-1 when nobody uses it). It is
 * forwarded at steps 0 .. last(o) - 1 and never after: rank (o + s) mod N
 * sends it at step s iff s < last(o), and rank (o + s + 1) mod N receives
 * it at that same step, so every send has its receive by construction. The
 * last step never sends (last(o) <= N - 1). A rank that did not receive at
 * step s - 1 holds nothing at step s, and then it has nothing to compute
 * either: a use at step s means s <= last(o), so the shard was sent at
 * s - 1. Under a causal contiguous layout shard o travels only to rank
 * N - 1 (rank 0 never receives); under a sliding window only as far as the
 * window reaches. The NCCL calls of a step are grouped (ncclGroupStart /
 * End) so that a rank that both sends and receives cannot deadlock.
 */
#include "parallel/ring_plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layout ------------------------------------------------------------ */

/* Units of `align` rows (the last one short), the first (units % count)
 * chunks one unit more, clipped to the length. */
static void chunk_range(int64_t len, int count, int64_t align, int c, int64_t *start, int64_t *rows) {
    int64_t units = (len + align - 1) / align, base = units / count, rem = units % count;
    int64_t u0 = c * base + (c < rem ? c : rem), u1 = u0 + base + (c < rem ? 1 : 0);
    int64_t r0 = u0 * align < len ? u0 * align : len, r1 = u1 * align < len ? u1 * align : len;
    *start = r0;
    *rows = r1 - r0;
}

static int chunk_count(fgi_ring_layout layout, int world) {
    return layout == FGI_RING_ZIGZAG ? 2 * world : world;
}

void fgi_ring_split(fgi_ring_layout layout, int world, int64_t len, int64_t align, int rank,
                    fgi_ring_chunk chunks[FGI_RING_MAX_CHUNKS], int *nchunks) {
    if (align < 1) align = 1;
    int ids[FGI_RING_MAX_CHUNKS] = {rank, 2 * world - 1 - rank};
    int n = layout == FGI_RING_ZIGZAG ? 2 : 1;
    int64_t local = 0;
    for (int i = 0; i < n; i++) {
        fgi_ring_chunk *c = &chunks[i];
        c->index = ids[i];
        chunk_range(len, chunk_count(layout, world), align, ids[i], &c->start, &c->len);
        c->local = local;
        local += c->len;
    }
    *nchunks = n;
}

const char *fgi_ring_class_name(fgi_ring_class cls) {
    switch (cls) {
    case FGI_RING_EMPTY: return "empty";
    case FGI_RING_PARTIAL: return "partial";
    case FGI_RING_FULL: return "full";
    }
    return "?";
}

/* ---- the plan -------------------------------------------------------------- */

void fgi_ring_plan_destroy(fgi_ring_plan *plan) {
    if (!plan) return;
    if (plan->ranks) free(plan->ranks[0].steps);
    free(plan->ranks);
    free(plan);
}

static fg_status check_desc(fg_ctx *ctx, const fgi_ring_desc *d) {
    if (d->world < 1 || d->world > FGI_RING_MAX_WORLD)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "ring world size %d is outside 1..%d", d->world,
                         FGI_RING_MAX_WORLD);
    if (d->layout != FGI_RING_CONTIGUOUS && d->layout != FGI_RING_ZIGZAG)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "ring layout %d is neither contiguous (%d) nor zig-zag (%d)", (int)d->layout,
                         FGI_RING_CONTIGUOUS, FGI_RING_ZIGZAG);
    if (d->align < 0 || d->align > FGI_RING_MAX_ALIGN)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "ring alignment %lld is outside 0..%d", (long long)d->align,
                         FGI_RING_MAX_ALIGN);
    if (d->q_len < 1 || d->q_len > INT32_MAX || d->kv_len < 1 || d->kv_len > INT32_MAX)
        return fgi_error(ctx, FG_ERR_SHAPE,
                         "ring lengths %lld (q) and %lld (kv) must be in 1..%d: the mods see int "
                         "positions",
                         (long long)d->q_len, (long long)d->kv_len, INT32_MAX);
    return FG_OK;
}

/* The class of every (q chunk, kv chunk) pair, by global chunk numbers:
 * cls[qc * count + kc]. */
static fg_status classify_chunks(fg_ctx *ctx, const fgi_ring_desc *d, int64_t align, int count, uint8_t *cls) {
    for (int qc = 0; qc < count; qc++) {
        int64_t q0, nq;
        chunk_range(d->q_len, count, align, qc, &q0, &nq);
        for (int kc = 0; kc < count; kc++) {
            int64_t k0, nk;
            chunk_range(d->kv_len, count, align, kc, &k0, &nk);
            fgi_ring_class c = FGI_RING_FULL;
            if (nq == 0 || nk == 0) c = FGI_RING_EMPTY;
            else if (d->pair_class) {
                c = (fgi_ring_class)-1;
                FGI_TRY(d->pair_class(d->user, q0, nq, k0, nk, &c));
                if (c != FGI_RING_EMPTY && c != FGI_RING_PARTIAL && c != FGI_RING_FULL)
                    return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                                     "ring pair_class gave %d for q [%lld, +%lld) x kv [%lld, +%lld): "
                                     "not empty (0), partial (1) or full (2)",
                                     (int)c, (long long)q0, (long long)nq, (long long)k0, (long long)nk);
            }
            cls[(size_t)qc * count + kc] = (uint8_t)c;
        }
    }
    return FG_OK;
}

/* The pairs of rank r at step s, from the chunk classes. */
static void fill_step(const fgi_ring_plan *p, const fgi_ring_rank *rk, int r, int s, const uint8_t *cls,
                      int count, fgi_ring_step *st) {
    const int N = p->world;
    fgi_ring_chunk kv[FGI_RING_MAX_CHUNKS];
    int nkv;
    st->kv_source = ((r - s) % N + N) % N;
    fgi_ring_split(p->layout, N, p->kv_len, p->align, st->kv_source, kv, &nkv);
    st->kv_rows = 0;
    for (int k = 0; k < nkv; k++) st->kv_rows += kv[k].len;
    st->npairs = 0;
    for (int qi = 0; qi < rk->nchunks; qi++)
        for (int ki = 0; ki < nkv; ki++) {
            const fgi_ring_chunk *q = &rk->q[qi], *k = &kv[ki];
            fgi_ring_pair *pr = &st->pairs[st->npairs++];
            pr->q_chunk = qi;
            pr->kv_chunk = ki;
            pr->q_local = q->local;
            pr->q_len = q->len;
            pr->kv_local = k->local;
            pr->kv_len = k->len;
            pr->q_offset = q->start;
            pr->kv_offset = k->start;
            pr->cls = (fgi_ring_class)cls[(size_t)q->index * count + k->index];
        }
}

static bool step_computes(const fgi_ring_step *st) {
    for (int i = 0; i < st->npairs; i++)
        if (st->pairs[i].cls != FGI_RING_EMPTY) return true;
    return false;
}

/* The transfer-skipping rule of the essay: shard o goes on while someone
 * further along its path still uses it. */
static void plan_transfers(fgi_ring_plan *p) {
    const int N = p->world;
    for (int o = 0; o < N; o++) {
        int last = -1;
        for (int s = 0; s < N; s++)
            if (step_computes(&p->ranks[(o + s) % N].steps[s])) last = s;
        for (int s = 0; s < last; s++) {
            p->ranks[(o + s) % N].steps[s].send = true;
            p->ranks[(o + s + 1) % N].steps[s].recv = true;
        }
    }
    for (int r = 0; r < N; r++)
        for (int s = 0; s < N; s++)
            p->ranks[r].steps[s].holds = s == 0 || p->ranks[r].steps[s - 1].recv;
}

void fgi_ring_home(const fgi_ring_plan *p, int rank, int *step, int *from) {
    const int N = p->world;
    *step = 0, *from = rank;
    for (int s = 1; s < N; s++) {
        const fgi_ring_step *st = &p->ranks[(rank + s) % N].steps[s];
        if (st->holds && st->kv_source == rank) *step = s, *from = (rank + s) % N;
    }
}

int fgi_ring_sum_msgs(const fgi_ring_plan *p, int rank, int s, fgi_ring_msg out[FGI_RING_MAX_MSGS]) {
    const int N = p->world;
    const fgi_ring_step *st = &p->ranks[rank].steps[s];
    int n = 0;
    if (st->send) out[n++] = (fgi_ring_msg){FGI_RING_SUM_ON, true, (rank + 1) % N, st->kv_rows};
    else if (st->holds && st->kv_source != rank)
        out[n++] = (fgi_ring_msg){FGI_RING_SUM_HOME, true, st->kv_source, st->kv_rows};
    if (st->recv) out[n++] = (fgi_ring_msg){FGI_RING_SUM_NEXT, false, (rank + N - 1) % N, p->ranks[rank].steps[s + 1].kv_rows};
    int home, from;
    fgi_ring_home(p, rank, &home, &from);
    if (home > 0 && home == s) out[n++] = (fgi_ring_msg){FGI_RING_SUM_MINE, false, from, p->ranks[rank].kv_rows};
    return n;
}

static void add_totals(fgi_ring_rank *rk, int world) {
    for (int s = 0; s < world; s++) {
        const fgi_ring_step *st = &rk->steps[s];
        rk->sends += st->send;
        rk->recvs += st->recv;
        for (int i = 0; i < st->npairs; i++) {
            const fgi_ring_pair *pr = &st->pairs[i];
            if (pr->cls == FGI_RING_EMPTY) continue;
            rk->pairs_computed++;
            if (pr->cls == FGI_RING_FULL) rk->pairs_full++;
            else rk->pairs_partial++;
            rk->elements += pr->q_len * pr->kv_len;
        }
    }
}

fg_status fgi_ring_plan_create(fg_ctx *ctx, const fgi_ring_desc *desc, fgi_ring_plan **out) {
    if (out) *out = NULL;
    if (!desc || !out) return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "NULL ring description or output");
    FGI_TRY(check_desc(ctx, desc));
    const int N = desc->world, count = chunk_count(desc->layout, N);

    uint8_t *cls = malloc((size_t)count * count);
    fgi_ring_plan *p = calloc(1, sizeof *p);
    fgi_ring_rank *ranks = calloc((size_t)N, sizeof *ranks);
    fgi_ring_step *steps = calloc((size_t)N * N, sizeof *steps);
    if (!cls || !p || !ranks || !steps) {
        free(cls);
        free(p);
        free(ranks);
        free(steps);
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory (ring plan of %d ranks)", N);
    }
    p->ranks = ranks;
    ranks[0].steps = steps; /* owns the block: see fgi_ring_plan_destroy */
    p->world = N;
    p->layout = desc->layout;
    p->q_len = desc->q_len;
    p->kv_len = desc->kv_len;
    p->align = desc->align > 0 ? desc->align : 1;

    fg_status st = classify_chunks(ctx, desc, p->align, count, cls);
    if (st != FG_OK) {
        free(cls);
        fgi_ring_plan_destroy(p);
        return st;
    }
    for (int r = 0; r < N; r++) {
        fgi_ring_rank *rk = &ranks[r];
        int nkv;
        fgi_ring_split(p->layout, N, p->q_len, p->align, r, rk->q, &rk->nchunks);
        fgi_ring_split(p->layout, N, p->kv_len, p->align, r, rk->kv, &nkv);
        p->nchunks = rk->nchunks;
        for (int i = 0; i < rk->nchunks; i++) {
            rk->q_rows += rk->q[i].len;
            rk->kv_rows += rk->kv[i].len;
        }
        if (rk->q_rows > p->max_q_rows) p->max_q_rows = rk->q_rows;
        if (rk->kv_rows > p->max_kv_rows) p->max_kv_rows = rk->kv_rows;
        rk->steps = steps + (size_t)r * N;
        for (int s = 0; s < N; s++) fill_step(p, rk, r, s, cls, count, &rk->steps[s]);
    }
    free(cls);
    plan_transfers(p);
    for (int r = 0; r < N; r++) add_totals(&ranks[r], N);
    *out = p;
    return FG_OK;
}

/* ---- classifiers --------------------------------------------------------- */

fg_status fgi_ring_class_causal(void *user, int64_t q_start, int64_t q_len, int64_t kv_start,
                                int64_t kv_len, fgi_ring_class *cls) {
    (void)user;
    int64_t q_last = q_start + q_len - 1, kv_last = kv_start + kv_len - 1;
    if (q_start >= kv_last) *cls = FGI_RING_FULL;      /* the first q sees the last kv */
    else if (q_last < kv_start) *cls = FGI_RING_EMPTY; /* the last q sees no kv        */
    else *cls = FGI_RING_PARTIAL;
    return FG_OK;
}

fg_status fgi_ring_class_mod(void *user, int64_t q_start, int64_t q_len, int64_t kv_start,
                             int64_t kv_len, fgi_ring_class *cls) {
    const fgi_ring_mod_classifier *c = user;
    if (!c || !c->ctx || !c->mod || !cls)
        return c ? fgi_error(c->ctx, FG_ERR_INVALID_ARGUMENT, "ring mod classifier without a context or mod")
                 : FG_ERR_INVALID_ARGUMENT;
    fg_ctx *ctx = c->ctx;
    if (q_start < 0 || kv_start < 0 || q_len < 1 || kv_len < 1 || q_start + q_len - 1 > INT32_MAX ||
        kv_start + kv_len - 1 > INT32_MAX)
        return fgi_error(ctx, FG_ERR_SHAPE, "ring pair q [%lld, +%lld) x kv [%lld, +%lld) is outside the int positions",
                         (long long)q_start, (long long)q_len, (long long)kv_start, (long long)kv_len);
    if (!fg_mod_has_mask(c->mod)) {
        *cls = FGI_RING_FULL;
        return FG_OK;
    }
    fg_block_mask_desc d = fg_block_mask_desc_init();
    d.batch = c->batch > 0 ? c->batch : 1;
    d.heads = c->heads > 0 ? c->heads : 1;
    d.q_len = (int)q_len;
    d.kv_len = (int)kv_len;
    d.q_block = c->q_block;
    d.kv_block = c->kv_block;
    d.q_offset = (int)q_start;
    d.kv_offset = (int)kv_start;
    fg_block_mask *m = NULL;
    FGI_TRY(fg_block_mask_create(ctx, c->mod, &d, c->binds, c->nbinds, &m));
    const int32_t *partial = NULL, *full = NULL;
    int64_t dims[4], idims[4];
    fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &partial, NULL, dims);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &full, NULL, NULL);
    fg_block_mask_array_get(m, FG_BM_KV_INDICES, NULL, NULL, idims);
    int64_t rows = dims[0] * dims[1] * dims[2], visited = 0;
    bool all_full = true;
    for (int64_t i = 0; i < rows; i++) {
        visited += partial[i] + full[i];
        all_full &= partial[i] == 0 && full[i] == idims[3];
    }
    fg_block_mask_destroy(m);
    *cls = visited == 0 ? FGI_RING_EMPTY : all_full ? FGI_RING_FULL : FGI_RING_PARTIAL;
    return FG_OK;
}
