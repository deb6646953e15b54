/* test_mutate.c -- damaged snippets never crash the pipeline.
 *
 * Every mod file of the gallery (the .c files of mods/, read from the
 * directory, so a new one joins by itself) is damaged a few hundred ways,
 * each way drawn from a stream fixed by the file's name (the same damages
 * whatever order the directory lists the files in): bytes deleted, a token of the language (or of C
 * outside it, or a stray byte) inserted, a span repeated, the text cut
 * short, a byte replaced; one to three of these a text. Each damaged text
 * then goes through every step a user's snippet meets on the host:
 *   - fg_mod_from_source: FG_OK or an error status with a message, a
 *     diagnostic, and an offset that is -1 or inside the text;
 *   - a mod that parsed: the source of every kernel kind at head dims 64
 *     and 128 (FG_OK or an error with a message), and the CPU evaluator
 *     over a tile, once with every buffer bound (8 elements: indices past
 *     them must be clamped or refused, never read) and once with none;
 *     a mask that evaluated gives 0 or 1.
 * Under the sanitizer build (scripts/test.sh) any read outside a buffer,
 * any use after free and any undefined behaviour on the way fails it. */
#include "testutil.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MUTATIONS 300 /* damaged texts per gallery mod */

/* What a damage may insert: the language's tokens, C's outside it, names
 * that may or may not exist, literals at the edges of their types, and
 * stray bytes. */
static const char *const pieces[] = {
    "(", ")", "{", "}", ";", "?", ":", "&&", "||", "!", "-", "+", "*", "/", "%", "<<", ">>", "~", "^", "&",
    "|", "<", ">=", "==", "=", ",", "[", "]", "[0]", "[-1]", ".", "'", "\"", "\\", "#", "/*", "*/", "//",
    "\n", "\t", " ", "\x01", "\xff", "int", "float", "bool", "const", "void", "return", "if", "else", "for",
    "while", "true", "false", "q_idx", "kv_idx", "score", "h", "b", "mask_mod", "score_mod", "X", "int X = ",
    "float Y[3];", "const int *Z;", "(int)", "(float)", "(bool)", "tanhf(", "exp2f(", "min(", "max(", "abs(",
    "sqrtf(", "logf(", "fabsf(", "floorf(", "0", "1.0f", "1e39", "2147483648", "-2147483648", "0x",
    "0x7fffffff", "1/0", "% 0", "NAN", "INFINITY",
};
#define NPIECES (sizeof pieces / sizeof pieces[0])

/* `src` damaged 1 to 3 times, into a buffer of the caller's (cap bytes). */
static size_t damage(const char *src, char *s, size_t cap, uint64_t *rng) {
    size_t n = strlen(src);
    memcpy(s, src, n + 1);
    const int times = 1 + (int)(tu_rand_u64(rng) % 3);
    for (int t = 0; t < times; t++) {
        const int op = (int)(tu_rand_u64(rng) % 5);
        const size_t at = tu_rand_u64(rng) % (n + 1);
        if (op == 0 && n) { /* delete 1 to 4 bytes */
            size_t d = 1 + tu_rand_u64(rng) % 4;
            if (at + d > n) d = n - at;
            memmove(s + at, s + at + d, n - at - d + 1);
            n -= d;
        } else if (op == 1) { /* insert a piece */
            const char *p = pieces[tu_rand_u64(rng) % NPIECES];
            const size_t l = strlen(p);
            if (n + l + 1 > cap) continue;
            memmove(s + at + l, s + at, n - at + 1);
            memcpy(s + at, p, l);
            n += l;
        } else if (op == 2 && n) { /* repeat a span of up to 40 bytes */
            char span[40];
            const size_t from = tu_rand_u64(rng) % n;
            size_t l = 1 + tu_rand_u64(rng) % sizeof span;
            if (from + l > n) l = n - from;
            if (n + l + 1 > cap) continue;
            memcpy(span, s + from, l);
            memmove(s + at + l, s + at, n - at + 1);
            memcpy(s + at, span, l);
            n += l;
        } else if (op == 3) { /* cut short */
            s[at] = 0;
            n = at;
        } else if (n) { /* replace a byte with a printable one */
            s[tu_rand_u64(rng) % n] = (char)(32 + tu_rand_u64(rng) % 95);
        }
    }
    return n;
}

/* The damage stream of a gallery file: FNV-1a of its name. */
static uint64_t stream_of(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
    return h;
}

