/*
 * context_parallel.c -- one long sequence's attention over several GPUs:
 * ring attention with fg_attention_forward_cp, one process per GPU.
 *
 *   context_parallel [options]                         start one rank per GPU
 *   context_parallel --rank R --world N --id-file PATH [options]   one rank
 *
 * The sequence's rows are cut into shards, one per rank (fg_cp_shard_rows).
 * Each rank keeps the queries of its shard and computes their attention
 * over the whole sequence: its K/V shard travels round a ring of the ranks
 * (NCCL send / receive) while every rank computes its queries against the
 * shard it holds, and the partial results merge exactly by their
 * log-sum-exps. The mods see global positions, so a causal mask or a
 * window means what it means on one GPU. docs/context_parallel.md has the
 * design.
 *
 * Layouts (--layout). contiguous: rank r holds the r-th of N consecutive
 * chunks. zigzag (the default): the sequence is cut into 2N chunks and rank
 * r holds chunks r and 2N-1-r, back to back in its buffers. Under a causal
 * mask a late row keeps more keys than an early one, so contiguous chunks
 * give the last rank 2N-1 times the first one's work, and since every ring
 * step waits for the slowest rank, the ring runs at its pace; zig-zag pairs
 * an early chunk with a late one and every rank does the same work. The CPU part
 * below prints each rank's share of the work under both layouts.
 *
 * Processes. NCCL wants one process (or one thread) per GPU, with all the
 * ranks' calls in flight together. Without --rank, this program is its own
 * launcher: it starts --world N copies of itself (fork + exec, so that no
 * CUDA state crosses a fork), rank i with `--rank i --world N --id-file F`,
 * waits for them and fails when any of them fails. A failed rank leaves its
 * peers blocked inside NCCL, which has no timeout of its own, so the
 * launcher then stops the others; it also stops all of them after
 * --timeout seconds. A job launcher (srun, mpirun, a script) can start the
 * ranks itself with the same three options; --device picks the GPU when it
 * is not the rank (several nodes: the local rank).
 *
 * Rendezvous. The ranks of a communicator must agree on one ncclUniqueId
 * (128 bytes), which only rank 0 can make. Rank 0 writes it to the id file
 * (a temporary file renamed into place, so a reader never sees half of
 * it); the other ranks wait for the file to appear. Rank 0 removes the file
 * once the communicator is up, since every rank has read it by then; an id
 * file left over from a run that failed earlier would send ranks to a
 * communicator that no longer exists, so give each run a fresh path.
 *
 * Each rank:
 *   - makes its device's primary context current before anything else:
 *     NCCL's communicator belongs to the device current at
 *     ncclCommInitRank, and flexgen adopts the context that is current, so
 *     both use the same device (the context's FG_OPT_DEVICE is set to it
 *     too: fg_attention_forward_cp checks that the communicator is on it);
 *   - fills q, k and v from a generator keyed on the GLOBAL position of
 *     each row, so every rank knows any row of the sequence without
 *     exchanging data: its own shard for the GPU, and the whole sequence's
 *     k and v on the host for the check;
 *   - calls fg_attention_forward_cp once (compiling the kernels or loading
 *     them from the disk cache), then --iters times without a plan (each
 *     call builds the block mask of every chunk pair and synchronises
 *     twice) and --iters times with a plan made once (fg_cp_plan_create),
 *     the figure it reports. The time is wall-clock time over the calls
 *     and a final synchronisation, and a rank's time is the ring's time:
 *     the ranks wait for each other at every step. The TFLOP/s are
 *     the whole sequence's FLOPs (counted over its non-empty blocks, as
 *     FlexAttention counts them) over that time;
 *   - poisons out and lse (0xFF bytes: NaN), runs once more and checks:
 *     every output finite, and 8 rows of every chunk, all heads, against
 *     fg_attention_reference (float64 on the CPU) of that row at its
 *     global position against all keys of the sequence, within the bf16
 *     forward's tolerance.
 *
 * Options: --world N (default: every visible GPU, at most 8; the GPU part
 * needs 2 or more), --mask FILE (a mod file such as mods/sliding_window.c;
 * default causal), --set NAME=VALUE (a scalar parameter of the mod),
 * --layout zigzag|contiguous, --seq S (global length, 65536), --heads H
 * (16), --kv-heads H (= heads), --head-dim D (128), --iters N (10),
 * --timeout SECONDS (600), --device D (= rank). Mods with buffer
 * parameters are not taken here (tests/gpu_cp.c runs them). --world 1 runs
 * the same path on one GPU: the baseline for a scaling efficiency.
 *
 * Exit status: 0 when every rank's check passes, or when the GPU part
 * cannot run here (no GPU: "no CUDA device: skipping the GPU part"; one
 * GPU or no NCCL: "skipping ..."); 2 for a usage error; 1 otherwise.
 *
 * NCCL is opened with dlopen ($FLEXGEN_NCCL_LIB, else libnccl.so.2), the
 * file flexgen opens, so the communicator made here is one flexgen's NCCL
 * understands; its few types are declared here by their ABI. NVLink
 * multicast (NVLS) is switched off unless the environment says otherwise
 * (NCCL_NVLS_ENABLE=0).
 *
 * Build: cc context_parallel.c $(pkg-config --cflags --libs flexgen) -ldl -lm
 */
#include "example_util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum {
    MAX_SET = 16,       /* --set options                                    */
    MAX_WORLD = 64,     /* fg_cp_shard_rows's limit                         */
    DEFAULT_WORLD = 8,  /* the launcher's cap: one machine's GPUs           */
    CHUNK_UNIT = 128,   /* chunks are cut in units of the kernels' block    */
    CHECK_ROWS = 8,     /* rows of each chunk checked against the reference */
};

/* The default mask, as mods/causal.c. */
static const char *const CAUSAL_SOURCE =
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return q_idx >= kv_idx;\n"
    "}\n";

typedef struct options {
    int world, rank, device;  /* world 0: not given; rank -1: the launcher */
    const char *id_file, *mask;
    const char *set_name[MAX_SET], *set_value[MAX_SET];
    int nset;
    fg_cp_layout layout;
    int64_t seq;
    int heads, kv_heads, head_dim, iters;
    double timeout_s;
} options;

