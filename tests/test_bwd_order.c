/* test_bwd_order.c -- the order of the Hopper backward's dK/dV pass
 * (attention/bwd_order.c): which kv tiles it starts first and whether it
 * runs the kv heads in pairs, on the CPU.
 *
 * A table of block-level masks, counts made here the way the block mask
 * stores them ([B][H][kv blocks] partial and full q blocks), against the
 * choice each must get: the leading tiles first where every head's first
 * tiles carry the global keys every query sees (one block or two, GQA
 * groups, kv blocks twice the pass's tile), grid order where the first
 * tiles are not much heavier than the rest (causal, a prefix, a band),
 * where only some heads have them, and where the grid fits in one wave;
 * pairs of heads where a head's tiles grow lighter along the kv axis
 * (causal, a prefix, global keys in front), not where they weigh alike (a band, no mask), nor
 * with an odd number of kv heads. Then the same on masks the CPU builder makes from the gallery's
 * local_global and causal, and arguments the choice must refuse; last, how
 * many pieces the tail split makes of the last wave's blocks. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "attention/bwd_order.h"

/* A block's class: 0 empty, 1 partial, 2 full. */
typedef int (*block_class)(int h, int qb, int kb);

static int causal(int h, int qb, int kb) {
    (void)h;
    return kb < qb ? 2 : kb == qb ? 1 : 0;
}
/* a band of four blocks back from the diagonal */
static int band(int h, int qb, int kb) {
    (void)h;
    return kb > qb || qb - kb > 4 ? 0 : kb == qb || qb - kb == 4 ? 1 : 2;
}
/* the band plus global keys in kv block 0, as local_global in blocks */
static int global1(int h, int qb, int kb) { return kb == 0 ? 1 : band(h, qb, kb); }
/* global keys over two kv blocks */
static int global2(int h, int qb, int kb) { return kb <= 1 ? 1 : band(h, qb, kb); }
/* a prefix of 16 blocks every query sees, causal after it */
static int prefix(int h, int qb, int kb) { return kb < 16 ? 2 : causal(h, qb, kb); }
/* every block full (no mask) */
static int dense(int h, int qb, int kb) {
    (void)h, (void)qb, (void)kb;
    return 2;
}
/* global keys in head 0 only */
static int global_head0(int h, int qb, int kb) { return h == 0 ? global1(h, qb, kb) : band(h, qb, kb); }

typedef struct mask_counts {
    int32_t *q_num, *full_q_num;
} mask_counts;

static mask_counts counts_of(block_class cls, int bm_batch, int bm_heads, int q_blocks, int kv_blocks) {
    const size_t n = (size_t)bm_batch * bm_heads * kv_blocks;
    mask_counts c = {calloc(n, sizeof(int32_t)), calloc(n, sizeof(int32_t))};
    assert_non_null(c.q_num);
    assert_non_null(c.full_q_num);
    for (int b = 0; b < bm_batch; b++)
        for (int h = 0; h < bm_heads; h++)
            for (int kb = 0; kb < kv_blocks; kb++) {
                const size_t row = ((size_t)b * bm_heads + h) * kv_blocks + kb;
                for (int qb = 0; qb < q_blocks; qb++) {
                    const int k = cls(h, qb, kb);
                    c.q_num[row] += k == 1;
                    c.full_q_num[row] += k == 2;
                }
            }
    return c;
}

typedef struct order_case {
    const char *what;
    block_class cls;
    int bm_batch, bm_heads, blocks; /* the mask: q and kv blocks alike */
    int kv_block;                   /* the mask's kv block rows         */
    int batch, heads_q, heads_kv;
    int slots;
    int want;       /* leading tiles        */
    int want_pairs; /* pairs of kv heads    */
} order_case;

