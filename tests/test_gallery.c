/*
 * test_gallery.c -- every mod of the gallery (mods/\*.c) against the same
 * mask or score written by hand in C.
 *
 * Each row of the table is one gallery mod with one set of parameters: a
 * `prepare` function that chooses the parameter values for a shape (random
 * document layouts, sequence lengths, image intervals, slopes...) and binds
 * them, and the C functions the mod must agree with. Every row is evaluated
 * on several shapes (square and Q_LEN != KV_LEN, odd sizes, several batches
 * and heads) over the whole (q_idx, kv_idx) range and over an offset
 * sub-tile, and compared element by element. Scores are compared bit for
 * bit: the C functions compute in the same order, in float, with the same
 * libm. Two mods are also checked against a 7 x 7 picture drawn by hand.
 */
#include "testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmask/blockmask.h"
#include "internal.h"

typedef struct shape {
    int batch, heads, q_len, kv_len;
} shape;

static const shape SHAPES[] = {
    {1, 1, 1, 1},       /* a single lane                          */
    {2, 3, 37, 53},     /* odd sizes, Q_LEN < KV_LEN              */
    {1, 2, 128, 128},   /* one block                              */
    {1, 1, 257, 300},   /* crosses the evaluator's chunk size     */
    {2, 1, 300, 129},   /* Q_LEN > KV_LEN                         */
};

/* Parameter values of one evaluation, as the C functions see them. */
typedef struct env {
    int window, prefix, width, height, kernel, dilation, global;
    float softcap;
    int32_t *doc, *offsets, *seq_idx, *text_image, *kv_image;
    float *slopes;
    fg_binding binds[4];
    size_t nbinds;
} env;

static void env_free(env *e) {
    free(e->doc);
    free(e->offsets);
    free(e->seq_idx);
    free(e->text_image);
    free(e->kv_image);
    free(e->slopes);
}

static int max_len(const shape *s) { return s->q_len > s->kv_len ? s->q_len : s->kv_len; }
static int rand_int(uint64_t *seed, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(tu_rand_u64(seed) % (uint64_t)(hi - lo + 1));
}

/* ---- the hand-written masks and scores ---------------------------------- */

static bool causal_c(const env *e, int b, int h, int q, int kv) {
    (void)e, (void)b, (void)h;
    return q >= kv;
}

static bool sliding_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    return q >= kv && q - kv <= e->window;
}

static bool prefix_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    return kv < e->prefix || q >= kv;
}

static bool document_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    return q >= kv && e->doc[q] == e->doc[kv];
}

/* Same sequence, causal; padding (seq_idx -1) sees nothing. Written with the
 * sequence ends rather than the mod's offsets test, as a second opinion. */
static bool jagged_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    int s = e->seq_idx[q];
    if (s < 0 || kv > q) return false;
    return kv >= e->offsets[s] && kv < e->offsets[s + 1];
}

static bool sasa_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    int dy = q / e->width - kv / e->width, dx = q % e->width - kv % e->width;
    return abs(dy) <= e->window && abs(dx) <= e->window;
}

static int clampi(int x, int lo, int hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}

static bool natten_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    int r = e->kernel / 2;
    int cy = clampi(q / e->width, r, e->height - 1 - r);
    int cx = clampi(q % e->width, r, e->width - 1 - r);
    return abs(cy - kv / e->width) <= r && abs(cx - kv % e->width) <= r;
}

static bool flamingo_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    return e->text_image[q] != -1 && e->text_image[q] == e->kv_image[kv];
}

/* Written with a division instead of the mod's multiplication, as a second
 * opinion: d is a whole number of DILATION steps, at most WINDOW of them. */
static bool dilated_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    if (kv > q) return false;
    int d = q - kv;
    return d % e->dilation == 0 && d / e->dilation <= e->window;
}

static bool local_global_c(const env *e, int b, int h, int q, int kv) {
    (void)b, (void)h;
    if (kv > q) return false;
    return kv < e->global || kv >= q - e->window;
}

static float noop_c(const env *e, float s, int b, int h, int q, int kv) {
    (void)e, (void)b, (void)h, (void)q, (void)kv;
    return s;
}

static float alibi_c(const env *e, float s, int b, int h, int q, int kv) {
    (void)b;
    return s + e->slopes[h] * (float)(kv - q);
}

