/* testutil.c -- see testutil.h. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *tu_source_root(void) {
    const char *r = getenv("FLEXGEN_SOURCE_ROOT");
    return r && *r ? r : ".";
}

const char *tu_path(const char *rel) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", tu_source_root(), rel);
    return buf;
}

char *tu_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *s = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) s[n] = 0;
    return s;
}

fg_mod *tu_gallery_mod(fg_ctx *ctx, const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "mods/%s.c", name);
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_file(ctx, tu_path(rel), &m);
    if (st != FG_OK) {
        print_error("gallery mod %s: %s\n%s", name, fg_status_string(st), fg_error_diagnostic(ctx));
        fail();
    }
    return m;
}

void tu_require_gpu(void) {
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) exit(1);
    fg_status st = fgi_cuda_ready(ctx);
    if (st != FG_OK) {
        printf("skipping: %s (%s)\n", fg_status_string(st), fg_errmsg(ctx));
        fg_ctx_destroy(ctx);
        exit(TU_MAIN_SKIP);
    }
    fg_ctx_destroy(ctx);
    /* The GPU suites are long; a run can take some of their tests only. */
    const char *filter = getenv("FLEXGEN_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
}

uint64_t tu_rand_u64(uint64_t *s) {
    uint64_t x = *s ? *s : 0x9E3779B97F4A7C15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1Dull;
}

double tu_rand_uniform(uint64_t *s) { return (double)(tu_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0); }
