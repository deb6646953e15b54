#define FG_KERNEL_BLOCK_MASK 1
#define FG_Q_BLOCK 128
#define FG_KV_BLOCK 64
/*
 * common.cuh -- what every generated kernel source starts with: fixed-width
 * types, the arithmetic helpers the emitted mods call, bounds-checked buffer
 * loads, and 16-bit float conversions. Self-contained on purpose: it
 * includes nothing, so NVRTC reads no header from disk and a compile depends
 * only on the text flexgen hands it (which is what the cache key hashes).
 *
 * Why helpers instead of plain operators. The emitted CUDA must compute what
 * the CPU evaluator (src/eval.c) computes, and the rules of the mod language
 * are not C++'s:
 *   - int + - * wrap (two's complement). Signed overflow is undefined in
 *     C++, and the optimiser uses that (`x + 1 > x` folds to true), so the
 *     wrapping forms go through unsigned arithmetic.
 *   - int / and % by zero give 0, INT_MIN / -1 gives INT_MIN and
 *     INT_MIN % -1 gives 0, where C++ has undefined behaviour and the GPU
 *     would produce garbage; the CPU evaluator reports these as errors, the
 *     GPU cannot report, so it yields a fixed value.
 *   - shift counts are taken & 31; >> of a negative value is arithmetic.
 *   - float -> int truncates and saturates, NaN -> 0 (__float2int_rz), where
 *     a C++ cast of an out-of-range float is undefined.
 *   - float + - * / are single IEEE operations rounded to nearest. Without
 *     the _rn intrinsics the compiler may contract a * b + c into one fused
 *     multiply-add, whose single rounding differs from the evaluator's two.
 *   - exp, log, tanh ... are the accurate device functions (expf, logf,
 *     tanhf), never the __expf-style intrinsics; rsqrt and sigmoid are
 *     spelled out with an IEEE division for the same reason.
 *   - a buffer read outside [0, length) gives 0 instead of faulting.
 * All helpers are tiny and force-inlined: the generated code costs the same
 * instructions a hand-written kernel would use.
 *
 * The 16-bit float types are storage only (a struct around the bits); the
 * conversions are single PTX instructions (sm_80 and newer), so neither
 * cuda_fp16.h nor cuda_bf16.h is needed.
 */

/* ---- types -------------------------------------------------------------- */

typedef int fg_i32;                /* 32-bit signed                         */
typedef unsigned int fg_u32;       /* 32-bit unsigned                       */
typedef long long fg_i64;          /* 64-bit signed                         */
typedef unsigned long long fg_u64; /* 64-bit unsigned                       */
typedef short fg_i16;              /* 16-bit signed                         */
typedef unsigned short fg_u16;     /* 16-bit unsigned                       */
typedef unsigned char fg_u8;       /* 8-bit unsigned                        */

static_assert(sizeof(fg_i32) == 4 && sizeof(fg_i64) == 8 && sizeof(fg_u16) == 2,
              "flexgen needs 32-bit int and 64-bit long long");
static_assert(sizeof(void *) == 8, "flexgen kernels use 64-bit pointers");

#define FG_INT_MIN (-2147483647 - 1)   /* INT_MIN without <climits>        */
#define FG_INT_MAX 2147483647          /* INT_MAX                          */
#define FG_INFINITY __int_as_float(0x7f800000)  /* +inf                    */
#define FG_NAN __int_as_float(0x7fffffff)       /* a quiet NaN             */

#define FG_DEV static __device__ __forceinline__

/* ---- int arithmetic: wrapping, total ------------------------------------ */

/* a + b, a - b, a * b and -a modulo 2^32. */
FG_DEV int fg_iadd(int a, int b) { return (int)((fg_u32)a + (fg_u32)b); }
FG_DEV int fg_isub(int a, int b) { return (int)((fg_u32)a - (fg_u32)b); }
FG_DEV int fg_imul(int a, int b) { return (int)((fg_u32)a * (fg_u32)b); }
FG_DEV int fg_ineg(int a) { return (int)(0u - (fg_u32)a); }
/* a / b truncated toward zero; 0 when b == 0; INT_MIN / -1 == INT_MIN. */
FG_DEV int fg_idiv(int a, int b) {
    if (b == 0) return 0;
    if (b == -1) return fg_ineg(a);
    return a / b;
}
/* a % b with the sign of a; 0 when b == 0 or b == -1. */
FG_DEV int fg_imod(int a, int b) {
    if (b == 0 || b == -1) return 0;
    return a % b;
}
/* a << (n & 31), bits shifted out are lost. */
FG_DEV int fg_shl(int a, int n) { return (int)((fg_u32)a << (n & 31)); }
/* a >> (n & 31), arithmetic (sign-filling), spelled so it is for any a. */
FG_DEV int fg_shr(int a, int n) {
    const int c = n & 31;
    return a < 0 ? ~(~a >> c) : a >> c;
}
/* |a|, with |INT_MIN| == INT_MIN (wrapping). */
FG_DEV int fg_iabs(int a) { return a < 0 ? fg_ineg(a) : a; }
/* min, max and clamp(x, lo, hi) == min(max(x, lo), hi) on ints. */
FG_DEV int fg_imin(int a, int b) { return a < b ? a : b; }
FG_DEV int fg_imax(int a, int b) { return a > b ? a : b; }
FG_DEV int fg_iclamp(int x, int lo, int hi) { return fg_imin(fg_imax(x, lo), hi); }

