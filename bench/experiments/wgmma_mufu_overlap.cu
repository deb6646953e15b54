/*
 * wgmma_mufu_overlap.cu -- does an SM's tensor-core work slow down while
 * another warp group runs a softmax's instructions beside it? At head dim 64
 * a forward tile's products and its exponentials each need about the same
 * clocks at peak (attention_notes), so a kernel can only pass ~50% of the
 * tensor peak if the two overlap. This measures it without the attention
 * kernel around it: each of a block's warp groups (two, three or four, one
 * block an SM) takes a role, and each times its own loop with clock64.
 *
 *   mma      one D=64 forward tile's products per iteration, as the kernel
 *            issues them: S = Q K^T (4 x m64n128k16, both operands in shared
 *            memory), then P V (8 x m64n64k16, P from registers), one group
 *            each, the previous group in flight (wgmma.wait_group 1)
 *   mma_ss   the same, P V reading P from shared memory too
 *   soft     a softmax's per-score work over 64 scores a thread: row max,
 *            FFMA, ex2 (MUFU), row sum, pack to bf16
 *   fma      the same instruction count with the MUFU op replaced by FFMA
 *   tile     a whole forward consumer without loads: S = Q K^T, the
 *            previous tile's P V, wait for S, online softmax (row maxima,
 *            exponentials, sums, O rescaled), P packed for the next P V
 *   tile_pp  the same, the three warp groups taking turns to issue their
 *            products (the kernel's ping-pong: named barriers 1-3)
 *   tile64   tile over 64-key tiles (fits four warp groups' registers)
 *   tile64_pp the same in turns
 *   t_nosum  tile without the row sums' additions, P V 72 columns wide
 *            (where ones beside V would give the sums: their cost only)
 *   t_nomax  tile without the row maxima (a fixed bound: cost only)
 *   t_none   both
 *   idle     nothing
 *
 * Build (sm_90a): nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/wmo bench/experiments/wgmma_mufu_overlap.cu
 * Run: /tmp/wmo [iterations]  -- prints cycles per iteration of each role
 * in each configuration, and the mma role's share of the tensor peak (a
 * tile's 2 x 64 x 128 x 64 x 2 flops at 4096 dense bf16 flops a clock per
 * SM: 512 clocks).
 */
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <cuda_runtime.h>

typedef unsigned int fg_u32;
typedef unsigned long long fg_u64;
#include "../../templates/attention/wgmma_sm90.cuh"

enum role { IDLE = 0, MMA = 1, MMA_SS = 2, SOFT = 3, FMA = 4, TILE = 5, TILE_PP = 6, TILE64 = 7, TILE64_PP = 8, TILE_NOSUM = 9, TILE_NOMAX = 10, TILE_NONE = 11 };
static const char *role_name[] = {"idle", "mma", "mma_ss", "soft", "fma", "tile", "tile_pp", "tile64", "tile64_pp", "t_nosum", "t_nomax", "t_none"};
static bool is_mma(int r) { return r == MMA || r == MMA_SS || r == TILE || r == TILE_PP || r == TILE64 || r == TILE64_PP || r >= TILE_NOSUM; }

struct config {
    int nwg;     /* warp groups a block: 2, 3 or 4 (4: 128 registers a thread) */
    int role[4]; /* TILE and TILE_PP at nwg <= 3 */
};

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

template <bool MUFU> __device__ void soft_loop(int iters, float seed, float *sink) {
    float x[64];
#pragma unroll
    for (int i = 0; i < 64; i++) x[i] = seed * (i + 1) * 0.01f;
    float acc = 0.f;
    fg_u32 packed = 0;
    for (int it = 0; it < iters; it++) {
        float m0 = x[0], m1 = x[1];
#pragma unroll
        for (int i = 2; i < 64; i += 2) m0 = fmaxf(m0, x[i]), m1 = fmaxf(m1, x[i + 1]);
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
        float l0 = 0.f, l1 = 0.f;
#pragma unroll
        for (int i = 0; i < 64; i += 2) {
            const float a = fmaf(x[i], 0.18f, -m0), b = fmaf(x[i + 1], 0.18f, -m1);
            const float ya = MUFU ? ex2(a) : fmaf(a, 0.5f, 1.f), yb = MUFU ? ex2(b) : fmaf(b, 0.5f, 1.f);
            l0 += ya, l1 += yb;
            fg_u32 p;
            asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(yb), "f"(ya));
            packed ^= p;
            x[i] = ya + x[i], x[i + 1] = yb + x[i + 1]; /* next iteration's scores depend on these */
        }
        acc += l0 + l1;
    }
    if (acc == 12345.f && packed == 7) *sink = acc; /* keeps the work */
}

