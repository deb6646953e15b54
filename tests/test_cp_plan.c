/* test_cp_plan.c -- the shard planner of context parallelism (ring_plan.c)
 * and the NCCL loader (driver/nccl.c), on the CPU.
 *
 * The planner is checked against what a ring must guarantee, for every row
 * of a table of world sizes (1, 2, 3, 4, 8), layouts (contiguous, zig-zag)
 * and lengths (multiples of the chunk count, odd ones, ones shorter than
 * the chunk count so that chunks have 0 rows, cross-attention lengths):
 *  - the layout: the ranks' chunks cut each sequence into consecutive,
 *    disjoint runs, stored back to back in each rank's buffer;
 *  - coverage: over all ranks and steps, every (q row, kv row) pair of the
 *    global attention lies in exactly one planned pair (an EMPTY pair
 *    covers its elements by the mask: nothing there is visible);
 *  - classes: each pair's class is what a brute-force evaluation of the
 *    mask over the pair's elements says (causal, sliding window, document,
 *    a mask that differs per head, no mask);
 *  - transfers: every send has its receive at the same step, the last step
 *    never sends, a shard is never sent past its last use, and a rank that
 *    computes with a shard holds it;
 *  - balance: causal zig-zag gives every rank the same work, step by step,
 *    and contiguous causal does not;
 *  - the backward's dK/dV sums (fgi_ring_sum_msgs), run on the CPU with a
 *    set of contributing ranks for each sum: sends meet receives, and
 *    every shard's sums reach its owner with exactly the ranks that
 *    computed with it, for causal, windowed and random class patterns.
 * The NCCL loader is checked with files that do not exist, are no library
 * or lack a symbol, and with a stand-in library (fake_nccl.c) for the
 * success path, the communicator query, a ring step's calls and the
 * conversion of an NCCL error into a status.
 *
 * The loader opens the process-wide library once (pthread_once), so only
 * test_nccl_once_env_missing -- the first test, run before anything else
 * can trigger the load -- goes through fgi_nccl_ready; the rest use the
 * uncached fgi_nccl_lib_open, which takes the file as an argument. */
#include "testutil.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/nccl.h"
#include "parallel/ring_plan.h"

static fg_mod *gallery(fg_ctx *ctx, const char *name) { return tu_gallery_mod(ctx, name); }

static fg_mod *expr_mask(fg_ctx *ctx, const char *expr) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_expr(ctx, FG_MASK_MOD, expr, NULL, 0, &m);
    if (st != FG_OK) print_error("%s: %s\n", fg_status_string(st), fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

static fgi_ring_desc desc_of(int world, int64_t q_len, int64_t kv_len, fgi_ring_layout layout, int64_t align,
                             fgi_ring_class_fn fn, void *user) {
    fgi_ring_desc d = {.world = world, .q_len = q_len, .kv_len = kv_len, .layout = layout, .align = align,
                       .pair_class = fn, .user = user};
    return d;
}

static fgi_ring_plan *plan_or_fail(fg_ctx *ctx, const fgi_ring_desc *d) {
    fgi_ring_plan *p = NULL;
    fg_status st = fgi_ring_plan_create(ctx, d, &p);
    if (st != FG_OK) print_error("%s: %s\n", fg_status_string(st), ctx ? fg_errmsg(ctx) : "");
    assert_int_equal(st, FG_OK);
    assert_non_null(p);
    return p;
}

/* ---- the layout --------------------------------------------------------- */

typedef struct split_row {
    fgi_ring_layout layout;
    int world, rank;
    int64_t len, align;
    int nchunks;
    int64_t start[2], rows[2], local[2];
    int index[2];
} split_row;

static const split_row split_rows[] = {
    /* contiguous: the first len % N ranks one row more */
    {FGI_RING_CONTIGUOUS, 3, 0, 10, 1, 1, {0}, {4}, {0}, {0}},
    {FGI_RING_CONTIGUOUS, 3, 1, 10, 1, 1, {4}, {3}, {0}, {1}},
    {FGI_RING_CONTIGUOUS, 3, 2, 10, 0, 1, {7}, {3}, {0}, {2}},
    {FGI_RING_CONTIGUOUS, 4, 3, 3, 1, 1, {3}, {0}, {0}, {3}},
    {FGI_RING_CONTIGUOUS, 1, 0, 7, 1, 1, {0}, {7}, {0}, {0}},
    /* zig-zag: 2N chunks (3, 3, 2, 2 for 10 over 4), rank r has r and 2N-1-r */
    {FGI_RING_ZIGZAG, 2, 0, 10, 1, 2, {0, 8}, {3, 2}, {0, 3}, {0, 3}},
    {FGI_RING_ZIGZAG, 2, 1, 10, 1, 2, {3, 6}, {3, 2}, {0, 3}, {1, 2}},
    {FGI_RING_ZIGZAG, 1, 0, 5, 1, 2, {0, 3}, {3, 2}, {0, 3}, {0, 1}},
    /* shorter than 2N: chunks of 0 rows (1, 1, 1, 1, 0, 0 for 4 over 6) */
    {FGI_RING_ZIGZAG, 3, 0, 4, 1, 2, {0, 4}, {1, 0}, {0, 1}, {0, 5}},
    {FGI_RING_ZIGZAG, 3, 1, 4, 1, 2, {1, 4}, {1, 0}, {0, 1}, {1, 4}},
    {FGI_RING_ZIGZAG, 3, 2, 4, 1, 2, {2, 3}, {1, 1}, {0, 1}, {2, 3}},
    {FGI_RING_ZIGZAG, 4, 3, 16, 1, 2, {6, 8}, {2, 2}, {0, 2}, {3, 4}},
    /* aligned: units of 128 rows, the last one short (1000 = 7 x 128 + 104) */
    {FGI_RING_CONTIGUOUS, 4, 0, 1000, 128, 1, {0}, {256}, {0}, {0}},
    {FGI_RING_CONTIGUOUS, 4, 3, 1000, 128, 1, {768}, {232}, {0}, {3}},
    {FGI_RING_CONTIGUOUS, 3, 1, 1000, 128, 1, {384}, {384}, {0}, {1}},
    {FGI_RING_CONTIGUOUS, 3, 2, 1000, 128, 1, {768}, {232}, {0}, {2}},
    {FGI_RING_ZIGZAG, 2, 0, 300, 128, 2, {0, 300}, {128, 0}, {0, 128}, {0, 3}},
    {FGI_RING_ZIGZAG, 2, 1, 300, 128, 2, {128, 256}, {128, 44}, {0, 128}, {1, 2}},
};

static void test_split(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof split_rows / sizeof split_rows[0]; i++) {
        const split_row *w = &split_rows[i];
        fgi_ring_chunk c[FGI_RING_MAX_CHUNKS];
        int n = -1;
        fgi_ring_split(w->layout, w->world, w->len, w->align, w->rank, c, &n);
        assert_int_equal(n, w->nchunks);
        for (int k = 0; k < n; k++) {
            assert_int_equal(c[k].start, w->start[k]);
            assert_int_equal(c[k].len, w->rows[k]);
            assert_int_equal(c[k].local, w->local[k]);
            assert_int_equal(c[k].index, w->index[k]);
        }
    }
}

