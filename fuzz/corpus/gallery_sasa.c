/*
 * sasa -- 2-D local window attention over an image.
 *
 * Stand-Alone Self-Attention in Vision Models (Ramachandran et al. 2019):
 * each pixel attends to the pixels within WINDOW rows and WINDOW columns of
 * it, the window cut off at the canvas edge. One of the examples of the
 * FlexAttention blog post (PyTorch, 2024). Tokens are pixels in row-major
 * order on a canvas W pixels wide; the defaults (128 x 64 = 8192 tokens,
 * a 17 x 17 window) fit the benchmark's S = 8192.
 */
#include <flexgen/mod.h>

int W = 128;     /* canvas width in tokens        */
int WINDOW = 8;  /* half-width of the square window */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    int qy = q_idx / W;
    int qx = q_idx % W;
    int ky = kv_idx / W;
    int kx = kv_idx % W;
    return abs(qy - ky) <= WINDOW && abs(qx - kx) <= WINDOW;
}