template <bool SS> __device__ void mma_loop(int iters, fg_u32 smem, float *sink) {
    float s[64], o[32];
#pragma unroll
    for (int i = 0; i < 64; i++) s[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) o[i] = 0.f;
    fg_u32 pa[8][4];
#pragma unroll
    for (int k = 0; k < 8; k++)
        for (int r = 0; r < 4; r++) pa[k][r] = 0x3c003c00u ^ (threadIdx.x * 7 + k * 4 + r);
    const fg_u32 q = smem, k = smem + 8192, v = smem + 24576, p = smem + 40960;
    for (int it = 0; it < iters; it++) {
        fgh_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) fgh_mma_ss_n128(s, fgh_desc_k(q + kk * 32), fgh_desc_k(k + kk * 32), 1);
        fgh_commit();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            if (SS)
                fgh_mma_ss_n64<0, 1>(o, fgh_desc_k(p + (kk & 3) * 32 + (kk >> 2) * 8192), fgh_desc_mn(v + kk * 2048, 8192), 1);
            else
                fgh_mma_rs_n64(o, pa[kk], fgh_desc_mn(v + kk * 2048, 8192));
        }
        fgh_commit();
        fgh_wait<1>();
    }
    fgh_wait<0>();
    fgh_fence_regs<64>(s);
    fgh_fence_regs<32>(o);
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) t += s[i];
#pragma unroll
    for (int i = 0; i < 32; i++) t += o[i];
    if (t == 12345.f) *sink = t;
}

/* P V with 72 columns: V's 64 and 8 more, which would hold ones for the row
 * sums (here only their cost: the operand's bytes are whatever is there). */
static __device__ __forceinline__ void mma_rs_n72(float *d, const fg_u32 *a, fg_u64 db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %41, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n72k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35}, {%36, %37, %38, %39}, %40, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

template <int BN> __device__ __forceinline__ void s_product(float *s, fg_u64 da, fg_u64 db, int acc) {
    if (BN == 128) fgh_mma_ss_n128(s, da, db, acc);
    else fgh_mma_ss_n64<0, 0>(s, da, db, acc);
}

/* One consumer's loop over K/V tiles of BN rows held in shared memory; NWG
 * warp groups take turns where PP. */
template <bool PP, int BN, int NWG, bool NOSUM = false, bool NOMAX = false>
__device__ void tile_loop(int iters, fg_u32 smem, float *sink, int wg) {
    constexpr int NS = BN / 2, KS = BN / 16; /* S's floats a thread, P V's k steps */
    float s[NS], o[36];
#pragma unroll
    for (int i = 0; i < 36; i++) o[i] = 0.f;
    fg_u32 pa[KS][4];
#pragma unroll
    for (int k = 0; k < KS; k++)
        for (int r = 0; r < 4; r++) pa[k][r] = 0;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    const fg_u32 q = smem, k = smem + 8192, v = smem + 24576;
    const float scale = 0.18f;
    for (int it = 0; it < iters; it++) {
        if (PP && (wg != 0 || it > 0)) fgh_named_sync(1 + wg, 256);
        fgh_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) s_product<BN>(s, fgh_desc_k(q + kk * 32), fgh_desc_k(k + kk * 32), kk > 0);
        fgh_commit();
        if (it > 0) {
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                if (NOSUM) mma_rs_n72(o, pa[kk], fgh_desc_mn(v + kk * 2048, 8192));
                else fgh_mma_rs_n64(o, pa[kk], fgh_desc_mn(v + kk * 2048, 8192));
            }
        }
        fgh_commit();
        if (PP && !(wg == NWG - 1 && it + 1 == iters)) fgh_named_arrive(1 + (wg + 1) % NWG, 256);
        fgh_wait<1>();
        fgh_fence_regs<NS>(s);
        float x0 = m0, x1 = m1;
        if (NOMAX) { /* a fixed bound instead of the row maxima (cost only) */
            x0 = 12.f, x1 = 12.f;
        } else {
#pragma unroll
            for (int i = 0; i < NS; i += 4) {
                x0 = fmaxf(x0, fmaxf(s[i], s[i + 1]) * scale);
                x1 = fmaxf(x1, fmaxf(s[i + 2], s[i + 3]) * scale);
            }
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 1));
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, 2));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 1));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, 2));
        }
        const float a0 = NOMAX ? 1.f : ex2(m0 - x0), a1 = NOMAX ? 1.f : ex2(m1 - x1);
        m0 = x0, m1 = x1;
        float t0 = 0.f, t1 = 0.f;
