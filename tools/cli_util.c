/*
 * cli_util.c -- the parts of the flexgen tool every subcommand needs: how a
 * mod is named on the command line, how its parameters get values, how
 * an error becomes a message and an exit code, lists of numbers, and the
 * names of the kernel kinds.
 *
 * Options are recorded raw while getopt runs and interpreted afterwards,
 * because the meaning of `--set WINDOW=256` (int or float?) is known only
 * once the mod is loaded, and the mod may be named after the --set.
 */
#include "cli.h"

#include "mod/deriv.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ----------------------------------------------------------------- */

int fg_cli_exit_code(fg_status st) {
    switch (st) {
    case FG_OK: return FG_EXIT_OK;
    case FG_ERR_SYNTAX:
    case FG_ERR_UNSUPPORTED:
    case FG_ERR_NAME:
    case FG_ERR_TYPE:
    case FG_ERR_SIGNATURE:
    case FG_ERR_ARITY:
    case FG_ERR_LIMIT: return FG_EXIT_BAD_MOD;
    case FG_ERR_COMPILE: return FG_EXIT_COMPILE;
    case FG_ERR_NO_DEVICE: return FG_EXIT_NO_GPU;
    case FG_ERR_TOLERANCE: return FG_EXIT_TOLERANCE;
    default: return FG_EXIT_OTHER;
    }
}

int fg_cli_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("flexgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

int fg_cli_fail(fg_ctx *ctx, fg_status st, const char *what) {
    const char *diag = ctx ? fg_error_diagnostic(ctx) : fg_status_string(st);
    /* a mod diagnostic starts with file:line:col, which reads best alone */
    bool positioned = ctx && fg_error_offset(ctx) >= 0;
    if (what) fprintf(stderr, "flexgen: %s:%s", what, positioned ? "\n" : " ");
    else if (!positioned) fputs("flexgen: ", stderr);
    fputs(diag && *diag ? diag : fg_status_string(st), stderr);
    if (!diag || !*diag || diag[strlen(diag) - 1] != '\n') fputc('\n', stderr);
    if (st == FG_ERR_COMPILE && ctx) {
        const char *log = fg_compile_log(ctx);
        if (log && *log) {
            fputs("---- NVRTC log ----\n", stderr);
            fputs(log, stderr);
            if (log[strlen(log) - 1] != '\n') fputc('\n', stderr);
        }
    }
    return fg_cli_exit_code(st);
}

/* ---- numbers ----------------------------------------------------------------- */

int fg_cli_parse_int(const char *s, const char *what, long long lo, long long hi, int *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 0) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return fg_cli_error(FG_EXIT_USAGE, "%s: '%s' is not a whole number in [%lld, %lld]", what,
                            s ? s : "", lo, hi);
    *out = (int)v;
    return 0;
}

int fg_cli_parse_double(const char *s, const char *what, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno == ERANGE)
        return fg_cli_error(FG_EXIT_USAGE, "%s: '%s' is not a number", what, s ? s : "");
    *out = v;
    return 0;
}

int fg_cli_parse_int_list(const char *s, const char *what, long long lo, long long hi, int32_t **out, int *n) {
    *out = NULL, *n = 0;
    if (!s || !*s) return fg_cli_error(FG_EXIT_USAGE, "%s: expected a comma-separated list of numbers", what);
    int cap = 1;
    for (const char *c = s; *c; c++) cap += *c == ',';
    int32_t *v = malloc(sizeof(int32_t) * (size_t)cap);
    char *copy = strdup(s);
    if (!v || !copy) {
        free(v), free(copy);
        return fg_cli_error(FG_EXIT_OTHER, "%s: out of memory", what);
    }
    /* strsep, unlike strtok, keeps empty items, which are errors here */
    int rc = 0, k = 0;
    for (char *rest = copy, *item; rc == 0 && (item = strsep(&rest, ",")) != NULL; k++) {
        int x = 0;
        rc = fg_cli_parse_int(item, what, lo, hi, &x);
        v[k] = x;
    }
    free(copy);
    if (rc) {
        free(v);
        return rc;
    }
    *out = v, *n = k;
    return 0;
}

/* ---- kernel kinds ------------------------------------------------------------ */

const char *const fg_cli_kernel_names[FG_CLI_KERNEL_KINDS] = {
    "attention", "blockmask", "attention-sm90", "attention-bwd", "attention-bwd-sm90", "decode"};
