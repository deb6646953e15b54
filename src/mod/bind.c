/*
 * bind.c -- run-time values for a mod's parameters: the public binding
 * helpers, their resolution against the mod's declarations (defaults for
 * unbound scalars, errors for unbound buffers and mismatched kinds), and the
 * layout of the by-value parameter struct the emitted CUDA declares and the
 * launchers pack.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- bindings ---------------------------------------------------------- */

fg_binding fg_bind_int(const char *name, int32_t v) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_SCALAR;
    b.type = FG_TYPE_INT;
    b.value.i = v;
    return b;
}

fg_binding fg_bind_float(const char *name, float v) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_SCALAR;
    b.type = FG_TYPE_FLOAT;
    b.value.f = v;
    return b;
}

fg_binding fg_bind_int_buffer(const char *name, const int32_t *data, int64_t length) {
    fg_binding b;
    memset(&b, 0, sizeof b);
    b.name = name;
    b.kind = FG_PARAM_BUFFER;
    b.type = FG_TYPE_INT;
    b.value.buffer.data = data;
    b.value.buffer.length = length;
    return b;
}

fg_binding fg_bind_float_buffer(const char *name, const float *data, int64_t length) {
    fg_binding b = fg_bind_int_buffer(name, NULL, length);
    b.type = FG_TYPE_FLOAT;
    b.value.buffer.data = data;
    return b;
}

static fgi_type public_to_internal(fg_type t) {
    switch (t) {
    case FG_TYPE_BOOL: return FGI_T_BOOL;
    case FG_TYPE_INT: return FGI_T_INT;
    case FG_TYPE_FLOAT: return FGI_T_FLOAT;
    }
    return FGI_T_NONE;
}

/* A scalar binding may give an int for a float parameter (converted) but not
 * a float for an int parameter (that would silently truncate). */
fg_status fgi_bind(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                   fgi_value *values) {
    FGI_CHECK_ARG(ctx, mod && values, "NULL mod or values");
    FGI_CHECK_ARG(ctx, binds || nbinds == 0, "NULL bindings with a non-zero count");
    bool bound[FGI_MAX_PARAMS] = {0};
    for (int i = 0; i < mod->nparams; i++) {
        memset(&values[i], 0, sizeof values[i]);
        if (mod->params[i].kind == FG_PARAM_SCALAR) values[i].scalar.i = mod->params[i].def.i;
    }
    for (size_t k = 0; k < nbinds; k++) {
        const fg_binding *bd = &binds[k];
        if (!bd->name) return fgi_error(ctx, FG_ERR_UNBOUND, "binding %zu has no name", k);
        int i = fgi_mod_find_param(mod, bd->name);
        if (i < 0)
            return fgi_error(ctx, FG_ERR_UNBOUND, "binding '%s' names no parameter of mod '%s'",
                             bd->name, mod->name ? mod->name : "?");
        const fgi_param *p = &mod->params[i];
        if (bound[i]) return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' bound twice", p->name);
        bound[i] = true;
        if (bd->kind != p->kind)
            return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is a %s, bound as a %s", p->name,
                             p->kind == FG_PARAM_BUFFER ? "buffer" : "scalar",
                             bd->kind == FG_PARAM_BUFFER ? "buffer" : "scalar");
        fgi_type bt = public_to_internal(bd->type);
        if (p->kind == FG_PARAM_BUFFER) {
            if (bt != p->type)
                return fgi_error(ctx, FG_ERR_UNBOUND, "buffer '%s' holds %s, bound with %s elements",
                                 p->name, fgi_type_name(p->type), fgi_type_name(bt));
            if (bd->value.buffer.length < 0 || (bd->value.buffer.length > 0 && !bd->value.buffer.data))
                return fgi_error(ctx, FG_ERR_UNBOUND, "buffer '%s' bound with a NULL pointer or negative length",
                                 p->name);
            values[i].data = bd->value.buffer.data;
            values[i].length = bd->value.buffer.length;
        } else if (p->type == FGI_T_INT) {
            if (bt != FGI_T_INT)
                return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is an int, bound with a %s",
                                 p->name, fgi_type_name(bt));
            values[i].scalar.i = bd->value.i;
        } else {
            if (bt == FGI_T_INT) values[i].scalar.f = (float)bd->value.i;
            else if (bt == FGI_T_FLOAT) values[i].scalar.f = bd->value.f;
            else return fgi_error(ctx, FG_ERR_UNBOUND, "parameter '%s' is a float, bound with a %s",
                                  p->name, fgi_type_name(bt));
        }
    }
    for (int i = 0; i < mod->nparams; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER && !bound[i])
            return fgi_error(ctx, FG_ERR_UNBOUND, "buffer parameter '%s' is not bound", mod->params[i].name);
        /* a float divisor's reciprocal must be a normal float (fg_fdiv_by) */
        if (!fgi_param_has_rcp(&mod->params[i])) continue;
        const float f = fabsf(values[i].scalar.f);
        if (f != 0 && f != INFINITY && !isnan(f) && !(f >= 0x1p-126f && f <= 0x1p126f))
            return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                             "parameter '%s' = %g divides: a float divisor must be 0, inf, NaN or of "
                             "magnitude in [2^-126, 2^126]",
                             mod->params[i].name, (double)values[i].scalar.f);
    }
    return FG_OK;
}

