/*
 * flamingo -- text tokens cross-attend only to the image of their interval.
 *
 * Flamingo (Alayrac et al. 2022) interleaves images with text; in its gated
 * cross-attention layers each text token attends only to the tokens of the
 * image that immediately precedes it (the "interval" it belongs to), and
 * text before the first image attends to none. Queries are text tokens, keys
 * are image tokens (Q_LEN != KV_LEN in general). The FlexAttention blog post
 * (PyTorch, 2024) lists it among the masks FlexAttention expresses.
 * `text_image[q]` is the image a text token belongs to (-1: none) and
 * `kv_image[kv]` the image each key token comes from.
 */
#include <flexgen/mod.h>

const int *text_image; /* [Q_LEN]: image index of each text token, -1 for none */
const int *kv_image;   /* [KV_LEN]: image index of each image token            */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    int img = text_image[q_idx];
    return img >= 0 && kv_image[kv_idx] == img;
}