const fg_kernel_kind fg_cli_kernel_kinds[FG_CLI_KERNEL_KINDS] = {
    FG_KERNEL_ATTENTION_FWD,      FG_KERNEL_BLOCK_MASK,         FG_KERNEL_ATTENTION_FWD_SM90,
    FG_KERNEL_ATTENTION_BWD,      FG_KERNEL_ATTENTION_BWD_SM90, FG_KERNEL_ATTENTION_DECODE};

const char *fg_cli_kernel_name(fg_kernel_kind kind) {
    for (int i = 0; i < FG_CLI_KERNEL_KINDS; i++)
        if (fg_cli_kernel_kinds[i] == kind) return fg_cli_kernel_names[i];
    return "?";
}

/* ---- options ----------------------------------------------------------------- */

const char fg_cli_mod_help[] =
    "  --mask FILE            mask_mod from a mod file (mods/*.c)\n"
    "  --score FILE           score_mod from a mod file (with --mask: combined)\n"
    "  --expr-mask 'EXPR'     mask_mod as a bool expression of b, h, q_idx, kv_idx\n"
    "  --expr-score 'EXPR'    score_mod as a float expression of score, b, h, q_idx, kv_idx\n"
    "  --param int:NAME=V | float:NAME=V | buffer-int:NAME | buffer-float:NAME\n"
    "                         declare a parameter the expressions use (repeatable)\n";
const char fg_cli_bind_help[] =
    "  --set NAME=VALUE       value of a scalar parameter (default: its declared one)\n"
    "  --buffer NAME=FILE     contents of a buffer parameter: numbers as text, or a\n"
    "                         raw little-endian .i32 / .f32 file\n";

void fg_cli_mod_args_init(fg_cli_mod_args *a) { memset(a, 0, sizeof *a); }

int fg_cli_has_mod(const fg_cli_mod_args *a) {
    return a->mask_file || a->score_file || a->mask_expr || a->score_expr;
}

/* "int:NAME=V", "float:NAME=V", "buffer-int:NAME", "buffer-float:NAME". */
static int parse_decl(fg_cli_mod_args *a, const char *arg) {
    static const struct {
        const char *prefix;
        fg_param_kind kind;
        fg_type type;
    } forms[] = {{"int:", FG_PARAM_SCALAR, FG_TYPE_INT},
                 {"float:", FG_PARAM_SCALAR, FG_TYPE_FLOAT},
                 {"buffer-int:", FG_PARAM_BUFFER, FG_TYPE_INT},
                 {"buffer-float:", FG_PARAM_BUFFER, FG_TYPE_FLOAT}};
    if (a->ndecls >= FG_CLI_MAX_ITEMS)
        return fg_cli_error(-1, "--param: at most %d parameters", FG_CLI_MAX_ITEMS);
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        size_t pl = strlen(forms[i].prefix);
        if (strncmp(arg, forms[i].prefix, pl) != 0) continue;
        const char *name = arg + pl, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        fg_param_decl *d = &a->decls[a->ndecls];
        memset(d, 0, sizeof *d);
        if (nl == 0 || nl >= sizeof a->decl_names[0])
            return fg_cli_error(-1, "--param %s: missing or too long a name", arg);
        if (forms[i].kind == FG_PARAM_BUFFER && eq)
            return fg_cli_error(-1, "--param %s: a buffer has no default value", arg);
        if (forms[i].kind == FG_PARAM_SCALAR) {
            if (!eq) return fg_cli_error(-1, "--param %s: give a default, e.g. %sNAME=0", arg,
                                         forms[i].prefix);
            double v = 0;
            if (fg_cli_parse_double(eq + 1, "--param", &v)) return -1;
            d->default_value = v;
        }
        memcpy(a->decl_names[a->ndecls], name, nl);
        a->decl_names[a->ndecls][nl] = 0;
        d->name = a->decl_names[a->ndecls];
        d->kind = forms[i].kind;
        d->type = forms[i].type;
        a->ndecls++;
        return 1;
    }
    return fg_cli_error(-1, "--param %s: expected int:NAME=V, float:NAME=V, buffer-int:NAME or "
                            "buffer-float:NAME", arg);
}

static int set_once(const char **slot, const char *opt, const char *arg) {
    if (*slot) return fg_cli_error(-1, "%s given twice", opt);
    *slot = arg;
    return 1;
}

