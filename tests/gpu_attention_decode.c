/* gpu_attention_decode.c -- the decode kernel, and ragged and paged calls
 * on the forward kernel (a prefill into a paged cache), against the CPU
 * reference.
 *
 * Every case draws fresh random inputs, poisons out and lse (all-ones bits:
 * NaN), runs fg_attention_forward and compares with fg_attention_reference
 * on the same host data (the reference reads ragged lengths, per-sequence
 * offsets and paged K/V itself):
 *     ||out - ref||_F / ||ref||_F <= 1e-2 (bf16), 2e-3 (fp16)
 *     |lse - ref| <= 1e-3 (1 + |ref|), -inf exactly where the reference has it
 *     no non-finite value, rows with LSE -inf exactly 0.
 * Queries sit at the end of their sequence (q_offsets[b] = len_b - q_len, at
 * least 0), as in a decode step. Paged cases scatter each sequence over
 * shuffled pages of a cache whose other rows hold random values, so a wrong
 * page shows; table entries past a sequence's pages are -1.
 * The table: every gallery mod over q_len 1..16, KV lengths 1 to 4097,
 * GQA 1, 4, 8 and MQA, head dims 64, 128, 256, both dtypes, contiguous and
 * every page size, ragged and uniform; then the features one at a time (a
 * 65536-key sequence, an empty sequence, a bad page, block masks, the
 * options, many row tiles); prefills of 17 to 1000 queries on the forward
 * kernel, paged, ragged, with block masks and a bad page; and the argument
 * errors.
 * FLEXGEN_TEST_QUICK=1 runs a reduced table (for compute-sanitizer). */
#include "gpu_cases.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cudrv.h"
#include "internal.h"

static int failures = 0;

/* An expected kernel: either forward kernel (the Hopper one where the GPU
 * and the call allow it). */
#define ANY_FORWARD ((fg_kernel_kind)-1)
static bool kind_is(fg_kernel_kind got, fg_kernel_kind want) {
    if (want == ANY_FORWARD) return got == FG_KERNEL_ATTENTION_FWD || got == FG_KERNEL_ATTENTION_FWD_SM90;
    return got == want;
}

typedef struct dcase {
    const char *mod;
    int d;
    fg_dtype dtype;
    int b, hq, hkv, q, kv; /* kv: the longest sequence                     */
    int ragged;            /* 1: lengths drawn in [1, kv]; 2: and one empty */
    int page;              /* page size, 0: contiguous K/V                  */
    int bad_page;          /* one used table entry outside the cache        */
    int bm;                /* a CPU block mask built at the queries' offset
                              (uniform lengths, so one q_offset): 1
                              broadcast over heads, 2 per query head       */
    int kv_block;
    int decode_opt;        /* FG_OPT_DECODE_KERNEL (0 is taken as 1, -1 as 0) */
    fg_kernel_kind expect; /* the kernel fg_attention_kernel_for picks      */
    int splits;            /* FG_OPT_DECODE_SPLITS (0: chosen per call)     */
    int pairs_opt;         /* FG_OPT_DECODE_HEAD_PAIRS (0 is taken as -1, the
                              call's choice; -1 as 0, never; 1 always)     */
    int expect_pairs;      /* 1: the -pairs kernel, -1: not it, 0: either   */
    int l2_opt;            /* FG_OPT_DECODE_L2_PREFETCH (0 is taken as -1, the
                              device's choice; -1 as 0, never; 1 always)   */
} dcase;

