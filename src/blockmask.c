/* blockmask.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

fg_status fg_block_mask_create(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc, const fg_binding *binds, size_t nbinds, fg_block_mask **out) {
    (void)mod;
    (void)desc;
    (void)binds;
    (void)nbinds;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

fg_status fg_block_mask_create_gpu(fg_ctx *ctx, const fg_mod *mod, const fg_block_mask_desc *desc, const fg_binding *binds, size_t nbinds, void *stream, fg_block_mask **out) {
    (void)mod;
    (void)desc;
    (void)binds;
    (void)nbinds;
    (void)stream;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

fg_status fg_block_mask_rebuild_gpu(fg_ctx *ctx, fg_block_mask *mask, const fg_mod *mod, const fg_binding *binds, size_t nbinds, void *stream) {
    (void)mask;
    (void)mod;
    (void)binds;
    (void)nbinds;
    (void)stream;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

fg_status fg_block_mask_from_kv_blocks(fg_ctx *ctx, const fg_block_mask_desc *desc, const int32_t *kv_num_blocks, const int32_t *kv_indices, const int32_t *full_kv_num_blocks, const int32_t *full_kv_indices, fg_block_mask **out) {
    (void)desc;
    (void)kv_num_blocks;
    (void)kv_indices;
    (void)full_kv_num_blocks;
    (void)full_kv_indices;
    (void)out;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

void fg_block_mask_destroy(fg_block_mask *mask) {
    (void)mask;
}

fg_status fg_block_mask_get_desc(const fg_block_mask *mask, fg_block_mask_desc *desc) {
    (void)mask;
    (void)desc;
    return FG_ERR_NOT_SUPPORTED;
}

fg_status fg_block_mask_upload(fg_ctx *ctx, fg_block_mask *mask) {
    (void)mask;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

fg_status fg_block_mask_download(fg_ctx *ctx, fg_block_mask *mask) {
    (void)mask;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/blockmask.c: not implemented");
}

fg_status fg_block_mask_array_get(const fg_block_mask *mask, fg_block_mask_array which, const int32_t **host, uint64_t *device, int64_t dims[4]) {
    (void)mask;
    (void)which;
    (void)host;
    (void)device;
    (void)dims;
    return FG_ERR_NOT_SUPPORTED;
}

fg_status fg_block_mask_sparsity(const fg_block_mask *mask, double *sparsity) {
    (void)mask;
    (void)sparsity;
    return FG_ERR_NOT_SUPPORTED;
}

fg_status fg_block_mask_picture(const fg_block_mask *mask, int max_rows, int max_cols, char **text) {
    (void)mask;
    (void)max_rows;
    (void)max_cols;
    (void)text;
    return FG_ERR_NOT_SUPPORTED;
}