/* ---- divisor parameters ------------------------------------------------ */

/* Integer division by a value only known at run time costs the GPU a
 * sequence of some twenty instructions (there is no divide unit); a mask
 * that takes `(q_idx - kv_idx) % DILATION` at every element pays it per
 * score. When the divisor is a scalar parameter it is the same for the
 * whole launch, so the host turns it into a multiply and a shift once
 * (fgi_divisor_of) and the kernels use those (fg_idiv_by, fg_imod_by).
 * A float divisor parameter gets its reciprocal, rounded to nearest, for
 * fg_fdiv_by (templates/common.cuh), which gives the IEEE quotient without
 * the division's per-element branch.
 *
 * Why m = ceil(2^(31+l) / D), l = ceil(log2 D), is exact for every
 * n <= 2^31: m = (2^(31+l) + e) / D with 0 <= e < D, so
 * n m / 2^(31+l) = n / D + n e / (D 2^(31+l)), and the second term is below
 * n / 2^(31+l) <= 2^-l <= 1 / D: too little to carry n / D past the next
 * integer, whose distance from n / D is at least 1 / D. m < 2^32 since
 * D > 2^(l-1), and n m < 2^63.
 *
 * Why the divisibility test (inv, rot, bound) is exact, for D = |d| =
 * o 2^k, o odd, with c = floor((2^31 - 1) / D), bound = 2c (o > 1) or
 * 2^(32-k) - 1 (o = 1), and the test rotr(a inv + (bound >> 1) 2^k, k) <=
 * bound on the 32-bit a itself, sign and all (no |a|: one instruction
 * fewer per element). The multiples of D among 32-bit numbers are j D,
 * -c <= j <= c when o > 1 (D does not divide 2^31). For those, a inv =
 * j 2^k mod 2^32 (o inv = 1), so a inv + c 2^k = (j + c) 2^k without
 * wrapping (2c 2^k < 2^32) and the rotation leaves j + c in [0, 2c]. For a
 * non-multiple: if one of a's low k bits is set, so is one of a inv's
 * (inv is odd), and of the sum's (c 2^k has none), and the rotation moves
 * it to bit 32 - k or above, past 2c < 2^(32-k); if none is, a = m 2^k
 * with m not a multiple of o, and m -> m inv + c mod 2^(32-k) permutes
 * the residues and sends the multiples j o, -c <= j <= c, exactly onto
 * [0, 2c], so m's lands above it. With o = 1 the test is just "a's low k
 * bits are clear": the added term (2^(31-k) - 1) 2^k has none set, and a
 * set bit rotates above bound while a clear set leaves a value below
 * 2^(32-k). d == 0, 1 and -1 (a % d is 0) have bound 2^32 - 1: the test
 * always holds. tests/test_emit.c checks it against %. */
fgi_divisor fgi_divisor_of(int32_t d) {
    fgi_divisor v = {0, 0, d, d == 0, 1, 0, UINT32_MAX};
    if (d == 0) v.d = 1;
    const uint64_t D = v.d < 0 ? (uint64_t)0 - (uint64_t)(int64_t)v.d : (uint64_t)v.d; /* 1 .. 2^31 */
    uint32_t l = 0;
    while (((uint64_t)1 << l) < D) l++;
    v.m = (uint32_t)((((uint64_t)1 << (31 + l)) + D - 1) / D);
    v.shift = 31 + l;
    if (d != 0) {
        uint32_t o = (uint32_t)D;
        while (!(o & 1u)) o >>= 1, v.rot++;
        uint32_t inv = o; /* Newton's iteration doubles the correct low bits: 3, 6, 12, 24, 48 */
        for (int i = 0; i < 4; i++) inv *= 2u - o * inv;
        v.inv = inv;
        /* 2c, c = floor((2^31 - 1) / D), or 2^(32-k) - 1 for a power of two */
        v.bound = o > 1 ? 2u * (uint32_t)((((uint64_t)1 << 31) - 1) / D) : (uint32_t)(((uint64_t)1 << (32 - v.rot)) - 1);
    }
    return v;
}