static const order_case cases[] = {
    /* B=4 H=16 S=8192 in blocks of 128 on 132 SMs: the benchmark's shape */
    {"global keys, broadcast mask", global1, 1, 1, 64, 128, 4, 16, 16, 132, 1, 1},
    {"global keys, a mask per head", global1, 4, 16, 64, 128, 4, 16, 16, 132, 1, 1},
    {"global keys over two blocks", global2, 1, 1, 64, 128, 4, 16, 16, 132, 2, 1},
    {"global keys, GQA 4:1", global1, 1, 1, 64, 128, 4, 32, 8, 132, 1, 1},
    {"global keys, kv blocks of 256", global1, 1, 1, 32, 256, 4, 16, 16, 132, 2, 1},
    {"causal", causal, 1, 1, 64, 128, 4, 16, 16, 132, 0, 1},
    {"causal, GQA 4:1", causal, 1, 1, 64, 128, 4, 16, 4, 132, 0, 1},
    {"causal, 15 kv heads", causal, 1, 1, 64, 128, 4, 15, 15, 132, 0, 0},
    {"a prefix of 16 blocks", prefix, 1, 1, 64, 128, 4, 16, 16, 132, 0, 1},
    {"a band", band, 1, 1, 64, 128, 4, 16, 16, 132, 0, 0},
    {"every block full", dense, 1, 1, 64, 128, 4, 16, 16, 132, 0, 0},
    {"global keys in one head of 16", global_head0, 4, 16, 64, 128, 4, 16, 16, 132, 0, 0},
    {"one wave: 64 blocks on 132 SMs", global1, 1, 1, 64, 128, 1, 1, 1, 132, 0, 0},
    {"one wave of causal: 128 blocks", causal, 1, 1, 64, 128, 1, 2, 2, 132, 0, 0},
    /* gpu_attention_bwd's choice test: B=1 H=10 S=2048 */
    {"causal, 160 blocks", causal, 1, 1, 16, 128, 1, 10, 10, 132, 0, 1},
};

static fgi_bwd_tiles tiles_of(const order_case *c, const mask_counts *m) {
    const int tile_rows = 128;
    return (fgi_bwd_tiles){
        .q_num = m->q_num,
        .full_q_num = m->full_q_num,
        .bm_batch = c->bm_batch,
        .bm_heads = c->bm_heads,
        .kv_blocks = c->blocks,
        .kv_block = c->kv_block,
        .batch = c->batch,
        .heads_q = c->heads_q,
        .heads_kv = c->heads_kv,
        .kv_tiles = c->blocks * c->kv_block / tile_rows,
        .tile_rows = tile_rows,
        .slots = c->slots,
    };
}

static void test_table(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const order_case *c = &cases[i];
        /* a per-head mask of a GQA call has heads_q heads */
        mask_counts m = counts_of(c->cls, c->bm_batch, c->bm_heads, c->blocks, c->blocks);
        const fgi_bwd_tiles t = tiles_of(c, &m);
        const int got = fgi_bwd_lead_tiles(&t), pairs = fgi_bwd_head_pairs(&t);
        if (got != c->want) print_error("%s: %d leading tiles, want %d\n", c->what, got, c->want);
        if (pairs != c->want_pairs) print_error("%s: pairs %d, want %d\n", c->what, pairs, c->want_pairs);
        assert_int_equal(got, c->want);
        assert_int_equal(pairs, c->want_pairs);
        free(m.q_num);
        free(m.full_q_num);
    }
}

/* The choice on masks the CPU builder makes: local_global's global keys
 * fill kv block 0 (S=4096: 32 q blocks see it, 65 units against ~8 for
 * the band's tiles), causal's first tile is twice the mean. Pairs for
 * causal and local_global (where the -lead kernel goes first); not for
 * prefix_lm here, whose prefix of 2048 is half of S=4096: its tiles weigh
 * alike over the first half, and pairing shortens the estimate by less
 * than half a percent. */
static void test_built_masks(void **state) {
    (void)state;
    fg_ctx *ctx = NULL;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    static const struct {
        const char *mod;
        int want, want_pairs;
    } built[] = {{"local_global", 1, 1}, {"causal", 0, 1}, {"sliding_window", 0, 0}, {"prefix_lm", 0, 0}};
    for (size_t i = 0; i < sizeof built / sizeof built[0]; i++) {
        fg_mod *mod = tu_gallery_mod(ctx, built[i].mod);
        fg_block_mask_desc d = fg_block_mask_desc_init();
        d.batch = d.heads = 1;
        d.q_len = d.kv_len = 4096;
        fg_block_mask *bm = NULL;
        assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, &bm), FG_OK);
        const int32_t *qn = NULL, *fqn = NULL;
        int64_t dims[4];
        assert_int_equal(fg_block_mask_array_get(bm, FG_BM_Q_NUM_BLOCKS, &qn, NULL, dims), FG_OK);
        assert_int_equal(fg_block_mask_array_get(bm, FG_BM_FULL_Q_NUM_BLOCKS, &fqn, NULL, NULL), FG_OK);
        assert_non_null(qn);
        const fgi_bwd_tiles t = {.q_num = qn, .full_q_num = fqn, .bm_batch = 1, .bm_heads = 1,
                                 .kv_blocks = (int)dims[2], .kv_block = 128, .batch = 4, .heads_q = 16,
                                 .heads_kv = 16, .kv_tiles = 32, .tile_rows = 128, .slots = 132};
        const int got = fgi_bwd_lead_tiles(&t), pairs = fgi_bwd_head_pairs(&t);
        if (got != built[i].want) print_error("%s: %d leading tiles, want %d\n", built[i].mod, got, built[i].want);
        if (pairs != built[i].want_pairs)
            print_error("%s: pairs %d, want %d\n", built[i].mod, pairs, built[i].want_pairs);
        assert_int_equal(got, built[i].want);
        assert_int_equal(pairs, built[i].want_pairs);
        fg_block_mask_destroy(bm);
        fg_mod_destroy(mod);
    }
    fg_ctx_destroy(ctx);
}

