/*
 * cmd_check.c -- `flexgen check`: run the GPU forward kernel (and with
 * --backward the backward kernels) against the CPU reference on fresh
 * random inputs, and optionally time them.
 *
 *   flexgen check --mask FILE [--score FILE] --batch B --heads H [--kv-heads H]
 *                 --q-len N [--kv-len N] --head-dim D --dtype bf16|fp16
 *                 [--set NAME=VALUE] [--buffer NAME=FILE] [--seed N]
 *                 [--dist uniform|normal] [--block-mask] [--block N]
 *                 [--q-offset N] [--kv-offset N] [--scale X] [--time N]
 *                 [--paged [--page-size N]] [--kv-lens L,...] [--q-offsets O,...]
 *                 [--decode-kernel 0|1|2] [--approx-math]
 *                 [--no-reference] [--backward [--deterministic] [--no-buffer-grads]]
 *
 * The outputs are poisoned (all bits set: NaN) before the launch, so a value
 * the kernel forgot to write shows up as non-finite. The reference is the
 * library's float64 one, evaluated with the mod itself (no block mask: a
 * block mask built from the mod must not change the result, so the check
 * also covers the GPU block-mask builder). On large problems the reference
 * would take minutes; then only batch 0 and the query heads of the first kv
 * head are compared (the message says so). The block mask is built as a
 * user builds it: one row for every sequence (head) when mask_mod never
 * reads b (h), which is also what the decode kernel needs with grouped
 * query heads.
 *
 * Decoding. --kv-lens gives each sequence its own KV length (a ragged batch,
 * --kv-len the longest it may be, by default the longest given); the
 * queries are then each sequence's newest tokens, q_offsets[b] = kv_lens[b]
 * - q_len, unless --q-offsets (one each) or --q-offset (every sequence)
 * says otherwise. --paged keeps K and V in a paged cache [num_pages,
 * page_size, Hkv, D] whose pages go to the sequences in a shuffled order,
 * with a few owned by nobody (paged.c), and hands the kernel the block
 * table; the table is checked on the host (fg_block_table_check) first.
 * The arrays are device memory for the GPU and the same values in host
 * memory for the reference, so the slice fallback reads row 0 of each.
 * K/V rows past a sequence's length and the pages nobody owns hold NaN:
 * the kernels promise never to read them, and a row read by mistake shows
 * as a non-finite output. The inputs are drawn as in a contiguous, uniform
 * run of the same seed and then cut or moved, so the two can be compared.
 * --decode-kernel sets FG_OPT_DECODE_KERNEL (0 never the decode kernel,
 * 1 the default, 2 wherever it applies), and the summary names the kernel
 * that ran. The backward takes none of this (it refuses such calls), so
 * --backward with them is a usage error.
 *
 * --approx-math sets FG_OPT_APPROX_MATH (approximate math in score_mod and
 * its derivative, forward and backward alike); the tolerances stay the
 * accurate kernels', which include/flexgen.h's bounds keep it inside.
 *
 * --time N times N launches of the kernel that ran, fetched once
 * (fg_attention_kernel_for), with device events after three warm-up
 * launches and prints the median and TFLOP/s, counting FLOPs as
 * FlexAttention's benchmark does: 4 * Hq * Q_LEN * D * density times the
 * keys of every sequence (B * KV_LEN when uniform), with density the
 * fraction of (q, kv) pairs the mask keeps, measured here at b = 0, h = 0
 * (through the block mask when there is one: full blocks count whole,
 * partial blocks are evaluated). A decode-shaped call (q_len up to
 * FG_DECODE_MAX_Q, or paged) is bound by reading K/V, so it also gets the
 * bytes of K/V it reads per second: 2 (K and V) * 2 bytes * Hkv * D times
 * the keys of every sequence, in TB/s. --sustain-ms MS first launches the
 * timed call for MS milliseconds of wall time: a GPU at its power limit
 * (the H100's 700 W) lowers its clock tens of milliseconds into a heavy
 * load, so the N timed launches then see the clock a training loop runs
 * at rather than the cold one (bench/attention_notes.md v51).
 *
 * --backward then runs the backward pass on the GPU forward's own out and
 * lse (the backward reuses the forward's log-sum-exp, so the forward always
 * runs first) with a random dout, and compares each gradient with the
 * float64 reference backward: dq, dk, dv, and the gradient of every float
 * buffer score_mod's value depends on (those are the ones the library
 * computes; the tool asks the same derivation which they are). The
 * gradients are poisoned like the outputs. A buffer gradient sums over
 * every (b, h), so when the reference runs on one slice it is not compared,
 * only checked for non-finite values. --deterministic runs the
 * deterministic mode and runs it twice: the two results must be
 * bit-identical. --no-buffer-grads asks for no buffer gradient (the
 * kernels' path without them, which a caller with constant buffers takes).
 * With --time, the backward's TFLOP/s count 2.5 times the
 * forward's FLOPs (two matmuls forward, five backward, the usual count).
 *
 * Exit codes: 0 within tolerance, 5 (FG_EXIT_TOLERANCE) over it, 4 without
 * a GPU, and the usual codes for bad options and bad mods (cli.h).
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmask.h"
#include "cli.h"
#include "cudrv.h"
#include "flexgen.h"

/* Multiply-adds the reference may spend on the whole problem before the
 * check falls back to one slice (about ten seconds on one core). */
#define CHECK_BUDGET 1.0e10

/* A 16-bit NaN in both bf16 and fp16 (all bits set): the poison of the
 * outputs and of K/V rows no key lives in. */
#define POISON16 0xFFFFu

typedef struct options {
    fg_cli_mod_args mod;
    int batch, heads, kv_heads, q_len, kv_len, head_dim;
    fg_dtype dtype;
    int seed, block, time_n, q_offset, kv_offset;
    int sustain_ms;               /* --sustain-ms: launches before the timing  */
    int page_size;                /* --paged: rows per page; 0: contiguous K/V */
    int decode_kernel;            /* FG_OPT_DECODE_KERNEL; -1: the default     */
    bool block_mask, normal, no_reference, backward, deterministic, no_buffer_grads, approx_math;
    bool paged, q_offset_given, q_offsets_derived;
    double scale;
    const char *kv_lens_arg, *q_offsets_arg; /* read once --batch is known      */
    int32_t *kv_lens, *q_offsets; /* host [batch], malloc'd; NULL: uniform     */
} options;

static void usage(FILE *f) {
    fprintf(f,
            "usage: flexgen check --mask FILE [--score FILE] --batch B --heads H [--kv-heads H]\n"
            "                     --q-len N [--kv-len N] --head-dim D --dtype bf16|fp16\n"
            "                     [--set NAME=VALUE] [--buffer NAME=FILE] [--seed N]\n"
            "                     [--dist uniform|normal] [--block-mask] [--block N]\n"
            "                     [--q-offset N] [--kv-offset N] [--scale X] [--time N [--sustain-ms MS]]\n"
            "                     [--paged [--page-size N]] [--kv-lens L,...] [--q-offsets O,...]\n"
            "                     [--decode-kernel 0|1|2] [--approx-math]\n"
            "                     [--no-reference] [--backward [--deterministic] [--no-buffer-grads]]\n"
            "Run the GPU forward kernel against the CPU reference (float64) on fresh random\n"
            "inputs and print the relative Frobenius error of out, the largest LSE error and\n"
            "the count of non-finite values. Tolerance: 1e-2 (bf16) / 2e-3 (fp16) on out,\n"
            "1e-3 (1 + |lse|) on LSE. --block-mask builds a block mask on the GPU (blocks of\n"
            "--block, default 128); --time N also times N launches (median, TFLOP/s),\n"
            "after MS ms of launches with --sustain-ms (the clock under sustained load);\n"
            "--no-reference skips the CPU reference (timing only; outputs are still\n"
            "checked for unwritten or non-finite values).\n"
            "--backward also runs the backward pass after the forward, with a random dout,\n"
            "and compares dq, dk, dv and the gradient of each float buffer score_mod reads\n"
            "with the reference backward: relative Frobenius error per tensor, tolerance\n"
            "2e-2 (bf16) / 5e-3 (fp16); --time N times it too (TFLOP/s counted as 2.5x the\n"
            "forward's FLOPs). --deterministic runs the deterministic backward twice and\n"
            "also requires the two results to be bit-identical. --no-buffer-grads leaves the\n"
            "float buffers' gradients out (as a caller whose buffers are constants would).\n"
            "Decoding: --kv-lens L1,L2,... gives each of the --batch sequences its own KV\n"
            "length in [0, --kv-len] (default --kv-len: the longest); its queries are then its\n"
            "newest tokens (q offset L - q_len) unless --q-offsets O1,O2,... (one each) or\n"
            "--q-offset N (all) places them. --paged keeps K and V in a paged cache\n"
            "[pages, page, Hkv, D] with pages shuffled among the sequences and a block table\n"
            "(--page-size N: a power of two in [16, 256], default 16). --decode-kernel 0|1|2\n"
            "never / by default / always takes the decode kernel (FG_OPT_DECODE_KERNEL); the\n"
            "summary names the kernel that ran. With --time, decode-shaped calls (q_len up\n"
            "to 16, or paged) also report TB/s of K/V read. The backward takes none of these.\n"
            "--approx-math runs kernels with approximate math in score_mod (FG_OPT_APPROX_MATH:\n"
            "tanh.approx, ex2 / lg2 / rsqrt.approx, div.full), at the same tolerances.\n"
            "Exit: 0 within tolerance, 5 over it, 4 no GPU.\n%s%s",
            fg_cli_mod_help, fg_cli_bind_help);
}