static float softcap_c(const env *e, float s, int b, int h, int q, int kv) {
    (void)b, (void)h, (void)q, (void)kv;
    return e->softcap * tanhf(s / e->softcap);
}

/* ---- parameter choices --------------------------------------------------- */

static void bind_i(env *e, const char *name, int v) { e->binds[e->nbinds++] = fg_bind_int(name, v); }

static void prep_none(env *e, const shape *s, uint64_t *seed) { (void)e, (void)s, (void)seed; }
static void prep_window_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->window = 1024;
}
static void prep_window_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->window = rand_int(seed, 0, 20);
    bind_i(e, "WINDOW", e->window);
}
static void prep_prefix_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->prefix = 2048;
}
static void prep_prefix_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->prefix = rand_int(seed, 0, 40);
    bind_i(e, "PREFIX", e->prefix);
}

/* Documents of random lengths packed back to back over every position. */
static void prep_document(env *e, const shape *s, uint64_t *seed) {
    int n = max_len(s);
    e->doc = malloc((size_t)n * sizeof *e->doc);
    for (int i = 0, d = 0; i < n; d++)
        for (int len = rand_int(seed, 1, 40); len > 0 && i < n; len--) e->doc[i++] = d;
    e->binds[e->nbinds++] = fg_bind_int_buffer("document_id", e->doc, n);
}

/* Sequences of random lengths, then a few padding tokens. */
static void prep_jagged(env *e, const shape *s, uint64_t *seed) {
    int n = max_len(s);
    int pad = n > 4 ? rand_int(seed, 0, 3) : 0;
    e->seq_idx = malloc((size_t)n * sizeof *e->seq_idx);
    e->offsets = malloc((size_t)(n + 1) * sizeof *e->offsets);
    int nseq = 0, i = 0;
    while (i < n - pad) {
        e->offsets[nseq] = i;
        for (int len = rand_int(seed, 1, 50); len > 0 && i < n - pad; len--) e->seq_idx[i++] = nseq;
        nseq++;
    }
    e->offsets[nseq] = i;
    for (; i < n; i++) e->seq_idx[i] = -1;
    e->binds[e->nbinds++] = fg_bind_int_buffer("offsets", e->offsets, nseq + 1);
    e->binds[e->nbinds++] = fg_bind_int_buffer("seq_idx", e->seq_idx, n);
}

static void prep_sasa_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->width = 128;
    e->window = 8;
}
static void prep_sasa_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->width = rand_int(seed, 1, 17);
    e->window = rand_int(seed, 0, 3);
    bind_i(e, "W", e->width);
    bind_i(e, "WINDOW", e->window);
}

static void prep_natten_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->width = 128;
    e->height = 64;
    e->kernel = 15;
}
static void prep_natten_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->width = rand_int(seed, 5, 20);
    e->height = rand_int(seed, 5, 20);
    e->kernel = 2 * rand_int(seed, 0, 2) + 1;
    bind_i(e, "W", e->width);
    bind_i(e, "H", e->height);
    bind_i(e, "KERNEL", e->kernel);
}

static void prep_alibi(env *e, const shape *s, uint64_t *seed) {
    (void)seed;
    e->slopes = malloc((size_t)s->heads * sizeof *e->slopes);
    for (int h = 0; h < s->heads; h++) e->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)s->heads);
    e->binds[e->nbinds++] = fg_bind_float_buffer("slopes", e->slopes, s->heads);
}

static void prep_softcap_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->softcap = 20.0f;
}
static void prep_softcap_small(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->softcap = 3.5f;
    e->binds[e->nbinds++] = fg_bind_float("SOFTCAP", e->softcap);
}

/* Text tokens grouped into intervals, each following an image (or none,
 * before the first); key tokens are the images' tokens back to back. */
static void prep_flamingo(env *e, const shape *s, uint64_t *seed) {
    e->text_image = malloc((size_t)s->q_len * sizeof *e->text_image);
    e->kv_image = malloc((size_t)s->kv_len * sizeof *e->kv_image);
    int img = -1;
    for (int q = 0; q < s->q_len; q++) {
        if (rand_int(seed, 0, 9) == 0) img++;
        e->text_image[q] = img;
    }
    int k = 0;
    for (int i = 0; k < s->kv_len; i++)
        for (int len = rand_int(seed, 1, 30); len > 0 && k < s->kv_len; len--) e->kv_image[k++] = i;
    e->binds[e->nbinds++] = fg_bind_int_buffer("text_image", e->text_image, s->q_len);
    e->binds[e->nbinds++] = fg_bind_int_buffer("kv_image", e->kv_image, s->kv_len);
}

