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
 * blocks (as a block mask's, from key 0) that hold a kept key among the
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
#include "mod/front.h"

#include <stdlib.h>
#include <string.h>

#define PROBE_BLOCK 128
#define PROBE_AT (1 << 20)                   /* a block's first key     */
#define PROBE_Q (PROBE_AT + PROBE_BLOCK - 1) /* the block's last query  */
#define PROBE_NEAR 16384
#define PROBE_SAMPLE 1024

/* Blocks of PROBE_BLOCK keys holding a kept key among [kv0, kv0 + n) for
 * the probe's query, or -1 where the evaluation fails. */
static int kept_blocks(fg_ctx *ctx, const fg_mod *mod, const fgi_value *values, int kv0, int n, uint8_t *out) {
    if (fgi_eval_mask(ctx, mod, values, 0, 0, PROBE_Q, 1, kv0, n, out) != FG_OK) return -1;
    int blocks = 0;
    for (int blk = 0; blk < n; blk += PROBE_BLOCK) {
        bool any = false;
        for (int j = blk; j < blk + PROBE_BLOCK && j < n && !any; j++) any = out[j] != 0;
        blocks += any;
    }
    return blocks;
}

static bool judge(const fg_mod *mod) {
    if (!mod->mask) return false;
    for (int i = 0; i < mod->nparams; i++)
        if (mod->params[i].kind == FG_PARAM_BUFFER) return false; /* no values to sample with */
    /* A context of its own: a failed evaluation (a division by zero at the
     * defaults, say) is a judgement, not the caller's error. */
    fg_ctx probe;
    memset(&probe, 0, sizeof probe);
    probe.offset = -1;
    fgi_value values[FGI_MAX_PARAMS];
    uint8_t *out = malloc(PROBE_NEAR);
    bool local = false;
    if (out && fgi_bind(&probe, mod, NULL, 0, values) == FG_OK) {
        const int near = kept_blocks(&probe, mod, values, PROBE_Q + 1 - PROBE_NEAR, PROBE_NEAR, out);
        const int first = kept_blocks(&probe, mod, values, 0, PROBE_SAMPLE, out);
        int middle = 0;
        for (int s = 1; s <= 3 && middle >= 0; s++) {
            const int m = kept_blocks(&probe, mod, values, PROBE_AT / 4 * s, PROBE_SAMPLE, out);
            middle = m < 0 ? -1 : middle + m;
        }
        local = near >= 0 && near <= FGI_LOCAL_NEAR_BLOCKS && first >= 0 && first <= FGI_LOCAL_FIRST_BLOCKS &&
                middle == 0;
    }
    free(out);
    fgi_clear_error(&probe);
    return local;
}

/* Judged on the first call only: sampling costs 10-200 us (the gallery's
 * masks, release build), which only a decode call that can walk in pairs
 * pays, once per mod. */
bool fgi_mask_is_local(const fg_mod *mod) {
    atomic_int *reach = (atomic_int *)&mod->mask_reach; /* a cache: mods are made mutable */
    int r = atomic_load_explicit(reach, memory_order_relaxed);
    if (r == 0) {
        r = judge(mod) ? 1 : 2;
        atomic_store_explicit(reach, r, memory_order_relaxed);
    }
    return r == 1;
}
