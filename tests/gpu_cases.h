/* gpu_cases.h -- what the attention GPU tests share (gpu_cases.c): a case
 * (mod, shape, layout, block mask), random inputs in bf16 / fp16, the
 * gallery's parameters on the host and the device, and device uploads. */
#ifndef FLEXGEN_GPU_CASES_H
#define FLEXGEN_GPU_CASES_H

#include "testutil.h"

#include <stdbool.h>
#include <stdint.h>

#include "cudrv.h"
#include "internal.h"

enum { BM_NONE = 0, BM_CPU = 1, BM_GPU = 2 };
enum { BHSD = 0, BSHD = 1 };

typedef struct acase {
    const char *mod;   /* gallery name, or NULL with `src`                */
    const char *src;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, q, kv;
    int q_offset, kv_offset;
    int layout, pad;   /* BSHD with `pad` extra elements after each row   */
    int bm, bm_b, bm_h, q_block, kv_block; /* bm_b / bm_h 0: B / H        */
    float scale;
    int expect_masked_rows; /* rows [0, n) must come out fully masked     */
    /* V of (batch 0, KV head 0) holds +inf at key kv / 2, column 0: the
     * rows of that KV head's query heads in batch 0 may come out as
     * anything (a masked key's 0 x inf is NaN in a tile's product too),
     * every other row must be exact (a kernel that walks several q tiles
     * carries nothing of one into the next) */
    int inf_v;
    /* out starts `out_off` elements into its allocation: 2 leaves it 4-byte
     * but not 16-byte aligned, which the Hopper kernels that store O by TMA
     * cannot describe (fg_attention_forward then runs the portable one) */
    int out_off;
} acase;

typedef struct binds {
    fg_binding host[8], dev[8];
    void *mem[8];
    CUdeviceptr dmem[8];
    int n;
} binds;

/* The gallery's mods, and the shapes the gallery sweeps rotate through
 * (lengths 1, 17, 127, 129, 1000, Q_LEN != KV_LEN, GQA and MQA). */
extern const char *const gallery[];
#define NGALLERY 13
typedef struct shape {
    int b, hq, hkv, q, kv;
} shape;
extern const shape shapes[];
#define NSHAPES 7

/* The tests' random stream (reseeded by nobody: every run draws the same). */
extern uint64_t rng;

double normal(void);
uint16_t to16(fg_dtype dt, float f);
/* n random values in the dtype: normal, or uniform in [-1, 1). */
uint16_t *random16(fg_dtype dt, size_t n, bool is_normal);
void add_scalar(binds *bb, fg_binding b);
void add_buffer(binds *bb, const char *name, fg_type type, void *data, int len);
void binds_free(binds *bb);
int32_t *documents(int n, int max_len);
void gallery_binds(const char *name, const acase *c, binds *bb);
void strides_of(const acase *c, int h, int s, int64_t st[4], size_t *elems);
uint16_t *random_tensor(const acase *c, int h, int s, const int64_t st[4], size_t elems,
                               bool is_normal);
CUdeviceptr upload(const void *p, size_t bytes);
double from16(fg_dtype dt, uint16_t h);
/* ||g - ref||_F / ||ref||_F over n contiguous 16-bit values (the absolute
 * norm when ref is all zero); non-finite values of g counted into
 * *nonfinite. */
double rel_err_dense16(fg_dtype dt, const uint16_t *g, const double *ref, size_t n, long *nonfinite);
const char *case_name(const acase *c, char *buf, size_t n);

/* A forward's out (`rows` rows of head dim d, in the dtype, contiguous)
 * and lse against the reference's: ok when
 *     ||out - ref||_F / ||ref||_F <= 1e-2 (bf16), 2e-3 (fp16),
 *     |lse - ref| <= 1e-3 (1 + |ref|), -inf exactly where the reference has it,
 *     no non-finite value, rows with LSE -inf exactly 0. */
typedef struct out_check {
    double rel, lse_err;
    long nonfinite, bad_masked, lse_inf_mismatch;
    bool ok;
} out_check;
out_check check_out(fg_dtype dt, const uint16_t *out, const float *lse, const double *ref, const double *ref_lse,
                    size_t rows, int d);
fg_mod *case_mod(fg_ctx *ctx, const acase *c);

/* A cmocka test that makes one call: a part of a long table or sweep (a
 * range of its rows), so that scripts/gpu_suite.sh runs the parts as
 * shards side by side; most of a part's time is its NVRTC compiles, one
 * core each. */
#define GPU_TEST(name, call) \
    static void name(void **state) { \
        (void)state; \
        call; \
    }

#endif