/* "[rank 3] " before a rank's lines; "" in the launcher. */
static char tag[32] = "";

static void usage(void) {
    fprintf(stderr,
            "usage: context_parallel [--world N] [options]\n"
            "       context_parallel --rank R --world N --id-file PATH [--device D] [options]\n"
            "options: --mask FILE --set NAME=VALUE --layout zigzag|contiguous --seq S --heads H\n"
            "         --kv-heads H --head-dim D --iters N --timeout SECONDS\n");
}

static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
    int64_t v;
    if (!parse_i64(s, lo, hi, &v)) return 0;
    *out = (int)v;
    return 1;
}

/* Later options override earlier ones, so the launcher can append a
 * rank's own to the command line it was given. 1: run, 0: usage error,
 * -1: --help. */
static int parse_options(int argc, char **argv, options *o) {
    memset(o, 0, sizeof *o);
    o->rank = o->device = -1;
    o->layout = FG_CP_ZIGZAG;
    o->seq = 65536;
    o->heads = 16;
    o->head_dim = 128;
    o->iters = 10;
    o->timeout_s = 600;
    for (int i = 1; i < argc; i += 2) { /* every option but --help takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = v != NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return -1;
        else if (!strcmp(a, "--world")) ok = ok && parse_int(v, 1, MAX_WORLD, &o->world);
        else if (!strcmp(a, "--rank")) ok = ok && parse_int(v, 0, MAX_WORLD - 1, &o->rank);
        else if (!strcmp(a, "--device")) ok = ok && parse_int(v, 0, 1023, &o->device);
        else if (!strcmp(a, "--id-file")) o->id_file = v;
        else if (!strcmp(a, "--mask")) o->mask = v;
        else if (!strcmp(a, "--seq")) ok = ok && parse_i64(v, 1, INT32_MAX, &o->seq);
        else if (!strcmp(a, "--heads")) ok = ok && parse_int(v, 1, 1024, &o->heads);
        else if (!strcmp(a, "--kv-heads")) ok = ok && parse_int(v, 1, 1024, &o->kv_heads);
        else if (!strcmp(a, "--head-dim")) ok = ok && parse_int(v, 16, 256, &o->head_dim);
        else if (!strcmp(a, "--iters")) ok = ok && parse_int(v, 1, 100000, &o->iters);
        else if (!strcmp(a, "--timeout")) {
            int t = 0;
            ok = ok && parse_int(v, 1, 86400, &t);
            o->timeout_s = t;
        } else if (!strcmp(a, "--layout")) {
            if (ok && !strcmp(v, "zigzag")) o->layout = FG_CP_ZIGZAG;
            else if (ok && !strcmp(v, "contiguous")) o->layout = FG_CP_CONTIGUOUS;
            else ok = 0;
        } else if (!strcmp(a, "--set")) {
            const char *eq = ok ? strchr(v, '=') : NULL;
            ok = eq && eq > v && o->nset < MAX_SET;
            if (ok) {
                /* The name is kept as its own string for the bindings. */
                o->set_name[o->nset] = strndup(v, (size_t)(eq - v));
                o->set_value[o->nset] = eq + 1;
                ok = o->set_name[o->nset++] != NULL;
            }
        } else {
            ok = 0;
        }
        if (!ok) {
            fprintf(stderr, "context_parallel: bad argument near '%s'\n", a);
            return 0;
        }
    }
    if (!o->kv_heads) o->kv_heads = o->heads;
    if (o->heads % o->kv_heads) {
        fprintf(stderr, "context_parallel: --heads %d is not a multiple of --kv-heads %d\n", o->heads,
                o->kv_heads);
        return 0;
    }
    if (o->rank >= 0 && (!o->world || !o->id_file || o->rank >= o->world)) {
        fprintf(stderr, "context_parallel: --rank R needs --world N (R < N) and --id-file PATH\n");
        return 0;
    }
    if (o->device < 0) o->device = o->rank > 0 ? o->rank : 0;
    return 1;
}

static const char *layout_name(fg_cp_layout layout) {
    return layout == FG_CP_ZIGZAG ? "zig-zag" : "contiguous";
}

/* ------------------------------------------------------------------------- */
/* The mod and its scalar parameters                                         */
/* ------------------------------------------------------------------------- */

static fg_status load_mod(fg_ctx *ctx, const options *o, fg_mod **mod) {
    if (o->mask) return fg_mod_from_file(ctx, o->mask, mod);
    return fg_mod_from_source(ctx, "causal.c", CAUSAL_SOURCE, (size_t)-1, mod);
}

/* Bindings for the scalars given with --set (the others keep their
 * defaults). Scalars are passed by value, so the same bindings serve the
 * CPU and the GPU. Returns 0 with a message for an unknown name or a mod
 * with buffer parameters. */
static int make_bindings(const fg_mod *mod, const options *o, fg_binding *binds, size_t cap,
                         size_t *nbinds, int verbose) {
    *nbinds = 0;
    if (fg_mod_param_count(mod) > cap) {
        fprintf(stderr, "%sthe mod has more than %zu parameters\n", tag, cap);
        return 0;
    }
    for (int i = 0; i < o->nset; i++) {
        int found = 0;
        for (size_t j = 0; j < fg_mod_param_count(mod); j++) {
            fg_param_info p;
            if (fg_mod_param(mod, j, &p) == FG_OK && !strcmp(p.name, o->set_name[i])) found = 1;
        }
        if (!found) {
            fprintf(stderr, "%s--set %s: the mod has no parameter of that name\n", tag, o->set_name[i]);
            return 0;
        }
    }
    for (size_t j = 0; j < fg_mod_param_count(mod); j++) {
        fg_param_info p;
        if (fg_mod_param(mod, j, &p) != FG_OK) return 0;
        if (p.kind == FG_PARAM_BUFFER) {
            fprintf(stderr,
                    "%sbuffer parameter '%s': this example binds no buffers (tests/gpu_cp.c runs "
                    "document, alibi and the other buffer mods over the ring)\n",
                    tag, p.name);
            return 0;
        }
        const char *given = NULL;
        for (int i = 0; i < o->nset; i++)
            if (!strcmp(o->set_name[i], p.name)) given = o->set_value[i];
        char *end = NULL;
        double v = given ? strtod(given, &end) : p.default_value;
        if (given && (end == given || *end)) {
            fprintf(stderr, "%s--set %s=%s: not a number\n", tag, p.name, given);
            return 0;
        }
        if (verbose)
            printf("parameter %s: %s = %g%s\n", p.name, p.type == FG_TYPE_INT ? "int" : "float", v,
                   given ? "" : " (default)");
        binds[(*nbinds)++] = p.type == FG_TYPE_INT ? fg_bind_int(p.name, (int32_t)v)
                                                   : fg_bind_float(p.name, (float)v);
    }
    return 1;
}

