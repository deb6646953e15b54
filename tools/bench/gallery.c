/*
 * gallery.c -- the parameter values of each case of `flexgen bench`, on the
 * host: a small store of named scalars and buffers, the gallery's setups
 * with the values of bench/torch_mods.py (document ids, offsets, slopes ...
 * generated here from fixed seeds, so every run sees the same), and for
 * custom mods the values of --set and --buffer.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

/* ---- the store ------------------------------------------------------------ */

void bench_params_free(bench_params *s) {
    for (int i = 0; i < s->n; i++) free(s->p[i].data);
    s->n = 0;
}

/* The slot named `name`, emptied (a new one if none); NULL when full. */
static bench_param *params_slot(bench_params *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->p[i].name, name) == 0) {
            free(s->p[i].data);
            memset(&s->p[i], 0, sizeof s->p[i]);
            snprintf(s->p[i].name, sizeof s->p[i].name, "%s", name);
            return &s->p[i];
        }
    if (s->n == BENCH_MAX_PARAMS) return NULL;
    bench_param *p = &s->p[s->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static bool set_scalar(bench_params *s, const char *name, fg_type type, double v) {
    bench_param *p = params_slot(s, name);
    if (!p) return false;
    p->kind = FG_PARAM_SCALAR;
    p->type = type;
    p->value = v;
    return true;
}

/* Takes ownership of data. */
static bool set_buffer(bench_params *s, const char *name, fg_type type, void *data, int64_t length) {
    bench_param *p = params_slot(s, name);
    if (!p) {
        free(data);
        return false;
    }
    p->kind = FG_PARAM_BUFFER;
    p->type = type;
    p->data = data;
    p->length = length;
    return true;
}

void bench_params_bind(const bench_params *s, fg_binding *b) {
    for (int i = 0; i < s->n; i++) {
        const bench_param *p = &s->p[i];
        if (p->kind == FG_PARAM_SCALAR)
            b[i] = p->type == FG_TYPE_INT ? fg_bind_int(p->name, (int32_t)p->value)
                                          : fg_bind_float(p->name, (float)p->value);
        else if (p->type == FG_TYPE_INT)
            b[i] = fg_bind_int_buffer(p->name, p->data, p->length);
        else
            b[i] = fg_bind_float_buffer(p->name, p->data, p->length);
    }
}

/* ---- the gallery's values (those of bench/torch_mods.py) ------------------ */

/* `count` positive lengths summing to `total`, from sorted random cut points. */
static int *random_lengths(int total, int count, uint64_t seed) {
    if (count > total) count = total;
    if (count < 1) count = 1;
    int *cuts = malloc(sizeof(int) * (size_t)(count + 1));
    if (!cuts) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    cuts[0] = 0;
    cuts[count] = total;
    for (int i = 1; i < count; i++) {
        int c;
        bool again;
        do { /* distinct cut points in [1, total-1] */
            c = 1 + (int)(fg_cli_rand_u64(&s) % (uint64_t)(total - 1));
            again = false;
            for (int j = 1; j < i; j++) again |= cuts[j] == c;
        } while (again);
        cuts[i] = c;
    }
    for (int i = 1; i < count; i++) /* insertion sort: count is small */
        for (int j = i; j > 1 && cuts[j - 1] > cuts[j]; j--) {
            int t = cuts[j];
            cuts[j] = cuts[j - 1];
            cuts[j - 1] = t;
        }
    int *len = malloc(sizeof(int) * (size_t)count);
    if (len)
        for (int i = 0; i < count; i++) len[i] = cuts[i + 1] - cuts[i];
    free(cuts);
    return len;
}

#define DOCUMENTS 12

static int32_t *ids_from_lengths(const int *len, int count, int S) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)S);
    if (!ids) return NULL;
    int pos = 0;
    for (int d = 0; d < count; d++)
        for (int i = 0; i < len[d] && pos < S; i++) ids[pos++] = d;
    return ids;
}

static void image_side(int S, int *width, int *height) {
    int w = (int)sqrt((double)S);
    while (w > 1 && S % w) w--;
    *width = S / w;
    *height = w;
}