enum { OPT_BATCH = 0x2000, OPT_HEADS, OPT_KV_HEADS, OPT_Q_LEN, OPT_KV_LEN, OPT_HEAD_DIM, OPT_DTYPE,
       OPT_SEED, OPT_DIST, OPT_BLOCK_MASK, OPT_BLOCK, OPT_Q_OFFSET, OPT_KV_OFFSET, OPT_SCALE,
       OPT_TIME, OPT_NO_REFERENCE, OPT_BACKWARD, OPT_DETERMINISTIC, OPT_NO_BUFFER_GRADS, OPT_PAGED, OPT_PAGE_SIZE, OPT_KV_LENS,
       OPT_Q_OFFSETS, OPT_DECODE_KERNEL, OPT_APPROX_MATH, OPT_SUSTAIN_MS };

static int *int_option(options *o, int opt, long long *lo, long long *hi) {
    *lo = 1, *hi = 1 << 30;
    switch (opt) {
    case OPT_BATCH: return &o->batch;
    case OPT_HEADS: return &o->heads;
    case OPT_KV_HEADS: return &o->kv_heads;
    case OPT_Q_LEN: return &o->q_len;
    case OPT_KV_LEN: return &o->kv_len;
    case OPT_HEAD_DIM: return &o->head_dim;
    case OPT_BLOCK: return &o->block;
    case OPT_TIME: return &o->time_n;
    case OPT_SEED: *lo = 0; *hi = 2147483647; return &o->seed;
    case OPT_Q_OFFSET: *lo = -(1ll << 30); return &o->q_offset;
    case OPT_KV_OFFSET: *lo = -(1ll << 30); return &o->kv_offset;
    case OPT_PAGE_SIZE: *lo = 16; *hi = 256; return &o->page_size;
    case OPT_DECODE_KERNEL: *lo = 0; *hi = 2; return &o->decode_kernel;
    case OPT_SUSTAIN_MS: *lo = 0; *hi = 600000; return &o->sustain_ms;
    }
    return NULL;
}

/* A list option with one value per sequence, into *out. */
static int per_sequence(const char *arg, const char *what, const options *o, long long lo, int32_t **out) {
    int n = 0;
    int rc = fg_cli_parse_int_list(arg, what, lo, 1 << 30, out, &n);
    if (rc) return rc;
    if (n != o->batch)
        return fg_cli_error(FG_EXIT_USAGE, "check: %s has %d value%s, one per sequence of --batch %d", what, n,
                            n == 1 ? "" : "s", o->batch);
    return FG_EXIT_OK;
}

/* --kv-lens and --q-offsets, read once --batch is known; --kv-len defaults
 * to the longest length, and the queries of a ragged batch default to each
 * sequence's newest tokens (how a decode step places them). */
static int ragged_args(options *o) {
    if (o->q_offsets_arg && o->q_offset_given)
        return fg_cli_error(FG_EXIT_USAGE, "check: give --q-offset N (every sequence) or --q-offsets (one "
                                           "each), not both");
    int rc = FG_EXIT_OK;
    if (o->kv_lens_arg && (rc = per_sequence(o->kv_lens_arg, "--kv-lens", o, 0, &o->kv_lens)) != 0) return rc;
    if (o->q_offsets_arg &&
        (rc = per_sequence(o->q_offsets_arg, "--q-offsets", o, -(1ll << 30), &o->q_offsets)) != 0)
        return rc;
    if (!o->kv_lens) return FG_EXIT_OK;
    int longest = 0;
    for (int b = 0; b < o->batch; b++) longest = o->kv_lens[b] > longest ? o->kv_lens[b] : longest;
    if (o->kv_len <= 0) o->kv_len = longest > 0 ? longest : o->q_len;
    for (int b = 0; b < o->batch; b++)
        if (o->kv_lens[b] > o->kv_len)
            return fg_cli_error(FG_EXIT_USAGE, "check: --kv-lens: sequence %d has %d keys, past --kv-len %d", b,
                                (int)o->kv_lens[b], o->kv_len);
    if (o->q_offsets || o->q_offset_given) return FG_EXIT_OK;
    o->q_offsets = malloc(sizeof(int32_t) * (size_t)o->batch);
    if (!o->q_offsets) return fg_cli_error(FG_EXIT_OTHER, "check: out of memory");
    for (int b = 0; b < o->batch; b++) o->q_offsets[b] = o->kv_lens[b] - o->q_len;
    o->q_offsets_derived = true;
    return FG_EXIT_OK;
}

/* A block mask is built for one set of query positions (its desc's
 * q_offset), so with per-sequence offsets they must all be the same. */
static int block_mask_positions(const options *o) {
    if (!o->block_mask || !o->q_offsets) return FG_EXIT_OK;
    for (int b = 1; b < o->batch; b++)
        if (o->q_offsets[b] != o->q_offsets[0])
            return fg_cli_error(FG_EXIT_USAGE,
                                "check: --block-mask builds one mask for one set of query positions, but the "
                                "sequences' q offsets differ (%d for sequence 0, %d for sequence %d%s); give "
                                "equal --q-offsets, or --q-offset N",
                                (int)o->q_offsets[0], (int)o->q_offsets[b], b,
                                o->q_offsets_derived ? ": kv_lens - q_len" : "");
    return FG_EXIT_OK;
}

/* The q offset of sequence b. */
static int q_offset_of(const options *o, int b) { return o->q_offsets ? o->q_offsets[b] : o->q_offset; }

/* The keys of sequence b, and of every sequence. */
static int kv_len_of(const options *o, int b) { return o->kv_lens ? o->kv_lens[b] : o->kv_len; }

static double total_keys(const options *o) {
    double n = 0;
    for (int b = 0; b < o->batch; b++) n += kv_len_of(o, b);
    return n;
}

