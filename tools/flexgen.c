/*
 * flexgen.c -- the command-line tool.
 *
 * The default action is the one a reader of the library wants first: show
 * the CUDA that a mod becomes. `flexgen --mask mods/sliding_window.c` prints
 * the complete source of the forward kernel -- the emitted mod between the
 * shared helpers and the template -- exactly as NVRTC would receive it;
 * `--emit ptx|cubin -o FILE` compiles it (no GPU needed), `--canonical`
 * shows the text the kernel cache is keyed by. Everything else is a
 * subcommand: `cache` here, and `blockmask`, `check`, `bench` in their own
 * files (tools/cmd_*.c). A build without one of those still links: the
 * references are weak, and the subcommand then says it is not available.
 *
 * Exit codes are part of the interface (scripts test them): see usage().
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jit.h"

#if defined(__GNUC__)
#pragma weak fg_cmd_blockmask
#pragma weak fg_cmd_check
#pragma weak fg_cmd_bench
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen [--mask FILE] [--score FILE] [options]   print or compile a kernel\n"
            "       flexgen cache list|stats|clear                    the kernel cache on disk\n"
            "       flexgen blockmask ...                             build and show a block mask\n"
            "       flexgen check ...                                 GPU kernel vs. CPU reference\n"
            "       flexgen bench ...                                 speed and accuracy\n"
            "(`flexgen SUBCOMMAND --help` for a subcommand's options)\n\n"
            "Naming the mod:\n%s\n"
            "Kernel:\n"
            "  --kernel attention|blockmask|attention-sm90|attention-bwd|attention-bwd-sm90|decode\n"
            "                          which kernel (default attention: the portable\n"
            "                          forward kernel; attention-sm90: the Hopper one;\n"
            "                          attention-bwd: the backward, with score_mod's\n"
            "                          derivative; attention-bwd-sm90: its Hopper one;\n"
            "                          decode: the split-KV decode kernel, paged K/V)\n"
            "  --dtype bf16|fp16       input type of the attention kernel (default bf16)\n"
            "  --head-dim N            head dim, a multiple of 16 in [16, 256] (default 128)\n"
            "  --block N               block-mask block size, q and kv (default 128)\n"
            "  --q-block N, --kv-block N   the two separately (powers of two, 16..256)\n"
            "  --arch ARCH             NVRTC target, e.g. sm_80, sm_90a (default: the GPU's,\n"
            "                          sm_90a without one)\n"
            "  --approx-math           approximate math in score_mod and its derivative:\n"
            "                          tanh.approx, ex2 / lg2 / rsqrt.approx, div.full\n"
            "                          (FG_OPT_APPROX_MATH; bounds in include/flexgen.h;\n"
            "                          also FLEXGEN_APPROX_MATH=1)\n"
            "  --lead-first            attention-bwd-sm90: the -lead kernel, whose dK/dV pass\n"
            "                          can start every head's first kv tiles first (what\n"
            "                          the backward takes for masks with global tokens, and\n"
            "                          to split the last wave of a pass without a block mask)\n"
            "  --head-pairs            attention-bwd-sm90: the -pairs kernel, whose dK/dV pass\n"
            "                          runs the kv heads in pairs (what the backward takes\n"
            "                          for causal and prefix masks); decode at head dim 64:\n"
            "                          the -pairs kernel, which walks two KV heads' rows as\n"
            "                          one (what a paged [page, row, head, d] cache takes)\n"
            "  --dense                 attention-sm90 at head dim 128, a mod without a\n"
            "                          mask_mod: the -dense kernel, 176-row K/V tiles (what\n"
            "                          the forward takes for calls without a block mask)\n\n"
            "Output:\n"
            "  --emit cuda|ptx|cubin   the CUDA source (default), or compile it with NVRTC\n"
            "  --emit mod              only the emitted mod (params struct, fg_mask_mod,\n"
            "                          fg_score_mod) without helpers and template\n"
            "  -o, --output FILE       write there instead of standard output\n"
            "  --canonical             print the mod's canonical text and hash instead\n"
            "  -h, --help              this text\n"
            "  -V, --version           the version\n\n"
            "Exit codes:\n"
            "  0 ok, 1 bad usage, 2 bad mod (diagnostic on stderr), 3 compile error (log on\n"
            "  stderr), 4 no GPU, 5 check over tolerance, 6 other error\n",
            fg_cli_mod_help);
}

/* ---- cache subcommand ------------------------------------------------------- */

