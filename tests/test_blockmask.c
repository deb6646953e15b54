/* test_blockmask.c -- block masks on the CPU: the layout, the classification
 * rule for ragged blocks, from_kv_blocks, sparsity, the picture, bad input.
 *
 * The expected block masks are derived here from first principles: for the
 * masks below, whether a tile is full, empty or partial follows from the
 * tile's index ranges alone (e.g. causal: full iff the lowest q is >= the
 * highest kv), computed without the evaluator. The property test then checks
 * the other direction for any mask: expanding a block mask back to elements
 * (full -> true, empty -> false, partial -> the evaluator) gives the
 * evaluator's dense mask, for random shapes and every gallery mask. */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmask.h"

enum { EMPTY = 0, PARTIAL = 1, FULL = 2 };

static fg_mod *mod_src(fg_ctx *ctx, const char *text) {
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "test", text, (size_t)-1, &m);
    if (st != FG_OK) print_error("%s\n%s\n", fg_status_string(st), fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

#define SIG "bool mask_mod(int b, int h, int q_idx, int kv_idx) "
static const char CAUSAL[] = SIG "{ return q_idx >= kv_idx; }\n";
static const char SLIDING[] = "int WINDOW = 100;\n" SIG
                              "{ return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW; }\n";
static const char PREFIX[] = "int PREFIX = 300;\n" SIG "{ return kv_idx < PREFIX || q_idx >= kv_idx; }\n";
static const char DOCUMENT[] = "const int *doc;\n" SIG "{ return doc[q_idx] == doc[kv_idx]; }\n";

/* ---- expected tiles from first principles ----------------------------- */

/* A tile's in-range extent: q in [qlo, qhi], kv in [klo, khi]. */
typedef struct extent { int b, h, qlo, qhi, klo, khi; } extent;
typedef int (*tile_rule)(const extent *e, const void *arg);

static int rule_causal(const extent *e, const void *arg) {
    (void)arg;
    if (e->qlo >= e->khi) return FULL;
    if (e->qhi < e->klo) return EMPTY;
    return PARTIAL;
}

/* q - kv takes every value in [qlo - khi, qhi - klo] over the rectangle. */
static int rule_sliding(const extent *e, const void *arg) {
    int w = *(const int *)arg, dmin = e->qlo - e->khi, dmax = e->qhi - e->klo;
    if (dmin >= 0 && dmax <= w) return FULL;
    if (dmax < 0 || dmin > w) return EMPTY;
    return PARTIAL;
}

/* kv < P || q >= kv: the columns kv >= P need q >= kv on every row. */
static int rule_prefix(const extent *e, const void *arg) {
    int p = *(const int *)arg;
    if (e->khi < p || e->qlo >= e->khi) return FULL;
    if (e->klo >= p && e->qhi < e->klo) return EMPTY;
    return PARTIAL;
}

/* Document ids are non-decreasing and every id in between occurs, so a
 * range of positions covers the id interval [doc[lo], doc[hi]]. */
static int rule_document(const extent *e, const void *arg) {
    const int32_t *doc = arg;
    int q0 = doc[e->qlo], q1 = doc[e->qhi], k0 = doc[e->klo], k1 = doc[e->khi];
    if (q0 == q1 && k0 == k1 && q0 == k0) return FULL;
    if (q1 < k0 || k1 < q0) return EMPTY;
    return PARTIAL;
}

/* Compare every array of m with the lists the rule implies. */
static void check_against_rule(const fg_block_mask *m, tile_rule rule, const void *arg) {
    fg_block_mask_desc d;
    assert_int_equal(fg_block_mask_get_desc(m, &d), FG_OK);
    int QB = (d.q_len + d.q_block - 1) / d.q_block, KB = (d.kv_len + d.kv_block - 1) / d.kv_block;
    const int32_t *a[8];
    for (int i = 0; i < 8; i++) {
        int64_t dims[4];
        assert_int_equal(fg_block_mask_array_get(m, (fg_block_mask_array)(i + 1), &a[i], NULL, dims), FG_OK);
        assert_non_null(a[i]);
        assert_int_equal(dims[0], d.batch);
        assert_int_equal(dims[1], d.heads);
        assert_int_equal(dims[2], i < 4 ? QB : KB);
        assert_int_equal(dims[3], i % 2 ? (i < 4 ? KB : QB) : 1);
    }
    int *cls = malloc(sizeof(int) * (size_t)QB * KB);
    for (int b = 0; b < d.batch; b++)
        for (int h = 0; h < d.heads; h++) {
            int64_t bh = (int64_t)b * d.heads + h;
            for (int qb = 0; qb < QB; qb++)
                for (int kb = 0; kb < KB; kb++) {
                    extent e = {b, h, qb * d.q_block, (qb + 1) * d.q_block - 1, kb * d.kv_block,
                                (kb + 1) * d.kv_block - 1};
                    if (e.qhi >= d.q_len) e.qhi = d.q_len - 1;
                    if (e.khi >= d.kv_len) e.khi = d.kv_len - 1;
                    cls[qb * KB + kb] = rule(&e, arg);
                }
            /* rows: kv lists; columns: q lists; both ascending, zero tails */
            for (int pass = 0; pass < 2; pass++) {
                int outer = pass ? KB : QB, inner = pass ? QB : KB;
                for (int o = 0; o < outer; o++) {
                    int64_t row = bh * outer + o;
                    for (int want = PARTIAL; want <= FULL; want++) {
                        int slot = pass * 4 + (want == FULL ? 2 : 0);
                        int n = 0;
                        for (int i = 0; i < inner; i++) {
                            int c = pass ? cls[i * KB + o] : cls[o * KB + i];
                            if (c != want) continue;
                            assert_int_equal(a[slot + 1][row * inner + n], i);
                            n++;
                        }
                        assert_int_equal(a[slot][row], n);
                        for (int i = n; i < inner; i++) assert_int_equal(a[slot + 1][row * inner + i], 0);
                    }
                }
            }
        }
    free(cls);
}

static fg_block_mask *build(fg_ctx *ctx, fg_mod *mod, fg_block_mask_desc d, const fg_binding *bd,
                            size_t nb) {
    fg_block_mask *m = NULL;
    fg_status st = fg_block_mask_create(ctx, mod, &d, bd, nb, &m);
    if (st != FG_OK) print_error("%s: %s\n", fg_status_string(st), fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}

static void test_causal_1000(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    fg_block_mask_desc d = {1, 1, 1000, 1000, 128, 128};
    fg_block_mask *m = build(ctx, mod, d, NULL, 0);
    /* 8 blocks of 128, the last holding 104 rows: q block i has one partial
     * block (the diagonal, ragged or not) and i full ones before it. */
    const int32_t *num, *idx, *fnum, *fidx;
    assert_int_equal(fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &num, NULL, NULL), FG_OK);
    assert_int_equal(fg_block_mask_array_get(m, FG_BM_KV_INDICES, &idx, NULL, NULL), FG_OK);
    assert_int_equal(fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL), FG_OK);
    assert_int_equal(fg_block_mask_array_get(m, FG_BM_FULL_KV_INDICES, &fidx, NULL, NULL), FG_OK);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(num[i], 1);
        assert_int_equal(idx[i * 8], i);
        assert_int_equal(fnum[i], i);
        for (int j = 0; j < i; j++) assert_int_equal(fidx[i * 8 + j], j);
    }
    check_against_rule(m, rule_causal, NULL);
    double sp;
    assert_int_equal(fg_block_mask_sparsity(m, &sp), FG_OK);
    assert_true(sp > 28.0 / 64 - 1e-12 && sp < 28.0 / 64 + 1e-12);
    fg_block_mask_destroy(m);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* Documents of lengths drawn in [1, max_len]: ids 0, 0, ..., 1, 1, ... */
