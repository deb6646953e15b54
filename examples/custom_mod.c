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
static fg_status make_bindings(const fg_mod *mod, const options *o, fg_binding *binds,
                               size_t *nbinds, void **store) {
    *nbinds = 0;
    if (fg_mod_param_count(mod) > MAX_PARAMS) {
        fprintf(stderr, "more than %d parameters\n", MAX_PARAMS);
        return FG_ERR_LIMIT;
    }
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
            fprintf(stderr, "\nbuffer '%s' needs --buffer %s=FILE\n", p.name, p.name);
            return FG_ERR_UNBOUND;
        }
        printf(" [%lld] from %s\n", (long long)st->length, st->value);
        void *data = malloc((size_t)st->length * 4);
        if (!data) {
            fprintf(stderr, "out of host memory\n");
            return FG_ERR_OUT_OF_MEMORY;
        }
        store[i] = data;
        for (int64_t j = 0; j < st->length; j++) {
            if (p.type == FG_TYPE_INT) ((int32_t *)data)[j] = (int32_t)st->data[j];
            else ((float *)data)[j] = (float)st->data[j];
        }
        binds[(*nbinds)++] = p.type == FG_TYPE_INT
                                 ? fg_bind_int_buffer(p.name, data, st->length)
                                 : fg_bind_float_buffer(p.name, data, st->length);
    }
    return FG_OK;
}

/* The block mask the attention call will use, drawn. */
static fg_status show_block_mask(fg_ctx *ctx, const fg_mod *mod, const options *o,
                                 const fg_binding *binds, size_t nbinds, fg_block_mask **mask,
                                 double *density) {
    fg_block_mask_desc desc = {.batch = o->batch, .heads = o->heads, .q_len = o->q_len,
                               .kv_len = o->kv_len};
    char *picture = NULL;
    double sparsity = 0;
    fg_status s = fg_block_mask_create(ctx, mod, &desc, binds, nbinds, mask);
    if (s == FG_OK) s = fg_block_mask_sparsity(*mask, &sparsity);
    if (s == FG_OK) s = fg_block_mask_picture(*mask, 16, 32, &picture);
    if (s == FG_OK)
        printf("block mask, Q_LEN=%d KV_LEN=%d, blocks of 128x128, %.1f%% empty:\n%s\n",
               o->q_len, o->kv_len, 100 * sparsity, picture);
    *density = 1.0 - sparsity;
    fg_free(picture);
    return s;
}

/* NVRTC needs no GPU: this proves the generated kernel compiles. */
static fg_status compile_kernel(fg_ctx *ctx, const fg_mod *mod, const options *o) {
    fg_kernel_config cfg = {.kind = FG_KERNEL_ATTENTION_FWD, .dtype = FG_BF16,
                            .head_dim = o->head_dim, .q_block = 128, .kv_block = 128};
    const char *arch = "?";
    void *image = NULL;
    size_t size = 0;
    double t0 = ex_now_ms();
    fg_status s = fg_compile(ctx, mod, &cfg, FG_EMIT_CUBIN, &image, &size);
    double ms = ex_now_ms() - t0;
    if (s == FG_OK) {
        fg_ctx_get_string(ctx, FG_OPT_ARCH, &arch);
        printf("forward kernel compiled by NVRTC for %s: %zu-byte cubin in %.0f ms\n", arch, size,
               ms);
    }
    fg_free(image);
    return s;
}

