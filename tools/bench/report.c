/*
 * report.c -- the results of `flexgen bench`: a table for people (a row per
 * case, "-" where a number does not apply, the error of a failed case in
 * place of its numbers) and JSON for programs, with the command line, the
 * device, the shape and how FLOPs are counted in "meta", one object per case
 * in "rows", and null for a number that is not finite. The backward's
 * columns and fields appear only with --backward, so the forward's table
 * and JSON stay as they were without it. --decode has a table and JSON of
 * its own (a row per mod, shape and K/V layout), with the same "meta"
 * beginning and the same accuracy columns.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* The accuracy columns of a row: errors and non-finite count, or "-". */
static void print_accuracy(FILE *f, const bench_accuracy *a) {
    if (a->checked) fprintf(f, " %9.2e %9.2e %5ld", a->err_out, a->err_lse, a->nonfinite);
    else fprintf(f, " %9s %9s %5s", "-", "-", "-");
}

void bench_print_table(FILE *f, const bench_result *r, int n, bool backward) {
    fprintf(f, "%-16s %7s %9s %8s", "mod", "density", "fwd ms", "TFLOP/s");
    if (backward) fprintf(f, " %9s %8s", "bwd ms", "TFLOP/s");
    fprintf(f, " %10s %10s %9s %8s %9s %8s %9s %9s %5s %8s\n", "bm rebuild", "bm first", "1st cold", "nvrtc",
            "1st disk", "mem hit", "err out", "err lse", "nan", "kernel");
    fprintf(f, "%-16s %7s %9s %8s", "", "", "", "");
    if (backward) fprintf(f, " %9s %8s", "", "");
    fprintf(f, " %10s %10s %9s %8s %9s %8s %9s %9s %5s %8s\n", "ms", "ms", "ms", "ms", "ms", "us", "", "", "", "");
    for (int i = 0; i < n; i++) {
        if (r[i].failure[0]) {
            fprintf(f, "%-16s FAILED: %s\n", r[i].name, r[i].failure);
            continue;
        }
        char rebuild[32] = "-", first[32] = "-";
        if (!isnan(r[i].bm_rebuild_ms)) snprintf(rebuild, sizeof rebuild, "%.4f", r[i].bm_rebuild_ms);
        if (!isnan(r[i].bm_first_ms)) snprintf(first, sizeof first, "%.1f", r[i].bm_first_ms);
        fprintf(f, "%-16s %7.3f %9.3f %8.1f", r[i].name, r[i].density, r[i].fwd_ms, r[i].tflops);
        if (backward) fprintf(f, " %9.3f %8.1f", r[i].bwd_ms, r[i].bwd_tflops);
        fprintf(f, " %10s %10s %9.1f %8.1f %9.2f %8.2f", rebuild, first, r[i].cold_ms, r[i].nvrtc_ms,
                r[i].disk_ms, r[i].mem_hit_us);
        print_accuracy(f, &r[i].acc);
        fprintf(f, " %8s\n", r[i].kernel ? r[i].kernel : "-");
    }
}

void bench_print_decode_header(FILE *f) {
    fprintf(f, "%-16s %4s %7s %3s %-10s %7s %9s %7s %8s %8s %-8s %9s %9s %5s\n", "mod", "B", "KV", "Q", "K/V",
            "keys", "GPU us", "TB/s", "host us", "1st us", "kernel", "err out", "err lse", "nan");
}