static void random_documents(uint64_t *rng, int32_t *doc, int n, int max_len) {
    int id = 0, left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
    for (int i = 0; i < n; i++) {
        if (left == 0) {
            id++;
            left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
        }
        doc[i] = id;
        left--;
    }
}

typedef struct rule_case {
    int q_len, kv_len, q_block, kv_block, param;
} rule_case;

static const rule_case rule_cases[] = {
    {1000, 1000, 128, 128, 100}, {1, 1, 128, 128, 0},    {127, 129, 64, 64, 1},
    {129, 127, 64, 128, 64},     {1000, 777, 64, 64, 300}, {8191, 8191, 128, 128, 1024},
    {300, 4000, 128, 64, 2000},  {513, 513, 16, 32, 17},
};

static void test_rules(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *causal = mod_src(ctx, CAUSAL), *sliding = mod_src(ctx, SLIDING),
           *prefix = mod_src(ctx, PREFIX), *document = mod_src(ctx, DOCUMENT);
    uint64_t rng = 42;
    for (size_t i = 0; i < sizeof rule_cases / sizeof rule_cases[0]; i++) {
        const rule_case *c = &rule_cases[i];
        fg_block_mask_desc d = {1, 1, c->q_len, c->kv_len, c->q_block, c->kv_block};
        fg_block_mask *m = build(ctx, causal, d, NULL, 0);
        check_against_rule(m, rule_causal, NULL);
        fg_block_mask_destroy(m);

        fg_binding w = fg_bind_int("WINDOW", c->param);
        m = build(ctx, sliding, d, &w, 1);
        check_against_rule(m, rule_sliding, &c->param);
        fg_block_mask_destroy(m);

        fg_binding p = fg_bind_int("PREFIX", c->param);
        m = build(ctx, prefix, d, &p, 1);
        check_against_rule(m, rule_prefix, &c->param);
        fg_block_mask_destroy(m);

        int n = c->q_len > c->kv_len ? c->q_len : c->kv_len;
        int32_t *doc = malloc(sizeof *doc * (size_t)n);
        random_documents(&rng, doc, n, 1 + c->param * 3);
        fg_binding bd = fg_bind_int_buffer("doc", doc, n);
        m = build(ctx, document, d, &bd, 1);
        check_against_rule(m, rule_document, doc);
        fg_block_mask_destroy(m);
        free(doc);
    }
    fg_mod_destroy(causal);
    fg_mod_destroy(sliding);
    fg_mod_destroy(prefix);
    fg_mod_destroy(document);
    fg_ctx_destroy(ctx);
}