/* The GPU part: random inputs, one call, rows checked against the CPU. */
static int run_on_gpu(fg_ctx *ctx, const fg_mod *mod, const options *o, fg_block_mask *mask,
                      double density, const fg_binding *hbinds, size_t nbinds) {
    int rc = 1;
    const size_t nq = (size_t)o->batch * o->heads * o->q_len * o->head_dim;
    const size_t nkv = (size_t)o->batch * o->kv_heads * o->kv_len * o->head_dim;
    const size_t nlse = (size_t)o->batch * o->heads * o->q_len;
    uint16_t *hq = NULL, *hk = NULL, *hv = NULL, *hout = NULL;
    float *hlse = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0, dbuf[MAX_PARAMS] = {0};
    fg_binding dbinds[MAX_PARAMS];
    ex_timer timer = {0};
    uint64_t seed = 5;

    /* Buffers: the same values, in device memory. */
    for (size_t i = 0; i < nbinds; i++) {
        dbinds[i] = hbinds[i];
        if (hbinds[i].kind != FG_PARAM_BUFFER) continue;
        size_t bytes = (size_t)hbinds[i].value.buffer.length * 4;
        dbuf[i] = ex_alloc(bytes);
        EX_REQUIRE(dbuf[i] && ex_upload(dbuf[i], hbinds[i].value.buffer.data, bytes),
                   "cannot copy buffer '%s' to the device", hbinds[i].name);
        dbinds[i].value.buffer.data = ex_ptr(dbuf[i]);
    }

    hq = ex_random_bf16(nq, &seed);
    hk = ex_random_bf16(nkv, &seed);
    hv = ex_random_bf16(nkv, &seed);
    hout = malloc(nq * sizeof *hout);
    hlse = malloc(nlse * sizeof *hlse);
    EX_REQUIRE(hq && hk && hv && hout && hlse, "out of host memory");
    q = ex_alloc(nq * 2), k = ex_alloc(nkv * 2), v = ex_alloc(nkv * 2), out = ex_alloc(nq * 2);
    lse = ex_alloc(nlse * sizeof(float));
    EX_REQUIRE(q && k && v && out && lse, "out of device memory");
    EX_REQUIRE(ex_upload(q, hq, nq * 2) && ex_upload(k, hk, nkv * 2) && ex_upload(v, hv, nkv * 2) &&
                   ex_poison(out, nq * 2) && ex_poison(lse, nlse * 4),
               "device copy failed");
    if (mask) EX_TRY(ctx, fg_block_mask_upload(ctx, mask));

    fg_attention_args a = {0};
    a.batch = o->batch, a.heads_q = o->heads, a.heads_kv = o->kv_heads;
    a.q_len = o->q_len, a.kv_len = o->kv_len, a.head_dim = o->head_dim, a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.block_mask = mask, a.binds = dbinds, a.nbinds = nbinds;

    double t0 = ex_now_ms();
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    EX_REQUIRE(ex_sync(), "the kernel failed");
    printf("first call: %.1f ms (kernel fetch included)\n", ex_now_ms() - t0);
    EX_REQUIRE(ex_timer_create(&timer), "no CUDA events");
    ex_timer_begin(&timer);
    EX_TRY(ctx, fg_attention_forward(ctx, mod, &a));
    double ms = ex_timer_end(&timer);
    printf("warm call: %.3f ms, %.1f TFLOP/s (density %.3f)\n", ms, ex_tflops(&a, density, ms),
           density);

    EX_REQUIRE(ex_download(hout, out, nq * 2) && ex_download(hlse, lse, nlse * sizeof *hlse),
               "download failed");
    ex_checksum c = ex_checksum_bf16(hout, nq);
    fg_attention_args host = a;
    host.q = hq, host.k = hk, host.v = hv;
    int rows = o->q_len < CHECK_ROWS ? o->q_len : CHECK_ROWS;
    ex_error err, e;
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, hbinds, nbinds, hout, hlse, 0, rows, &err));
    EX_TRY(ctx, ex_compare_rows(ctx, mod, &host, hbinds, nbinds, hout, hlse, o->q_len - rows,
                                rows, &e));
    ex_error_merge(&err, &e);
    printf("checksum %.6f (sum|x| %.6f, non-finite %zu); vs CPU reference (first and last %d "
           "rows): out rel err %.2e, lse err %.2e\n", c.sum, c.abs_sum, c.nonfinite, rows,
           err.out_rel, err.lse_max);
    EX_REQUIRE(c.nonfinite == 0 && ex_error_ok(&err), "FAILED: outside tolerance");
    printf("OK\n");
    rc = 0;
done:
    ex_timer_destroy(&timer);
    for (size_t i = 0; i < nbinds; i++) ex_free(dbuf[i]);
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse);
    free(hq), free(hk), free(hv), free(hout), free(hlse);
    return rc;
}

int main(int argc, char **argv) {
    int rc = 1;
    options o;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_block_mask *mask = NULL;
    fg_binding binds[MAX_PARAMS];
    void *store[MAX_PARAMS] = {0};
    size_t nbinds = 0;
    double density = 1.0;

    if (!parse_args(argc, argv, &o)) {
        usage();
        rc = 2;
        goto done;
    }
    EX_REQUIRE(o.heads % o.kv_heads == 0, "--heads must be a multiple of --kv-heads");
    EX_TRY(ctx, fg_ctx_create(&ctx));
    if (o.file)
        EX_TRY(ctx, fg_mod_from_file(ctx, o.file, &mod));
    else
        EX_TRY(ctx, mod_from_exprs(ctx, &o, &mod));
    printf("mod '%s' (%s), hash %016llx; canonical form:\n%s\n", fg_mod_name(mod),
           fg_mod_has_mask(mod) && fg_mod_has_score(mod) ? "mask_mod and score_mod"
           : fg_mod_has_mask(mod)                        ? "mask_mod"
                                                         : "score_mod",
           (unsigned long long)fg_mod_hash(mod), fg_mod_canonical(mod));
    if (make_bindings(mod, &o, binds, &nbinds, store) != FG_OK) goto done;
    if (fg_mod_has_mask(mod))
        EX_TRY(ctx, show_block_mask(ctx, mod, &o, binds, nbinds, &mask, &density));
    if (o.compile) EX_TRY(ctx, compile_kernel(ctx, mod, &o));

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s; B=%d Hq=%d Hkv=%d Q_LEN=%d KV_LEN=%d D=%d bf16\n", ex_cu.device_name,
           o.batch, o.heads, o.kv_heads, o.q_len, o.kv_len, o.head_dim);
    rc = run_on_gpu(ctx, mod, &o, mask, density, binds, nbinds);

done:
    for (int i = 0; i < MAX_PARAMS; i++) free(store[i]);
    for (int i = 0; i < o.nset; i++) free(o.set[i].data);
    fg_block_mask_destroy(mask);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
