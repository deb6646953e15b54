/*
 * cmd_bench.c -- `flexgen bench`: speed, first-call costs and accuracy of
 * the forward kernel for each mod, for users without Python.
 *
 * It measures what bench/compare_torch.py measures on the flexgen side, the
 * same way, so the two agree where they overlap:
 *
 *   forward        median of per-launch CUDA-event timings after warm-up, on
 *                  random normal inputs (never zeros, which hide unwritten
 *                  outputs and run faster than real data);
 *   TFLOP/s        4 * B * H * S * S * D * density, FlexAttention's count,
 *                  density = 1 - block sparsity of the mod's block mask;
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
 */
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cudrv.h"
#include "flexgen.h"

#define MAX_CASES 64
#define MAX_PARAMS 16
#define MAX_SETS 32

/* ------------------------------------------------------------------------- */
/* Parameters and buffers of one case, on the host                           */
/* ------------------------------------------------------------------------- */

typedef struct host_param {
    char name[64];
    fg_param_kind kind;
    fg_type type;
    double value;      /* scalars                            */
    void *data;        /* buffers: int32_t or float, malloc'd */
    int64_t length;
} host_param;

typedef struct setup {
    host_param p[MAX_PARAMS];
    int n;
} setup;

static void setup_free(setup *s) {
    for (int i = 0; i < s->n; i++) free(s->p[i].data);
    s->n = 0;
}

static host_param *setup_slot(setup *s, const char *name) {
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->p[i].name, name) == 0) {
            free(s->p[i].data);
            memset(&s->p[i], 0, sizeof s->p[i]);
            snprintf(s->p[i].name, sizeof s->p[i].name, "%s", name);
            return &s->p[i];
        }
    if (s->n == MAX_PARAMS) return NULL;
    host_param *p = &s->p[s->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    return p;
}

static bool set_scalar(setup *s, const char *name, fg_type type, double v) {
    host_param *p = setup_slot(s, name);
    if (!p) return false;
    p->kind = FG_PARAM_SCALAR;
    p->type = type;
    p->value = v;
    return true;
}