/* One step spelled out: zig-zag over 2 ranks, 8 rows, causal. Rank 1 holds
 * rows [2, 4) and [4, 6); at step 1 it holds rank 0's shard, rows [0, 2)
 * and [6, 8), stored as rows 0..1 and 2..3 of the received buffer. */
static void test_one_step(void **state) {
    (void)state;
    fgi_ring_desc d = desc_of(2, 8, 8, FGI_RING_ZIGZAG, 1, fgi_ring_class_causal, NULL);
    fgi_ring_plan *p = plan_or_fail(NULL, &d);
    const fgi_ring_step *st = &p->ranks[1].steps[1];
    assert_int_equal(st->kv_source, 0);
    assert_int_equal(st->kv_rows, 4);
    assert_true(st->holds);
    assert_int_equal(st->npairs, 4);
    static const fgi_ring_pair want[4] = {
        {0, 0, 0, 2, 0, 2, 2, 0, FGI_RING_FULL},
        {0, 1, 0, 2, 2, 2, 2, 6, FGI_RING_EMPTY},
        {1, 0, 2, 2, 0, 2, 4, 0, FGI_RING_FULL},
        {1, 1, 2, 2, 2, 2, 4, 6, FGI_RING_EMPTY},
    };
    for (int i = 0; i < 4; i++) {
        const fgi_ring_pair *a = &st->pairs[i], *b = &want[i];
        assert_int_equal(a->q_chunk, b->q_chunk);
        assert_int_equal(a->kv_chunk, b->kv_chunk);
        assert_int_equal(a->q_local, b->q_local);
        assert_int_equal(a->q_len, b->q_len);
        assert_int_equal(a->kv_local, b->kv_local);
        assert_int_equal(a->kv_len, b->kv_len);
        assert_int_equal(a->q_offset, b->q_offset);
        assert_int_equal(a->kv_offset, b->kv_offset);
        assert_int_equal(a->cls, b->cls);
    }
    /* the transfers of 2 ranks: each shard is used on both, so step 0
     * sends both ways and step 1 (the last) sends nothing */
    for (int r = 0; r < 2; r++) {
        assert_true(p->ranks[r].steps[0].send && p->ranks[r].steps[0].recv);
        assert_false(p->ranks[r].steps[1].send || p->ranks[r].steps[1].recv);
    }
    fgi_ring_plan_destroy(p);
}

/* ---- what every plan must satisfy ---------------------------------------- */

/* The table row being checked, for the failure messages. */
static char current_case[160];

/* The chunks of every rank cut [0, len) into runs in chunk-number order,
 * each stored right after the rank's previous one. */
static void check_layout(const fgi_ring_plan *p, bool q_side) {
    int count = p->nchunks * p->world;
    int64_t len = q_side ? p->q_len : p->kv_len;
    const fgi_ring_chunk **by_index = calloc((size_t)count, sizeof *by_index);
    for (int r = 0; r < p->world; r++) {
        const fgi_ring_rank *rk = &p->ranks[r];
        assert_int_equal(rk->nchunks, p->nchunks);
        int64_t local = 0;
        for (int i = 0; i < rk->nchunks; i++) {
            const fgi_ring_chunk *c = q_side ? &rk->q[i] : &rk->kv[i];
            assert_in_range(c->index, 0, count - 1);
            assert_null(by_index[c->index]);
            by_index[c->index] = c;
            assert_int_equal(c->local, local);
            local += c->len;
        }
        assert_int_equal(local, q_side ? rk->q_rows : rk->kv_rows);
        assert_true(local <= (q_side ? p->max_q_rows : p->max_kv_rows));
    }
    /* in order, back to back; in units of align rows (the last one short)
     * the chunks differ by one unit at most, and each starts on a unit */
    const int64_t A = p->align;
    int64_t next = 0, lo = len, hi = 0;
    for (int c = 0; c < count; c++) {
        const fgi_ring_chunk *ch = by_index[c];
        assert_non_null(ch);
        assert_int_equal(ch->start, next);
        next += ch->len;
        int64_t units = (ch->len + A - 1) / A;
        if (units < lo) lo = units;
        if (units > hi) hi = units;
        if (ch->len > 0) assert_int_equal(ch->start % A, 0);
        if (ch->start + ch->len < len) assert_int_equal(ch->len % A, 0);
    }
    assert_int_equal(next, len);
    assert_true(hi - lo <= 1);
    free(by_index);
}

static bool step_computes(const fgi_ring_step *st) {
    for (int i = 0; i < st->npairs; i++)
        if (st->pairs[i].cls != FGI_RING_EMPTY) return true;
    return false;
}

static void check_transfers(const fgi_ring_plan *p) {
    const int N = p->world;
    for (int r = 0; r < N; r++) {
        const fgi_ring_rank *rk = &p->ranks[r];
        int sends = 0, recvs = 0;
        assert_false(rk->steps[N - 1].send);
        assert_false(rk->steps[N - 1].recv);
        for (int s = 0; s < N; s++) {
            const fgi_ring_step *st = &rk->steps[s];
            assert_int_equal(st->kv_source, ((r - s) % N + N) % N);
            /* a send pairs with the next rank's receive, at the same step */
            assert_int_equal(st->send, p->ranks[(r + 1) % N].steps[s].recv);
            /* holding: own shard at step 0, else received the step before */
            assert_int_equal(st->holds, s == 0 || rk->steps[s - 1].recv);
            if (step_computes(st)) assert_true(st->holds);
            /* what arrives is what the next step holds */
            if (st->recv) assert_int_equal(rk->steps[s + 1].kv_source, (st->kv_source + N - 1) % N);
            /* never sent past its last use: someone further on computes */
            if (st->send) {
                bool used_later = false;
                for (int t = s + 1; t < N && !used_later; t++)
                    used_later = step_computes(&p->ranks[(r + t - s) % N].steps[t]);
                assert_true(used_later);
            }
            sends += st->send;
            recvs += st->recv;
        }
        assert_int_equal(sends, rk->sends);
        assert_int_equal(recvs, rk->recvs);
    }
}

/* Every (q, kv) element in exactly one pair; pairs agree with the chunks;
 * the totals add up. */
