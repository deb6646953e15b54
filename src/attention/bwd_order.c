/*
 * bwd_order.c -- the order in which the Hopper backward's dK/dV pass
 * starts its blocks.
 *
 * The pass is a grid of blocks, one per (kv tile, kv head, batch), each
 * walking the q blocks its kv tile sees under the block mask; the hardware
 * starts them in grid order (a head's tiles in order, the heads one after
 * another) as SMs free up. Two orders change that, each chosen per call
 * from an estimate:
 *
 *   a block's weight is its partial q blocks twice (their steps evaluate
 *   mask_mod and select) plus its full ones, plus one for the block's own
 *   loads and stores; in the fluid picture block i starts once the work
 *   before it, spread over the slots, is done, so a pass in some order ends
 *   at max(total / slots, max_i (before_i / slots + w_i)).
 *
 * Leading tiles first (the -lead kernel). When one tile of every head
 * carries far more work than the others -- the tile of the keys every
 * query sees: global tokens (local_global), attention sinks -- the last
 * heads' heavy tiles start near the end and run on alone while the other
 * SMs idle. Starting the first tiles of every head before all the rest
 * removes that tail; it costs the pass its L2 sharing of a head's Q and dO
 * between its heavy and its light tiles, and a causal mask, whose first
 * tile is only about twice the mean, lost 2-4% to it (attention_notes
 * v34). The leading tiles go first when every head's first tiles weigh at
 * least four times the mean and the estimate shortens by a tenth or more
 * (local_global at B=4 H=16 S=8192: by about a quarter; causal, prefixes
 * and documents not at all).
 *
 * Pairs of heads (the -pairs kernel, config.head_pairs). Under a causal
 * mask a head's kv tiles grow lighter from the first (every query) to the
 * last (a few), so the last head's first tile starts near the end and
 * outlasts the others by about half its length: 3% of the pass at B=4 H=16 S=8192 (ncu: SMs
 * active 96.6% of the time). Two heads' tiles interleaved (tile t of
 * both, then t + 1) put the heaviest of the last two heads earlier, and
 * the pass still holds about two heads' Q and dO in L2 at a time (four
 * heads lost 1-2% on noop). Chosen when the estimate shortens by at least
 * half a percent (causal by 1.4%, prefix_lm by 0.8%; masks whose tiles
 * weigh alike, noop, flamingo, sliding_window, not at all: flamingo ran
 * 0.6% slower paired, attention_notes v43).
 */
#include "attention/bwd_order.h"

#include <stdbool.h>

#define HEAVY_TIMES 4  /* a leading tile's weight against the mean       */
#define BLOCK_COST 1   /* a block's own loads and stores, in full q blocks */

/* The weight of the pass's block (b, hk, tile): over the query heads of
 * kv head hk, the q blocks of the mask's kv block the tile lies in. */
static int64_t weight(const fgi_bwd_tiles *t, int b, int hk, int tile) {
    const int group = t->heads_q / t->heads_kv;
    const int kb = (int)((int64_t)tile * t->tile_rows / t->kv_block);
    const int mb = t->bm_batch == 1 ? 0 : b;
    int64_t w = BLOCK_COST;
    for (int g = 0; g < group; g++) {
        const int h = hk * group + g, mh = t->bm_heads == 1 ? 0 : h;
        const int64_t row = ((int64_t)mb * t->bm_heads + mh) * t->kv_blocks + kb;
        w += 2 * (int64_t)t->q_num[row] + t->full_q_num[row];
    }
    return w;
}

/* One block of the fluid estimate, (batch * heads_kv + kv head, tile):
 * it starts after `*before` units of work and may end the pass. */
static void fluid_step(const fgi_bwd_tiles *t, int hb, int tile, double *before, double *end) {
    const int64_t w = weight(t, hb / t->heads_kv, hb % t->heads_kv, tile);
    const double finish = *before + (double)w * t->slots;
    if (finish > *end) *end = finish;
    *before += (double)w;
}

/* The fluid estimate of the pass's end with the first `lead` tiles of
 * every head started first (0: grid order), in weight units times slots. */
