/* gpu_blockmask.c -- the GPU block-mask builder agrees with the CPU builder
 * bit for bit: every array, every gallery mask, shapes with B / H broadcast,
 * odd lengths, Q_LEN != KV_LEN, blocks of 64 and 128; a rebuild with new
 * buffer contents gives the CPU answer for the new contents; upload and
 * download round-trip. */
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockmask.h"
#include "cudrv.h"

typedef struct shape {
    int batch, heads, q_len, kv_len, q_block, kv_block;
} shape;

static const shape shapes[] = {
    {1, 1, 1, 1, 128, 128},       {1, 1, 127, 127, 64, 64},     {2, 1, 129, 129, 128, 128},
    {1, 3, 1000, 1000, 128, 128}, {2, 2, 1000, 777, 64, 128},   {1, 1, 129, 1000, 64, 64},
    {1, 1, 8191, 8191, 128, 128}, {1, 2, 300, 8191, 128, 64},   {3, 2, 513, 1025, 64, 64},
};

/* Host and device copies of random values for every parameter. */
typedef struct bound {
    fg_binding host[16], dev[16];
    void *mem[16];
    CUdeviceptr dmem[16];
    size_t n;
} bound;

static void random_documents(uint64_t *rng, int32_t *doc, int n, int max_len) {
    int id = 0, left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
    for (int i = 0; i < n; i++) {
        if (left == 0) {
            id++;
            left = 1 + (int)(tu_rand_u64(rng) % (uint64_t)max_len);
        }
        doc[i] = id;
        left--;
    }
}

static void fill_buffer(uint64_t *rng, fg_type type, void *v, int len) {
    if (type == FG_TYPE_INT) random_documents(rng, v, len, 1 + (int)(tu_rand_u64(rng) % 700));
    else
        for (int k = 0; k < len; k++) ((float *)v)[k] = (float)(2 * tu_rand_uniform(rng) - 1);
}

static void bind_random(const fg_mod *mod, uint64_t *rng, int len, bound *bd) {
    memset(bd, 0, sizeof *bd);
    size_t np = fg_mod_param_count(mod);
    assert_true(np <= 16);
    for (size_t i = 0; i < np; i++) {
        fg_param_info pi;
        assert_int_equal(fg_mod_param(mod, i, &pi), FG_OK);
        size_t k = bd->n++;
        if (pi.kind == FG_PARAM_BUFFER) {
            bd->mem[k] = malloc(4 * (size_t)len);
            fill_buffer(rng, pi.type, bd->mem[k], len);
            assert_int_equal(fgi_cu()->cuMemAlloc(&bd->dmem[k], 4 * (size_t)len), CUDA_SUCCESS);
            assert_int_equal(fgi_cu()->cuMemcpyHtoD(bd->dmem[k], bd->mem[k], 4 * (size_t)len), CUDA_SUCCESS);
            const void *dp = (const void *)(uintptr_t)bd->dmem[k];
            if (pi.type == FG_TYPE_INT) {
                bd->host[k] = fg_bind_int_buffer(pi.name, bd->mem[k], len);
                bd->dev[k] = fg_bind_int_buffer(pi.name, dp, len);
            } else {
                bd->host[k] = fg_bind_float_buffer(pi.name, bd->mem[k], len);
                bd->dev[k] = fg_bind_float_buffer(pi.name, dp, len);
            }
        } else if (pi.type == FG_TYPE_INT) {
            int def = (int)pi.default_value, span = def > 0 ? def : 64;
            bd->host[k] = fg_bind_int(pi.name, 1 + (int)(tu_rand_u64(rng) % (uint64_t)(2 * span)));
            bd->dev[k] = bd->host[k];
        } else {
            bd->host[k] = fg_bind_float(pi.name, (float)(pi.default_value * 2 * tu_rand_uniform(rng)));
            bd->dev[k] = bd->host[k];
        }
    }
}

static void unbind(bound *bd) {
    for (size_t i = 0; i < bd->n; i++) {
        free(bd->mem[i]);
        if (bd->dmem[i]) fgi_cu()->cuMemFree(bd->dmem[i]);
    }
}