static void check_coverage(const fgi_ring_plan *p) {
    const int N = p->world;
    uint8_t *seen = calloc((size_t)(p->q_len * p->kv_len), 1);
    assert_non_null(seen);
    for (int r = 0; r < N; r++) {
        const fgi_ring_rank *rk = &p->ranks[r];
        int64_t pairs = 0, full = 0, partial = 0, elements = 0;
        for (int s = 0; s < N; s++) {
            const fgi_ring_step *st = &rk->steps[s];
            const fgi_ring_rank *src = &p->ranks[st->kv_source];
            assert_int_equal(st->kv_rows, src->kv_rows);
            assert_int_equal(st->npairs, rk->nchunks * src->nchunks);
            for (int i = 0; i < st->npairs; i++) {
                const fgi_ring_pair *pr = &st->pairs[i];
                const fgi_ring_chunk *q = &rk->q[pr->q_chunk], *k = &src->kv[pr->kv_chunk];
                assert_int_equal(pr->q_offset, q->start);
                assert_int_equal(pr->q_local, q->local);
                assert_int_equal(pr->q_len, q->len);
                assert_int_equal(pr->kv_offset, k->start);
                assert_int_equal(pr->kv_local, k->local);
                assert_int_equal(pr->kv_len, k->len);
                if (pr->q_len == 0 || pr->kv_len == 0) assert_int_equal(pr->cls, FGI_RING_EMPTY);
                for (int64_t a = 0; a < pr->q_len; a++)
                    for (int64_t b = 0; b < pr->kv_len; b++)
                        seen[(pr->q_offset + a) * p->kv_len + pr->kv_offset + b]++;
                if (pr->cls == FGI_RING_EMPTY) continue;
                pairs++;
                full += pr->cls == FGI_RING_FULL;
                partial += pr->cls == FGI_RING_PARTIAL;
                elements += pr->q_len * pr->kv_len;
            }
        }
        assert_int_equal(pairs, rk->pairs_computed);
        assert_int_equal(full, rk->pairs_full);
        assert_int_equal(partial, rk->pairs_partial);
        assert_int_equal(elements, rk->elements);
    }
    for (int64_t i = 0; i < p->q_len * p->kv_len; i++)
        if (seen[i] != 1) {
            print_error("%s: element (%lld, %lld) covered %d times\n", current_case, (long long)(i / p->kv_len),
                        (long long)(i % p->kv_len), seen[i]);
            fail();
        }
    free(seen);
}

/* The mask over the whole global attention, heads h in [0, heads), by the
 * evaluator, and each pair's class from it. */
static uint8_t *dense_mask(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                           int heads, int64_t q_len, int64_t kv_len) {
    size_t n = (size_t)(q_len * kv_len);
    uint8_t *m = malloc(n * (size_t)heads);
    assert_non_null(m);
    for (int h = 0; h < heads; h++)
        assert_int_equal(fg_mod_eval_mask(ctx, mod, binds, nbinds, 0, h, 0, (int)q_len, 0, (int)kv_len,
                                          m + (size_t)h * n),
                         FG_OK);
    return m;
}

static void check_classes(const fgi_ring_plan *p, const uint8_t *dense, int heads) {
    size_t n = (size_t)(p->q_len * p->kv_len);
    for (int r = 0; r < p->world; r++)
        for (int s = 0; s < p->world; s++) {
            const fgi_ring_step *st = &p->ranks[r].steps[s];
            for (int i = 0; i < st->npairs; i++) {
                const fgi_ring_pair *pr = &st->pairs[i];
                int64_t on = 0, total = pr->q_len * pr->kv_len * heads;
                for (int h = 0; h < heads; h++)
                    for (int64_t a = 0; a < pr->q_len; a++)
                        for (int64_t b = 0; b < pr->kv_len; b++)
                            on += dense[(size_t)h * n + (size_t)((pr->q_offset + a) * p->kv_len + pr->kv_offset + b)];
                fgi_ring_class want = on == 0 ? FGI_RING_EMPTY : on == total ? FGI_RING_FULL : FGI_RING_PARTIAL;
                if (pr->cls != want) {
                    print_error("%s: rank %d step %d pair q [%lld, +%lld) kv [%lld, +%lld): %s, the mask says %s\n",
                                current_case, r, s, (long long)pr->q_offset, (long long)pr->q_len, (long long)pr->kv_offset,
                                (long long)pr->kv_len, fgi_ring_class_name(pr->cls), fgi_ring_class_name(want));
                    fail();
                }
            }
        }
}

static void check_plan(const fgi_ring_plan *p) {
    check_layout(p, true);
    check_layout(p, false);
    check_coverage(p);
    check_transfers(p);
}

/* ---- the table -------------------------------------------------------- */

typedef struct plan_case {
    int world;
    int64_t q_len, kv_len, align;
} plan_case;

/* Per world size: a multiple of 2N, odd lengths, lengths under 2N (chunks
 * of 0 rows), cross-attention lengths, chunks aligned to blocks. */
static const plan_case plan_cases[] = {
    {1, 48, 48, 1},    {1, 1, 1, 1},      {1, 37, 37, 1},  {1, 20, 33, 1},  {1, 100, 100, 16},
    {2, 96, 96, 1},    {2, 101, 101, 1},  {2, 3, 3, 1},    {2, 1, 1, 1},    {2, 40, 57, 1},   {2, 300, 300, 16},
    {3, 144, 144, 1},  {3, 149, 149, 1},  {3, 5, 5, 1},    {3, 4, 4, 1},    {3, 70, 41, 1},   {3, 500, 500, 64},
    {4, 192, 192, 1},  {4, 203, 203, 1},  {4, 7, 7, 1},    {4, 6, 6, 1},    {4, 50, 50, 1},   {4, 203, 203, 16},
    {8, 384, 384, 1},  {8, 391, 391, 1},  {8, 11, 11, 1},  {8, 5, 5, 1},    {8, 1, 1, 1},     {8, 100, 131, 1},
    {8, 391, 391, 32}, {8, 100, 131, 16},
};

/* Documents of lengths in [1, max_len]: ids 0, 0, ..., 1, 1, ... */
static void random_documents(uint64_t *rng, int32_t *doc, int64_t n, int max_len) {
    int id = 0, left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
    for (int64_t i = 0; i < n; i++) {
        if (left == 0) {
            id++;
            left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
        }
        doc[i] = id;
        left--;
    }
}

typedef struct mask_case {
    const char *what;
    fg_mod *mod;
    fg_binding binds[1];
    size_t nbinds;
    int heads;
} mask_case;

/* Every case x layout x mask: the invariants, and the classes against the
 * brute-force mask. Causal also through the range classifier, which must
 * agree with the mod's. */
