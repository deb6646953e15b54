/*
 * cmd_blockmask.c -- `flexgen blockmask`: build a block mask from a mask mod
 * and show it.
 *
 *   flexgen blockmask --mask FILE --q-len N [--kv-len N] [--batch B --heads H]
 *                     [--block N | --q-block N --kv-block N]
 *                     [--set NAME=VALUE] [--buffer NAME=FILE] [--gpu] [--json]
 *
 * Without --json it prints the picture (one character per block, downsampled
 * for large masks), the per-q-block counts and the totals; with --json every
 * array as nested lists shaped like the array, and the counts. --gpu builds
 * with the generated kernel (buffers are copied to the device first) and
 * downloads the result, so the output is comparable with the CPU build.
 *
 * Buffer files hold numbers as text (separated by spaces, commas or new
 * lines); they are read as the buffer's element type.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudrv.h"
#include "flexgen.h"

int fg_cmd_blockmask(int argc, char **argv);

#define MAX_BINDS 32

typedef struct options {
    const char *mask;
    fg_block_mask_desc desc;
    int block;
    bool gpu, json;
    const char *sets[MAX_BINDS];
    int nsets;
    const char *buffers[MAX_BINDS];
    int nbuffers;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen blockmask --mask FILE --q-len N [--kv-len N] [--batch B --heads H]\n"
            "                         [--block N | --q-block N --kv-block N]\n"
            "                         [--set NAME=VALUE] [--buffer NAME=FILE] [--gpu] [--json]\n");
}

static bool parse_int(const char *s, int lo, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > 1 << 30) return false;
    *out = (int)v;
    return true;
}

/* Options that take an int value, by name. */
static int *int_option(options *o, const char *name) {
    if (!strcmp(name, "--q-len")) return &o->desc.q_len;
    if (!strcmp(name, "--kv-len")) return &o->desc.kv_len;
    if (!strcmp(name, "--batch")) return &o->desc.batch;
    if (!strcmp(name, "--heads")) return &o->desc.heads;
    if (!strcmp(name, "--block")) return &o->block;
    if (!strcmp(name, "--q-block")) return &o->desc.q_block;
    if (!strcmp(name, "--kv-block")) return &o->desc.kv_block;
    return NULL;
}

static int parse_args(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->desc.batch = o->desc.heads = 1;
    o->desc.kv_len = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        int *ip = int_option(o, a);
        if (!strcmp(a, "--gpu")) o->gpu = true;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!val) {
            fprintf(stderr, "flexgen blockmask: '%s' needs a value (or is unknown)\n", a);
            return 2;
        } else if (!strcmp(a, "--mask")) o->mask = val, i++;
        else if (!strcmp(a, "--set") && o->nsets < MAX_BINDS) o->sets[o->nsets++] = val, i++;
        else if (!strcmp(a, "--buffer") && o->nbuffers < MAX_BINDS) o->buffers[o->nbuffers++] = val, i++;
        else if (ip) {
            if (!parse_int(val, 1, ip)) {
                fprintf(stderr, "flexgen blockmask: %s: '%s' is not a positive integer\n", a, val);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "flexgen blockmask: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!o->mask || o->desc.q_len <= 0) {
        usage(stderr);
        return 2;
    }
    if (o->block && (o->desc.q_block || o->desc.kv_block)) {
        fprintf(stderr, "flexgen blockmask: give --block or --q-block/--kv-block, not both\n");
        return 2;
    }
    if (o->block) o->desc.q_block = o->desc.kv_block = o->block;
    if (o->desc.kv_len < 0) o->desc.kv_len = o->desc.q_len;
    return -1; /* go on */
}

/* ---- bindings from --set and --buffer ----------------------------------- */

typedef struct binds {
    fg_binding b[MAX_BINDS];
    void *host[MAX_BINDS];
    CUdeviceptr dev[MAX_BINDS];
    size_t n;
} binds;

static bool find_param(const fg_mod *mod, const char *name, size_t len, fg_param_info *pi) {
    for (size_t i = 0; i < fg_mod_param_count(mod); i++)
        if (fg_mod_param(mod, i, pi) == FG_OK && strlen(pi->name) == len && !strncmp(pi->name, name, len))
            return true;
    return false;
}

static bool bind_set(const fg_mod *mod, const char *arg, binds *bd) {
    const char *eq = strchr(arg, '=');
    fg_param_info pi;
    if (!eq || !find_param(mod, arg, (size_t)(eq - arg), &pi) || pi.kind != FG_PARAM_SCALAR) {
        fprintf(stderr, "flexgen blockmask: --set %s: not NAME=VALUE for a scalar parameter of the mod\n", arg);
        return false;
    }
    char *end;
    if (pi.type == FG_TYPE_INT) {
        long v = strtol(eq + 1, &end, 0);
        if (end == eq + 1 || *end || v < INT32_MIN || v > INT32_MAX) goto bad;
        bd->b[bd->n++] = fg_bind_int(pi.name, (int32_t)v);
    } else {
        float v = strtof(eq + 1, &end);
        if (end == eq + 1 || *end) goto bad;
        bd->b[bd->n++] = fg_bind_float(pi.name, v);
    }
    return true;
bad:
    fprintf(stderr, "flexgen blockmask: --set %s: bad %s value\n", arg, pi.type == FG_TYPE_INT ? "int" : "float");
    return false;
}

