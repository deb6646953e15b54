/*
 * report.c -- the results of `flexgen bench`: a table for people (a row per
 * case, "-" where a number does not apply, the error of a failed case in
 * place of its numbers) and JSON for programs, with the command line, the
 * device, the shape and how FLOPs are counted in "meta", one object per case
 * in "rows", and null for a number that is not finite. The backward's
 * columns and fields appear only with --backward, so the forward's table
 * and JSON stay as they were without it.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench.h"

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

void bench_write_json(FILE *f, const bench_opts *o, int argc, char **argv, const char *device,
                      const bench_result *r, int n) {
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
               "\"4*B*H*S*S*D*density, density = 1 - block sparsity\"",
            fg_version_string(), o->batch, o->heads, o->seq, o->head_dim, o->dtype == FG_BF16 ? "bf16" : "fp16",
            o->warmup, o->iters);
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