static void test_table(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *causal = gallery(ctx, "causal"), *sliding = gallery(ctx, "sliding_window"),
           *document = gallery(ctx, "document"), *noop = gallery(ctx, "noop");
    /* per head: causal on head 0, its mirror image on head 1 */
    fg_mod *per_head = expr_mask(ctx, "h == 0 ? q_idx >= kv_idx : q_idx <= kv_idx");
    uint64_t rng = 7;
    static const fgi_ring_layout layouts[] = {FGI_RING_CONTIGUOUS, FGI_RING_ZIGZAG};
    for (size_t ci = 0; ci < sizeof plan_cases / sizeof plan_cases[0]; ci++) {
        const plan_case *c = &plan_cases[ci];
        int64_t longest = c->q_len > c->kv_len ? c->q_len : c->kv_len;
        int32_t *doc = malloc(sizeof(int32_t) * (size_t)longest);
        random_documents(&rng, doc, longest, 1 + (int)(longest / 5));
        int window = 1 + (int)(longest / 7);
        mask_case masks[] = {
            {"causal", causal, {{0}}, 0, 1},
            {"sliding_window", sliding, {fg_bind_int("WINDOW", window)}, 1, 1},
            {"document", document, {fg_bind_int_buffer("document_id", doc, longest)}, 1, 1},
            {"per-head", per_head, {{0}}, 0, 2},
            {"noop", noop, {{0}}, 0, 1},
        };
        for (size_t li = 0; li < 2; li++)
            for (size_t mi = 0; mi < sizeof masks / sizeof masks[0]; mi++) {
                const mask_case *m = &masks[mi];
                snprintf(current_case, sizeof current_case, "N=%d q_len=%lld kv_len=%lld align=%lld %s %s", c->world,
                         (long long)c->q_len, (long long)c->kv_len, (long long)c->align,
                         layouts[li] == FGI_RING_ZIGZAG ? "zig-zag" : "contiguous", m->what);
                fgi_ring_mod_classifier mc = {ctx, m->mod, m->binds, m->nbinds, 1, m->heads, 16, 32};
                fgi_ring_desc d = desc_of(c->world, c->q_len, c->kv_len, layouts[li], c->align, fgi_ring_class_mod, &mc);
                fgi_ring_plan *p = plan_or_fail(ctx, &d);
                uint8_t *dense = dense_mask(ctx, m->mod, m->binds, m->nbinds, m->heads, c->q_len, c->kv_len);
                check_plan(p);
                check_classes(p, dense, m->heads);
                if (m->mod == causal) {
                    fgi_ring_desc dc = d;
                    dc.pair_class = fgi_ring_class_causal;
                    dc.user = NULL;
                    fgi_ring_plan *pc = plan_or_fail(ctx, &dc);
                    check_classes(pc, dense, 1);
                    fgi_ring_plan_destroy(pc);
                }
                if (m->mod == noop) {
                    /* no callback means no mask: the same plan */
                    fgi_ring_desc dn = d;
                    dn.pair_class = NULL;
                    fgi_ring_plan *pn = plan_or_fail(ctx, &dn);
                    check_classes(pn, dense, 1);
                    fgi_ring_plan_destroy(pn);
                }
                free(dense);
                fgi_ring_plan_destroy(p);
            }
        free(doc);
    }
    fg_mod_destroy(causal);
    fg_mod_destroy(sliding);
    fg_mod_destroy(document);
    fg_mod_destroy(noop);
    fg_mod_destroy(per_head);
    fg_ctx_destroy(ctx);
}

/* The class is the element-wise answer whatever the block size: the same
 * plan for blocks of 16 x 16, 16 x 128 and 128 x 128, and for several heads
 * of a mask that ignores h. */
static void test_block_size_independent(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *sliding = gallery(ctx, "sliding_window");
    fg_binding w = fg_bind_int("WINDOW", 100);
    static const int blocks[][4] = {{16, 16, 1, 1}, {16, 128, 1, 1}, {128, 128, 1, 1}, {64, 32, 2, 3}};
    fgi_ring_plan *first = NULL;
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        fgi_ring_mod_classifier mc = {ctx, sliding, &w, 1, blocks[i][2], blocks[i][3], blocks[i][0], blocks[i][1]};
        fgi_ring_desc d = desc_of(4, 1000, 1000, FGI_RING_ZIGZAG, 0, fgi_ring_class_mod, &mc);
        fgi_ring_plan *p = plan_or_fail(ctx, &d);
        if (!first) {
            first = p;
            continue;
        }
        for (int r = 0; r < 4; r++)
            for (int s = 0; s < 4; s++)
                for (int k = 0; k < 4; k++)
                    assert_int_equal(p->ranks[r].steps[s].pairs[k].cls, first->ranks[r].steps[s].pairs[k].cls);
        fgi_ring_plan_destroy(p);
    }
    fgi_ring_plan_destroy(first);
    fg_mod_destroy(sliding);
    fg_ctx_destroy(ctx);
}

/* ---- balance --------------------------------------------------------------- */

static int64_t spread(const fgi_ring_plan *p, int64_t (*measure)(const fgi_ring_plan *, int)) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int r = 0; r < p->world; r++) {
        int64_t v = measure(p, r);
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    return hi - lo;
}

static int64_t planned_elements(const fgi_ring_plan *p, int r) { return p->ranks[r].elements; }

/* The scores the causal mask keeps on rank r's rows: what the kernels
 * really compute once the mask skips blocks, at element resolution. */
static int64_t causal_elements(const fgi_ring_plan *p, int r) {
    int64_t n = 0;
    for (int i = 0; i < p->ranks[r].nchunks; i++) {
        const fgi_ring_chunk *c = &p->ranks[r].q[i];
        for (int64_t q = c->start; q < c->start + c->len; q++) n += q + 1;
    }
    return n;
}

/* Under zig-zag every rank does 2N + 1 chunk pairs (2N - 1 full ones and
 * two diagonals), and at each step the same: two half pairs and a full one
 * at step 0, two full pairs after. The element counts then differ by less
 * than one chunk pair (rows differ by one at most); with lengths that are
 * a multiple of 2N they are equal. Contiguous chunks give rank r r full
 * pairs and a diagonal: the spread is (N - 1) contiguous pairs, far more
 * than one zig-zag pair. */