static void assert_same(const fg_block_mask *cpu, const fg_block_mask *gpu, const char *what) {
    for (int i = 1; i <= 8; i++) {
        const int32_t *a, *b;
        int64_t da[4], db[4];
        assert_int_equal(fg_block_mask_array_get(cpu, (fg_block_mask_array)i, &a, NULL, da), FG_OK);
        assert_int_equal(fg_block_mask_array_get(gpu, (fg_block_mask_array)i, &b, NULL, db), FG_OK);
        assert_non_null(a);
        assert_non_null(b);
        assert_memory_equal(da, db, sizeof da);
        size_t n = (size_t)(da[0] * da[1] * da[2] * da[3]);
        if (memcmp(a, b, n * sizeof *a) != 0) {
            size_t j = 0;
            while (a[j] == b[j]) j++;
            print_error("%s: array %d differs at %zu: cpu %d gpu %d\n", what, i, j, a[j], b[j]);
            fail();
        }
    }
}

static void compare_one(fg_ctx *ctx, fg_mod *mod, const shape *s, uint64_t *rng) {
    fg_block_mask_desc d = {s->batch, s->heads, s->q_len, s->kv_len, s->q_block, s->kv_block};
    bound bd;
    int len = (s->q_len > s->kv_len ? s->q_len : s->kv_len) + 16;
    bind_random(mod, rng, len, &bd);
    fg_block_mask *cpu = NULL, *gpu = NULL;
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, bd.host, bd.n, &cpu), FG_OK);
    fg_status st = fg_block_mask_create_gpu(ctx, mod, &d, bd.dev, bd.n, NULL, &gpu);
    if (st != FG_OK) print_error("%s: %s\n%s\n", fg_status_string(st), fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    const int32_t *h;
    uint64_t dptr;
    assert_int_equal(fg_block_mask_array_get(gpu, FG_BM_KV_INDICES, &h, &dptr, NULL), FG_OK);
    assert_null(h); /* nothing on the host before a download */
    assert_true(dptr != 0);
    assert_int_equal(fg_block_mask_download(ctx, gpu), FG_OK);
    char what[256];
    snprintf(what, sizeof what, "%s %dx%dx%dx%d blocks %dx%d", fg_mod_name(mod), s->batch, s->heads,
             s->q_len, s->kv_len, s->q_block, s->kv_block);
    assert_same(cpu, gpu, what);
    fg_block_mask_destroy(cpu);
    fg_block_mask_destroy(gpu);
    unbind(&bd);
}

static void test_gallery_agrees(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    DIR *dir = opendir(tu_path("mods"));
    assert_non_null(dir);
    uint64_t rng = 5;
    int tested = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        size_t n = strlen(e->d_name);
        if (n < 3 || strcmp(e->d_name + n - 2, ".c") != 0) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(n - 2), e->d_name);
        fg_mod *mod = tu_gallery_mod(ctx, name);
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) compare_one(ctx, mod, &shapes[i], &rng);
        tested++;
        fg_mod_destroy(mod);
    }
    closedir(dir);
    assert_true(tested > 0);
    print_message("gallery mods compared: %d\n", tested);
    fg_ctx_destroy(ctx);
}

/* Masks outside the gallery: no mask_mod at all, nothing true, heads that
 * differ, float buffers, and every block size the codegen accepts. */
static const char *const extra_mods[] = {
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }\n",
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return false; }\n",
    "int W = 5;\nbool mask_mod(int b, int h, int q_idx, int kv_idx) { return (q_idx + h * W) % 7 != kv_idx % 5 || b == 1; }\n",
    "int C = 16;\nconst float *bias;\nbool mask_mod(int b, int h, int q_idx, int kv_idx) { return bias[kv_idx] > 0.0f || q_idx / C == kv_idx / C; }\n",
};

static void test_extra_agrees(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    uint64_t rng = 9;
    for (size_t i = 0; i < sizeof extra_mods / sizeof extra_mods[0]; i++) {
        fg_mod *mod = NULL;
        assert_int_equal(fg_mod_from_source(ctx, "extra", extra_mods[i], (size_t)-1, &mod), FG_OK);
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) compare_one(ctx, mod, &shapes[k], &rng);
        static const int blocks[] = {16, 32, 256};
        for (size_t k = 0; k < 3; k++) {
            shape s = {2, 1, 700, 555, blocks[k], blocks[2 - k]};
            compare_one(ctx, mod, &s, &rng);
        }
        fg_mod_destroy(mod);
    }
    fg_ctx_destroy(ctx);
}

