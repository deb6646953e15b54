/*
 * softcap -- tanh soft-capping of the scores, causal.
 *
 * Logit soft-capping as in Gemma 2 (Gemma Team 2024) and Grok-1: scores are
 * squashed into (-SOFTCAP, SOFTCAP) by SOFTCAP * tanh(score / SOFTCAP).
 * FlexAttention's `generate_tanh_softcap` (attention-gym,
 * score_mod/softcapping.py); Gemma 2 uses 50 for attention, the
 * FlexAttention benchmark 20.
 */
#include <flexgen/mod.h>

float SOFTCAP = 20.0;

float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
    return SOFTCAP * tanh(score / SOFTCAP);
}

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx;
}
