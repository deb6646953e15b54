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
            "  --json FILE          also write the results as JSON ('-' for stdout)\n"
            "  -h, --help           this text\n"
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

/* 0 ok, -1 help printed, else an exit code (message printed). */
static int parse_opts(int argc, char **argv, bench_opts *o, char **owned, int *nowned) {
    enum { O_MASK = 256, O_SCORE, O_MODS, O_GALLERY, O_BATCH, O_HEADS, O_SEQ, O_HEAD_DIM, O_DTYPE,
           O_SET, O_BUFFER, O_ITERS, O_WARMUP, O_CHECK_SEQ, O_NO_CHECK, O_JSON, O_BACKWARD,
           O_DETERMINISTIC };
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
        {0, 0, 0, 0}};
    const char *mods = NULL, *dir = NULL;
    bool last_was_mask = false;
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
        case O_BATCH: ok = !fg_cli_parse_int(optarg, "--batch", 1, 65535, &o->batch); break;
        case O_HEADS: ok = !fg_cli_parse_int(optarg, "--heads", 1, 65535, &o->heads); break;
        case O_SEQ: ok = !fg_cli_parse_int(optarg, "--seq", 1, 1 << 24, &o->seq); break;
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
    for (int i = 0; i < o->ncases; i++) case_name_from_files(&o->cases[i]);
    if ((o->nsets || o->nbuffers) && o->ncases == 0)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --set and --buffer give values to --mask / --score "
                                           "mods (the gallery brings its own)");
    if (o->ncases == 0 || mods) {
        char all[512] = "";
        for (size_t i = 0; i < bench_gallery_count; i++)
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "," : "",
                     bench_gallery[i].name);
        int rc = add_gallery(o, mods ? mods : all, gallery_dir(dir), owned, nowned);
        if (rc) return rc;
    }
    return 0;
}

int fg_cmd_bench(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.batch = 4, o.heads = 16, o.seq = 8192, o.head_dim = 128, o.dtype = FG_BF16;
    o.warmup = 5, o.iters = 30, o.check = true;
    char *owned[BENCH_MAX_CASES] = {0};
    int nowned = 0;
    int rc = parse_opts(argc, argv, &o, owned, &nowned);
    if (rc != 0) {
        for (int i = 0; i < nowned; i++) free(owned[i]);
        return rc < 0 ? 0 : rc;
    }
    fg_ctx *ctx = NULL;
    bench_result *res = calloc((size_t)o.ncases, sizeof *res);
    if (!res || fg_ctx_create(&ctx) != FG_OK) {
        free(res);
        for (int i = 0; i < nowned; i++) free(owned[i]);
        return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    }
    fg_status st = fgi_cuda_ready(ctx);
    char device[256] = "unknown device";
    bench_inputs in = {0};
    bool cuda_ok = st == FG_OK;
    if (st == FG_OK) {
        CUdevice dev;
        if (fgi_cu()->cuCtxGetDevice(&dev) == CUDA_SUCCESS) fgi_cu()->cuDeviceGetName(device, sizeof device, dev);
        printf("# flexgen %s bench on %s: B=%d H=%d S=%d D=%d %s, %d warm-up + %d timed launches%s\n",
               fg_version_string(), device, o.batch, o.heads, o.seq, o.head_dim,
               o.dtype == FG_BF16 ? "bf16" : "fp16", o.warmup, o.iters,
               !o.backward ? "" : o.deterministic ? ", forward and deterministic backward" : ", forward and backward");
        fflush(stdout);
        st = bench_inputs_alloc(ctx, &o, &in);
    }
    if (st != FG_OK) {
        rc = fg_cli_fail(ctx, st, "bench");
    } else {
        for (int i = 0; i < o.ncases; i++) {
            fg_status cs = bench_run_case(ctx, &o, &o.cases[i], &in, &res[i]);
            if (cs != FG_OK && rc == 0) rc = fg_cli_exit_code(cs);
        }
        bench_print_table(stdout, res, o.ncases, o.backward);
        if (o.json) {
            FILE *f = strcmp(o.json, "-") == 0 ? stdout : fopen(o.json, "w");
            if (!f) {
                rc = fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s: %s", o.json, strerror(errno));
            } else {
                bench_write_json(f, &o, argc, argv, device, res, o.ncases);
                if (f != stdout && fclose(f) != 0)
                    rc = fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s", o.json);
            }
        }
    }
    if (cuda_ok) bench_inputs_free(&in);
    free(res);
    fg_ctx_destroy(ctx);
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return rc;
}