/* FG_EXIT_OK to go on, -1 after --help, else an exit code. */
static int parse_args(int argc, char **argv, options *o) {
    static const struct option longopts[] = {
        FG_CLI_MOD_LONGOPTS,
        FG_CLI_BIND_LONGOPTS,
        {"batch", required_argument, 0, OPT_BATCH},
        {"heads", required_argument, 0, OPT_HEADS},
        {"kv-heads", required_argument, 0, OPT_KV_HEADS},
        {"q-len", required_argument, 0, OPT_Q_LEN},
        {"kv-len", required_argument, 0, OPT_KV_LEN},
        {"head-dim", required_argument, 0, OPT_HEAD_DIM},
        {"dtype", required_argument, 0, OPT_DTYPE},
        {"seed", required_argument, 0, OPT_SEED},
        {"dist", required_argument, 0, OPT_DIST},
        {"block-mask", no_argument, 0, OPT_BLOCK_MASK},
        {"block", required_argument, 0, OPT_BLOCK},
        {"q-offset", required_argument, 0, OPT_Q_OFFSET},
        {"kv-offset", required_argument, 0, OPT_KV_OFFSET},
        {"scale", required_argument, 0, OPT_SCALE},
        {"time", required_argument, 0, OPT_TIME},
        {"sustain-ms", required_argument, 0, OPT_SUSTAIN_MS},
        {"no-reference", no_argument, 0, OPT_NO_REFERENCE},
        {"backward", no_argument, 0, OPT_BACKWARD},
        {"deterministic", no_argument, 0, OPT_DETERMINISTIC},
        {"no-buffer-grads", no_argument, 0, OPT_NO_BUFFER_GRADS},
        {"paged", no_argument, 0, OPT_PAGED},
        {"page-size", required_argument, 0, OPT_PAGE_SIZE},
        {"kv-lens", required_argument, 0, OPT_KV_LENS},
        {"q-offsets", required_argument, 0, OPT_Q_OFFSETS},
        {"decode-kernel", required_argument, 0, OPT_DECODE_KERNEL},
        {"approx-math", no_argument, 0, OPT_APPROX_MATH},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    fg_cli_mod_args_init(&o->mod);
    o->batch = o->heads = 1;
    o->head_dim = 128;
    o->dtype = FG_BF16;
    o->block = 128;
    o->seed = 1;
    o->normal = true;
    o->decode_kernel = -1;
    optind = 0; /* glibc: restart scanning, argv[0] is the command name */
    int c, li;
    while ((c = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
        long long lo, hi;
        int *ip = int_option(o, c, &lo, &hi);
        if (c == 'h') {
            usage(stdout);
            return -1;
        } else if (ip) {
            if (fg_cli_parse_int(optarg, longopts[li].name, lo, hi, ip)) return FG_EXIT_USAGE;
            o->q_offset_given |= c == OPT_Q_OFFSET;
            o->paged |= c == OPT_PAGE_SIZE; /* a page size says paged */
        } else if (c == OPT_KV_LENS) {
            o->kv_lens_arg = optarg;
        } else if (c == OPT_Q_OFFSETS) {
            o->q_offsets_arg = optarg;
        } else if (c == OPT_PAGED) {
            o->paged = true;
        } else if (c == OPT_DTYPE) {
            if (!strcmp(optarg, "bf16")) o->dtype = FG_BF16;
            else if (!strcmp(optarg, "fp16")) o->dtype = FG_FP16;
            else return fg_cli_error(FG_EXIT_USAGE, "check: --dtype must be bf16 or fp16, not '%s'", optarg);
        } else if (c == OPT_DIST) {
            if (!strcmp(optarg, "normal")) o->normal = true;
            else if (!strcmp(optarg, "uniform")) o->normal = false;
            else return fg_cli_error(FG_EXIT_USAGE, "check: --dist must be uniform or normal, not '%s'", optarg);
        } else if (c == OPT_SCALE) {
            if (fg_cli_parse_double(optarg, "scale", &o->scale)) return FG_EXIT_USAGE;
        } else if (c == OPT_BLOCK_MASK) {
            o->block_mask = true;
        } else if (c == OPT_NO_REFERENCE) {
            o->no_reference = true;
        } else if (c == OPT_BACKWARD) {
            o->backward = true;
        } else if (c == OPT_DETERMINISTIC) {
            o->deterministic = true;
        } else if (c == OPT_NO_BUFFER_GRADS) {
            o->no_buffer_grads = true;
        } else if (c == OPT_APPROX_MATH) {
            o->approx_math = true;
        } else {
            int r = fg_cli_mod_option(&o->mod, c, optarg);
            if (r < 0) return FG_EXIT_USAGE;
            if (r == 0) {
                usage(stderr);
                return FG_EXIT_USAGE;
            }
        }
    }
    if (optind < argc) return fg_cli_error(FG_EXIT_USAGE, "check: unexpected argument '%s'", argv[optind]);
    if (!fg_cli_has_mod(&o->mod))
        return fg_cli_error(FG_EXIT_USAGE, "check: needs a mod (--mask FILE and/or --score FILE)");
    if (o->q_len <= 0) return fg_cli_error(FG_EXIT_USAGE, "check: needs --q-len N");
    if (o->deterministic && !o->backward)
        return fg_cli_error(FG_EXIT_USAGE, "check: --deterministic is a mode of the backward (add --backward)");
    if (o->no_buffer_grads && !o->backward)
        return fg_cli_error(FG_EXIT_USAGE, "check: --no-buffer-grads is a mode of the backward (add --backward)");
    if (o->sustain_ms && !o->time_n)
        return fg_cli_error(FG_EXIT_USAGE, "check: --sustain-ms comes before a timing (add --time N)");
    if (o->backward && (o->paged || o->kv_lens_arg || o->q_offsets_arg))
        return fg_cli_error(FG_EXIT_USAGE, "check: the backward takes uniform lengths and contiguous K/V: "
                                           "--backward goes without --paged, --kv-lens and --q-offsets");
    int rc = ragged_args(o);
    if (rc) return rc;
    if (o->kv_len <= 0) o->kv_len = o->q_len;
    if (o->kv_heads <= 0) o->kv_heads = o->heads;
    if (o->paged && !o->page_size) o->page_size = 16;
    if (o->paged && (o->page_size & (o->page_size - 1)) != 0)
        return fg_cli_error(FG_EXIT_USAGE, "check: --page-size must be a power of two in [16, 256], not %d",
                            o->page_size);
    return block_mask_positions(o);
}

/* ---- inputs ------------------------------------------------------------------ */

/* An input as a 16-bit float, rounded to nearest even. fp16 keeps this
 * command's own range rule, so that a seed goes on giving the inputs it
 * gave: magnitudes under the normal range become 0 (no subnormals) and
 * those from 2^16 up saturate at 65504. */
static uint16_t to16(fg_dtype dt, float f) {
    if (dt == FG_BF16) return fgi_float_to_bf16(f);
    float a = fabsf(f);
    if (a < 0x1p-14f) f = copysignf(0.0f, f);
    else if (!(a < 65536.0f)) f = copysignf(65504.0f, f);
    return fgi_float_to_fp16(f);
}

static double from16(fg_dtype dt, uint16_t h) {
    return dt == FG_BF16 ? fgi_bf16_to_float(h) : fgi_fp16_to_float(h);
}

/* Elements begin..end-1 of a random tensor: normal (Box-Muller, two
 * draws each) or uniform in [-1, 1) (one). */
typedef struct random_fill {
    uint16_t *x;
    fg_dtype dt;
    bool normal;
} random_fill;

static void random_elements(void *arg, size_t begin, size_t end, uint64_t *s) {
    const random_fill *r = arg;
    for (size_t i = begin; i < end; i++) {
        double u = fg_cli_rand_uniform(s), v;
        if (r->normal) v = sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * fg_cli_rand_uniform(s));
        else v = 2 * u - 1;
        r->x[i] = to16(r->dt, (float)v);
    }
}

/* A random tensor of n elements, drawn on every core (the same values as
 * one thread drawing them in order: fg_cli_rand_fill). */
static uint16_t *random_tensor(size_t n, fg_dtype dt, bool normal, uint64_t *s) {
    random_fill r = {malloc(n * 2), dt, normal};
    if (r.x) fg_cli_rand_fill(s, n, normal ? 2 : 1, random_elements, &r);
    return r.x;
}

/* ---- device memory ------------------------------------------------------------ */

typedef struct device {
    CUdeviceptr q, k, v, out, lse;
    CUdeviceptr kv_lens, q_offsets, table; /* int32, when given           */
    CUdeviceptr dout, dq, dk, dv; /* the backward's                      */
    CUdeviceptr grad[FG_CLI_MAX_ITEMS]; /* buffer gradients, fp32        */
    CUdeviceptr buf[FG_CLI_MAX_ITEMS];
    fg_binding binds[FG_CLI_MAX_ITEMS];
    size_t nbinds;
} device;

static fg_status upload(fg_ctx *ctx, CUdeviceptr *d, const void *p, size_t bytes) {
    FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(d, bytes), "cuMemAlloc");
    if (p) FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyHtoD(*d, p, bytes), "cuMemcpyHtoD");
    return FG_OK;
}

static fg_status device_binds(fg_ctx *ctx, const fg_cli_bindings *host, device *dev) {
    for (size_t i = 0; i < host->n; i++) {
        dev->binds[i] = host->binds[i];
        dev->nbinds = i + 1;
        if (host->binds[i].kind != FG_PARAM_BUFFER || host->binds[i].value.buffer.length == 0) continue;
        FGI_TRY(upload(ctx, &dev->buf[i], host->binds[i].value.buffer.data,
                       (size_t)host->binds[i].value.buffer.length * 4));
        dev->binds[i].value.buffer.data = (const void *)(uintptr_t)dev->buf[i];
    }
    return FG_OK;
}