/* ---- float arithmetic: one IEEE rounding per operation ------------------ */

/* a + b, a - b, a * b, a / b rounded to nearest, never fused into an FMA. */
FG_DEV float fg_fadd(float a, float b) { return __fadd_rn(a, b); }
FG_DEV float fg_fsub(float a, float b) { return __fsub_rn(a, b); }
FG_DEV float fg_fmul(float a, float b) { return __fmul_rn(a, b); }
FG_DEV float fg_fdiv(float a, float b) { return __fdiv_rn(a, b); }
/* clamp(x, lo, hi) == fminf(fmaxf(x, lo), hi) (NaN bounds are ignored). */
FG_DEV float fg_fclamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
/* 1 / sqrt(x) with an IEEE square root and division (rsqrtf is approximate). */
FG_DEV float fg_rsqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }
/* 1 / (1 + exp(-x)) with the accurate expf. */
FG_DEV float fg_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

/* ---- conversions ------------------------------------------------------- */

/* float -> int: truncate toward zero, saturate, NaN -> 0. */
FG_DEV int fg_f2i(float x) { return __float2int_rz(x); }
/* int -> float rounded to nearest (what a C cast does, said explicitly). */
FG_DEV float fg_i2f(int x) { return __int2float_rn(x); }

/* ---- buffers ------------------------------------------------------------ */

/* p[i] when 0 <= i < len, else 0: a mod may index with any int. */
FG_DEV int fg_load_i32(const int *__restrict__ p, fg_i64 len, int i) {
    return (i >= 0 && (fg_i64)i < len) ? __ldg(p + i) : 0;
}
FG_DEV float fg_load_f32(const float *__restrict__ p, fg_i64 len, int i) {
    return (i >= 0 && (fg_i64)i < len) ? __ldg(p + i) : 0.0f;
}

/* ---- 16-bit floats (storage) -------------------------------------------- */

/* The bits of one bfloat16 / IEEE half value. */
struct fg_bf16 {
    fg_u16 bits;
};
struct fg_fp16 {
    fg_u16 bits;
};

