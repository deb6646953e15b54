/*
 * attention_bwd.cuh -- the portable backward attention kernels (sm_80 and
 * newer, mma.sync): FlashAttention-2's schedule, with the mods applied and
 * differentiated exactly as the forward applies them.
 *
 * Three kernels, launched in this order on one stream:
 *   fg_attention_bwd_pre   delta = rowsum(dO * O) - dlse per query row (fp32),
 *                          and the fp32 dQ accumulator zeroed;
 *   fg_attention_bwd_dkdv  one thread block per (kv tile, kv head, batch):
 *                          K and V stay in shared memory, dK and dV in
 *                          registers, while the q tiles the block mask's
 *                          transposed arrays list stream past, for every
 *                          query head of the KV group (GQA sums there, with
 *                          no atomics). Per q tile, with S^T = K Q^T (kv rows,
 *                          q columns, so dK and dV accumulate straight from
 *                          the tensor cores' accumulator layout):
 *                            P^T  = exp(mods(S^T) - lse)      (the forward's
 *                                                              LSE, reused)
 *                            dV  += P^T dO
 *                            dP^T = V dO^T
 *                            dS^T = P^T * (dP^T - delta)
 *                            dR^T = dS^T * d score_mod / d score
 *                            dK  += dR^T Q                    (scaled at the end)
 *                            dQ  += dR K   (through shared memory, added to
 *                                           the fp32 accumulator with atomics)
 *                          and, per float buffer read of score_mod, dS times
 *                          its derivative added to the buffer's gradient;
 *   fg_attention_bwd_dq    dQ = scale * accumulator, in the input dtype.
 *
 * The deterministic variant (dq_atomic 0) keeps the order of every sum fixed:
 * the dK/dV pass leaves dQ alone, and fg_attention_bwd_dq_tiles computes it
 * with one thread block per (q tile, query head, batch) walking the block
 * mask's own arrays (per q block, its kv blocks), recomputing S and dP there
 * as FlashAttention-2's separate dQ pass does; the buffer gradients go into
 * fixed-point accumulators with integer atomics, which commute, and
 * fg_attention_bwd_fixed_to_float rounds them to fp32 once.
 *
 * The mods. Where the forward keeps a pair (FlexAttention's rules: an empty
 * block drops it, a full block keeps it without asking mask_mod, a partial
 * block asks mask_mod; positions past Q_LEN / KV_LEN are always dropped and
 * the mods never see them), P is exp(score_mod(scale * q.k) - lse);
 * elsewhere P is 0, and so is every gradient the pair contributes: the
 * derivative is taken only where P != 0, so an infinite derivative at a
 * dropped pair (log at 0, say) never meets a zero. A fully masked row has
 * lse = -inf and P = 0 everywhere: it contributes nothing, never a NaN.
 * d score_mod / d score (fg_score_grad) and the buffer gradients
 * (fg_mod_grads, fg_accumulate_grads) are emitted from the checked tree by
 * src/codegen/emit_grad.c; without a score_mod the derivative is 1.
 *
 * The source puts templates/attention/mma_sm80.cuh (cp.async, ldmatrix,
 * mma.sync) before this file.
 *
 * Head dims over 128 split the output columns of dK, dV and dQ over
 * FGB_DSPLIT thread blocks, each recomputing S and dP over the whole head
 * dim, so no thread holds more than 2 x 128 accumulator columns.
 */

#define FGB_NWARPS 4
#define FGB_THREADS (FGB_NWARPS * 32)
#define FGB_D FG_HEAD_DIM
/* The dK/dV pass: a warp per 16 kv rows, eight warps (128 kv rows) to head
 * dim 128, so each q step's Q and dO loads and dQ atomics serve twice the
 * kv rows (the pass is bound by L2 traffic, and that is most of it); four
 * over head dim 128, where eight would not fit an sm_80 block's shared
 * memory. With a block mask of 64-row kv blocks, a block covers 64 rows
 * (kv_rows) and the upper warps idle. */
#if FG_HEAD_DIM > 128
#define FGB_KV_WARPS 4
#else
#define FGB_KV_WARPS 8
#endif
#define FGB_KV_THREADS (FGB_KV_WARPS * 32)
#define FGB_BLOCK_N (16 * FGB_KV_WARPS)    /* kv rows per thread block (at most)  */
#if FG_HEAD_DIM > 64
#define FGB_BLOCK_M 32                     /* q rows per step                     */
#else
#define FGB_BLOCK_M 64
#endif
#if FG_HEAD_DIM > 128
#define FGB_DSPLIT 2
#define FGB_DC (16 * ((FGB_D / 16 + 1) / 2)) /* output columns of one thread block:
                                              the second block's last 16 may lie
                                              past D, and are computed but not kept */
#else
#define FGB_DSPLIT 1
#define FGB_DC FGB_D
#endif
#define FGB_ROW (FGB_D + 8)                /* padded shared row of Q, K, V, dO    */
#define FGB_SROW (FGB_BLOCK_M + 8)         /* padded shared row of dR^T           */
#define FGB_CHUNKS (FGB_D / 8)             /* 16-byte chunks per row              */
#define FGB_KSTEPS (FGB_D / 16)
#define FGB_MTILES (FGB_BLOCK_M / 8)       /* n8 tiles of S^T (q columns)         */
#define FGB_DCTILES (FGB_DC / 8)           /* n8 tiles of dK / dV (d columns)     */
#define FGB_QSLABS (FGB_BLOCK_M / 16)      /* 16-row slabs of the dQ tile         */
/* Warps that share a dQ slab, each taking a band of columns (a multiple of
 * 16); where the columns do not split evenly, one warp per slab and the
 * others rest. */
#if FGB_DC % (16 * (FGB_KV_WARPS / FGB_QSLABS)) == 0
#define FGB_QPARTS (FGB_KV_WARPS / FGB_QSLABS)
#else
#define FGB_QPARTS 1
#endif
#define FGB_QCOLS (FGB_DC / FGB_QPARTS)    /* dQ columns of one warp              */

/* The backward kernels' first argument; its fields are printed here from
 * src/attention/abi_bwd.def when the templates are embedded into the
 * library (scripts/embed_templates.py). */
struct fgb_args {
/* @abi src/attention/abi_bwd.def */
};
static_assert(sizeof(fgb_args) == 480, "fgb_args must match fgi_attn_bwd_abi");

#define FGB_NEG_INF __int_as_float(0xff800000)
#define FGB_POS_INF __int_as_float(0x7f800000)
#define FGB_LOG2E 1.4426950408889634f

/* ---- PTX wrappers (besides mma_sm80.cuh's) --------------------------------- */

static __device__ __forceinline__ fg_u32 fgb_smem_addr(const void *p) {
    fg_u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}
static __device__ __forceinline__ float fgb_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

/* ---- buffer gradients: exact fixed-point sums ------------------------------- */