/* ---- the property: block mask expanded == dense mask --------------------- */

/* Bind every parameter of mod: scalars a random value in [lo, hi] (ints) or
 * their default scaled (floats); int buffers non-decreasing document-like
 * ids; float buffers values in [-1, 1]; each buffer long enough for any
 * index the gallery uses (positions, heads, batches). */
typedef struct bound {
    fg_binding binds[16];
    void *mem[16];
    size_t n;
} bound;

static void bind_random(fg_ctx *ctx, const fg_mod *mod, uint64_t *rng, int len, bound *bd) {
    (void)ctx;
    memset(bd, 0, sizeof *bd);
    size_t np = fg_mod_param_count(mod);
    assert_true(np <= 16);
    for (size_t i = 0; i < np; i++) {
        fg_param_info pi;
        assert_int_equal(fg_mod_param(mod, i, &pi), FG_OK);
        if (pi.kind == FG_PARAM_BUFFER) {
            if (pi.type == FG_TYPE_INT) {
                int32_t *v = malloc(sizeof *v * (size_t)len);
                random_documents(rng, v, len, 1 + (int)(tu_rand_u64(rng) % 300));
                bd->mem[bd->n] = v;
                bd->binds[bd->n++] = fg_bind_int_buffer(pi.name, v, len);
            } else {
                float *v = malloc(sizeof *v * (size_t)len);
                for (int k = 0; k < len; k++) v[k] = (float)(2 * tu_rand_uniform(rng) - 1);
                bd->mem[bd->n] = v;
                bd->binds[bd->n++] = fg_bind_float_buffer(pi.name, v, len);
            }
        } else if (pi.type == FG_TYPE_INT) {
            /* around the default, so windows and prefixes stay meaningful */
            int def = (int)pi.default_value;
            int span = def > 0 ? def : 64;
            bd->binds[bd->n++] = fg_bind_int(pi.name, 1 + (int)(tu_rand_u64(rng) % (uint64_t)(2 * span)));
        } else {
            bd->binds[bd->n++] = fg_bind_float(pi.name, (float)(pi.default_value * 2 * tu_rand_uniform(rng)));
        }
    }
}

static void unbind(bound *bd) {
    for (size_t i = 0; i < bd->n; i++) free(bd->mem[i]);
}

