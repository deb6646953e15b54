/*
 * cmd_bench.c -- `flexgen bench`: speed, first-call costs and accuracy of
 * the forward kernel for each mod (and with --backward the backward's
 * speed), for users without Python.
 *
 * It measures what bench/compare_torch.py measures on the flexgen side, the
 * same way, so the two agree where they overlap:
 *
 *   forward        median of per-launch CUDA-event timings after warm-up, on
 *                  random normal inputs (never zeros, which hide unwritten
 *                  outputs and run faster than real data);
 *   TFLOP/s        4 * B * H * S * S * D * density, FlexAttention's count,
 *                  density = 1 - block sparsity of the mod's block mask;
 *   backward       with --backward: the median of event-timed backward
 *                  passes on the forward's out and lse and a random dout,
 *                  writing dq, dk, dv and the gradient of every float buffer
 *                  score_mod's value depends on; TFLOP/s counted as 2.5
 *                  times the forward's FLOPs (five matmuls to the forward's
 *                  two, FlashAttention's convention); --deterministic times
 *                  that mode;
 *   block mask     the GPU builder's first build (its kernel compiled with an
 *                  empty cache) and the median of in-place rebuilds, which is
 *                  what a training loop pays per batch;
 *   first call     the attention kernel from an empty disk cache (NVRTC +
 *                  load + one run), again after dropping the memory cache
 *                  (disk load + one run), and a memory hit (fg_kernel_get on
 *                  a loaded kernel);
 *   accuracy       on (1, 2, min(S, 1024), D), fresh inputs: the GPU output
 *                  against the library's float64 CPU reference, as the
 *                  relative Frobenius error of out, the largest LSE error,
 *                  and the count of non-finite outputs.
 *
 * Each case gets its own empty cache folder, so "cold" means cold. The
 * gallery runs by default with the same parameter values as
 * bench/torch_mods.py and buffers generated here (document ids, offsets,
 * slopes ...); `--mask FILE [--score FILE]` (repeatable) runs your own mods,
 * with `--set NAME=VALUE` and `--buffer NAME=FILE` (numbers as text).
 *
 * With --decode it measures instead what bench/compare_decode.py measures
 * on the flexgen side: decode steps, B sequences of KV keys with Q new
 * queries each at their ends (--shapes B:KV:Q,..., GQA --heads 32 over
 * --kv-heads 8 by default), for each mod (causal, sliding_window, alibi
 * and softcap by default), shape and K/V layout (--pages: 0 contiguous,
 * else a paged cache of that page size): the GPU time of fg_kernel_launch
 * on the kernel fetched once, the TB/s of K and V the step must read, the
 * host's time per launch call, and the accuracy of a small step of the same
 * kind (decode.c says how).
 *
 * --approx-math (or FLEXGEN_APPROX_MATH=1) runs every kernel with
 * approximate math in score_mod (FG_OPT_APPROX_MATH); the accuracy check
 * then measures what that costs against the float64 reference.
 *
 * The tool links the static library, so the timed loop uses the library's
 * own driver table (cudrv.h) for device memory and events: no CUDA runtime.
 *
 * This file is the command: its options and the loop over the cases. The
 * other files of tools/bench/ each do one job of it (bench.h lists them).
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen bench [--mask FILE [--score FILE]]... [options]\n"
            "\n"
            "Forward speed, block-mask build time, first-call costs and accuracy of\n"
            "flexgen's kernels for each mod (the gallery in mods/ by default), and with\n"
            "--backward the backward's speed.\n"
            "\n"
            "  --mask FILE          a mod file (repeat for several cases)\n"
            "  --score FILE         a score_mod file for the preceding --mask (or alone)\n"
            "  --mods A,B,...       gallery mods to run (default: all)\n"
            "  --gallery DIR        the gallery folder (default: $FLEXGEN_SOURCE_ROOT/mods or ./mods)\n"
            "  --batch N --heads N --seq N --head-dim N   shape (default 4 16 8192 128)\n"
            "  --dtype bf16|fp16    input dtype (default bf16)\n"
            "  --set NAME=VALUE     a scalar parameter for the custom mods\n"
            "  --buffer NAME=FILE   a buffer parameter for the custom mods (numbers as text)\n"
            "  --iters N            timed launches (default 30)   --warmup N (default 5)\n"
            "  --check-seq N        sequence length of the accuracy check (default min(S,1024))\n"
            "  --no-check           skip the accuracy check against the CPU reference\n"
            "  --backward           also time the backward pass (dq, dk, dv and the gradient of\n"
            "                       each float buffer score_mod reads; TFLOP/s counted as 2.5x\n"
            "                       the forward's FLOPs); its accuracy: flexgen check --backward\n"
            "  --deterministic      time the backward's deterministic mode\n"
            "  --approx-math        approximate math in score_mod and its derivative\n"
            "                       (FG_OPT_APPROX_MATH: tanh.approx, ex2 / lg2 / rsqrt.approx,\n"
            "                       div.full; bounds in include/flexgen.h)\n"
            "  --json FILE          also write the results as JSON ('-' for stdout)\n"
            "  -h, --help           this text\n"
            "\n"
            "Decoding (--decode): for each mod (default causal,sliding_window,alibi,softcap),\n"
            "shape and K/V layout, the median GPU time of fg_kernel_launch on the kernel\n"
            "fetched once, the TB/s of K/V the step must read, the host's time per launch\n"
            "call, and the accuracy of a small step of the same kind.\n"
            "  --decode             decode steps instead of the forward\n"
            "  --shapes B:KV:Q,...  sequences, keys each, new queries each (default\n"
            "                       8:32768:1,32:8192:1,8:32768:4,1:131072:1)\n"
            "  --heads N --kv-heads N --head-dim N   query and K/V heads, head dim (default\n"
            "                       32 8 128)\n"
            "  --pages LIST         K/V layouts: 0 contiguous, else a paged cache of that page\n"
            "                       size, a power of two in [16, 256] (default 0,16,64)\n"
            "  --check-seq N        the accuracy check's KV length (default min(KV, 4096); its\n"
            "                       batch is min(B, 2))\n"
            "\n"
            "exit status: 0 success, 1 usage, 2 bad mod, 3 compile error, 4 no CUDA device,\n"
            "6 another failure (the table still shows the cases that ran)\n");
}

static const char *gallery_dir(const char *opt) {
    static char buf[4096];
    if (opt) return opt;
    const char *root = getenv("FLEXGEN_SOURCE_ROOT");
    if (root && *root) {
        snprintf(buf, sizeof buf, "%s/mods", root);
        return buf;
    }
    return "mods";
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 4;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s.c", dir, name);
    return p;
}

static int add_gallery(bench_opts *o, const char *list, const char *dir, char **owned, int *nowned) {
    char *copy = strdup(list);
    if (!copy) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    int rc = 0;
    for (char *tok = strtok(copy, ","); tok && rc == 0; tok = strtok(NULL, ",")) {
        size_t i = 0;
        while (i < bench_gallery_count && strcmp(bench_gallery[i].name, tok) != 0) i++;
        if (i == bench_gallery_count) {
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: unknown gallery mod '%s'", tok);
        } else if (o->ncases == BENCH_MAX_CASES) {
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", BENCH_MAX_CASES);
        } else {
            bench_case *c = &o->cases[o->ncases++];
            memset(c, 0, sizeof *c);
            snprintf(c->name, sizeof c->name, "%s", bench_gallery[i].name);
            c->mask_file = owned[(*nowned)++] = join_path(dir, bench_gallery[i].name);
            c->setup = bench_gallery[i].setup;
            if (!c->mask_file) rc = fg_cli_error(FG_EXIT_OTHER, "out of memory");
        }
    }
    free(copy);
    return rc;
}

static void case_name_from_files(bench_case *c) {
    const char *f = c->mask_file ? c->mask_file : c->score_file;
    const char *base = strrchr(f, '/');
    base = base ? base + 1 : f;
    size_t n = strcspn(base, ".");
    snprintf(c->name, sizeof c->name, "%.*s", (int)n, base);
    if (c->mask_file && c->score_file) {
        const char *sb = strrchr(c->score_file, '/');
        sb = sb ? sb + 1 : c->score_file;
        size_t m = strcspn(sb, ".");
        size_t used = strlen(c->name);
        snprintf(c->name + used, sizeof c->name - used, "+%.*s", (int)m, sb);
    }
}

/* The gallery mods of --decode (bench/compare_decode.py's). */
static const char decode_mods[] = "causal,sliding_window,alibi,softcap";

