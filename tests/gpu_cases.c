/* gpu_cases.c -- see gpu_cases.h. */
#include "gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- inputs ---------------------------------------------------------------- */

uint64_t rng = 0x5eed1234abcdULL;

const char *const gallery[NGALLERY] = {"noop",     "causal",  "sliding_window", "prefix_lm",
                                       "document", "jagged",  "sasa",           "natten",
                                       "alibi",    "softcap", "flamingo",       "dilated",
                                       "local_global"};
const shape shapes[NSHAPES] = {
    {1, 2, 2, 1, 1},     {2, 2, 1, 17, 129},  {1, 2, 2, 127, 127}, {1, 1, 1, 129, 1000},
    {2, 2, 2, 257, 255}, {1, 1, 1, 1000, 17}, {1, 2, 1, 1000, 1000},
};

double normal(void) {
    double u = tu_rand_uniform(&rng), v = tu_rand_uniform(&rng);
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

uint16_t to16(fg_dtype dt, float f) {
    if (dt == FG_BF16) {
        uint32_t u;
        memcpy(&u, &f, 4);
        u += 0x7fff + ((u >> 16) & 1);
        return (uint16_t)(u >> 16);
    }
    /* fp16 (|f| well inside the normal range here): round to nearest. */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int e = (int)((u >> 23) & 255) - 127 + 15;
    uint32_t m = u & 0x7fffff;
    if (e <= 0) return (uint16_t)sign; /* tiny: flush to zero */
    uint32_t h = ((uint32_t)e << 10) | (m >> 13);
    uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

uint16_t *random16(fg_dtype dt, size_t n, bool is_normal) {
    uint16_t *x = malloc(n * 2);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++)
        x[i] = to16(dt, is_normal ? (float)normal() : (float)(2 * tu_rand_uniform(&rng) - 1));
    return x;
}

/* ---- buffers and scalars for the gallery ---------------------------------- */


void add_scalar(binds *bb, fg_binding b) {
    bb->host[bb->n] = b;
    bb->dev[bb->n] = b;
    bb->n++;
}

void add_buffer(binds *bb, const char *name, fg_type type, void *data, int len) {
    int k = bb->n++;
    bb->mem[k] = data;
    assert_int_equal(fgi_cu()->cuMemAlloc(&bb->dmem[k], 4 * (size_t)len), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemcpyHtoD(bb->dmem[k], data, 4 * (size_t)len), CUDA_SUCCESS);
    if (type == FG_TYPE_INT) {
        bb->host[k] = fg_bind_int_buffer(name, data, len);
        bb->dev[k] = fg_bind_int_buffer(name, (const int32_t *)(uintptr_t)bb->dmem[k], len);
    } else {
        bb->host[k] = fg_bind_float_buffer(name, data, len);
        bb->dev[k] = fg_bind_float_buffer(name, (const float *)(uintptr_t)bb->dmem[k], len);
    }
}

void binds_free(binds *bb) {
    for (int i = 0; i < bb->n; i++) {
        free(bb->mem[i]);
        if (bb->dmem[i]) fgi_cu()->cuMemFree(bb->dmem[i]);
    }
}

/* Documents of random lengths (up to max_len) back to back. */
int32_t *documents(int n, int max_len) {
    int32_t *doc = malloc(sizeof *doc * (size_t)n);
    int id = 0, left = 1 + (int)(tu_rand_u64(&rng) % (uint64_t)max_len);
    for (int i = 0; i < n; i++) {
        if (left == 0) id++, left = 1 + (int)(tu_rand_u64(&rng) % (uint64_t)max_len);
        doc[i] = id;
        left--;
    }
    return doc;
}

/* The parameters of a gallery mod for a problem whose mods see q indices
 * [q_offset, q_offset + q) and kv indices [kv_offset, kv_offset + kv). */
void gallery_binds(const char *name, const acase *c, binds *bb) {
    memset(bb, 0, sizeof *bb);
    if (!name) return;
    const int nq = c->q_offset + c->q, nkv = c->kv_offset + c->kv;
    const int n = nq > nkv ? nq : nkv;
    if (!strcmp(name, "sliding_window")) {
        add_scalar(bb, fg_bind_int("WINDOW", n / 5 + 1));
    } else if (!strcmp(name, "prefix_lm")) {
        add_scalar(bb, fg_bind_int("PREFIX", n / 3));
    } else if (!strcmp(name, "document")) {
        add_buffer(bb, "document_id", FG_TYPE_INT, documents(n, n / 3 + 2), n);
    } else if (!strcmp(name, "jagged")) {
        /* Sequences back to back over the first 90 % of the tokens, the
         * rest padding (-1). */
        int32_t *seq = malloc(sizeof *seq * (size_t)n), *off = malloc(sizeof *off * (size_t)(n + 1));
        int real = n - n / 10, s = 0, left = 0;
        for (int i = 0; i < n; i++) {
            if (i >= real) {
                seq[i] = -1;
                continue;
            }
            if (left == 0) {
                off[s++] = i;
                left = 1 + (int)(tu_rand_u64(&rng) % (uint64_t)(n / 4 + 1));
            }
            seq[i] = s - 1;
            left--;
        }
        off[s] = real;
        add_buffer(bb, "offsets", FG_TYPE_INT, off, s + 1);
        add_buffer(bb, "seq_idx", FG_TYPE_INT, seq, n);
    } else if (!strcmp(name, "sasa")) {
        add_scalar(bb, fg_bind_int("W", 16));
        add_scalar(bb, fg_bind_int("WINDOW", 3));
    } else if (!strcmp(name, "natten")) {
        add_scalar(bb, fg_bind_int("W", 16));
        add_scalar(bb, fg_bind_int("H", (n + 15) / 16 < 5 ? 5 : (n + 15) / 16));
        add_scalar(bb, fg_bind_int("KERNEL", 5));
    } else if (!strcmp(name, "alibi")) {
        float *sl = malloc(sizeof *sl * (size_t)c->hq);
        for (int h = 0; h < c->hq; h++) sl[h] = powf(2.0f, -8.0f * (float)(h + 1) / (float)c->hq);
        add_buffer(bb, "slopes", FG_TYPE_FLOAT, sl, c->hq);
    } else if (!strcmp(name, "softcap")) {
        add_scalar(bb, fg_bind_float("SOFTCAP", 2.0f)); /* scores reach ~ +-4: it bites */
    } else if (!strcmp(name, "flamingo")) {
        /* 4 images; the first fifth of the text belongs to none. */
        int32_t *ti = malloc(sizeof *ti * (size_t)nq), *ki = malloc(sizeof *ki * (size_t)nkv);
        for (int i = 0; i < nq; i++) ti[i] = (int)((int64_t)i * 5 / nq) - 1;
        for (int j = 0; j < nkv; j++) ki[j] = (int)((int64_t)j * 4 / nkv);
        add_buffer(bb, "text_image", FG_TYPE_INT, ti, nq);
        add_buffer(bb, "kv_image", FG_TYPE_INT, ki, nkv);
    } else if (!strcmp(name, "dilated")) {
        /* every third key, reaching back about 0.3 n */
        add_scalar(bb, fg_bind_int("DILATION", 3));
        add_scalar(bb, fg_bind_int("WINDOW", n / 10 + 2));
    } else if (!strcmp(name, "local_global")) {
        /* a band of about n / 8, and the first 5 keys for every query */
        add_scalar(bb, fg_bind_int("WINDOW", n / 8 + 1));
        add_scalar(bb, fg_bind_int("GLOBAL", 5));
    }
}

/* ---- one case -------------------------------------------------------------- */

/* Element strides (b, h, s, d) of a [B, H, S, D] tensor in the case's layout. */
void strides_of(const acase *c, int h, int s, int64_t st[4], size_t *elems) {
    const int64_t row = c->d + (c->layout == BSHD ? c->pad : 0);
    if (c->layout == BSHD) {
        st[3] = 1, st[2] = (int64_t)h * row, st[1] = row, st[0] = (int64_t)s * h * row;
    } else {
        st[3] = 1, st[2] = row, st[1] = (int64_t)s * row, st[0] = (int64_t)h * s * row;
    }
    *elems = (size_t)c->b * (size_t)st[0];
}

uint16_t *random_tensor(const acase *c, int h, int s, const int64_t st[4], size_t elems,
                               bool is_normal) {
    uint16_t *x = malloc(elems * 2);
    for (size_t i = 0; i < elems; i++) x[i] = 0xffff; /* padding stays NaN */
    for (int b = 0; b < c->b; b++)
        for (int hh = 0; hh < h; hh++)
            for (int ss = 0; ss < s; ss++)
                for (int d = 0; d < c->d; d++) {
                    float v = is_normal ? (float)normal() : (float)(2 * tu_rand_uniform(&rng) - 1);
                    x[b * st[0] + hh * st[1] + ss * st[2] + d] = to16(c->dtype, v);
                }
    return x;
}

CUdeviceptr upload(const void *p, size_t bytes) {
    CUdeviceptr d;
    assert_int_equal(fgi_cu()->cuMemAlloc(&d, bytes), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemcpyHtoD(d, p, bytes), CUDA_SUCCESS);
    return d;
}

double from16(fg_dtype dt, uint16_t h) {
    if (dt == FG_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m | 1024, e - 25);
    return (h >> 15) ? -v : v;
}

double rel_err_dense16(fg_dtype dt, const uint16_t *g, const double *ref, size_t n, long *nonfinite) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double x = from16(dt, g[i]);
        if (!isfinite(x)) (*nonfinite)++;
        num += (x - ref[i]) * (x - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

const char *case_name(const acase *c, char *buf, size_t n) {
    char out_off[32] = "";
    if (c->out_off) snprintf(out_off, sizeof out_off, " out at +%d elements", c->out_off);
    snprintf(buf, n, "%s D=%d %s B=%d Hq=%d Hkv=%d Q=%d KV=%d off=%d/%d %s bm=%d(%dx%d, B%d H%d)%s%s",
             c->mod ? c->mod : "src", c->d, c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq,
             c->hkv, c->q, c->kv, c->q_offset, c->kv_offset, c->layout == BSHD ? "BSHD" : "BHSD",
             c->bm, c->q_block, c->kv_block, c->bm_b, c->bm_h, c->inf_v ? " +inf in V" : "", out_off);
    return buf;
}

fg_mod *case_mod(fg_ctx *ctx, const acase *c) {
    if (c->mod) return tu_gallery_mod(ctx, c->mod);
    fg_mod *m = NULL;
    fg_status st = fg_mod_from_source(ctx, "case", c->src, (size_t)-1, &m);
    if (st != FG_OK) print_error("%s\n", fg_error_diagnostic(ctx));
    assert_int_equal(st, FG_OK);
    return m;
}


/* ---- checks ---------------------------------------------------------------- */

out_check check_out(fg_dtype dt, const uint16_t *out, const float *lse, const double *ref, const double *ref_lse,
                    size_t rows, int d) {
    out_check c = {0};
    double num = 0, den = 0;
    for (size_t r = 0; r < rows; r++) {
        const bool masked = isinf(ref_lse[r]);
        for (int i = 0; i < d; i++) {
            const double g = from16(dt, out[r * (size_t)d + i]), x = ref[r * (size_t)d + i];
            if (!isfinite(g)) c.nonfinite++;
            if (masked && g != 0.0) c.bad_masked++;
            num += (g - x) * (g - x);
            den += x * x;
        }
        if (isnan(lse[r])) c.nonfinite++;
        else if (masked || isinf(lse[r])) c.lse_inf_mismatch += !(isinf(lse[r]) && lse[r] < 0 && masked);
        else {
            const double e = fabs(lse[r] - ref_lse[r]) / (1 + fabs(ref_lse[r]));
            if (e > c.lse_err) c.lse_err = e;
        }
    }
    c.rel = den > 0 ? sqrt(num / den) : sqrt(num);
    const double tol = dt == FG_BF16 ? 1e-2 : 2e-3;
    c.ok = c.rel <= tol && c.lse_err <= 1e-3 && c.nonfinite == 0 && c.bad_masked == 0 && c.lse_inf_mismatch == 0;
    return c;
}