/* Expand m to elements and compare with the evaluator's dense mask. */
static void check_expansion(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask *m,
                            const fg_binding *binds, size_t nb) {
    fg_block_mask_desc d;
    fg_block_mask_get_desc(m, &d);
    int QB = (d.q_len + d.q_block - 1) / d.q_block, KB = (d.kv_len + d.kv_block - 1) / d.kv_block;
    const int32_t *num, *idx, *fnum, *fidx;
    fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &num, NULL, NULL);
    fg_block_mask_array_get(m, FG_BM_KV_INDICES, &idx, NULL, NULL);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_INDICES, &fidx, NULL, NULL);
    size_t n = (size_t)d.q_len * d.kv_len;
    uint8_t *dense = malloc(n), *expanded = malloc(n), *tile = malloc((size_t)d.q_block * d.kv_block);
    for (int b = 0; b < d.batch; b++)
        for (int h = 0; h < d.heads; h++) {
            assert_int_equal(fg_mod_eval_mask(ctx, mod, binds, nb, b, h, 0, d.q_len, 0, d.kv_len, dense), FG_OK);
            memset(expanded, 0, n);
            for (int qb = 0; qb < QB; qb++) {
                int64_t row = ((int64_t)b * d.heads + h) * QB + qb;
                int q0 = qb * d.q_block, nq = d.q_len - q0 < d.q_block ? d.q_len - q0 : d.q_block;
                for (int full = 0; full < 2; full++) {
                    const int32_t *cnt = full ? fnum : num, *list = full ? fidx : idx;
                    for (int i = 0; i < cnt[row]; i++) {
                        int k0 = list[row * KB + i] * d.kv_block;
                        int nk = d.kv_len - k0 < d.kv_block ? d.kv_len - k0 : d.kv_block;
                        if (!full)
                            assert_int_equal(fg_mod_eval_mask(ctx, mod, binds, nb, b, h, q0, nq, k0, nk, tile), FG_OK);
                        for (int r = 0; r < nq; r++)
                            for (int c = 0; c < nk; c++)
                                expanded[(size_t)(q0 + r) * d.kv_len + k0 + c] = full ? 1 : tile[r * nk + c];
                    }
                }
            }
            assert_memory_equal(dense, expanded, n);
        }
    free(dense);
    free(expanded);
    free(tile);
}

/* The transposes hold the same tiles as the kv lists. */
static void check_transpose(const fg_block_mask *m) {
    fg_block_mask_desc d;
    fg_block_mask_get_desc(m, &d);
    int QB = (d.q_len + d.q_block - 1) / d.q_block, KB = (d.kv_len + d.kv_block - 1) / d.kv_block;
    const int32_t *a[8];
    for (int i = 0; i < 8; i++) fg_block_mask_array_get(m, (fg_block_mask_array)(i + 1), &a[i], NULL, NULL);
    for (int64_t bh = 0; bh < (int64_t)d.batch * d.heads; bh++)
        for (int full = 0; full < 2; full++) {
            int64_t from_rows = 0, from_cols = 0;
            for (int qb = 0; qb < QB; qb++) {
                int64_t row = bh * QB + qb;
                for (int i = 0; i < a[full * 2][row]; i++) {
                    int kb = a[full * 2 + 1][row * KB + i];
                    int64_t col = bh * KB + kb;
                    /* qb must be listed in column kb */
                    int found = 0;
                    for (int j = 0; j < a[4 + full * 2][col]; j++) found |= a[5 + full * 2][col * QB + j] == qb;
                    assert_true(found);
                    from_rows++;
                }
            }
            for (int kb = 0; kb < KB; kb++) from_cols += a[4 + full * 2][bh * KB + kb];
            assert_int_equal(from_rows, from_cols);
        }
}

static const char *const property_mods[] = {CAUSAL, SLIDING, PREFIX, DOCUMENT,
    "int W = 5;\n" SIG "{ return (q_idx + h * W) % 7 != kv_idx % 5 || b == 1; }\n",
    "int C = 16;\nconst float *bias;\n" SIG "{ return bias[kv_idx] > 0.0f || q_idx / C == kv_idx / C; }\n",
    SIG "{ return false; }\n",
    SIG "{ return true; }\n"};