/* --shapes B:KV:Q,... */
static int parse_shapes(const char *arg, bench_opts *o) {
    char *copy = strdup(arg);
    if (!copy) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    int rc = 0;
    o->nshapes = 0;
    for (char *rest = copy, *item; rc == 0 && (item = strsep(&rest, ",")) != NULL;) {
        bench_decode_shape sh;
        char tail;
        if (o->nshapes == BENCH_MAX_SHAPES)
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: --shapes: at most %d shapes", BENCH_MAX_SHAPES);
        else if (sscanf(item, "%d:%d:%d%c", &sh.batch, &sh.kv_len, &sh.q_len, &tail) != 3 || sh.batch < 1 ||
                 sh.batch > 65535 || sh.kv_len < 1 || sh.kv_len > (1 << 30) || sh.q_len < 1 || sh.q_len > 1024)
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: --shapes: '%s' is not B:KV:Q (B in [1, 65535], KV in "
                                             "[1, 2^30], Q in [1, 1024])", item);
        else
            o->shapes[o->nshapes++] = sh;
    }
    free(copy);
    return rc;
}

/* --pages LIST: 0 (contiguous) or page sizes, powers of two in [16, 256]. */
static int parse_pages(const char *arg, bench_opts *o) {
    int32_t *v = NULL;
    int n = 0, rc = fg_cli_parse_int_list(arg, "--pages", 0, 256, &v, &n);
    for (int i = 0; rc == 0 && i < n; i++)
        if (v[i] != 0 && (v[i] < 16 || (v[i] & (v[i] - 1)) != 0))
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: --pages: %d is neither 0 (contiguous) nor a power of two "
                                             "in [16, 256]", (int)v[i]);
    if (rc == 0 && n > BENCH_MAX_PAGES)
        rc = fg_cli_error(FG_EXIT_USAGE, "bench: --pages: at most %d layouts", BENCH_MAX_PAGES);
    for (int i = 0; rc == 0 && i < n; i++) o->pages[i] = v[i];
    if (rc == 0) o->npages = n;
    free(v);
    return rc;
}

