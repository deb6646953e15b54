/*
 * causal -- each query attends to itself and the keys before it.
 *
 * The causal mask of decoder-only language models (GPT, "Attention Is All
 * You Need" 2017); FlexAttention's `causal_mask` (attention-gym,
 * mask_mod/causal.py). Half of the blocks are empty, the diagonal ones are
 * partial and the rest are full.
 */
#include <flexgen/mod.h>

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx;
}