static void random_desc(uint64_t *rng, fg_block_mask_desc *d) {
    static const int lens[] = {1, 2, 15, 63, 64, 65, 127, 128, 129, 200, 257, 333, 511};
    memset(d, 0, sizeof *d); /* struct_size 0: the 0.1 layout */
    d->batch = 1 + (int)(tu_rand_u64(rng) % 2);
    d->heads = 1 + (int)(tu_rand_u64(rng) % 3);
    d->q_len = lens[tu_rand_u64(rng) % (sizeof lens / sizeof lens[0])];
    d->kv_len = tu_rand_u64(rng) % 3 ? lens[tu_rand_u64(rng) % (sizeof lens / sizeof lens[0])] : d->q_len;
    d->q_block = tu_rand_u64(rng) % 2 ? 64 : 128;
    d->kv_block = tu_rand_u64(rng) % 2 ? 64 : (tu_rand_u64(rng) % 2 ? 128 : 32);
}

static void property_one(fg_ctx *ctx, fg_mod *mod, uint64_t *rng) {
    fg_block_mask_desc d;
    random_desc(rng, &d);
    bound bd;
    int len = (d.q_len > d.kv_len ? d.q_len : d.kv_len) + 16;
    bind_random(ctx, mod, rng, len, &bd);
    fg_block_mask *m = build(ctx, mod, d, bd.binds, bd.n);
    check_expansion(ctx, mod, m, bd.binds, bd.n);
    check_transpose(m);
    fg_block_mask_destroy(m);
    unbind(&bd);
}

static void test_property_random(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    uint64_t rng = 7;
    for (size_t i = 0; i < sizeof property_mods / sizeof property_mods[0]; i++) {
        fg_mod *mod = mod_src(ctx, property_mods[i]);
        for (int k = 0; k < 12; k++) property_one(ctx, mod, &rng);
        fg_mod_destroy(mod);
    }
    fg_ctx_destroy(ctx);
}

static void test_property_gallery(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    DIR *dir = opendir(tu_path("mods"));
    if (!dir) skip();
    uint64_t rng = 11;
    int tested = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 3 || strcmp(e->d_name + n - 2, ".c") != 0) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(n - 2), e->d_name);
        fg_mod *mod = tu_gallery_mod(ctx, name);
        if (fg_mod_has_mask(mod)) {
            for (int k = 0; k < 6; k++) property_one(ctx, mod, &rng);
            tested++;
        }
        fg_mod_destroy(mod);
    }
    closedir(dir);
    print_message("gallery masks tested: %d\n", tested);
    fg_ctx_destroy(ctx);
}

/* B and H of 1 mean b = 0 and h = 0 for the mod; a head-dependent mask
 * differs across heads. */
static void test_heads_differ(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, SIG "{ return kv_idx < (h + 1) * 64; }\n");
    fg_block_mask_desc d = {1, 3, 256, 256, 64, 64};
    fg_block_mask *m = build(ctx, mod, d, NULL, 0);
    const int32_t *fnum;
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
    for (int h = 0; h < 3; h++)
        for (int qb = 0; qb < 4; qb++) assert_int_equal(fnum[h * 4 + qb], h + 1);
    fg_block_mask_destroy(m);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* ---- from_kv_blocks ------------------------------------------------------- */

/* Causal over 4 x 4 blocks of 64, written by hand. */
static const int32_t HAND_NUM[4] = {1, 1, 1, 1};
static const int32_t HAND_IDX[16] = {0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0};
static const int32_t HAND_FNUM[4] = {0, 1, 2, 3};
static const int32_t HAND_FIDX[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 2, 0};

static void test_from_kv_blocks(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_block_mask_desc d = {1, 1, 256, 256, 64, 64};
    fg_block_mask *m = NULL;
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, &d, HAND_NUM, HAND_IDX, HAND_FNUM, HAND_FIDX, &m), FG_OK);
    check_against_rule(m, rule_causal, NULL);
    fg_block_mask_destroy(m);
    /* no full blocks at all */
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, &d, HAND_NUM, HAND_IDX, NULL, NULL, &m), FG_OK);
    const int32_t *fq;
    fg_block_mask_array_get(m, FG_BM_FULL_Q_NUM_BLOCKS, &fq, NULL, NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(fq[i], 0);
    fg_block_mask_destroy(m);
    fg_ctx_destroy(ctx);
}