static void device_free(device *d) {
    const CUdeviceptr all[] = {d->q, d->k, d->v, d->out, d->lse, d->kv_lens,
                               d->q_offsets, d->table, d->dout, d->dq, d->dk, d->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) fgi_cu()->cuMemFree(all[i]);
    for (size_t i = 0; i < d->nbinds; i++)
        if (d->buf[i]) fgi_cu()->cuMemFree(d->buf[i]);
    for (size_t i = 0; i < FG_CLI_MAX_ITEMS; i++)
        if (d->grad[i]) fgi_cu()->cuMemFree(d->grad[i]);
}

/* ---- comparison ---------------------------------------------------------------- */

typedef struct result {
    double rel, lse_err;
    long nonfinite, lse_mismatch;
    int checked_batch, checked_heads;
} result;

/* Whether the reference, spending `factor` times the forward's work, is
 * over budget on the whole problem and runs on one slice instead. */
static bool over_budget(const options *o, double factor) {
    return factor * o->heads * o->q_len * total_keys(o) * o->head_dim > CHECK_BUDGET;
}

/* The reference's arguments: `host` (the GPU call with the host's
 * bindings, lengths, offsets and block table) with the host inputs and no
 * block mask, on batch 0 x the query heads of kv head 0 when `slice`, else
 * on everything. */
static void reference_args(const options *o, const fg_attention_args *host, bool slice, const uint16_t *hq,
                           const uint16_t *hk, const uint16_t *hv, fg_attention_args *a) {
    *a = *host;
    a->q = hq, a->k = hk, a->v = hv, a->lse = NULL, a->block_mask = NULL, a->stream = NULL;
    if (slice) {
        a->batch = 1;
        a->heads_q = o->heads / o->kv_heads;
        a->heads_kv = 1;
    }
    /* The slice is the first rows of every tensor (the first of each
     * per-sequence array), read with the full problem's strides: BHSD, or
     * for a paged cache (page, head, row in page). */
    const int64_t D = o->head_dim;
    const int64_t qs[4] = {(int64_t)o->heads * o->q_len * D, (int64_t)o->q_len * D, D, 1};
    const int64_t ks[4] = {(int64_t)o->kv_heads * o->kv_len * D, (int64_t)o->kv_len * D, D, 1};
    const int64_t ps[4] = {(int64_t)o->page_size * o->kv_heads * D, D, (int64_t)o->kv_heads * D, 1};
    memcpy(a->q_stride, qs, sizeof qs), memcpy(a->out_stride, qs, sizeof qs);
    memcpy(a->k_stride, o->paged ? ps : ks, sizeof ks), memcpy(a->v_stride, o->paged ? ps : ks, sizeof ks);
}

/* The GPU's out and lse against the reference on `host` (see
 * reference_args). A row of a sequence with no keys has output 0 and LSE
 * -inf on both sides, which counts as a match. */
static fg_status compare(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *host, const options *o,
                         const uint16_t *hq, const uint16_t *hk, const uint16_t *hv, const uint16_t *gout,
                         const float *glse, result *r) {
    fg_attention_args a;
    reference_args(o, host, over_budget(o, 1.0), hq, hk, hv, &a);
    const size_t rows = (size_t)a.batch * a.heads_q * o->q_len, D = (size_t)o->head_dim;
    double *rout = malloc(sizeof(double) * rows * D), *rlse = malloc(sizeof(double) * rows);
    if (!rout || !rlse) {
        free(rout), free(rlse);
        return FG_ERR_OUT_OF_MEMORY;
    }
    fg_status st = fg_attention_reference(ctx, mod, &a, rout, rlse);
    memset(r, 0, sizeof *r);
    r->checked_batch = a.batch, r->checked_heads = a.heads_q;
    double num = 0, den = 0;
    for (int b = 0; st == FG_OK && b < a.batch; b++)
        for (int h = 0; h < a.heads_q; h++)
            for (int i = 0; i < o->q_len; i++) {
                size_t rr = ((size_t)b * a.heads_q + h) * o->q_len + i;
                size_t gr = ((size_t)b * o->heads + h) * o->q_len + i;
                for (size_t d = 0; d < D; d++) {
                    double g = from16(o->dtype, gout[gr * D + d]), x = rout[rr * D + d];
                    if (!isfinite(g)) r->nonfinite++;
                    num += (g - x) * (g - x);
                    den += x * x;
                }
                double gl = glse[gr], xl = rlse[rr];
                if (isnan(gl)) r->nonfinite++;
                else if (isinf(xl) || isinf(gl)) r->lse_mismatch += !(isinf(xl) && isinf(gl) && gl < 0);
                else if (fabs(gl - xl) / (1 + fabs(xl)) > r->lse_err) r->lse_err = fabs(gl - xl) / (1 + fabs(xl));
            }
    r->rel = den > 0 ? sqrt(num / den) : sqrt(num);
    free(rout), free(rlse);
    return st;
}

/* ---- density and timing -------------------------------------------------------- */

/* Fraction of (q, kv) pairs kept at b = 0, h = 0 with the queries at
 * q_offset, evaluated in tiles (only the partial blocks when there is a
 * block mask). */
static fg_status density_of(fg_ctx *ctx, const fg_mod *mod, const fg_cli_bindings *hb,
                            const fg_block_mask *bm, const options *o, int q_offset, double *density) {
    *density = 1.0;
    if (!fg_mod_has_mask(mod) && !bm) return FG_OK;
    const int T = 128;
    uint8_t *m = malloc((size_t)T * T);
    if (!m) return FG_ERR_OUT_OF_MEMORY;
    double kept = 0;
    fg_status st = FG_OK;
    const int32_t *num = NULL, *idx = NULL, *fnum = NULL, *fidx = NULL;
    int64_t dims[4] = {0, 0, 0, 0};
    fg_block_mask_desc d;
    if (bm) {
        fg_block_mask_get_desc(bm, &d);
        fg_block_mask_array_get(bm, FG_BM_KV_NUM_BLOCKS, &num, NULL, dims);
        fg_block_mask_array_get(bm, FG_BM_FULL_KV_NUM_BLOCKS, &fnum, NULL, NULL);
        fg_block_mask_array_get(bm, FG_BM_FULL_KV_INDICES, &fidx, NULL, NULL);
        fg_block_mask_array_get(bm, FG_BM_KV_INDICES, &idx, NULL, dims);
    }
    for (int q0 = 0; st == FG_OK && q0 < o->q_len; q0 += bm ? d.q_block : T) {
        const int nq = o->q_len - q0 < (bm ? d.q_block : T) ? o->q_len - q0 : (bm ? d.q_block : T);
        if (!bm) {
            for (int k0 = 0; st == FG_OK && k0 < o->kv_len; k0 += T) {
                const int nk = o->kv_len - k0 < T ? o->kv_len - k0 : T;
                st = fg_mod_eval_mask(ctx, mod, hb->binds, hb->n, 0, 0, q0 + q_offset, nq,
                                      k0 + o->kv_offset, nk, m);
                for (int i = 0; i < nq * nk; i++) kept += m[i];
            }
            continue;
        }
        const int qb = q0 / d.q_block, KB = (int)dims[3];
        for (int i = 0; i < fnum[qb]; i++) {
            int k0 = fidx[(int64_t)qb * KB + i] * d.kv_block;
            int nk = o->kv_len - k0 < d.kv_block ? o->kv_len - k0 : d.kv_block;
            kept += (double)nq * nk;
        }
        for (int i = 0; st == FG_OK && i < num[qb]; i++) {
            int k0 = idx[(int64_t)qb * KB + i] * d.kv_block;
            int nk = o->kv_len - k0 < d.kv_block ? o->kv_len - k0 : d.kv_block;
            for (int s0 = 0; st == FG_OK && s0 < nq; s0 += T / 4) { /* stay within the T x T scratch */
                int ns = nq - s0 < T / 4 ? nq - s0 : T / 4;
                for (int t0 = 0; st == FG_OK && t0 < nk; t0 += T) {
                    int nt = nk - t0 < T ? nk - t0 : T;
                    st = fg_mod_eval_mask(ctx, mod, hb->binds, hb->n, 0, 0, q0 + s0 + q_offset, ns,
                                          k0 + t0 + o->kv_offset, nt, m);
                    for (int j = 0; j < ns * nt; j++) kept += m[j];
                }
            }
        }
    }
    free(m);
    *density = kept / ((double)o->q_len * o->kv_len);
    return st;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* One launch of the forward (bwd NULL) or the backward of `a` on kernel k. */
static fg_status launch_once(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a, const fg_attention_bwd_args *bwd) {
    return bwd ? fg_kernel_launch_backward(ctx, k, bwd) : fg_kernel_launch(ctx, k, a);
}

/* The forward (bwd NULL) or the backward of `a` on kernel k, launched n
 * times after three warm-up launches and `sustain_ms` milliseconds of
 * launches (synchronising every eight, so the host never runs far ahead
 * of the wall time it measures). */
static fg_status time_runs(fg_ctx *ctx, fg_kernel *k, const fg_attention_args *a, const fg_attention_bwd_args *bwd,
                           int n, int sustain_ms, double *median_ms) {
    CUevent e0 = NULL, e1 = NULL;
    float *ms = malloc(sizeof(float) * (size_t)n);
    fg_status st = ms ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventCreate(&e0, CU_EVENT_DEFAULT), "cuEventCreate");
    if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventCreate(&e1, CU_EVENT_DEFAULT), "cuEventCreate");
    for (int i = 0; st == FG_OK && i < 3; i++) st = launch_once(ctx, k, a, bwd);
    for (const double t0 = fgi_now_ms(); st == FG_OK && fgi_now_ms() - t0 < sustain_ms;) {
        for (int i = 0; st == FG_OK && i < 8; i++) st = launch_once(ctx, k, a, bwd);
        if (st == FG_OK)
            st = fgi_cu_status(ctx, fgi_cu()->cuStreamSynchronize((CUstream)a->stream), "cuStreamSynchronize");
    }
    for (int i = 0; st == FG_OK && i < n; i++) {
        st = fgi_cu_status(ctx, fgi_cu()->cuEventRecord(e0, (CUstream)a->stream), "cuEventRecord");
        if (st == FG_OK) st = launch_once(ctx, k, a, bwd);
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventRecord(e1, (CUstream)a->stream), "cuEventRecord");
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventSynchronize(e1), "cuEventSynchronize");
        if (st == FG_OK) st = fgi_cu_status(ctx, fgi_cu()->cuEventElapsedTime(&ms[i], e0, e1), "cuEventElapsedTime");
    }
    if (st == FG_OK) {
        qsort(ms, (size_t)n, sizeof *ms, cmp_float);
        *median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    }
    if (e0) fgi_cu()->cuEventDestroy(e0);
    if (e1) fgi_cu()->cuEventDestroy(e1);
    free(ms);
    return st;
}