/* Read the numbers of a text file as int32 or float. */
static void *read_numbers(const char *path, fg_type type, int64_t *count) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t cap = 1024, n = 0;
    unsigned char *v = malloc(cap * 4);
    char tok[128];
    int c, len = 0;
    bool ok = v != NULL;
    while (ok) {
        c = fgetc(f);
        bool sep = c == EOF || c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r';
        if (!sep) {
            if (len < (int)sizeof tok - 1) tok[len++] = (char)c;
            else ok = false;
            continue;
        }
        if (len > 0) {
            tok[len] = 0;
            len = 0;
            char *end;
            if (n == cap) {
                unsigned char *nv = realloc(v, cap * 2 * 4);
                if (!nv) { ok = false; break; }
                v = nv;
                cap *= 2;
            }
            if (type == FG_TYPE_INT) {
                long x = strtol(tok, &end, 0);
                int32_t y = (int32_t)x;
                if (*end || x < INT32_MIN || x > INT32_MAX) ok = false;
                memcpy(v + n * 4, &y, 4);
            } else {
                float y = strtof(tok, &end);
                if (*end) ok = false;
                memcpy(v + n * 4, &y, 4);
            }
            n++;
        }
        if (c == EOF) break;
    }
    fclose(f);
    if (!ok) {
        free(v);
        return NULL;
    }
    *count = (int64_t)n;
    return v;
}

static bool bind_buffer(const fg_mod *mod, const char *arg, binds *bd) {
    const char *eq = strchr(arg, '=');
    fg_param_info pi;
    if (!eq || !find_param(mod, arg, (size_t)(eq - arg), &pi) || pi.kind != FG_PARAM_BUFFER) {
        fprintf(stderr, "flexgen blockmask: --buffer %s: not NAME=FILE for a buffer parameter of the mod\n", arg);
        return false;
    }
    int64_t n = 0;
    void *data = read_numbers(eq + 1, pi.type, &n);
    if (!data) {
        fprintf(stderr, "flexgen blockmask: --buffer %s: cannot read the numbers in '%s'\n", arg, eq + 1);
        return false;
    }
    bd->host[bd->n] = data;
    bd->b[bd->n++] = pi.type == FG_TYPE_INT ? fg_bind_int_buffer(pi.name, data, n)
                                            : fg_bind_float_buffer(pi.name, data, n);
    return true;
}

/* Point the buffer bindings at device copies. */
static fg_status to_device(fg_ctx *ctx, binds *bd) {
    for (size_t i = 0; i < bd->n; i++) {
        if (bd->b[i].kind != FG_PARAM_BUFFER || bd->b[i].value.buffer.length == 0) continue;
        size_t bytes = (size_t)bd->b[i].value.buffer.length * 4;
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&bd->dev[i], bytes), "cuMemAlloc (buffer)");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(bd->dev[i], bd->host[i], bytes), "cuMemcpyHtoD (buffer)");
        bd->b[i].value.buffer.data = (const void *)(uintptr_t)bd->dev[i];
    }
    return FG_OK;
}

static void free_binds(binds *bd) {
    for (size_t i = 0; i < bd->n; i++) {
        free(bd->host[i]);
        if (bd->dev[i]) fgi_cu()->cuMemFree(bd->dev[i]);
    }
}

/* ---- output ------------------------------------------------------------------ */

static const char *const array_names[8] = {"kv_num_blocks", "kv_indices", "full_kv_num_blocks",
                                            "full_kv_indices", "q_num_blocks", "q_indices",
                                            "full_q_num_blocks", "full_q_indices"};

/* Nested JSON lists over dims (the last dim dropped when it is 1 for the
 * 3-D count arrays). */
static void json_array(FILE *f, const int32_t *a, const int64_t dims[4], int ndims) {
    /* size[d]: elements under one list of depth d */
    int64_t size[5];
    size[ndims] = 1;
    for (int d = ndims - 1; d >= 0; d--) size[d] = size[d + 1] * dims[d];
    for (int64_t i = 0; i < size[0]; i++) {
        for (int d = 0; d < ndims; d++)
            if (i % size[d] == 0) fputc('[', f);
        fprintf(f, "%d", a[i]);
        for (int d = ndims - 1; d >= 0; d--)
            if ((i + 1) % size[d] == 0) fputc(']', f);
        if (i + 1 < size[0]) fputs(", ", f);
    }
}

typedef struct totals {
    int64_t partial, full, tiles;
} totals;