/* What the choice refuses: it keeps the grid order. */
static void test_bad_input(void **state) {
    (void)state;
    mask_counts m = counts_of(global1, 1, 1, 64, 64);
    const fgi_bwd_tiles good = {.q_num = m.q_num, .full_q_num = m.full_q_num, .bm_batch = 1, .bm_heads = 1,
                                .kv_blocks = 64, .kv_block = 128, .batch = 4, .heads_q = 16, .heads_kv = 16,
                                .kv_tiles = 64, .tile_rows = 128, .slots = 132};
    assert_int_equal(fgi_bwd_lead_tiles(&good), 1);
    assert_int_equal(fgi_bwd_lead_tiles(NULL), 0);
    fgi_bwd_tiles t = good;
    t.q_num = NULL;
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.slots = 0;
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.kv_tiles = 1; /* nothing to start before */
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.heads_q = 15; /* not a GQA multiple */
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.heads_kv = 0;
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.tile_rows = 0;
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    t = good;
    t.batch = 65535, t.heads_kv = t.heads_q = 65535; /* 2^32 blocks and more: the kernel's index is 32-bit */
    assert_int_equal(fgi_bwd_lead_tiles(&t), 0);
    free(m.q_num);
    free(m.full_q_num);
    /* the pairs' choice refuses the same */
    m = counts_of(causal, 1, 1, 64, 64);
    fgi_bwd_tiles c = good;
    c.q_num = m.q_num, c.full_q_num = m.full_q_num;
    assert_int_equal(fgi_bwd_head_pairs(&c), 1);
    assert_int_equal(fgi_bwd_head_pairs(NULL), 0);
    t = c, t.full_q_num = NULL;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    t = c, t.slots = -1;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    t = c, t.heads_q = 15;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    t = c, t.kv_block = 0;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    t = c, t.batch = 0;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    t = c, t.batch = 65536, t.heads_kv = t.heads_q = 65536;
    assert_int_equal(fgi_bwd_head_pairs(&t), 0);
    free(m.q_num);
    free(m.full_q_num);
}

/* The tail split's pieces: B=4 H=16 S=8192's 4096 blocks on 132 SMs leave
 * 4 in the last wave, 33 pieces each (fewer where a block has fewer
 * steps); a grid of whole waves, a last wave of half the SMs or more, a
 * block of one step, and a grid reaching 2^31 blocks take none. */
static void test_tail_pieces(void **state) {
    (void)state;
    static const struct {
        int64_t blocks;
        int sms;
        int64_t steps, from;
        int pieces;
    } cases[] = {
        {4096, 132, 128, 4092, 33},
        {4096, 132, 10, 4092, 10},
        {16, 132, 16, 0, 8},
        {1, 132, 266, 0, 132},
        {198, 132, 64, 132, 2},
        {264, 132, 128, 0, 0},
        {200, 132, 128, 0, 0},
        {1, 132, 1, 0, 0},
        {0, 132, 8, 0, 0},
        {4096, 0, 8, 0, 0},
        {4096, 132, 0, 0, 0},
        {((int64_t)1 << 31) - 60, 132, 64, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t from = -1;
        const int got = fgi_bwd_tail_pieces(cases[i].blocks, cases[i].sms, cases[i].steps, &from);
        if (got != cases[i].pieces || from != cases[i].from)
            print_error("case %zu: %d pieces from %lld\n", i, got, (long long)from);
        assert_int_equal(got, cases[i].pieces);
        assert_int_equal(from, cases[i].from);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_built_masks),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_tail_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