static void prep_dilated_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->dilation = 4;
    e->window = 256;
}
static void prep_dilated_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->dilation = rand_int(seed, 1, 7);
    e->window = rand_int(seed, 0, 20);
    bind_i(e, "DILATION", e->dilation);
    bind_i(e, "WINDOW", e->window);
}

static void prep_local_global_default(env *e, const shape *s, uint64_t *seed) {
    (void)s, (void)seed;
    e->window = 512;
    e->global = 64;
}
static void prep_local_global_small(env *e, const shape *s, uint64_t *seed) {
    (void)s;
    e->window = rand_int(seed, 0, 20);
    e->global = rand_int(seed, 0, 10);
    bind_i(e, "WINDOW", e->window);
    bind_i(e, "GLOBAL", e->global);
}

/* ---- the table ----------------------------------------------------------- */

typedef bool (*mask_fn)(const env *, int, int, int, int);
typedef float (*score_fn)(const env *, float, int, int, int, int);

typedef struct gallery_row {
    const char *mod;
    const char *params;   /* what the row varies, for messages */
    void (*prepare)(env *, const shape *, uint64_t *);
    mask_fn mask;         /* NULL: the mod has no mask_mod   */
    score_fn score;       /* NULL: the mod has no score_mod  */
} gallery_row;

static const gallery_row ROWS[] = {
    {"noop", "", prep_none, NULL, noop_c},
    {"causal", "", prep_none, causal_c, NULL},
    {"sliding_window", "WINDOW=1024 (default)", prep_window_default, sliding_c, NULL},
    {"sliding_window", "WINDOW in [0, 20]", prep_window_small, sliding_c, NULL},
    {"prefix_lm", "PREFIX=2048 (default)", prep_prefix_default, prefix_c, NULL},
    {"prefix_lm", "PREFIX in [0, 40]", prep_prefix_small, prefix_c, NULL},
    {"document", "random documents", prep_document, document_c, NULL},
    {"jagged", "random sequences and padding", prep_jagged, jagged_c, NULL},
    {"sasa", "W=128 WINDOW=8 (default)", prep_sasa_default, sasa_c, NULL},
    {"sasa", "W in [1, 17], WINDOW in [0, 3]", prep_sasa_small, sasa_c, NULL},
    {"natten", "128 x 64, KERNEL=15 (default)", prep_natten_default, natten_c, NULL},
    {"natten", "W, H in [5, 20], KERNEL in {1, 3, 5}", prep_natten_small, natten_c, NULL},
    {"alibi", "slopes 2^(-8(h+1)/H)", prep_alibi, causal_c, alibi_c},
    {"softcap", "SOFTCAP=20 (default)", prep_softcap_default, causal_c, softcap_c},
    {"softcap", "SOFTCAP=3.5", prep_softcap_small, causal_c, softcap_c},
    {"flamingo", "random intervals", prep_flamingo, flamingo_c, NULL},
    {"dilated", "DILATION=4 WINDOW=256 (default)", prep_dilated_default, dilated_c, NULL},
    {"dilated", "DILATION in [1, 7], WINDOW in [0, 20]", prep_dilated_small, dilated_c, NULL},
    {"local_global", "WINDOW=512 GLOBAL=64 (default)", prep_local_global_default, local_global_c, NULL},
    {"local_global", "WINDOW in [0, 20], GLOBAL in [0, 10]", prep_local_global_small, local_global_c, NULL},
};