int fgi_divisor_param(const fg_mod *mod, const fgi_expr *e) {
    if (!mod || !e || e->kind != FGI_E_BINARY || (e->op != FGI_OP_DIV && e->op != FGI_OP_MOD) ||
        (e->type != FGI_T_INT && e->type != FGI_T_FLOAT))
        return -1;
    const fgi_expr *d = e->b;
    while (d && ((d->kind == FGI_E_UNARY && d->op == FGI_OP_PLUS) ||
                 (d->kind == FGI_E_CAST && d->a && d->a->type == d->type)))
        d = d->a;
    if (!d || d->kind != FGI_E_PARAM || d->index < 0 || d->index >= mod->nparams) return -1;
    const fgi_param *p = &mod->params[d->index];
    return p->kind == FG_PARAM_SCALAR && p->type == e->type ? d->index : -1;
}

static void mark_expr(fg_mod *mod, const fgi_expr *e) {
    if (!e) return;
    const int i = fgi_divisor_param(mod, e);
    if (i >= 0) mod->params[i].divisor = true;
    mark_expr(mod, e->a);
    mark_expr(mod, e->b);
    mark_expr(mod, e->c);
    for (int k = 0; k < e->nargs; k++) mark_expr(mod, e->args[k]);
}

static void mark_func(fg_mod *mod, const fgi_func *f) {
    if (!f) return;
    for (int i = 0; i < f->nlocals; i++) mark_expr(mod, f->locals[i].init);
    mark_expr(mod, f->ret);
}

static void mark_mask(fg_mod *mod, const fgi_mask_node *n) {
    if (!n) return;
    if (n->op == FGI_MASK_LEAF) mark_func(mod, n->func);
    mark_mask(mod, n->a);
    mark_mask(mod, n->b);
}

void fgi_mod_mark_divisors(fg_mod *mod) {
    for (int i = 0; i < mod->nparams; i++) mod->params[i].divisor = false;
    mark_mask(mod, mod->mask);
    mark_func(mod, mod->score);
}

/* ---- parameter struct layout ------------------------------------------ */

void fgi_param_layout_compute(const fg_mod *mod, fgi_param_layout *layout) {
    size_t off = 0;
    const int n = mod->nparams < FGI_MAX_PARAMS ? mod->nparams : FGI_MAX_PARAMS;
    for (int i = 0; i < n; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER) {
            off = (off + 7) & ~(size_t)7;
            layout->offsets[i] = off;
            off += 16;
        } else {
            layout->offsets[i] = off;
            off += 4;
        }
    }
    for (int i = 0; i < n; i++) {
        layout->div_offsets[i] = 0;
        if (mod->params[i].divisor) {
            layout->div_offsets[i] = off;
            off += fgi_param_has_rcp(&mod->params[i]) ? sizeof(float) : sizeof(fgi_divisor);
        }
    }
    off += 4; /* fg_pad */
    layout->size = (off + 7) & ~(size_t)7;
}

void fgi_param_pack(const fg_mod *mod, const fgi_param_layout *layout, const fgi_value *values,
                    void *blob) {
    unsigned char *p = blob;
    memset(p, 0, layout->size);
    for (int i = 0; i < mod->nparams && i < FGI_MAX_PARAMS; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER) {
            uint64_t ptr = (uint64_t)(uintptr_t)values[i].data;
            int64_t len = values[i].length;
            memcpy(p + layout->offsets[i], &ptr, 8);
            memcpy(p + layout->offsets[i] + 8, &len, 8);
        } else {
            memcpy(p + layout->offsets[i], &values[i].scalar, 4);
            if (fgi_param_has_rcp(&mod->params[i])) {
                /* 1 / f rounded to nearest (one IEEE float division here),
                 * what fg_fdiv_by needs */
                const float y = 1.0f / values[i].scalar.f;
                memcpy(p + layout->div_offsets[i], &y, sizeof y);
            } else if (mod->params[i].divisor) {
                const fgi_divisor v = fgi_divisor_of(values[i].scalar.i);
                memcpy(p + layout->div_offsets[i], &v, sizeof v);
            }
        }
    }
}