static double estimate(const fgi_bwd_tiles *t, int lead, int64_t total) {
    double before = 0, end = (double)total;
    const int heads = t->batch * t->heads_kv;
    /* pass 0: the leading tiles (none in grid order); pass 1: the rest */
    for (int pass = lead ? 0 : 1; pass < 2; pass++)
        for (int hb = 0; hb < heads; hb++)
            for (int tile = pass ? lead : 0; tile < (pass ? t->kv_tiles : lead); tile++)
                fluid_step(t, hb, tile, &before, &end);
    return end;
}

/* The same for the pass in pairs of kv heads (heads_kv even, so a pair
 * lies in one batch). */
static double estimate_pairs(const fgi_bwd_tiles *t, int64_t total) {
    double before = 0, end = (double)total;
    const int heads = t->batch * t->heads_kv;
    for (int hb = 0; hb < heads; hb += 2)
        for (int tile = 0; tile < t->kv_tiles; tile++)
            for (int s = 0; s < 2; s++) fluid_step(t, hb + s, tile, &before, &end);
    return end;
}

/* What both choices check first: a mask whose counts describe this call's
 * pass, over a wave of blocks and under 2^32 of them (the kernel's index
 * arithmetic is 32-bit). Sets *total to the pass's weight. */
static bool weighable(const fgi_bwd_tiles *t, int64_t *total) {
    if (!t || !t->q_num || !t->full_q_num || t->slots <= 0 || t->kv_tiles < 2 || t->heads_kv <= 0 ||
        t->heads_q % t->heads_kv != 0 || t->kv_block <= 0 || t->tile_rows <= 0 || t->batch <= 0)
        return false;
    const int64_t blocks = (int64_t)t->batch * t->heads_kv * t->kv_tiles;
    if (blocks <= t->slots || blocks >= ((int64_t)1 << 32)) return false; /* one wave starts every block at once */
    const int heads = t->batch * t->heads_kv; /* under 2^31: kv_tiles >= 2 */
    *total = 0;
    for (int hb = 0; hb < heads; hb++)
        for (int tile = 0; tile < t->kv_tiles; tile++) *total += weight(t, hb / t->heads_kv, hb % t->heads_kv, tile);
    return true;
}

int fgi_bwd_lead_tiles(const fgi_bwd_tiles *t) {
    int64_t total;
    if (!weighable(t, &total)) return 0;
    const int heads = t->batch * t->heads_kv;
    const int64_t blocks = (int64_t)heads * t->kv_tiles;
    /* the leading tiles heavy in every head: weight * blocks >= HEAVY_TIMES * total */
    int lead = 0;
    for (; lead < FGI_BWD_LEAD_MAX && lead < t->kv_tiles - 1; lead++) {
        bool heavy = true;
        for (int hb = 0; hb < heads && heavy; hb++)
            heavy = weight(t, hb / t->heads_kv, hb % t->heads_kv, lead) * blocks >= HEAVY_TIMES * total;
        if (!heavy) break;
    }
    if (lead == 0) return 0;
    return 10 * estimate(t, lead, total) <= 9 * estimate(t, 0, total) ? lead : 0;
}

int fgi_bwd_head_pairs(const fgi_bwd_tiles *t) {
    int64_t total;
    if (!weighable(t, &total) || t->heads_kv % 2 != 0) return 0;
    return FGI_BWD_PAIRS_GAIN * estimate_pairs(t, total) <= (FGI_BWD_PAIRS_GAIN - 1) * estimate(t, 0, total);
}

int fgi_bwd_tail_pieces(int64_t blocks, int sms, int64_t steps, int64_t *from) {
    *from = 0;
    if (blocks <= 0 || sms <= 0 || steps <= 0) return 0;
    const int64_t tail = blocks % sms;
    if (tail == 0 || 2 * tail > sms) return 0;
    int64_t pieces = sms / tail;
    if (pieces > steps) pieces = steps;
    /* the grid is one-dimensional, its index 32-bit */
    if (pieces < 2 || blocks - tail + tail * pieces >= ((int64_t)1 << 31)) return 0;
    *from = blocks - tail;
    return (int)pieces;
}