static int push_raw(const char **list, int *n, const char *opt, const char *arg) {
    if (!strchr(arg, '=') || arg[0] == '=')
        return fg_cli_error(-1, "%s %s: expected NAME=VALUE", opt, arg);
    if (*n >= FG_CLI_MAX_ITEMS) return fg_cli_error(-1, "%s: at most %d", opt, FG_CLI_MAX_ITEMS);
    list[(*n)++] = arg;
    return 1;
}

int fg_cli_mod_option(fg_cli_mod_args *a, int opt, const char *arg) {
    if (!arg) arg = "";
    switch (opt) {
    case FG_CLI_OPT_MASK: return set_once(&a->mask_file, "--mask", arg);
    case FG_CLI_OPT_SCORE: return set_once(&a->score_file, "--score", arg);
    case FG_CLI_OPT_EXPR_MASK: return set_once(&a->mask_expr, "--expr-mask", arg);
    case FG_CLI_OPT_EXPR_SCORE: return set_once(&a->score_expr, "--expr-score", arg);
    case FG_CLI_OPT_PARAM: return parse_decl(a, arg);
    case FG_CLI_OPT_SET: return push_raw(a->sets, &a->nsets, "--set", arg);
    case FG_CLI_OPT_BUFFER: return push_raw(a->buffers, &a->nbuffers, "--buffer", arg);
    default: return 0;
    }
}

/* ---- loading ----------------------------------------------------------------- */

/* One side (mask or score) from a file or an expression; *out stays NULL
 * when that side was not given. */
static int load_side(fg_ctx *ctx, const fg_cli_mod_args *a, fg_mod_kind kind, fg_mod **out) {
    const char *file = kind == FG_MASK_MOD ? a->mask_file : a->score_file;
    const char *expr = kind == FG_MASK_MOD ? a->mask_expr : a->score_expr;
    const char *opt = kind == FG_MASK_MOD ? "mask" : "score";
    *out = NULL;
    if (file && expr)
        return fg_cli_error(FG_EXIT_USAGE, "give --%s or --expr-%s, not both", opt, opt);
    fg_status st = FG_OK;
    if (file) st = fg_mod_from_file(ctx, file, out);
    else if (expr) st = fg_mod_from_expr(ctx, kind, expr, a->decls, (size_t)a->ndecls, out);
    else return 0;
    if (st != FG_OK) return fg_cli_fail(ctx, st, NULL);
    /* Alone, a file keeps whatever it defines; beside the other side it
     * must supply the part its option names. */
    bool other = kind == FG_MASK_MOD ? (a->score_file || a->score_expr)
                                     : (a->mask_file || a->mask_expr);
    if (!other) return 0;
    if (file && kind == FG_MASK_MOD && !fg_mod_has_mask(*out)) {
        fg_mod_destroy(*out);
        *out = NULL;
        return fg_cli_error(FG_EXIT_BAD_MOD, "%s: --mask names a file without a mask_mod", file);
    }
    if (file && kind == FG_SCORE_MOD && !fg_mod_has_score(*out)) {
        fg_mod_destroy(*out);
        *out = NULL;
        return fg_cli_error(FG_EXIT_BAD_MOD, "%s: --score names a file without a score_mod", file);
    }
    return 0;
}

int fg_cli_load_mod(fg_ctx *ctx, const fg_cli_mod_args *a, fg_mod **out) {
    *out = NULL;
    if (!fg_cli_has_mod(a))
        return fg_cli_error(FG_EXIT_USAGE,
                            "no mod: give --mask FILE, --score FILE, --expr-mask or --expr-score");
    fg_mod *mask = NULL, *score = NULL;
    int rc = load_side(ctx, a, FG_MASK_MOD, &mask);
    if (rc == 0) rc = load_side(ctx, a, FG_SCORE_MOD, &score);
    if (rc != 0) {
        fg_mod_destroy(mask);
        fg_mod_destroy(score);
        return rc;
    }
    /* A lone file keeps everything it defines (--mask alibi.c keeps its
     * score_mod too); two sides are combined. */
    if (!mask || !score) {
        *out = mask ? mask : score;
        return 0;
    }
    fg_status st = fg_mod_combine(ctx, mask, score, out);
    fg_mod_destroy(mask);
    fg_mod_destroy(score);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "combining --mask and --score");
    return 0;
}

