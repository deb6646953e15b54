/*
 * growable.h -- reading a public argument struct that may grow (flexgen.h,
 * Conventions): fg_kernel_config, fg_block_mask_desc, fg_attention_args.
 *
 * Each such struct ends its 0.1 fields with `size_t struct_size`, and every
 * field added later comes after it, so offsetof(T, struct_size) is both the
 * size of the 0.1 layout and where the caller's size is found. The library
 * never works on the caller's struct: each entry point copies it once into
 * its own layout (FGI_STRUCT_IN) and reads the copy, in which struct_size
 * is sizeof(T) and every field the caller did not have is zero. The rule is
 * Linux's copy_struct_from_user: what the caller's size covers is taken,
 * what it does not is zero, and bytes the library does not know are
 * accepted only when they are zero.
 */
#ifndef FLEXGEN_GROWABLE_H
#define FLEXGEN_GROWABLE_H

#include "internal.h"

#include <string.h>

/* A struct_size past this is no struct's size but a field nobody set (a
 * 0.1 caller filling an uninitialised struct field by field leaves whatever
 * the stack held there): it is refused without reading that far. */
#define FGI_STRUCT_SIZE_MAX 4096

/* Copy the caller's struct `in` (named `what` in messages) into `out`, the
 * library's layout of `size` bytes whose 0.1 part, and struct_size field,
 * start at `v01`. */
static inline fg_status fgi_struct_in(fg_ctx *ctx, const char *what, const void *in, size_t v01,
                                      size_t size, void *out) {
    size_t claimed;
    memcpy(&claimed, (const unsigned char *)in + v01, sizeof claimed);
    if (claimed == 0) claimed = v01;
    if (claimed < v01 || claimed > FGI_STRUCT_SIZE_MAX)
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT,
                         "%s.struct_size is %zu: it must be 0 (the 0.1 layout, %zu bytes) or the "
                         "struct's sizeof (%zu bytes in this flexgen, more in a newer one); is it "
                         "uninitialised?",
                         what, claimed, v01, size);
    for (size_t i = size; i < claimed; i++)
        if (((const unsigned char *)in)[i] != 0)
            return fgi_error(ctx, FG_ERR_NOT_SUPPORTED,
                             "%s: the caller's struct of %zu bytes sets byte %zu, past the %zu "
                             "bytes flexgen %s knows: it asks for a field of a newer flexgen",
                             what, claimed, i, size, FLEXGEN_VERSION_STRING);
    memset(out, 0, size);
    memcpy(out, in, claimed < size ? claimed : size);
    memcpy((unsigned char *)out + v01, &size, sizeof size);
    return FG_OK;
}

#define FGI_STRUCT_IN(ctx, T, in, out) \
    fgi_struct_in((ctx), #T, (in), offsetof(T, struct_size), sizeof(T), (out))

#endif
