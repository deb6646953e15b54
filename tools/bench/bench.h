/*
 * bench.h -- what the files of `flexgen bench` share. One job each:
 *
 *   cmd_bench.c  the command: its options, the loop over the cases and the
 *                exit status (its top comment says what is measured, how);
 *   gallery.c    each case's parameter values on the host: the gallery's
 *                (those of bench/torch_mods.py) or --set / --buffer's;
 *   inputs.c     what the kernels read, in device memory: random q, k, v,
 *                the parameter values and the block mask;
 *   timing.c     the event-timed loop and its median, and the host's time
 *                per launch;
 *   measure.c    one case: block mask, first calls, forward speed, and
 *                with --backward the backward's speed;
 *   decode.c     with --decode, one decode step of a case: a shape and a
 *                K/V layout, its GPU time, TB/s and host time per call;
 *   accuracy.c   one case's output (or decode step's) against the float64
 *                CPU reference;
 *   report.c     the tables and the JSON.
 */
#ifndef FLEXGEN_TOOLS_BENCH_H
#define FLEXGEN_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "cudrv.h"
#include "flexgen.h"

#define BENCH_MAX_CASES 64
#define BENCH_MAX_PARAMS 16
#define BENCH_MAX_SETS 32
#define BENCH_MAX_SHAPES 16
#define BENCH_MAX_PAGES 8

/* ---- parameter values on the host (gallery.c) ---------------------------- */

typedef struct bench_param {
    char name[64];
    fg_param_kind kind;
    fg_type type;
    double value;      /* scalars                            */
    void *data;        /* buffers: int32_t or float, malloc'd */
    int64_t length;
} bench_param;

typedef struct bench_params {
    bench_param p[BENCH_MAX_PARAMS];
    int n;
} bench_params;

void bench_params_free(bench_params *s);
/* Host bindings of the values, b[0 .. s->n). */
void bench_params_bind(const bench_params *s, fg_binding *b);

/* A gallery mod's values for the shape (B, H, S); false when out of memory. */
typedef bool (*bench_setup_fn)(int B, int H, int S, bench_params *s);

typedef struct bench_gallery_entry {
    const char *name; /* mods/<name>.c */
    bench_setup_fn setup;
} bench_gallery_entry;

extern const bench_gallery_entry bench_gallery[];
extern const size_t bench_gallery_count;

/* ---- options (cmd_bench.c) ----------------------------------------------- */

typedef struct bench_case {
    char name[128];
    const char *mask_file, *score_file;
    bench_setup_fn setup;    /* gallery: its values; custom: none           */
} bench_case;

/* A decode step: `batch` sequences of kv_len keys, q_len new queries each
 * (bench/compare_decode.py's B:KV:Q). */
typedef struct bench_decode_shape {
    int batch, kv_len, q_len;
} bench_decode_shape;

typedef struct bench_opts {
    int batch, heads, seq, head_dim;
    fg_dtype dtype;
    int warmup, iters, check_seq;
    bool check;
    bool backward, deterministic; /* also time the backward, in this mode   */
    bool decode;                  /* --decode: decode steps (decode.c)      */
    bool approx_math;             /* FG_OPT_APPROX_MATH: --approx-math, or
                                     the environment's FLEXGEN_APPROX_MATH */
    int kv_heads;                 /* --decode: K/V heads (query heads: heads) */
    bench_decode_shape shapes[BENCH_MAX_SHAPES];
    int nshapes;
    int pages[BENCH_MAX_PAGES];   /* page sizes; 0: contiguous K/V          */
    int npages;
    const char *json;
    bench_case cases[BENCH_MAX_CASES];
    int ncases;
    const char *sets[BENCH_MAX_SETS];    /* NAME=VALUE */
    int nsets;
    const char *buffers[BENCH_MAX_SETS]; /* NAME=FILE  */
    int nbuffers;
} bench_opts;

/* The values of case c at the shape (B, H, S) into *s (emptied first): the
 * gallery's, or for a custom mod those of --set and --buffer, checked
 * against the mod's parameters. */
fg_status bench_case_params(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                            int B, int H, int S, bench_params *s);

/* ---- device memory (inputs.c) -------------------------------------------- */

/* The parameter values as the kernels take them: buffers copied to the
 * device, scalars as they are. */
typedef struct bench_dev_params {
    fg_binding binds[BENCH_MAX_PARAMS];
    CUdeviceptr mem[BENCH_MAX_PARAMS];
    size_t n;
} bench_dev_params;

