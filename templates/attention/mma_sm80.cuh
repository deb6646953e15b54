/*
 * mma_sm80.cuh -- the PTX wrappers both portable attention kernels use
 * (attention_fwd.cuh, attention_bwd.cuh): cp.async copies, ldmatrix, and the
 * m16n8k16 mma.sync with fp32 accumulation in the configured input type.
 * The Hopper kernel has its own (TMA, wgmma).
 */

/* 16 bytes global -> shared; `valid` false zero-fills without reading. */
static __device__ __forceinline__ void fga_cp16(fg_u32 dst, const void *src, bool valid) {
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

static __device__ __forceinline__ void fga_ldsm4(fg_u32 addr, fg_u32 &r0, fg_u32 &r1,
                                                 fg_u32 &r2, fg_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
static __device__ __forceinline__ void fga_ldsm4t(fg_u32 addr, fg_u32 &r0, fg_u32 &r1,
                                                  fg_u32 &r2, fg_u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

/* c += a * b for one m16n8k16 tile, fp32 accumulation. */
static __device__ __forceinline__ void fga_mma(float *c, const fg_u32 *a, fg_u32 b0, fg_u32 b1) {
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

