/*
 * jagged -- causal attention within each sequence of a jagged batch.
 *
 * The nested-tensor (jagged layout) case of FlexAttention: variable-length
 * sequences stored back to back, described by `offsets` (sequence s occupies
 * tokens offsets[s] .. offsets[s+1]-1, nseq + 1 entries) and `seq_idx` (the
 * sequence of each token). attention-gym's `create_njt_wrapper` /
 * FlexAttention's nested-jagged-tensor support. A token whose seq_idx is
 * negative (padding) attends to nothing; the test on it comes before the
 * offsets read, so offsets is only indexed with a real sequence number.
 */
#include <flexgen/mod.h>

const int *offsets; /* [nseq + 1]: first token of each sequence, then the total */
const int *seq_idx; /* [total tokens]: sequence of each token, -1 for padding    */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    int s = seq_idx[q_idx];
    return s >= 0 && kv_idx <= q_idx && kv_idx >= offsets[s];
}