static bool same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Evaluate one tile and compare every lane. */
static void check_tile(fg_ctx *ctx, fg_mod *m, const gallery_row *r, const env *e, const shape *s,
                       int b, int h, int q0, int nq, int kv0, int nk, uint64_t *seed) {
    size_t n = (size_t)nq * nk;
    uint8_t *mk = malloc(n);
    float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
    for (size_t i = 0; i < n; i++) in[i] = (float)(tu_rand_uniform(seed) * 60.0 - 30.0);
    fg_status st = fg_mod_eval_mask(ctx, m, e->binds, e->nbinds, b, h, q0, nq, kv0, nk, mk);
    if (st == FG_OK) st = fg_mod_eval_score(ctx, m, e->binds, e->nbinds, b, h, q0, nq, kv0, nk, in, out);
    if (st != FG_OK) {
        print_error("%s (%s): %s\n", r->mod, r->params, fg_error_diagnostic(ctx));
        fail();
    }
    /* without a score_mod the scores are copied */
    for (int i = 0; i < nq; i++)
        for (int j = 0; j < nk; j++) {
            size_t k = (size_t)i * nk + j;
            int q = q0 + i, kv = kv0 + j;
            bool want_m = r->mask ? r->mask(e, b, h, q, kv) : true;
            float want_s = r->score ? r->score(e, in[k], b, h, q, kv) : in[k];
            if (mk[k] != want_m || !same_float(out[k], want_s)) {
                print_error("%s (%s), shape %dx%dx%dx%d, b=%d h=%d q=%d kv=%d: mask %d want %d, "
                            "score %.9g want %.9g\n",
                            r->mod, r->params, s->batch, s->heads, s->q_len, s->kv_len, b, h, q, kv,
                            mk[k], want_m, (double)out[k], (double)want_s);
                fail();
            }
        }
    free(mk);
    free(in);
    free(out);
}

static void test_gallery_rows(void **state) {
    fg_ctx *ctx = *state;
    uint64_t seed = 0x5eed;
    for (size_t ri = 0; ri < sizeof ROWS / sizeof ROWS[0]; ri++) {
        const gallery_row *r = &ROWS[ri];
        fg_mod *m = tu_gallery_mod(ctx, r->mod);
        assert_int_equal(fg_mod_has_mask(m), r->mask != NULL);
        assert_int_equal(fg_mod_has_score(m), r->score != NULL);
        for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
            const shape *s = &SHAPES[si];
            for (int rep = 0; rep < 2; rep++) { /* two random draws per shape */
                env e;
                memset(&e, 0, sizeof e);
                r->prepare(&e, s, &seed);
                for (int b = 0; b < s->batch; b++)
                    for (int h = 0; h < s->heads; h++) {
                        check_tile(ctx, m, r, &e, s, b, h, 0, s->q_len, 0, s->kv_len, &seed);
                        /* an offset sub-tile, as a block-mask builder asks for */
                        int q0 = rand_int(&seed, 0, s->q_len - 1);
                        int kv0 = rand_int(&seed, 0, s->kv_len - 1);
                        int nq = rand_int(&seed, 1, s->q_len - q0);
                        int nk = rand_int(&seed, 1, s->kv_len - kv0);
                        check_tile(ctx, m, r, &e, s, b, h, q0, nq, kv0, nk, &seed);
                    }
                env_free(&e);
            }
        }
        fg_mod_destroy(m);
    }
}

/* The gallery's defaults are what a benchmark at S = 8192 uses, and every
 * buffer is declared (so a missing binding is reported, not read). */