typedef struct bad_lists {
    const char *what;
    int row, entry;      /* which entry of the partial list to change (-1: count) */
    int value;
    int full_row, full_entry, full_value; /* same for the full list (row -1: none) */
} bad_lists;

static const bad_lists bad_cases[] = {
    {"count above kv blocks", 0, -1, 5, -1, 0, 0},
    {"negative count", 1, -1, -1, -1, 0, 0},
    {"index past the end", 2, 0, 4, -1, 0, 0},
    {"negative index", 3, 0, -1, -1, 0, 0},
    {"partial and full share a block", 3, 0, 1, -1, 0, 0},
    {"not ascending", -1, 0, 0, 3, 1, 0},
    {"duplicate in full list", -1, 0, 0, 2, 1, 0},
};

static void test_from_kv_blocks_errors(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_block_mask_desc d = {1, 1, 256, 256, 64, 64};
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_lists *c = &bad_cases[i];
        int32_t num[4], idx[16], fnum[4], fidx[16];
        memcpy(num, HAND_NUM, sizeof num);
        memcpy(idx, HAND_IDX, sizeof idx);
        memcpy(fnum, HAND_FNUM, sizeof fnum);
        memcpy(fidx, HAND_FIDX, sizeof fidx);
        if (c->row >= 0) {
            if (c->entry < 0) num[c->row] = c->value;
            else idx[c->row * 4 + c->entry] = c->value;
        }
        if (c->full_row >= 0) fidx[c->full_row * 4 + c->full_entry] = c->full_value;
        fg_block_mask *m = (fg_block_mask *)&d; /* must be reset to NULL */
        fg_status st = fg_block_mask_from_kv_blocks(ctx, &d, num, idx, fnum, fidx, &m);
        if (st != FG_ERR_INVALID_ARGUMENT) print_error("case '%s' gave %s\n", c->what, fg_status_string(st));
        assert_int_equal(st, FG_ERR_INVALID_ARGUMENT);
        assert_null(m);
        assert_true(strlen(fg_errmsg(ctx)) > 0);
    }
    fg_block_mask *m = NULL;
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, &d, HAND_NUM, HAND_IDX, HAND_FNUM, NULL, &m),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, &d, NULL, HAND_IDX, NULL, NULL, &m), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_from_kv_blocks(ctx, NULL, HAND_NUM, HAND_IDX, NULL, NULL, &m),
                     FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_from_kv_blocks(NULL, &d, HAND_NUM, HAND_IDX, NULL, NULL, &m),
                     FG_ERR_INVALID_ARGUMENT);
    fg_ctx_destroy(ctx);
}

/* ---- picture and sparsity --------------------------------------------------- */

