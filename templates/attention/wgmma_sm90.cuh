/*
 * wgmma_sm90.cuh -- the PTX wrappers both Hopper attention kernels use
 * (attention_fwd_sm90.cuh, attention_bwd_sm90.cuh): wgmma and its shared
 * memory descriptors, mbarriers, TMA tensor and bulk copies, the bulk
 * reduction, the async-proxy fence and named barriers. sm_90a only.
 *
 * Shared-memory operands are stored as the wgmma canonical layout with the
 * 128-byte swizzle, which is also what TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B: the head dim is cut into 64-element column
 * blocks ("regions"), each region holds the tile's rows as 128-byte lines,
 * and the 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its line
 * (regions start on 1024-byte boundaries). A descriptor plus (bytes >> 4)
 * addresses `bytes` further: the start-address field cannot carry over,
 * shared memory being under 256 KB.
 */

#if defined(FG_DTYPE_FP16)
#define FGH_AB "f16"
#else
#define FGH_AB "bf16"
#endif

/* A CUtensorMap (cuda.h): 128 opaque bytes, 64-byte aligned. */
struct __align__(64) fgh_tmap {
    fg_u64 w[16];
};
/* ---- wgmma ------------------------------------------------------------------ */

/* A shared-memory matrix descriptor with the 128-byte swizzle: start
 * address, leading and stride byte offsets, each stored >> 4. */
static __device__ __forceinline__ fg_u64 fgh_desc(fg_u32 addr, fg_u32 lead, fg_u32 stride) {
    return (fg_u64)((addr & 0x3FFFFu) >> 4) | ((fg_u64)((lead & 0x3FFFFu) >> 4) << 16) |
           ((fg_u64)((stride & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
/* K-major operand (rows of Q, K, V or dO as stored, k along the row): the
 * leading offset is unused with this swizzle (1 by convention); 8-row
 * groups are 1024 bytes apart. */
static __device__ __forceinline__ fg_u64 fgh_desc_k(fg_u32 addr) { return fgh_desc(addr, 16, 1024); }
/* MN-major operand (rows of V, dO, Q or K as stored, read transposed: the
 * row index is k): `lead` bytes from one 64-column swizzle atom to the
 * next, 8-row groups (k steps of 8) 1024 bytes apart. */
static __device__ __forceinline__ fg_u64 fgh_desc_mn(fg_u32 addr, fg_u32 lead) { return fgh_desc(addr, lead, 1024); }

/* A thread's warp group (128 threads). At head dims 64, 192 and 256 it is
 * taken through a shuffle from lane 0: the compiler then knows it is the
 * same across the warp and keeps what is made of it (the consumer's Q
 * descriptors, a tile's descriptors per k step) in uniform registers,
 * where it made each in every thread and moved it over (R2UR) per
 * product: the forward -3 to -4% time at 64, -1 to -4% at 192 and 256,
 * the backward's dK/dV pass -1% on ALiBi at 64. At head dims 96 and 128
 * the same cut 24-40 instructions and lost (causal +3% and +1.7%, ALiBi's
 * forward +7% at 128), so they keep the plain shift
 * (bench/attention_notes.md f16, f18). */
static __device__ __forceinline__ int fgh_warp_group(int tid) {
#if FG_HEAD_DIM == 64 || FG_HEAD_DIM >= 192
    return __shfl_sync(0xffffffffu, tid >> 7, 0);
#else
    return tid >> 7;
#endif
}

static __device__ __forceinline__ void fgh_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void fgh_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void fgh_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* After a wait: the accumulators are defined here, not at the issue. */
template <int N> static __device__ __forceinline__ void fgh_fence_regs(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* A warp group's accumulator fragment as asm operands and their numbers:
 * d[0..31] (n64), d[0..63] (n128) or d[0..87] (n176), each C(d[i]) with C
 * FGH_RW where the product adds to it, FGH_WO where it only writes it;
 * operands 0-31, 0-63 or 0-87, so the product's other operands follow from
 * %32, %64 or %88. */
#define FGH_RW(x) "+f"(x)
#define FGH_WO(x) "=f"(x)
#define FGH_ACC32(C) \
    C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), \
    C(d[8]), C(d[9]), C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), \
    C(d[16]), C(d[17]), C(d[18]), C(d[19]), C(d[20]), C(d[21]), C(d[22]), C(d[23]), \
    C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]), C(d[30]), C(d[31])
#define FGH_ACC64(C) \
    FGH_ACC32(C), \
    C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]), \
    C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), \
    C(d[48]), C(d[49]), C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), \
    C(d[56]), C(d[57]), C(d[58]), C(d[59]), C(d[60]), C(d[61]), C(d[62]), C(d[63])