/* Which options the command line had, as far as --decode cares. */
enum {
    GIVEN_FORWARD_SHAPE = 1, /* --batch, --seq                    */
    GIVEN_HEADS = 2,         /* --heads                           */
    GIVEN_DECODE_ONLY = 4    /* --shapes, --pages, --kv-heads     */
};

/* What --decode takes and what it does not, and its defaults. */
static int decode_options(bench_opts *o, unsigned given) {
    if (!o->decode) {
        if (given & GIVEN_DECODE_ONLY)
            return fg_cli_error(FG_EXIT_USAGE, "bench: --shapes, --pages and --kv-heads go with --decode");
        return 0;
    }
    if (given & GIVEN_FORWARD_SHAPE)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --decode takes its shapes from --shapes B:KV:Q, not --batch "
                                           "and --seq");
    if (o->backward) return fg_cli_error(FG_EXIT_USAGE, "bench: --decode times the forward only (no --backward)");
    if (!(given & GIVEN_HEADS)) o->heads = 32;
    if (o->kv_heads == 0) o->kv_heads = 8;
    if (o->heads % o->kv_heads != 0)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --heads %d is not a multiple of --kv-heads %d", o->heads,
                            o->kv_heads);
    if (o->nshapes == 0) parse_shapes("8:32768:1,32:8192:1,8:32768:4,1:131072:1", o);
    if (o->npages == 0) o->pages[0] = 0, o->pages[1] = 16, o->pages[2] = 64, o->npages = 3;
    return 0;
}