typedef struct cache_totals {
    size_t files;
    uint64_t bytes;
    bool print;
} cache_totals;

static void cache_visit(void *arg, const fgi_cache_file *f) {
    cache_totals *t = arg;
    t->files++;
    t->bytes += f->size;
    if (!t->print) return;
    char when[32] = "?";
    time_t tt = (time_t)f->mtime;
    struct tm tm;
    if (localtime_r(&tt, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("%10llu  %s  %s\n", (unsigned long long)f->size, when, f->name);
}

static int cmd_cache(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: flexgen cache list    the files, most recently used first\n"
                "       flexgen cache stats   folder, file count and size\n"
                "       flexgen cache clear   remove every cache file\n"
                "The folder: $FLEXGEN_CACHE_DIR, else $XDG_CACHE_HOME/flexgen, else "
                "~/.cache/flexgen.\n");
        return argc < 2 ? FG_EXIT_USAGE : FG_EXIT_OK;
    }
    if (argc > 2) return fg_cli_error(FG_EXIT_USAGE, "cache %s: unexpected '%s'", argv[1], argv[2]);
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    int rc = FG_EXIT_OK;
    const char *dir = NULL;
    fg_status st = fg_cache_dir(ctx, &dir);
    if (st != FG_OK) {
        rc = fg_cli_fail(ctx, st, "cache");
    } else if (strcmp(argv[1], "list") == 0 || strcmp(argv[1], "stats") == 0) {
        cache_totals t = {0, 0, strcmp(argv[1], "list") == 0};
        st = fgi_cache_list(ctx, cache_visit, &t);
        if (st != FG_OK) rc = fg_cli_fail(ctx, st, "cache");
        else if (!t.print) {
            int64_t cap = 0;
            fg_ctx_get_int(ctx, FG_OPT_CACHE_MAX_BYTES, &cap);
            printf("folder:  %s\nfiles:   %zu\nbytes:   %llu\nlimit:   %lld\n", dir, t.files,
                   (unsigned long long)t.bytes, (long long)cap);
        }
    } else if (strcmp(argv[1], "clear") == 0) {
        size_t removed = 0;
        st = fg_cache_clear(ctx, &removed);
        if (st != FG_OK) rc = fg_cli_fail(ctx, st, "cache clear");
        else printf("removed %zu file%s from %s\n", removed, removed == 1 ? "" : "s", dir);
    } else {
        rc = fg_cli_error(FG_EXIT_USAGE, "cache: unknown action '%s' (list, stats or clear)", argv[1]);
    }
    fg_ctx_destroy(ctx);
    return rc;
}

/* ---- the default action: source, PTX, cubin, canonical ----------------------- */

typedef enum emit_what { EMIT_CUDA, EMIT_PTX, EMIT_CUBIN, EMIT_MOD, EMIT_CANONICAL } emit_what;

typedef struct gen_opts {
    fg_cli_mod_args mod;
    fg_kernel_config cfg;
    emit_what what;
    const char *output;
} gen_opts;

enum {
    OPT_KERNEL = 0x2000, OPT_DTYPE, OPT_HEAD_DIM, OPT_BLOCK, OPT_Q_BLOCK, OPT_KV_BLOCK, OPT_ARCH,
    OPT_EMIT, OPT_CANONICAL, OPT_APPROX_MATH, OPT_LEAD_FIRST, OPT_HEAD_PAIRS, OPT_DENSE
};

static int parse_choice(const char *arg, const char *opt, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(arg, names[i]) == 0) return i;
    fprintf(stderr, "flexgen: %s: unknown value '%s' (", opt, arg);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s%s", i ? ", " : "", names[i]);
    fputs(")\n", stderr);
    return -1;
}