/* ------------------------------------------------------------------------- */
/* The CPU part: the shard plan and each rank's share of the work            */
/* ------------------------------------------------------------------------- */

/* Every chunk must hold rows: the layout cuts S into world (contiguous) or
 * 2 * world (zig-zag) chunks of whole 128-row units. */
static int64_t min_seq(fg_cp_layout layout, int world) {
    return (int64_t)CHUNK_UNIT * (layout == FG_CP_ZIGZAG ? 2 * world : world);
}

/* The (query, key) pairs each rank's rows keep, estimated: mask_mod
 * evaluated against every key of the sequence at evenly spaced rows of
 * each chunk (b = h = 0), scaled to the chunk's rows. A few dozen rows per
 * chunk give the shares to a fraction of a percent for masks that change
 * smoothly along the sequence, at a cost of rows x S evaluations. */
static fg_status estimate_pairs(fg_ctx *ctx, const fg_mod *mod, const fg_binding *binds, size_t nbinds,
                                fg_cp_layout layout, int world, int64_t S, double *pairs) {
    uint8_t *keep = malloc((size_t)S);
    if (!keep) return FG_ERR_OUT_OF_MEMORY;
    int64_t per_chunk = ((int64_t)1 << 24) / S;
    per_chunk = per_chunk < 4 ? 4 : per_chunk > 64 ? 64 : per_chunk;
    fg_status st = FG_OK;
    for (int r = 0; r < world && st == FG_OK; r++) {
        int64_t start[2], len[2];
        int nchunks = 0;
        pairs[r] = 0;
        st = fg_cp_shard_rows(layout, world, r, S, start, len, &nchunks);
        for (int c = 0; c < nchunks && st == FG_OK; c++) {
            int64_t n = len[c] < per_chunk ? len[c] : per_chunk, kept = 0;
            for (int64_t i = 0; i < n && st == FG_OK; i++) {
                int64_t row = start[c] + len[c] * (2 * i + 1) / (2 * n); /* middles of n slices */
                st = fg_mod_eval_mask(ctx, mod, binds, nbinds, 0, 0, (int)row, 1, 0, (int)S, keep);
                for (int64_t j = 0; j < S && st == FG_OK; j++) kept += keep[j];
            }
            if (n) pairs[r] += (double)len[c] * (double)kept / (double)n;
        }
    }
    free(keep);
    return st;
}

/* The busiest rank's share of the kept pairs, in percent. */
static double busiest_share(const double *pairs, int world) {
    double total = 0, most = 0;
    for (int r = 0; r < world; r++) {
        total += pairs[r];
        if (pairs[r] > most) most = pairs[r];
    }
    return total > 0 ? 100.0 * most / total : 0.0;
}

static int show_plan(fg_ctx *ctx, const fg_mod *mod, const options *o, const fg_binding *binds,
                     size_t nbinds, int world) {
    int rc = 1;
    double pairs[MAX_WORLD], other[MAX_WORLD], total = 0;
    const fg_cp_layout other_layout = o->layout == FG_CP_ZIGZAG ? FG_CP_CONTIGUOUS : FG_CP_ZIGZAG;
    printf("shard plan: S=%lld rows over %d ranks, %s (chunks in units of %d rows)\n",
           (long long)o->seq, world, layout_name(o->layout), CHUNK_UNIT);
    EX_TRY(ctx, estimate_pairs(ctx, mod, binds, nbinds, o->layout, world, o->seq, pairs));
    EX_TRY(ctx, estimate_pairs(ctx, mod, binds, nbinds, other_layout, world, o->seq, other));
    for (int r = 0; r < world; r++) total += pairs[r];
    for (int r = 0; r < world; r++) {
        int64_t start[2], len[2];
        int nchunks = 0;
        char rows[128];
        EX_TRY(ctx, fg_cp_shard_rows(o->layout, world, r, o->seq, start, len, &nchunks));
        int at = snprintf(rows, sizeof rows, "%lld..%lld", (long long)start[0],
                          (long long)(start[0] + len[0] - 1));
        if (nchunks == 2 && at > 0 && (size_t)at < sizeof rows)
            snprintf(rows + at, sizeof rows - (size_t)at, " + %lld..%lld", (long long)start[1],
                     (long long)(start[1] + len[1] - 1));
        printf("  rank %2d: rows %-34s (%lld rows), %5.1f%% of the kept (query, key) pairs\n", r, rows,
               (long long)(len[0] + (nchunks == 2 ? len[1] : 0)), total > 0 ? 100 * pairs[r] / total : 0.0);
    }
    printf("busiest rank: %.1f%% of the work (%.1f%% would be even); %s would give %.1f%%\n",
           busiest_share(pairs, world), 100.0 / world, layout_name(other_layout),
           busiest_share(other, world));
    printf("(pairs estimated from mask_mod at b = h = 0, evaluated against every key at a few rows "
           "of each chunk; every ring step waits for the busiest rank)\n");
    rc = 0;
done:
    return rc;
}

/* ------------------------------------------------------------------------- */
/* The driver and NCCL                                                       */
/* ------------------------------------------------------------------------- */

/* Make `device`'s primary context current on this thread: the context
 * NCCL's communicator and flexgen's calls will both use. */