#define FGH_REGS32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FGH_REGS64 \
    FGH_REGS32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

#define FGH_ACC88(C) \
    FGH_ACC64(C), \
    C(d[64]), C(d[65]), C(d[66]), C(d[67]), C(d[68]), C(d[69]), C(d[70]), C(d[71]), \
    C(d[72]), C(d[73]), C(d[74]), C(d[75]), C(d[76]), C(d[77]), C(d[78]), C(d[79]), \
    C(d[80]), C(d[81]), C(d[82]), C(d[83]), C(d[84]), C(d[85]), C(d[86]), C(d[87])
#define FGH_REGS88 \
    FGH_REGS64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87"

/* D (64 x 176, fp32, per warp group) = or += A (64 x 16, shared) * B (16 x 176,
 * shared), both K-major: one k step of Q K^T over 176-row K tiles. */
static __device__ __forceinline__ void fgh_mma_ss_n176(float *d, fg_u64 da, fg_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n176k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS88
                 "}, %88, %89, p, 1, 1, 0, 0;\n}\n"
                 : FGH_ACC88(FGH_RW)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* D (64 x 128, fp32, per warp group) = or += A (64 x 16, shared) * B (16 x 128,
 * shared), both K-major: one k step of Q K^T. */
static __device__ __forceinline__ void fgh_mma_ss_n128(float *d, fg_u64 da, fg_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS64
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FGH_ACC64(FGH_RW)
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* The same, first k step, D's registers written only (as fgh_mma_ss_n64_first). */
static __device__ __forceinline__ void fgh_mma_ss_n128_first(float *d, fg_u64 da, fg_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS64
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : FGH_ACC64(FGH_WO)
                 : "l"(da), "l"(db));
}

/* D (64 x 64, fp32, per warp group) = or += A (64 x 16, shared) * B (16 x 64,
 * shared); TA / TB 1 read A / B MN-major (transposed), 0 K-major. */
template <int TA, int TB>
static __device__ __forceinline__ void fgh_mma_ss_n64(float *d, fg_u64 da, fg_u64 db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS32
                 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
                 : FGH_ACC32(FGH_RW)
                 : "l"(da), "l"(db), "r"(accumulate), "n"(TA), "n"(TB));
}

/* The same, first k step: D = A * B with D's registers written only. As
 * an operand read too ("+f"), they tie the product to what the registers
 * held before: the compiler then keeps the previous values' registers for
 * it and moves what it computed there (the element loop's results) out of
 * the way first. */
template <int TA, int TB>
static __device__ __forceinline__ void fgh_mma_ss_n64_first(float *d, fg_u64 da, fg_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS32
                 "}, %32, %33, p, 1, 1, %34, %35;\n}\n"
                 : FGH_ACC32(FGH_WO)
                 : "l"(da), "l"(db), "n"(TA), "n"(TB));
}

/* D (64 x 128, fp32, per warp group) += A (64 x 16, registers) * B (16 x 128,
 * shared, N-major: rows of V or dO as stored, read transposed): one k step
 * of P V. */