/* ---- numbers files ------------------------------------------------------------- */

static bool has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static int read_file(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return fg_cli_error(FG_EXIT_OTHER, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *bigger = cap > ((size_t)1 << 34) ? NULL : realloc(buf, cap * 2 + 1);
        if (!bigger) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        return fg_cli_error(FG_EXIT_OTHER, "%s: %s", path, buf ? "read error" : "out of memory");
    }
    buf[n] = 0;
    *text = buf;
    *len = n;
    return 0;
}

static int parse_numbers(const char *path, const char *text, fg_type type, void **data,
                         int64_t *count) {
    size_t cap = 256, n = 0;
    void *arr = malloc(cap * 4);
    const char *s = text;
    while (arr) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == ',') s++;
        if (!*s) break;
        char *end;
        errno = 0;
        if (n == cap) {
            void *bigger = realloc(arr, cap * 2 * 4);
            if (!bigger) break;
            arr = bigger;
            cap *= 2;
        }
        if (type == FG_TYPE_INT) {
            long long v = strtoll(s, &end, 10);
            if (end == s || errno || v < INT32_MIN || v > INT32_MAX) break;
            ((int32_t *)arr)[n++] = (int32_t)v;
        } else {
            float v = strtof(s, &end);
            if (end == s) break;
            ((float *)arr)[n++] = v;
        }
        s = end;
    }
    if (!arr || *s) {
        free(arr);
        if (!arr) return fg_cli_error(FG_EXIT_OTHER, "%s: out of memory", path);
        return fg_cli_error(FG_EXIT_USAGE, "%s: byte %ld: expected %s number, found '%.12s'", path,
                            (long)(s - text), type == FG_TYPE_INT ? "an int32" : "a", s);
    }
    *data = arr;
    *count = (int64_t)n;
    return 0;
}

int fg_cli_read_numbers(const char *path, fg_type type, void **data, int64_t *count) {
    *data = NULL;
    *count = 0;
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(path, &text, &len);
    if (rc) return rc;
    bool raw_i32 = has_suffix(path, ".i32"), raw_f32 = has_suffix(path, ".f32");
    if (raw_i32 || raw_f32) {
        if ((raw_i32 && type != FG_TYPE_INT) || (raw_f32 && type != FG_TYPE_FLOAT)) {
            free(text);
            return fg_cli_error(FG_EXIT_USAGE, "%s: the buffer holds %s, the file the other kind",
                                path, type == FG_TYPE_INT ? "ints" : "floats");
        }
        if (len % 4 != 0) {
            free(text);
            return fg_cli_error(FG_EXIT_USAGE, "%s: %zu bytes is not a whole number of 4-byte values",
                                path, len);
        }
        /* little-endian on every machine CUDA runs on; the copy drops the NUL */
        void *arr = malloc(len ? len : 4);
        if (!arr) {
            free(text);
            return fg_cli_error(FG_EXIT_OTHER, "%s: out of memory", path);
        }
        memcpy(arr, text, len);
        free(text);
        *data = arr;
        *count = (int64_t)(len / 4);
        return 0;
    }
    rc = parse_numbers(path, text, type, data, count);
    free(text);
    return rc;
}

/* ---- bindings ------------------------------------------------------------------- */

/* The declared parameter called name[0, n), or -1. */
static int find_param(const fg_mod *mod, const char *name, size_t n, fg_param_info *info) {
    size_t np = fg_mod_param_count(mod);
    for (size_t i = 0; i < np; i++) {
        if (fg_mod_param(mod, i, info) != FG_OK) continue;
        if (strlen(info->name) == n && strncmp(info->name, name, n) == 0) return (int)i;
    }
    return -1;
}

static int bind_slot(fg_cli_bindings *b, const char *name, size_t n, fg_binding **slot) {
    if (b->n >= FG_CLI_MAX_ITEMS) return fg_cli_error(FG_EXIT_USAGE, "too many bindings");
    if (n >= sizeof b->names[0]) return fg_cli_error(FG_EXIT_USAGE, "parameter name too long");
    memcpy(b->names[b->n], name, n);
    b->names[b->n][n] = 0;
    *slot = &b->binds[b->n];
    memset(*slot, 0, sizeof **slot);
    (*slot)->name = b->names[b->n];
    b->n++;
    return 0;
}