static void test_causal_balance(void **state) {
    (void)state;
    static const int worlds[] = {2, 3, 4, 8};
    static const int extra[] = {0, 1, 5};
    for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++)
        for (size_t ei = 0; ei < sizeof extra / sizeof extra[0]; ei++) {
            int N = worlds[wi];
            int64_t L = 2 * N * 64 + extra[ei];
            int64_t chunk = (L + 2 * N - 1) / (2 * N); /* the longest zig-zag chunk */
            fgi_ring_desc d = desc_of(N, L, L, FGI_RING_ZIGZAG, 1, fgi_ring_class_causal, NULL);
            fgi_ring_plan *z = plan_or_fail(NULL, &d);
            check_plan(z);
            for (int r = 0; r < N; r++) {
                const fgi_ring_rank *rk = &z->ranks[r];
                assert_int_equal(rk->pairs_computed, 2 * N + 1);
                assert_int_equal(rk->pairs_partial, 2);
                for (int s = 0; s < N; s++) {
                    int full = 0, partial = 0;
                    for (int k = 0; k < rk->steps[s].npairs; k++) {
                        full += rk->steps[s].pairs[k].cls == FGI_RING_FULL;
                        partial += rk->steps[s].pairs[k].cls == FGI_RING_PARTIAL;
                    }
                    assert_int_equal(full, s == 0 ? 1 : 2);
                    assert_int_equal(partial, s == 0 ? 2 : 0);
                }
                /* every shard is used everywhere: every step but the last
                 * sends and receives */
                assert_int_equal(rk->sends, N - 1);
                assert_int_equal(rk->recvs, N - 1);
            }
            int64_t zp = spread(z, planned_elements), zc = spread(z, causal_elements);
            if (extra[ei] == 0) {
                assert_int_equal(zp, 0);
                assert_int_equal(zc, 0);
            }
            assert_true(zp < chunk * chunk);
            assert_true(zc < chunk * chunk);

            d.layout = FGI_RING_CONTIGUOUS;
            fgi_ring_plan *c = plan_or_fail(NULL, &d);
            check_plan(c);
            int64_t cp = spread(c, planned_elements), cc = spread(c, causal_elements);
            /* rank N - 1 does b x L (b = L / N, its rows), rank 0 at most
             * (b + 1)^2: the spread is about N - 1 contiguous pairs */
            int64_t b = L / N;
            assert_true(cp >= (N - 1) * b * b - 2 * b - 1);
            assert_true(cp > chunk * chunk);
            assert_true(cc > chunk * chunk);
            /* rank r computes r + 1 pairs; shard o travels only up to rank
             * N - 1, so rank N - 1 never sends and rank 0 never receives:
             * rank r < N - 1 passes on the shards 0..r at steps r..0 */
            for (int r = 0; r < N; r++) {
                assert_int_equal(c->ranks[r].pairs_computed, r + 1);
                assert_int_equal(c->ranks[r].sends, r == N - 1 ? 0 : r + 1);
                assert_int_equal(c->ranks[r].recvs, r);
            }
            fgi_ring_plan_destroy(z);
            fgi_ring_plan_destroy(c);
        }
}

/* A window shorter than a contiguous chunk: each shard is used by its own
 * rank and the next, so it is sent once, at step 0, and never further --
 * under the contiguous layout. */
static void test_window_skips_transfers(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *sliding = gallery(ctx, "sliding_window");
    fg_binding w = fg_bind_int("WINDOW", 50);
    fgi_ring_mod_classifier mc = {ctx, sliding, &w, 1, 1, 1, 0, 0};
    fgi_ring_desc d = desc_of(8, 8 * 128, 8 * 128, FGI_RING_CONTIGUOUS, 128, fgi_ring_class_mod, &mc);
    fgi_ring_plan *p = plan_or_fail(ctx, &d);
    check_plan(p);
    for (int r = 0; r < 8; r++) {
        const fgi_ring_rank *rk = &p->ranks[r];
        assert_int_equal(rk->sends, r < 7 ? 1 : 0);
        assert_int_equal(rk->recvs, r > 0 ? 1 : 0);
        assert_int_equal(rk->steps[0].send, r < 7);
        assert_int_equal(rk->pairs_computed, r > 0 ? 2 : 1);
        for (int s = 2; s < 8; s++) assert_false(rk->steps[s].holds);
    }
    fgi_ring_plan_destroy(p);
    /* zig-zag is the wrong layout for it: rank r's late chunk needs the
     * shard of rank r + 1, which comes round the ring last, so every rank
     * forwards shards at almost every step (align 1: 16 chunks of 64 rows;
     * with 128-row units there would be only 8 units, and the late chunks
     * empty) */
    d.layout = FGI_RING_ZIGZAG;
    d.align = 1;
    p = plan_or_fail(ctx, &d);
    check_plan(p);
    for (int r = 0; r < 8; r++) assert_true(p->ranks[r].sends >= 6);
    fgi_ring_plan_destroy(p);
    fg_mod_destroy(sliding);
    fg_ctx_destroy(ctx);
}

/* ---- the backward's dK/dV sums ---------------------------------------------- */

/* Classes from a hash of the pair: arbitrary patterns of empty, partial
 * and full pairs, so the schedule meets shards that stop early, ranks that
 * hold a shard without computing, and shards nobody uses. */
static fg_status random_class(void *user, int64_t q_start, int64_t q_len, int64_t kv_start, int64_t kv_len,
                              fgi_ring_class *cls) {
    (void)q_len, (void)kv_len;
    uint64_t h = *(const uint64_t *)user ^ ((uint64_t)q_start * 0x9E3779B97F4A7C15u) ^
                 ((uint64_t)kv_start * 0xC2B2AE3D27D4EB4Fu);
    h ^= h >> 29, h *= 0xBF58476D1CE4E5B9u, h ^= h >> 32;
    *cls = (fgi_ring_class)(h % 3);
    return FG_OK;
}

/* Run the backward's sum messages over the plan on the CPU, with a set of
 * contributing ranks in place of each sum (a bit per rank): every send
 * must meet exactly one receive of the same step, peer and rows; a rank
 * receives the sums of the shard it holds next exactly when it will hold
 * it; and each rank's own shard ends with exactly the ranks that computed
 * a pair with it. */