/* ---- the backward pass ------------------------------------------------------------ */

/* One gradient the backward writes: dq, dk or dv (16-bit, the dtype) or a
 * float buffer's (fp32, the buffer's length). */
typedef struct grad {
    char name[80];      /* "dq", "dk", "dv", or "d(NAME)" for buffer NAME    */
    size_t n;           /* elements                                          */
    bool fp32;
    CUdeviceptr *dev;   /* its device memory, owned by `device`             */
    void *gpu, *again;  /* host copies of the GPU's first and second run    */
    double *ref;        /* the reference's first nref elements; NULL: none  */
    size_t nref;
    double rel;
    long nonfinite, differ;
} grad;

typedef struct backward {
    grad g[3 + FG_CLI_MAX_ITEMS];
    int n;
    fg_binding binds[FG_CLI_MAX_ITEMS];     /* gradient bindings, device memory */
    fg_binding ref_binds[FG_CLI_MAX_ITEMS]; /* the same for the reference       */
    size_t nbinds;
    uint16_t *hdout;
    fg_attention_bwd_args args;             /* the GPU call                     */
    bool sliced;                            /* the reference ran on one slice   */
} backward;

static void backward_free(backward *b) {
    for (int i = 0; i < b->n; i++) free(b->g[i].gpu), free(b->g[i].again), free(b->g[i].ref);
    free(b->hdout);
}

static size_t grad_bytes(const grad *t) { return t->n * (t->fp32 ? 4 : 2); }

/* Element i of a host copy of t. */
static double grad_value(const grad *t, const void *p, fg_dtype dt, size_t i) {
    return t->fp32 ? ((const float *)p)[i] : from16(dt, ((const uint16_t *)p)[i]);
}

static grad *add_grad(backward *b, const char *name, size_t n, bool fp32, CUdeviceptr *dev) {
    grad *t = &b->g[b->n++];
    memset(t, 0, sizeof *t);
    if (fp32) snprintf(t->name, sizeof t->name, "d(%s)", name);
    else snprintf(t->name, sizeof t->name, "%s", name);
    t->n = n, t->fp32 = fp32, t->dev = dev;
    return t;
}

/* Poison every gradient (all bits set: NaN), run the backward, wait for it
 * and copy each gradient to the host (to `again` for the second run). */
static fg_status backward_run(fg_ctx *ctx, const fg_mod *mod, backward *b, bool second, double *ms) {
    for (int i = 0; i < b->n; i++)
        FGI_CU_TRY(ctx, fgi_cu()->cuMemsetD8(*b->g[i].dev, 0xff, grad_bytes(&b->g[i])), "cuMemsetD8");
    double t0 = fgi_now_ms();
    FGI_TRY(fg_attention_backward(ctx, mod, &b->args));
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxSynchronize(), "kernel execution");
    *ms = fgi_now_ms() - t0;
    for (int i = 0; i < b->n; i++)
        FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyDtoH(second ? b->g[i].again : b->g[i].gpu, *b->g[i].dev,
                                               grad_bytes(&b->g[i])),
                   "cuMemcpyDtoH");
    return FG_OK;
}

/* ---- the command ------------------------------------------------------------------ */

typedef struct state {
    options o;
    fg_ctx *ctx;
    fg_mod *mod;
    fg_cli_bindings hb;
    bool have_hb;
    device dev;
    fg_block_mask *bm;
    fg_cli_paging pg;  /* --paged: the block table (host)            */
    fg_kernel *kernel; /* the forward's kernel, fetched once         */
    uint16_t *hq, *hk, *hv, *gout;
    size_t nk;         /* elements of hk and hv (a paged cache's too) */
    float *glse;
    backward bw;
} state;

/* The gradients to write, a random dout, their device memory and the GPU
 * call on the forward call `a`. The dout is drawn after the forward's
 * inputs, so a seed gives the same q, k and v with or without --backward. */
static fg_status backward_setup(state *s, const fg_attention_args *a, uint64_t *seed) {
    const options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    backward *b = &s->bw;
    device *dv = &s->dev;
    const size_t D = (size_t)o->head_dim;
    const size_t nq = (size_t)o->batch * o->heads * o->q_len * D;
    const size_t nk = (size_t)o->batch * o->kv_heads * o->kv_len * D;
    const char *names[FG_CLI_MAX_ITEMS];
    int nnames = 0;
    if (!o->no_buffer_grads) FGI_TRY(fg_cli_grad_buffers(ctx, s->mod, names, FG_CLI_MAX_ITEMS, &nnames));
    add_grad(b, "dq", nq, false, &dv->dq);
    add_grad(b, "dk", nk, false, &dv->dk);
    add_grad(b, "dv", nk, false, &dv->dv);
    for (int k = 0; k < nnames; k++) {
        const fg_binding *hb = NULL;
        for (size_t i = 0; i < s->hb.n && !hb; i++)
            if (!strcmp(s->hb.binds[i].name, names[k])) hb = &s->hb.binds[i];
        /* Unbound, the forward has refused already; empty, there is
         * nothing to write. */
        if (!hb || hb->kind != FG_PARAM_BUFFER || hb->value.buffer.length <= 0) continue;
        add_grad(b, names[k], (size_t)hb->value.buffer.length, true, &dv->grad[b->nbinds]);
        b->binds[b->nbinds++] = fg_bind_float_buffer(names[k], NULL, hb->value.buffer.length);
    }
    b->hdout = random_tensor(nq, o->dtype, o->normal, seed);
    bool host_ok = b->hdout != NULL;
    for (int i = 0; i < b->n; i++) {
        b->g[i].gpu = malloc(grad_bytes(&b->g[i]));
        if (o->deterministic) b->g[i].again = malloc(grad_bytes(&b->g[i]));
        host_ok = host_ok && b->g[i].gpu && (b->g[i].again || !o->deterministic);
    }
    if (!host_ok) return fgi_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the gradients");
    FGI_TRY(upload(ctx, &dv->dout, b->hdout, nq * 2));
    for (int i = 0; i < b->n; i++) FGI_TRY(upload(ctx, b->g[i].dev, NULL, grad_bytes(&b->g[i])));
    for (size_t k = 0; k < b->nbinds; k++) b->binds[k].value.buffer.data = (const void *)(uintptr_t)dv->grad[k];

    fg_attention_bwd_args *ba = &b->args;
    *ba = fg_attention_bwd_args_init();
    ba->fwd = a;
    ba->dout = (const void *)(uintptr_t)dv->dout;
    ba->dq = (void *)(uintptr_t)dv->dq, ba->dk = (void *)(uintptr_t)dv->dk, ba->dv = (void *)(uintptr_t)dv->dv;
    ba->grad_binds = b->binds, ba->ngrad_binds = b->nbinds;
    ba->deterministic = o->deterministic;
    return FG_OK;
}