/* bf16 -> float is exact: the bits are the high half of the float. */
FG_DEV float fg_bf16_to_f32(fg_bf16 x) { return __int_as_float((int)((fg_u32)x.bits << 16)); }
/* float -> bf16 rounded to nearest even (NaN stays NaN). */
FG_DEV fg_bf16 fg_f32_to_bf16(float x) {
    fg_bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
/* half -> float (exact) and float -> half rounded to nearest even. */
FG_DEV float fg_fp16_to_f32(fg_fp16 x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x.bits));
    return r;
}
FG_DEV fg_fp16 fg_f32_to_fp16(float x) {
    fg_fp16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

/* Two floats -> one register of two 16-bit values, `lo` in the low half
 * (the layout of mma fragments and of consecutive elements in memory). */
FG_DEV fg_u32 fg_pack_bf16x2(float lo, float hi) {
    fg_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FG_DEV fg_u32 fg_pack_fp16x2(float lo, float hi) {
    fg_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
/* One register of two 16-bit values -> two floats (exact). */
FG_DEV void fg_unpack_bf16x2(fg_u32 v, float &lo, float &hi) {
    lo = __int_as_float((int)(v << 16));
    hi = __int_as_float((int)(v & 0xffff0000u));
}
FG_DEV void fg_unpack_fp16x2(fg_u32 v, float &lo, float &hi) {
    const fg_u16 l = (fg_u16)(v & 0xffffu), h = (fg_u16)(v >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
}

/* The configured input type (FG_DTYPE_BF16 / FG_DTYPE_FP16), for templates
 * that are written once for both. */
#if defined(FG_DTYPE_FP16)
typedef fg_fp16 fg_elem;
#define fg_elem_to_f32 fg_fp16_to_f32
#define fg_f32_to_elem fg_f32_to_fp16
#define fg_pack2 fg_pack_fp16x2
#define fg_unpack2 fg_unpack_fp16x2
#else
typedef fg_bf16 fg_elem;
#define fg_elem_to_f32 fg_bf16_to_f32
#define fg_f32_to_elem fg_f32_to_bf16
#define fg_pack2 fg_pack_bf16x2
#define fg_unpack2 fg_unpack_bf16x2
#endif
/* ---- the mod: causal (mods/causal.c)
 * Emitted by flexgen from the checked syntax tree, not copied from the
 * file. Its canonical text (the kernel cache key's part):
 *
 *   bool mask_mod(int b, int h, int q_idx, int kv_idx) {
 *       return q_idx >= kv_idx;
 *   }
 */
#define FG_HAS_MASK_MOD 1
#define FG_HAS_SCORE_MOD 0

/* The mod's parameters, passed by value to every kernel; the host packs
 * the same layout (fgi_param_layout_compute). */
struct __align__(8) fg_mod_params {
    int fg_pad; /* never empty */
};
static_assert(sizeof(fg_mod_params) == 8, "fg_mod_params size");

__device__ __forceinline__ bool fg_mask_mod(const fg_mod_params &p, int b, int h, int q_idx, int kv_idx) {
#line 12 "mods/causal.c"
    return q_idx >= kv_idx;
#line 213 "flexgen.cu"
}

/* No score_mod: scores are used as they are. */
__device__ __forceinline__ float fg_score_mod(const fg_mod_params &p, float score, int b, int h, int q_idx, int kv_idx) {
    return score;
}

/*
 * blockmask.cuh -- the GPU block-mask builder (FG_KERNEL_BLOCK_MASK).
 *
 * Spliced after the emitted mod, so fg_mod_params and
 * fg_mask_mod(p, b, h, q_idx, kv_idx) exist; FG_Q_BLOCK and FG_KV_BLOCK are
 * the block sizes. Two kernels, launched back to back on one stream with no
 * host round trip between them:
 *
 *   fg_block_mask_classify  one warp per (b, h, q block, kv block) tile.
 *       Lane l owns the tile's columns l, l+32, ... and walks the rows; every
 *       few rows the warp votes, and as soon as some lane saw a true and some
 *       lane saw a false the tile is partial and the warp stops. Full and
 *       empty tiles must be evaluated everywhere (nothing else proves them),
 *       but those evaluations are independent, branch-free and spread over
 *       every lane of the GPU. Positions past q_len / kv_len are never
 *       evaluated: the last row / column block is judged on the part that
 *       exists. Interior tiles take a path without per-element bounds tests.
 *       Result: one byte per tile, 0 empty / 1 partial / 2 full.
 *
 *   fg_block_mask_compact  one warp per list: first the (b, h, q block) rows
 *       (-> kv_num_blocks / kv_indices and the full_ pair), then the
 *       (b, h, kv block) columns (-> the q_* transposes). The warp reads 32
 *       tiles at a time, and a ballot plus a popcount of the lanes below
 *       gives each partial / full tile its slot, so indices come out
 *       ascending; the unused tail of every index row is written with zeros.
 *       A mask that reads neither b nor h (per_b / per_h = 0) was
 *       classified for b = 0 / h = 0 only; every list reads those tiles.
 *
 * The layout and the classification rule are the CPU builder's
 * (src/blockmask.c); the two must agree bit for bit.
 */

#ifndef FG_Q_BLOCK
#error "FG_Q_BLOCK must be defined"
#endif
#ifndef FG_KV_BLOCK
#error "FG_KV_BLOCK must be defined"
#endif

#define FG_BM_WARPS 8
#define FG_BM_FULL_WARP 0xffffffffu
/* Rows evaluated between two votes: enough independent evaluations per lane
 * to hide latency, few enough that a partial tile stops early. */
#define FG_BM_ROWS_PER_VOTE 8
#define FG_BM_COLS ((FG_KV_BLOCK + 31) / 32)

/* Walk rows [i0, i0 + FG_BM_ROWS_PER_VOTE) of a tile; `checked` tiles test
 * every position against the clipped extent (nq, nk). */
template <bool checked>
__device__ __forceinline__ void fg_bm_rows(const fg_mod_params &p, int b, int h, int q0, int k0,
                                           int i0, int nq, int nk, int lane, bool &any, bool &all) {
#pragma unroll
    for (int di = 0; di < FG_BM_ROWS_PER_VOTE; di++) {
        int i = i0 + di;
#pragma unroll
        for (int c = 0; c < FG_BM_COLS; c++) {
            int j = lane + 32 * c;
            bool in = checked ? (i < nq && j < nk) : (FG_KV_BLOCK >= 32 || j < FG_KV_BLOCK);
            if (in) {
                bool m = fg_mask_mod(p, b, h, q0 + i, k0 + j);
                any |= m;
                all &= m;
            }
        }
    }
}

/* Classify one tile with the calling warp; returns 0 / 1 / 2. */
template <bool checked>
__device__ __forceinline__ int fg_bm_classify_tile(const fg_mod_params &p, int b, int h, int q0,
                                                   int k0, int nq, int nk, int lane) {
    bool any = false, all = true;
    for (int i0 = 0; i0 < nq; i0 += FG_BM_ROWS_PER_VOTE) {
        fg_bm_rows<checked>(p, b, h, q0, k0, i0, nq, nk, lane, any, all);
        bool seen_true = __any_sync(FG_BM_FULL_WARP, any);
        bool seen_false = __any_sync(FG_BM_FULL_WARP, !all);
        if (seen_true && seen_false) return 1;
    }
    if (__any_sync(FG_BM_FULL_WARP, any)) return 2;
    return 0;
}

extern "C" __global__ void __launch_bounds__(FG_BM_WARPS * 32)
fg_block_mask_classify(const fg_mod_params p, int B, int H, int q_len, int kv_len, int QB, int KB,
                       unsigned char *tiles) {
    int lane = threadIdx.x & 31;
    long long tile = (long long)blockIdx.x * FG_BM_WARPS + (threadIdx.x >> 5);
    long long ntiles = (long long)B * H * QB * KB;
    if (tile >= ntiles) return; /* whole warps leave together */
    int kb = (int)(tile % KB);
    long long r = tile / KB;
    int qb = (int)(r % QB);
    r /= QB;
    int h = (int)(r % H);
    int b = (int)(r / H);
    int q0 = qb * FG_Q_BLOCK, k0 = kb * FG_KV_BLOCK;
    int nq = q_len - q0 < FG_Q_BLOCK ? q_len - q0 : FG_Q_BLOCK;
    int nk = kv_len - k0 < FG_KV_BLOCK ? kv_len - k0 : FG_KV_BLOCK;
    int cls = (nq == FG_Q_BLOCK && nk == FG_KV_BLOCK)
                  ? fg_bm_classify_tile<false>(p, b, h, q0, k0, nq, nk, lane)
                  : fg_bm_classify_tile<true>(p, b, h, q0, k0, nq, nk, lane);
    if (lane == 0) tiles[tile] = (unsigned char)cls;
}

/* Compact one list of n tiles (tile i at t[i * stride]) into the partial and
 * full index lists and their counts. */
__device__ __forceinline__ void fg_bm_compact_list(const unsigned char *t, int n, int stride,
                                                   int lane, int *num_p, int *idx_p, int *num_f,
                                                   int *idx_f) {
    unsigned below = (1u << lane) - 1u;
    int cp = 0, cf = 0;
    for (int i0 = 0; i0 < n; i0 += 32) {
        int i = i0 + lane;
        int c = i < n ? t[(long long)i * stride] : 0;
        unsigned mp = __ballot_sync(FG_BM_FULL_WARP, c == 1);
        unsigned mf = __ballot_sync(FG_BM_FULL_WARP, c == 2);
        if (c == 1) idx_p[cp + __popc(mp & below)] = i;
        if (c == 2) idx_f[cf + __popc(mf & below)] = i;
        cp += __popc(mp);
        cf += __popc(mf);
    }
    for (int i = cp + lane; i < n; i += 32) idx_p[i] = 0;
    for (int i = cf + lane; i < n; i += 32) idx_f[i] = 0;
    if (lane == 0) {
        *num_p = cp;
        *num_f = cf;
    }
}

extern "C" __global__ void __launch_bounds__(FG_BM_WARPS * 32)
fg_block_mask_compact(int B, int H, int per_b, int per_h, int QB, int KB,
                      const unsigned char *tiles, int *kv_num, int *kv_idx, int *full_kv_num,
                      int *full_kv_idx, int *q_num, int *q_idx, int *full_q_num,
                      int *full_q_idx) {
    int lane = threadIdx.x & 31;
    long long w = (long long)blockIdx.x * FG_BM_WARPS + (threadIdx.x >> 5);
    long long rows = (long long)B * H * QB, cols = (long long)B * H * KB;
    bool is_row = w < rows;
    if (!is_row && w >= rows + cols) return;
    long long list = is_row ? w : w - rows;
    int inner = is_row ? QB : KB;
    long long bh = list / inner;
    int o = (int)(list % inner);
    /* the tile map holds [per_b ? B : 1][per_h ? H : 1] */
    long long src = (per_b ? bh / H : 0) * (per_h ? H : 1) + (per_h ? bh % H : 0);
    const unsigned char *t = tiles + src * QB * KB;
    if (is_row)
        fg_bm_compact_list(t + (long long)o * KB, KB, 1, lane, kv_num + list, kv_idx + list * KB,
                           full_kv_num + list, full_kv_idx + list * KB);
    else
        fg_bm_compact_list(t + o, QB, KB, lane, q_num + list, q_idx + list * QB, full_q_num + list,
                           full_q_idx + list * QB);
}