/* Takes ownership of data. */
static bool set_buffer(setup *s, const char *name, fg_type type, void *data, int64_t length) {
    host_param *p = setup_slot(s, name);
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

/* ------------------------------------------------------------------------- */
/* Random numbers and 16-bit floats                                          */
/* ------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static double rng_uniform(uint64_t *s) { /* (0, 1] */
    return ((double)(rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* IEEE binary16 with round-to-nearest-even, subnormals and overflow to inf. */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
    if (mag < 0x38800000u) {                                     /* subnormal or zero */
        if (mag < 0x33000000u) return (uint16_t)sign;
        uint32_t m = (mag & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(mag >> 23) + 13 + 1;
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = mag - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t h = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31) u = sign | 0x7f800000u | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n random normal values as 16-bit floats (Box-Muller). */
static uint16_t *random_halves(size_t n, fg_dtype dt, uint64_t seed) {
    uint16_t *x = malloc(n * sizeof *x);
    if (!x) return NULL;
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(rng_uniform(&s))), t = 6.283185307179586 * rng_uniform(&s);
        float a = (float)(r * cos(t)), b = (float)(r * sin(t));
        x[i] = dt == FG_BF16 ? f32_to_bf16(a) : f32_to_f16(a);
        if (i + 1 < n) x[i + 1] = dt == FG_BF16 ? f32_to_bf16(b) : f32_to_f16(b);
    }
    return x;
}

static float half_to_f32(uint16_t h, fg_dtype dt) { return dt == FG_BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

/* ------------------------------------------------------------------------- */
/* The gallery's parameters and buffers (the values of bench/torch_mods.py)  */
/* ------------------------------------------------------------------------- */

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
            c = 1 + (int)(rng_next(&s) % (uint64_t)(total - 1));
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

typedef bool (*setup_fn)(int B, int H, int S, setup *s);

static bool setup_none(int B, int H, int S, setup *s) {
    (void)B, (void)H, (void)S, (void)s;
    return true;
}

static bool setup_sliding_window(int B, int H, int S, setup *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "WINDOW", FG_TYPE_INT, 1024);
}

static bool setup_prefix_lm(int B, int H, int S, setup *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "PREFIX", FG_TYPE_INT, 2048);
}

static bool setup_document(int B, int H, int S, setup *s) {
    (void)B, (void)H;
    int n = S < DOCUMENTS ? S : DOCUMENTS;
    int *len = random_lengths(S, n, 1);
    if (!len) return false;
    int32_t *ids = ids_from_lengths(len, n, S);
    free(len);
    return ids && set_buffer(s, "document_id", FG_TYPE_INT, ids, S);
}

static bool setup_jagged(int B, int H, int S, setup *s) {
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

static bool setup_sasa(int B, int H, int S, setup *s) {
    (void)B, (void)H;
    int w, h;
    image_side(S, &w, &h);
    return set_scalar(s, "W", FG_TYPE_INT, w) && set_scalar(s, "WINDOW", FG_TYPE_INT, 8);
}

static bool setup_natten(int B, int H, int S, setup *s) {
    (void)B, (void)H;
    int w, h;
    image_side(S, &w, &h);
    return set_scalar(s, "W", FG_TYPE_INT, w) && set_scalar(s, "H", FG_TYPE_INT, h) &&
           set_scalar(s, "KERNEL", FG_TYPE_INT, 15);
}

static bool setup_alibi(int B, int H, int S, setup *s) {
    (void)B, (void)S;
    float *slopes = malloc(sizeof(float) * (size_t)H);
    if (!slopes) return false;
    for (int h = 0; h < H; h++) slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / H);
    return set_buffer(s, "slopes", FG_TYPE_FLOAT, slopes, H);
}

static bool setup_softcap(int B, int H, int S, setup *s) {
    (void)B, (void)H, (void)S;
    return set_scalar(s, "SOFTCAP", FG_TYPE_FLOAT, 20.0);
}

#define FLAMINGO_IMAGES 8

/* Text in FLAMINGO_IMAGES + 1 intervals (the first sees no image), keys are
 * image tokens, S / FLAMINGO_IMAGES per image. */
static bool setup_flamingo(int B, int H, int S, setup *s) {
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

static const struct gallery_entry {
    const char *name;
    setup_fn setup;
} gallery[] = {
    {"noop", setup_none},       {"causal", setup_none},           {"sliding_window", setup_sliding_window},
    {"prefix_lm", setup_prefix_lm}, {"document", setup_document}, {"jagged", setup_jagged},
    {"sasa", setup_sasa},       {"natten", setup_natten},         {"alibi", setup_alibi},
    {"softcap", setup_softcap}, {"flamingo", setup_flamingo},
};
#define GALLERY_COUNT (sizeof gallery / sizeof gallery[0])

/* ------------------------------------------------------------------------- */
/* Options                                                                    */
/* ------------------------------------------------------------------------- */

typedef struct bench_case {
    char name[128];
    const char *mask_file, *score_file;
    setup_fn setup;          /* gallery: its values; custom: none           */
} bench_case;

typedef struct bench_opts {
    int batch, heads, seq, head_dim;
    fg_dtype dtype;
    int warmup, iters, check_seq;
    bool check;
    const char *json;
    bench_case cases[MAX_CASES];
    int ncases;
    const char *sets[MAX_SETS];    /* NAME=VALUE */
    int nsets;
    const char *buffers[MAX_SETS]; /* NAME=FILE  */
    int nbuffers;
} bench_opts;

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen bench [--mask FILE [--score FILE]]... [options]\n"
            "\n"
            "Forward speed, block-mask build time, first-call costs and accuracy of\n"
            "flexgen's kernels for each mod (the gallery in mods/ by default).\n"
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
        while (i < GALLERY_COUNT && strcmp(gallery[i].name, tok) != 0) i++;
        if (i == GALLERY_COUNT) {
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: unknown gallery mod '%s'", tok);
        } else if (o->ncases == MAX_CASES) {
            rc = fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", MAX_CASES);
        } else {
            bench_case *c = &o->cases[o->ncases++];
            memset(c, 0, sizeof *c);
            snprintf(c->name, sizeof c->name, "%s", gallery[i].name);
            c->mask_file = owned[(*nowned)++] = join_path(dir, gallery[i].name);
            c->setup = gallery[i].setup;
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
           O_SET, O_BUFFER, O_ITERS, O_WARMUP, O_CHECK_SEQ, O_NO_CHECK, O_JSON };
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
            if (o->ncases == MAX_CASES) return fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", MAX_CASES);
            memset(&o->cases[o->ncases], 0, sizeof o->cases[0]);
            o->cases[o->ncases++].mask_file = optarg;
            last_was_mask = true;
            continue;
        case O_SCORE:
            if (last_was_mask) {
                o->cases[o->ncases - 1].score_file = optarg;
            } else {
                if (o->ncases == MAX_CASES)
                    return fg_cli_error(FG_EXIT_USAGE, "bench: more than %d cases", MAX_CASES);
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
            ok = o->nsets < MAX_SETS && strchr(optarg, '=');
            if (ok) o->sets[o->nsets++] = optarg;
            break;
        case O_BUFFER:
            ok = o->nbuffers < MAX_SETS && strchr(optarg, '=');
            if (ok) o->buffers[o->nbuffers++] = optarg;
            break;
        case O_ITERS: ok = !fg_cli_parse_int(optarg, "--iters", 1, 100000, &o->iters); break;
        case O_WARMUP: ok = !fg_cli_parse_int(optarg, "--warmup", 0, 100000, &o->warmup); break;
        case O_CHECK_SEQ: ok = !fg_cli_parse_int(optarg, "--check-seq", 1, 1 << 16, &o->check_seq); break;
        case O_NO_CHECK: o->check = false; break;
        case O_JSON: o->json = optarg; break;
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
    for (int i = 0; i < o->ncases; i++) case_name_from_files(&o->cases[i]);
    if ((o->nsets || o->nbuffers) && o->ncases == 0)
        return fg_cli_error(FG_EXIT_USAGE, "bench: --set and --buffer give values to --mask / --score "
                                           "mods (the gallery brings its own)");
    if (o->ncases == 0 || mods) {
        char all[512] = "";
        for (size_t i = 0; i < GALLERY_COUNT; i++)
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "," : "", gallery[i].name);
        int rc = add_gallery(o, mods ? mods : all, gallery_dir(dir), owned, nowned);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Custom parameters: --set and --buffer                                     */
/* ------------------------------------------------------------------------- */

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

static fg_status apply_set(fg_ctx *ctx, const fg_mod *mod, const char *spec, setup *s) {
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

static fg_status apply_buffer(fg_ctx *ctx, const fg_mod *mod, const char *spec, setup *s) {
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

/* ------------------------------------------------------------------------- */
/* Device memory and bindings                                                */
/* ------------------------------------------------------------------------- */

typedef struct device_setup {
    fg_binding binds[MAX_PARAMS];
    CUdeviceptr mem[MAX_PARAMS];
    size_t n;
} device_setup;

static void host_binds(const setup *s, fg_binding *b) {
    for (int i = 0; i < s->n; i++) {
        const host_param *p = &s->p[i];
        if (p->kind == FG_PARAM_SCALAR)
            b[i] = p->type == FG_TYPE_INT ? fg_bind_int(p->name, (int32_t)p->value)
                                          : fg_bind_float(p->name, (float)p->value);
        else if (p->type == FG_TYPE_INT)
            b[i] = fg_bind_int_buffer(p->name, p->data, p->length);
        else
            b[i] = fg_bind_float_buffer(p->name, p->data, p->length);
    }
}

static void device_free(device_setup *d) {
    for (size_t i = 0; i < d->n; i++)
        if (d->mem[i]) fgi_cu()->cuMemFree(d->mem[i]);
    memset(d, 0, sizeof *d);
}

static fg_status device_upload(fg_ctx *ctx, const setup *s, device_setup *d) {
    memset(d, 0, sizeof *d);
    host_binds(s, d->binds);
    d->n = (size_t)s->n;
    for (int i = 0; i < s->n; i++) {
        const host_param *p = &s->p[i];
        if (p->kind != FG_PARAM_BUFFER || p->length == 0) continue;
        size_t bytes = (size_t)p->length * 4;
        FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&d->mem[i], bytes), "cuMemAlloc");
        FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(d->mem[i], p->data, bytes), "cuMemcpyHtoD");
        d->binds[i].value.buffer.data = (const void *)(uintptr_t)d->mem[i];
    }
    return FG_OK;
}

static fg_status upload_halves(fg_ctx *ctx, const uint16_t *h, size_t n, CUdeviceptr *out) {
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(out, n * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(*out, h, n * 2), "cuMemcpyHtoD");
    return FG_OK;
}

/* ------------------------------------------------------------------------- */
/* Measurements                                                               */
/* ------------------------------------------------------------------------- */

typedef struct result {
    char name[128];
    char mod_name[128];
    double density;
    double fwd_ms, tflops;
    double bm_first_ms, bm_rebuild_ms;
    double cold_ms, nvrtc_ms, disk_ms, disk_load_ms, mem_hit_us;
    double err_out, err_lse;
    long nonfinite;
    bool checked;
    const char *kernel; /* the forward kernel that ran: "sm90" or "portable" */
    char failure[512];
} result;

static double wall_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef fg_status (*launch_fn)(fg_ctx *ctx, void *arg);

/* Median of `iters` event-timed launches after `warmup` untimed ones. */
static fg_status time_median(fg_ctx *ctx, launch_fn fn, void *arg, int warmup, int iters, double *ms) {
    const fgi_cu_api *cu = fgi_cu();
    for (int i = 0; i < warmup; i++) FGI_TRY(fn(ctx, arg));
    CUevent *ev = calloc((size_t)iters * 2, sizeof *ev);
    double *t = calloc((size_t)iters, sizeof *t);
    fg_status st = ev && t ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    int made = 0;
    for (; st == FG_OK && made < iters * 2; made++)
        st = fgi_cu_status(ctx, cu->cuEventCreate(&ev[made], CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i], NULL), "cuEventRecord");
        if (st == FG_OK) st = fn(ctx, arg);
        if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuEventRecord(ev[2 * i + 1], NULL), "cuEventRecord");
    }
    if (st == FG_OK) st = fgi_cu_status(ctx, cu->cuCtxSynchronize(), "cuCtxSynchronize");
    for (int i = 0; st == FG_OK && i < iters; i++) {
        float e = 0;
        st = fgi_cu_status(ctx, cu->cuEventElapsedTime(&e, ev[2 * i], ev[2 * i + 1]), "cuEventElapsedTime");
        t[i] = e;
    }
    if (st == FG_OK) {
        qsort(t, (size_t)iters, sizeof *t, cmp_double);
        *ms = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    }
    for (int i = 0; i < made; i++) cu->cuEventDestroy(ev[i]);
    free(ev);
    free(t);
    return st;
}