/* A buffer gradient sums ds * d score_mod / d buf[i] over every pair that
 * reads element i, and those terms cancel heavily (ALiBi's slope gradient is
 * sum ds (kv - q), and ds sums to zero along a row), so the order of an fp32
 * sum would decide its digits. Each thread keeps a double running sum per
 * read (fg_grad_cache, emitted with the mod), and the sums go into a
 * fixed-point accumulator per element: four int64 limbs, limb k counting
 * units of 2^(32 k - 64), holding every multiple of 2^-64 up to about 2^95
 * exactly. A part is split into 32-bit chunks, one per limb, so a limb takes
 * 2^31 additions before it could overflow. Integer addition commutes: the
 * total does not depend on the order of the atomics, so buffer gradients are
 * bit-reproducible in both modes. Parts under 2^-64 in magnitude are
 * dropped, parts of 2^63 or more clamped there; fg_attention_bwd_fixed_to_float
 * rounds the total to fp32 once. */
#define FGB_FIXED_LIMBS 4

static __device__ __forceinline__ void fgb_fixed_add(long long *acc, double v) {
    if (!(v != 0.0)) return; /* zero, or a NaN that has no fixed-point form */
    const bool neg = v < 0.0;
    double m = fabs(v);
    if (m >= 9.2233720368547748e18) m = 9.2233720368547748e18; /* 2^63 - 2^10 */
    /* m in units of 2^-64: hi * 2^64 + lo, truncated */
    const double whole = floor(m);
    const unsigned long long hi = (unsigned long long)whole;
    const unsigned long long lo = (unsigned long long)((m - whole) * 18446744073709551616.0);
    const unsigned long long chunk[4] = {lo & 0xffffffffull, lo >> 32, hi & 0xffffffffull, hi >> 32};
#pragma unroll
    for (int k = 0; k < FGB_FIXED_LIMBS; k++)
        if (chunk[k])
            atomicAdd((unsigned long long *)(acc + k),
                      neg ? (unsigned long long)(-(long long)chunk[k]) : chunk[k]);
}

__device__ __forceinline__ void fg_grad_add(long long *acc, int i, double v) {
    fgb_fixed_add(acc + (fg_i64)i * FGB_FIXED_LIMBS, v);
}

/* The lanes holding the same element i (-1: nothing) add their sums, in
 * lane order, and the lowest of them adds the total. Every lane calls it. */
__device__ __forceinline__ void fg_grad_add_warp(long long *acc, int i, double v) {
    const int lane = threadIdx.x & 31;
    double sum = 0.0;
    int first = -1;
    for (int src = 0; src < 32; src++) {
        const int oi = __shfl_sync(0xffffffffu, i, src);
        const double o = __shfl_sync(0xffffffffu, v, src);
        if (oi == i) {
            sum += o;
            if (first < 0) first = src;
        }
    }
    if (i >= 0 && lane == first) fg_grad_add(acc, i, sum);
}

/* p[0] += x and p[1] += y, atomically each (p 8-byte aligned): one vector
 * reduction on sm_90, which halves the dQ atomics' L2 requests. */
static __device__ __forceinline__ void fgb_red2(float *p, float x, float y) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
#else
    atomicAdd(p, x);
    atomicAdd(p + 1, y);
#endif
}

/* Rows [r0, r0 + ROWS) of a [len, D] slab into shared memory (padded rows);
 * rows at or past `len` are zero-filled (a zero row times anything is 0,
 * where stale shared memory could hold a NaN). */
template <int ROWS, int THREADS = FGB_THREADS>
static __device__ __forceinline__ void fgb_load_tile(fg_u32 smem, const fg_u16 *base, fg_i64 row_stride, int r0,
                                                     int len) {
#pragma unroll 4
    for (int c = threadIdx.x; c < ROWS * FGB_CHUNKS; c += THREADS) {
        const int r = c / FGB_CHUNKS, ch = c % FGB_CHUNKS;
        const bool ok = r0 + r < len;
        const fg_u16 *src = ok ? base + (fg_i64)(r0 + r) * row_stride + ch * 8 : base;
        fga_cp16(smem + (fg_u32)((r * FGB_ROW + ch * 8) * 2), src, ok);
    }
}

/* ---- delta and the dQ accumulator ---------------------------------------------- */

/* The preprocess and the dQ conversion take FGB_ROW_BLOCK query rows of one
 * (b, h) per thread block (the host's grid: bwd_geometry's block_m for
 * these entries). A row is read as D / 8 chunks of 16 bytes, FGB_ROW_LANES
 * lanes to a row (D / 8 rounded up to a power of two, so a row's lanes are
 * an aligned group of a warp that xor shuffles can sum): each thread keeps
 * several 16-byte loads in flight, where one 2-byte load per lane and four
 * rows per block left both passes at about half the DRAM bandwidth. */
#define FGB_ROW_BLOCK 64
#define FGB_ROW_CHUNKS (FGB_D / 8)
#define FGB_ROW_LANES (FGB_ROW_CHUNKS <= 2 ? 2 : FGB_ROW_CHUNKS <= 4 ? 4 : FGB_ROW_CHUNKS <= 8 ? 8 : FGB_ROW_CHUNKS <= 16 ? 16 : 32)
#define FGB_ROWS_PER_PASS (FGB_THREADS / FGB_ROW_LANES)
#define FGB_PRE_PASSES (FGB_ROW_BLOCK / FGB_ROWS_PER_PASS)
#define FGB_PRE_BATCH (FGB_PRE_PASSES < 4 ? FGB_PRE_PASSES : 4)
static_assert(FGB_D % 16 == 0 && FGB_ROW_CHUNKS <= 32, "head dims are multiples of 16, at most 256");
static_assert(FG_LAUNCH_BLOCK_M_fg_attention_bwd_pre == FGB_ROW_BLOCK &&
                  FG_LAUNCH_BLOCK_M_fg_attention_bwd_dq == FGB_ROW_BLOCK,
              "bwd_geometry: query rows per block of the preprocess and the dQ conversion");
static_assert(FG_LAUNCH_THREADS_fg_attention_bwd_pre == FGB_THREADS &&
                  FG_LAUNCH_THREADS_fg_attention_bwd_dq == FGB_THREADS,
              "bwd_geometry: threads of the preprocess and the dQ conversion");

/* The dQ accumulator's rows per (b, h): the Hopper pass adds whole 64-row
 * tiles, so its rows are q_pitch apart; the portable one's are Q_LEN. */
#if defined(FG_KERNEL_ATTENTION_BWD_SM90)
#define FGB_ACC_ROWS(a) ((a).q_pitch)
#else
#define FGB_ACC_ROWS(a) ((a).q_len)
#endif

/* 8 consecutive 16-bit elements (VEC: one 16-byte load), kept packed
 * until fgb_dot8 so that several loads fit in flight. */
template <bool VEC>
static __device__ __forceinline__ uint4 fgb_load8(const fg_elem *p) {
    uint4 u;
    if (VEC) {
        u = *(const uint4 *)p;
    } else {
        u.x = (fg_u32)p[0].bits | (fg_u32)p[1].bits << 16;
        u.y = (fg_u32)p[2].bits | (fg_u32)p[3].bits << 16;
        u.z = (fg_u32)p[4].bits | (fg_u32)p[5].bits << 16;
        u.w = (fg_u32)p[6].bits | (fg_u32)p[7].bits << 16;
    }
    return u;
}