/* The float64 reference backward on the host copies of the forward's
 * inputs (`host`: the forward call with host bindings), into each
 * gradient's ref. On a slice (batch 0, the query heads of kv head 0) the
 * reference's dq, dk and dv are the first rows of the GPU's (contiguous
 * BHSD), and buffer gradients, sums over every (b, h), are left out. */
static fg_status backward_reference(state *s, const fg_attention_args *host) {
    const options *o = &s->o;
    backward *b = &s->bw;
    b->sliced = over_budget(o, 2.5);
    fg_attention_args ra;
    reference_args(o, host, b->sliced, s->hq, s->hk, s->hv, &ra);
    /* Not read (the reference recomputes the forward), but required. */
    ra.out = s->gout, ra.lse = s->glse;
    const size_t D = (size_t)o->head_dim;
    b->g[0].nref = (size_t)ra.batch * ra.heads_q * o->q_len * D;
    b->g[1].nref = b->g[2].nref = (size_t)ra.batch * ra.heads_kv * o->kv_len * D;
    for (int i = 3; i < b->n; i++) b->g[i].nref = b->sliced ? 0 : b->g[i].n;
    for (int i = 0; i < b->n; i++) {
        if (!b->g[i].nref) continue;
        b->g[i].ref = malloc(sizeof(double) * b->g[i].nref);
        if (!b->g[i].ref) return fgi_error(s->ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the reference");
    }
    fg_attention_bwd_args rb = fg_attention_bwd_args_init();
    rb.fwd = &ra;
    rb.dout = b->hdout;
    memcpy(rb.dout_stride, ra.out_stride, sizeof rb.dout_stride);
    rb.dq = b->g[0].ref, rb.dk = b->g[1].ref, rb.dv = b->g[2].ref;
    for (size_t k = 0; k < b->nbinds && !b->sliced; k++) {
        /* The reference's gradient bindings take double arrays. */
        b->ref_binds[k] = b->binds[k];
        b->ref_binds[k].value.buffer.data = b->g[3 + k].ref;
    }
    rb.grad_binds = b->ref_binds, rb.ngrad_binds = b->sliced ? 0 : b->nbinds;
    return fg_attention_reference_backward(s->ctx, s->mod, &rb);
}

/* Compare and print a line per gradient; whether all are within tolerance. */
static bool backward_report(state *s, double first_ms) {
    const options *o = &s->o;
    backward *b = &s->bw;
    const double tol = o->dtype == FG_BF16 ? 2e-2 : 5e-3;
    bool ok = true;
    long differ = 0;
    size_t total = 0;
    printf("backward%s: first call %.1f ms, random dout\n", o->deterministic ? " (deterministic)" : "", first_ms);
    if (!o->no_reference && b->sliced)
        printf("backward checked against the reference: batch 0, query heads 0..%d, kv head 0 (the whole problem "
               "is large)\n",
               o->heads / o->kv_heads - 1);
    for (int i = 0; i < b->n; i++) {
        grad *t = &b->g[i];
        for (size_t j = 0; j < t->n; j++) t->nonfinite += !isfinite(grad_value(t, t->gpu, o->dtype, j));
        if (t->again)
            for (size_t j = 0, w = t->fp32 ? 4 : 2; j < t->n; j++)
                t->differ += memcmp((const char *)t->gpu + j * w, (const char *)t->again + j * w, w) != 0;
        differ += t->differ, total += t->n;
        ok = ok && t->nonfinite == 0;
        if (t->ref) {
            double num = 0, den = 0;
            for (size_t j = 0; j < t->nref; j++) {
                double g = grad_value(t, t->gpu, o->dtype, j), x = t->ref[j];
                num += (g - x) * (g - x);
                den += x * x;
            }
            t->rel = den > 0 ? sqrt(num / den) : sqrt(num);
            ok = ok && t->rel <= tol; /* false for NaN too */
            printf("%s: relative Frobenius error %.3e (tolerance %.0e), non-finite %ld\n", t->name, t->rel, tol,
                   t->nonfinite);
        } else if (o->no_reference) {
            printf("%s: non-finite %ld\n", t->name, t->nonfinite);
        } else {
            printf("%s: not compared (a sum over every (b, h), the reference ran on a slice), non-finite %ld\n",
                   t->name, t->nonfinite);
        }
    }
    if (o->deterministic) {
        if (differ == 0) printf("deterministic: a second run is bit-identical\n");
        else printf("deterministic: a second run differs in %ld of %zu values\n", differ, total);
        ok = ok && differ == 0;
    }
    return ok;
}

/* The backward after the forward call `a` (its out and lse on the device):
 * run, check, report. An exit code, FG_EXIT_OK to go on; *ok says whether
 * the gradients are within tolerance. */
static int check_backward(state *s, const fg_attention_args *a, const fg_attention_args *host, uint64_t *seed,
                          bool *ok) {
    fg_ctx *ctx = s->ctx;
    double first_ms = 0, again_ms;
    fg_status st = backward_setup(s, a, seed);
    if (st == FG_OK) st = backward_run(ctx, s->mod, &s->bw, false, &first_ms);
    if (st == FG_OK && s->o.deterministic) st = backward_run(ctx, s->mod, &s->bw, true, &again_ms);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check: backward");
    if (!s->o.no_reference) {
        st = backward_reference(s, host);
        if (st != FG_OK) return fg_cli_fail(ctx, st, "check: reference backward");
    }
    *ok = backward_report(s, first_ms);
    return FG_EXIT_OK;
}

/* ---- the call's inputs: lengths, pages, device memory ---------------------------- */

/* The rows of a contiguous [B, Hkv, KV, D] tensor past each sequence's
 * length, poisoned: no kernel may read them. */
static void poison_past_lengths(const options *o, uint16_t *x) {
    const size_t D = (size_t)o->head_dim;
    for (int b = 0; b < o->batch; b++)
        for (int h = 0; h < o->kv_heads; h++) {
            const size_t row0 = ((size_t)b * o->kv_heads + h) * o->kv_len + kv_len_of(o, b);
            const size_t n = (size_t)(o->kv_len - kv_len_of(o, b)) * D;
            for (size_t i = 0; i < n; i++) x[row0 * D + i] = POISON16;
        }
}

/* K and V moved into a paged cache. The pages are shuffled by a stream of
 * their own, so the values stay those of the contiguous run. */
static int page_kv(state *s) {
    const options *o = &s->o;
    const uint64_t seed = 0xD1B54A32D192ED03ull ^ (uint64_t)o->seed;
    if (fg_cli_paging_make(o->batch, o->kv_len, o->kv_lens, o->page_size, seed, &s->pg) != 0)
        return fg_cli_error(FG_EXIT_OTHER, "check: out of host memory for the block table");
    uint16_t *k = fg_cli_paged_copy(&s->pg, s->hk, o->kv_heads, o->kv_len, o->head_dim, o->kv_lens, POISON16);
    uint16_t *v = fg_cli_paged_copy(&s->pg, s->hv, o->kv_heads, o->kv_len, o->head_dim, o->kv_lens, POISON16);
    if (!k || !v) {
        free(k), free(v);
        return fg_cli_error(FG_EXIT_OTHER, "check: out of host memory for the paged cache");
    }
    free(s->hk), free(s->hv);
    s->hk = k, s->hv = v;
    s->nk = fg_cli_paged_elems(&s->pg, o->kv_heads, o->head_dim);
    return FG_EXIT_OK;
}

/* q, k and v on the host, drawn from `seed` as a contiguous, uniform run
 * draws them, then cut to the sequences' lengths and paged; room for the
 * GPU's out and lse. */
static int host_inputs(state *s, uint64_t *seed) {
    const options *o = &s->o;
    const size_t D = (size_t)o->head_dim, nq = (size_t)o->batch * o->heads * o->q_len * D;
    s->nk = (size_t)o->batch * o->kv_heads * o->kv_len * D;
    s->hq = random_tensor(nq, o->dtype, o->normal, seed);
    s->hk = random_tensor(s->nk, o->dtype, o->normal, seed);
    s->hv = random_tensor(s->nk, o->dtype, false, seed);
    s->gout = malloc(nq * 2);
    s->glse = malloc(sizeof(float) * (size_t)o->batch * o->heads * o->q_len);
    if (!s->hq || !s->hk || !s->hv || !s->gout || !s->glse)
        return fg_cli_error(FG_EXIT_OTHER, "check: out of host memory");
    if (o->kv_lens) poison_past_lengths(o, s->hk), poison_past_lengths(o, s->hv);
    return o->paged ? page_kv(s) : FG_EXIT_OK;
}

/* A device copy of n int32 values; none for NULL. */
static fg_status upload_ints(fg_ctx *ctx, CUdeviceptr *d, const int32_t *p, size_t n) {
    return p ? upload(ctx, d, p, n * sizeof *p) : FG_OK;
}

/* Everything the GPU call reads, and its out and lse, poisoned. */
static fg_status device_inputs(state *s) {
    const options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    device *dv = &s->dev;
    const size_t nl = (size_t)o->batch * o->heads * o->q_len, nq = nl * (size_t)o->head_dim;
    FGI_TRY(upload(ctx, &dv->q, s->hq, nq * 2));
    FGI_TRY(upload(ctx, &dv->k, s->hk, s->nk * 2));
    FGI_TRY(upload(ctx, &dv->v, s->hv, s->nk * 2));
    FGI_TRY(upload(ctx, &dv->out, NULL, nq * 2));
    FGI_TRY(upload(ctx, &dv->lse, NULL, nl * 4));
    FGI_TRY(upload_ints(ctx, &dv->kv_lens, o->kv_lens, (size_t)o->batch));
    FGI_TRY(upload_ints(ctx, &dv->q_offsets, o->q_offsets, (size_t)o->batch));
    FGI_TRY(upload_ints(ctx, &dv->table, s->pg.table, (size_t)o->batch * (size_t)s->pg.max_pages));
    FGI_TRY(device_binds(ctx, &s->hb, dv));
    FGI_CU_TRY(ctx, fgi_cu()->cuMemsetD8(dv->out, 0xff, nq * 2), "cuMemsetD8");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemsetD8(dv->lse, 0xff, nl * 4), "cuMemsetD8");
    return FG_OK;
}