static __device__ __forceinline__ void fgh_mma_rs_n128(float *d, const fg_u32 *a, fg_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : FGH_ACC64(FGH_RW)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* The same with 64 columns. */
static __device__ __forceinline__ void fgh_mma_rs_n64(float *d, const fg_u32 *a, fg_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." FGH_AB "." FGH_AB " {"
                 FGH_REGS32
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : FGH_ACC32(FGH_RW)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/* D (64 x N, fp32) += A (64 x 16, registers) * B (16 x N, shared, N-major),
 * for N a multiple of 64 up to 256: n128 products, then an n64 one for
 * the rest, each 128 columns two 64-column regions (`region` bytes apart)
 * further along B. P V of the forward at every head dim. */
template <int N>
static __device__ __forceinline__ void fgh_mma_rs_cols(float *d, const fg_u32 *a, fg_u64 db, fg_u32 region) {
    static_assert(N % 64 == 0 && N <= 256, "fgh_mma_rs_cols: N must be 64, 128, 192 or 256");
    if (N >= 128) fgh_mma_rs_n128(d, a, db);
    if (N >= 256) fgh_mma_rs_n128(d + 64, a, db + ((2 * region) >> 4));
    if (N % 128) fgh_mma_rs_n64(d + (N - 64) / 2, a, db + ((((N - 64) / 64) * region) >> 4));
}
/* The register-A product at the kernel's head dim: D (64 x FG_HEAD_DIM,
 * fp32) += A (64 x 16, registers) * B (16 x FG_HEAD_DIM, shared, N-major).
 * P V in the forward, P^T dO and dR^T Q in the backward. */
static __device__ __forceinline__ void fgh_mma_rs_d(float *d, const fg_u32 *a, fg_u64 db) {
#if FG_HEAD_DIM == 128
    fgh_mma_rs_n128(d, a, db);
#elif FG_HEAD_DIM == 64
    fgh_mma_rs_n64(d, a, db);
#endif
}

/* ---- mbarriers and TMA ------------------------------------------------------- */

static __device__ __forceinline__ void fgh_bar_init(fg_u32 bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* Wait until the barrier's phase with this parity has completed. */
static __device__ __forceinline__ void fgh_bar_wait(fg_u32 bar, int parity) {
    asm volatile("{\n.reg .pred done;\nFGH_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra FGH_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
static __device__ __forceinline__ void fgh_bar_arrive(fg_u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* `count` arrivals at once (one thread standing for `count` warps). */
static __device__ __forceinline__ void fgh_bar_arrive_n(fg_u32 bar, int count) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
/* The producer's arrival, announcing the bytes the TMA unit will deliver. */
static __device__ __forceinline__ void fgh_bar_expect(fg_u32 bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
/* One box (its rows x 64 columns, as the tensor map says) of a [batch,
 * heads, len, D] tensor into shared memory, completing `bar` with its
 * bytes. */
static __device__ __forceinline__ void fgh_tma_load(fg_u32 dst, const fgh_tmap *map, int col, int row, int head,
                                                    int batch, fg_u32 bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(map), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(bar)
                 : "memory");
}
/* The same box asked into the L2 only (no shared memory, no barrier): a
 * later fgh_tma_load of it then waits for the L2, not for DRAM. */
static __device__ __forceinline__ void fgh_tma_prefetch_l2(const fgh_tmap *map, int col, int row, int head,
                                                           int batch) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(map), "r"(col),
                 "r"(row), "r"(head), "r"(batch)
                 : "memory");
}
/* Where byte `col_byte` (0..127) of row `row` lies in a region of
 * 128-byte rows with the 128-byte swizzle (1024-byte aligned): its 16-byte
 * chunk moves to chunk ^ (row % 8), as TMA writes it and wgmma reads it. */
static __device__ __forceinline__ fg_u32 fgh_swz128(int row, int col_byte) {
    return row * 128 + ((((col_byte >> 4) ^ row) & 7) << 4) + (col_byte & 15);
}
/* Four 8 x 8 tiles of 16-bit pairs to shared memory, each from a warp's
 * accumulator fragments (a thread's pair in row lane / 4, columns 2 (lane
 * % 4) and one more: the m16n8 / wgmma layout); lane l gives the address
 * of row l % 8 of tile l / 8. */
static __device__ __forceinline__ void fgh_stmatrix_x4(fg_u32 addr, fg_u32 r0, fg_u32 r1, fg_u32 r2, fg_u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
/* One box of a [batch, heads, len, D] tensor from shared memory (laid out
 * as fgh_tma_load leaves it) to global, by the TMA unit: rows past the
 * tensor's end are not written. A bulk group per commit; the shared
 * memory is read once fgh_bulk_wait<.., true> says so. */
static __device__ __forceinline__ void fgh_tma_store(const fgh_tmap *map, fg_u32 src, int col, int row, int head,
                                                     int batch) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
                 "r"(src), "r"(col), "r"(row), "r"(head), "r"(batch)
                 : "memory");
}
/* `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
 * to shared memory, completing `bar` with them. */
static __device__ __forceinline__ void fgh_bulk_load(fg_u32 dst, const void *src, int bytes, fg_u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
/* dst[i] += src[i] for `bytes` / 4 floats, shared to global, by the TMA
 * unit (each element added atomically); one bulk group per commit. */
static __device__ __forceinline__ void fgh_bulk_add_f32(void *dst, fg_u32 src, int bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
/* `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared
 * to global, by the TMA unit; one bulk group per commit. */
static __device__ __forceinline__ void fgh_bulk_store(void *dst, fg_u32 src, int bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void fgh_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* This thread's bulk groups beyond the newest N have read their shared
 * memory (READ) or are complete. */
template <int N, bool READ> static __device__ __forceinline__ void fgh_bulk_wait() {
    if (READ)
        asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
    else
        asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* Shared-memory writes of this thread made visible to the async proxy
 * (wgmma and TMA read through it); a barrier after it publishes them. */
static __device__ __forceinline__ void fgh_fence_async_smem() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
/* Named barrier `id` (1..15) over `threads` threads (a multiple of 32). */
static __device__ __forceinline__ void fgh_named_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* Arrive at named barrier `id` without waiting: the producer side of a
 * barrier whose consumer side calls fgh_named_sync with the same count. */
static __device__ __forceinline__ void fgh_named_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
