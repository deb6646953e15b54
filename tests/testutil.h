/* testutil.h -- small helpers shared by the test executables. */
#ifndef FLEXGEN_TESTUTIL_H
#define FLEXGEN_TESTUTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "flexgen.h"

/* The source tree's root ($FLEXGEN_SOURCE_ROOT, set by meson; else "."). */
const char *tu_source_root(void);
/* "<root>/<rel>" in a static buffer (valid until the next call). */
const char *tu_path(const char *rel);
/* A whole file as NUL-terminated text (free it), or NULL when it cannot be
 * read. */
char *tu_read_file(const char *path);
/* Load mods/<name>.c from the gallery; fails the test on error (prints the
 * diagnostic). */
fg_mod *tu_gallery_mod(fg_ctx *ctx, const char *name);
/* For gpu_* tests: exit(77) (meson: skipped) when no CUDA device is usable;
 * else applies $FLEXGEN_TEST_FILTER (a cmocka name pattern, * and ?) to the
 * group that follows. */
void tu_require_gpu(void);
/* Deterministic pseudo-random numbers (xorshift64*). */
uint64_t tu_rand_u64(uint64_t *state);
double tu_rand_uniform(uint64_t *state); /* [0, 1) */
#define TU_MAIN_SKIP 77

#endif