static void test_gallery_params(void **state) {
    fg_ctx *ctx = *state;
    static const struct {
        const char *mod;
        const char *param;
        fg_param_kind kind;
        fg_type type;
        double def;
    } rows[] = {
        {"sliding_window", "WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 1024},
        {"prefix_lm", "PREFIX", FG_PARAM_SCALAR, FG_TYPE_INT, 2048},
        {"document", "document_id", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"jagged", "offsets", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"jagged", "seq_idx", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"sasa", "W", FG_PARAM_SCALAR, FG_TYPE_INT, 128},
        {"sasa", "WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 8},
        {"natten", "W", FG_PARAM_SCALAR, FG_TYPE_INT, 128},
        {"natten", "H", FG_PARAM_SCALAR, FG_TYPE_INT, 64},
        {"natten", "KERNEL", FG_PARAM_SCALAR, FG_TYPE_INT, 15},
        {"alibi", "slopes", FG_PARAM_BUFFER, FG_TYPE_FLOAT, 0},
        {"softcap", "SOFTCAP", FG_PARAM_SCALAR, FG_TYPE_FLOAT, 20},
        {"flamingo", "text_image", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"flamingo", "kv_image", FG_PARAM_BUFFER, FG_TYPE_INT, 0},
        {"dilated", "DILATION", FG_PARAM_SCALAR, FG_TYPE_INT, 4},
        {"dilated", "WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 256},
        {"local_global", "WINDOW", FG_PARAM_SCALAR, FG_TYPE_INT, 512},
        {"local_global", "GLOBAL", FG_PARAM_SCALAR, FG_TYPE_INT, 64},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, rows[i].mod);
        bool found = false;
        for (size_t k = 0; k < fg_mod_param_count(m); k++) {
            fg_param_info info;
            assert_int_equal(fg_mod_param(m, k, &info), FG_OK);
            if (strcmp(info.name, rows[i].param) != 0) continue;
            found = true;
            assert_int_equal(info.kind, rows[i].kind);
            assert_int_equal(info.type, rows[i].type);
            if (info.kind == FG_PARAM_SCALAR) assert_true(info.default_value == rows[i].def);
        }
        if (!found) {
            print_error("%s has no parameter %s\n", rows[i].mod, rows[i].param);
            fail();
        }
        if (rows[i].kind == FG_PARAM_BUFFER) {
            uint8_t out;
            assert_int_equal(fg_mod_eval_mask(ctx, m, NULL, 0, 0, 0, 0, 1, 0, 1, &out), FG_ERR_UNBOUND);
        }
        fg_mod_destroy(m);
    }
}

/* The guards keep the buffer reads in range: padding tokens in jagged never
 * index offsets, text before the first image never reads past kv_image. */
static void test_gallery_guards(void **state) {
    fg_ctx *ctx = *state;
    fg_mod *jag = tu_gallery_mod(ctx, "jagged");
    const int32_t offsets[] = {0, 3, 5};
    const int32_t seq_idx[] = {0, 0, 0, 1, 1, -1, -1};
    fg_binding jb[2] = {fg_bind_int_buffer("offsets", offsets, 3), fg_bind_int_buffer("seq_idx", seq_idx, 7)};
    uint8_t out[49];
    assert_int_equal(fg_mod_eval_mask(ctx, jag, jb, 2, 0, 0, 0, 7, 0, 7, out), FG_OK);
    static const char *want[7] = {"1000000", "1100000", "1110000", "0001000",
                                  "0001100", "0000000", "0000000"};
    for (int q = 0; q < 7; q++)
        for (int kv = 0; kv < 7; kv++) assert_int_equal(out[q * 7 + kv], want[q][kv] - '0');
    fg_mod_destroy(jag);

    fg_mod *fl = tu_gallery_mod(ctx, "flamingo");
    const int32_t text_image[] = {-1, -1, 0, 0, 1};
    const int32_t kv_image[] = {0, 0, 1};
    fg_binding fb[2] = {fg_bind_int_buffer("text_image", text_image, 5),
                        fg_bind_int_buffer("kv_image", kv_image, 3)};
    assert_int_equal(fg_mod_eval_mask(ctx, fl, fb, 2, 0, 0, 0, 5, 0, 3, out), FG_OK);
    static const char *fwant[5] = {"000", "000", "110", "110", "001"};
    for (int q = 0; q < 5; q++)
        for (int kv = 0; kv < 3; kv++) assert_int_equal(out[q * 3 + kv], fwant[q][kv] - '0');
    fg_mod_destroy(fl);
}

/* The two window mods on 7 x 7, drawn by hand (row q, column kv): dilated
 * with DILATION=2 WINDOW=2 sees distances 0, 2 and 4; local_global with
 * WINDOW=1 GLOBAL=2 the keys 0 and 1 and the one before the query. */
static void test_gallery_pictures(void **state) {
    fg_ctx *ctx = *state;
    static const struct {
        const char *mod, *p1, *p2;
        int v1, v2;
        const char *want[7];
    } rows[] = {
        {"dilated", "DILATION", "WINDOW", 2, 2,
         {"1000000", "0100000", "1010000", "0101000", "1010100", "0101010", "0010101"}},
        {"local_global", "WINDOW", "GLOBAL", 1, 2,
         {"1000000", "1100000", "1110000", "1111000", "1101100", "1100110", "1100011"}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, rows[i].mod);
        fg_binding binds[2] = {fg_bind_int(rows[i].p1, rows[i].v1), fg_bind_int(rows[i].p2, rows[i].v2)};
        uint8_t out[49];
        assert_int_equal(fg_mod_eval_mask(ctx, m, binds, 2, 0, 0, 0, 7, 0, 7, out), FG_OK);
        for (int q = 0; q < 7; q++)
            for (int kv = 0; kv < 7; kv++)
                if (out[q * 7 + kv] != rows[i].want[q][kv] - '0') {
                    print_error("%s: q=%d kv=%d is %d\n", rows[i].mod, q, kv, out[q * 7 + kv]);
                    fail();
                }
        fg_mod_destroy(m);
    }
    /* DILATION must be positive: 0 is the evaluator's division by zero. */
    fg_mod *d = tu_gallery_mod(ctx, "dilated");
    fg_binding zero = fg_bind_int("DILATION", 0);
    uint8_t out;
    assert_int_equal(fg_mod_eval_mask(ctx, d, &zero, 1, 0, 0, 0, 1, 0, 1, &out), FG_ERR_EVAL);
    fg_mod_destroy(d);
}

/* Which masks keep only keys near a late query (fgi_mask_is_local, judged
 * on first use and remembered, at its parameters' defaults): the windows (a
 * sliding window of 1025 keys is 9 blocks of 128; dilated's reach of
 * 1024; local_global's window of 513 and its one block of global keys;
 * natten's and sasa's canvases lie behind the sampled query, or 9 rows of
 * it), and not: causal masks (every block), no mask, masks read from
 * buffers (no values to sample). Then masks made from expressions: a
 * window of 16 blocks is one, of 17 not; keys every 4096 (the samples of
 * the row's middle hold some) not; a global block of 3 at the start not;
 * a mask whose evaluation fails at its defaults (a division by zero) not. */
static void test_gallery_reach(void **state) {
    fg_ctx *ctx = *state;
    static const struct {
        const char *mod;
        bool local;
    } rows[] = {
        {"sliding_window", true}, {"dilated", true},   {"local_global", true}, {"natten", true},
        {"sasa", true},           {"causal", false},   {"alibi", false},       {"softcap", false},
        {"prefix_lm", false},     {"noop", false},     {"document", false},    {"jagged", false},
        {"flamingo", false},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        fg_mod *m = tu_gallery_mod(ctx, rows[i].mod);
        const bool local = fgi_mask_is_local(m);
        if (local != rows[i].local) fail_msg("%s: local %d", rows[i].mod, (int)local);
        assert_int_equal(fgi_mask_is_local(m), local); /* remembered */
        fg_mod_destroy(m);
    }
    static const struct {
        const char *expr;
        bool local;
    } exprs[] = {
        {"q_idx >= kv_idx && q_idx - kv_idx < 16 * 128", true},
        {"q_idx >= kv_idx && q_idx - kv_idx < 16 * 128 + 1", false},
        {"q_idx >= kv_idx && kv_idx % 4096 == 0", false},
        {"q_idx >= kv_idx && (q_idx - kv_idx <= 1024 || kv_idx < 2 * 128)", true},
        {"q_idx >= kv_idx && (q_idx - kv_idx <= 1024 || kv_idx < 3 * 128)", false},
        {"q_idx >= kv_idx && q_idx - kv_idx <= 1024 && q_idx % Z == 0", false},
    };
    const fg_param_decl z = {"Z", FG_PARAM_SCALAR, FG_TYPE_INT, 0.0};
    for (size_t i = 0; i < sizeof exprs / sizeof exprs[0]; i++) {
        fg_mod *m = NULL;
        assert_int_equal(fg_mod_from_expr(ctx, FG_MASK_MOD, exprs[i].expr, &z, 1, &m), FG_OK);
        const bool local = fgi_mask_is_local(m);
        if (local != exprs[i].local) fail_msg("%s: local %d", exprs[i].expr, (int)local);
        fg_mod_destroy(m);
    }
}

static int setup(void **state) {
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) return -1;
    *state = ctx;
    return 0;
}

static int teardown(void **state) {
    fg_ctx_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gallery_rows),
        cmocka_unit_test(test_gallery_params),
        cmocka_unit_test(test_gallery_guards),
        cmocka_unit_test(test_gallery_pictures),
        cmocka_unit_test(test_gallery_reach),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