static bool setup_none(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S, (void)s;
    return true;
}

static bool setup_sliding_window(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "WINDOW", FG_TYPE_INT, 1024);
}

static bool setup_prefix_lm(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "PREFIX", FG_TYPE_INT, 2048);
}

static bool setup_document(int B, int H, int S, bench_params *s) {
    (void)B, (void)H;
    int n = S < DOCUMENTS ? S : DOCUMENTS;
    int *len = random_lengths(S, n, 1);
    if (!len) return false;
    int32_t *ids = ids_from_lengths(len, n, S);
    free(len);
    return ids && set_buffer(s, "document_id", FG_TYPE_INT, ids, S);
}

static bool setup_jagged(int B, int H, int S, bench_params *s) {
    (void)B, (void)H;
    int n = S < DOCUMENTS ? S : DOCUMENTS;
    int *len = random_lengths(S, n, 2);
    int32_t *off = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int32_t *seq = len ? ids_from_lengths(len, n, S) : NULL;
    if (!len || !off || !seq) {
        free(len), free(off), free(seq);
        return false;
    }
    off[0] = 0;
    for (int i = 0; i < n; i++) off[i + 1] = off[i] + len[i];
    free(len);
    if (!set_buffer(s, "offsets", FG_TYPE_INT, off, n + 1)) {
        free(seq);
        return false;
    }
    return set_buffer(s, "seq_idx", FG_TYPE_INT, seq, S);
}

static bool setup_sasa(int B, int H, int S, bench_params *s) {
    (void)B, (void)H;
    int w, h;
    image_side(S, &w, &h);
    return set_scalar(s, "W", FG_TYPE_INT, w) && set_scalar(s, "WINDOW", FG_TYPE_INT, 8);
}

static bool setup_natten(int B, int H, int S, bench_params *s) {
    (void)B, (void)H;
    int w, h;
    image_side(S, &w, &h);
    return set_scalar(s, "W", FG_TYPE_INT, w) && set_scalar(s, "H", FG_TYPE_INT, h) &&
           set_scalar(s, "KERNEL", FG_TYPE_INT, 15);
}

static bool setup_alibi(int B, int H, int S, bench_params *s) {
    (void)B, (void)S;
    float *slopes = malloc(sizeof(float) * (size_t)H);
    if (!slopes) return false;
    for (int h = 0; h < H; h++) slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
    return set_buffer(s, "slopes", FG_TYPE_FLOAT, slopes, H);
}

static bool setup_softcap(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "SOFTCAP", FG_TYPE_FLOAT, 20.0);
}

#define FLAMINGO_IMAGES 8

/* Text in FLAMINGO_IMAGES + 1 intervals (the first sees no image), keys are
 * image tokens, S / FLAMINGO_IMAGES per image. */
static bool setup_flamingo(int B, int H, int S, bench_params *s) {
    (void)B, (void)H;
    int n = S < FLAMINGO_IMAGES + 1 ? S : FLAMINGO_IMAGES + 1;
    int *len = random_lengths(S, n, 3);
    int32_t *text = len ? ids_from_lengths(len, n, S) : NULL;
    int32_t *kv = malloc(sizeof(int32_t) * (size_t)S);
    free(len);
    if (!text || !kv) {
        free(text), free(kv);
        return false;
    }
    int per = S / FLAMINGO_IMAGES > 0 ? S / FLAMINGO_IMAGES : 1;
    for (int i = 0; i < S; i++) {
        text[i] -= 1;
        kv[i] = i / per < FLAMINGO_IMAGES - 1 ? i / per : FLAMINGO_IMAGES - 1;
    }
    if (!set_buffer(s, "text_image", FG_TYPE_INT, text, S)) {
        free(kv);
        return false;
    }
    return set_buffer(s, "kv_image", FG_TYPE_INT, kv, S);
}

static bool setup_dilated(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "DILATION", FG_TYPE_INT, 4) && set_scalar(s, "WINDOW", FG_TYPE_INT, 256);
}