void bench_print_decode_row(FILE *f, const bench_decode_result *r) {
    char layout[32] = "contiguous";
    if (r->page) snprintf(layout, sizeof layout, "paged %d", r->page);
    fprintf(f, "%-16s %4d %7d %3d %-10s", r->name, r->shape.batch, r->shape.kv_len, r->shape.q_len, layout);
    if (r->failure[0]) {
        fprintf(f, " FAILED: %s\n", r->failure);
        return;
    }
    fprintf(f, " %7lld %9.1f %7.3f %8.2f %8.2f %-8s", (long long)r->keys, r->gpu_ms * 1e3, r->tbps, r->host_us,
            r->host_first_us, r->kernel ? r->kernel : "-");
    print_accuracy(f, &r->acc);
    fputc('\n', f);
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

/* The accuracy fields of a row, when it was checked. */
static void json_accuracy(FILE *f, const bench_accuracy *a) {
    if (!a->checked) return;
    fputs(", \"error_out\": ", f);
    json_num(f, a->err_out);
    fputs(", \"error_lse\": ", f);
    json_num(f, a->err_lse);
    fprintf(f, ", \"nonfinite\": %ld", a->nonfinite);
}

/* The start of the JSON, up to the fields of "meta" each kind of run adds:
 * the date, the command line, the device, the version, the dtype and the
 * launch counts. */
static void json_meta_begin(FILE *f, const bench_opts *o, int argc, char **argv, const char *device) {
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
    fprintf(f, ", \"flexgen\": \"%s\", \"dtype\": \"%s\", \"warmup\": %d, \"iters\": %d", fg_version_string(),
            o->dtype == FG_BF16 ? "bf16" : "fp16", o->warmup, o->iters);
    fprintf(f, ", \"approx_math\": %s", o->approx_math ? "true" : "false");
}

void bench_write_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                      const bench_result *r, int n) {
    json_meta_begin(f, o, argc, argv, device);
    fprintf(f, ", \"shape\": {\"B\": %d, \"H\": %d, \"S\": %d, \"D\": %d},\n  \"flops\": "
               "\"4*B*H*S*S*D*density, density = 1 - block sparsity\"",
            o->batch, o->heads, o->seq, o->head_dim);
    if (o->backward)
        fprintf(f, ",\n  \"backward\": {\"deterministic\": %s, \"gradients\": \"dq, dk, dv and every float buffer "
                   "score_mod's value depends on\", \"flops\": \"2.5 * the forward's\"}",
                o->deterministic ? "true" : "false");
    fputs("},\n \"rows\": [", f);
    for (int i = 0; i < n; i++) {
        const bench_result *x = &r[i];
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
            {"tflops", x->tflops},           {"bwd_ms", x->bwd_ms},
            {"bwd_tflops", x->bwd_tflops},   {"block_mask_rebuild_ms", x->bm_rebuild_ms},
            {"block_mask_first_ms", x->bm_first_ms}, {"first_call_cold_ms", x->cold_ms},
            {"nvrtc_compile_ms", x->nvrtc_ms}, {"first_call_disk_ms", x->disk_ms},
            {"disk_load_ms", x->disk_load_ms}, {"memory_hit_us", x->mem_hit_us},
        };
        for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
            if (!o->backward && strncmp(nums[k].k, "bwd_", 4) == 0) continue;
            fprintf(f, ", \"%s\": ", nums[k].k);
            json_num(f, nums[k].v);
        }
        if (x->kernel) fprintf(f, ", \"kernel\": \"%s\"", x->kernel);
        json_accuracy(f, &x->acc);
        fputs("}", f);
    }
    fputs("\n ]\n}\n", f);
}

void bench_write_decode_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                             const bench_decode_result *r, int n) {
    json_meta_begin(f, o, argc, argv, device);
    fprintf(f, ", \"heads\": {\"Hq\": %d, \"Hkv\": %d}, \"D\": %d,\n  \"bytes\": \"2 (K and V) * B * Hkv * D * "
               "2 bytes * the keys some query of the step can see\", \"host_us\": \"wall-clock time of one "
               "fg_kernel_launch on the fetched kernel, in a burst of launches (host_first_us: right after a "
               "synchronisation)\"},\n \"rows\": [",
            o->heads, o->kv_heads, o->head_dim);
    for (int i = 0; i < n; i++) {
        const bench_decode_result *x = &r[i];
        char system[32] = "flexgen"; /* bench/compare_decode.py's names */
        if (x->page) snprintf(system, sizeof system, "flexgen_paged%d", x->page);
        fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
        json_str(f, x->name);
        fputs(", \"mod\": ", f);
        json_str(f, x->mod_name);
        fprintf(f, ", \"system\": \"%s\", \"B\": %d, \"KV\": %d, \"Q\": %d, \"page\": %d", system, x->shape.batch,
                x->shape.kv_len, x->shape.q_len, x->page);
        if (x->failure[0]) {
            fputs(", \"failure\": ", f);
            json_str(f, x->failure);
            fputs("}", f);
            continue;
        }
        fprintf(f, ", \"visible_keys\": %lld, \"bytes\": %.0f, \"gpu_ms\": ", (long long)x->keys, x->bytes);
        json_num(f, x->gpu_ms);
        fputs(", \"tbps\": ", f);
        json_num(f, x->tbps);
        fputs(", \"host_us\": ", f);
        json_num(f, x->host_us);
        fputs(", \"host_first_us\": ", f);
        json_num(f, x->host_first_us);
        if (x->kernel) fprintf(f, ", \"kernel\": \"%s\"", x->kernel);
        json_accuracy(f, &x->acc);
        fputs("}", f);
    }
    fputs("\n ]\n}\n", f);
}