static totals count(const fg_block_mask *m) {
    const int32_t *num, *fnum;
    int64_t dims[4];
    fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &num, NULL, dims);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
    totals t = {0, 0, 0};
    int64_t rows = dims[0] * dims[1] * dims[2];
    fg_block_mask_array_get(m, FG_BM_KV_INDICES, NULL, NULL, dims);
    t.tiles = rows * dims[3];
    for (int64_t r = 0; r < rows; r++) {
        t.partial += num[r];
        t.full += fnum[r];
    }
    return t;
}

static void print_json(FILE *f, const fg_block_mask *m, const char *mod_name, bool gpu) {
    fg_block_mask_desc d;
    fg_block_mask_get_desc(m, &d);
    double sp = 0;
    fg_block_mask_sparsity(m, &sp);
    totals t = count(m);
    fprintf(f, "{\"mod\": \"%s\", \"builder\": \"%s\", \"shape\": [%d, %d, %d, %d], \"block\": [%d, %d],\n",
            mod_name, gpu ? "gpu" : "cpu", d.batch, d.heads, d.q_len, d.kv_len, d.q_block, d.kv_block);
    fprintf(f, " \"counts\": {\"tiles\": %lld, \"full\": %lld, \"partial\": %lld, \"empty\": %lld},\n",
            (long long)t.tiles, (long long)t.full, (long long)t.partial,
            (long long)(t.tiles - t.full - t.partial));
    fprintf(f, " \"sparsity\": %.6f", sp);
    for (int i = 0; i < 8; i++) {
        const int32_t *a;
        int64_t dims[4];
        fg_block_mask_array_get(m, (fg_block_mask_array)(i + 1), &a, NULL, dims);
        fprintf(f, ",\n \"%s\": ", array_names[i]);
        json_array(f, a, dims, i % 2 ? 4 : 3);
    }
    fprintf(f, "}\n");
}

#define SHOW_HEADS 4

static void print_text(FILE *f, const fg_block_mask *m) {
    char *pic = NULL;
    if (fg_block_mask_picture(m, 0, 0, &pic) == FG_OK) fputs(pic, f);
    fg_free(pic);
    const int32_t *num, *fnum;
    int64_t dims[4];
    fg_block_mask_array_get(m, FG_BM_KV_NUM_BLOCKS, &num, NULL, dims);
    fg_block_mask_array_get(m, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
    int64_t bh = dims[0] * dims[1];
    for (int64_t i = 0; i < bh && i < SHOW_HEADS; i++) {
        fprintf(f, "(%lld, %lld) partial / full kv blocks per q block:", (long long)(i / dims[1]),
                (long long)(i % dims[1]));
        for (int64_t q = 0; q < dims[2]; q++) {
            if (q == 64) {
                fprintf(f, " ...");
                break;
            }
            fprintf(f, " %d/%d", num[i * dims[2] + q], fnum[i * dims[2] + q]);
        }
        fputc('\n', f);
    }
    totals t = count(m);
    double sp = 0;
    fg_block_mask_sparsity(m, &sp);
    fprintf(f, "tiles %lld: full %lld, partial %lld, empty %lld; sparsity %.2f%%\n", (long long)t.tiles,
            (long long)t.full, (long long)t.partial, (long long)(t.tiles - t.full - t.partial), 100 * sp);
}

/* ---- the command ---------------------------------------------------------------- */

static fg_status build(fg_ctx *ctx, const fg_mod *mod, const options *o, binds *bd, fg_block_mask **m) {
    if (!o->gpu) return fg_block_mask_create(ctx, mod, &o->desc, bd->b, bd->n, m);
    fg_status st = fgi_cuda_ready(ctx);
    if (st != FG_OK) return st;
    if ((st = to_device(ctx, bd)) != FG_OK) return st;
    if ((st = fg_block_mask_create_gpu(ctx, mod, &o->desc, bd->b, bd->n, NULL, m)) != FG_OK) return st;
    return fg_block_mask_download(ctx, *m);
}

int fg_cmd_blockmask(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) {
        fprintf(stderr, "flexgen blockmask: out of memory\n");
        return 1;
    }
    fg_mod *mod = NULL;
    fg_block_mask *m = NULL;
    binds bd;
    memset(&bd, 0, sizeof bd);
    rc = 1;
    if (fg_mod_from_file(ctx, o.mask, &mod) != FG_OK) {
        fprintf(stderr, "%s\n", fg_error_diagnostic(ctx));
        goto done;
    }
    for (int i = 0; i < o.nsets; i++)
        if (!bind_set(mod, o.sets[i], &bd)) goto done;
    for (int i = 0; i < o.nbuffers; i++)
        if (!bind_buffer(mod, o.buffers[i], &bd)) goto done;
    fg_status st = build(ctx, mod, &o, &bd, &m);
    if (st != FG_OK) {
        fprintf(stderr, "flexgen blockmask: %s: %s\n", fg_status_string(st), fg_error_diagnostic(ctx));
        goto done;
    }
    if (o.json) print_json(stdout, m, fg_mod_name(mod), o.gpu);
    else print_text(stdout, m);
    rc = 0;
done:
    fg_block_mask_destroy(m);
    free_binds(&bd);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