fg_status bench_dev_params_upload(fg_ctx *ctx, const bench_params *s, bench_dev_params *d);
void bench_dev_params_free(bench_dev_params *d);

/* A block mask built on the GPU for calls of B x H, q_len x kv_len, with
 * the queries at q_offset + i, as a user builds it: one row for every
 * batch entry (head) when mask_mod never reads b (h); blocks of 128. */
fg_status bench_block_mask_create(fg_ctx *ctx, const fg_mod *mod, int B, int H, int q_len, int kv_len,
                                  int q_offset, const bench_dev_params *d, fg_block_mask **out);

/* n random normal values as 16-bit floats (malloc'd; NULL when out of
 * memory), the same for the same seed. */
uint16_t *bench_random_halves(size_t n, fg_dtype dt, uint64_t seed);
/* A new device copy of n 16-bit values. */
fg_status bench_upload_halves(fg_ctx *ctx, const uint16_t *h, size_t n, CUdeviceptr *out);
/* New device memory of n random normal 16-bit values, for timed runs: a
 * block of bench_random_halves(seed) repeated (the values do not change a
 * kernel's speed, and a long tensor is quick to fill). */
fg_status bench_upload_random(fg_ctx *ctx, size_t n, fg_dtype dt, uint64_t seed, CUdeviceptr *out);
/* A new device copy of n int32 values. */
fg_status bench_upload_ints(fg_ctx *ctx, const int32_t *h, size_t n, CUdeviceptr *out);

/* The timed runs' q, k, v (random), out and lse, shared by every case;
 * with --backward also dout (random), dq, dk and dv. */
typedef struct bench_inputs {
    CUdeviceptr q, k, v, out, lse;
    CUdeviceptr dout, dq, dk, dv;
} bench_inputs;

fg_status bench_inputs_alloc(fg_ctx *ctx, const bench_opts *o, bench_inputs *in);
void bench_inputs_free(const bench_inputs *in);

/* ---- timing (timing.c) --------------------------------------------------- */

typedef fg_status (*bench_launch_fn)(fg_ctx *ctx, void *arg);

/* Bytes written to flush the L2: 256 MiB, as triton.testing.do_bench (and
 * so bench/compare_decode.py) writes, over twice the L2 of current GPUs. */
#define BENCH_L2_FLUSH_BYTES ((size_t)256 << 20)

/* Median of `iters` event-timed launches after `warmup` untimed ones; with
 * `flush` (a buffer of BENCH_L2_FLUSH_BYTES, 0 for none) each timed launch
 * comes after a write of it, outside its events, so the launch finds none
 * of its inputs in the L2. */
fg_status bench_time_median(fg_ctx *ctx, bench_launch_fn fn, void *arg, int warmup, int iters,
                            CUdeviceptr flush, double *ms);
/* The host's time per launch in microseconds: the median over `rounds` of
 * the wall-clock time of `burst` back-to-back launches (the device drained
 * before each, never inside the timed region) divided by `burst`, and the
 * median of the first launch after the drain alone. */
fg_status bench_host_us(fg_ctx *ctx, bench_launch_fn fn, void *arg, int rounds, int burst, double *us,
                        double *first_us);
/* Wait for the device (cuCtxSynchronize). */
fg_status bench_sync(fg_ctx *ctx);

/* bench_launch_forward's argument: one forward pass. */
typedef struct bench_fwd_arg {
    const fg_mod *mod;
    fg_attention_args args;
} bench_fwd_arg;

fg_status bench_launch_forward(fg_ctx *ctx, void *arg);

/* bench_launch_backward's argument: one backward pass (args.fwd points at
 * the forward's arguments). */
typedef struct bench_bwd_arg {
    const fg_mod *mod;
    fg_attention_bwd_args args;
} bench_bwd_arg;

fg_status bench_launch_backward(fg_ctx *ctx, void *arg);

/* bench_launch_kernel's argument: one fg_kernel_launch of a fetched
 * kernel (what a serving loop does per step). */
typedef struct bench_kernel_arg {
    fg_kernel *kernel;
    fg_attention_args args;
} bench_kernel_arg;

fg_status bench_launch_kernel(fg_ctx *ctx, void *arg);

/* bench_launch_rebuild's argument: one in-place GPU rebuild of a block mask. */
typedef struct bench_rebuild_arg {
    fg_block_mask *mask;
    const fg_mod *mod;
    const fg_binding *binds;
    size_t nbinds;
} bench_rebuild_arg;

fg_status bench_launch_rebuild(fg_ctx *ctx, void *arg);