#pragma unroll
        for (int i = 0; i < NS; i += 4) {
            s[i] = ex2(fmaf(s[i], scale, -x0)), s[i + 1] = ex2(fmaf(s[i + 1], scale, -x0));
            s[i + 2] = ex2(fmaf(s[i + 2], scale, -x1)), s[i + 3] = ex2(fmaf(s[i + 3], scale, -x1));
            if (!NOSUM) t0 += s[i] + s[i + 1], t1 += s[i + 2] + s[i + 3];
        }
        l0 = l0 * a0 + t0, l1 = l1 * a1 + t1;
        fgh_wait<0>();
        fgh_fence_regs<36>(o);
#pragma unroll
        for (int i = 0; i < (NOSUM ? 36 : 32); i += 4) o[i] *= a0, o[i + 1] *= a0, o[i + 2] *= a1, o[i + 3] *= a1;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[kk][0]) : "f"(s[8 * kk + 1]), "f"(s[8 * kk + 0]));
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[kk][1]) : "f"(s[8 * kk + 3]), "f"(s[8 * kk + 2]));
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[kk][2]) : "f"(s[8 * kk + 5]), "f"(s[8 * kk + 4]));
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pa[kk][3]) : "f"(s[8 * kk + 7]), "f"(s[8 * kk + 6]));
        }
    }
    fgh_fence();
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        if (NOSUM) mma_rs_n72(o, pa[kk], fgh_desc_mn(v + kk * 2048, 8192));
        else fgh_mma_rs_n64(o, pa[kk], fgh_desc_mn(v + kk * 2048, 8192));
    }
    fgh_commit();
    fgh_wait<0>();
    fgh_fence_regs<36>(o);
    float t = l0 + l1;
#pragma unroll
    for (int i = 0; i < 36; i++) t += o[i];
    if (t == 12345.f) *sink = t;
}

template <int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) bench(config c, int iters, long long *cycles, float *sink) {
    extern __shared__ __align__(1024) unsigned char sm[];
    /* operands: bf16 values of magnitude ~1, varied, so the tensor cores do real work */
    for (int i = threadIdx.x; i < 65536 / 4; i += blockDim.x)
        ((fg_u32 *)sm)[i] = 0x3f803f80u ^ ((i * 2654435761u) & 0x007f007fu);
    __syncthreads();
    const int wg = threadIdx.x >> 7;
    const int r = c.role[wg];
    const fg_u32 base = (fg_u32)__cvta_generic_to_shared(sm);
    const long long t0 = clock64();
    /* at four warp groups (128 registers) only the tile64 roles, which fit */
    if (NWG <= 3 && r == MMA) mma_loop<false>(iters, base, sink);
    else if (NWG <= 3 && r == MMA_SS) mma_loop<true>(iters, base, sink);
    else if (NWG <= 3 && r == SOFT) soft_loop<true>(iters, 1.f + threadIdx.x * 1e-3f, sink);
    else if (NWG <= 3 && r == FMA) soft_loop<false>(iters, 1.f + threadIdx.x * 1e-3f, sink);
    else if (r == TILE64) tile_loop<false, 64, NWG>(iters, base, sink, wg);
    else if (r == TILE64_PP) tile_loop<true, 64, NWG>(iters, base, sink, wg);
    else if (NWG <= 3 && r == TILE) tile_loop<false, 128, NWG>(iters, base, sink, wg);
    else if (NWG <= 3 && r == TILE_PP) tile_loop<true, 128, NWG>(iters, base, sink, wg);
    else if (NWG <= 3 && r == TILE_NOSUM) tile_loop<false, 128, NWG, true, false>(iters, base, sink, wg);
    else if (NWG <= 3 && r == TILE_NOMAX) tile_loop<false, 128, NWG, false, true>(iters, base, sink, wg);
    else if (NWG <= 3 && r == TILE_NONE) tile_loop<false, 128, NWG, true, true>(iters, base, sink, wg);
    const long long t1 = clock64();
    if ((threadIdx.x & 127) == 0) cycles[blockIdx.x * 4 + wg] = t1 - t0;
}

