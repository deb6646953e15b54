/*
 * custom_mod.c -- run any mod: a file in the mod language, or expressions.
 *
 *   custom_mod [options] FILE.c
 *   custom_mod [options] --expr-mask 'q_idx >= kv_idx' [--expr-score 'score * 0.5f']
 *
 * This is the loop a user goes through with a new mod: does it parse and
 * check (if not, the diagnostic points at the token), what does flexgen make
 * of it (the canonical text is what the cache key is made from), which
 * parameters does it take, what does its block mask look like, does the
 * generated kernel compile, and does the GPU agree with the CPU reference.
 * Everything up to the compile runs without a GPU.
 *
 * Parameters: scalars keep their default unless `--set NAME=VALUE` says
 * otherwise. Buffers come from text files of numbers, `--buffer NAME=FILE`;
 * the same values go to the CPU (block mask, reference) and, copied, to the
 * GPU. In the expression form each --set / --buffer also declares the
 * parameter (int when every value is an integer, else float).
 *
 * Options: --batch N (1), --heads N (4), --kv-heads N (= heads), --q-len N
 * (1024), --kv-len N (= q-len), --head-dim N (128), --no-compile. The
 * program exits 0 when the mod checks and, with a GPU, the result is within
 * bf16 tolerance of the reference; 2 for a usage error; 1 otherwise.
 *
 * Build: cc custom_mod.c $(pkg-config --cflags --libs flexgen) -lm
 */
#include "example_util.h"

#include <errno.h>

enum { MAX_PARAMS = 32, CHECK_ROWS = 8 };

/* A --set or --buffer from the command line. */
typedef struct setting {
    const char *name;  /* points into argv */
    const char *value; /* the text after '=' */
    int is_buffer;
    double *data;      /* buffers: the numbers read from the file */
    int64_t length;
    int all_int;
} setting;

typedef struct options {
    const char *file, *expr_mask, *expr_score;
    int batch, heads, kv_heads, q_len, kv_len, head_dim, compile;
    setting set[MAX_PARAMS];
    int nset;
} options;

static void usage(void) {
    fprintf(stderr,
            "usage: custom_mod [options] FILE.c\n"
            "       custom_mod [options] --expr-mask EXPR [--expr-score EXPR]\n"
            "options: --batch N --heads N --kv-heads N --q-len N --kv-len N --head-dim N\n"
            "         --set NAME=VALUE --buffer NAME=FILE --no-compile\n");
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

/* Read whitespace-separated numbers. Returns 0 with a message on failure. */
static int read_numbers(setting *st) {
    FILE *f = fopen(st->value, "r");
    if (!f) {
        fprintf(stderr, "--buffer %s: cannot open '%s'\n", st->name, st->value);
        return 0;
    }
    size_t cap = 0;
    double x;
    st->all_int = 1;
    while (fscanf(f, "%lf", &x) == 1) {
        if ((size_t)st->length == cap) {
            cap = cap ? 2 * cap : 256;
            double *p = realloc(st->data, cap * sizeof *p);
            if (!p) break;
            st->data = p;
        }
        st->data[st->length++] = x;
        if (x != floor(x) || fabs(x) > 2147483647.0) st->all_int = 0;
    }
    int ok = feof(f) && st->length > 0;
    fclose(f);
    if (!ok) fprintf(stderr, "--buffer %s: '%s' is not a list of numbers\n", st->name, st->value);
    return ok;
}

static int add_setting(options *o, const char *arg, int is_buffer) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || o->nset == MAX_PARAMS) return 0;
    setting *st = &o->set[o->nset++];
    memset(st, 0, sizeof *st);
    st->name = arg, st->value = eq + 1, st->is_buffer = is_buffer;
    ((char *)arg)[eq - arg] = '\0'; /* argv strings are writable */
    return is_buffer ? read_numbers(st) : 1;
}