/* 0 ok, -1 help printed, else an exit code (message printed). */
static int parse_opts(int argc, char **argv, bench_opts *o, char **owned, int *nowned) {
    enum { O_MASK = 256, O_SCORE, O_MODS, O_GALLERY, O_BATCH, O_HEADS, O_SEQ, O_HEAD_DIM, O_DTYPE,
           O_SET, O_BUFFER, O_ITERS, O_WARMUP, O_CHECK_SEQ, O_NO_CHECK, O_JSON, O_BACKWARD,
           O_DETERMINISTIC, O_DECODE, O_SHAPES, O_PAGES, O_KV_HEADS, O_APPROX_MATH };
    static const struct option longopts[] = {
        {"mask", required_argument, 0, O_MASK},       {"score", required_argument, 0, O_SCORE},
        {"mods", required_argument, 0, O_MODS},       {"gallery", required_argument, 0, O_GALLERY},
        {"batch", required_argument, 0, O_BATCH},     {"heads", required_argument, 0, O_HEADS},
        {"seq", required_argument, 0, O_SEQ},         {"q-len", required_argument, 0, O_SEQ},
        {"head-dim", required_argument, 0, O_HEAD_DIM}, {"dtype", required_argument, 0, O_DTYPE},
        {"set", required_argument, 0, O_SET},         {"buffer", required_argument, 0, O_BUFFER},
        {"iters", required_argument, 0, O_ITERS},     {"warmup", required_argument, 0, O_WARMUP},
        {"check-seq", required_argument, 0, O_CHECK_SEQ}, {"no-check", no_argument, 0, O_NO_CHECK},
        {"json", required_argument, 0, O_JSON},       {"help", no_argument, 0, 'h'},
        {"backward", no_argument, 0, O_BACKWARD},     {"deterministic", no_argument, 0, O_DETERMINISTIC},
        {"decode", no_argument, 0, O_DECODE},         {"shapes", required_argument, 0, O_SHAPES},
        {"pages", required_argument, 0, O_PAGES},     {"kv-heads", required_argument, 0, O_KV_HEADS},
        {"approx-math", no_argument, 0, O_APPROX_MATH},
        {0, 0, 0, 0}};
    const char *mods = NULL, *dir = NULL;
    bool last_was_mask = false;
    unsigned given = 0; /* GIVEN_* */
    optind = 0; /* glibc: restart scanning, argv[0] is the command name */
    opterr = 1;
    for (;;) {
        int li = -1;
        int c = getopt_long(argc, argv, "h", longopts, &li);
        if (c == -1) break;
        bool ok = true;
        switch (c) {
        case O_MASK:
            if (o->ncases == BENCH_MAX_CASES)
                return fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", BENCH_MAX_CASES);
            memset(&o->cases[o->ncases], 0, sizeof o->cases[0]);
            o->cases[o->ncases++].mask_file = optarg;
            last_was_mask = true;
            continue;
        case O_SCORE:
            if (last_was_mask) {
                o->cases[o->ncases - 1].score_file = optarg;
            } else {
                if (o->ncases == BENCH_MAX_CASES)
                    return fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", BENCH_MAX_CASES);
                memset(&o->cases[o->ncases], 0, sizeof o->cases[0]);
                o->cases[o->ncases++].score_file = optarg;
            }
            last_was_mask = false;
            continue;
        case O_MODS: mods = optarg; break;
        case O_GALLERY: dir = optarg; break;
        case O_BATCH:
            ok = !fg_cli_parse_int(optarg, "--batch", 1, 65535, &o->batch), given |= GIVEN_FORWARD_SHAPE;
            break;
        case O_HEADS: ok = !fg_cli_parse_int(optarg, "--heads", 1, 65535, &o->heads), given |= GIVEN_HEADS; break;
        case O_SEQ: ok = !fg_cli_parse_int(optarg, "--seq", 1, 1 << 24, &o->seq), given |= GIVEN_FORWARD_SHAPE; break;
        case O_KV_HEADS:
            ok = !fg_cli_parse_int(optarg, "--kv-heads", 1, 65535, &o->kv_heads), given |= GIVEN_DECODE_ONLY;
            break;
        case O_SHAPES: ok = !parse_shapes(optarg, o), given |= GIVEN_DECODE_ONLY; break;
        case O_PAGES: ok = !parse_pages(optarg, o), given |= GIVEN_DECODE_ONLY; break;
        case O_DECODE: o->decode = true; break;
        case O_HEAD_DIM: ok = !fg_cli_parse_int(optarg, "--head-dim", 1, 1024, &o->head_dim); break;
        case O_DTYPE:
            if (strcmp(optarg, "bf16") == 0) o->dtype = FG_BF16;
            else if (strcmp(optarg, "fp16") == 0) o->dtype = FG_FP16;
            else ok = false;
            break;
        case O_SET:
            ok = o->nsets < BENCH_MAX_SETS && strchr(optarg, '=');
            if (ok) o->sets[o->nsets++] = optarg;
            break;
        case O_BUFFER:
            ok = o->nbuffers < BENCH_MAX_SETS && strchr(optarg, '=');
            if (ok) o->buffers[o->nbuffers++] = optarg;
            break;
        case O_ITERS: ok = !fg_cli_parse_int(optarg, "--iters", 1, 100000, &o->iters); break;
        case O_WARMUP: ok = !fg_cli_parse_int(optarg, "--warmup", 0, 100000, &o->warmup); break;
        case O_CHECK_SEQ: ok = !fg_cli_parse_int(optarg, "--check-seq", 1, 1 << 16, &o->check_seq); break;
        case O_NO_CHECK: o->check = false; break;
        case O_JSON: o->json = optarg; break;
        case O_BACKWARD: o->backward = true; break;
        case O_DETERMINISTIC: o->deterministic = true; break;
        case O_APPROX_MATH: o->approx_math = true; break;
        case 'h': usage(stdout); return -1;
        default: usage(stderr); return FG_EXIT_USAGE;
        }
        last_was_mask = false;
        if (!ok) {
            if (c == O_DTYPE || c == O_SET || c == O_BUFFER)
                fg_cli_error(FG_EXIT_USAGE, "bench: bad value '%s' for --%s", optarg ? optarg : "",
                             li >= 0 ? longopts[li].name : "?");
            return FG_EXIT_USAGE;
        }
    }
    for (int i = optind; i < argc; i++) {
        if (strcmp(argv[i], "bench") == 0) continue; /* the subcommand itself */
        return fg_cli_error(FG_EXIT_USAGE, "bench: unexpected argument '%s'", argv[i]);
    }
    if (o->deterministic && !o->backward)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --deterministic is a mode of the backward (add --backward)");
    int rc = decode_options(o, given);
    if (rc) return rc;
    for (int i = 0; i < o->ncases; i++) case_name_from_files(&o->cases[i]);
    if ((o->nsets || o->nbuffers) && o->ncases == 0)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --set and --buffer give values to --mask / --score "
                                           "mods (the gallery brings its own)");
    if (o->ncases == 0 || mods) {
        char all[512] = "";
        for (size_t i = 0; i < bench_gallery_count; i++)
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "," : "",
                     bench_gallery[i].name);
        rc = add_gallery(o, mods ? mods : o->decode ? decode_mods : all, gallery_dir(dir), owned, nowned);
        if (rc) return rc;
    }
    return 0;
}