static void test_picture(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    fg_block_mask_desc d = {1, 1, 1000, 1000, 128, 128};
    fg_block_mask *m = build(ctx, mod, d, NULL, 0);
    char *pic = NULL;
    assert_int_equal(fg_block_mask_picture(m, 0, 0, &pic), FG_OK);
    assert_string_equal(pic, "BlockMask(shape=(1, 1, 1000, 1000), block=(128, 128), sparsity=43.75%)\n"
                             "(0, 0)\n"
                             "+.......\n#+......\n##+.....\n###+....\n"
                             "####+...\n#####+..\n######+.\n#######+\n");
    fg_free(pic);
    /* 2 x 2 blocks per cell: a cell with only full tiles is '#', only empty
     * '.', anything else '+' */
    assert_int_equal(fg_block_mask_picture(m, 4, 4, &pic), FG_OK);
    assert_non_null(strstr(pic, "(0, 0)\n+...\n#+..\n##+.\n###+\n"));
    fg_free(pic);
    assert_int_equal(fg_block_mask_picture(m, -1, 0, &pic), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_picture(NULL, 0, 0, &pic), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_picture(m, 0, 0, NULL), FG_ERR_INVALID_ARGUMENT);
    fg_block_mask_destroy(m);

    /* many (b, h): a few are drawn, the rest counted */
    fg_block_mask_desc d2 = {2, 4, 100, 100, 64, 64};
    m = build(ctx, mod, d2, NULL, 0);
    assert_int_equal(fg_block_mask_picture(m, 0, 0, &pic), FG_OK);
    assert_non_null(strstr(pic, "sparsity=25.00%"));
    assert_non_null(strstr(pic, "(0, 3)\n+.\n#+\n"));
    assert_non_null(strstr(pic, "4 more"));
    fg_free(pic);
    fg_block_mask_destroy(m);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* ---- bad arguments ------------------------------------------------------------- */

typedef struct bad_desc {
    fg_block_mask_desc d;
    fg_status want;
} bad_desc;

static const bad_desc bad_descs[] = {
    {{0, 1, 100, 100, 0, 0}, FG_ERR_SHAPE},   {{1, 0, 100, 100, 0, 0}, FG_ERR_SHAPE},
    {{1, 1, 0, 100, 0, 0}, FG_ERR_SHAPE},     {{1, 1, 100, -5, 0, 0}, FG_ERR_SHAPE},
    {{1, 1, 100, 100, 100, 128}, FG_ERR_SHAPE}, {{1, 1, 100, 100, 128, 8}, FG_ERR_SHAPE},
    {{1, 1, 100, 100, 512, 128}, FG_ERR_SHAPE}, {{1, 1, 100, 100, -128, 128}, FG_ERR_SHAPE},
    {{65536, 65536, 1 << 20, 1 << 20, 16, 16}, FG_ERR_SHAPE},
};

static void test_bad_arguments(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL), *doc = mod_src(ctx, DOCUMENT);
    fg_block_mask *m = NULL;
    for (size_t i = 0; i < sizeof bad_descs / sizeof bad_descs[0]; i++) {
        assert_int_equal(fg_block_mask_create(ctx, mod, &bad_descs[i].d, NULL, 0, &m), bad_descs[i].want);
        assert_null(m);
    }
    fg_block_mask_desc d = {1, 1, 100, 100, 0, 0};
    assert_int_equal(fg_block_mask_create(NULL, mod, &d, NULL, 0, &m), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_create(ctx, NULL, &d, NULL, 0, &m), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_create(ctx, mod, NULL, NULL, 0, &m), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, NULL), FG_ERR_INVALID_ARGUMENT);
    /* an unbound buffer, and one too short (the evaluator's bounds check) */
    assert_int_equal(fg_block_mask_create(ctx, doc, &d, NULL, 0, &m), FG_ERR_UNBOUND);
    int32_t short_doc[10] = {0};
    fg_binding bd = fg_bind_int_buffer("doc", short_doc, 10);
    assert_int_equal(fg_block_mask_create(ctx, doc, &d, &bd, 1, &m), FG_ERR_EVAL);
    assert_null(m);

    /* defaults: block 0 means 128 */
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, &m), FG_OK);
    fg_block_mask_desc got;
    assert_int_equal(fg_block_mask_get_desc(m, &got), FG_OK);
    assert_int_equal(got.q_block, 128);
    assert_int_equal(got.kv_block, 128);
    const int32_t *host;
    uint64_t dev = 1;
    int64_t dims[4];
    assert_int_equal(fg_block_mask_array_get(m, (fg_block_mask_array)0, &host, &dev, dims), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_array_get(m, (fg_block_mask_array)9, &host, &dev, dims), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_array_get(m, FG_BM_Q_INDICES, &host, &dev, dims), FG_OK);
    assert_non_null(host);
    assert_int_equal(dev, 0); /* not on a device */
    assert_int_equal(fg_block_mask_array_get(NULL, FG_BM_Q_INDICES, &host, &dev, dims), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_get_desc(NULL, &got), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_get_desc(m, NULL), FG_ERR_INVALID_ARGUMENT);
    double sp;
    assert_int_equal(fg_block_mask_sparsity(NULL, &sp), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_sparsity(m, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_download(ctx, m), FG_ERR_INVALID_ARGUMENT); /* nothing on a device */
    assert_int_equal(fg_block_mask_upload(ctx, NULL), FG_ERR_INVALID_ARGUMENT);
    assert_int_equal(fg_block_mask_upload(NULL, m), FG_ERR_INVALID_ARGUMENT);
    fg_block_mask_destroy(m);
    fg_block_mask_destroy(NULL);
    fg_mod_destroy(mod);
    fg_mod_destroy(doc);
    fg_ctx_destroy(ctx);
}

