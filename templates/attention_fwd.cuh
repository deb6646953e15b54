/*
 * attention_fwd.cuh -- the portable forward attention kernel (sm_80 and
 * newer): FlashAttention-2's schedule written with mma.sync, ldmatrix and
 * cp.async in inline PTX, so NVRTC compiles it without any CUDA header.
 *
 * The idea. One thread block owns FGA_BLOCK_M query rows of one (batch, head)
 * and streams the keys and values past them FGA_BLOCK_N at a time. Each warp
 * owns 16 or 32 of the rows: it computes its slice of S = Q K^T on the tensor
 * cores, turns it into probabilities with the running ("online") softmax,
 * and adds P V into an accumulator of its rows x D that stays in registers
 * for the whole sweep. Nothing of size Q_LEN x KV_LEN ever exists; HBM sees Q,
 * K, V once per q tile and the output once.
 *
 * The online softmax keeps, per row, the largest score seen so far (m, in
 * log2 units: the scale and log2(e) are folded into one multiply so the
 * exponential is a single ex2.approx) and the sum of exp2(s - m) (l). A new
 * tile that raises m rescales l and the accumulator by exp2(m_old - m_new).
 * A row that has seen only masked scores keeps m = -inf; exponentials are
 * then taken against 0 instead of m, so -inf - -inf never happens and such a
 * row ends with l = 0: output 0 and LSE -inf, as FlexAttention defines a
 * fully masked row. l is summed per thread and reduced across the quad of
 * threads that share a row only at the end (the rescale factor is the same
 * for all four, so the partial sums stay consistent).
 *
 * Which tiles are visited comes from the block mask (FlexAttention's
 * layout): for the q block, the partial kv blocks (mask_mod evaluated
 * inside) and then the full ones (no mask evaluation). A mask block of
 * kv_block columns is kv_block / BLOCK_N kernel tiles; the host checks that BLOCK_M
 * divides q_block, so a kernel q tile never straddles two mask rows.
 * Without a block mask every tile is visited, as partial when the mod has a
 * mask_mod and as full otherwise. Independently of the mask, positions past
 * Q_LEN or KV_LEN are masked by the kernel, and the mods are called only
 * inside [0, Q_LEN) x [0, KV_LEN), so a buffer a mod reads is never indexed
 * out of range because of tile padding. The scale is applied before
 * score_mod (score_mod sees q.k * scale, as in FlexAttention).
 *
 * Memory. K and V tiles are double-buffered in shared memory with cp.async:
 * the next tile is in flight while the tensor cores work on this one. Rows
 * past the end are zero-filled by cp.async's src-size operand (a zero V row
 * times a zero probability is 0, whereas stale shared memory could hold a
 * NaN). Each shared row is padded by 16 bytes so that the eight 16-byte rows
 * an ldmatrix phase reads fall into different banks. Q is loaded once;
 * where registers allow it is kept there as mma A fragments, otherwise it is
 * re-read from shared memory with ldmatrix (the kernel stays within 255
 * registers without spilling more than a few bytes). All global offsets
 * are 64-bit.
 *
 * Mods. The kernel calls the mods split by what each part reads
 * (src/emit_split.c): the parts that read only b, h and parameters once per
 * thread, the parts that read q_idx but not kv_idx once per row the thread
 * owns (before the sweep), the parts that read kv_idx but not q_idx once
 * per column it owns in a tile, and only the rest per score -- what
 * Triton's broadcasting gives FlexAttention. The split gives the same bits
 * as the whole mod.
 *
 * The host (src/attention.c) mirrors FGA_BLOCK_M / FGA_BLOCK_N / the shared
 * memory size and the fga_args layout; the static_assert below and the one in
 * src/attention.h keep the two in step. A Hopper variant (wgmma + TMA) is a
 * second template with the same entry signature.
 */

#ifndef FG_HEAD_DIM
#error "FG_HEAD_DIM must be defined by the code generator"
#endif
#if (FG_HEAD_DIM % 16) != 0 || FG_HEAD_DIM < 16 || FG_HEAD_DIM > 256
#error "FG_HEAD_DIM must be a multiple of 16 in [16, 256]"
#endif

