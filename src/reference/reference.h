/*
 * reference.h -- what the CPU references share (reference.c, the forward;
 * reference_bwd.c, the backward): argument checks and bindings, the inputs
 * of one (b, h) as doubles, and FlexAttention's rule for which pairs take
 * part.
 */
#ifndef FLEXGEN_REFERENCE_H
#define FLEXGEN_REFERENCE_H

#include "attention/attention.h"
#include "blockmask/blockmask.h"

/* One reference call: its arguments, checked, with the parameters bound. */
typedef struct fgi_ref_ctx {
    const fg_attention_args *a;
    const fg_mod *mod;
    const fgi_value *values;
    const fg_block_mask *bm;     /* NULL: every pair is asked of mask_mod      */
    float scale;
    fgi_attn_strides st;
    uint8_t *states;             /* [QB][KB] of the current (b, h), with bm    */
} fgi_ref_ctx;

/* Check the arguments (host pointers), the block mask's host copy and
 * shape, and bind the parameters into `values` (FGI_MAX_PARAMS entries). */
fg_status fgi_ref_init(fg_ctx *ctx, fgi_ref_ctx *rc, const fg_mod *mod, const fg_attention_args *a,
                       fgi_value *values);
void fgi_ref_free(fgi_ref_ctx *rc);

/* q, k, v (and dO for the backward) of one (b, h) as doubles, [len][D]. */
typedef struct fgi_ref_rows {
    double *q, *k, *v, *dout;
    uint8_t *kv_bad;   /* [kv_len]: 1 for a key of a bad page (paged)     */
    int kv_len;        /* keys of this sequence (kv_lens) loaded          */
    int q_offset;      /* this sequence's q offset (q_offsets)            */
} fgi_ref_rows;
fg_status fgi_ref_rows_alloc(fg_ctx *ctx, const fgi_ref_ctx *rc, fgi_ref_rows *r, bool with_dout);
void fgi_ref_rows_free(fgi_ref_rows *r);
/* Load the rows of query head h (k and v of its KV head) and dO when `dout`
 * is not NULL (strides as in fg_attention_args: all zero means contiguous),
 * and the block states of (b, h). With kv_lens, q_offsets or a block table
 * (host arrays, forward reference only) the sequence's own length, offset
 * and pages: keys of a page outside [0, num_pages) are marked in kv_bad
 * and take no part, as in the decode kernel. */
void fgi_ref_load_head(const fgi_ref_ctx *rc, fgi_ref_rows *r, int b, int h, const void *dout,
                   const int64_t dout_stride[4]);

/* Whether pair (q, kv) of the current (b, h) takes part: an empty block
 * drops it, a full block keeps it, a partial block (or no block mask) keeps
 * it when mask_mod said so (`mask_bit`; 1 without a mask_mod). */
bool fgi_ref_pair_kept(const fgi_ref_ctx *rc, int q, int kv, int mask_bit);

/* fg_attention_reference on `threads` threads (0: one a core, within a
 * memory bound), the (b, h) pairs shared among them; the same answer, bit
 * for bit, and the same error, on any number. */
fg_status fgi_attention_reference_threads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                          double *out, double *lse, int threads);

/* The backward reference's outputs, host memory, float64: dq [B][Hq][Q][D],
 * dk and dv [B][Hkv][KV][D], and per parameter of the mod the gradient of a
 * float buffer (NULL: not wanted; its length is the bound buffer's). dO is
 * in the call's dtype with the given strides. */
typedef struct fgi_ref_bwd_out {
    const void *dout;
    int64_t dout_stride[4];
    const float *dlse; /* fp32 [B][Hq][Q_LEN], or NULL */
    double *dq, *dk, *dv;
    double *const *buf_grads;
} fgi_ref_bwd_out;
fg_status fgi_attention_reference_backward(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                           const fgi_ref_bwd_out *out);
/* The same on `threads` threads (0: one a core, within a memory bound),
 * in units of one (batch, KV head); the same answer, bit for bit, and the
 * same error, on any number. */
fg_status fgi_attention_reference_backward_threads(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *args,
                                                   const fgi_ref_bwd_out *out, int threads);

#endif