/* The dot product of two such packs, in fp32. */
static __device__ __forceinline__ float fgb_dot8(uint4 x, uint4 y) {
    const fg_u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        fg_elem xl, xh, yl, yh;
        xl.bits = (fg_u16)(xs[i] & 0xffffu), xh.bits = (fg_u16)(xs[i] >> 16);
        yl.bits = (fg_u16)(ys[i] & 0xffffu), yh.bits = (fg_u16)(ys[i] >> 16);
        acc += fg_elem_to_f32(xl) * fg_elem_to_f32(yl);
        acc += fg_elem_to_f32(xh) * fg_elem_to_f32(yh);
    }
    return acc;
}

/* Whether a 16-bit tensor's rows can be read or written 16 bytes at a time. */
static __device__ __forceinline__ bool fgb_vec16(fg_u64 ptr, const fg_i64 *stride) {
    return ((ptr | (fg_u64)stride[0] | (fg_u64)stride[1] | (fg_u64)stride[2]) & 7) == 0 && (ptr & 15) == 0;
}

/* delta = sum_d dO * O in fp32 for query rows [r0, r0 + FGB_ROW_BLOCK) of
 * (b, h) (and, for the Hopper kernel, lse * log2(e) beside it); VEC: O's
 * and dO's rows are read 16 bytes at a time. */
