/* cache.c -- placeholder until the module lands (every entry point reports FG_ERR_NOT_SUPPORTED). */
#include "internal.h"

void fg_cache_get_stats(fg_cache_stats *stats) {
    (void)stats;
}

void fg_cache_reset_stats(void) {
}

fg_status fg_cache_dir(fg_ctx *ctx, const char **dir) {
    (void)dir;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/cache.c: not implemented");
}

fg_status fg_cache_clear(fg_ctx *ctx, size_t *removed) {
    (void)removed;
    return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "src/cache.c: not implemented");
}

void fg_cache_forget_memory(void) {
}