static void check_error(fg_ctx *ctx, fg_status st, size_t len, const char *what, const char *text) {
    const char *msg = fg_errmsg(ctx);
    const int64_t off = fg_error_offset(ctx);
    const bool ok = st != FG_OK && msg && *msg && off >= -1 && off <= (int64_t)len && fg_error_diagnostic(ctx);
    if (!ok) print_error("%s: status %s, message \"%s\", offset %lld, on\n%s\n", what, fg_status_string(st),
                         msg ? msg : "(null)", (long long)off, text);
    assert_true(ok);
}

/* Every host step after the parse, on a mod that parsed from `text` (len
 * bytes). */
static void exercise(fg_ctx *ctx, fg_mod *mod, const char *text, size_t len) {
    static const fg_kernel_kind kinds[] = {FG_KERNEL_ATTENTION_FWD,      FG_KERNEL_BLOCK_MASK,
                                           FG_KERNEL_ATTENTION_FWD_SM90, FG_KERNEL_ATTENTION_BWD,
                                           FG_KERNEL_ATTENTION_BWD_SM90, FG_KERNEL_ATTENTION_DECODE};
    assert_true(fg_mod_canonical(mod)[0] != 0);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (int d = 64; d <= 128; d += 64) {
            fg_kernel_config c = fg_kernel_config_init();
            c.kind = kinds[k], c.head_dim = d, c.arch = "sm_90a";
            char *src = NULL;
            const fg_status st = fg_generate_source(ctx, mod, &c, &src);
            if (st == FG_OK) {
                assert_non_null(src);
                fg_free(src);
            } else {
                check_error(ctx, st, len, "source", text);
            }
        }

    static const int32_t ints[8] = {0, 1, 2, 3, 100000, -5, 7, 2147483647};
    static const float floats[8] = {0.f, 1.f, -1.f, 1e30f, -1e30f, 0.5f, 3.f, 1e-30f};
    fg_binding binds[16];
    size_t nb = 0;
    for (size_t i = 0; i < fg_mod_param_count(mod) && nb < 16; i++) {
        fg_param_info pi;
        assert_int_equal(fg_mod_param(mod, i, &pi), FG_OK);
        if (pi.kind == FG_PARAM_BUFFER)
            binds[nb++] = pi.type == FG_TYPE_INT ? fg_bind_int_buffer(pi.name, ints, 8)
                                                 : fg_bind_float_buffer(pi.name, floats, 8);
    }
    uint8_t mask[64];
    float in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i - 30.f;
    for (int bound = 1; bound >= 0; bound--) {
        fg_status st = fg_mod_eval_mask(ctx, mod, bound ? binds : NULL, bound ? nb : 0, 0, 1, 0, 8, 0, 8, mask);
        if (st == FG_OK)
            for (int i = 0; i < 64; i++) assert_true(mask[i] <= 1);
        else
            check_error(ctx, st, len, "mask", text);
        st = fg_mod_eval_score(ctx, mod, bound ? binds : NULL, bound ? nb : 0, 1, 0, 5, 8, 3, 8, in, out);
        if (st != FG_OK) check_error(ctx, st, len, "score", text);
    }
}

static void test_damaged_gallery(void **state) {
    (void)state;
    fg_ctx *ctx = NULL;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tu_path("mods"));
    DIR *d = opendir(dir);
    assert_non_null(d);
    int files = 0;
    long parsed = 0, refused = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t nl = strlen(e->d_name);
        if (nl < 3 || strcmp(e->d_name + nl - 2, ".c") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *orig = tu_read_file(path);
        assert_non_null(orig);
        const size_t cap = strlen(orig) * 2 + 1024;
        char *text = malloc(cap);
        assert_non_null(text);
        files++;
        uint64_t rng = stream_of(e->d_name);
        for (int m = 0; m < MUTATIONS; m++) {
            const size_t len = damage(orig, text, cap, &rng);
            fg_mod *mod = NULL;
            const fg_status st = fg_mod_from_source(ctx, e->d_name, text, len, &mod);
            if (st == FG_OK) {
                parsed++;
                exercise(ctx, mod, text, len);
                fg_mod_destroy(mod);
            } else {
                refused++;
                assert_null(mod);
                check_error(ctx, st, len, "parse", text);
            }
        }
        free(text);
        free(orig);
    }
    closedir(d);
    printf("%d gallery mods, %d damaged texts each: %ld parsed, %ld refused\n", files, MUTATIONS, parsed,
           refused);
    assert_true(files >= 13);
    assert_true(parsed > 0 && refused > 0); /* both paths ran */
    fg_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_damaged_gallery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