typedef struct fwd_arg {
    const fg_mod *mod;
    fg_attention_args args;
} fwd_arg;

static fg_status launch_forward(fg_ctx *ctx, void *p) {
    fwd_arg *a = p;
    return fg_attention_forward(ctx, a->mod, &a->args);
}

typedef struct rebuild_arg {
    fg_block_mask *mask;
    const fg_mod *mod;
    const fg_binding *binds;
    size_t nbinds;
} rebuild_arg;

static fg_status launch_rebuild(fg_ctx *ctx, void *p) {
    rebuild_arg *a = p;
    return fg_block_mask_rebuild_gpu(ctx, a->mask, a->mod, a->binds, a->nbinds, NULL);
}

static fg_status device_sync(fg_ctx *ctx) {
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxSynchronize(), "cuCtxSynchronize");
    return FG_OK;
}

static bool is_word_char(char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Whether a mask_mod body of the canonical text reads the index argument
 * `arg` ("b" / "h"): when none does, the block mask broadcasts over that
 * dimension. The canonical text prints each mask function as
 * "bool NAME(int b, int h, int q_idx, int kv_idx) {", its body, then "}"
 * alone on a line; anything else counts as "uses" (never broadcast wrongly). */
static bool mod_uses(const fg_mod *mod, const char *arg) {
    const char *t = fg_mod_canonical(mod);
    const char *sig = "(int b, int h, int q_idx, int kv_idx) {\n";
    size_t n = strlen(arg);
    bool found_mask = false;
    for (const char *p = t ? strstr(t, "bool ") : NULL; p; p = strstr(p + 1, "bool ")) {
        if (p != t && p[-1] != '\n') continue;
        const char *open = strstr(p, sig);
        const char *eol = strchr(p, '\n');
        if (!open || !eol || open > eol) continue;
        const char *body = open + strlen(sig);
        const char *end = strstr(body, "\n}");
        if (!end) return true;
        found_mask = true;
        for (const char *w = body; w < end; w++)
            if (strncmp(w, arg, n) == 0 && (w == body || !is_word_char(w[-1])) && !is_word_char(w[n]))
                return true;
    }
    return !found_mask;
}

/* A fresh, empty cache folder for one case. */
static bool fresh_cache_dir(char *buf, size_t n) {
    const char *tmp = getenv("TMPDIR");
    snprintf(buf, n, "%s/flexgen-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(buf) != NULL;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* The folder and whatever is in it (cache files, and temporary files of an
 * interrupted write). */
static void remove_cache_dir(const char *dir) {
    if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fg_cli_error(0, "bench: could not remove %s", dir);
}

static fg_status load_case_mod(fg_ctx *ctx, const bench_case *c, fg_mod **out) {
    fg_mod *m = NULL, *s = NULL;
    *out = NULL;
    if (c->mask_file) FGI_TRY(fg_mod_from_file(ctx, c->mask_file, &m));
    if (c->score_file) {
        fg_status st = fg_mod_from_file(ctx, c->score_file, &s);
        if (st != FG_OK) {
            fg_mod_destroy(m);
            return st;
        }
    }
    if (m && s) {
        fg_status st = fg_mod_combine(ctx, m, s, out);
        fg_mod_destroy(m);
        fg_mod_destroy(s);
        return st;
    }
    *out = m ? m : s;
    return FG_OK;
}

static fg_status make_setup(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                            int B, int H, int S, setup *s) {
    memset(s, 0, sizeof *s);
    if (c->setup && !c->setup(B, H, S, s))
        return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory for the parameters of %s", c->name);
    if (!c->setup) {
        for (int i = 0; i < o->nsets; i++) FGI_TRY(apply_set(ctx, mod, o->sets[i], s));
        for (int i = 0; i < o->nbuffers; i++) FGI_TRY(apply_buffer(ctx, mod, o->buffers[i], s));
    }
    return FG_OK;
}

/* The accuracy check on (1, 2, Sc, D): GPU against the float64 reference. */
static fg_status check_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                            result *r) {
    const int B = 1, H = 2, S = o->check_seq > 0 ? o->check_seq : (o->seq < 1024 ? o->seq : 1024);
    const int D = o->head_dim;
    size_t n = (size_t)B * H * S * D;
    setup s;
    device_setup d = {0};
    fg_block_mask *bm = NULL;
    CUdeviceptr dq = 0, dk = 0, dv = 0, dout = 0, dlse = 0;
    uint16_t *hq = random_halves(n, o->dtype, 101), *hk = random_halves(n, o->dtype, 102);
    uint16_t *hv = random_halves(n, o->dtype, 103), *hout = malloc(n * 2);
    float *hlse = malloc(sizeof(float) * (size_t)B * H * S);
    double *ref = malloc(sizeof(double) * n), *ref_lse = malloc(sizeof(double) * (size_t)B * H * S);
    fg_status st = make_setup(ctx, o, c, mod, B, H, S, &s);
    if (!hq || !hk || !hv || !hout || !hlse || !ref || !ref_lse) st = FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) st = device_upload(ctx, &s, &d);
    if (st == FG_OK) st = upload_halves(ctx, hq, n, &dq);
    if (st == FG_OK) st = upload_halves(ctx, hk, n, &dk);
    if (st == FG_OK) st = upload_halves(ctx, hv, n, &dv);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&dout, n * 2), "cuMemAlloc");
    if (st == FG_OK)
        st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&dlse, sizeof(float) * (size_t)B * H * S), "cuMemAlloc");
    if (st == FG_OK) /* poison: an unwritten output shows as non-finite */
        st = fgi_cu_status(ctx, fgi_cu()->cuMemsetD8(dout, 0xff, n * 2), "cuMemsetD8");
    fg_block_mask_desc desc = {1, 1, S, S, 128, 128};
    if (st == FG_OK && fg_mod_has_mask(mod))
        st = fg_block_mask_create_gpu(ctx, mod, &desc, d.binds, d.n, NULL, &bm);
    fg_attention_args a;
    memset(&a, 0, sizeof a);
    a.batch = B, a.heads_q = a.heads_kv = H, a.q_len = a.kv_len = S, a.head_dim = D;
    a.dtype = o->dtype;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.block_mask = bm, a.binds = d.binds, a.nbinds = d.n;
    if (st == FG_OK) st = fg_attention_forward(ctx, mod, &a);
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hout, dout, n * 2), "cuMemcpyDtoH");
    if (st == FG_OK)
        st = fgi_cu_status(ctx, fgi_cu()->cuMemcpyDtoH(hlse, dlse, sizeof(float) * (size_t)B * H * S), "cuMemcpyDtoH");
    if (st == FG_OK) {
        fg_binding hb[MAX_PARAMS];
        host_binds(&s, hb);
        fg_attention_args h = a;
        h.q = hq, h.k = hk, h.v = hv, h.out = ref, h.lse = NULL, h.block_mask = NULL;
        h.binds = hb, h.nbinds = (size_t)s.n;
        st = fg_attention_reference(ctx, mod, &h, ref, ref_lse);
    }
    if (st == FG_OK) {
        double num = 0, den = 0, lse_err = 0;
        long bad = 0;
        for (size_t i = 0; i < n; i++) {
            double x = half_to_f32(hout[i], o->dtype);
            if (!isfinite(x)) {
                bad++;
                continue;
            }
            num += (x - ref[i]) * (x - ref[i]);
            den += ref[i] * ref[i];
        }
        for (size_t i = 0; i < (size_t)B * H * S; i++) {
            if (isinf(ref_lse[i]) && isinf(hlse[i]) && ref_lse[i] < 0 && hlse[i] < 0) continue;
            double e = fabs((double)hlse[i] - ref_lse[i]);
            if (!(e <= lse_err)) lse_err = isfinite(e) ? e : INFINITY;
        }
        r->err_out = den > 0 ? sqrt(num / den) : sqrt(num);
        r->err_lse = lse_err;
        r->nonfinite = bad;
        r->checked = true;
    }
    fg_block_mask_destroy(bm);
    if (dq) fgi_cu()->cuMemFree(dq);
    if (dk) fgi_cu()->cuMemFree(dk);
    if (dv) fgi_cu()->cuMemFree(dv);
    if (dout) fgi_cu()->cuMemFree(dout);
    if (dlse) fgi_cu()->cuMemFree(dlse);
    device_free(&d);
    setup_free(&s);
    free(hq), free(hk), free(hv), free(hout), free(hlse), free(ref), free(ref_lse);
    return st;
}