/* One option of the default action; FG_EXIT_OK or FG_EXIT_USAGE. */
static int gen_option(gen_opts *o, int c, const char *arg) {
    static const char *const dtypes[] = {"bf16", "fp16"};
    static const char *const emits[] = {"cuda", "ptx", "cubin", "mod"};
    int i, v;
    switch (c) {
    case OPT_KERNEL:
        if ((i = parse_choice(arg, "--kernel", fg_cli_kernel_names, FG_CLI_KERNEL_KINDS)) < 0) return FG_EXIT_USAGE;
        o->cfg.kind = fg_cli_kernel_kinds[i];
        return 0;
    case OPT_DTYPE:
        if ((i = parse_choice(arg, "--dtype", dtypes, 2)) < 0) return FG_EXIT_USAGE;
        o->cfg.dtype = i == 0 ? FG_BF16 : FG_FP16;
        return 0;
    case OPT_HEAD_DIM: return fg_cli_parse_int(arg, "--head-dim", 1, 100000, &o->cfg.head_dim);
    case OPT_BLOCK:
        if (fg_cli_parse_int(arg, "--block", 1, 100000, &v)) return FG_EXIT_USAGE;
        o->cfg.q_block = o->cfg.kv_block = v;
        return 0;
    case OPT_Q_BLOCK: return fg_cli_parse_int(arg, "--q-block", 1, 100000, &o->cfg.q_block);
    case OPT_KV_BLOCK: return fg_cli_parse_int(arg, "--kv-block", 1, 100000, &o->cfg.kv_block);
    case OPT_ARCH: o->cfg.arch = arg; return 0;
    case OPT_APPROX_MATH: o->cfg.approx_math = 1; return 0;
    case OPT_LEAD_FIRST: o->cfg.lead_first = 1; return 0;
    case OPT_HEAD_PAIRS: o->cfg.head_pairs = 1; return 0;
    case OPT_DENSE: o->cfg.dense = 1; return 0;
    case OPT_EMIT:
        if ((i = parse_choice(arg, "--emit", emits, 4)) < 0) return FG_EXIT_USAGE;
        o->what = i == 0 ? EMIT_CUDA : i == 1 ? EMIT_PTX : i == 2 ? EMIT_CUBIN : EMIT_MOD;
        return 0;
    case OPT_CANONICAL: o->what = EMIT_CANONICAL; return 0;
    case 'o': o->output = arg; return 0;
    default: {
        int r = fg_cli_mod_option(&o->mod, c, arg);
        if (r == 1) return 0;
        if (r == 0) usage(stderr);
        return FG_EXIT_USAGE;
    }
    }
}

static int write_out(const char *path, const void *data, size_t n, bool binary) {
    if (!path || strcmp(path, "-") == 0) {
        if (binary && isatty(STDOUT_FILENO))
            return fg_cli_error(FG_EXIT_USAGE, "a cubin is binary: give -o FILE");
        if (fwrite(data, 1, n, stdout) != n || fflush(stdout) != 0)
            return fg_cli_error(FG_EXIT_OTHER, "writing standard output failed");
        return 0;
    }
    FILE *f = fopen(path, binary ? "wb" : "w");
    if (!f) return fg_cli_error(FG_EXIT_OTHER, "%s: cannot open for writing", path);
    bool ok = fwrite(data, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok) return fg_cli_error(FG_EXIT_OTHER, "%s: write failed", path);
    return 0;
}

static int run_generate(fg_ctx *ctx, const gen_opts *o, const fg_mod *mod) {
    if (o->what == EMIT_CANONICAL) {
        char text[64];
        const char *canon = fg_mod_canonical(mod);
        snprintf(text, sizeof text, "/* hash %016llx */\n", (unsigned long long)fg_mod_hash(mod));
        size_t cl = strlen(canon), tl = strlen(text);
        char *all = malloc(cl + tl + 1);
        if (!all) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
        memcpy(all, canon, cl);
        memcpy(all + cl, text, tl + 1);
        int rc = write_out(o->output, all, cl + tl, false);
        free(all);
        return rc;
    }
    if (o->what == EMIT_MOD) {
        /* the kernels' spelling of score_mod: approximate as the kernel
         * would be (the flag, or the context's FLEXGEN_APPROX_MATH) */
        int64_t approx = o->cfg.approx_math;
        if (!approx) fg_ctx_get_int(ctx, FG_OPT_APPROX_MATH, &approx);
        fgi_buf b = {0};
        fg_status st = fgi_emit_mod_math(ctx, mod, NULL, approx ? FGI_MATH_APPROX : FGI_MATH_ACCURATE, &b);
        if (st != FG_OK) {
            fgi_buf_free(&b);
            return fg_cli_fail(ctx, st, NULL);
        }
        int rc = write_out(o->output, b.data ? b.data : "", b.len, false);
        fgi_buf_free(&b);
        return rc;
    }
    if (o->what == EMIT_CUDA) {
        char *src = NULL;
        fg_status st = fg_generate_source(ctx, mod, &o->cfg, &src);
        if (st != FG_OK) return fg_cli_fail(ctx, st, NULL);
        int rc = write_out(o->output, src, strlen(src), false);
        fg_free(src);
        return rc;
    }
    void *image = NULL;
    size_t size = 0;
    fg_status st = fg_compile(ctx, mod, &o->cfg, o->what == EMIT_PTX ? FG_EMIT_PTX : FG_EMIT_CUBIN,
                              &image, &size);
    if (st != FG_OK) return fg_cli_fail(ctx, st, NULL);
    /* NVRTC's PTX ends with a NUL that does not belong in a text file */
    size_t n = size;
    if (o->what == EMIT_PTX)
        while (n > 0 && ((const char *)image)[n - 1] == 0) n--;
    int rc = write_out(o->output, image, n, o->what == EMIT_CUBIN);
    fg_free(image);
    return rc;
}