static int gpu_select(int device) {
    int dev = 0;
    void *cuctx = NULL;
    int r = ex_cu.cuDeviceGet(&dev, device);
    if (r == 0) r = ex_cu.cuDevicePrimaryCtxRetain(&cuctx, dev);
    if (r == 0) r = ex_cu.cuCtxSetCurrent(cuctx);
    if (r != 0) {
        fprintf(stderr, "%sdevice %d: %s\n", tag, device, ex_cuda_error_name(r));
        return 0;
    }
    if (ex_cu.cuDeviceGetName(ex_cu.device_name, (int)sizeof ex_cu.device_name, dev) != 0)
        snprintf(ex_cu.device_name, sizeof ex_cu.device_name, "device %d", device);
    ex_cu.ok = 1;
    return 1;
}

/* nccl.h's types by their ABI: ncclUniqueId is a struct of
 * NCCL_UNIQUE_ID_BYTES (128) chars, passed by value; ncclComm_t is a
 * pointer; ncclResult_t is an enum whose ncclSuccess is 0. */
typedef struct nccl_id {
    char internal[128];
} nccl_id;

typedef struct nccl_api {
    void *lib;
    char why[512];
    int (*GetVersion)(int *);
    int (*GetUniqueId)(nccl_id *);
    int (*CommInitRank)(void **comm, int nranks, nccl_id id, int rank);
    int (*CommDestroy)(void *comm);
    int (*CommAbort)(void *comm);             /* optional                  */
    const char *(*GetErrorString)(int);
    const char *(*GetLastError)(void *comm);  /* optional: NCCL 2.13 and on */
} nccl_api;

static nccl_api nccl;

/* The file flexgen opens: $FLEXGEN_NCCL_LIB, else libnccl.so.2, else
 * libnccl.so. dlopen of the same file returns the same handle, so the
 * communicator made here and the library's NCCL calls share one copy of
 * NCCL. */
static int nccl_open(void) {
    if (nccl.lib) return 1;
    const char *path = getenv("FLEXGEN_NCCL_LIB");
    void *lib = NULL;
    if (path && *path) {
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    } else {
        path = "libnccl.so.2";
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib && (lib = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL)) != NULL) path = "libnccl.so";
    }
    if (!lib) {
        const char *why = dlerror();
        snprintf(nccl.why, sizeof nccl.why,
                 "%s could not be opened (%s); set FLEXGEN_NCCL_LIB to NCCL's libnccl.so.2", path,
                 why ? why : "no reason given");
        return 0;
    }
    struct nccl_sym { void **slot; const char *name; } syms[] = {
        {(void **)&nccl.GetVersion, "ncclGetVersion"},
        {(void **)&nccl.GetUniqueId, "ncclGetUniqueId"},
        {(void **)&nccl.CommInitRank, "ncclCommInitRank"},
        {(void **)&nccl.CommDestroy, "ncclCommDestroy"},
        {(void **)&nccl.GetErrorString, "ncclGetErrorString"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(nccl.why, sizeof nccl.why, "%s lacks %s", path, syms[i].name);
            dlclose(lib);
            return 0;
        }
    }
    *(void **)&nccl.CommAbort = dlsym(lib, "ncclCommAbort");
    *(void **)&nccl.GetLastError = dlsym(lib, "ncclGetLastError");
    nccl.lib = lib;
    return 1;
}

static int nccl_ok(int r, const char *what, void *comm) {
    if (r == 0) return 1;
    const char *detail = nccl.GetLastError ? nccl.GetLastError(comm) : NULL;
    fprintf(stderr, "%s%s: %s%s%s\n", tag, what, nccl.GetErrorString(r), detail && *detail ? ": " : "",
            detail ? detail : "");
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Rendezvous through the id file                                            */
/* ------------------------------------------------------------------------- */

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Write the id beside `path` and rename it into place: a reader sees no
 * file or the whole id. */
static int write_id(const char *path, const nccl_id *id) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= (int)sizeof tmp) return 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600); /* the id lets anyone join: keep it private */
    if (fd < 0) {
        fprintf(stderr, "%s%s: %s\n", tag, tmp, strerror(errno));
        return 0;
    }
    ssize_t n = write(fd, id, sizeof *id);
    /* fsync: ranks on other nodes may read it over a shared file system. */
    int ok = n == (ssize_t)sizeof *id && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        fprintf(stderr, "%swriting %s: %s\n", tag, path, strerror(errno));
        unlink(tmp);
    }
    return ok;
}

static int read_id(const char *path, nccl_id *id, double timeout_s) {
    const double t0 = ex_now_ms();
    for (;;) {
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            ssize_t n = read(fd, id, sizeof *id);
            close(fd);
            if (n == (ssize_t)sizeof *id) return 1;
        }
        if (ex_now_ms() - t0 > timeout_s * 1e3) {
            fprintf(stderr,
                    "%sno NCCL id in %s after %.0f s: is rank 0 running, with the same --id-file? "
                    "(--timeout sets the wait)\n",
                    tag, path, timeout_s);
            return 0;
        }
        sleep_ms(20);
    }
}

/* ------------------------------------------------------------------------- */
/* Inputs keyed on global positions                                          */
/* ------------------------------------------------------------------------- */

enum { TENSOR_Q = 1, TENSOR_K = 2, TENSOR_V = 3 };

/* splitmix64's finaliser: a good 64-bit mix in a few operations. */
static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Row `pos` of head h of batch b of a tensor: D bf16 values uniform in
 * [-1, 1), the same on every rank and every run. */
static void fill_row(uint16_t *dst, int tensor, int b, int h, int64_t pos, int D) {
    uint64_t key = mix64(mix64(mix64((uint64_t)tensor) ^ (uint64_t)b) ^ (uint64_t)h) ^ (uint64_t)pos;
    key = mix64(key);
    for (int d = 0; d < D; d++) {
        uint64_t x = mix64(key + (uint64_t)d);
        dst[d] = ex_bf16((float)((double)(x >> 11) * (2.0 / 9007199254740992.0) - 1.0));
    }
}

/* ------------------------------------------------------------------------- */
/* One rank                                                                  */
/* ------------------------------------------------------------------------- */

enum { BATCH = 1 };

/* A flexgen failure inside a rank, with the rank's tag. Unlike
 * ex_report, FG_ERR_NO_DEVICE is a failure here: the rank has found its
 * device already, so losing it is no reason to skip. */