/* Four warps. Each warp owns FGA_MT slabs of 16 query rows, so every K or
 * V fragment it reads from shared memory feeds FGA_MT tensor-core ops: with
 * two slabs (32 rows) a warp reads half the shared-memory bytes per FLOP
 * that one slab needs, and a 128-row q tile halves the K/V traffic from L2.
 * Two slabs need q blocks of 128 (FG_Q_BLOCK, part of the configuration) and
 * a head dim up to 128; at D = 128 the K/V tile shrinks to 32 rows to keep
 * the accumulators (32 x 128 of O per warp) within 255 registers, and Q is
 * re-read from shared memory instead of being held in registers. */
#define FGA_NWARPS 4
#define FGA_THREADS (FGA_NWARPS * 32)
#if FG_HEAD_DIM <= 128 && !(defined(FG_Q_BLOCK) && FG_Q_BLOCK < 128)
#define FGA_MT 2
#else
#define FGA_MT 1
#endif
#define FGA_BLOCK_M (16 * FGA_MT * FGA_NWARPS)
#if FG_HEAD_DIM > 128 || (FGA_MT == 2 && FG_HEAD_DIM > 64)
#define FGA_BLOCK_N 32
#else
#define FGA_BLOCK_N 64
#endif
#if FG_HEAD_DIM > 128 || (FGA_MT == 2 && FG_HEAD_DIM > 64)
#define FGA_Q_IN_REGS 0
#else
#define FGA_Q_IN_REGS 1
#endif
#define FGA_D FG_HEAD_DIM
#define FGA_KSTEPS (FGA_D / 16)      /* k steps of Q K^T over the head dim */
#define FGA_NTILES (FGA_BLOCK_N / 8) /* n tiles of S                       */
#define FGA_DTILES (FGA_D / 8)       /* n tiles of O                       */
#define FGA_ROW (FGA_D + 8)          /* padded shared row, in elements     */
#define FGA_CHUNKS (FGA_D / 8)       /* 16-byte chunks per row             */

typedef unsigned int fga_u32;
typedef unsigned short fga_u16;
typedef long long fga_i64;
typedef unsigned long long fga_u64;

/* The kernel's first argument; src/attention.h declares the same layout
 * (fgi_attn_abi). Strides are in elements for (b, h, s). */
struct fga_args {
    fga_u64 q, k, v, out, lse;
    fga_i64 q_stride[3], k_stride[3], v_stride[3], o_stride[3];
    fga_u64 kv_num, kv_idx, full_num, full_idx;
    int batch, heads_q, heads_kv, q_len, kv_len;
    int q_offset, kv_offset;
    float scale, scale_log2;
    int has_block_mask, bm_batch, bm_heads, bm_q_blocks, bm_kv_blocks, bm_q_block, bm_kv_block;
    int q_tiles, pad_;
};
static_assert(sizeof(fga_args) == 240, "fga_args must match fgi_attn_abi");

#define FGA_NEG_INF __int_as_float(0xff800000)
#define FGA_LOG2E 1.4426950408889634f
#define FGA_LN2 0.6931471805599453f

/* ---- PTX wrappers --------------------------------------------------------- */