/* ---- results (measure.c, decode.c, accuracy.c, report.c) ----------------- */

/* An output against the float64 reference: the relative Frobenius error
 * of out, the largest LSE error, the count of non-finite outputs. */
typedef struct bench_accuracy {
    double err_out, err_lse;
    long nonfinite;
    bool checked;
} bench_accuracy;

typedef struct bench_result {
    char name[128];
    char mod_name[128];
    double density;
    double fwd_ms, tflops;
    double bwd_ms, bwd_tflops; /* with --backward                        */
    double bm_first_ms, bm_rebuild_ms;
    double cold_ms, nvrtc_ms, disk_ms, disk_load_ms, mem_hit_us;
    bench_accuracy acc;
    const char *kernel; /* the forward kernel that ran: "sm90" or "portable" */
    char failure[512];
} bench_result;

/* One decode step of a case: a shape and a K/V layout. */
typedef struct bench_decode_result {
    char name[128];
    char mod_name[128];
    bench_decode_shape shape;
    int page;              /* the page size; 0: contiguous K/V            */
    int64_t keys;          /* keys some query of the step can see         */
    double bytes;          /* of K and V the step must read               */
    double gpu_ms, tbps;   /* event-timed launches, and bytes / gpu_ms    */
    double host_us;        /* the host's time per fg_kernel_launch call   */
    double host_first_us;  /* the same for a call right after a sync      */
    const char *kernel;    /* the kernel that ran (fg_cli_kernel_name)    */
    bench_accuracy acc;
    char failure[512];
} bench_decode_result;

/* The mask file's mod, the score file's, or the two combined. */
fg_status bench_load_case_mod(fg_ctx *ctx, const bench_case *c, fg_mod **out);

/* Measure case c into *r (and check it, when o->check): on failure the
 * error is printed and kept in r->failure. */
fg_status bench_run_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const bench_inputs *in,
                         bench_result *r);
/* The accuracy check of case c's mod on (1, 2, Sc, D). */
fg_status bench_check_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                           bench_accuracy *acc);

/* ---- decode steps (decode.c) ---------------------------------------------- */

/* A paged step's host side: every sequence a->kv_len keys long with its
 * queries at a->q_offset, and pages handed out to them (paged.c; the page
 * size seeds the shuffle, so the timed step and its check agree). */
typedef struct bench_paged_step {
    int32_t *kv_lens, *q_offsets;
    fg_cli_paging pg;
} bench_paged_step;

fg_status bench_paged_step_make(fg_ctx *ctx, const fg_attention_args *a, int page, bench_paged_step *p);
/* a's kv_lens, q_offsets, block table and paging sizes become p's (host
 * memory). */
void bench_paged_step_apply(const bench_paged_step *p, fg_attention_args *a);
void bench_paged_step_free(bench_paged_step *p);

/* The timed decode steps' q, k, v (random), out and lse, shared by every
 * row, large enough for every shape and layout. */
typedef struct bench_decode_inputs {
    CUdeviceptr q, k, v, out, lse;
    CUdeviceptr flush; /* BENCH_L2_FLUSH_BYTES, written before each timed step */
} bench_decode_inputs;

fg_status bench_decode_inputs_alloc(fg_ctx *ctx, const bench_opts *o, bench_decode_inputs *in);
void bench_decode_inputs_free(const bench_decode_inputs *in);

/* Measure case c's decode step of `shape` with K/V contiguous (page 0) or
 * paged into *r (and check it, when o->check): on failure the error is
 * printed and kept in r->failure. */
fg_status bench_run_decode(fg_ctx *ctx, const bench_opts *o, const bench_case *c, bench_decode_shape shape,
                           int page, const bench_decode_inputs *in, bench_decode_result *r);
/* The accuracy check of a decode step on (min(B, 2), KV' = min(KV,
 * --check-seq or 4096), Q): the same layout, the queries at KV' - Q. */
fg_status bench_check_decode(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                             bench_decode_shape shape, int page, bench_accuracy *acc);

/* ---- reports (report.c) --------------------------------------------------- */

/* The table; `backward` adds the backward's columns. */
void bench_print_table(FILE *f, const bench_result *r, int n, bool backward);
/* The results as JSON, with the command line, the device and the shape. */
void bench_write_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                      const bench_result *r, int n);
/* The same for decode steps, the table a row at a time (a row takes
 * seconds). */
void bench_print_decode_header(FILE *f);
void bench_print_decode_row(FILE *f, const bench_decode_result *r);
void bench_write_decode_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                             const bench_decode_result *r, int n);

#endif
