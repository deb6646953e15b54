/*
 * sliding_window -- causal attention limited to the last WINDOW keys.
 *
 * Sliding-window (local) attention as in Longformer (Beltagy et al. 2020)
 * and Mistral 7B (Jiang et al. 2023); FlexAttention's `sliding_window_causal`
 * (attention-gym, mask_mod/sliding_window.py). The default 1024 is the
 * "sliding window 1024" case of the FlexAttention benchmark.
 */
#include <flexgen/mod.h>

int WINDOW = 1024; /* a query sees keys q_idx - WINDOW .. q_idx */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW;
}