/* The block mask, built on the GPU for the call's positions (the q offset
 * every sequence shares, block_mask_positions saw to it) as a user builds
 * it: one row for every sequence (head) when mask_mod never reads b (h). */
static fg_status make_block_mask(state *s) {
    const options *o = &s->o;
    bool uses_b, uses_h;
    fgi_bm_mask_uses(s->mod, &uses_b, &uses_h);
    fg_block_mask_desc bd = fg_block_mask_desc_init();
    bd.batch = uses_b ? o->batch : 1, bd.heads = uses_h ? o->heads : 1;
    bd.q_len = o->q_len, bd.kv_len = o->kv_len, bd.q_block = bd.kv_block = o->block;
    bd.q_offset = q_offset_of(o, 0), bd.kv_offset = o->kv_offset;
    FGI_TRY(fg_block_mask_create_gpu(s->ctx, s->mod, &bd, s->dev.binds, s->dev.nbinds, NULL, &s->bm));
    return fg_block_mask_download(s->ctx, s->bm);
}

/* The GPU call on the device inputs. */
static fg_attention_args gpu_args(const state *s) {
    const options *o = &s->o;
    const device *dv = &s->dev;
    fg_attention_args a = fg_attention_args_init();
    a.batch = o->batch, a.heads_q = o->heads, a.heads_kv = o->kv_heads;
    a.q_len = o->q_len, a.kv_len = o->kv_len, a.head_dim = o->head_dim, a.dtype = o->dtype;
    a.q = (const void *)(uintptr_t)dv->q, a.k = (const void *)(uintptr_t)dv->k;
    a.v = (const void *)(uintptr_t)dv->v, a.out = (void *)(uintptr_t)dv->out;
    a.lse = (float *)(uintptr_t)dv->lse;
    a.scale = (float)o->scale;
    a.q_offset = o->q_offset, a.kv_offset = o->kv_offset;
    a.block_mask = s->bm;
    a.binds = dv->binds, a.nbinds = dv->nbinds;
    a.kv_lens = (const int32_t *)(uintptr_t)dv->kv_lens;
    a.q_offsets = (const int32_t *)(uintptr_t)dv->q_offsets;
    if (o->paged) {
        a.block_table = (const int32_t *)(uintptr_t)dv->table;
        a.page_size = o->page_size, a.num_pages = s->pg.num_pages, a.max_pages = s->pg.max_pages;
    }
    return a;
}

/* ---- the forward's check and timing -------------------------------------------------- */

/* The checked call: fg_attention_forward (the first call compiles: timed
 * to the kernel's end), its out and lse copied to the host, then the
 * kernel that ran (fg_attention_kernel_for names it). */
static fg_status first_call(state *s, const fg_attention_args *a, double *first_ms) {
    const options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    const size_t nl = (size_t)o->batch * o->heads * o->q_len, nq = nl * (size_t)o->head_dim;
    const double t0 = fgi_now_ms();
    FGI_TRY(fg_attention_forward(ctx, s->mod, a));
    FGI_CU_TRY(ctx, fgi_cu()->cuCtxSynchronize(), "kernel execution");
    *first_ms = fgi_now_ms() - t0;
    FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyDtoH(s->gout, s->dev.out, nq * 2), "cuMemcpyDtoH");
    FGI_CU_TRY(ctx, fgi_cu()->cuMemcpyDtoH(s->glse, s->dev.lse, nl * 4), "cuMemcpyDtoH");
    return fg_attention_kernel_for(ctx, s->mod, a, &s->kernel);
}

/* Up to 16 values of a per-sequence array, comma-separated. */
static void print_list(const char *name, const int32_t *v, int n) {
    printf("%s ", name);
    for (int i = 0; i < n && i < 16; i++) printf("%s%d", i ? "," : "", (int)v[i]);
    if (n > 16) printf(",... (%d in all)", n);
}

static void print_summary(const state *s, double first_ms) {
    const options *o = &s->o;
    printf("mod %s: B=%d Hq=%d Hkv=%d Q=%d KV=%d D=%d %s", fg_mod_name(s->mod), o->batch, o->heads, o->kv_heads,
           o->q_len, o->kv_len, o->head_dim, o->dtype == FG_BF16 ? "bf16" : "fp16");
    if (o->paged)
        printf(", paged (page %d, %d pages, %d per sequence at most)", o->page_size, s->pg.num_pages,
               s->pg.max_pages);
    int64_t approx = 0;
    fg_ctx_get_int(s->ctx, FG_OPT_APPROX_MATH, &approx);
    printf("%s, kernel: %s%s (first call %.1f ms)\n", s->bm ? ", GPU block mask" : "",
           fg_cli_kernel_name(fg_kernel_kind_of(s->kernel)), approx ? " with approximate math" : "", first_ms);
    if (!o->kv_lens && !o->q_offsets) return;
    printf("per sequence: ");
    if (o->kv_lens) print_list("kv_lens", o->kv_lens, o->batch);
    if (o->kv_lens && o->q_offsets) printf("; ");
    if (o->q_offsets) print_list("q_offsets", o->q_offsets, o->batch);
    printf("%s\n", o->q_offsets_derived ? " (kv_lens - q_len: the queries are the newest tokens)" : "");
}