/* Without a device, the GPU entry points say so and leave nothing behind. */
/* fgi_block_mask_counts, which the backward's tile order reads without
 * waiting: the host arrays of a CPU mask; nothing for a mask whose arrays
 * are only on the device and whose counts' copy was never queued; the
 * pinned copy once the word after it holds the last build's number, and
 * nothing while it holds an older one (a copy still landing). The pinned
 * memory is stood in for by ordinary memory: the reader only reads it. */
static void test_counts_for_the_backward(void **state) {
    (void)state;
    fg_ctx *ctx = NULL;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = mod_src(ctx, CAUSAL);
    fg_block_mask_desc d = {2, 1, 300, 500, 128, 128, sizeof(fg_block_mask_desc), 0, 0};
    fg_block_mask *m = NULL;
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, &m), FG_OK);
    const int qn = fgi_bm_slot(FG_BM_Q_NUM_BLOCKS), fqn = fgi_bm_slot(FG_BM_FULL_Q_NUM_BLOCKS);
    const int32_t *a = NULL, *b = NULL;
    assert_true(fgi_block_mask_counts(m, &a, &b));
    assert_ptr_equal(a, m->host[qn]);
    assert_ptr_equal(b, m->host[fqn]);

    m->host_valid = false; /* as after a GPU build */
    a = b = NULL;
    assert_false(fgi_block_mask_counts(m, &a, &b));
    assert_null(a);
    const int64_t n = m->count[qn] + m->count[fqn];
    int32_t *pinned = calloc((size_t)n + 1, sizeof(int32_t));
    assert_non_null(pinned);
    memcpy(pinned, m->host[qn], (size_t)m->count[qn] * sizeof(int32_t));
    memcpy(pinned + m->count[qn], m->host[fqn], (size_t)m->count[fqn] * sizeof(int32_t));
    m->counts_host = pinned, m->counts_seq = 7, m->counts_queued = true;
    pinned[n] = 6; /* the previous build's copy */
    assert_false(fgi_block_mask_counts(m, &a, &b));
    pinned[n] = 7;
    assert_true(fgi_block_mask_counts(m, &a, &b));
    assert_ptr_equal(a, pinned);
    assert_ptr_equal(b, pinned + m->count[qn]);
    assert_memory_equal(b, m->host[fqn], (size_t)m->count[fqn] * sizeof(int32_t));
    m->counts_queued = false; /* a build inside a stream capture queues none */
    assert_false(fgi_block_mask_counts(m, &a, &b));
    m->counts_host = NULL; /* not the driver's memory: not for fg_block_mask_destroy */
    free(pinned);
    fg_block_mask_destroy(m);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

static void test_no_device(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    if (fgi_cuda_ready(ctx) == FG_OK) {
        fg_ctx_destroy(ctx);
        skip();
    }
    fg_mod *mod = mod_src(ctx, CAUSAL);
    fg_block_mask_desc d = {1, 1, 300, 300, 0, 0};
    fg_block_mask *m = (fg_block_mask *)&d;
    assert_int_equal(fg_block_mask_create_gpu(ctx, mod, &d, NULL, 0, NULL, &m), FG_ERR_NO_DEVICE);
    assert_null(m);
    m = build(ctx, mod, d, NULL, 0);
    assert_int_equal(fg_block_mask_upload(ctx, m), FG_ERR_NO_DEVICE);
    assert_int_equal(fg_block_mask_rebuild_gpu(ctx, m, mod, NULL, 0, NULL), FG_ERR_NO_DEVICE);
    /* still a valid host mask */
    double sp;
    assert_int_equal(fg_block_mask_sparsity(m, &sp), FG_OK);
    fg_block_mask_destroy(m);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_causal_1000),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_heads_differ),
        cmocka_unit_test(test_property_random),
        cmocka_unit_test(test_property_gallery),
        cmocka_unit_test(test_from_kv_blocks),
        cmocka_unit_test(test_from_kv_blocks_errors),
        cmocka_unit_test(test_picture),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_counts_for_the_backward),
        cmocka_unit_test(test_no_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
