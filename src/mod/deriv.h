/*
 * deriv.h -- the derivatives of a mod's score_mod, as checked trees
 * (deriv.c).
 *
 * The backward pass needs, at every visited (q_idx, kv_idx), the derivative
 * of score_mod with respect to its score argument, and for every read of a
 * float buffer parameter whose value the result depends on, the derivative
 * with respect to the value read and the index it was read at (the gradient
 * of buf[i] accumulates dS * that derivative). deriv.c builds each as an
 * ordinary typed function of the same arguments as score_mod, so the emitter
 * prints it and the evaluator computes it exactly as it does score_mod: the
 * GPU kernel and the CPU reference share one meaning by construction.
 */
#ifndef FLEXGEN_DERIV_H
#define FLEXGEN_DERIV_H

#include "internal.h"

/* One float buffer read of score_mod that gets a gradient. */
typedef struct fgi_grad_site {
    int param;          /* the buffer parameter                                */
    fgi_func *index;    /* int function of (score, b, h, q_idx, kv_idx): the
                           element read                                        */
    fgi_func *grad;     /* float function: d score_mod / d (the value read)    */
} fgi_grad_site;

/* What the backward pass knows of a mod: empty without a score_mod. The
 * trees live in `arena` and share the mod's own nodes for primal values, so
 * the mod must outlive them. */
typedef struct fgi_mod_grad {
    fgi_arena arena;
    fgi_func *d_score;      /* d score_mod / d score; NULL: no score_mod (the
                               derivative is 1)                                 */
    fgi_grad_site *sites;   /* in evaluation order; reads whose derivative is
                               zero everywhere (under a comparison, a cast to
                               int) are left out                                */
    int nsites;
} fgi_mod_grad;

/* Derive `mod`'s score_mod into `out` (free with fgi_mod_grad_free). Each
 * builtin's rule comes from the d_x / d_y / d_z columns of builtins.def;
 * the chain rule runs through locals, arithmetic, ?: and casts; comparisons,
 * integer arithmetic and casts to int or bool have derivative 0. */
fg_status fgi_mod_derive(fg_ctx *ctx, const fg_mod *mod, fgi_mod_grad *out);
void fgi_mod_grad_free(fgi_mod_grad *g);

/* The by-value struct the backward kernel takes for the gradients
 * (fg_mod_grads in the emitted source): one entry per float buffer parameter
 * some read of which gets a gradient, in parameter order, each a float
 * pointer (to the element's fixed-point accumulators) and its length as
 * int64 (16 bytes, aligned to 8); then an int32 fg_pad; the size rounded
 * up to 8. */
#define FGI_MAX_GRAD_BUFFERS 64
typedef struct fgi_grad_layout {
    int n;
    int param[FGI_MAX_GRAD_BUFFERS];     /* the parameter of entry k       */
    size_t offset[FGI_MAX_GRAD_BUFFERS]; /* of its pointer; length at + 8  */
    size_t size;
} fgi_grad_layout;
void fgi_grad_layout_compute(const fgi_mod_grad *g, fgi_grad_layout *layout);

#endif
