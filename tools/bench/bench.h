/*
 * bench.h -- what the files of `flexgen bench` share. One job each:
 *
 *   cmd_bench.c  the command: its options, the loop over the cases and the
 *                exit status (its top comment says what is measured, how);
 *   gallery.c    each case's parameter values on the host: the gallery's
 *                (those of bench/torch_mods.py) or --set / --buffer's;
 *   inputs.c     what the kernels read, in device memory: random q, k, v
 *                and the parameter values;
 *   timing.c     the event-timed loop and its median;
 *   measure.c    one case: block mask, first calls, forward speed, and
 *                with --backward the backward's speed;
 *   accuracy.c   one case's output against the float64 CPU reference;
 *   report.c     the table and the JSON.
 */
#ifndef FLEXGEN_TOOLS_BENCH_H
#define FLEXGEN_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cudrv.h"
#include "flexgen.h"

#define BENCH_MAX_CASES 64
#define BENCH_MAX_PARAMS 16
#define BENCH_MAX_SETS 32

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

typedef struct bench_opts {
    int batch, heads, seq, head_dim;
    fg_dtype dtype;
    int warmup, iters, check_seq;
    bool check;
    bool backward, deterministic; /* also time the backward, in this mode   */
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

/* n random normal values as 16-bit floats (malloc'd; NULL when out of
 * memory), the same for the same seed. */
uint16_t *bench_random_halves(size_t n, fg_dtype dt, uint64_t seed);
/* A new device copy of n 16-bit values. */
fg_status bench_upload_halves(fg_ctx *ctx, const uint16_t *h, size_t n, CUdeviceptr *out);

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

/* Median of `iters` event-timed launches after `warmup` untimed ones. */
fg_status bench_time_median(fg_ctx *ctx, bench_launch_fn fn, void *arg, int warmup, int iters, double *ms);
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

/* bench_launch_rebuild's argument: one in-place GPU rebuild of a block mask. */
typedef struct bench_rebuild_arg {
    fg_block_mask *mask;
    const fg_mod *mod;
    const fg_binding *binds;
    size_t nbinds;
} bench_rebuild_arg;

fg_status bench_launch_rebuild(fg_ctx *ctx, void *arg);

/* ---- results (measure.c, accuracy.c, report.c) --------------------------- */

typedef struct bench_result {
    char name[128];
    char mod_name[128];
    double density;
    double fwd_ms, tflops;
    double bwd_ms, bwd_tflops; /* with --backward                        */
    double bm_first_ms, bm_rebuild_ms;
    double cold_ms, nvrtc_ms, disk_ms, disk_load_ms, mem_hit_us;
    double err_out, err_lse;
    long nonfinite;
    bool checked;
    const char *kernel; /* the forward kernel that ran: "sm90" or "portable" */
    char failure[512];
} bench_result;

/* Measure case c into *r (and check it, when o->check): on failure the
 * error is printed and kept in r->failure. */
fg_status bench_run_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const bench_inputs *in,
                         bench_result *r);
/* The accuracy check of case c's mod: fills err_out, err_lse, nonfinite and
 * sets checked. */
fg_status bench_check_case(fg_ctx *ctx, const bench_opts *o, const bench_case *c, const fg_mod *mod,
                           bench_result *r);

/* The table; `backward` adds the backward's columns. */
void bench_print_table(FILE *f, const bench_result *r, int n, bool backward);
/* The results as JSON, with the command line, the device and the shape. */
void bench_write_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                      const bench_result *r, int n);

#endif
