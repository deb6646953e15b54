/*
 * bwd_order.h -- the order in which the Hopper backward's dK/dV pass
 * starts its blocks (bwd_order.c).
 */
#ifndef FLEXGEN_BWD_ORDER_H
#define FLEXGEN_BWD_ORDER_H

#include <stdint.h>

/* The most leading tiles per head the pass starts first: past a few, the
 * heads' Q and dO no longer share L2 at the start. */
#define FGI_BWD_LEAD_MAX 4

/* One dK/dV pass over a block mask, as the weighing needs it. */
typedef struct fgi_bwd_tiles {
    /* the mask's transposed counts, [bm_batch][bm_heads][kv_blocks]: per kv
     * block, its partial and its full q blocks (host arrays) */
    const int32_t *q_num, *full_q_num;
    int bm_batch, bm_heads, kv_blocks, kv_block;
    int batch, heads_q, heads_kv; /* the call's */
    int kv_tiles, tile_rows;      /* the pass's blocks per (batch, kv head), their kv rows */
    int slots;                    /* the pass's blocks the GPU runs at once */
} fgi_bwd_tiles;

/* How many leading kv tiles of every (batch, kv head) the pass should start
 * before all other tiles (fgs_block_of in attention_bwd_sm90.cuh): 0 (grid
 * order) unless the first tiles of every head are heavy and starting them
 * first shortens the pass by the estimate by at least a tenth. */
int fgi_bwd_lead_tiles(const fgi_bwd_tiles *t);

/* Whether the pass should run in pairs of kv heads (the -pairs kernel):
 * both heads' tile 0, then both heads' tile 1, ... instead of one head's
 * tiles after another's. 1 where the heads' tiles grow lighter along the kv axis
 * (causal, prefixes) and pairing shortens the estimate by at least
 * 1 / FGI_BWD_PAIRS_GAIN; 0 otherwise, and where heads_kv is odd. */
#define FGI_BWD_PAIRS_GAIN 200
int fgi_bwd_head_pairs(const fgi_bwd_tiles *t);

/* The tail split (the -lead kernel's "last wave"): for a pass of `blocks`
 * equal blocks of `steps` q steps each, one block per SM on `sms` SMs,
 * how many pieces each block of the last wave becomes, and in *from the
 * first of those blocks; 0 where the last wave is empty or fills half the
 * SMs or more, where a block would not make two pieces (SMs / tail of
 * them, at most one per step), or where the grid would reach 2^31 blocks. */
int fgi_bwd_tail_pieces(int64_t blocks, int sms, int64_t steps, int64_t *from);

#endif
