/*
 * local_global -- a causal sliding window plus GLOBAL global keys at the start.
 *
 * Longformer's local + global attention (Beltagy et al. 2020), made causal:
 * a query sees the last WINDOW keys (as sliding_window) and the first
 * GLOBAL keys, whatever its distance to them. BigBird's global tokens
 * (Zaheer et al. 2020, the ITC form: existing tokens such as [CLS] made
 * global) are the same set; its random keys are left out, so the mask is
 * a function of the indices alone. In both papers global tokens also see
 * every token; under causality that adds nothing, since each of the first
 * GLOBAL queries already sees all its earlier keys, global ones. At the
 * benchmark's S = 8192, in blocks of 128, a query block visits 3 partial
 * blocks (the global keys, both ends of the band) and 3 full ones.
 */
#include <flexgen/mod.h>

int WINDOW = 512; /* a query sees keys q_idx - WINDOW .. q_idx     */
int GLOBAL = 64;  /* and keys 0 .. GLOBAL - 1, the global tokens */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return kv_idx <= q_idx && (kv_idx < GLOBAL || q_idx - kv_idx <= WINDOW);
}