static bool quick(void) {
    const char *q = getenv("FLEXGEN_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static void name_of(const dcase *c, char *buf, size_t n) {
    snprintf(buf, n, "%s D=%d %s B=%d Hq=%d Hkv=%d Q=%d KV=%d %s page=%d%s%s%s", c->mod, c->d,
             c->dtype == FG_BF16 ? "bf16" : "fp16", c->b, c->hq, c->hkv, c->q, c->kv,
             c->ragged ? (c->ragged == 2 ? "ragged+empty" : "ragged") : "uniform", c->page,
             c->bad_page ? " bad-page" : "", c->bm ? " block-mask" : "",
             c->l2_opt ? (c->l2_opt > 0 ? " l2-prefetch" : " no-l2-prefetch") : "");
}

static void run_case(const dcase *c) {
    char name[256];
    name_of(c, name, sizeof name);
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    const int opt = c->decode_opt < 0 ? 0 : c->decode_opt ? c->decode_opt : 1;
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_KERNEL, opt), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_SPLITS, c->splits), FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_HEAD_PAIRS, c->pairs_opt == 0 ? -1 : c->pairs_opt > 0),
                     FG_OK);
    assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_L2_PREFETCH, c->l2_opt == 0 ? -1 : c->l2_opt > 0), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, c->mod);
    /* the gallery's parameters for positions up to kv + q */
    acase ac = {.mod = c->mod, .d = c->d, .dtype = c->dtype, .b = c->b, .hq = c->hq, .hkv = c->hkv,
                .q = c->q, .kv = c->kv, .q_offset = c->kv};
    binds bb;
    gallery_binds(c->mod, &ac, &bb);

    const int B = c->b, D = c->d;
    int32_t *lens = malloc(sizeof *lens * (size_t)B), *qoff = malloc(sizeof *qoff * (size_t)B);
    for (int b = 0; b < B; b++) {
        lens[b] = c->ragged ? 1 + (int)(tu_rand_u64(&rng) % (uint64_t)c->kv) : c->kv;
        if (c->ragged && b == 0) lens[b] = c->kv; /* the longest is there */
        if (c->ragged == 2 && b == B - 1) lens[b] = 0;
        qoff[b] = lens[b] - c->q > 0 ? lens[b] - c->q : 0;
    }

    fg_attention_args a = fg_attention_args_init();
    a.batch = B, a.heads_q = c->hq, a.heads_kv = c->hkv, a.q_len = c->q, a.kv_len = c->kv;
    a.head_dim = D, a.dtype = c->dtype;
    const size_t nq = (size_t)B * c->hq * c->q * D, nlse = (size_t)B * c->hq * c->q;
    size_t nkv; /* elements of k (and of v) */
    int32_t *table = NULL;
    int max_pages = 0, num_pages = 0;
    if (c->page) {
        max_pages = (c->kv + c->page - 1) / c->page;
        int used = 0;
        for (int b = 0; b < B; b++) used += (lens[b] + c->page - 1) / c->page;
        num_pages = used + 3;
        int *perm = malloc(sizeof *perm * (size_t)num_pages);
        for (int i = 0; i < num_pages; i++) perm[i] = i;
        for (int i = num_pages - 1; i > 0; i--) {
            int j = (int)(tu_rand_u64(&rng) % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        table = malloc(sizeof *table * (size_t)B * max_pages);
        int next = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < max_pages; i++)
                table[b * max_pages + i] = i < (lens[b] + c->page - 1) / c->page ? perm[next++] : -1;
        free(perm);
        if (c->bad_page) table[0] = num_pages + 7;
        nkv = (size_t)num_pages * c->page * c->hkv * D;
        a.page_size = c->page, a.num_pages = num_pages, a.max_pages = max_pages;
    } else {
        nkv = (size_t)B * c->hkv * c->kv * D;
    }
    uint16_t *hq = random16(c->dtype, nq, true), *hk = random16(c->dtype, nkv, true),
             *hv = random16(c->dtype, nkv, false);
    CUdeviceptr dq = upload(hq, nq * 2), dk = upload(hk, nkv * 2), dv = upload(hv, nkv * 2), dout, dlse;
    CUdeviceptr dlens = upload(lens, sizeof *lens * (size_t)B), dqoff = upload(qoff, sizeof *qoff * (size_t)B);
    CUdeviceptr dtable = table ? upload(table, sizeof *table * (size_t)B * max_pages) : 0;
    assert_int_equal(fgi_cu()->cuMemAlloc(&dout, nq * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemAlloc(&dlse, nlse * 4), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemsetD8(dout, 0xff, nq * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemsetD8(dlse, 0xff, nlse * 4), CUDA_SUCCESS);

    fg_block_mask *bm = NULL;
    if (c->bm) {
        /* bm 2: a mask per query head, which grouped heads cannot share */
        fg_block_mask_desc desc = {1, c->bm == 2 ? c->hq : 1, c->q, c->kv, 128, c->kv_block, sizeof desc,
                                   qoff[0], 0};
        fg_status st = fg_block_mask_create(ctx, mod, &desc, bb.host, (size_t)bb.n, &bm);
        if (st != FG_OK) print_error("%s: block mask: %s\n", name, fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
    }
    a.block_mask = bm;
    if (c->ragged) a.kv_lens = (const int32_t *)(uintptr_t)dlens;
    if (c->bm) a.q_offset = qoff[0]; /* uniform lengths: the mask's offset */
    else a.q_offsets = (const int32_t *)(uintptr_t)dqoff;
    if (table) a.block_table = (const int32_t *)(uintptr_t)dtable;
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    a.out = (void *)(uintptr_t)dout, a.lse = (float *)(uintptr_t)dlse;
    a.binds = bb.dev, a.nbinds = (size_t)bb.n;

    fg_kernel *k = NULL;
    fg_status st = fg_attention_kernel_for(ctx, mod, &a, &k);
    if (st != FG_OK) print_error("%s: kernel: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);
    const fg_kernel_kind kind = fg_kernel_kind_of(k);
    const int pairs = k->config.head_pairs;
    fg_kernel_release(k);
    st = fg_attention_forward(ctx, mod, &a);
    if (st != FG_OK) print_error("%s: %s: %s\n%s", name, fg_status_string(st), fg_errmsg(ctx), fg_compile_log(ctx));
    assert_int_equal(st, FG_OK);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    uint16_t *gout = malloc(nq * 2);
    float *glse = malloc(nlse * 4);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(gout, dout, nq * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(glse, dlse, nlse * 4), CUDA_SUCCESS);

    /* The reference on the same host arrays. */
    if (c->bad_page) {
        fg_attention_args t = a;
        assert_int_equal(fg_block_table_check(ctx, &t, table, c->ragged ? lens : NULL), FG_ERR_SHAPE);
        assert_non_null(strstr(fg_errmsg(ctx), "sequence 0, page 0"));
    } else if (table) {
        assert_int_equal(fg_block_table_check(ctx, &a, table, c->ragged ? lens : NULL), FG_OK);
    }
    double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nlse);
    a.q = hq, a.k = hk, a.v = hv, a.binds = bb.host;
    a.kv_lens = c->ragged ? lens : NULL;
    a.q_offsets = c->bm ? NULL : qoff;
    a.block_table = table;
    st = fg_attention_reference(ctx, mod, &a, rout, rlse);
    if (st != FG_OK) print_error("%s: reference: %s\n", name, fg_errmsg(ctx));
    assert_int_equal(st, FG_OK);

    const out_check oc = check_out(c->dtype, gout, glse, rout, rlse, nlse, D);
    const bool pairs_ok = c->expect_pairs == 0 || pairs == (c->expect_pairs > 0);
    const bool ok = oc.ok && kind_is(kind, c->expect) && pairs_ok;
    printf("%-4s %s: rel %.2e lse %.2e kernel %d%s\n", ok ? "ok" : "FAIL", name, oc.rel, oc.lse_err, (int)kind,
           pairs ? "-pairs" : "");
    fflush(stdout);
    if (!ok) {
        printf("     nonfinite %ld, nonzero masked %ld, lse -inf mismatch %ld, kernel %d%s (expected %d%s)\n",
               oc.nonfinite, oc.bad_masked, oc.lse_inf_mismatch, (int)kind, pairs ? "-pairs" : "", (int)c->expect,
               c->expect_pairs > 0 ? "-pairs" : c->expect_pairs < 0 ? " without pairs" : "");
        failures++;
    }
    free(rout), free(rlse), free(gout), free(glse), free(hq), free(hk), free(hv), free(lens), free(qoff), free(table);
    fgi_cu()->cuMemFree(dq), fgi_cu()->cuMemFree(dk), fgi_cu()->cuMemFree(dv), fgi_cu()->cuMemFree(dout);
    fgi_cu()->cuMemFree(dlse), fgi_cu()->cuMemFree(dlens), fgi_cu()->cuMemFree(dqoff);
    if (dtable) fgi_cu()->cuMemFree(dtable);
    fg_block_mask_destroy(bm);
    binds_free(&bb);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* ---- the gallery sweep ------------------------------------------------------ */

/* Every gallery mod, `reps` cases each over head dims, dtypes, batches,
 * GQA, q_len, KV lengths, ragged lengths and page sizes, in two halves
 * (mods of even and of odd index): a half's kernels compile in a process
 * of its own when the GPU suite runs one test per process, so the sweep
 * takes half the time beside the others. */
/* Every fourth mod of the gallery from `part` (four shards of
 * scripts/gpu_suite.sh, whose NVRTC compiles run side by side). */
static void gallery_part(int part) {
    static const int qs[5] = {1, 2, 4, 8, 16}, kvs[4] = {1, 17, 1000, 4097}, pages[6] = {0, 16, 32, 64, 128, 256};
    static const int dims[3] = {64, 128, 256};
    static const int heads[4][2] = {{2, 2}, {8, 2}, {8, 1}, {16, 2}}; /* GQA 1, 4, MQA 8, 8 */
    const int reps = quick() ? 1 : 4;
    for (int m = part; m < NGALLERY; m += 4)
        for (int rep = 0; rep < reps; rep++) {
            const int k = m * reps + rep;
            dcase c = {gallery[m], dims[k % 3], k % 2 ? FG_FP16 : FG_BF16, 1 + k % 3,
                       heads[k % 4][0], heads[k % 4][1], qs[k % 5], kvs[(k / 2) % 4], k % 2,
                       pages[k % 6], 0, 0, 0, 0, FG_KERNEL_ATTENTION_DECODE};
            run_case(&c);
        }
    assert_int_equal(failures, 0);
}

GPU_TEST(test_gallery_0, gallery_part(0))
GPU_TEST(test_gallery_1, gallery_part(1))
GPU_TEST(test_gallery_2, gallery_part(2))
GPU_TEST(test_gallery_3, gallery_part(3))

/* ---- the features one at a time --------------------------------------------- */

static void test_features(void **state) {
    (void)state;
    const fg_kernel_kind DEC = FG_KERNEL_ATTENTION_DECODE;
    const dcase cases[] = {
        /* one long sequence: many splits, contiguous and paged */
        {"causal", 128, FG_BF16, 1, 8, 1, 1, 65536, 0, 0, 0, 0, 0, 0, DEC},
        {"sliding_window", 128, FG_BF16, 1, 8, 2, 4, 65536, 0, 256, 0, 0, 0, 0, DEC},
        /* a batch with an empty sequence; a bad page */
        {"alibi", 64, FG_FP16, 4, 8, 2, 2, 1000, 2, 0, 0, 0, 0, 0, DEC},
        {"causal", 128, FG_BF16, 3, 4, 4, 1, 1000, 1, 16, 1, 0, 0, 0, DEC},
        {"softcap", 128, FG_BF16, 3, 32, 8, 1, 4097, 1, 64, 1, 0, 0, 0, DEC},
        /* block masks: MQA with a broadcast mask, GQA 1 with 64-row kv
         * blocks, GQA 4 with 16 queries */
        {"sliding_window", 128, FG_BF16, 2, 8, 1, 1, 4097, 0, 0, 0, 1, 128, 0, DEC},
        {"prefix_lm", 64, FG_FP16, 2, 2, 2, 8, 1000, 0, 0, 0, 1, 64, 0, DEC},
        {"causal", 128, FG_BF16, 1, 16, 4, 16, 4097, 0, 0, 0, 1, 128, 0, DEC},
        /* a block mask the decode tiles cannot walk (per query head, with
         * two query heads per KV head): a forward kernel serves the call,
         * and fg_attention_kernel_for says so */
        {"causal", 64, FG_BF16, 1, 4, 2, 4, 1000, 0, 0, 0, 2, 128, 0, ANY_FORWARD},
        /* head dims 16 and 32, which the decode kernel does not take
         * (decode_check): the forward kernel serves decode-sized calls,
         * contiguous, ragged over a paged cache (its ragged form), and
         * with the decode kernel asked for everywhere (option 2) */
        {"causal", 32, FG_BF16, 2, 8, 2, 1, 1000, 0, 0, 0, 0, 0, 0, ANY_FORWARD},
        {"alibi", 16, FG_FP16, 3, 8, 2, 4, 1000, 1, 16, 0, 0, 0, 0, ANY_FORWARD},
        {"sliding_window", 32, FG_BF16, 2, 4, 4, 2, 4097, 0, 64, 0, 0, 0, 2, ANY_FORWARD},
        /* option 2: the decode kernel for 100 queries of GQA 8 (13 row
         * tiles), paged */
        {"document", 128, FG_BF16, 2, 16, 2, 100, 1000, 1, 32, 0, 0, 0, 2, DEC},
        {"natten", 256, FG_FP16, 2, 4, 1, 3, 4097, 1, 128, 0, 0, 0, 0, DEC},
        /* split counts asked for (FG_OPT_DECODE_SPLITS): one block per
         * walk; an odd count over a paged cache; more than the walk has
         * tiles for (kv 1000: 8 splits); 128 over ragged lengths, where
         * the short sequences leave splits empty */
        {"causal", 128, FG_BF16, 2, 8, 2, 1, 4097, 0, 0, 0, 0, 0, 0, DEC, 1},
        {"alibi", 64, FG_FP16, 2, 8, 2, 2, 4097, 0, 16, 0, 0, 0, 0, DEC, 5},
        {"softcap", 128, FG_BF16, 1, 4, 1, 1, 1000, 0, 0, 0, 0, 0, 0, DEC, 128},
        {"sliding_window", 64, FG_BF16, 3, 8, 2, 1, 65536, 1, 64, 0, 0, 0, 0, DEC, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (quick() && cases[i].kv > 10000) continue;
        run_case(&cases[i]);
    }
    /* option 0 keeps the forward kernel, paged calls included */
    {
        fg_ctx *ctx;
        assert_int_equal(fg_ctx_create(&ctx), FG_OK);
        assert_int_equal(fg_ctx_set_int(ctx, FG_OPT_DECODE_KERNEL, 0), FG_OK);
        fg_mod *mod = tu_gallery_mod(ctx, "causal");
        fg_attention_args a = fg_attention_args_init();
        a.batch = 2, a.heads_q = 4, a.heads_kv = 4, a.q_len = 4, a.kv_len = 1000, a.head_dim = 128, a.dtype = FG_BF16;
        fg_kernel *k;
        assert_int_equal(fg_attention_kernel_for(ctx, mod, &a, &k), FG_OK);
        assert_true(fg_kernel_kind_of(k) != FG_KERNEL_ATTENTION_DECODE);
        fg_kernel_release(k);
        a.block_table = (const int32_t *)(uintptr_t)16, a.page_size = 16, a.num_pages = 100, a.max_pages = 63;
        assert_int_equal(fg_attention_kernel_for(ctx, mod, &a, &k), FG_OK);
        assert_int_equal(fg_kernel_kind_of(k), FG_KERNEL_ATTENTION_FWD);
        fg_kernel_release(k);
        fg_mod_destroy(mod);
        fg_ctx_destroy(ctx);
    }
    assert_int_equal(failures, 0);
}

/* ---- KV heads in pairs ------------------------------------------------------------ */

/* The decode kernel at head dim 64 over a paged cache ([page, row, head,
 * d]: a pair's rows side by side) walks two KV heads at once: GQA 4, 1
 * (MHA, a pair's two heads in one tile) and 8 with 16 queries (several row
 * tiles), warps on one head's half of the columns (more than 8 rows a
 * head, padded to 16-row slabs) and on both, ragged, every page size, a
 * bad page, a long sequence with many splits, a block mask broadcast over
 * heads; by the option's choice (-1) not for the block mask of a local
 * mask (fgi_mask_is_local), unless asked for (1); and where it must not:
 * the option off, MQA (one KV head), head
 * dim 128, a contiguous cache (a head's rows back to back), a mask per
 * query head over a group of one (the pair's tile would read two mask
 * rows). */
static void test_head_pairs(void **state) {
    (void)state;
    const fg_kernel_kind DEC = FG_KERNEL_ATTENTION_DECODE;
    const dcase cases[] = {
        {"causal", 64, FG_BF16, 4, 16, 4, 1, 4097, 1, 16, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"causal", 64, FG_BF16, 4, 16, 4, 1, 4097, 1, 16, 0, 0, 0, 0, DEC, 0, -1, -1},
        {"alibi", 64, FG_FP16, 2, 6, 6, 3, 1000, 0, 32, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"softcap", 64, FG_BF16, 3, 32, 4, 16, 1000, 1, 64, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"sliding_window", 64, FG_BF16, 2, 8, 2, 2, 4097, 2, 128, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"document", 64, FG_FP16, 2, 8, 2, 1, 1000, 1, 256, 1, 0, 0, 0, DEC, 0, 0, 1},
        {"causal", 64, FG_BF16, 1, 32, 8, 1, 65536, 0, 64, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"prefix_lm", 64, FG_BF16, 2, 8, 2, 4, 4097, 0, 16, 0, 1, 128, 0, DEC, 0, 0, 1},
        /* half slabs: a multiple of 16 rows a head (4 x 4, 2 x 8), ragged,
         * a bad page */
        {"causal", 64, FG_BF16, 2, 16, 4, 4, 4097, 1, 16, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"alibi", 64, FG_FP16, 2, 16, 8, 8, 1000, 2, 64, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"sliding_window", 64, FG_BF16, 2, 8, 2, 4, 4097, 0, 32, 1, 0, 0, 0, DEC, 0, 0, 1},
        /* rows padded to 16-row slabs: 12 a head (the eight-warp walk of
         * 32 rows), 20 a head (64 rows), ragged */
        {"softcap", 64, FG_BF16, 2, 16, 4, 3, 1000, 1, 16, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"alibi", 64, FG_FP16, 2, 16, 4, 5, 4097, 1, 64, 0, 0, 0, 0, DEC, 0, 0, 1},
        /* the choice by the mask's reach: a block mask of a local mask
         * (sliding_window, local_global) one head a walk, unless pairs are
         * asked for; a causal block mask in pairs */
        {"sliding_window", 64, FG_BF16, 2, 8, 2, 1, 4097, 0, 16, 0, 1, 128, 0, DEC, 0, 0, -1},
        {"sliding_window", 64, FG_BF16, 2, 8, 2, 1, 4097, 0, 16, 0, 1, 128, 0, DEC, 0, 1, 1},
        {"local_global", 64, FG_FP16, 2, 8, 2, 2, 4097, 0, 64, 0, 1, 128, 0, DEC, 0, 0, -1},
        {"causal", 64, FG_BF16, 2, 8, 2, 1, 4097, 0, 16, 0, 1, 128, 0, DEC, 0, 0, 1},
        {"noop", 64, FG_BF16, 2, 8, 1, 1, 1000, 0, 16, 0, 0, 0, 0, DEC, 0, 0, -1},
        {"causal", 128, FG_BF16, 2, 8, 2, 1, 1000, 0, 16, 0, 0, 0, 0, DEC, 0, 0, -1},
        {"causal", 64, FG_BF16, 2, 8, 2, 1, 1000, 0, 0, 0, 0, 0, 0, DEC, 0, 0, -1},
        {"causal", 64, FG_BF16, 1, 4, 4, 2, 1000, 0, 16, 0, 2, 128, 0, DEC, 0, 0, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (quick() && cases[i].kv > 10000) continue;
        run_case(&cases[i]);
    }
    assert_int_equal(failures, 0);
}

/* Both forms of the K/V copies (FG_OPT_DECODE_L2_PREFETCH: with the L2
 * prefetch, the H100's choice, and without, the H200's), whatever this
 * GPU would choose: contiguous and paged walks, 128-row tiles (the K/V
 * ring at head dim 128 and in pairs, stages at 64) and 64-row ones (block
 * masks of 64-row kv blocks), KV heads in pairs, ragged lengths ending
 * inside a tile. */
static void test_l2_prefetch(void **state) {
    (void)state;
    const fg_kernel_kind DEC = FG_KERNEL_ATTENTION_DECODE;
    const dcase base[] = {
        {"causal", 128, FG_BF16, 3, 32, 8, 1, 4097, 1, 0, 0, 0, 0, 0, DEC, 0, 0, 0},
        {"alibi", 128, FG_FP16, 2, 16, 4, 4, 1000, 1, 16, 0, 0, 0, 0, DEC, 0, 0, 0},
        {"causal", 64, FG_BF16, 2, 16, 4, 1, 4097, 2, 0, 0, 0, 0, 0, DEC, 0, 0, -1},
        {"softcap", 64, FG_BF16, 3, 32, 4, 1, 1000, 1, 64, 0, 0, 0, 0, DEC, 0, 0, 1},
        {"sliding_window", 128, FG_BF16, 2, 16, 4, 1, 4097, 0, 0, 0, 1, 64, 0, DEC, 0, 0, 0},
        {"prefix_lm", 64, FG_FP16, 2, 8, 2, 1, 1000, 0, 0, 0, 1, 64, 0, DEC, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        for (int form = -1; form <= 1; form += 2) {
            dcase c = base[i];
            c.l2_opt = form;
            run_case(&c);
        }
    assert_int_equal(failures, 0);
}

/* ---- prefill into a paged cache: the forward kernel ------------------------------ */

/* Past FG_DECODE_MAX_Q queries (or at a head dim the decode kernel does
 * not take, or with option 0) ragged and paged calls run on the portable
 * forward kernel, whatever the GPU: a prefill, or a chunk of one, whose
 * queries are the last q_len positions of each sequence. */
static void test_prefill(void **state) {
    (void)state;
    const fg_kernel_kind FWD = FG_KERNEL_ATTENTION_FWD;
    const dcase cases[] = {
        {"causal", 128, FG_BF16, 3, 8, 2, 300, 1000, 1, 16, 0, 0, 0, 0, FWD},
        {"sliding_window", 64, FG_FP16, 3, 4, 4, 128, 4097, 2, 64, 0, 0, 0, 0, FWD},
        {"alibi", 64, FG_BF16, 3, 4, 4, 17, 17, 1, 0, 0, 0, 0, 0, FWD},
        {"softcap", 128, FG_FP16, 2, 8, 8, 129, 4097, 1, 128, 1, 0, 0, 0, FWD},
        {"natten", 256, FG_BF16, 1, 2, 1, 100, 1000, 0, 32, 0, 0, 0, 0, FWD},
        {"prefix_lm", 128, FG_BF16, 2, 4, 2, 1000, 1000, 1, 256, 0, 0, 0, 0, FWD},
        /* a block mask over paged K/V (uniform lengths, one q_offset) */
        {"document", 128, FG_BF16, 2, 4, 2, 200, 1000, 0, 256, 0, 1, 128, 0, FWD},
        {"sliding_window", 64, FG_BF16, 2, 4, 4, 100, 4097, 0, 16, 0, 2, 64, 0, FWD},
        /* a head dim the decode kernel does not take; option 0 */
        {"causal", 96, FG_BF16, 2, 4, 2, 4, 1000, 1, 16, 0, 0, 0, 0, FWD},
        {"alibi", 128, FG_FP16, 3, 8, 2, 1, 1000, 2, 32, 0, 0, 0, -1, FWD},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    assert_int_equal(failures, 0);
}

/* ---- a workspace of the caller's -------------------------------------------------- */

/* A split decode call (one long sequence) with the caller's workspace
 * gives the same bits as with the library's pool; too small a workspace
 * falls back to the pool; a misaligned one is refused; a call on the
 * forward kernel needs none. */
static void test_workspace(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, "causal");
    const int B = 1, HQ = 8, HKV = 2, Q = 2, KV = 20000, D = 128;
    const size_t nq = (size_t)B * HQ * Q * D, nkv = (size_t)B * HKV * KV * D, nl = (size_t)B * HQ * Q;
    uint16_t *hq = random16(FG_BF16, nq, true), *hk = random16(FG_BF16, nkv, true), *hv = random16(FG_BF16, nkv, false);
    CUdeviceptr dq = upload(hq, nq * 2), dk = upload(hk, nkv * 2), dv = upload(hv, nkv * 2), dout[2], dlse[2];
    fg_attention_args a = fg_attention_args_init();
    a.batch = B, a.heads_q = HQ, a.heads_kv = HKV, a.q_len = Q, a.kv_len = KV, a.head_dim = D, a.dtype = FG_BF16;
    a.q_offset = KV - Q;
    size_t need = 0;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &need), FG_OK); /* pointers not needed */
    assert_true(need > 0);
    a.q = (const void *)(uintptr_t)dq, a.k = (const void *)(uintptr_t)dk, a.v = (const void *)(uintptr_t)dv;
    CUdeviceptr ws;
    assert_int_equal(fgi_cu()->cuMemAlloc(&ws, need + 512), CUDA_SUCCESS);
    void *host[2][2];
    for (int run = 0; run < 2; run++) {
        assert_int_equal(fgi_cu()->cuMemAlloc(&dout[run], nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemAlloc(&dlse[run], nl * 4), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(dout[run], 0xff, nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(dlse[run], 0xff, nl * 4), CUDA_SUCCESS);
        a.out = (void *)(uintptr_t)dout[run], a.lse = (float *)(uintptr_t)dlse[run];
        /* run 0: the pool's; run 1: the caller's */
        a.workspace = run ? (void *)(uintptr_t)ws : NULL, a.workspace_size = run ? need : 0;
        assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);
        assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
        host[run][0] = malloc(nq * 2), host[run][1] = malloc(nl * 4);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(host[run][0], dout[run], nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemcpyDtoH(host[run][1], dlse[run], nl * 4), CUDA_SUCCESS);
    }
    assert_memory_equal(host[0][0], host[1][0], nq * 2);
    assert_memory_equal(host[0][1], host[1][1], nl * 4);
    long nonfinite = 0;
    for (size_t i = 0; i < nq; i++) nonfinite += !isfinite(from16(FG_BF16, ((uint16_t *)host[1][0])[i]));
    assert_int_equal(nonfinite, 0);
    /* too small: the pool serves the call */
    a.workspace_size = need - 1;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);
    /* misaligned */
    a.workspace = (void *)(uintptr_t)(ws + 16), a.workspace_size = need;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_SHAPE);
    /* the forward kernel's calls take 256 bytes (the Hopper forward's tile
     * counter, as flexgen.h says); bad shapes are refused */
    a.q_len = 100;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &need), FG_OK);
    assert_int_equal(need, 256);
    a.heads_kv = 3;
    assert_int_equal(fg_attention_workspace_size(ctx, mod, &a, &need), FG_ERR_SHAPE);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    for (int run = 0; run < 2; run++) {
        free(host[run][0]), free(host[run][1]);
        fgi_cu()->cuMemFree(dout[run]), fgi_cu()->cuMemFree(dlse[run]);
    }
    fgi_cu()->cuMemFree(ws), fgi_cu()->cuMemFree(dq), fgi_cu()->cuMemFree(dk), fgi_cu()->cuMemFree(dv);
    free(hq), free(hk), free(hv);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

/* ---- the merge ------------------------------------------------------------------ */

/* Attention over KV cut into `nparts` uneven chunks (each a forward call on
 * its slice of K and V with kv_offset at its start), merged, against the
 * reference over the whole KV. Causal with queries at the start makes the
 * later chunks fully masked for the first rows: parts of weight 0. The
 * merge writes over part 0 (in place). */
static void merge_case(const char *modname, int d, fg_dtype dt, int nparts) {
    const int B = 2, H = 4, Q = 37, KV = 1000;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, modname);
    acase ac = {.mod = modname, .d = d, .dtype = dt, .b = B, .hq = H, .hkv = H, .q = Q, .kv = KV};
    binds bb;
    gallery_binds(modname, &ac, &bb);
    const size_t nq = (size_t)B * H * Q * d, nkv = (size_t)B * H * KV * d, nl = (size_t)B * H * Q;
    uint16_t *hq = random16(dt, nq, true), *hk = random16(dt, nkv, true), *hv = random16(dt, nkv, false);
    CUdeviceptr dq = upload(hq, nq * 2), dk = upload(hk, nkv * 2), dv = upload(hv, nkv * 2);
    CUdeviceptr douts[8], dlses[8], dlse;
    fg_merge_args m = fg_merge_args_init();
    int cut[9];
    for (int i = 0; i <= nparts; i++) cut[i] = i == nparts ? KV : (int)((int64_t)KV * i * i / (nparts * nparts));
    for (int i = 0; i < nparts; i++) {
        assert_int_equal(fgi_cu()->cuMemAlloc(&douts[i], nq * 2), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemAlloc(&dlses[i], nl * 4), CUDA_SUCCESS);
        assert_int_equal(fgi_cu()->cuMemsetD8(douts[i], 0xff, nq * 2), CUDA_SUCCESS);
        fg_attention_args a = fg_attention_args_init();
        a.batch = B, a.heads_q = H, a.heads_kv = H, a.q_len = Q, a.kv_len = cut[i + 1] - cut[i];
        a.head_dim = d, a.dtype = dt, a.kv_offset = cut[i];
        a.q = (const void *)(uintptr_t)dq;
        a.k = (const void *)(uintptr_t)(dk + (size_t)cut[i] * d * 2);
        a.v = (const void *)(uintptr_t)(dv + (size_t)cut[i] * d * 2);
        a.k_stride[0] = (int64_t)H * KV * d, a.k_stride[1] = (int64_t)KV * d, a.k_stride[2] = d, a.k_stride[3] = 1;
        memcpy(a.v_stride, a.k_stride, sizeof a.k_stride);
        a.out = (void *)(uintptr_t)douts[i], a.lse = (float *)(uintptr_t)dlses[i];
        a.binds = bb.dev, a.nbinds = (size_t)bb.n;
        fg_status st = fg_attention_forward(ctx, mod, &a);
        if (st != FG_OK) print_error("merge part %d: %s\n", i, fg_errmsg(ctx));
        assert_int_equal(st, FG_OK);
        m.outs[i] = (const void *)(uintptr_t)douts[i];
        m.lses[i] = (const float *)(uintptr_t)dlses[i];
    }
    assert_int_equal(fgi_cu()->cuMemAlloc(&dlse, nl * 4), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemsetD8(dlse, 0xff, nl * 4), CUDA_SUCCESS);
    m.batch = B, m.heads = H, m.q_len = Q, m.head_dim = d, m.dtype = dt, m.nparts = nparts;
    m.out = (void *)(uintptr_t)douts[0], m.lse = (float *)(uintptr_t)dlse;
    assert_int_equal(fg_attention_merge(ctx, &m), FG_OK);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    uint16_t *gout = malloc(nq * 2);
    float *glse = malloc(nl * 4);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(gout, douts[0], nq * 2), CUDA_SUCCESS);
    assert_int_equal(fgi_cu()->cuMemcpyDtoH(glse, dlse, nl * 4), CUDA_SUCCESS);

    fg_attention_args r = fg_attention_args_init();
    r.batch = B, r.heads_q = H, r.heads_kv = H, r.q_len = Q, r.kv_len = KV, r.head_dim = d, r.dtype = dt;
    r.q = hq, r.k = hk, r.v = hv, r.out = gout, r.binds = bb.host, r.nbinds = (size_t)bb.n;
    double *rout = malloc(sizeof(double) * nq), *rlse = malloc(sizeof(double) * nl);
    assert_int_equal(fg_attention_reference(ctx, mod, &r, rout, rlse), FG_OK);
    double num = 0, den = 0, lse_err = 0;
    long bad = 0;
    for (size_t i = 0; i < nl; i++) {
        for (int c = 0; c < d; c++) {
            const double g = from16(dt, gout[i * d + c]), x = rout[i * d + c];
            bad += !isfinite(g);
            num += (g - x) * (g - x), den += x * x;
        }
        if (isinf(rlse[i]) || isinf(glse[i])) bad += !(isinf(rlse[i]) && isinf(glse[i]) && glse[i] < 0);
        else if (fabs(glse[i] - rlse[i]) / (1 + fabs(rlse[i])) > lse_err) lse_err = fabs(glse[i] - rlse[i]) / (1 + fabs(rlse[i]));
    }
    const double rel = sqrt(num / den), tol = dt == FG_BF16 ? 1e-2 : 3e-3;
    const bool ok = rel <= tol && lse_err <= 1e-3 && bad == 0;
    printf("%-4s merge %s D=%d %s of %d parts: rel %.2e lse %.2e\n", ok ? "ok" : "FAIL", modname, d,
           dt == FG_BF16 ? "bf16" : "fp16", nparts, rel, lse_err);
    failures += !ok;
    /* errors: part counts, the LSE written over a part's */
    m.nparts = 0;
    assert_int_equal(fg_attention_merge(ctx, &m), FG_ERR_INVALID_ARGUMENT);
    m.nparts = FG_MERGE_MAX_PARTS + 1;
    assert_int_equal(fg_attention_merge(ctx, &m), FG_ERR_INVALID_ARGUMENT);
    m.nparts = nparts, m.lse = (float *)m.lses[nparts - 1];
    assert_int_equal(fg_attention_merge(ctx, &m), FG_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < nparts; i++) fgi_cu()->cuMemFree(douts[i]), fgi_cu()->cuMemFree(dlses[i]);
    fgi_cu()->cuMemFree(dlse), fgi_cu()->cuMemFree(dq), fgi_cu()->cuMemFree(dk), fgi_cu()->cuMemFree(dv);
    free(gout), free(glse), free(rout), free(rlse), free(hq), free(hk), free(hv);
    binds_free(&bb);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

static void test_merge(void **state) {
    (void)state;
    merge_case("causal", 128, FG_BF16, 2);
    merge_case("alibi", 64, FG_FP16, 8);
    merge_case("softcap", 128, FG_FP16, 3);
    assert_int_equal(failures, 0);
}

/* ---- argument errors ------------------------------------------------------------ */

static void test_errors(void **state) {
    (void)state;
    fg_ctx *ctx;
    assert_int_equal(fg_ctx_create(&ctx), FG_OK);
    assert_int_equal(fgi_cuda_ready(ctx), FG_OK);
    fg_mod *mod = tu_gallery_mod(ctx, "causal");
    CUdeviceptr buf;
    assert_int_equal(fgi_cu()->cuMemAlloc(&buf, 1 << 22), CUDA_SUCCESS);
    void *p = (void *)(uintptr_t)buf;
    fg_attention_args a = fg_attention_args_init();
    a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.q_len = 1, a.kv_len = 100, a.head_dim = 64, a.dtype = FG_BF16;
    a.q = a.k = a.v = p, a.out = p;
    a.block_table = (const int32_t *)p, a.page_size = 16, a.num_pages = 8, a.max_pages = 7;
    /* page sizes outside [16, 256] or not powers of two */
    a.page_size = 8;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_NOT_SUPPORTED);
    a.page_size = 48;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_NOT_SUPPORTED);
    /* kv_len past max_pages pages */
    a.page_size = 16, a.kv_len = 113;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_SHAPE);
    a.kv_len = 100;
    /* paging fields without a table */
    a.block_table = NULL;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_INVALID_ARGUMENT);
    a.block_table = (const int32_t *)p;
    /* a misaligned page stride */
    a.k_stride[0] = 16 * 2 * 64 + 4, a.k_stride[1] = 64, a.k_stride[2] = 128, a.k_stride[3] = 1;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_SHAPE);
    memset(a.k_stride, 0, sizeof a.k_stride);
    /* a misaligned lengths array */
    a.kv_lens = (const int32_t *)((char *)p + 2);
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_SHAPE);
    a.kv_lens = NULL;
    /* the backward has no ragged or paged form */
    fg_attention_bwd_args ba = fg_attention_bwd_args_init();
    a.lse = (float *)p;
    ba.fwd = &a, ba.dout = p, ba.dq = ba.dk = ba.dv = p;
    assert_int_equal(fg_attention_backward(ctx, mod, &ba), FG_ERR_NOT_SUPPORTED);
    /* the host check of a table: the first bad entry, and lengths */
    int32_t table[2 * 7];
    for (int i = 0; i < 14; i++) table[i] = i % 8;
    assert_int_equal(fg_block_table_check(ctx, &a, table, NULL), FG_OK);
    table[7 + 3] = 8;
    assert_int_equal(fg_block_table_check(ctx, &a, table, NULL), FG_ERR_SHAPE);
    assert_non_null(strstr(fg_errmsg(ctx), "sequence 1, page 3"));
    const int32_t lens[2] = {100, 40}; /* sequence 1 uses pages 0..2 only */
    assert_int_equal(fg_block_table_check(ctx, &a, table, lens), FG_OK);
    const int32_t bad_lens[2] = {100, 101};
    assert_int_equal(fg_block_table_check(ctx, &a, table, bad_lens), FG_ERR_SHAPE);
    /* a block mask built for other offsets than the call's */
    a.block_table = NULL, a.page_size = a.num_pages = a.max_pages = 0, a.lse = NULL;
    fg_block_mask_desc desc = {1, 1, 1, 100, 128, 128, sizeof desc, 99, 0};
    fg_block_mask *bm;
    assert_int_equal(fg_block_mask_create(ctx, mod, &desc, NULL, 0, &bm), FG_OK);
    a.block_mask = bm;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_ERR_SHAPE);
    a.q_offset = 99;
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);
    fg_block_mask_destroy(bm);
    /* a decode kernel made for kv blocks of 128 walks tiles of 128 rows at
     * head dim 64: it refuses a mask of kv blocks of 64 (the call's own
     * choice, fg_attention_forward, takes the kernel of 64-row tiles) */
    fg_kernel_config kc = fg_kernel_config_init();
    kc.kind = FG_KERNEL_ATTENTION_DECODE, kc.head_dim = 64;
    fg_kernel *dk;
    assert_int_equal(fg_kernel_get(ctx, mod, &kc, &dk), FG_OK);
    fg_block_mask_desc desc64 = {1, 1, 1, 100, 128, 64, sizeof desc64, 99, 0};
    assert_int_equal(fg_block_mask_create(ctx, mod, &desc64, NULL, 0, &bm), FG_OK);
    a.block_mask = bm;
    assert_int_equal(fg_kernel_launch(ctx, dk, &a), FG_ERR_NOT_SUPPORTED);
    assert_non_null(strstr(fg_errmsg(ctx), "tiles of 128 rows"));
    assert_int_equal(fg_attention_forward(ctx, mod, &a), FG_OK);
    fg_kernel_release(dk);
    fg_block_mask_destroy(bm);
    assert_int_equal(fgi_cu()->cuCtxSynchronize(), CUDA_SUCCESS);
    fgi_cu()->cuMemFree(buf);
    fg_mod_destroy(mod);
    fg_ctx_destroy(ctx);
}

int main(void) {
    tu_require_gpu();
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* scripts/gpu_suite.sh reads this table for its shards, a test a line */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_workspace),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_head_pairs),
        cmocka_unit_test(test_l2_prefetch),
        cmocka_unit_test(test_prefill),
        cmocka_unit_test(test_gallery_0),
        cmocka_unit_test(test_gallery_1),
        cmocka_unit_test(test_gallery_2),
        cmocka_unit_test(test_gallery_3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