static int cmd_generate(int argc, char **argv) {
    static const struct option longopts[] = {
        FG_CLI_MOD_LONGOPTS,
        {"kernel", required_argument, 0, OPT_KERNEL},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"head-dim", required_argument, 0, OPT_HEAD_DIM},
        {"block", required_argument, 0, OPT_BLOCK},
        {"q-block", required_argument, 0, OPT_Q_BLOCK},
        {"kv-block", required_argument, 0, OPT_KV_BLOCK},
        {"arch", required_argument, 0, OPT_ARCH},
        {"approx-math", no_argument, 0, OPT_APPROX_MATH},
        {"lead-first", no_argument, 0, OPT_LEAD_FIRST},
        {"head-pairs", no_argument, 0, OPT_HEAD_PAIRS},
        {"dense", no_argument, 0, OPT_DENSE},
        {"emit", required_argument, 0, OPT_EMIT},
        {"canonical", no_argument, 0, OPT_CANONICAL},
        {"output", required_argument, 0, 'o'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    gen_opts o;
    memset(&o, 0, sizeof o);
    fg_cli_mod_args_init(&o.mod);
    o.cfg = fg_kernel_config_init(); /* this header's layout: approx_math, lead_first, head_pairs and dense are read */
    o.cfg.kind = FG_KERNEL_ATTENTION_FWD;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:hV", longopts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return FG_EXIT_OK;
        }
        if (c == 'V') {
            printf("flexgen %s\n", fg_version_string());
            return FG_EXIT_OK;
        }
        if (c == '?' || c == ':') {
            const char *bad = argv[optind - 1];
            return fg_cli_error(FG_EXIT_USAGE, "%s '%s' (flexgen --help lists the options)",
                                c == ':' ? "missing value for" : "unknown option", bad);
        }
        int rc = gen_option(&o, c, optarg);
        if (rc) return rc;
    }
    if (optind < argc)
        return fg_cli_error(FG_EXIT_USAGE, "unexpected argument '%s' (flexgen --help)", argv[optind]);
    if (!fg_cli_has_mod(&o.mod)) {
        usage(stderr);
        return FG_EXIT_USAGE;
    }
    fg_ctx *ctx;
    if (fg_ctx_create(&ctx) != FG_OK) return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    fg_mod *mod = NULL;
    int rc = fg_cli_load_mod(ctx, &o.mod, &mod);
    if (rc == 0) rc = run_generate(ctx, &o, mod);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------ */

typedef int (*subcommand_fn)(int argc, char **argv);

int main(int argc, char **argv) {
    if (argc >= 2 && argv[1][0] != '-') {
        static const struct {
            const char *name;
            subcommand_fn fn;
        } subs[] = {{"blockmask", fg_cmd_blockmask}, {"check", fg_cmd_check}, {"bench", fg_cmd_bench}};
        if (strcmp(argv[1], "cache") == 0) return cmd_cache(argc - 1, argv + 1);
        for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
            if (strcmp(argv[1], subs[i].name) != 0) continue;
            if (!subs[i].fn)
                return fg_cli_error(FG_EXIT_OTHER, "'%s' is not available in this build", argv[1]);
            return subs[i].fn(argc - 1, argv + 1);
        }
        return fg_cli_error(FG_EXIT_USAGE, "unknown command '%s' (flexgen --help)", argv[1]);
    }
    return cmd_generate(argc, argv);
}