typedef struct inputs {
    CUdeviceptr q, k, v, out, lse;
} inputs;

static fg_status run_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const inputs *in,
                          result *r) {
    const int B = o->batch, H = o->heads, S = o->seq, D = o->head_dim;
    fg_mod *mod = NULL;
    fg_block_mask *bm = NULL;
    setup s = {0};
    device_setup d = {0};
    char cache[4096] = "";
    fg_cache_stats s0, s1;
    snprintf(r->name, sizeof r->name, "%s", c->name);
    fg_status st = load_case_mod(ctx, c, &mod);
    if (st == FG_OK) snprintf(r->mod_name, sizeof r->mod_name, "%s", fg_mod_name(mod));
    if (st == FG_OK) st = make_setup(ctx, o, c, mod, B, H, S, &s);
    if (st == FG_OK) st = device_upload(ctx, &s, &d);
    if (st == FG_OK && !fresh_cache_dir(cache, sizeof cache))
        st = fgi_error(ctx, FG_ERR_IO, "cannot create a temporary cache folder: %s", strerror(errno));
    if (st == FG_OK) st = fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, cache);
    fg_cache_forget_memory();

    /* Block mask: first build (builder compiled cold), then in-place rebuilds. */
    r->density = 1.0;
    r->bm_first_ms = r->bm_rebuild_ms = NAN; /* none without a mask_mod */
    if (st == FG_OK && fg_mod_has_mask(mod)) {
        fg_block_mask_desc desc = {mod_uses(mod, "b") ? B : 1, mod_uses(mod, "h") ? H : 1, S, S, 128, 128};
        double t0 = wall_ms();
        st = fg_block_mask_create_gpu(ctx, mod, &desc, d.binds, d.n, NULL, &bm);
        if (st == FG_OK) st = device_sync(ctx);
        r->bm_first_ms = wall_ms() - t0;
        rebuild_arg ra = {bm, mod, d.binds, d.n};
        if (st == FG_OK) st = time_median(ctx, launch_rebuild, &ra, o->warmup, o->iters, &r->bm_rebuild_ms);
        double sparsity = 0;
        if (st == FG_OK) st = fg_block_mask_download(ctx, bm);
        if (st == FG_OK) st = fg_block_mask_sparsity(bm, &sparsity);
        r->density = 1.0 - sparsity;
    }

    /* First calls: cold (empty disk cache), then from disk, then a memory hit. */
    fwd_arg fa;
    memset(&fa, 0, sizeof fa);
    fa.mod = mod;
    fg_attention_args *a = &fa.args;
    a->batch = B, a->heads_q = a->heads_kv = H, a->q_len = a->kv_len = S, a->head_dim = D;
    a->dtype = o->dtype;
    a->q = (const void *)(uintptr_t)in->q, a->k = (const void *)(uintptr_t)in->k;
    a->v = (const void *)(uintptr_t)in->v, a->out = (void *)(uintptr_t)in->out;
    a->lse = (float *)(uintptr_t)in->lse;
    a->block_mask = bm, a->binds = d.binds, a->nbinds = d.n;
    if (st == FG_OK) {
        fg_cache_get_stats(&s0);
        double t0 = wall_ms();
        st = fg_attention_forward(ctx, mod, a);
        if (st == FG_OK) st = device_sync(ctx);
        r->cold_ms = wall_ms() - t0;
        fg_cache_get_stats(&s1);
        r->nvrtc_ms = s1.compile_ms - s0.compile_ms;
    }
    if (st == FG_OK) {
        fg_cache_forget_memory();
        fg_cache_get_stats(&s0);
        double t0 = wall_ms();
        st = fg_attention_forward(ctx, mod, a);
        if (st == FG_OK) st = device_sync(ctx);
        r->disk_ms = wall_ms() - t0;
        fg_cache_get_stats(&s1);
        r->disk_load_ms = s1.load_ms - s0.load_ms;
    }
    if (st == FG_OK) {
        fg_kernel_config cfg = {FG_KERNEL_ATTENTION_FWD, o->dtype, D, 0, 0, NULL}; /* as forward asks */
        fg_kernel *k = NULL;
        st = fg_kernel_get(ctx, mod, &cfg, &k);
        r->kernel = fg_kernel_kind_of(k) == FG_KERNEL_ATTENTION_FWD_SM90 ? "sm90" : "portable";
        fg_kernel_release(k);
        const int n = 1000;
        double t0 = wall_ms();
        for (int i = 0; st == FG_OK && i < n; i++) {
            st = fg_kernel_get(ctx, mod, &cfg, &k);
            fg_kernel_release(k);
        }
        r->mem_hit_us = (wall_ms() - t0) * 1e3 / n;
    }

    /* Forward speed. */
    if (st == FG_OK) st = time_median(ctx, launch_forward, &fa, o->warmup, o->iters, &r->fwd_ms);
    if (st == FG_OK)
        r->tflops = 4.0 * B * H * (double)S * S * D * r->density / (r->fwd_ms * 1e-3) / 1e12;

    fg_block_mask_destroy(bm);
    device_free(&d);
    setup_free(&s);
    if (st == FG_OK && o->check) st = check_case(ctx, o, c, mod, r);
    if (st != FG_OK) { /* report now: the cleanup below may clear the error */
        snprintf(r->failure, sizeof r->failure, "%s: %s", fg_status_string(st), fg_errmsg(ctx));
        fg_cli_fail(ctx, st, r->name);
    }
    if (cache[0]) remove_cache_dir(cache);
    fg_ctx_set_string(ctx, FG_OPT_CACHE_DIR, NULL);
    fg_mod_destroy(mod);
    return st;
}