static int bind_set(const fg_mod *mod, const char *arg, fg_cli_bindings *b) {
    const char *eq = strchr(arg, '=');
    size_t n = (size_t)(eq - arg);
    fg_param_info info;
    if (find_param(mod, arg, n, &info) < 0)
        return fg_cli_error(FG_EXIT_USAGE, "--set %s: the mod has no parameter '%.*s'", arg, (int)n,
                            arg);
    if (info.kind != FG_PARAM_SCALAR)
        return fg_cli_error(FG_EXIT_USAGE, "--set %s: '%s' is a buffer (use --buffer NAME=FILE)",
                            arg, info.name);
    fg_binding *slot = NULL;
    int rc = bind_slot(b, arg, n, &slot);
    if (rc) return rc;
    if (info.type == FG_TYPE_INT) {
        int v = 0;
        if (fg_cli_parse_int(eq + 1, "--set", INT32_MIN, INT32_MAX, &v)) return FG_EXIT_USAGE;
        *slot = fg_bind_int(slot->name, v);
    } else {
        double v = 0;
        if (fg_cli_parse_double(eq + 1, "--set", &v)) return FG_EXIT_USAGE;
        *slot = fg_bind_float(slot->name, (float)v);
    }
    return 0;
}

static int bind_buffer(const fg_mod *mod, const char *arg, fg_cli_bindings *b) {
    const char *eq = strchr(arg, '=');
    size_t n = (size_t)(eq - arg);
    fg_param_info info;
    if (find_param(mod, arg, n, &info) < 0)
        return fg_cli_error(FG_EXIT_USAGE, "--buffer %s: the mod has no parameter '%.*s'", arg,
                            (int)n, arg);
    if (info.kind != FG_PARAM_BUFFER)
        return fg_cli_error(FG_EXIT_USAGE, "--buffer %s: '%s' is a scalar (use --set NAME=VALUE)",
                            arg, info.name);
    fg_binding *slot = NULL;
    int rc = bind_slot(b, arg, n, &slot);
    if (rc) return rc;
    void *data;
    int64_t count;
    rc = fg_cli_read_numbers(eq + 1, info.type, &data, &count);
    if (rc) {
        b->n--;
        return rc;
    }
    b->owned[b->n - 1] = data;
    *slot = info.type == FG_TYPE_INT ? fg_bind_int_buffer(slot->name, data, count)
                                     : fg_bind_float_buffer(slot->name, data, count);
    return 0;
}

int fg_cli_bind(fg_ctx *ctx, const fg_mod *mod, const fg_cli_mod_args *a, fg_cli_bindings *out) {
    (void)ctx;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < a->nsets; i++) {
        int rc = bind_set(mod, a->sets[i], out);
        if (rc) {
            fg_cli_bindings_free(out);
            return rc;
        }
    }
    for (int i = 0; i < a->nbuffers; i++) {
        int rc = bind_buffer(mod, a->buffers[i], out);
        if (rc) {
            fg_cli_bindings_free(out);
            return rc;
        }
    }
    return 0;
}

void fg_cli_bindings_free(fg_cli_bindings *b) {
    if (!b) return;
    for (size_t i = 0; i < FG_CLI_MAX_ITEMS; i++) free(b->owned[i]);
    memset(b, 0, sizeof *b);
}

/* ---- the backward pass -------------------------------------------------------- */

/* The library decides which buffers get gradients from the derivative of
 * score_mod (a read under a comparison or a cast to int has none); asking
 * the same derivation gives the tool exactly the set the backward accepts. */
fg_status fg_cli_grad_buffers(fg_ctx *ctx, const fg_mod *mod, const char **names, int max, int *n) {
    *n = 0;
    fgi_mod_grad g;
    FGI_TRY(fgi_mod_derive(ctx, mod, &g));
    fgi_grad_layout layout;
    fgi_grad_layout_compute(&g, &layout);
    fgi_mod_grad_free(&g);
    if (layout.n > max)
        return fgi_error(ctx, FG_ERR_NOT_SUPPORTED, "%d float buffers get gradients, more than the %d this tool takes",
                         layout.n, max);
    for (int k = 0; k < layout.n; k++) {
        fg_param_info info;
        FGI_TRY(fg_mod_param(mod, (size_t)layout.param[k], &info));
        names[(*n)++] = info.name;
    }
    return FG_OK;
}
