/*
 * dilated -- a causal sliding window with gaps: every DILATION-th key back.
 *
 * The dilated sliding window of Longformer (Beltagy et al. 2020): a query
 * sees the keys at distances 0, DILATION, 2 DILATION, ..., WINDOW DILATION
 * behind it (WINDOW + 1 keys): DILATION times the reach of a plain window
 * of as many keys. With an unbounded WINDOW it is the strided pattern of
 * the Sparse Transformer (Child et al. 2019, "Generating Long Sequences
 * with Sparse Transformers"), (q_idx - kv_idx) mod stride == 0; LongNet's
 * dilated attention (Ding et al. 2023) keeps every r-th token of fixed
 * segments instead of sliding, the same kind of work per element. The
 * defaults reach back 1024 positions, as far as sliding_window's, with a
 * quarter of its keys: at the benchmark's S = 8192 every visited block is
 * partial, and the mask takes a `%` by a run-time value per element.
 * DILATION must be positive. The `%` comes last, so it only runs inside
 * the causal band.
 */
#include <flexgen/mod.h>

int DILATION = 4;  /* distance between two keys a query sees */
int WINDOW = 256;  /* keys besides its own: reach WINDOW * DILATION */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    int d = q_idx - kv_idx;
    return d >= 0 && d <= WINDOW * DILATION && d % DILATION == 0;
}
