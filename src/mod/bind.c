/*
 * bind.c -- run-time values for a mod's parameters: the public binding
 * helpers, their resolution against the mod's declarations (defaults for
 * unbound scalars, errors for unbound buffers and mismatched kinds), and the
 * layout of the by-value parameter struct the emitted CUDA declares and the
 * launchers pack.
 */
#include "internal.h"

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
    for (int i = 0; i < mod->nparams; i++)
        if (mod->params[i].kind == FG_PARAM_BUFFER && !bound[i])
            return fgi_error(ctx, FG_ERR_UNBOUND, "buffer parameter '%s' is not bound", mod->params[i].name);
    return FG_OK;
}

/* ---- parameter struct layout ------------------------------------------ */

void fgi_param_layout_compute(const fg_mod *mod, fgi_param_layout *layout) {
    size_t off = 0;
    for (int i = 0; i < mod->nparams && i < FGI_MAX_PARAMS; i++) {
        if (mod->params[i].kind == FG_PARAM_BUFFER) {
            off = (off + 7) & ~(size_t)7;
            layout->offsets[i] = off;
            off += 16;
        } else {
            layout->offsets[i] = off;
            off += 4;
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
        }
    }
}
