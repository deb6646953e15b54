/*
 * alibi -- Attention with Linear Biases, causal.
 *
 * ALiBi (Press et al. 2022, "Train Short, Test Long"): instead of position
 * embeddings each head adds slopes[h] * (kv_idx - q_idx) to its scores, a
 * penalty growing with distance. FlexAttention's `generate_alibi_bias`
 * (attention-gym, score_mod/alibi.py). The usual slopes are
 * 2^(-8 (h + 1) / H); `slopes` holds one per head.
 */
#include <flexgen/mod.h>

const float *slopes; /* [heads]: the bias slope of each head */

float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
    return score + slopes[h] * (float)(kv_idx - q_idx);
}

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx;
}