static void launch(const config &c, int sms, int smem, int iters, long long *d_cycles, float *d_sink) {
    if (c.nwg == 2) bench<2><<<sms, 256, smem>>>(c, iters, d_cycles, d_sink);
    else if (c.nwg == 3) bench<3><<<sms, 384, smem>>>(c, iters, d_cycles, d_sink);
    else bench<4><<<sms, 512, smem>>>(c, iters, d_cycles, d_sink);
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 2000;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const int smem = 200 * 1024; /* one block an SM */
    cudaFuncSetAttribute(bench<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(bench<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(bench<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    long long *d_cycles;
    float *d_sink;
    cudaMalloc(&d_cycles, sizeof(long long) * sms * 4);
    cudaMalloc(&d_sink, 4);
    const config cfgs[] = {
        {3, {MMA, IDLE, IDLE}},          {3, {MMA_SS, IDLE, IDLE}},      {3, {SOFT, IDLE, IDLE}},
        {3, {FMA, IDLE, IDLE}},          {3, {SOFT, SOFT, IDLE}},        {3, {SOFT, SOFT, SOFT}},
        {3, {MMA, MMA, IDLE}},           {3, {MMA, MMA, MMA}},           {3, {MMA, SOFT, IDLE}},
        {3, {MMA_SS, SOFT, IDLE}},       {3, {MMA, FMA, IDLE}},          {3, {MMA, SOFT, SOFT}},
        {3, {MMA_SS, SOFT, SOFT}},       {3, {MMA, MMA, SOFT}},          {3, {MMA_SS, MMA_SS, SOFT}},
        {3, {TILE, IDLE, IDLE}},         {3, {TILE, TILE, IDLE}},        {3, {TILE, TILE, TILE}},
        {3, {TILE_PP, TILE_PP, TILE_PP}}, {2, {TILE, TILE}},             {2, {TILE_PP, TILE_PP}},
        {3, {TILE64, TILE64, TILE64}},   {3, {TILE64_PP, TILE64_PP, TILE64_PP}},
        {4, {TILE64, TILE64, TILE64, TILE64}}, {4, {TILE64_PP, TILE64_PP, TILE64_PP, TILE64_PP}},
        {3, {TILE_NOSUM, TILE_NOSUM, TILE_NOSUM}}, {3, {TILE_NOMAX, TILE_NOMAX, TILE_NOMAX}},
        {3, {TILE_NONE, TILE_NONE, TILE_NONE}},
    };
    long long *h = (long long *)malloc(sizeof(long long) * sms * 4);
    printf("%d SMs, %d iterations; cycles per iteration (mean over SMs) of warp groups 0-3;\n"
           "tensor busy: the mma roles' products (512 clocks at peak an iteration, tile64 256) over the slowest\n",
           sms, iters);
    for (const config &c : cfgs) {
        for (int rep = 0; rep < 2; rep++) { /* the first launch warms up */
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0), cudaEventCreate(&e1);
            cudaEventRecord(e0);
            launch(c, sms, smem, iters, d_cycles, d_sink);
            cudaEventRecord(e1);
            cudaError_t err = cudaEventSynchronize(e1);
            if (err == cudaSuccess) err = cudaGetLastError();
            if (err != cudaSuccess) {
                printf("error: %s\n", cudaGetErrorString(err));
                return 1;
            }
            float ms = 0.f;
            cudaEventElapsedTime(&ms, e0, e1);
            if (rep == 0) continue;
            cudaMemcpy(h, d_cycles, sizeof(long long) * sms * 4, cudaMemcpyDeviceToHost);
            double work = 0, slowest = 0;
            for (int w = 0; w < 4; w++) {
                if (w >= c.nwg) {
                    printf("%-10s", "");
                    continue;
                }
                printf("%-10s", role_name[c.role[w]]);
            }
            printf("|");
            for (int w = 0; w < 4; w++) {
                if (w >= c.nwg || c.role[w] == IDLE) {
                    printf("        -");
                    continue;
                }
                double sum = 0;
                for (int b = 0; b < sms; b++) sum += (double)h[b * 4 + w];
                const double per = sum / sms / iters;
                printf(" %8.1f", per);
                if (is_mma(c.role[w])) {
                    work += (c.role[w] == TILE64 || c.role[w] == TILE64_PP) ? 256.0 : 512.0;
                    if (per > slowest) slowest = per;
                }
            }
            printf(" | %7.3f ms", ms);
            if (work > 0) printf(" | tensor busy %.0f%% of peak", 100.0 * work / slowest);
            printf("\n");
        }
    }
    return 0;
}
