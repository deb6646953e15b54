/*
 * natten -- 2-D neighbourhood attention with the window clamped to the canvas.
 *
 * Neighborhood Attention Transformer (Hassani et al. 2023): like a sliding
 * 2-D window, but near the edges the window's centre is moved inwards so
 * that every query sees exactly KERNEL x KERNEL keys. FlexAttention's
 * `natten_mask` (attention-gym, mask_mod/natten.py). Tokens are pixels in
 * row-major order on an H x W canvas; the defaults (64 x 128 = 8192 tokens,
 * a 15 x 15 kernel) fit the benchmark's S = 8192. KERNEL should be odd.
 */
#include <flexgen/mod.h>

int W = 128;      /* canvas width  */
int H = 64;       /* canvas height */
int KERNEL = 15;  /* neighbourhood size (odd) */

bool mask_mod(int b, int h, int q_idx, int kv_idx) {
    int r = KERNEL / 2;
    int qy = q_idx / W;
    int qx = q_idx % W;
    int ky = kv_idx / W;
    int kx = kv_idx % W;
    int cy = clamp(qy, r, H - 1 - r);
    int cx = clamp(qx, r, W - 1 - r);
    return abs(cy - ky) <= r && abs(cx - kx) <= r;
}