static int parse_args(int argc, char **argv, options *o) {
    *o = (options){.batch = 1, .heads = 4, .q_len = 1024, .head_dim = 128, .compile = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(a, "--no-compile")) o->compile = 0;
        else if (a[0] != '-' && !o->file) o->file = a;
        else if (!next) ok = 0;
        else if (!strcmp(a, "--expr-mask")) o->expr_mask = next, i++;
        else if (!strcmp(a, "--expr-score")) o->expr_score = next, i++;
        else if (!strcmp(a, "--set")) ok = add_setting(o, argv[++i], 0);
        else if (!strcmp(a, "--buffer")) ok = add_setting(o, argv[++i], 1);
        else if (!strcmp(a, "--batch")) ok = parse_int(argv[++i], 1, 1 << 16, &o->batch);
        else if (!strcmp(a, "--heads")) ok = parse_int(argv[++i], 1, 1024, &o->heads);
        else if (!strcmp(a, "--kv-heads")) ok = parse_int(argv[++i], 1, 1024, &o->kv_heads);
        else if (!strcmp(a, "--q-len")) ok = parse_int(argv[++i], 1, 1 << 20, &o->q_len);
        else if (!strcmp(a, "--kv-len")) ok = parse_int(argv[++i], 1, 1 << 20, &o->kv_len);
        else if (!strcmp(a, "--head-dim")) ok = parse_int(argv[++i], 16, 256, &o->head_dim);
        else ok = 0;
        if (!ok) {
            fprintf(stderr, "custom_mod: bad argument near '%s'\n", a);
            return 0;
        }
    }
    if (!o->kv_heads) o->kv_heads = o->heads;
    if (!o->kv_len) o->kv_len = o->q_len;
    return (o->file != NULL) != (o->expr_mask || o->expr_score);
}

/* The expression form: every --set / --buffer declares a parameter. */
static fg_status mod_from_exprs(fg_ctx *ctx, const options *o, fg_mod **out) {
    fg_param_decl decl[MAX_PARAMS];
    for (int i = 0; i < o->nset; i++) {
        const setting *st = &o->set[i];
        char *end;
        double v = st->is_buffer ? 0.0 : strtod(st->value, &end);
        int is_int = st->is_buffer ? st->all_int : strspn(st->value, "-0123456789") == strlen(st->value);
        decl[i] = (fg_param_decl){st->name, st->is_buffer ? FG_PARAM_BUFFER : FG_PARAM_SCALAR,
                                  is_int ? FG_TYPE_INT : FG_TYPE_FLOAT, v};
    }
    fg_mod *mask = NULL, *score = NULL;
    fg_status s = FG_OK;
    if (o->expr_mask) s = fg_mod_from_expr(ctx, FG_MASK_MOD, o->expr_mask, decl, (size_t)o->nset, &mask);
    if (s == FG_OK && o->expr_score)
        s = fg_mod_from_expr(ctx, FG_SCORE_MOD, o->expr_score, decl, (size_t)o->nset, &score);
    if (s == FG_OK && mask && score) s = fg_mod_combine(ctx, mask, score, out);
    else if (s == FG_OK) *out = mask ? mask : score, mask = score = NULL;
    fg_mod_destroy(mask);
    fg_mod_destroy(score);
    return s;
}

/* Host bindings for every parameter the mod declares, from the settings.
 * Buffer values are converted to the declared element type into `store`. */
static fg_status make_bindings(fg_ctx *ctx, const fg_mod *mod, const options *o, fg_binding *binds,
                               size_t *nbinds, void **store) {
    *nbinds = 0;
    for (size_t i = 0; i < fg_mod_param_count(mod); i++) {
        fg_param_info p;
        fg_status s = fg_mod_param(mod, i, &p);
        if (s != FG_OK) return s;
        const setting *st = NULL;
        for (int j = 0; j < o->nset; j++)
            if (!strcmp(o->set[j].name, p.name)) st = &o->set[j];
        printf("parameter %-12s %s %-5s", p.name, p.kind == FG_PARAM_SCALAR ? "scalar" : "buffer",
               p.type == FG_TYPE_INT ? "int" : "float");
        if (p.kind == FG_PARAM_SCALAR) {
            double v = st ? strtod(st->value, NULL) : p.default_value;
            printf(" = %g%s\n", v, st ? "" : " (default)");
            binds[(*nbinds)++] = p.type == FG_TYPE_INT ? fg_bind_int(p.name, (int32_t)v)
                                                       : fg_bind_float(p.name, (float)v);
            continue;
        }
        if (!st || !st->is_buffer) {
            printf("\n");
            return fg_status_string(FG_ERR_UNBOUND) ? (fprintf(stderr, "buffer '%s' needs --buffer %s=FILE\n", p.name, p.name), FG_ERR_UNBOUND) : FG_ERR_UNBOUND;
        }
        printf(" [%lld] from %s\n", (long long)st->length, st->value);
        void *data = malloc((size_t)st->length * 4);
        if (!data) return FG_ERR_OUT_OF_MEMORY;
        store[i] = data;
        for (int64_t j = 0; j < st->length; j++) {
            if (p.type == FG_TYPE_INT) ((int32_t *)data)[j] = (int32_t)st->data[j];
            else ((float *)data)[j] = (float)st->data[j];
        }
        binds[(*nbinds)++] = p.type == FG_TYPE_INT
                                 ? fg_bind_int_buffer(p.name, data, st->length)
                                 : fg_bind_float_buffer(p.name, data, st->length);
    }
    (void)ctx;
    return FG_OK;
}