template <bool VEC>
static __device__ __forceinline__ void fgb_pre_rows(const fgb_args &a, int r0, int h, int b) {
    const fg_i64 rb = (fg_i64)b * a.heads_q + h;
    const int sub = threadIdx.x % FGB_ROW_LANES, chunk = sub * 8;
    const fg_elem *o = (const fg_elem *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)h * a.o_stride[1];
    const fg_elem *d = (const fg_elem *)a.dout + (fg_i64)b * a.do_stride[0] + (fg_i64)h * a.do_stride[1];
    /* FGB_PRE_BATCH rows per thread at a time: their loads all issued
     * before any is used */
    for (int p0 = 0; p0 < FGB_PRE_PASSES; p0 += FGB_PRE_BATCH) {
        uint4 x[FGB_PRE_BATCH], y[FGB_PRE_BATCH];
#pragma unroll
        for (int j = 0; j < FGB_PRE_BATCH; j++) {
            const int row = r0 + (p0 + j) * FGB_ROWS_PER_PASS + threadIdx.x / FGB_ROW_LANES;
            x[j] = y[j] = make_uint4(0, 0, 0, 0);
            if (row < a.q_len && chunk < FGB_D) {
                x[j] = fgb_load8<VEC>(o + (fg_i64)row * a.o_stride[2] + chunk);
                y[j] = fgb_load8<VEC>(d + (fg_i64)row * a.do_stride[2] + chunk);
            }
        }
#pragma unroll
        for (int j = 0; j < FGB_PRE_BATCH; j++) {
            const int row = r0 + (p0 + j) * FGB_ROWS_PER_PASS + threadIdx.x / FGB_ROW_LANES;
            float acc = fgb_dot8(x[j], y[j]);
            /* the row's lanes are an aligned group: xor within it */
#pragma unroll
            for (int off = FGB_ROW_LANES / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
            if (sub != 0 || row >= a.q_len) continue;
            const fg_i64 r = rb * a.q_pitch + row;
            /* d lse_i / d s_ij = P_ij: a gradient on lse joins dS = P (dP - delta)
             * as -dlse in delta. */
            if (a.dlse) acc -= ((const float *)a.dlse)[rb * a.q_len + row];
            ((float *)a.delta)[r] = acc;
            /* lse2 = lse log2(e), and +inf for a row no key reaches (lse
             * -inf): there exp2(x - lse2) is 0 for every finite x, so the
             * Hopper pass's element loops without a score_mod need no test
             * of lse2 to keep such rows out (attention_bwd_sm90.cuh,
             * fgs_elements) */
            if (a.lse2) {
                const float l = ((const float *)a.lse)[rb * a.q_len + row];
                ((float *)a.lse2)[r] = l == FGB_NEG_INF ? FGB_POS_INF : l * FGB_LOG2E;
            }
        }
    }
}

/* Whether the dQ accumulator's tiles have flags and no zeros (the Hopper
 * pass at head dim 128: attention_bwd_sm90.cuh's "The dQ accumulator
 * without zeros"); else the preprocess zeroes the accumulator. */
#if defined(FG_KERNEL_ATTENTION_BWD_SM90) && FG_HEAD_DIM == 128
#define FGB_DQ_FLAGS 1
#else
#define FGB_DQ_FLAGS 0
#endif

#if defined(FG_KERNEL_ATTENTION_BWD_SM90)
static_assert(FGB_ROW_BLOCK == 64, "a block of the preprocess and the dQ conversion is one row of dQ tiles");
/* The Hopper accumulator's 64 x 64 tile (4096 floats) holding row `row`,
 * column `c` of (b, h) (rb = b * Hq + h): [rb][q_pitch / 64][D / 64]. */
static __device__ __forceinline__ fg_i64 fgb_dq_tile(const fgb_args &a, fg_i64 rb, int row, int c) {
    return (rb * (FGB_ACC_ROWS(a) >> 6) + (row >> 6)) * (FGB_D / 64) + (c >> 6);
}
/* The flag of tile number `tile` (one int per tile, in the same order). */
static __device__ __forceinline__ int *fgb_dq_flag_at(const fgb_args &a, fg_i64 tile) {
    return (int *)a.dq_flags + tile;
}
static __device__ __forceinline__ int *fgb_dq_flag(const fgb_args &a, fg_i64 rb, int row, int c) {
    return fgb_dq_flag_at(a, fgb_dq_tile(a, rb, row, c));
}
#endif

/* The preprocess: delta (fgb_pre_rows), and where dq_accum is in use, the
 * flags of this block's row of dQ tiles zeroed (FGB_DQ_FLAGS: a tile's
 * first reduction stores) or else its rows of the accumulator, which
 * saves a memset of the whole accumulator before this launch: the zeros
 * go out while the loads are in flight. Grid
 * (ceil(q_pitch / FGB_ROW_BLOCK), Hq, B). */
extern "C" __global__ void __launch_bounds__(FGB_THREADS)
fg_attention_bwd_pre(const __grid_constant__ fgb_args a) {
    const int h = blockIdx.y, b = blockIdx.z, r0 = blockIdx.x * FGB_ROW_BLOCK;
#if FGB_DQ_FLAGS
    if (a.dq_accum && threadIdx.x < FGB_D / 64)
        fgb_dq_flag(a, (fg_i64)b * a.heads_q + h, r0, 64 * threadIdx.x)[0] = 0;
#else
    if (a.dq_accum) {
        const fg_i64 rb = (fg_i64)b * a.heads_q + h;
        const int acc_rows = FGB_ACC_ROWS(a);
        const int n = (min(acc_rows, r0 + FGB_ROW_BLOCK) - r0) * (FGB_D / 4);
        float4 *z = (float4 *)((float *)a.dq_accum + (rb * acc_rows + r0) * FGB_D);
        for (int i = threadIdx.x; i < n; i += FGB_THREADS) z[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#endif
    if (fgb_vec16(a.out, a.o_stride) && fgb_vec16(a.dout, a.do_stride))
        fgb_pre_rows<true>(a, r0, h, b);
    else
        fgb_pre_rows<false>(a, r0, h, b);
}

/* One thread per gradient element: the fixed-point sum rounded to fp32
 * (the limbs converted and added in double, smallest first: the same
 * operations in the same order every time). Grid ceil(n / 128). */
extern "C" __global__ void __launch_bounds__(FGB_THREADS)
fg_attention_bwd_fixed_to_float(const long long *__restrict__ acc, float *__restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * FGB_THREADS + threadIdx.x;
    if (i >= n) return;
    double v = 0.0;
#pragma unroll
    for (int k = 0; k < FGB_FIXED_LIMBS; k++) v += (double)acc[i * FGB_FIXED_LIMBS + k] * ldexp(1.0, 32 * k - 64);
    out[i] = (float)v;
}

/* Where the dQ accumulator keeps column c of query row `row` of (b, h)
 * (rb = b * Hq + h). The portable dK/dV pass adds rows of D floats
 * ([rb][Q_LEN][D]); the Hopper one adds 64 x 64 tiles with the TMA unit
 * ([rb][q_pitch / 64][D / 64][64 rows][64 columns]), the float pairs of
 * tile row r permuted (pair p at p ^ 4 (r % 8)) so that the tensor cores'
 * accumulator rows take different shared-memory banks on their way out. */
static __device__ __forceinline__ fg_i64 fgb_dq_index(const fgb_args &a, fg_i64 rb, int row, int c) {
#if defined(FG_KERNEL_ATTENTION_BWD_SM90)
    const int r = row & 63, cc = c & 63;
    const int pc = ((((cc >> 1) ^ ((r & 7) << 2))) << 1) | (cc & 1);
    return (fgb_dq_tile(a, rb, row, c) * 64 + r) * 64 + pc;
#else
    return (rb * FGB_ACC_ROWS(a) + row) * FGB_D + c;
#endif
}

/* dQ = scale * accumulator, rounded to the dtype: a thread per 8 columns
 * of a row (8 consecutive columns are 32 contiguous bytes in either
 * layout: the Hopper one permutes float pairs in aligned groups of four),
 * 16-byte stores where dq allows them. Grid (ceil(Q_LEN / FGB_ROW_BLOCK),
 * Hq, B). */
extern "C" __global__ void __launch_bounds__(FGB_THREADS)
fg_attention_bwd_dq(const __grid_constant__ fgb_args a) {
    const int h = blockIdx.y, b = blockIdx.z, r0 = blockIdx.x * FGB_ROW_BLOCK;
    const fg_i64 rb = (fg_i64)b * a.heads_q + h;
    const float *acc = (const float *)a.dq_accum;
    fg_elem *dq = (fg_elem *)a.dq + (fg_i64)b * a.dq_stride[0] + (fg_i64)h * a.dq_stride[1];
    const bool vec = fgb_vec16(a.dq, a.dq_stride);
    const int n = (min(a.q_len, r0 + FGB_ROW_BLOCK) - r0) * FGB_ROW_CHUNKS;
#if FGB_DQ_FLAGS
    /* which of this row's tiles some reduction wrote: the others hold
     * whatever the workspace held, and their dQ is 0 */
    unsigned written = 0; /* bit t: tile t */
#pragma unroll
    for (int t = 0; t < FGB_D / 64; t++) written |= (unsigned)(*fgb_dq_flag(a, rb, r0, 64 * t) != 0) << t;
#endif
    /* four chunks per thread at a time, their loads issued first */
    for (int i0 = threadIdx.x; i0 < n; i0 += 4 * FGB_THREADS) {
        float4 x[4][2];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + j * FGB_THREADS;
            if (i >= n) continue;
            const int row = r0 + i / FGB_ROW_CHUNKS, c = (i % FGB_ROW_CHUNKS) * 8;
#if FGB_DQ_FLAGS
            if (!((written >> (c >> 6)) & 1)) {
                x[j][0] = x[j][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                continue;
            }
#endif
            const float4 *src = (const float4 *)(acc + fgb_dq_index(a, rb, row, c));
            x[j][0] = src[0], x[j][1] = src[1];
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = i0 + j * FGB_THREADS;
            if (i >= n) continue;
            const int row = r0 + i / FGB_ROW_CHUNKS, c = (i % FGB_ROW_CHUNKS) * 8;
            const float f[8] = {x[j][0].x, x[j][0].y, x[j][0].z, x[j][0].w,
                                x[j][1].x, x[j][1].y, x[j][1].z, x[j][1].w};
            fg_elem *dst = dq + (fg_i64)row * a.dq_stride[2] + c;
            if (vec) {
                uint4 u;
                u.x = fg_pack2(f[0] * a.scale, f[1] * a.scale);
                u.y = fg_pack2(f[2] * a.scale, f[3] * a.scale);
                u.z = fg_pack2(f[4] * a.scale, f[5] * a.scale);
                u.w = fg_pack2(f[6] * a.scale, f[7] * a.scale);
                *(uint4 *)dst = u;
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) dst[k] = fg_f32_to_elem(f[k] * a.scale);
            }
        }
    }
}

/* ---- dK, dV and dQ ----------------------------------------------------------------- */

/* The tiles one thread block visits, from one row of a block mask's index
 * arrays: the dK/dV pass walks the transposed row of its kv block (q tiles
 * of FGB_BLOCK_M), the dQ pass the row of its q block (kv tiles). Items
 * [0, n_partial * per_block) are tiles of partial blocks (mask_mod
 * evaluated), the rest of full ones. Without a block mask every tile of
 * the other side, partial when the mod has a mask_mod. */
struct fgb_plan {
    const int *part, *full;
    int n_partial, n_items, per_block, block, tile;
};

/* num, idx, full_num, full_idx: the four arrays of one direction (device
 * pointers, [bm_batch][bm_heads][rows][cols]); row: the block-mask row this
 * block reads; cols: the other side's block count; block: the other side's
 * block size; tile: the tile the kernel steps by; len: the other side's
 * length (no block mask). */
static __device__ __forceinline__ fgb_plan fgb_plan_make(const fgb_args &a, fg_u64 num, fg_u64 idx,
                                                         fg_u64 full_num, fg_u64 full_idx, fg_i64 row,
                                                         int cols, int block, int tile, int len) {
    fgb_plan pl;
    pl.tile = tile;
    if (a.has_block_mask) {
        pl.part = (const int *)idx + row * cols;
        pl.full = (const int *)full_idx + row * cols;
        pl.n_partial = ((const int *)num)[row];
        pl.per_block = block / tile;
        pl.block = block;
        pl.n_items = (pl.n_partial + ((const int *)full_num)[row]) * pl.per_block;
    } else {
        pl.part = pl.full = 0;
        pl.n_partial = 0;
        pl.per_block = 1;
        pl.block = tile;
        pl.n_items = (len + tile - 1) / tile;
    }
    return pl;
}

/* The block-mask row of (b, h) and block `blk` of the rows' side. */
static __device__ __forceinline__ fg_i64 fgb_bm_row(const fgb_args &a, int b, int h, int blk, int rows) {
    const int mb = a.bm_batch == 1 ? 0 : b, mh = a.bm_heads == 1 ? 0 : h;
    return ((fg_i64)mb * a.bm_heads + mh) * rows + blk;
}

/* The first row of item j and whether it is partial. */
static __device__ __forceinline__ int fgb_item_start(const fgb_plan &pl, int j, bool &partial) {
    if (!pl.part) {
        partial = FG_HAS_MASK_MOD;
        return j * pl.tile;
    }
    const int blk = j / pl.per_block, sub = j % pl.per_block;
    partial = blk < pl.n_partial;
    const int ob = partial ? pl.part[blk] : pl.full[blk - pl.n_partial];
    return ob * pl.block + sub * pl.tile;
}

/* 4 bytes global -> shared; `valid` false zero-fills without reading. */
static __device__ __forceinline__ void fgb_cp4(fg_u32 dst, const void *src, bool valid) {
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}

/* The dK/dV pass's plan for query head h: the transposed row of its kv
 * block, q tiles of FGB_BLOCK_M. */
static __device__ __forceinline__ fgb_plan fgb_dkdv_plan(const fgb_args &a, int b, int h, int kv0) {
    return a.has_block_mask ? fgb_plan_make(a, a.q_num, a.q_idx, a.full_q_num, a.full_q_idx,
                                            fgb_bm_row(a, b, h, kv0 / a.bm_kv_block, a.bm_kv_blocks),
                                            a.bm_q_blocks, a.bm_q_block, FGB_BLOCK_M, a.q_len)
                            : fgb_plan_make(a, 0, 0, 0, 0, 0, 0, 0, FGB_BLOCK_M, a.q_len);
}

/* Queue the loads of step j of head h's plan into one stage: Q and dO rows
 * (cp.async, rows past Q_LEN zero), lse and delta (rows past Q_LEN zero; the
 * element loop never reads them there). The caller commits. */
static __device__ __forceinline__ void fgb_dkdv_load(const fgb_args &a, int b, int h, const fgb_plan &pl, int j,
                                                     fg_u32 sQ, float *rows) {
    bool partial;
    const int q0 = fgb_item_start(pl, j, partial);
    const fg_u16 *qp = (const fg_u16 *)a.q + (fg_i64)b * a.q_stride[0] + (fg_i64)h * a.q_stride[1];
    const fg_u16 *op = (const fg_u16 *)a.dout + (fg_i64)b * a.do_stride[0] + (fg_i64)h * a.do_stride[1];
    fgb_load_tile<FGB_BLOCK_M, FGB_KV_THREADS>(sQ, qp, a.q_stride[2], q0, a.q_len);
    fgb_load_tile<FGB_BLOCK_M, FGB_KV_THREADS>(sQ + FGB_BLOCK_M * FGB_ROW * 2, op, a.do_stride[2], q0, a.q_len);
    const fg_i64 rb = (fg_i64)b * a.heads_q + h;
    for (int i = threadIdx.x; i < 2 * FGB_BLOCK_M; i += FGB_KV_THREADS) {
        const int r = i % FGB_BLOCK_M;
        const bool in = q0 + r < a.q_len;
        const float *src = i < FGB_BLOCK_M ? (const float *)a.lse + (in ? rb * a.q_len + q0 + r : 0)
                                           : (const float *)a.delta + (in ? rb * a.q_pitch + q0 + r : 0);
        fgb_cp4(fgb_smem_addr(rows + i), src, in);
    }
}

/* Pack two accumulator n8 tiles (columns 16 kc .. 16 kc + 15) into one A
 * fragment of k16. */
static __device__ __forceinline__ void fgb_to_a(fg_u32 (&f)[4], const float (&c0)[4], const float (&c1)[4]) {
    f[0] = fg_pack2(c0[0], c0[1]);
    f[1] = fg_pack2(c0[2], c0[3]);
    f[2] = fg_pack2(c1[0], c1[1]);
    f[3] = fg_pack2(c1[2], c1[3]);
}

/* The Hopper source replaces the portable dK/dV pass with its own
 * (attention_bwd_sm90.cuh) and keeps everything else. */
#if !defined(FG_KERNEL_ATTENTION_BWD_SM90)
/* bwd_geometry's shared memory against this pass's layout below: K, V,
 * dR^T, two stages of Q and dO, two of lse and delta. */
static_assert(FG_LAUNCH_SMEM_fg_attention_bwd_dkdv >= (2 * FGB_BLOCK_N + 4 * FGB_BLOCK_M) * FGB_ROW * 2 +
                                                          FGB_BLOCK_N * FGB_SROW * 2 + 4 * FGB_BLOCK_M * 4,
              "bwd_geometry: the dK/dV pass's shared memory");

/* Grid (kv_tiles * FGB_DSPLIT, Hkv, B). Two blocks per SM at most: the
 * register budget is 255 a thread (with the bound on threads alone, ptxas
 * aims at three blocks and spills at some head dims). */
extern "C" __global__ void __launch_bounds__(FGB_KV_THREADS, FGB_KV_WARPS == 4 ? 2 : 1)
fg_attention_bwd_dkdv(const __grid_constant__ fgb_args a, const __grid_constant__ fg_mod_params p,
                      const __grid_constant__ fg_mod_grads gr) {
    extern __shared__ __align__(128) unsigned char fgb_smem[];
    /* K, V and dR^T, then two stages of (Q, dO) and of (lse, delta): the
     * next step's tiles load while this one computes. */
    const fg_u32 sK = fgb_smem_addr(fgb_smem);
    const fg_u32 sV = sK + FGB_BLOCK_N * FGB_ROW * 2;
    const fg_u32 sS = sV + FGB_BLOCK_N * FGB_ROW * 2; /* dR^T, [kv][q] */
    const fg_u32 sQ0 = sS + FGB_BLOCK_N * FGB_SROW * 2;
    const fg_u32 stage_bytes = 2 * FGB_BLOCK_M * FGB_ROW * 2;
    float *const s_rows0 = (float *)(fgb_smem + (sQ0 - sK) + 2 * stage_bytes); /* [2][2][BM] */

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int kvt = blockIdx.x / FGB_DSPLIT, dc0 = (blockIdx.x % FGB_DSPLIT) * FGB_DC;
    const int hk = blockIdx.y, b = blockIdx.z;
    const int group = a.heads_q / a.heads_kv;
    const int kv0 = kvt * a.kv_rows;
    const int kv_end = min(a.kv_len, kv0 + a.kv_rows); /* this block's rows end here */

    const fg_u16 *kp = (const fg_u16 *)a.k + (fg_i64)b * a.k_stride[0] + (fg_i64)hk * a.k_stride[1];
    const fg_u16 *vp = (const fg_u16 *)a.v + (fg_i64)b * a.v_stride[0] + (fg_i64)hk * a.v_stride[1];
    fgb_load_tile<FGB_BLOCK_N, FGB_KV_THREADS>(sK, kp, a.k_stride[2], kv0, kv_end);
    fgb_load_tile<FGB_BLOCK_N, FGB_KV_THREADS>(sV, vp, a.v_stride[2], kv0, kv_end);

    /* ldmatrix lane patterns: A from a row-major [m][k] tile; B from a
     * [n][k] tile (no transpose) or a [k][n] tile (transposed); A from a
     * [k][m] tile (transposed). */
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int bn_row = (lane & 7) + (lane >> 4) * 8, bn_col = ((lane >> 3) & 1) * 8;
    const int bk_row = (lane & 7) + ((lane >> 3) & 1) * 8, bk_col = (lane >> 4) * 8;

    /* This warp's kv rows: kvr0 + {0, 8}. */
    const int kvr0 = kv0 + warp * 16 + g;
    float dk[FGB_DCTILES][4], dv[FGB_DCTILES][4];
#pragma unroll
    for (int i = 0; i < FGB_DCTILES; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;

    fg_grad_cache gcache;
    fg_grad_cache_init(gcache);

    /* The steps: every q tile of every query head of the group, in order,
     * the head's plan made when its first tile is reached. */
    int gi = 0, j = 0, stage = 0;
    fgb_plan pl = fgb_dkdv_plan(a, b, hk * group, kv0);
    while (gi < group && pl.n_items == 0)
        if (++gi < group) pl = fgb_dkdv_plan(a, b, hk * group + gi, kv0);
    if (gi < group) fgb_dkdv_load(a, b, hk * group + gi, pl, j, sQ0, s_rows0);
    fga_cp_commit(); /* with K and V */

    while (gi < group) {
        const int h = hk * group + gi;
        bool partial;
        const int q0 = fgb_item_start(pl, j, partial);
        const fg_i64 row_base = ((fg_i64)b * a.heads_q + h) * a.q_len;
        const fg_u32 sQ = sQ0 + stage * stage_bytes, sO = sQ + FGB_BLOCK_M * FGB_ROW * 2;
        const float *const s_lse = s_rows0 + stage * 2 * FGB_BLOCK_M, *const s_delta = s_lse + FGB_BLOCK_M;

        /* The next step (the loop's advance, done here so `continue` keeps it). */
        int ngi = gi, nj = j + 1;
        while (ngi < group && nj >= pl.n_items) {
            nj = 0;
            if (++ngi < group) pl = fgb_dkdv_plan(a, b, hk * group + ngi, kv0);
        }
        gi = ngi, j = nj, stage ^= 1;

        __syncthreads(); /* the previous step is done with its stage and dR^T */
        if (gi < group) {
            fgb_dkdv_load(a, b, hk * group + gi, pl, j, sQ0 + stage * stage_bytes, s_rows0 + stage * 2 * FGB_BLOCK_M);
            fga_cp_commit();
            fga_cp_wait<1>();
        } else {
            fga_cp_wait<0>();
        }
        __syncthreads();

        /* S^T = K Q^T for this warp's 16 kv rows. */
        float s[FGB_MTILES][4];
#pragma unroll
        for (int i = 0; i < FGB_MTILES; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FGB_KSTEPS; kk++) {
            fg_u32 af[4];
            fga_ldsm4(sK + (fg_u32)(((warp * 16 + a_row) * FGB_ROW + kk * 16 + a_col) * 2), af[0], af[1], af[2], af[3]);
#pragma unroll
            for (int np = 0; np < FGB_MTILES / 2; np++) {
                fg_u32 bf[4];
                fga_ldsm4(sQ + (fg_u32)(((np * 16 + bn_row) * FGB_ROW + kk * 16 + bn_col) * 2), bf[0], bf[1], bf[2], bf[3]);
                fga_mma(s[2 * np], af, bf[0], bf[1]);
                fga_mma(s[2 * np + 1], af, bf[2], bf[3]);
            }
        }

        /* dP^T = V dO^T, over the whole head dim. */
        float dp[FGB_MTILES][4];
#pragma unroll
        for (int i = 0; i < FGB_MTILES; i++) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FGB_KSTEPS; kk++) {
            fg_u32 af[4];
            fga_ldsm4(sV + (fg_u32)(((warp * 16 + a_row) * FGB_ROW + kk * 16 + a_col) * 2), af[0], af[1], af[2], af[3]);
#pragma unroll
            for (int np = 0; np < FGB_MTILES / 2; np++) {
                fg_u32 bf[4];
                fga_ldsm4(sO + (fg_u32)(((np * 16 + bn_row) * FGB_ROW + kk * 16 + bn_col) * 2), bf[0], bf[1], bf[2], bf[3]);
                fga_mma(dp[2 * np], af, bf[0], bf[1]);
                fga_mma(dp[2 * np + 1], af, bf[2], bf[3]);
            }
        }

        /* Element by element: P^T, then dR^T = P^T (dP^T - delta) d score_mod /
         * d score in place of dP^T, and the buffer gradients. Element e of
         * tile i sits at kv row kvr0 + 8 (e >> 1), q column 8 i + 2 t4 + (e & 1). */
#pragma unroll
        for (int i = 0; i < FGB_MTILES; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int kv = kvr0 + 8 * (e >> 1), qc = 8 * i + 2 * t4 + (e & 1), q = q0 + qc;
                const float lse = s_lse[qc];
                float pr = 0.f, dr = 0.f;
                if (FG_GRAD_SITES == 0) {
                    /* No buffer gradient: no branch per element (as the
                     * Hopper pass, attention_notes v28): whether the pair is
                     * kept is one bool made eagerly (every mod expression
                     * is total), P is made for every element and selected,
                     * and dR is 0 wherever P is. */
                    const int qi = q + a.q_offset, ki = kv + a.kv_offset;
                    const bool keep = (q < a.q_len) & (kv < kv_end) & (lse != FGB_NEG_INF) &
                                      (!partial | fg_mask_mod(p, b, h, qi, ki));
                    const float raw = s[i][e] * a.scale;
                    const float pv = fgb_exp2(fg_score_mod(p, raw, b, h, qi, ki) * FGB_LOG2E - lse * FGB_LOG2E);
                    pr = keep ? pv : 0.f;
                    const float ds = pr * (dp[i][e] - s_delta[qc]);
                    dr = pr != 0.f ? ds * fg_score_grad(p, raw, b, h, qi, ki) : 0.f;
                } else if (q < a.q_len && kv < kv_end && lse != FGB_NEG_INF) {
                    const int qi = q + a.q_offset, ki = kv + a.kv_offset;
                    if (!partial || fg_mask_mod(p, b, h, qi, ki)) {
                        const float raw = s[i][e] * a.scale;
                        const float sc = fg_score_mod(p, raw, b, h, qi, ki);
                        pr = fgb_exp2(sc * FGB_LOG2E - lse * FGB_LOG2E);
                        if (pr != 0.f) {
                            const float ds = pr * (dp[i][e] - s_delta[qc]);
                            dr = ds * fg_score_grad(p, raw, b, h, qi, ki);
                            if (FGB_DSPLIT == 1 || dc0 == 0) fg_accumulate_grads(p, gr, gcache, ds, raw, b, h, qi, ki);
                        }
                    }
                }
                s[i][e] = pr;
                dp[i][e] = dr;
            }

        /* dV += P^T dO and dK += dR^T Q over this block's output columns,
         * P^T and dR^T packed from the accumulator layout to A fragments. */
#pragma unroll
        for (int kc = 0; kc < FGB_BLOCK_M / 16; kc++) {
            fg_u32 pa[4], ra[4];
            fgb_to_a(pa, s[2 * kc], s[2 * kc + 1]);
            fgb_to_a(ra, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
            for (int dpair = 0; dpair < FGB_DCTILES / 2; dpair++) {
                fg_u32 of[4], qf[4];
                const int col = dc0 + dpair * 16 + bk_col;
                fga_ldsm4t(sO + (fg_u32)(((kc * 16 + bk_row) * FGB_ROW + col) * 2), of[0], of[1], of[2], of[3]);
                fga_ldsm4t(sQ + (fg_u32)(((kc * 16 + bk_row) * FGB_ROW + col) * 2), qf[0], qf[1], qf[2], qf[3]);
                fga_mma(dv[2 * dpair], pa, of[0], of[1]);
                fga_mma(dv[2 * dpair + 1], pa, of[2], of[3]);
                fga_mma(dk[2 * dpair], ra, qf[0], qf[1]);
                fga_mma(dk[2 * dpair + 1], ra, qf[2], qf[3]);
            }
        }

        if (!a.dq_atomic) continue; /* dQ has a pass of its own */

        /* dR^T to shared memory for dQ = dR K. */
#pragma unroll
        for (int i = 0; i < FGB_MTILES; i++) {
            const int r = warp * 16 + g, c = 8 * i + 2 * t4;
            *(fg_u32 *)(fgb_smem + (sS - sK) + (r * FGB_SROW + c) * 2) = fg_pack2(dp[i][0], dp[i][1]);
            *(fg_u32 *)(fgb_smem + (sS - sK) + ((r + 8) * FGB_SROW + c) * 2) = fg_pack2(dp[i][2], dp[i][3]);
        }
        __syncthreads();

        /* dQ[slab rows][this warp's columns] = dR K, added to the fp32
         * accumulator. A from dR^T ([kv][q], transposed), B from K
         * ([kv][d], transposed). */
        if (warp / FGB_QSLABS < FGB_QPARTS) {
            const int slab = warp % FGB_QSLABS, part = warp / FGB_QSLABS;
            const int qcol0 = dc0 + part * FGB_QCOLS;
            float dq[FGB_QCOLS / 8][4];
#pragma unroll
            for (int i = 0; i < FGB_QCOLS / 8; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;
#pragma unroll
            for (int kc = 0; kc < FGB_BLOCK_N / 16; kc++) {
                fg_u32 af[4];
                fga_ldsm4t(sS + (fg_u32)(((kc * 16 + bn_row) * FGB_SROW + slab * 16 + bn_col) * 2), af[0], af[1], af[2], af[3]);
#pragma unroll
                for (int dpair = 0; dpair < FGB_QCOLS / 16; dpair++) {
                    fg_u32 kf[4];
                    fga_ldsm4t(sK + (fg_u32)(((kc * 16 + bk_row) * FGB_ROW + qcol0 + dpair * 16 + bk_col) * 2), kf[0], kf[1], kf[2], kf[3]);
                    fga_mma(dq[2 * dpair], af, kf[0], kf[1]);
                    fga_mma(dq[2 * dpair + 1], af, kf[2], kf[3]);
                }
            }
#pragma unroll
            for (int i = 0; i < FGB_QCOLS / 8; i++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int q = q0 + slab * 16 + g + 8 * half;
                    if (q < a.q_len && (FGB_DSPLIT == 1 || qcol0 + 8 * i + 2 * t4 < FGB_D))
                        fgb_red2((float *)a.dq_accum + (row_base + q) * FGB_D + qcol0 + 8 * i + 2 * t4,
                                 dq[i][2 * half], dq[i][2 * half + 1]);
                }
        }
    }

    fg_grad_flush(gr, gcache);

    /* dK (scaled) and dV of this warp's rows and this block's columns. */
    fg_elem *dkp = (fg_elem *)a.dk + (fg_i64)b * a.dk_stride[0] + (fg_i64)hk * a.dk_stride[1];
    fg_elem *dvp = (fg_elem *)a.dv + (fg_i64)b * a.dv_stride[0] + (fg_i64)hk * a.dv_stride[1];
#pragma unroll
    for (int i = 0; i < FGB_DCTILES; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int kv = kvr0 + 8 * half, c = dc0 + 8 * i + 2 * t4;
            if (kv >= kv_end || (FGB_DSPLIT > 1 && c >= FGB_D)) continue;
            *(fg_u32 *)(dkp + (fg_i64)kv * a.dk_stride[2] + c) =
                fg_pack2(dk[i][2 * half] * a.scale, dk[i][2 * half + 1] * a.scale);
            *(fg_u32 *)(dvp + (fg_i64)kv * a.dv_stride[2] + c) = fg_pack2(dv[i][2 * half], dv[i][2 * half + 1]);
        }
}

#endif /* !FG_KERNEL_ATTENTION_BWD_SM90 */

/* ---- dQ on its own (the deterministic pass) ------------------------------------- */

#define FGQ_BLOCK_M 64                     /* q rows per thread block: 16 a warp  */
#if FG_HEAD_DIM > 128
#define FGQ_BLOCK_N 32                     /* kv rows per step                    */
#else
#define FGQ_BLOCK_N 64
#endif
#define FGQ_NTILES (FGQ_BLOCK_N / 8)       /* n8 tiles of S (kv columns)          */

/* One thread block per (q tile, query head, batch), times FGB_DSPLIT column
 * bands over head dims past 128. Q and dO stay in shared memory, the dQ
 * rows of each warp in registers, while the kv tiles the block mask lists
 * for the q block stream past: per kv tile
 *     S  = Q K^T, P = exp(mods(S) - lse), dP = dO V^T,
 *     dR = P (dP - delta) d score_mod / d score,  dQ += dR K,
 * in the same order every run; dQ is scaled and written at the end. The
 * pairs kept, the mods' arguments and the guards are the dK/dV pass's.
 * Grid (q_tiles * FGB_DSPLIT, Hq, B); registers as for the dK/dV pass. */
/* bwd_geometry's shared memory against this pass's layout: Q, dO, K, V. */
static_assert(FG_LAUNCH_SMEM_fg_attention_bwd_dq_tiles >= (2 * FGQ_BLOCK_M + 2 * FGQ_BLOCK_N) * FGB_ROW * 2,
              "bwd_geometry: the deterministic dQ pass's shared memory");
extern "C" __global__ void __launch_bounds__(FGB_THREADS, 2)
fg_attention_bwd_dq_tiles(const __grid_constant__ fgb_args a, const __grid_constant__ fg_mod_params p) {
    extern __shared__ __align__(128) unsigned char fgb_smem[];
    const fg_u32 sQ = fgb_smem_addr(fgb_smem);
    const fg_u32 sO = sQ + FGQ_BLOCK_M * FGB_ROW * 2; /* dO */
    const fg_u32 sK = sO + FGQ_BLOCK_M * FGB_ROW * 2;
    const fg_u32 sV = sK + FGQ_BLOCK_N * FGB_ROW * 2;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int qt = blockIdx.x / FGB_DSPLIT, dc0 = (blockIdx.x % FGB_DSPLIT) * FGB_DC;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (a.heads_q / a.heads_kv);
    const int q0 = qt * FGQ_BLOCK_M;

    const fg_u16 *qp = (const fg_u16 *)a.q + (fg_i64)b * a.q_stride[0] + (fg_i64)h * a.q_stride[1];
    const fg_u16 *op = (const fg_u16 *)a.dout + (fg_i64)b * a.do_stride[0] + (fg_i64)h * a.do_stride[1];
    const fg_u16 *kp = (const fg_u16 *)a.k + (fg_i64)b * a.k_stride[0] + (fg_i64)hk * a.k_stride[1];
    const fg_u16 *vp = (const fg_u16 *)a.v + (fg_i64)b * a.v_stride[0] + (fg_i64)hk * a.v_stride[1];
    fgb_load_tile<FGQ_BLOCK_M>(sQ, qp, a.q_stride[2], q0, a.q_len);
    fgb_load_tile<FGQ_BLOCK_M>(sO, op, a.do_stride[2], q0, a.q_len);

    /* This warp's q rows qr0 + {0, 8}, their lse and delta. */
    const int qr0 = q0 + warp * 16 + g;
    const fg_i64 row_base = ((fg_i64)b * a.heads_q + h) * a.q_len;
    /* scalars, not arrays: an array indexed in a loop the compiler leaves
     * rolled would go to local memory */
    const bool in0 = qr0 < a.q_len, in1 = qr0 + 8 < a.q_len;
    const float lse0 = in0 ? ((const float *)a.lse)[row_base + qr0] : FGB_NEG_INF;
    const float lse1 = in1 ? ((const float *)a.lse)[row_base + qr0 + 8] : FGB_NEG_INF;
    const fg_i64 delta_base = ((fg_i64)b * a.heads_q + h) * a.q_pitch;
    const float delta0 = in0 ? ((const float *)a.delta)[delta_base + qr0] : 0.f;
    const float delta1 = in1 ? ((const float *)a.delta)[delta_base + qr0 + 8] : 0.f;

    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int bn_row = (lane & 7) + (lane >> 4) * 8, bn_col = ((lane >> 3) & 1) * 8;
    const int bk_row = (lane & 7) + ((lane >> 3) & 1) * 8, bk_col = (lane >> 4) * 8;

    float dq[FGB_DCTILES][4];
#pragma unroll
    for (int i = 0; i < FGB_DCTILES; i++) dq[i][0] = dq[i][1] = dq[i][2] = dq[i][3] = 0.f;

    const fgb_plan pl = a.has_block_mask
                            ? fgb_plan_make(a, a.kv_num, a.kv_idx, a.full_kv_num, a.full_kv_idx,
                                            fgb_bm_row(a, b, h, q0 / a.bm_q_block, a.bm_q_blocks),
                                            a.bm_kv_blocks, a.bm_kv_block, FGQ_BLOCK_N, a.kv_len)
                            : fgb_plan_make(a, 0, 0, 0, 0, 0, 0, 0, FGQ_BLOCK_N, a.kv_len);
    for (int j = 0; j < pl.n_items; j++) {
        bool partial;
        const int kv0 = fgb_item_start(pl, j, partial);
        __syncthreads(); /* the previous step is done with K and V */
        fgb_load_tile<FGQ_BLOCK_N>(sK, kp, a.k_stride[2], kv0, a.kv_len);
        fgb_load_tile<FGQ_BLOCK_N>(sV, vp, a.v_stride[2], kv0, a.kv_len);
        fga_cp_commit();
        fga_cp_wait<0>();
        __syncthreads();

        /* S = Q K^T and dP = dO V^T for this warp's 16 q rows. */
        float s[FGQ_NTILES][4], dp[FGQ_NTILES][4];
#pragma unroll
        for (int i = 0; i < FGQ_NTILES; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < FGB_KSTEPS; kk++) {
            fg_u32 qf[4], of[4];
            fga_ldsm4(sQ + (fg_u32)(((warp * 16 + a_row) * FGB_ROW + kk * 16 + a_col) * 2), qf[0], qf[1], qf[2], qf[3]);
            fga_ldsm4(sO + (fg_u32)(((warp * 16 + a_row) * FGB_ROW + kk * 16 + a_col) * 2), of[0], of[1], of[2], of[3]);
#pragma unroll
            for (int np = 0; np < FGQ_NTILES / 2; np++) {
                fg_u32 kf[4], vf[4];
                fga_ldsm4(sK + (fg_u32)(((np * 16 + bn_row) * FGB_ROW + kk * 16 + bn_col) * 2), kf[0], kf[1], kf[2], kf[3]);
                fga_ldsm4(sV + (fg_u32)(((np * 16 + bn_row) * FGB_ROW + kk * 16 + bn_col) * 2), vf[0], vf[1], vf[2], vf[3]);
                fga_mma(s[2 * np], qf, kf[0], kf[1]);
                fga_mma(s[2 * np + 1], qf, kf[2], kf[3]);
                fga_mma(dp[2 * np], of, vf[0], vf[1]);
                fga_mma(dp[2 * np + 1], of, vf[2], vf[3]);
            }
        }

        /* dR in place of S. Element e of tile i sits at q row qr0 + 8 (e >> 1),
         * kv column kv0 + 8 i + 2 t4 + (e & 1). */
#pragma unroll
        for (int i = 0; i < FGQ_NTILES; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, q = qr0 + 8 * r, kv = kv0 + 8 * i + 2 * t4 + (e & 1);
                const float lse = r ? lse1 : lse0, delta = r ? delta1 : delta0;
                float dr = 0.f;
                if (q < a.q_len && kv < a.kv_len && lse != FGB_NEG_INF) {
                    const int qi = q + a.q_offset, ki = kv + a.kv_offset;
                    if (!partial || fg_mask_mod(p, b, h, qi, ki)) {
                        const float raw = s[i][e] * a.scale;
                        const float sc = fg_score_mod(p, raw, b, h, qi, ki);
                        const float pr = fgb_exp2(sc * FGB_LOG2E - lse * FGB_LOG2E);
                        if (pr != 0.f) dr = pr * (dp[i][e] - delta) * fg_score_grad(p, raw, b, h, qi, ki);
                    }
                }
                s[i][e] = dr;
            }

        /* dQ += dR K over this block's columns: A from dR's accumulator
         * layout, B from K ([kv][d], transposed). */
#pragma unroll
        for (int kc = 0; kc < FGQ_BLOCK_N / 16; kc++) {
            fg_u32 ra[4];
            fgb_to_a(ra, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
            for (int dpair = 0; dpair < FGB_DCTILES / 2; dpair++) {
                fg_u32 kf[4];
                fga_ldsm4t(sK + (fg_u32)(((kc * 16 + bk_row) * FGB_ROW + dc0 + dpair * 16 + bk_col) * 2), kf[0], kf[1], kf[2], kf[3]);
                fga_mma(dq[2 * dpair], ra, kf[0], kf[1]);
                fga_mma(dq[2 * dpair + 1], ra, kf[2], kf[3]);
            }
        }
    }

    fg_elem *dqp = (fg_elem *)a.dq + (fg_i64)b * a.dq_stride[0] + (fg_i64)h * a.dq_stride[1];
#pragma unroll
    for (int i = 0; i < FGB_DCTILES; i++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int q = qr0 + 8 * r, c = dc0 + 8 * i + 2 * t4;
            if (q >= a.q_len || (FGB_DSPLIT > 1 && c >= FGB_D)) continue;
            *(fg_u32 *)(dqp + (fg_i64)q * a.dq_stride[2] + c) =
                fg_pack2(dq[i][2 * r] * a.scale, dq[i][2 * r + 1] * a.scale);
        }
}