/* --time: the forward on the kernel that ran, and the backward. */
static int time_check(state *s, const fg_attention_args *a) {
    const options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    double density, ms = 0;
    fg_status st = density_of(ctx, s->mod, &s->hb, s->bm, o, q_offset_of(o, 0), &density);
    if (st == FG_OK) st = time_runs(ctx, s->kernel, a, NULL, o->time_n, o->sustain_ms, &ms);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check: timing");
    const double keys = total_keys(o);
    const double flops = 4.0 * o->heads * (double)o->q_len * keys * o->head_dim * density;
    printf("time: median %.3f ms over %d launches, density %.4f, %.1f TFLOP/s\n", ms, o->time_n, density,
           flops / (ms * 1e-3) / 1e12);
    if (o->q_len <= FG_DECODE_MAX_Q || o->paged) { /* bound by reading K/V */
        const double bytes = 2.0 * 2.0 * o->kv_heads * o->head_dim * keys;
        printf("K/V: %.1f MB read per call, %.3f TB/s of K/V\n", bytes / 1e6, bytes / (ms * 1e-3) / 1e12);
    }
    if (!o->backward) return FG_EXIT_OK;
    fg_kernel *k = NULL;
    /* A workspace of its own, as a training loop keeps one: from the
     * library's pool, each launch after the synchronisation that ends the
     * one before would map its hundreds of MB afresh (~0.2 ms at B=4 H=16
     * S=8192), which is not the kernels' time. */
    fg_attention_bwd_args bw = s->bw.args;
    size_t ws_bytes = 0;
    CUdeviceptr ws = 0;
    st = fg_attention_backward_workspace_size(ctx, s->mod, &bw, &ws_bytes);
    if (st == FG_OK && ws_bytes > 0) st = fgi_cu_status(ctx, fgi_cu()->cuMemAlloc(&ws, ws_bytes), "cuMemAlloc");
    bw.workspace = (void *)(uintptr_t)ws;
    bw.workspace_size = ws_bytes;
    /* the kernel fg_attention_backward would run (its -lead form where
     * the block mask asks for it) */
    if (st == FG_OK) st = fg_attention_backward_kernel_for(ctx, s->mod, &bw, &k);
    if (st == FG_OK) st = time_runs(ctx, k, a, &bw, o->time_n, o->sustain_ms, &ms);
    fg_kernel_release(k);
    if (ws) fgi_cu()->cuMemFree(ws);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check: timing the backward");
    printf("time backward%s: median %.3f ms over %d launches, %.1f TFLOP/s (2.5x the forward's FLOPs)\n",
           o->deterministic ? " (deterministic)" : "", ms, o->time_n, 2.5 * flops / (ms * 1e-3) / 1e12);
    return FG_EXIT_OK;
}

/* The GPU's outputs against the reference (or, with --no-reference, only
 * for non-finite values); prints the summary and the errors. Whether they
 * are within tolerance goes to *ok. */
static int check_forward(state *s, const fg_attention_args *host, double first_ms, bool *ok) {
    const options *o = &s->o;
    const size_t nl = (size_t)o->batch * o->heads * o->q_len, nq = nl * (size_t)o->head_dim;
    result r;
    if (o->no_reference) {
        memset(&r, 0, sizeof r);
        r.checked_batch = o->batch, r.checked_heads = o->heads;
        for (size_t i = 0; i < nq; i++) r.nonfinite += !isfinite(from16(o->dtype, s->gout[i]));
        for (size_t i = 0; i < nl; i++) r.nonfinite += isnan(s->glse[i]);
    } else {
        fg_status st = compare(s->ctx, s->mod, host, o, s->hq, s->hk, s->hv, s->gout, s->glse, &r);
        if (st != FG_OK) return fg_cli_fail(s->ctx, st, "check: reference");
    }
    const double tol = o->dtype == FG_BF16 ? 1e-2 : 2e-3;
    *ok = r.rel <= tol && r.lse_err <= 1e-3 && r.nonfinite == 0 && r.lse_mismatch == 0;
    print_summary(s, first_ms);
    if (o->no_reference) printf("no reference run (--no-reference): only non-finite values checked\n");
    else if (r.checked_batch != o->batch || r.checked_heads != o->heads)
        printf("checked against the reference: batch 0, query heads 0..%d (the whole problem is large)\n",
               r.checked_heads - 1);
    if (!o->no_reference) {
        printf("out: relative Frobenius error %.3e (tolerance %.0e)\n", r.rel, tol);
        printf("lse: max error %.3e (tolerance 1e-3 (1 + |lse|)), -inf mismatches %ld\n", r.lse_err,
               r.lse_mismatch);
    }
    printf("non-finite values: %ld\n", r.nonfinite);
    return FG_EXIT_OK;
}

static int run_check(state *s) {
    options *o = &s->o;
    fg_ctx *ctx = s->ctx;
    int rc = fg_cli_load_mod(ctx, &o->mod, &s->mod);
    if (rc) return rc;
    rc = fg_cli_bind(ctx, s->mod, &o->mod, &s->hb);
    if (rc) return rc;
    s->have_hb = true;
    fg_status st = o->decode_kernel >= 0 ? fg_ctx_set_int(ctx, FG_OPT_DECODE_KERNEL, o->decode_kernel) : FG_OK;
    if (st == FG_OK && o->approx_math) st = fg_ctx_set_int(ctx, FG_OPT_APPROX_MATH, 1);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");
    st = fgi_cuda_ready(ctx);
    if (st == FG_ERR_NO_DEVICE)
        return fg_cli_error(FG_EXIT_NO_GPU, "check: no usable CUDA device (%s): the check needs a GPU",
                            fg_errmsg(ctx));
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");

    uint64_t seed = 0x9E3779B97F4A7C15ull ^ ((uint64_t)o->seed * 0x100000001b3ull);
    rc = host_inputs(s, &seed);
    if (rc) return rc;
    st = device_inputs(s);
    if (st != FG_OK) return fg_cli_fail(ctx, st, "check");
    if (o->block_mask && (st = make_block_mask(s)) != FG_OK) return fg_cli_fail(ctx, st, "check: block mask");
    const fg_attention_args a = gpu_args(s);
    if (o->paged && (st = fg_block_table_check(ctx, &a, s->pg.table, o->kv_lens)) != FG_OK)
        return fg_cli_fail(ctx, st, "check: block table");
    double first_ms = 0;
    if ((st = first_call(s, &a, &first_ms)) != FG_OK) return fg_cli_fail(ctx, st, "check");

    /* the reference reads the same call from host memory */
    fg_attention_args host = a;
    host.binds = s->hb.binds, host.nbinds = s->hb.n;
    host.kv_lens = o->kv_lens, host.q_offsets = o->q_offsets, host.block_table = s->pg.table;
    bool ok = false, bwd_ok = true;
    rc = check_forward(s, &host, first_ms, &ok);
    if (rc == FG_EXIT_OK && o->backward) rc = check_backward(s, &a, &host, &seed, &bwd_ok);
    if (rc == FG_EXIT_OK && o->time_n > 0) rc = time_check(s, &a);
    if (rc) return rc;
    ok = ok && bwd_ok;
    printf("%s\n", ok ? "PASS" : "FAIL: outside tolerance");
    return ok ? FG_EXIT_OK : FG_EXIT_TOLERANCE;
}

static void options_free(options *o) {
    free(o->kv_lens), free(o->q_offsets);
    o->kv_lens = o->q_offsets = NULL;
}

int fg_cmd_check(int argc, char **argv) {
    state s;
    memset(&s, 0, sizeof s);
    int rc = parse_args(argc, argv, &s.o);
    if (rc) {
        options_free(&s.o);
        return rc < 0 ? FG_EXIT_OK : rc;
    }
    if (fg_ctx_create(&s.ctx) != FG_OK) {
        options_free(&s.o);
        return fg_cli_error(FG_EXIT_OTHER, "check: out of memory");
    }
    rc = run_check(&s);
    device_free(&s.dev); /* frees only what was allocated */
    fg_block_mask_destroy(s.bm);
    fg_kernel_release(s.kernel);
    if (s.have_hb) fg_cli_bindings_free(&s.hb);
    fg_mod_destroy(s.mod);
    backward_free(&s.bw);
    fg_cli_paging_free(&s.pg);
    free(s.hq), free(s.hk), free(s.hv), free(s.gout), free(s.glse);
    options_free(&s.o);
    fg_ctx_destroy(s.ctx);
    return rc;
}