static __device__ __forceinline__ fga_u32 fga_smem_addr(const void *p) {
    fga_u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

/* 16 bytes global -> shared; `valid` false zero-fills without reading. */
static __device__ __forceinline__ void fga_cp16(fga_u32 dst, const void *src, bool valid) {
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
static __device__ __forceinline__ void fga_cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void fga_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

static __device__ __forceinline__ void fga_ldsm4(fga_u32 addr, fga_u32 &r0, fga_u32 &r1,
                                                 fga_u32 &r2, fga_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
static __device__ __forceinline__ void fga_ldsm4t(fga_u32 addr, fga_u32 &r0, fga_u32 &r1,
                                                  fga_u32 &r2, fga_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c += a * b for one m16n8k16 tile, fp32 accumulation. */
static __device__ __forceinline__ void fga_mma(float *c, const fga_u32 *a, fga_u32 b0, fga_u32 b1) {
#if defined(FG_DTYPE_FP16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/* Two floats to one register of two 16-bit values, `lo` in the low half. */
static __device__ __forceinline__ fga_u32 fga_pack(float lo, float hi) {
    fga_u32 r;
#if defined(FG_DTYPE_FP16)
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

static __device__ __forceinline__ float fga_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ float fga_log2(float x) {
    float r;
    asm("lg2.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ float fga_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float fga_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---- tiles ------------------------------------------------------------------ */

/* Copy `rows` rows of a [len, D] slab starting at row r0 into shared memory
 * (padded rows); rows at or past `len` are zero-filled. */
template <int ROWS>
static __device__ __forceinline__ void fga_load_tile(fga_u32 smem, const fga_u16 *base,
                                                     fga_i64 row_stride, int r0, int len) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int c = tid; c < ROWS * FGA_CHUNKS; c += FGA_THREADS) {
        const int r = c / FGA_CHUNKS, ch = c % FGA_CHUNKS;
        const bool ok = r0 + r < len;
        const fga_u16 *src = ok ? base + (fga_i64)(r0 + r) * row_stride + ch * 8 : base;
        fga_cp16(smem + (fga_u32)((r * FGA_ROW + ch * 8) * 2), src, ok);
    }
}

/* The kv tiles one q tile visits: items [0, n_partial * per_block) are
 * sub-tiles of partial blocks, the rest sub-tiles of full blocks. */
struct fga_plan {
    const int *part, *full; /* index rows of the block mask (NULL: dense) */
    int n_partial, n_items, per_block, kv_block;
};

static __device__ __forceinline__ int fga_item_kv0(const fga_plan &pl, int j, bool &partial) {
    if (!pl.part) {
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
        partial = true;
#else
        partial = false;
#endif
        return j * FGA_BLOCK_N;
    }
    const int blk = j / pl.per_block, sub = j - blk * pl.per_block;
    int kb;
    if (blk < pl.n_partial) {
        partial = true;
        kb = pl.part[blk];
    } else {
        partial = false;
        kb = pl.full[blk - pl.n_partial];
    }
    return kb * pl.kv_block + sub * FGA_BLOCK_N;
}

/* ---- the kernel ------------------------------------------------------------- */

#if !defined(FG_HAS_SPLIT_MODS)
/* Source generated without the split mods (emit_split.c): the same entry
 * points, with every part computed per element by the whole mod. */
struct fg_mask_head {};
struct fg_mask_row {};
struct fg_mask_col {};
struct fg_score_head {};
struct fg_score_row {};
struct fg_score_col {};
static __device__ __forceinline__ fg_mask_head fg_mask_head_init(const fg_mod_params &, int, int) {
    return fg_mask_head();
}
static __device__ __forceinline__ fg_mask_row fg_mask_row_init(const fg_mod_params &, const fg_mask_head &,
                                                               int, int, int) {
    return fg_mask_row();
}
static __device__ __forceinline__ fg_mask_col fg_mask_col_init(const fg_mod_params &, const fg_mask_head &,
                                                               int, int, int) {
    return fg_mask_col();
}
static __device__ __forceinline__ bool fg_mask_split(const fg_mod_params &p, const fg_mask_head &, int b,
                                                     int h, int q_idx, int kv_idx, const fg_mask_row &,
                                                     const fg_mask_col &) {
    return fg_mask_mod(p, b, h, q_idx, kv_idx);
}
static __device__ __forceinline__ fg_score_head fg_score_head_init(const fg_mod_params &, int, int) {
    return fg_score_head();
}
static __device__ __forceinline__ fg_score_row fg_score_row_init(const fg_mod_params &,
                                                                 const fg_score_head &, int, int, int) {
    return fg_score_row();
}
static __device__ __forceinline__ fg_score_col fg_score_col_init(const fg_mod_params &,
                                                                 const fg_score_head &, int, int, int) {
    return fg_score_col();
}
static __device__ __forceinline__ float fg_score_split(const fg_mod_params &p, const fg_score_head &,
                                                       float score, int b, int h, int q_idx, int kv_idx,
                                                       const fg_score_row &, const fg_score_col &) {
    return fg_score_mod(p, score, b, h, q_idx, kv_idx);
}
#endif

extern "C" __global__ void __launch_bounds__(FGA_THREADS)
fg_attention_fwd(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p) {
    extern __shared__ __align__(128) unsigned char fga_smem[];
    const fga_u32 sQ = fga_smem_addr(fga_smem);
    const fga_u32 sK = sQ + FGA_BLOCK_M * FGA_ROW * 2;
    const fga_u32 sV = sK + 2 * FGA_BLOCK_N * FGA_ROW * 2;
    const fga_u32 kv_stage = FGA_BLOCK_N * FGA_ROW * 2;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    /* Heavier q tiles (late rows of a causal mask) are scheduled first. */
    const int qt = a.q_tiles - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (a.heads_q / a.heads_kv);
    const int q0 = qt * FGA_BLOCK_M;

    const fga_u16 *qp = (const fga_u16 *)a.q + (fga_i64)b * a.q_stride[0] + (fga_i64)h * a.q_stride[1];
    const fga_u16 *kp = (const fga_u16 *)a.k + (fga_i64)b * a.k_stride[0] + (fga_i64)hk * a.k_stride[1];
    const fga_u16 *vp = (const fga_u16 *)a.v + (fga_i64)b * a.v_stride[0] + (fga_i64)hk * a.v_stride[1];

    fga_plan pl;
    pl.per_block = 1;
    pl.kv_block = FGA_BLOCK_N;
    if (a.has_block_mask) {
        const int mb = a.bm_batch == 1 ? 0 : b, mh = a.bm_heads == 1 ? 0 : h;
        const fga_i64 row = ((fga_i64)mb * a.bm_heads + mh) * a.bm_q_blocks + q0 / a.bm_q_block;
        pl.part = (const int *)a.kv_idx + row * a.bm_kv_blocks;
        pl.full = (const int *)a.full_idx + row * a.bm_kv_blocks;
        pl.n_partial = ((const int *)a.kv_num)[row];
        pl.per_block = a.bm_kv_block / FGA_BLOCK_N;
        pl.kv_block = a.bm_kv_block;
        pl.n_items = (pl.n_partial + ((const int *)a.full_num)[row]) * pl.per_block;
    } else {
        pl.part = pl.full = 0;
        pl.n_partial = 0;
        pl.n_items = (a.kv_len + FGA_BLOCK_N - 1) / FGA_BLOCK_N;
    }

    /* Q tile, then the first K/V tile: two commit groups. */
    fga_load_tile<FGA_BLOCK_M>(sQ, qp, a.q_stride[2], q0, a.q_len);
    fga_cp_commit();
    if (pl.n_items > 0) {
        bool first_partial;
        const int kv0 = fga_item_kv0(pl, 0, first_partial);
        fga_load_tile<FGA_BLOCK_N>(sK, kp, a.k_stride[2], kv0, a.kv_len);
        fga_load_tile<FGA_BLOCK_N>(sV, vp, a.v_stride[2], kv0, a.kv_len);
    }
    fga_cp_commit();
    fga_cp_wait<1>();
    __syncthreads();

    /* ldmatrix lane addressing: A (Q) fragments and the B tiles of K / V. */
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;
    const fga_u32 q_lane = sQ + (fga_u32)(((warp * 16 * FGA_MT + a_row) * FGA_ROW + a_col) * 2);
    const fga_u32 q_slab = 16 * FGA_ROW * 2; /* bytes between a warp's 16-row slabs */

#if FGA_Q_IN_REGS
    fga_u32 qf[FGA_MT][FGA_KSTEPS][4];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
        for (int kk = 0; kk < FGA_KSTEPS; kk++)
            fga_ldsm4(q_lane + mt * q_slab + kk * 32, qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2],
                      qf[mt][kk][3]);
#endif

    float o[FGA_MT][FGA_DTILES][4];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
        for (int i = 0; i < FGA_DTILES; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float m_run[FGA_MT][2], l_run[FGA_MT][2];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++) {
        m_run[mt][0] = m_run[mt][1] = FGA_NEG_INF;
        l_run[mt][0] = l_run[mt][1] = 0.f;
    }

    /* This thread's rows: qrow0 + mt * 16 + {0, 8}. */
    const int qrow0 = q0 + warp * 16 * FGA_MT + g;

    /* The parts of the mods that do not depend on kv_idx, computed once for
     * the whole sweep: per (b, h) and per row this thread owns. Rows past
     * Q_LEN are masked by the kernel; their parts are computed at the last
     * row so that a mod never sees an index out of range. */
    const fg_mask_head mhd = fg_mask_head_init(p, b, h);
    const fg_score_head shd = fg_score_head_init(p, b, h);
    fg_mask_row mrow[FGA_MT][2];
    fg_score_row srow[FGA_MT][2];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int qi = min(qrow0 + mt * 16 + r * 8, a.q_len - 1) + a.q_offset;
            mrow[mt][r] = fg_mask_row_init(p, mhd, b, h, qi);
            srow[mt][r] = fg_score_row_init(p, shd, b, h, qi);
        }

    for (int j = 0; j < pl.n_items; j++) {
        const int buf = j & 1;
        bool partial, next_partial;
        const int kv0 = fga_item_kv0(pl, j, partial);
        if (j + 1 < pl.n_items) {
            const int nkv0 = fga_item_kv0(pl, j + 1, next_partial);
            fga_load_tile<FGA_BLOCK_N>(sK + (buf ^ 1) * kv_stage, kp, a.k_stride[2], nkv0, a.kv_len);
            fga_load_tile<FGA_BLOCK_N>(sV + (buf ^ 1) * kv_stage, vp, a.v_stride[2], nkv0, a.kv_len);
            fga_cp_commit();
            fga_cp_wait<1>();
        } else {
            fga_cp_wait<0>();
        }
        __syncthreads();

        /* S = Q K^T for this warp's rows; each K fragment serves every slab. */
        float s[FGA_MT][FGA_NTILES][4];
#pragma unroll
        for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
            for (int i = 0; i < FGA_NTILES; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
        const fga_u32 k_lane = sK + buf * kv_stage + (fga_u32)((k_row * FGA_ROW + k_col) * 2);
#pragma unroll
        for (int kk = 0; kk < FGA_KSTEPS; kk++) {
#if FGA_Q_IN_REGS
#define FGA_QA(mt) qf[mt][kk]
#else
            fga_u32 qa[FGA_MT][4];
#pragma unroll
            for (int mt = 0; mt < FGA_MT; mt++)
                fga_ldsm4(q_lane + mt * q_slab + kk * 32, qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
#define FGA_QA(mt) qa[mt]
#endif
#pragma unroll
            for (int np = 0; np < FGA_NTILES / 2; np++) {
                fga_u32 b0, b1, b2, b3;
                fga_ldsm4(k_lane + (fga_u32)((np * 16 * FGA_ROW + kk * 16) * 2), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < FGA_MT; mt++) {
                    fga_mma(s[mt][2 * np], FGA_QA(mt), b0, b1);
                    fga_mma(s[mt][2 * np + 1], FGA_QA(mt), b2, b3);
                }
            }
#undef FGA_QA
        }

        /* Scale, mods and range, into log2 units. Range checks and mask_mod
         * only where a tile is partial or crosses Q_LEN / KV_LEN. */
        const bool check = partial || kv0 + FGA_BLOCK_N > a.kv_len || q0 + FGA_BLOCK_M > a.q_len;

        /* Fragment by fragment: the column parts of the mods once per column
         * this thread owns (two per n8 fragment, shared by all its rows),
         * then the elements. The mask's parts only in partial tiles, so full
         * tiles do no mask work at all. */
#if defined(FG_HAS_SCORE_MOD) && FG_HAS_SCORE_MOD
#pragma unroll
        for (int i = 0; i < FGA_NTILES; i++) {
            fg_mask_col mcol[2];
            fg_score_col scol[2];
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int kc = min(kv0 + i * 8 + t4 * 2 + c, a.kv_len - 1) + a.kv_offset;
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
                if (partial) mcol[c] = fg_mask_col_init(p, mhd, b, h, kc);
#endif
                scol[c] = fg_score_col_init(p, shd, b, h, kc);
            }
#pragma unroll
            for (int mt = 0; mt < FGA_MT; mt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = qrow0 + mt * 16 + (e >> 1) * 8;
                    const int ki = kv0 + i * 8 + t4 * 2 + (e & 1);
                    bool keep = true;
                    if (check) {
                        keep = qi < a.q_len && ki < a.kv_len;
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
                        if (keep && partial)
                            keep = fg_mask_split(p, mhd, b, h, qi + a.q_offset, ki + a.kv_offset,
                                                 mrow[mt][e >> 1], mcol[e & 1]);
#endif
                    }
                    float v = s[mt][i][e] * a.scale;
                    if (keep)
                        v = fg_score_split(p, shd, v, b, h, qi + a.q_offset, ki + a.kv_offset,
                                           srow[mt][e >> 1], scol[e & 1]);
                    s[mt][i][e] = keep ? v * FGA_LOG2E : FGA_NEG_INF;
                }
            }
        }
#else
        if (check) {
#pragma unroll
            for (int i = 0; i < FGA_NTILES; i++) {
                fg_mask_col mcol[2];
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
                if (partial) {
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        mcol[c] = fg_mask_col_init(p, mhd, b, h,
                                                   min(kv0 + i * 8 + t4 * 2 + c, a.kv_len - 1) + a.kv_offset);
                }
#endif
#pragma unroll
                for (int mt = 0; mt < FGA_MT; mt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = qrow0 + mt * 16 + (e >> 1) * 8;
                        const int ki = kv0 + i * 8 + t4 * 2 + (e & 1);
                        bool keep = qi < a.q_len && ki < a.kv_len;
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
                        if (keep && partial)
                            keep = fg_mask_split(p, mhd, b, h, qi + a.q_offset, ki + a.kv_offset,
                                                 mrow[mt][e >> 1], mcol[e & 1]);
#endif
                        s[mt][i][e] = keep ? s[mt][i][e] * a.scale_log2 : FGA_NEG_INF;
                    }
                }
            }
        } else {
#pragma unroll
            for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
                for (int i = 0; i < FGA_NTILES; i++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][i][e] *= a.scale_log2;
        }
#endif

        /* Online softmax: new maxima, rescale, exponentials. */
#pragma unroll
        for (int mt = 0; mt < FGA_MT; mt++) {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mx = FGA_NEG_INF;
#pragma unroll
                for (int i = 0; i < FGA_NTILES; i++)
                    mx = fmaxf(mx, fmaxf(s[mt][i][2 * r], s[mt][i][2 * r + 1]));
                mx = fga_quad_max(mx);
                const float m_new = fmaxf(m_run[mt][r], mx);
                const float m_use = m_new == FGA_NEG_INF ? 0.f : m_new;
                const float alpha = fga_exp2(m_run[mt][r] - m_use);
                m_run[mt][r] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < FGA_NTILES; i++) {
                    s[mt][i][2 * r] = fga_exp2(s[mt][i][2 * r] - m_use);
                    s[mt][i][2 * r + 1] = fga_exp2(s[mt][i][2 * r + 1] - m_use);
                    sum += s[mt][i][2 * r] + s[mt][i][2 * r + 1];
                }
                l_run[mt][r] = l_run[mt][r] * alpha + sum;
#pragma unroll
                for (int i = 0; i < FGA_DTILES; i++) {
                    o[mt][i][2 * r] *= alpha;
                    o[mt][i][2 * r + 1] *= alpha;
                }
            }
        }

        /* O += P V: P goes from accumulator layout straight to A fragments;
         * each V fragment serves every slab. */
        const fga_u32 v_lane = sV + buf * kv_stage + (fga_u32)((v_row * FGA_ROW + v_col) * 2);
#pragma unroll
        for (int kc = 0; kc < FGA_BLOCK_N / 16; kc++) {
            fga_u32 pa[FGA_MT][4];
#pragma unroll
            for (int mt = 0; mt < FGA_MT; mt++) {
                pa[mt][0] = fga_pack(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                pa[mt][1] = fga_pack(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                pa[mt][2] = fga_pack(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                pa[mt][3] = fga_pack(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < FGA_DTILES / 2; dp++) {
                fga_u32 b0, b1, b2, b3;
                fga_ldsm4t(v_lane + (fga_u32)((kc * 16 * FGA_ROW + dp * 16) * 2), b0, b1, b2, b3);
#pragma unroll
                for (int mt = 0; mt < FGA_MT; mt++) {
                    fga_mma(o[mt][2 * dp], pa[mt], b0, b1);
                    fga_mma(o[mt][2 * dp + 1], pa[mt], b2, b3);
                }
            }
        }
        __syncthreads(); /* this buffer is refilled by iteration j + 1 */
    }

    /* Normalise and write: out rows and, from one thread per quad, LSE. */
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int qi = qrow0 + mt * 16 + r * 8;
            const float l = fga_quad_sum(l_run[mt][r]);
            if (qi >= a.q_len) continue;
            const float inv = l > 0.f ? 1.f / l : 0.f;
            fga_u16 *op = (fga_u16 *)a.out + (fga_i64)b * a.o_stride[0] + (fga_i64)h * a.o_stride[1] +
                          (fga_i64)qi * a.o_stride[2];
#pragma unroll
            for (int i = 0; i < FGA_DTILES; i++)
                *(fga_u32 *)(op + i * 8 + t4 * 2) =
                    fga_pack(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
            if (a.lse && t4 == 0) {
                float *lp = (float *)a.lse + ((fga_i64)b * a.heads_q + h) * a.q_len + qi;
                *lp = l > 0.f ? (m_run[mt][r] + fga_log2(l)) * FGA_LN2 : FGA_NEG_INF;
            }
        }
    }
}