/* ------------------------------------------------------------------------- */
/* Output                                                                     */
/* ------------------------------------------------------------------------- */

static void print_table(FILE *f, const result *r, int n) {
    fprintf(f, "%-16s %7s %9s %8s %10s %10s %9s %8s %9s %8s %9s %9s %5s %8s\n", "mod", "density", "fwd ms",
            "TFLOP/s", "bm rebuild", "bm first", "1st cold", "nvrtc", "1st disk", "mem hit", "err out",
            "err lse", "nan", "kernel");
    fprintf(f, "%-16s %7s %9s %8s %10s %10s %9s %8s %9s %8s %9s %9s %5s %8s\n", "", "", "", "", "ms", "ms", "ms",
            "ms", "ms", "us", "", "", "", "");
    for (int i = 0; i < n; i++) {
        if (r[i].failure[0]) {
            fprintf(f, "%-16s FAILED: %s\n", r[i].name, r[i].failure);
            continue;
        }
        char rebuild[32] = "-", first[32] = "-";
        if (!isnan(r[i].bm_rebuild_ms)) snprintf(rebuild, sizeof rebuild, "%.4f", r[i].bm_rebuild_ms);
        if (!isnan(r[i].bm_first_ms)) snprintf(first, sizeof first, "%.1f", r[i].bm_first_ms);
        fprintf(f, "%-16s %7.3f %9.3f %8.1f %10s %10s %9.1f %8.1f %9.2f %8.2f", r[i].name, r[i].density,
                r[i].fwd_ms, r[i].tflops, rebuild, first, r[i].cold_ms, r[i].nvrtc_ms, r[i].disk_ms,
                r[i].mem_hit_us);
        if (r[i].checked) fprintf(f, " %9.2e %9.2e %5ld", r[i].err_out, r[i].err_lse, r[i].nonfinite);
        else fprintf(f, " %9s %9s %5s", "-", "-", "-");
        fprintf(f, " %8s\n", r[i].kernel ? r[i].kernel : "-");
    }
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

static void write_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                       const result *r, int n) {
    char date[64];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f, "{\n \"meta\": {\"date\": \"%s\", \"command\": \"flexgen", date);
    for (int i = 0; i < argc; i++) { /* the words, JSON-escaped, inside one string */
        fputc(' ', f);
        for (const char *c = argv[i]; *c; c++) {
            unsigned char ch = (unsigned char)*c;
            if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
            else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
            else fputc(ch, f);
        }
    }
    fputs("\", \"device\": ", f);
    json_str(f, device);
    fprintf(f, ", \"flexgen\": \"%s\", \"shape\": {\"B\": %d, \"H\": %d, \"S\": %d, \"D\": %d}, "
               "\"dtype\": \"%s\", \"warmup\": %d, \"iters\": %d,\n  \"flops\": "
               "\"4*B*H*S*S*D*density, density = 1 - block sparsity\"},\n \"rows\": [",
            fg_version_string(), o->batch, o->heads, o->seq, o->head_dim, o->dtype == FG_BF16 ? "bf16" : "fp16",
            o->warmup, o->iters);
    for (int i = 0; i < n; i++) {
        const result *x = &r[i];
        fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
        json_str(f, x->name);
        fputs(", \"mod\": ", f);
        json_str(f, x->mod_name);
        if (x->failure[0]) {
            fputs(", \"failure\": ", f);
            json_str(f, x->failure);
            fputs("}", f);
            continue;
        }
        const struct { const char *k; double v; } nums[] = {
            {"density", x->density},         {"fwd_ms", x->fwd_ms},
            {"tflops", x->tflops},           {"block_mask_rebuild_ms", x->bm_rebuild_ms},
            {"block_mask_first_ms", x->bm_first_ms}, {"first_call_cold_ms", x->cold_ms},
            {"nvrtc_compile_ms", x->nvrtc_ms}, {"first_call_disk_ms", x->disk_ms},
            {"disk_load_ms", x->disk_load_ms}, {"memory_hit_us", x->mem_hit_us},
        };
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            fprintf(f, ", \"%s\": ", nums[k].k);
            json_num(f, nums[k].v);
        }
        if (x->kernel) fprintf(f, ", \"kernel\": \"%s\"", x->kernel);
        if (x->checked) {
            fputs(", \"error_out\": ", f);
            json_num(f, x->err_out);
            fputs(", \"error_lse\": ", f);
            json_num(f, x->err_lse);
            fprintf(f, ", \"nonfinite\": %ld", x->nonfinite);
        }
        fputs("}", f);
    }
    fputs("\n ]\n}\n", f);
}