/* A document mask rebuilt in place for a new layout equals a fresh CPU
 * build for that layout; the device memory stays where it was. */
static void test_rebuild(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    fg_mod *mod = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "document",
                                        "const int *doc;\nbool mask_mod(int b, int h, int q_idx, int kv_idx) "
                                        "{ return doc[b * 4096 + q_idx] == doc[b * 4096 + kv_idx] && q_idx >= kv_idx; }\n",
                                        (size_t)-1, &mod),
                     FG_OK);
    const int B = 3, S = 4096;
    int32_t *doc = malloc(sizeof *doc * B * S);
    CUdeviceptr ddoc;
    assert_int_equal(fgi_cu()->cuMemAlloc(&ddoc, sizeof *doc * B * S), CUDA_SUCCESS);
    fg_block_mask_desc d = {B, 1, S, S, 128, 128};
    fg_block_mask *gpu = NULL;
    uint64_t rng = 3, first_ptr = 0;
    for (int round = 0; round < 4; round++) {
        for (int b = 0; b < B; b++) random_documents(&rng, doc + b * S, S, 50 + round * 400);
        assert_int_equal(fgi_cu()->cuMemcpyHtoD(ddoc, doc, sizeof *doc * B * S), CUDA_SUCCESS);
        fg_binding hb = fg_bind_int_buffer("doc", doc, B * S);
        fg_binding db = fg_bind_int_buffer("doc", (const int32_t *)(uintptr_t)ddoc, B * S);
        if (round == 0) {
            assert_int_equal(fg_block_mask_create_gpu(ctx, mod, &d, &db, 1, NULL, &gpu), FG_OK);
        } else {
            assert_int_equal(fg_block_mask_rebuild_gpu(ctx, gpu, mod, &db, 1, NULL), FG_OK);
        }
        uint64_t ptr;
        assert_int_equal(fg_block_mask_array_get(gpu, FG_BM_KV_NUM_BLOCKS, NULL, &ptr, NULL), FG_OK);
        if (round == 0) first_ptr = ptr;
        assert_int_equal(ptr, first_ptr);
        assert_int_equal(fg_block_mask_download(ctx, gpu), FG_OK);
        fg_block_mask *cpu = NULL;
        assert_int_equal(fg_block_mask_create(ctx, mod, &d, &hb, 1, &cpu), FG_OK);
        assert_same(cpu, gpu, "rebuild");
        fg_block_mask_destroy(cpu);
    }
    fg_block_mask_destroy(gpu);
    fgi_cu()->cuMemFree(ddoc);
    free(doc);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* A host-made mask goes up and comes back unchanged, and a rebuild of it on
 * the device gives the same arrays. */
static void test_upload_download(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    fg_mod *mod = NULL;
    assert_int_equal(fg_mod_from_source(ctx, "causal",
                                        "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return q_idx >= kv_idx; }\n",
                                        (size_t)-1, &mod),
                     FG_OK);
    fg_block_mask_desc d = {2, 2, 1000, 900, 64, 128};
    fg_block_mask *a = NULL, *b = NULL;
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, &a), FG_OK);
    assert_int_equal(fg_block_mask_create(ctx, mod, &d, NULL, 0, &b), FG_OK);
    assert_int_equal(fg_block_mask_upload(ctx, b), FG_OK);
    /* scribble on the host copy, then download must restore it */
    const int32_t *h;
    fg_block_mask_array_get(b, FG_BM_KV_NUM_BLOCKS, &h, NULL, NULL);
    memset((void *)h, 0x7f, 16);
    assert_int_equal(fg_block_mask_download(ctx, b), FG_OK);
    assert_same(a, b, "upload/download");
    assert_int_equal(fg_block_mask_rebuild_gpu(ctx, b, mod, NULL, 0, NULL), FG_OK);
    assert_int_equal(fg_block_mask_download(ctx, b), FG_OK);
    assert_same(a, b, "rebuild of a host-made mask");
    fg_block_mask_destroy(a);
    fg_block_mask_destroy(b);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    tu_require_gpu();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gallery_agrees),
        cmocka_unit_test(test_extra_agrees),
        cmocka_unit_test(test_rebuild),
        cmocka_unit_test(test_upload_download),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