static void check_sum_schedule(const fgi_ring_plan *p) {
    const int N = p->world;
    uint64_t held[FGI_RING_MAX_WORLD] = {0}; /* the sums each rank holds at a step */
    uint64_t home[FGI_RING_MAX_WORLD] = {0};
    bool home_set[FGI_RING_MAX_WORLD] = {false};
    for (int s = 0; s < N; s++) {
        uint64_t sent[FGI_RING_MAX_WORLD][FGI_RING_MAX_WORLD] = {{0}}; /* [from][to] */
        int nsent[FGI_RING_MAX_WORLD][FGI_RING_MAX_WORLD] = {{0}};
        int64_t rows_sent[FGI_RING_MAX_WORLD][FGI_RING_MAX_WORLD] = {{0}};
        /* each holder adds its share, then posts its sends */
        for (int r = 0; r < N; r++) {
            const fgi_ring_step *st = &p->ranks[r].steps[s];
            if (!st->holds) continue;
            if (s == 0) held[r] = 0;
            for (int i = 0; i < st->npairs; i++)
                if (st->pairs[i].cls != FGI_RING_EMPTY) held[r] |= 1ull << r;
            if (!st->send && st->kv_source == r) home[r] = held[r], home_set[r] = true; /* stored at step 0 */
        }
        fgi_ring_msg msgs[FGI_RING_MAX_WORLD][FGI_RING_MAX_MSGS];
        int nmsg[FGI_RING_MAX_WORLD];
        for (int r = 0; r < N; r++) {
            nmsg[r] = fgi_ring_sum_msgs(p, r, s, msgs[r]);
            for (int i = 0; i < nmsg[r]; i++) {
                const fgi_ring_msg *m = &msgs[r][i];
                if (!m->send) continue;
                assert_true(p->ranks[r].steps[s].holds);
                assert_int_equal(m->rows, p->ranks[r].steps[s].kv_rows);
                sent[r][m->peer] = held[r];
                rows_sent[r][m->peer] = m->rows;
                nsent[r][m->peer]++;
            }
        }
        for (int r = 0; r < N; r++) {
            bool got_next = false;
            for (int i = 0; i < nmsg[r]; i++) {
                const fgi_ring_msg *m = &msgs[r][i];
                if (m->send) continue;
                if (nsent[m->peer][r] != 1) fail_msg("%s: step %d: rank %d receives from %d, which sends %d", current_case, s, r, m->peer, nsent[m->peer][r]);
                assert_int_equal(rows_sent[m->peer][r], m->rows);
                nsent[m->peer][r] = 0;
                if (m->kind == FGI_RING_SUM_NEXT) {
                    assert_true(s + 1 < N && p->ranks[r].steps[s + 1].holds);
                    assert_int_equal(m->rows, p->ranks[r].steps[s + 1].kv_rows);
                    held[r] = sent[m->peer][r];
                    got_next = true;
                } else {
                    assert_int_equal(m->kind, FGI_RING_SUM_MINE);
                    assert_false(home_set[r]);
                    assert_int_equal(m->rows, p->ranks[r].kv_rows);
                    home[r] = sent[m->peer][r], home_set[r] = true;
                }
            }
            if (s + 1 < N) assert_int_equal(got_next, p->ranks[r].steps[s + 1].holds);
        }
        for (int a = 0; a < N; a++)
            for (int b = 0; b < N; b++)
                if (nsent[a][b]) fail_msg("%s: step %d: rank %d sends to %d, which does not receive", current_case, s, a, b);
    }
    for (int o = 0; o < N; o++) {
        uint64_t want = 0;
        for (int r = 0; r < N; r++)
            for (int s = 0; s < N; s++) {
                const fgi_ring_step *st = &p->ranks[r].steps[s];
                if (st->holds && st->kv_source == o)
                    for (int i = 0; i < st->npairs; i++)
                        if (st->pairs[i].cls != FGI_RING_EMPTY) want |= 1ull << r;
            }
        if (!home_set[o] || home[o] != want)
            fail_msg("%s: rank %d's dK/dV: contributions %#llx, want %#llx%s", current_case, o,
                     (unsigned long long)home[o], (unsigned long long)want, home_set[o] ? "" : " (never stored)");
    }
}

static void test_backward_sums(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *sliding = gallery(ctx, "sliding_window");
    static const fgi_ring_layout layouts[] = {FGI_RING_CONTIGUOUS, FGI_RING_ZIGZAG};
    const int worlds[] = {1, 2, 3, 4, 5, 8, 16};
    for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++)
        for (size_t li = 0; li < 2; li++) {
            const int N = worlds[wi];
            const int64_t len = (int64_t)N * 2 * 128 + 77;
            for (uint64_t seed = 0; seed < 40; seed++) {
                snprintf(current_case, sizeof current_case, "N=%d %s random classes %llu", N,
                         layouts[li] == FGI_RING_ZIGZAG ? "zig-zag" : "contiguous", (unsigned long long)seed);
                fgi_ring_desc d = desc_of(N, len, len, layouts[li], 128, random_class, &seed);
                fgi_ring_plan *p = plan_or_fail(ctx, &d);
                check_sum_schedule(p);
                fgi_ring_plan_destroy(p);
            }
            snprintf(current_case, sizeof current_case, "N=%d %s causal", N,
                     layouts[li] == FGI_RING_ZIGZAG ? "zig-zag" : "contiguous");
            fgi_ring_desc d = desc_of(N, len, len, layouts[li], 128, fgi_ring_class_causal, NULL);
            fgi_ring_plan *p = plan_or_fail(ctx, &d);
            check_sum_schedule(p);
            fgi_ring_plan_destroy(p);
            snprintf(current_case, sizeof current_case, "N=%d %s sliding window", N,
                     layouts[li] == FGI_RING_ZIGZAG ? "zig-zag" : "contiguous");
            fg_binding w = fg_bind_int("WINDOW", 200);
            fgi_ring_mod_classifier mc = {ctx, sliding, &w, 1, 1, 1, 0, 0};
            d = desc_of(N, len, len, layouts[li], 128, fgi_ring_class_mod, &mc);
            p = plan_or_fail(ctx, &d);
            check_sum_schedule(p);
            fgi_ring_plan_destroy(p);
        }
    fg_mod_destroy(sliding);
    fg_ctx_destroy(ctx);
}

/* ---- bad input ---------------------------------------------------------- */

static fg_status fails_with_io(void *user, int64_t a, int64_t b, int64_t c, int64_t d, fgi_ring_class *cls) {
    (void)a, (void)b, (void)c, (void)d, (void)cls;
    return fgi_error(user, FG_ERR_IO, "classifier failed on purpose");
}

static fg_status makes_up_a_class(void *user, int64_t a, int64_t b, int64_t c, int64_t d, fgi_ring_class *cls) {
    (void)user, (void)a, (void)b, (void)c, (void)d;
    *cls = (fgi_ring_class)7;
    return FG_OK;
}

typedef struct bad_row {
    int world;
    int64_t q_len, kv_len, align;
    int layout;
    fgi_ring_class_fn fn;
    fg_status want;
    const char *says;
} bad_row;

static const bad_row bad_rows[] = {
    {0, 10, 10, 1, FGI_RING_ZIGZAG, NULL, FG_ERR_INVALID_ARGUMENT, "world size 0"},
    {65, 10, 10, 1, FGI_RING_ZIGZAG, NULL, FG_ERR_INVALID_ARGUMENT, "world size 65"},
    {2, 10, 10, 1, 0, NULL, FG_ERR_INVALID_ARGUMENT, "layout 0"},
    {2, 10, 10, 1, 3, NULL, FG_ERR_INVALID_ARGUMENT, "layout 3"},
    {2, 10, 10, -1, FGI_RING_ZIGZAG, NULL, FG_ERR_INVALID_ARGUMENT, "alignment -1"},
    {2, 10, 10, (1 << 20) + 1, FGI_RING_ZIGZAG, NULL, FG_ERR_INVALID_ARGUMENT, "alignment 1048577"},
    {2, 0, 10, 1, FGI_RING_CONTIGUOUS, NULL, FG_ERR_SHAPE, "lengths 0"},
    {2, 10, -1, 1, FGI_RING_CONTIGUOUS, NULL, FG_ERR_SHAPE, "(kv)"},
    {2, (int64_t)INT32_MAX + 1, 10, 1, FGI_RING_CONTIGUOUS, NULL, FG_ERR_SHAPE, "2147483648"},
    {2, 10, 10, 1, FGI_RING_ZIGZAG, fails_with_io, FG_ERR_IO, "on purpose"},
    {2, 10, 10, 1, FGI_RING_ZIGZAG, makes_up_a_class, FG_ERR_INVALID_ARGUMENT, "gave 7"},
};