static void rank_report(fg_ctx *ctx, fg_status st, const char *what) {
    fprintf(stderr, "%s%s failed: %s\n", tag, what, fg_status_string(st));
    if (ctx) {
        fprintf(stderr, "%s%s\n", tag, fg_error_diagnostic(ctx));
        if (st == FG_ERR_COMPILE) fprintf(stderr, "%s\n", fg_compile_log(ctx));
    }
}

#define RANK_TRY(ctx, call)                                    \
    do {                                                       \
        fg_status rank_st_ = (call);                           \
        if (rank_st_ != FG_OK) {                               \
            rank_report((ctx), rank_st_, #call);               \
            rc = 1;                                            \
            goto done;                                         \
        }                                                      \
    } while (0)

/* The rows a rank holds: global starts and lengths of its chunks, in the
 * order they sit in its buffers. */
typedef struct shard {
    int64_t start[2], len[2];
    int nchunks, rows;
} shard;

/* Host inputs. hk and hv are the whole sequence's k and v, for the
 * reference, which needs every key; lk and lv copy the rank's rows of
 * them, and lq is made for its rows only. Layouts [B, H, rows, D]. */
static void make_inputs(const options *o, const shard *sh, uint16_t *hk, uint16_t *hv, uint16_t *lq,
                        uint16_t *lk, uint16_t *lv) {
    const int H = o->heads, HKV = o->kv_heads, D = o->head_dim, rows = sh->rows;
    const int64_t S = o->seq;
    for (int b = 0; b < BATCH; b++)
        for (int h = 0; h < HKV; h++)
            for (int64_t i = 0; i < S; i++) {
                size_t at = (((size_t)b * HKV + h) * (size_t)S + (size_t)i) * D;
                fill_row(hk + at, TENSOR_K, b, h, i, D);
                fill_row(hv + at, TENSOR_V, b, h, i, D);
            }
    for (int b = 0; b < BATCH; b++) {
        for (int h = 0; h < H; h++) {
            size_t lr = 0;
            for (int c = 0; c < sh->nchunks; c++)
                for (int64_t i = 0; i < sh->len[c]; i++, lr++)
                    fill_row(lq + (((size_t)b * H + h) * rows + lr) * D, TENSOR_Q, b, h, sh->start[c] + i, D);
        }
        for (int h = 0; h < HKV; h++) {
            size_t lr = 0;
            for (int c = 0; c < sh->nchunks; c++)
                for (int64_t i = 0; i < sh->len[c]; i++, lr++) {
                    size_t from = (((size_t)b * HKV + h) * (size_t)S + (size_t)(sh->start[c] + i)) * D;
                    size_t to = (((size_t)b * HKV + h) * rows + lr) * D;
                    memcpy(lk + to, hk + from, (size_t)D * 2);
                    memcpy(lv + to, hv + from, (size_t)D * 2);
                }
        }
    }
}

/* Up to CHECK_ROWS rows of each chunk (its first and last and evenly
 * between), all heads, against fg_attention_reference: each row's q at
 * its global position against every key of the sequence. lout and llse
 * are the rank's results, [B, H, rows, D] and [B, H, rows]. */
static fg_status check_rows(fg_ctx *ctx, const fg_mod *mod, const options *o, const fg_binding *binds,
                            size_t nbinds, const shard *sh, const uint16_t *hk, const uint16_t *hv,
                            const uint16_t *lout, const float *llse, ex_error *err, int *checked) {
    const int H = o->heads, D = o->head_dim, rows = sh->rows;
    uint16_t *sq = malloc((size_t)BATCH * H * D * 2), *sout = malloc((size_t)BATCH * H * D * 2);
    float *slse = malloc((size_t)BATCH * H * sizeof *slse);
    fg_status st = sq && sout && slse ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    fg_attention_args ref = FG_ATTENTION_ARGS_INIT;
    ref.batch = BATCH, ref.heads_q = H, ref.heads_kv = o->kv_heads, ref.q_len = 1, ref.kv_len = (int)o->seq;
    ref.head_dim = D, ref.dtype = FG_BF16, ref.q = sq, ref.k = hk, ref.v = hv, ref.out = sout;
    memset(err, 0, sizeof *err);
    *checked = 0;
    for (int c = 0, local0 = 0; c < sh->nchunks && st == FG_OK; local0 += (int)sh->len[c], c++) {
        const int n = sh->len[c] < CHECK_ROWS ? (int)sh->len[c] : CHECK_ROWS;
        for (int i = 0; i < n && st == FG_OK; i++) {
            const int in_chunk = n > 1 ? (int)((sh->len[c] - 1) * i / (n - 1)) : 0;
            const int local = local0 + in_chunk;
            const int64_t global = sh->start[c] + in_chunk;
            for (int b = 0; b < BATCH; b++)
                for (int h = 0; h < H; h++) {
                    const size_t bh = (size_t)b * H + h;
                    fill_row(sq + bh * D, TENSOR_Q, b, h, global, D);
                    memcpy(sout + bh * D, lout + (bh * rows + (size_t)local) * D, (size_t)D * 2);
                    slse[bh] = llse[bh * rows + (size_t)local];
                }
            ref.q_offset = (int)global;
            ex_error e;
            st = ex_compare_rows(ctx, mod, &ref, binds, nbinds, sout, slse, 0, 1, &e);
            if (st == FG_OK) ex_error_merge(err, &e), ++*checked;
        }
    }
    free(sq), free(sout), free(slse);
    return st;
}

static int run_rank(const options *o) {
    int rc = 1;
    const int world = o->world, rank = o->rank, H = o->heads, HKV = o->kv_heads, D = o->head_dim;
    const int64_t S = o->seq;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_block_mask *whole = NULL;
    fg_cp_plan *plan = NULL;
    fg_binding binds[64];
    size_t nbinds = 0;
    void *comm = NULL;
    int comm_ok = 0;
    uint16_t *hk = NULL, *hv = NULL, *lq = NULL, *lk = NULL, *lv = NULL, *lout = NULL;
    float *llse = NULL;
    ex_dptr q = 0, k = 0, v = 0, out = 0, lse = 0;

    snprintf(tag, sizeof tag, "[rank %d] ", rank);
    RANK_TRY(ctx, fg_ctx_create(&ctx));
    RANK_TRY(ctx, load_mod(ctx, o, &mod));
    if (!make_bindings(mod, o, binds, sizeof binds / sizeof binds[0], &nbinds, 0)) goto done;

    shard sh = {{0, 0}, {0, 0}, 0, 0};
    RANK_TRY(ctx, fg_cp_shard_rows(o->layout, world, rank, S, sh.start, sh.len, &sh.nchunks));
    EX_REQUIRE(S >= min_seq(o->layout, world), "%s--seq %lld is too short: %s over %d ranks needs %lld rows",
               tag, (long long)S, layout_name(o->layout), world, (long long)min_seq(o->layout, world));
    const int rows = sh.rows = (int)(sh.len[0] + sh.len[1]);

    /* The device first: NCCL and flexgen both take the current context. */
    int count = ex_gpu_count();
    if (!count) {
        printf("%s", tag);
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    EX_REQUIRE(o->device < count, "%s--device %d: this machine has %d CUDA devices", tag, o->device, count);
    if (!gpu_select(o->device)) goto done;
    RANK_TRY(ctx, fg_ctx_set_int(ctx, FG_OPT_DEVICE, o->device));

    /* The communicator: rank 0 makes the id, the others read it. */
    EX_REQUIRE(nccl_open(), "%sno NCCL: %s", tag, nccl.why);
    int version = 0;
    nccl.GetVersion(&version);
    /* NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9,
     * major * 1000 + minor * 100 + patch before. */
    const int vmajor = version >= 10000 ? version / 10000 : version / 1000;
    const int vminor = version >= 10000 ? version / 100 % 100 : version / 100 % 10;
    nccl_id id;
    memset(&id, 0, sizeof id);
    if (rank == 0) {
        if (!nccl_ok(nccl.GetUniqueId(&id), "ncclGetUniqueId", NULL) || !write_id(o->id_file, &id)) goto done;
    } else if (!read_id(o->id_file, &id, o->timeout_s)) {
        goto done;
    }
    double t0 = ex_now_ms();
    if (!nccl_ok(nccl.CommInitRank(&comm, world, id, rank), "ncclCommInitRank", NULL)) goto done;
    comm_ok = 1;
    /* Every rank has joined, so every rank has read the id. */
    if (rank == 0) unlink(o->id_file);
    printf("%sdevice %d (%s), NCCL %d.%d.%d, communicator up in %.0f ms; rows %lld..%lld", tag,
           o->device, ex_cu.device_name, vmajor, vminor, version % 100, ex_now_ms() - t0,
           (long long)sh.start[0], (long long)(sh.start[0] + sh.len[0] - 1));
    if (sh.nchunks == 2)
        printf(" + %lld..%lld", (long long)sh.start[1], (long long)(sh.start[1] + sh.len[1] - 1));
    printf(" (%d rows)\n", rows);

    const size_t nkv_all = (size_t)BATCH * HKV * (size_t)S * D;
    const size_t nq = (size_t)BATCH * H * rows * D, nkv = (size_t)BATCH * HKV * rows * D;
    const size_t nlse = (size_t)BATCH * H * rows;
    hk = malloc(nkv_all * 2), hv = malloc(nkv_all * 2);
    lq = malloc(nq * 2), lk = malloc(nkv * 2), lv = malloc(nkv * 2), lout = malloc(nq * 2);
    llse = malloc(nlse * sizeof *llse);
    EX_REQUIRE(hk && hv && lq && lk && lv && lout && llse, "%sout of host memory", tag);
    make_inputs(o, &sh, hk, hv, lq, lk, lv);

    q = ex_alloc(nq * 2), k = ex_alloc(nkv * 2), v = ex_alloc(nkv * 2), out = ex_alloc(nq * 2);
    lse = ex_alloc(nlse * sizeof(float));
    EX_REQUIRE(q && k && v && out && lse, "%sout of device memory", tag);
    EX_REQUIRE(ex_upload(q, lq, nq * 2) && ex_upload(k, lk, nkv * 2) && ex_upload(v, lv, nkv * 2),
               "%supload failed", tag);
    EX_REQUIRE(ex_poison(out, nq * 2) && ex_poison(lse, nlse * 4), "%smemset failed", tag);

    /* The whole sequence's block mask, for the FLOP count and this rank's
     * share of the visited blocks (its rows are whole blocks but for the
     * sequence's last one, so its q blocks are its own). */
    fg_block_mask_desc desc = FG_BLOCK_MASK_DESC_INIT;
    desc.batch = 1, desc.heads = 1, desc.q_len = desc.kv_len = (int)S;
    RANK_TRY(ctx, fg_block_mask_create_gpu(ctx, mod, &desc, binds, nbinds, NULL, &whole));
    RANK_TRY(ctx, fg_block_mask_download(ctx, whole));
    double sparsity = 0;
    const int32_t *partial = NULL, *full = NULL;
    int64_t dims[4];
    uint64_t unused;
    RANK_TRY(ctx, fg_block_mask_sparsity(whole, &sparsity));
    RANK_TRY(ctx, fg_block_mask_array_get(whole, FG_BM_KV_NUM_BLOCKS, &partial, &unused, dims));
    RANK_TRY(ctx, fg_block_mask_array_get(whole, FG_BM_FULL_KV_NUM_BLOCKS, &full, &unused, dims));
    int64_t mine = 0, all = 0;
    for (int64_t qb = 0; qb < dims[2]; qb++) all += partial[qb] + full[qb];
    for (int c = 0; c < sh.nchunks; c++) {
        const int64_t qb0 = sh.start[c] / CHUNK_UNIT;
        const int64_t qb1 = (sh.start[c] + sh.len[c] + CHUNK_UNIT - 1) / CHUNK_UNIT;
        for (int64_t qb = qb0; qb < qb1; qb++) mine += partial[qb] + full[qb];
    }
    printf("%svisits %lld of the sequence's %lld non-empty blocks (%.1f%%; %.1f%% would be even)\n", tag,
           (long long)mine, (long long)all, all ? 100.0 * (double)mine / (double)all : 0.0, 100.0 / world);
    fg_block_mask_destroy(whole); /* its device memory is the ring's now */
    whole = NULL;

    fg_attention_args a = FG_ATTENTION_ARGS_INIT;
    a.batch = BATCH, a.heads_q = H, a.heads_kv = HKV, a.q_len = a.kv_len = rows, a.head_dim = D;
    a.dtype = FG_BF16;
    a.q = ex_ptr(q), a.k = ex_ptr(k), a.v = ex_ptr(v), a.out = ex_ptr(out);
    a.lse = (float *)ex_ptr(lse);
    a.binds = binds, a.nbinds = nbinds; /* offsets and block mask: the library's, per pair */
    fg_cp_args cp = FG_CP_ARGS_INIT;
    cp.local = &a, cp.comm = comm, cp.global_len = S, cp.layout = o->layout;

    t0 = ex_now_ms();
    RANK_TRY(ctx, fg_attention_forward_cp(ctx, mod, &cp));
    EX_REQUIRE(ex_sync(), "%sthe first call failed on the GPU", tag);
    printf("%sfirst call: %.1f ms (kernels compiled or loaded, pair masks, the ring)\n", tag,
           ex_now_ms() - t0);

    /* The same calls without a plan build the ring's pair masks each time
     * (and synchronise twice); a plan made once, as a training loop would
     * keep one per mask, leaves the ring alone in the timed calls. */
    t0 = ex_now_ms();
    for (int i = 0; i < o->iters; i++) RANK_TRY(ctx, fg_attention_forward_cp(ctx, mod, &cp));
    EX_REQUIRE(ex_sync(), "%sa timed call failed on the GPU", tag);
    const double ms_no_plan = (ex_now_ms() - t0) / o->iters;
    t0 = ex_now_ms();
    RANK_TRY(ctx, fg_cp_plan_create(ctx, mod, &cp, &plan));
    printf("%splan: %.2f ms (the pair masks and the schedule, once)\n", tag, ex_now_ms() - t0);
    cp.plan = plan;
    t0 = ex_now_ms();
    for (int i = 0; i < o->iters; i++) RANK_TRY(ctx, fg_attention_forward_cp(ctx, mod, &cp));
    EX_REQUIRE(ex_sync(), "%sa timed call failed on the GPU", tag);
    const double ms = (ex_now_ms() - t0) / o->iters;
    printf("%swithout a plan: %.2f ms each\n", tag, ms_no_plan);
    fg_attention_args whole_seq = a;
    whole_seq.q_len = whole_seq.kv_len = (int)S;
    printf("%s%d calls: %.2f ms each, %.1f TFLOP/s for the whole sequence (S=%lld H=%d Hkv=%d D=%d bf16, "
           "%s, %s, %d ranks, density %.3f)\n",
           tag, o->iters, ms, ex_tflops(&whole_seq, 1.0 - sparsity, ms), (long long)S, H, HKV, D,
           fg_mod_name(mod), layout_name(o->layout), world, 1.0 - sparsity);

    /* The checked run: outputs poisoned, so nothing left unwritten passes. */
    EX_REQUIRE(ex_poison(out, nq * 2) && ex_poison(lse, nlse * 4), "%smemset failed", tag);
    RANK_TRY(ctx, fg_attention_forward_cp(ctx, mod, &cp));
    EX_REQUIRE(ex_sync() && ex_download(lout, out, nq * 2) && ex_download(llse, lse, nlse * 4),
               "%sthe checked call failed", tag);
    ex_checksum sum = ex_checksum_bf16(lout, nq);
    size_t lse_nan = 0;
    for (size_t i = 0; i < nlse; i++) lse_nan += isnan(llse[i]) != 0;
    printf("%schecksum: sum %.6f, sum|x| %.6f, non-finite outputs %zu, NaN lse %zu\n", tag, sum.sum,
           sum.abs_sum, sum.nonfinite, lse_nan);

    ex_error err;
    int checked = 0;
    t0 = ex_now_ms();
    RANK_TRY(ctx, check_rows(ctx, mod, o, binds, nbinds, &sh, hk, hv, lout, llse, &err, &checked));
    printf("%svs CPU reference (%d rows: %d of each chunk, all %d heads, each against all %lld keys, "
           "%.1f s): out rel err %.2e, lse err %.2e\n",
           tag, checked, CHECK_ROWS, H, (long long)S, (ex_now_ms() - t0) / 1e3, err.out_rel, err.lse_max);
    EX_REQUIRE(sum.nonfinite == 0 && lse_nan == 0 && ex_error_ok(&err),
               "%sFAILED: outside tolerance (out %.0e, lse %.0e) or not finite", tag, EX_BF16_OUT_TOL,
               EX_LSE_TOL);
    printf("%sOK\n", tag);
    rc = 0;

done:
    if (plan) {
        ex_sync(); /* its masks may still be read */
        fg_cp_plan_destroy(plan);
    }
    fg_block_mask_destroy(whole);
    ex_free(q), ex_free(k), ex_free(v), ex_free(out), ex_free(lse);
    /* A rank that failed may leave a transfer its peers wait for: abort
     * instead of the orderly destroy. */
    if (comm_ok) {
        if (rc == 0 || !nccl.CommAbort) nccl.CommDestroy(comm);
        else nccl.CommAbort(comm);
    }
    if (rank == 0 && rc != 0 && o->id_file) unlink(o->id_file);
    free(hk), free(hv), free(lq), free(lk), free(lv), free(lout), free(llse);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}

/* ------------------------------------------------------------------------- */
/* The launcher                                                              */
/* ------------------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    int done, status;
} child;

/* Stop the ranks still running, politely first. */
static void stop_children(child *kids, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (kids[r].pid > 0 && !kids[r].done) kill(kids[r].pid, sig);
}

/* Start one rank: this program again, with the launcher's arguments and
 * the rank's own after them. */
static pid_t start_rank(int argc, char **argv, int rank, int world, const char *id_file) {
    char rank_s[16], world_s[16], self[4096];
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    snprintf(world_s, sizeof world_s, "%d", world);
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) self[n] = '\0';
    else snprintf(self, sizeof self, "%s", argv[0]);
    char **args = calloc((size_t)argc + 7, sizeof *args);
    if (!args) return -1;
    for (int i = 0; i < argc; i++) args[i] = argv[i];
    char opt_rank[] = "--rank", opt_world[] = "--world", opt_id[] = "--id-file";
    args[argc] = opt_rank, args[argc + 1] = rank_s;
    args[argc + 2] = opt_world, args[argc + 3] = world_s;
    args[argc + 4] = opt_id, args[argc + 5] = (char *)id_file;
    fflush(NULL); /* nothing buffered may be written twice */
    const pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* The rank ends with the launcher, however that ends (a test
         * harness's timeout, a kill): a rank left alone would wait in NCCL
         * for peers that are gone. The setting survives exec. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != launcher) _exit(1);
        execv(self, args);
        fprintf(stderr, "[rank %d] cannot start %s: %s\n", rank, self, strerror(errno));
        _exit(127);
    }
    if (pid < 0) fprintf(stderr, "fork: %s\n", strerror(errno));
    free(args);
    return pid;
}