/* ------------------------------------------------------------------------- */

static fg_status alloc_inputs(fg_ctx *ctx, const bench_opts *o, inputs *in) {
    size_t n = (size_t)o->batch * o->heads * o->seq * o->head_dim;
    memset(in, 0, sizeof *in);
    for (int t = 0; t < 3; t++) {
        uint16_t *h = random_halves(n, o->dtype, 1 + (uint64_t)t);
        if (!h) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the inputs");
        CUdeviceptr *p = t == 0 ? &in->q : t == 1 ? &in->k : &in->v;
        fg_status st = upload_halves(ctx, h, n, p);
        free(h);
        FGI_TRY(st);
    }
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->out, n * 2), "cuMemAlloc");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&in->lse, sizeof(float) * (size_t)o->batch * o->heads * o->seq),
               "cuMemAlloc");
    return FG_OK;
}

static void free_inputs(const inputs *in) {
    const CUdeviceptr p[] = {in->q, in->k, in->v, in->out, in->lse};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (p[i]) fgi_cu()->cuMemFree(p[i]);
}

int fg_cmd_bench(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.batch = 4, o.heads = 16, o.seq = 8192, o.head_dim = 128, o.dtype = FG_BF16;
    o.warmup = 5, o.iters = 30, o.check = true;
    char *owned[MAX_CASES] = {0};
    int nowned = 0;
    int rc = parse_opts(argc, argv, &o, owned, &nowned);
    if (rc != 0) {
        for (int i = 0; i < nowned; i++) free(owned[i]);
        return rc < 0 ? 0 : rc;
    }
    fg_ctx *ctx = NULL;
    result *res = calloc((size_t)o.ncases, sizeof *res);
    if (!res || fg_ctx_create(&ctx) != FG_OK) {
        free(res);
        for (int i = 0; i < nowned; i++) free(owned[i]);
        return fg_cli_error(FG_EXIT_OTHER, "out of memory");
    }
    fg_status st = fgi_cuda_ready(ctx);
    char device[256] = "unknown device";
    inputs in = {0};
    bool cuda_ok = st == FG_OK;
    if (st == FG_OK) {
        CUdevice dev;
        if (fgi_cu()->cuCtxGetDevice(&dev) == CUDA_SUCCESS) fgi_cu()->cuDeviceGetName(device, sizeof device, dev);
        printf("# flexgen %s bench on %s: B=%d H=%d S=%d D=%d %s, %d warm-up + %d timed launches\n",
               fg_version_string(), device, o.batch, o.heads, o.seq, o.head_dim,
               o.dtype == FG_BF16 ? "bf16" : "fp16", o.warmup, o.iters);
        fflush(stdout);
        st = alloc_inputs(ctx, &o, &in);
    }
    if (st != FG_OK) {
        rc = fg_cli_fail(ctx, st, "bench");
    } else {
        for (int i = 0; i < o.ncases; i++) {
            fg_status cs = run_case(ctx, &o, &o.cases[i], &in, &res[i]);
            if (cs != FG_OK && rc == 0) rc = fg_cli_exit_code(cs);
        }
        print_table(stdout, res, o.ncases);
        if (o.json) {
            FILE *f = strcmp(o.json, "-") == 0 ? stdout : fopen(o.json, "w");
            if (!f) {
                rc = fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s: %s", o.json, strerror(errno));
            } else {
                write_json(f, &o, argc, argv, device, res, o.ncases);
                if (f != stdout && fclose(f) != 0)
                    rc = fg_cli_error(FG_EXIT_OTHER, "bench: cannot write %s", o.json);
            }
        }
    }
    if (cuda_ok) free_inputs(&in);
    free(res);
    fg_ctx_destroy(ctx);
    for (int i = 0; i < nowned; i++) free(owned[i]);
    return rc;
}