static void test_bad_input(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    for (size_t i = 0; i < sizeof bad_rows / sizeof bad_rows[0]; i++) {
        const bad_row *b = &bad_rows[i];
        fgi_ring_desc d = desc_of(b->world, b->q_len, b->kv_len, (fgi_ring_layout)b->layout, b->align, b->fn, ctx);
        fgi_ring_plan *p = (fgi_ring_plan *)&d;
        assert_int_equal(fgi_ring_plan_create(ctx, &d, &p), b->want);
        assert_null(p);
        if (!strstr(fg_errmsg(ctx), b->says)) {
            print_error("row %zu: '%s' lacks '%s'\n", i, fg_errmsg(ctx), b->says);
            fail();
        }
    }
    fgi_ring_desc ok = desc_of(2, 10, 10, FGI_RING_ZIGZAG, 1, NULL, NULL);
    assert_int_equal(fgi_ring_plan_create(ctx, NULL, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fgi_ring_plan_create(ctx, &ok, NULL), FG_ERR_INVALID_ARGUMENT);
    fgi_ring_plan_destroy(NULL);

    /* the mod classifier's errors come through: an unbound buffer */
    fg_mod *document = gallery(ctx, "document");
    fgi_ring_mod_classifier mc = {ctx, document, NULL, 0, 1, 1, 0, 0};
    fgi_ring_desc d = desc_of(2, 64, 64, FGI_RING_ZIGZAG, 1, fgi_ring_class_mod, &mc);
    fgi_ring_plan *p = NULL;
    assert_int_equal(fgi_ring_plan_create(ctx, &d, &p), FG_ERR_UNBOUND);
    assert_null(p);
    /* and an out-of-range buffer read (ids for half the sequence) */
    int32_t ids[32] = {0};
    fg_binding bd = fg_bind_int_buffer("document_id", ids, 32);
    mc.binds = &bd;
    mc.nbinds = 1;
    assert_int_equal(fgi_ring_plan_create(ctx, &d, &p), FG_ERR_EVAL);
    assert_null(p);
    fg_mod_destroy(document);
    fg_ctx_destroy(ctx);
}

/* ---- the NCCL loader ------------------------------------------------------- */

static void assert_says(fg_ctx *ctx, const char *what) {
    if (!strstr(fg_errmsg(ctx), what)) {
        print_error("message '%s' lacks '%s'\n", fg_errmsg(ctx), what);
        fail();
    }
}

#define MISSING_LIB "/nonexistent/flexgen-test/libnccl.so.2"

/* The process-wide loader: FLEXGEN_NCCL_LIB names a file that does not
 * exist, so the first use fails and names it; the outcome is kept, so a
 * later call fails the same way even with the variable changed. */
static void test_nccl_once_env_missing(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    setenv("FLEXGEN_NCCL_LIB", MISSING_LIB, 1);
    const fgi_nccl_lib *lib = (const fgi_nccl_lib *)ctx;
    assert_int_equal(fgi_nccl_ready(ctx, &lib), FG_ERR_NOT_SUPPORTED);
    assert_null(lib);
    assert_says(ctx, MISSING_LIB);
    assert_says(ctx, "FLEXGEN_NCCL_LIB");
    const char *fake = getenv("FLEXGEN_TEST_FAKE_NCCL");
    if (fake) setenv("FLEXGEN_NCCL_LIB", fake, 1);
    else unsetenv("FLEXGEN_NCCL_LIB");
    assert_int_equal(fgi_nccl_ready(ctx, NULL), FG_ERR_NOT_SUPPORTED);
    assert_says(ctx, MISSING_LIB);
    /* what goes through the process-wide library fails alike */
    int comm[3] = {0, 1, 0};
    fgi_nccl_comm_info info;
    assert_int_equal(fgi_nccl_comm_info_get(ctx, NULL, comm, &info), FG_ERR_NOT_SUPPORTED);
    assert_says(ctx, MISSING_LIB);
    /* a step with nothing to move needs no library */
    fgi_nccl_transfer none = {0};
    assert_int_equal(fgi_nccl_ring_exchange(ctx, NULL, comm, &none, NULL), FG_OK);
    unsetenv("FLEXGEN_NCCL_LIB");
    fg_ctx_destroy(ctx);
}

typedef struct open_row {
    const char *path;    /* NULL: from the environment variable below   */
    const char *env;     /* for FLEXGEN_NCCL_LIB (NULL: unset)            */
    const char *says[2]; /* in the message                                */
} open_row;

/* Files that are no usable NCCL: each FG_ERR_NOT_SUPPORTED with a message
 * naming the file and the trouble, nothing left open. */
static void test_nccl_open_errors(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    char readme[4096];
    snprintf(readme, sizeof readme, "%s", tu_path("README.md"));
    const char *norecv = getenv("FLEXGEN_TEST_FAKE_NCCL_NORECV");
    const open_row rows[] = {
        {MISSING_LIB, NULL, {MISSING_LIB, "could not be opened"}},
        {NULL, MISSING_LIB, {MISSING_LIB, "FLEXGEN_NCCL_LIB names"}},
        {readme, NULL, {readme, "could not be opened"}},
        {"libm.so.6", NULL, {"libm.so.6 has no ncclGetVersion", "FLEXGEN_NCCL_LIB"}},
        {norecv, NULL, {norecv ? norecv : "", "has no ncclRecv"}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const open_row *w = &rows[i];
        if (!w->path && !w->env) continue; /* the fake was not built */
        if (w->env) setenv("FLEXGEN_NCCL_LIB", w->env, 1);
        fgi_nccl_lib lib;
        memset(&lib, 0xab, sizeof lib);
        assert_int_equal(fgi_nccl_lib_open(ctx, w->path, &lib), FG_ERR_NOT_SUPPORTED);
        assert_null(lib.handle);
        assert_null(lib.api.ncclSend);
        for (int k = 0; k < 2; k++) assert_says(ctx, w->says[k]);
        unsetenv("FLEXGEN_NCCL_LIB");
    }
    /* with nothing set, the default names: found or not, the status says */
    fgi_nccl_lib lib;
    fg_status st = fgi_nccl_lib_open(ctx, NULL, &lib);
    assert_true(st == FG_OK || st == FG_ERR_NOT_SUPPORTED);
    if (st == FG_OK) {
        assert_true(lib.version >= FGI_NCCL_MIN_VERSION);
        fgi_nccl_lib_close(&lib);
    } else {
        assert_says(ctx, "libnccl.so.2");
        assert_says(ctx, "FLEXGEN_NCCL_LIB");
    }
    assert_int_equal(fgi_nccl_lib_open(ctx, MISSING_LIB, NULL), FG_ERR_INVALID_ARGUMENT);
    fgi_nccl_lib_close(NULL);
    fg_ctx_destroy(ctx);
}

typedef struct version_row {
    int reported;   /* what ncclGetVersion says         */
    fg_status want;
    int version;    /* normalised                       */
} version_row;

static const version_row version_rows[] = {
    {22304, FG_OK, 22304},                  /* 2.23.4 */
    {20903, FG_OK, 20903},                  /* 2.9.3, the new encoding */
    {2804, FG_OK, 20804},                   /* 2.8.4, the old one */
    {2708, FG_OK, 20708},                   /* 2.7.8 */
    {2604, FG_ERR_NOT_SUPPORTED, 20604},    /* 2.6.4: no send / recv */
};

/* The stand-in NCCL: versions, the communicator query, a ring step's calls
 * and an error turned into a status with NCCL's own text. */
static void test_nccl_fake(void **state) {
    (void)state;
    const char *path = getenv("FLEXGEN_TEST_FAKE_NCCL");
    if (!path) skip();
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    void (*set_version)(int) = NULL;
    const char *(*log)(void) = NULL;
    void (*reset)(void) = NULL;
    void *sym = dlsym(h, "fake_nccl_set_version");
    memcpy(&set_version, &sym, sizeof sym);
    sym = dlsym(h, "fake_nccl_log");
    memcpy(&log, &sym, sizeof sym);
    sym = dlsym(h, "fake_nccl_reset");
    memcpy(&reset, &sym, sizeof sym);
    assert_true(set_version && log && reset);
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fgi_nccl_lib lib;
    for (size_t i = 0; i < sizeof version_rows / sizeof version_rows[0]; i++) {
        set_version(version_rows[i].reported);
        assert_int_equal(fgi_nccl_version_normalise(version_rows[i].reported), version_rows[i].version);
        assert_int_equal(fgi_nccl_lib_open(ctx, path, &lib), version_rows[i].want);
        if (version_rows[i].want == FG_OK) {
            assert_int_equal(lib.version, version_rows[i].version);
            assert_string_equal(lib.path, path);
            fgi_nccl_lib_close(&lib);
        } else {
            assert_says(ctx, "2.6.4");
            assert_says(ctx, "2.7 or newer");
        }
    }
    set_version(22304);
    assert_int_equal(fgi_nccl_lib_open(ctx, path, &lib), FG_OK);

    /* the communicator: rank 2 of 4 on device 1 */
    int comm[3] = {2, 4, 1}, bad[3] = {5, 4, 0};
    fgi_nccl_comm_info info = {0};
    assert_int_equal(fgi_nccl_comm_info_get(ctx, &lib, comm, &info), FG_OK);
    assert_int_equal(info.rank, 2);
    assert_int_equal(info.size, 4);
    assert_int_equal(info.device, 1);
    assert_int_equal(fgi_nccl_comm_info_get(ctx, &lib, bad, &info), FG_ERR_INVALID_ARGUMENT);
    assert_says(ctx, "rank 5 of 4");
    assert_int_equal(fgi_nccl_comm_info_get(ctx, &lib, NULL, &info), FG_ERR_INVALID_ARGUMENT);

    /* a ring step: K and V to the next rank, the previous rank's in, one
     * group, bytes as ncclUint8 (1); a 0-byte buffer is skipped */
    char k[64], v[64], rk[64], rv[64];
    fgi_nccl_transfer t = {2, 3, {k, v}, {64, 48}, 3, 1, {rk, rv, NULL}, {64, 48, 0}};
    reset();
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &t, NULL), FG_OK);
    assert_string_equal(log(), "start;send(3,64,1);send(3,48,1);recv(1,64,1);recv(1,48,1);end;");
    /* a step that only receives (the last rank of a causal contiguous
     * ring) */
    fgi_nccl_transfer only_recv = {0, 3, {NULL}, {0}, 1, 1, {rk}, {16}};
    reset();
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &only_recv, NULL), FG_OK);
    assert_string_equal(log(), "start;recv(1,16,1);end;");

    /* NCCL refuses a peer outside the communicator: the status carries
     * NCCL's text, and the group is still closed */
    t.next = 7;
    reset();
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &t, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_says(ctx, "ncclSend: NCCL error 4: invalid argument (fake NCCL)");
    assert_string_equal(log(), "start;end;");
    t.next = 3;
    t.prev = -1;
    reset();
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &t, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_says(ctx, "ncclRecv: NCCL error 4");
    assert_string_equal(log(), "start;send(3,64,1);send(3,48,1);end;");
    t.prev = 1;
    t.nsend = 5;
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &t, NULL), FG_ERR_INVALID_ARGUMENT);
    t.nsend = 2;
    t.send_buf[1] = NULL;
    assert_int_equal(fgi_nccl_ring_exchange(ctx, &lib, comm, &t, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_says(ctx, "send buffer 1 is NULL");

    /* the backward's int64 sums across the ranks: one group, in place */
    long long g0[8], g1[4];
    void *bufs[3] = {g0, NULL, g1};
    const size_t counts[3] = {8, 0, 4};
    reset();
    assert_int_equal(fgi_nccl_sum_i64(ctx, &lib, comm, bufs, counts, 3, NULL), FG_OK);
    assert_string_equal(log(), "start;allreduce(0,8,4);allreduce(0,4,4);end;");
    const size_t none[1] = {0};
    reset();
    assert_int_equal(fgi_nccl_sum_i64(ctx, &lib, comm, bufs, none, 1, NULL), FG_OK);
    assert_string_equal(log(), "");

    /* results other than misuse are communication failures */
    assert_int_equal(fgi_nccl_status(ctx, &lib, FGI_NCCL_SUCCESS, "x"), FG_OK);
    assert_int_equal(fgi_nccl_status(ctx, &lib, FGI_NCCL_SYSTEM_ERROR, "ncclGroupEnd"), FG_ERR_CUDA);
    assert_says(ctx, "ncclGroupEnd: NCCL error 2: system error (fake NCCL)");
    assert_int_equal(fgi_nccl_status(ctx, &lib, FGI_NCCL_INVALID_USAGE, "ncclSend"), FG_ERR_INVALID_ARGUMENT);

    fgi_nccl_dtype dt = -1;
    assert_int_equal(fgi_nccl_dtype_of(ctx, FG_BF16, &dt), FG_OK);
    assert_int_equal(dt, FGI_NCCL_BFLOAT16);
    assert_int_equal(fgi_nccl_dtype_of(ctx, FG_FP16, &dt), FG_OK);
    assert_int_equal(dt, FGI_NCCL_FLOAT16);
    assert_int_equal(fgi_nccl_dtype_of(ctx, (fg_dtype)9, &dt), FG_ERR_INVALID_ARGUMENT);

    fgi_nccl_lib_close(&lib);
    fg_ctx_destroy(ctx);
    dlclose(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* first: the only test that triggers the once-only load */
        cmocka_unit_test(test_nccl_once_env_missing),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_one_step),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_block_size_independent),
        cmocka_unit_test(test_causal_balance),
        cmocka_unit_test(test_window_skips_transfers),
        cmocka_unit_test(test_backward_sums),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_nccl_open_errors),
        cmocka_unit_test(test_nccl_fake),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
