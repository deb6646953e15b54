/*
 * reach.c -- whether a mask keeps a late query's keys near it only: the
 * walk length a block mask built from it gives a decode call.
 *
 * A decode call's KV walk visits the blocks its block mask keeps. Under a
 * causal mask that is the whole sequence; under a sliding window, a few
 * blocks however long the sequence grows. The decode kernel at head dim 64
 * has two walks over a paged cache (attention/decode.c): one KV head a
 * walk, or two at once (-pairs: half the walks, each tile twice the
 * bytes). Long walks run faster in pairs; walks of a few tiles run faster
 * one head a walk, since a short walk waits on each tile's latency and the
 * pairs put twice the bytes behind each wait (bench/attention_notes.md,
 * "decode d48"). The sequence's length is not known when the mod is made,
 * nor are the keys a GPU-built block mask keeps known to the host without
 * waiting for the GPU, so the mod is judged once (on first use), by
 * sampling its mask at its parameters' defaults: for the last query of a
 * 128-key block at 2^20 (q_idx = 2^20 + 127, b = 0, h = 0), the 128-key
 * blocks (as a block mask's, from key 0; counted by building the block
 * mask of that one row on the CPU, fg_block_mask_create) that hold a kept
 * key among the
 * 16384 keys up to the query, among the first 1024 keys of the sequence
 * (global or sink tokens), and in three samples of 1024 keys spread over
 * the rest. A mask is local when the last 16384 keys hold at most
 * FGI_LOCAL_NEAR_BLOCKS such blocks, the first 1024 at most
 * FGI_LOCAL_FIRST_BLOCKS, and the three samples none.
 *
 * A sample, not a proof: a mask it misjudges (one that keeps every 4096th
 * key, say) takes the other walk, which gives the same result to rounding,
 * a little slower. The judgement depends on the mod alone, never on the
 * values bound at a call, so changing a parameter never changes the kernel
 * (flexgen.h: changing a value never recompiles).
 */
#include "blockmask/blockmask.h"

#include <string.h>

#define PROBE_BLOCK 128
#define PROBE_AT (1 << 20)                   /* a block's first key     */
#define PROBE_Q (PROBE_AT + PROBE_BLOCK - 1) /* the block's last query  */
#define PROBE_NEAR 16384
#define PROBE_SAMPLE 1024

/* Blocks of PROBE_BLOCK keys holding a kept key among [kv0, kv0 + n) for
 * the probe's query (kv0 a multiple of PROBE_BLOCK): the partial and full
 * counts of that row's block mask; -1 where building it fails (a buffer
 * parameter left unbound, an evaluation error). */
static int kept_blocks(fg_ctx *ctx, const fg_mod *mod, int kv0, int n) {
    const fg_block_mask_desc d = {1, 1, 1, n, PROBE_BLOCK, PROBE_BLOCK, sizeof d, PROBE_Q, kv0};
    fg_block_mask *m = NULL;
    if (fg_block_mask_create(ctx, mod, &d, NULL, 0, &m) != FG_OK) return -1;
    const int32_t *part = NULL, *full = NULL;
    fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &part, NULL, NULL);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &full, NULL, NULL);
    const int blocks = part && full ? part[0] + full[0] : -1;
    fg_block_mask_destroy(m);
    return blocks;
}

static bool judge(const fg_mod *mod) {
    if (!mod->mask) return false;
    /* A context of its own: a failed build (an unbound buffer, a division
     * by zero at the defaults) is a judgement, not the caller's error. */
    fg_ctx probe;
    memset(&probe, 0, sizeof probe);
    probe.offset = -1;
    const int near = kept_blocks(&probe, mod, PROBE_Q + 1 - PROBE_NEAR, PROBE_NEAR);
    bool local = near >= 0 && near <= FGI_LOCAL_NEAR_BLOCKS;
    if (local) {
        const int first = kept_blocks(&probe, mod, 0, PROBE_SAMPLE);
        local = first >= 0 && first <= FGI_LOCAL_FIRST_BLOCKS;
    }
    for (int s = 1; s <= 3 && local; s++) local = kept_blocks(&probe, mod, PROBE_AT / 4 * s, PROBE_SAMPLE) == 0;
    fgi_clear_error(&probe);
    return local;
}

/* Judged on the first call only: sampling costs 20-300 us (the gallery's
 * masks), which only a decode call that can walk in pairs pays, once per
 * mod. */
bool fgi_mask_is_local(const fg_mod *mod) {
    atomic_int *reach = (atomic_int *)&mod->mask_reach; /* a cache: mods are made mutable */
    int r = atomic_load_explicit(reach, memory_order_relaxed);
    if (r == 0) {
        r = judge(mod) ? 1 : 2;
        atomic_store_explicit(reach, r, memory_order_relaxed);
    }
    return r == 1;
}