static int run_ranks(int argc, char **argv, const options *o, int world) {
    child kids[MAX_WORLD];
    memset(kids, 0, sizeof kids);
    char dir[4096], id_file[4200];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/flexgen-cp-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "mkdtemp %s: %s\n", dir, strerror(errno));
        return 1;
    }
    snprintf(id_file, sizeof id_file, "%s/nccl-id", dir);
    printf("starting %d ranks (one process per GPU; NCCL id in %s)\n", world, id_file);

    int failed = 0, running = 0, timed_out = 0;
    for (int r = 0; r < world && !failed; r++) {
        kids[r].pid = start_rank(argc, argv, r, world, id_file);
        if (kids[r].pid < 0) failed = 1;
        else running++;
    }
    if (failed) stop_children(kids, world, SIGTERM);

    /* Wait for all; the first failure stops the rest (they would wait for
     * it inside NCCL for ever), and so does the timeout. */
    const double t0 = ex_now_ms();
    double stop_at = failed ? t0 : 0;
    while (running > 0) {
        int reaped = 0;
        for (int r = 0; r < world; r++) {
            if (kids[r].pid <= 0 || kids[r].done) continue;
            pid_t p = waitpid(kids[r].pid, &kids[r].status, WNOHANG);
            if (p != kids[r].pid) continue;
            kids[r].done = 1, running--, reaped = 1;
            if (!(WIFEXITED(kids[r].status) && WEXITSTATUS(kids[r].status) == 0) && !stop_at) {
                failed = 1;
                stop_at = ex_now_ms();
                stop_children(kids, world, SIGTERM);
            }
        }
        if (reaped) continue;
        const double now = ex_now_ms();
        if (!stop_at && now - t0 > o->timeout_s * 1e3) {
            fprintf(stderr, "the ranks ran past --timeout %.0f s: stopping them\n", o->timeout_s);
            timed_out = failed = 1;
            stop_at = now;
            stop_children(kids, world, SIGTERM);
        } else if (stop_at && now - stop_at > 10e3) {
            stop_children(kids, world, SIGKILL); /* a rank stuck in the driver ignores SIGTERM */
        }
        sleep_ms(50);
    }

    for (int r = 0; r < world; r++) {
        if (kids[r].pid <= 0) {
            printf("rank %d: not started\n", r);
        } else if (WIFEXITED(kids[r].status) && WEXITSTATUS(kids[r].status) != 0) {
            printf("rank %d: exit status %d\n", r, WEXITSTATUS(kids[r].status));
        } else if (WIFSIGNALED(kids[r].status)) {
            printf("rank %d: ended by signal %d%s\n", r, WTERMSIG(kids[r].status),
                   timed_out || failed ? " (stopped by the launcher)" : "");
        }
    }
    unlink(id_file); /* rank 0 removes it; not when it never got that far */
    rmdir(dir);
    if (failed) printf("FAILED\n");
    else printf("all %d ranks OK\n", world);
    return failed ? 1 : 0;
}

