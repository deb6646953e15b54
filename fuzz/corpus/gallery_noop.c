/*
 * noop -- the identity score_mod: plain softmax attention with no mask.
 *
 * FlexAttention's `noop` score_mod (torch.nn.attention.flex_attention docs,
 * attention-gym's "full" baseline). It is the reference point of the
 * benchmark: flexgen on it should match dense SDPA.
 */
#include <flexgen/mod.h>

float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
    return score;
}
