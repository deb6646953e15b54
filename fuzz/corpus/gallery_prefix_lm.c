/*
 * prefix_lm -- bidirectional attention over a prefix, causal after it.
 *
 * The prefix language model of T5 / UniLM (Raffel et al. 2020, Dong et al.
 * 2019): every token sees the whole prefix (the prompt), the rest is causal.
 * FlexAttention's `prefix_lm_causal` (attention-gym, mask_mod/prefix_lm.py),
 * which is or_masks(prefix_mask, causal_mask). PREFIX = 2048 is a quarter of
 * the benchmark's S = 8192.
 */
#include <flexgen/mod.h>

int PREFIX = 2048; /* number of leading tokens everyone attends to */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return kv_idx < PREFIX || q_idx >= kv_idx;
}