/* The JSON file of --json ('-': stdout); NULL after printing an error. */
static FILE *json_open(const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (!f) fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s: %s", path, strerror(errno));
    return f;
}

/* 0, or an exit code after printing an error. */
static int json_close(FILE *f, const char *path) {
    if (f != stdout && fclose(f) != 0) return fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s", path);
    return 0;
}

/* The forward's cases: measured, then the table and the JSON. */
static int run_forward(fg_ctx *ctx, const bench_opts *o, int argc, char **argv, const char *device) {
    bench_result *res = calloc((size_t)o->ncases, sizeof *res);
    if (!res) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    printf("# flexgen %s bench on %s: B=%d H=%d S=%d D=%d %s, %d warm-up + %d timed launches%s%s\n",
           fg_version_string(), device, o->batch, o->heads, o->seq, o->head_dim,
           o->dtype == FG_BF16 ? "bf16" : "fp16", o->warmup, o->iters,
           !o->backward ? "" : o->deterministic ? ", forward and deterministic backward" : ", forward and backward",
           o->approx_math ? ", approximate math" : "");
    fflush(stdout);
    int rc = 0;
    bench_inputs in;
    fg_status st = bench_inputs_alloc(ctx, o, &in);
    if (st != FG_OK) {
        rc = fg_cli_fail(ctx, st, "bench");
    } else {
        for (int i = 0; i < o->ncases; i++) {
            fg_status cs = bench_run_case(ctx, o, &o->cases[i], &in, &res[i]);
            if (cs != FG_OK && rc == 0) rc = fg_cli_exit_code(cs);
        }
        bench_print_table(stdout, res, o->ncases, o->backward);
        FILE *f = o->json ? json_open(o->json) : NULL;
        if (f) bench_write_json(f, o, argc, argv, device, res, o->ncases);
        int jc = !o->json ? 0 : f ? json_close(f, o->json) : FG_EXIT_OTHER;
        if (jc) rc = jc;
    }
    bench_inputs_free(&in);
    free(res);
    return rc;
}