static bool setup_local_global(int B, int H, int S, bench_params *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "WINDOW", FG_TYPE_INT, 512) && set_scalar(s, "GLOBAL", FG_TYPE_INT, 64);
}

const bench_gallery_entry bench_gallery[] = {
    {"noop", setup_none},       {"causal", setup_none},           {"sliding_window", setup_sliding_window},
    {"prefix_lm", setup_prefix_lm}, {"document", setup_document}, {"jagged", setup_jagged},
    {"sasa", setup_sasa},       {"natten", setup_natten},         {"alibi", setup_alibi},
    {"softcap", setup_softcap}, {"flamingo", setup_flamingo},     {"dilated", setup_dilated},
    {"local_global", setup_local_global},
};
const size_t bench_gallery_count = sizeof bench_gallery / sizeof bench_gallery[0];

/* ---- custom values: --set and --buffer ------------------------------------ */

static bool find_param(const fg_mod *mod, const char *name, fg_param_info *info) {
    size_t n = fg_mod_param_count(mod);
    for (size_t i = 0; i < n; i++)
        if (fg_mod_param(mod, i, info) == FG_OK && strcmp(info->name, name) == 0) return true;
    return false;
}

/* Split "NAME=REST" and find NAME among the mod's parameters of `kind`. */
static fg_status named_param(fg_ctx *ctx, const fg_mod *mod, const char *spec, fg_param_kind kind,
                             char name[64], fg_param_info *info) {
    size_t n = strcspn(spec, "=");
    if (n == 0 || n >= 64 || spec[n] != '=')
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "'%s' is not NAME=VALUE", spec);
    memcpy(name, spec, n);
    name[n] = 0;
    if (!find_param(mod, name, info) || info->kind != kind)
        return fgi_error(ctx, FG_ERR_UNBOUND, "mod '%s' has no %s parameter '%s'", fg_mod_name(mod),
                         kind == FG_PARAM_SCALAR ? "scalar" : "buffer", name);
    return FG_OK;
}

static fg_status apply_set(fg_ctx *ctx, const fg_mod *mod, const char *spec, bench_params *s) {
    char name[64];
    fg_param_info info;
    FGI_TRY(named_param(ctx, mod, spec, FG_PARAM_SCALAR, name, &info));
    const char *text = spec + strlen(name) + 1;
    char *end;
    double v = strtod(text, &end);
    if (*text == 0 || *end != 0 || (info.type == FG_TYPE_INT && (v != floor(v) || fabs(v) > 2147483647.0)))
        return fgi_error(ctx, FG_ERR_INVALID_ARGUMENT, "--set %s: not a%s number", spec,
                         info.type == FG_TYPE_INT ? " whole int32" : "");
    return set_scalar(s, name, info.type, v) ? FG_OK : fgi_error(ctx, FG_ERR_LIMIT, "too many parameters");
}

static fg_status apply_buffer(fg_ctx *ctx, const fg_mod *mod, const char *spec, bench_params *s) {
    char name[64];
    fg_param_info info;
    FGI_TRY(named_param(ctx, mod, spec, FG_PARAM_BUFFER, name, &info));
    void *data = NULL;
    int64_t count = 0;
    if (fg_cli_read_numbers(spec + strlen(name) + 1, info.type, &data, &count) != 0)
        return fgi_error(ctx, FG_ERR_IO, "--buffer %s: cannot read the numbers", spec);
    return set_buffer(s, name, info.type, data, count) ? FG_OK
                                                       : fgi_error(ctx, FG_ERR_LIMIT, "too many parameters");
}

fg_status bench_case_params(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                            int B, int H, int S, bench_params *s) {
    memset(s, 0, sizeof *s);
    if (c->setup && !c->setup(B, H, S, s))
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory for the parameters of %s", c->name);
    if (!c->setup) {
        for (int i = 0; i < o->nsets; i++) FGI_TRY(apply_set(ctx, mod, o->sets[i], s));
        for (int i = 0; i < o->nbuffers; i++) FGI_TRY(apply_buffer(ctx, mod, o->buffers[i], s));
    }
    return FG_OK;
}
