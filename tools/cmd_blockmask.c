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
 * The mod and its values come from the options shared by every subcommand
 * (cli.h: --mask / --expr-mask, --param, --set, --buffer).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cudrv.h"
#include "flexgen.h"

typedef struct options {
    fg_cli_mod_args mod;
    fg_block_mask_desc desc;
    int block;
    bool gpu, json;
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen blockmask --mask FILE --q-len N [--kv-len N] [--batch B --heads H]\n"
            "                         [--block N | --q-block N --kv-block N]\n"
            "                         [--set NAME=VALUE] [--buffer NAME=FILE] [--gpu] [--json]\n"
            "Build the block mask of a mask mod (on the CPU, or with --gpu on the device)\n"
            "and print its picture, counts and sparsity, or every array with --json.\n%s%s",
            fg_cli_mod_help, fg_cli_bind_help);
}

enum { OPT_Q_LEN = 0x2000, OPT_KV_LEN, OPT_BATCH, OPT_HEADS, OPT_BLOCK, OPT_Q_BLOCK, OPT_KV_BLOCK,
       OPT_GPU, OPT_JSON };

/* Options that take a positive int, by getopt value. */
static int *int_option(options *o, int opt) {
    switch (opt) {
    case OPT_Q_LEN: return &o->desc.q_len;
    case OPT_KV_LEN: return &o->desc.kv_len;
    case OPT_BATCH: return &o->desc.batch;
    case OPT_HEADS: return &o->desc.heads;
    case OPT_BLOCK: return &o->block;
    case OPT_Q_BLOCK: return &o->desc.q_block;
    case OPT_KV_BLOCK: return &o->desc.kv_block;
    }
    return NULL;
}

/* FG_EXIT_OK to go on, -1 after --help, else an exit code. */
static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        FG_CLI_MOD_LONGOPTS,
        FG_CLI_BIND_LONGOPTS,
        {"q-len", required_argument, 0, OPT_Q_LEN},
        {"kv-len", required_argument, 0, OPT_KV_LEN},
        {"batch", required_argument, 0, OPT_BATCH},
        {"heads", required_argument, 0, OPT_HEADS},
        {"block", required_argument, 0, OPT_BLOCK},
        {"q-block", required_argument, 0, OPT_Q_BLOCK},
        {"kv-block", required_argument, 0, OPT_KV_BLOCK},
        {"gpu", no_argument, 0, OPT_GPU},
        {"json", no_argument, 0, OPT_JSON},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    fg_cli_mod_args_init(&o->mod);
    o->desc.batch = o->desc.heads = 1;
    optind = 0; /* glibc: restart scanning, argv[0] is the command name */
    int c, li;
    while ((c = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        int *ip = int_option(o, c);
        if (c == 'h') {
            usage(stdout);
            return -1;
        } else if (c == OPT_GPU) o->gpu = true;
        else if (c == OPT_JSON) o->json = true;
        else if (ip) {
            if (fg_cli_parse_int(optarg, longopts[li].name, 1, 1 << 30, ip)) return FG_EXIT_USAGE;
        } else {
            int r = fg_cli_mod_option(&o->mod, c, optarg);
            if (r < 0) return FG_EXIT_USAGE;
            if (r == 0) {
                usage(stderr);
                return FG_EXIT_USAGE;
            }
        }
    }
    if (optind < argc) return fg_cli_error(FG_EXIT_USAGE, "blockmask: unexpected argument '%s'", argv[optind]);
    if (!fg_cli_has_mod(&o->mod) || o->desc.q_len <= 0)
        return fg_cli_error(FG_EXIT_USAGE, "blockmask: needs a mask (--mask FILE) and --q-len N");
    if (o->block && (o->desc.q_block || o->desc.kv_block))
        return fg_cli_error(FG_EXIT_USAGE, "blockmask: give --block or --q-block/--kv-block, not both");
    if (o->block) o->desc.q_block = o->desc.kv_block = o->block;
    if (o->desc.kv_len <= 0) o->desc.kv_len = o->desc.q_len;
    return FG_EXIT_OK;
}

/* Device copies of the buffer bindings (for --gpu). */
typedef struct device_binds {
    fg_binding b[FG_CLI_MAX_ITEMS];
    CUdeviceptr mem[FG_CLI_MAX_ITEMS];
    size_t n;
} device_binds;

static fg_status to_device(fg_ctx *ctx, const fg_cli_bindings *host, device_binds *dev) {
    for (size_t i = 0; i < host->n; i++) {
        dev->b[i] = host->binds[i];
        dev->n = i + 1;
        if (host->binds[i].kind != FG_PARAM_BUFFER || host->binds[i].value.buffer.length == 0) continue;
        size_t bytes = (size_t)host->binds[i].value.buffer.length * 4;
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&dev->mem[i], bytes), "cuMemAlloc (buffer)");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(dev->mem[i], host->binds[i].value.buffer.data, bytes),
                   "cuMemcpyHtoD (buffer)");
        dev->b[i].value.buffer.data = (const void *)(uintptr_t)dev->mem[i];
    }
    return FG_OK;
}

static void free_device(device_binds *dev) {
    for (size_t i = 0; i < dev->n; i++)
        if (dev->mem[i]) fgi_cu()->cuMemFree(dev->mem[i]);
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

static fg_status build(fg_ctx *ctx, const fg_mod *mod, const options *o, const fg_cli_bindings *bb,
                       fg_block_mask **m) {
    if (!o->gpu) return fg_block_mask_create(ctx, mod, &o->desc, bb->binds, bb->n, m);
    fg_status st = fgi_cuda_ready(ctx);
    if (st != FG_OK) return st;
    device_binds dev;
    memset(&dev, 0, sizeof dev);
    st = to_device(ctx, bb, &dev);
    if (st == FG_OK) st = fg_block_mask_create_gpu(ctx, mod, &o->desc, dev.b, dev.n, NULL, m);
    if (st == FG_OK) st = fg_block_mask_download(ctx, *m);
    free_device(&dev);
    return st;
}

int fg_cmd_blockmask(int argc, char **argv) {
    options o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc < 0 ? FG_EXIT_OK : rc;
    fg_ctx *ctx = NULL;
    if (fg_ctx_create(&ctx) != FG_OK) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    fg_mod *mod = NULL;
    fg_block_mask *m = NULL;
    fg_cli_bindings bb;
    memset(&bb, 0, sizeof bb);
    rc = fg_cli_load_mod(ctx, &o.mod, &mod);
    if (!rc) rc = fg_cli_bind(ctx, mod, &o.mod, &bb);
    if (!rc) {
        fg_status st = build(ctx, mod, &o, &bb, &m);
        if (st != FG_OK) rc = fg_cli_fail(ctx, st, "blockmask");
    }
    if (!rc) {
        if (o.json) print_json(stdout, m, fg_mod_name(mod), o.gpu);
        else print_text(stdout, m);
    }
    fg_block_mask_destroy(m);
    fg_cli_bindings_free(&bb);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}