/* The decode steps: each case at each shape in each K/V layout, a row
 * printed as it is measured, then the JSON. */
static int run_decode(fg_ctx *ctx, const bench_opts *o, int argc, char **argv, const char *device) {
    const int n = o->ncases * o->nshapes * o->npages;
    bench_decode_result *res = calloc((size_t)n, sizeof *res);
    if (!res) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    printf("# flexgen %s decode bench on %s: Hq=%d Hkv=%d D=%d %s%s, %d warm-up + %d timed launches, "
           "the L2 flushed before each; TB/s of the K/V bytes a step must read\n",
           fg_version_string(), device, o->heads, o->kv_heads, o->head_dim, o->dtype == FG_BF16 ? "bf16" : "fp16",
           o->approx_math ? ", approximate math" : "", o->warmup, o->iters);
    fflush(stdout);
    int rc = 0;
    bench_decode_inputs in;
    fg_status st = bench_decode_inputs_alloc(ctx, o, &in);
    if (st != FG_OK) {
        rc = fg_cli_fail(ctx, st, "bench");
    } else {
        bench_print_decode_header(stdout);
        for (int i = 0, k = 0; i < o->ncases; i++)
            for (int j = 0; j < o->nshapes; j++)
                for (int p = 0; p < o->npages; p++, k++) {
                    fg_status cs = bench_run_decode(ctx, o, &o->cases[i], o->shapes[j], o->pages[p], &in, &res[k]);
                    if (cs != FG_OK && rc == 0) rc = fg_cli_exit_code(cs);
                    bench_print_decode_row(stdout, &res[k]);
                    fflush(stdout);
                }
        FILE *f = o->json ? json_open(o->json) : NULL;
        if (f) bench_write_decode_json(f, o, argc, argv, device, res, n);
        int jc = !o->json ? 0 : f ? json_close(f, o->json) : FG_EXIT_OTHER;
        if (jc) rc = jc;
    }
    bench_decode_inputs_free(&in);
    free(res);
    return rc;
}

int fg_cmd_bench(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.batch = 4, o.heads = 16, o.seq = 8192, o.head_dim = 128, o.dtype = FG_BF16;
    o.warmup = 5, o.iters = 30, o.check = true;
    char *owned[BENCH_MAX_CASES] = {0};
    int nowned = 0;
    int rc = parse_opts(argc, argv, &o, owned, &nowned);
    fg_ctx *ctx = NULL;
    if (rc == 0 && fg_ctx_create(&ctx) != FG_OK) rc = fg_cli_error(FG_EXIT_OTHER, "out of memory");
    if (rc == 0) { /* the flag, or FLEXGEN_APPROX_MATH: what the report says is what ran */
        int64_t approx = 0;
        if (o.approx_math) fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 1);
        fg_ctx_get_int(ctx, FG_OPT_APPROX_MATH, &approx);
        o.approx_math = approx != 0;
    }
    fg_status st = rc == 0 ? fgi_cuda_ready(ctx) : FG_OK;
    if (rc == 0 && st == FG_ERR_NO_DEVICE)
        rc = fg_cli_error(FG_EXIT_NO_GPU, "bench: no usable CUDA device (%s): the benchmark needs a GPU",
                          fg_errmsg(ctx));
    if (rc == 0 && st != FG_OK) rc = fg_cli_fail(ctx, st, "bench");
    if (rc == 0) {
        char device[256] = "unknown device";
        CUdevice dev;
        if (fgi_cu()->cuCtxGetDevice(&dev) == CUDA_SUCCESS) fgi_cu()->cuDeviceGetName(device, sizeof device, dev);
        rc = o.decode ? run_decode(ctx, &o, argc, argv, device) : run_forward(ctx, &o, argc, argv, device);
    }
    fg_ctx_destroy(ctx);
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return rc < 0 ? 0 : rc;
}
