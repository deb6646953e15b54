/*
 * document -- causal attention within each document of a packed sequence.
 *
 * Several documents packed back to back into one sequence (sequence packing
 * for pre-training, as in Llama 3) must not attend across their boundaries.
 * FlexAttention's `generate_doc_mask_mod(causal_mask, offsets)` (attention-gym,
 * mask_mod/document_mask.py). `document_id[i]` is the document of token i;
 * it must cover every position the mask is evaluated at. The causal test
 * comes first so that the buffer is read only where it can matter.
 */
#include <flexgen/mod.h>

const int *document_id; /* [total tokens]: document index of each token */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    return q_idx >= kv_idx && document_id[q_idx] == document_id[kv_idx];
}