static int run_launcher(int argc, char **argv, const options *o) {
    int rc = 1;
    fg_ctx *ctx = NULL;
    fg_mod *mod = NULL;
    fg_binding binds[64];
    size_t nbinds = 0;

    EX_TRY(ctx, fg_ctx_create(&ctx));
    EX_TRY(ctx, load_mod(ctx, o, &mod));
    printf("mod %s:\n%s\n", fg_mod_name(mod), fg_mod_canonical(mod));
    if (!make_bindings(mod, o, binds, sizeof binds / sizeof binds[0], &nbinds, 1)) {
        rc = 2;
        goto done;
    }

    /* Without --world: every GPU of the machine, up to DEFAULT_WORLD; the
     * plan is shown for 2 ranks where there are fewer GPUs than that. */
    const int count = ex_gpu_count();
    int world = o->world;
    if (!world) world = count < 2 ? 2 : count > DEFAULT_WORLD ? DEFAULT_WORLD : count;
    if (o->seq < min_seq(o->layout, world)) {
        fprintf(stderr, "--seq %lld is too short: %s over %d ranks needs at least %lld rows (%d per chunk)\n",
                (long long)o->seq, layout_name(o->layout), world, (long long)min_seq(o->layout, world),
                CHUNK_UNIT);
        rc = 2;
        goto done;
    }
    if (show_plan(ctx, mod, o, binds, nbinds, world)) goto done;

    rc = 0;
    if (!count) {
        ex_no_gpu();
        goto done;
    }
    if (!o->world && count < 2) {
        printf("skipping the GPU part: 1 CUDA device, context parallelism needs 2 or more "
               "(--world 1 runs the one-GPU baseline)\n");
        goto done;
    }
    if (world > count) {
        printf("skipping the GPU part: --world %d needs %d CUDA devices, this machine has %d\n", world, world,
               count);
        goto done;
    }
    if (!nccl_open()) {
        printf("skipping the GPU part: no NCCL (%s)\n", nccl.why);
        goto done;
    }
    rc = run_ranks(argc, argv, o, world);

done:
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    const int parsed = parse_options(argc, argv, &o);
    if (parsed != 1) {
        usage();
        return parsed ? 0 : 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* whole lines, as the ranks share the terminal */
    /* NVLink multicast stays off unless the environment says otherwise;
     * set before NCCL starts, and inherited by the ranks. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int rc = o.rank >= 0 ? run_rank(&o) : run_launcher(argc, argv, &o);
    for (int i = 0; i < o.nset; i++) free((void *)o.set_name[i]);
    return rc;
}
