// stream_tail.cu -- does a decode-shaped streaming walk lose time to an uneven end?
// A walk like the decode kernel's (128 threads, 3 stages of 32 KB, cp.async 16 B with
// L2::256B, 2 blocks per SM) over 537 MB: static ranges against tiles taken from a global
// counter or from one in a cluster's rank 0; prints each mode's time and the blocks' end
// times, each SM's block durations, and the SMs a cluster probe sees together.
// Build: nvcc -O3 -arch=sm_90a -std=c++17 -o stream_tail stream_tail.cu (attention_notes d20)
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <map>
#include <set>
#include <cuda_runtime.h>

#define STAGES 3
#define TILE 32768
#define THREADS 128
#define CH (TILE / 16 / THREADS)

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
__device__ __forceinline__ void cp16(unsigned dst, const void *src) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ unsigned cl_rank() { unsigned r; asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ unsigned cl_size() { unsigned r; asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r)); return r; }
__device__ __forceinline__ void cl_sync() { asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }
__device__ __forceinline__ unsigned cl_add(unsigned addr, unsigned rank, unsigned v) {
    unsigned remote, old;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("atom.shared::cluster.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(remote), "r"(v) : "memory");
    return old;
}

// mode 0: static ranges; 1: global counter (cnt zeroed); 2: cluster counter
template <int MODE>
__global__ void __launch_bounds__(THREADS, 2) walk(const char *src, int ntiles, int per, unsigned *cnt,
                                                    unsigned long long *rec, float *sink) {
    extern __shared__ __align__(128) unsigned char sm[];
    __shared__ int item[8];
    __shared__ unsigned ctr;
    const unsigned s0 = (unsigned)__cvta_generic_to_shared(sm);
    const int tid = threadIdx.x;
    unsigned long long t0 = gtime();
    int lo = 0, hi = 0;
    if (MODE == 0) { lo = min(ntiles, (int)blockIdx.x * per); hi = min(ntiles, lo + per); }
    int cbase = 0, cend = 0;
    if (MODE == 2) {
        int cs = cl_size(), cid = blockIdx.x / cs;
        cbase = min(ntiles, cid * per * cs); cend = min(ntiles, cbase + per * cs);
        if (tid == 0) ctr = 0;
        cl_sync();
    }
    // claim: tile index for pipeline slot
    auto claim = [&]() -> int {
        if (MODE == 1) return (int)atomicAdd(cnt, 1u);
        unsigned a = (unsigned)__cvta_generic_to_shared(&ctr);
        return cbase + (int)cl_add(a, 0, 1u);
    };
    float acc = 0.f;
    int n = 0;
    if (MODE == 0) {
        n = hi - lo;
        for (int s = 0; s < STAGES - 1; s++) {
            if (s < n) {
                const char *g = src + (size_t)(lo + s) * TILE;
                for (int i = 0; i < CH; i++) cp16(s0 + s * TILE + (i * THREADS + tid) * 16, g + (i * THREADS + tid) * 16);
            }
            commit();
        }
        for (int t = 0; t < n; t++) {
            waitg<STAGES - 2>();
            __syncthreads();
            int tn = t + STAGES - 1;
            if (tn < n) {
                const char *g = src + (size_t)(lo + tn) * TILE;
                int st = tn % STAGES;
                for (int i = 0; i < CH; i++) cp16(s0 + st * TILE + (i * THREADS + tid) * 16, g + (i * THREADS + tid) * 16);
            }
            commit();
            acc += *(const float *)(sm + (t % STAGES) * TILE + tid * 16);
        }
    } else {
        const int lim = MODE == 1 ? ntiles : cend;
        int ring[STAGES];
        if (tid == 0) { for (int s = 0; s < STAGES - 1; s++) item[2 + s] = claim(); item[0] = claim(); }
        __syncthreads();
        for (int s = 0; s < STAGES - 1; s++) {
            ring[s] = item[2 + s];
            if (ring[s] < lim) {
                const char *g = src + (size_t)ring[s] * TILE;
                for (int i = 0; i < CH; i++) cp16(s0 + s * TILE + (i * THREADS + tid) * 16, g + (i * THREADS + tid) * 16);
            }
            commit();
        }
        for (int t = 0;; t++) {
            const int st = t % STAGES;
            if (ring[st] >= lim) break;
            waitg<STAGES - 2>();
            __syncthreads();
            const int nx = item[t & 1];
            if (tid == 0) item[(t + 1) & 1] = nx < lim ? claim() : nx;
            const int sn = (t + STAGES - 1) % STAGES;
            ring[sn] = nx;
            if (nx < lim) {
                const char *g = src + (size_t)nx * TILE;
                for (int i = 0; i < CH; i++) cp16(s0 + sn * TILE + (i * THREADS + tid) * 16, g + (i * THREADS + tid) * 16);
            }
            commit();
            acc += *(const float *)(sm + st * TILE + tid * 16);
            n++;
        }
        if (MODE == 2) { waitg<0>(); __syncthreads(); cl_sync(); }
    }
    waitg<0>();
    if (acc == 12345.f) sink[0] = acc;
    unsigned long long t1 = gtime();
    if (tid == 0) {
        rec[blockIdx.x * 4 + 0] = smid();
        rec[blockIdx.x * 4 + 1] = t0;
        rec[blockIdx.x * 4 + 2] = t1;
        rec[blockIdx.x * 4 + 3] = n;
    }
}

__global__ void gpc_probe(unsigned *out) {
    if (threadIdx.x == 0) out[blockIdx.x] = smid();
}

template <int MODE>
static float run(const char *src, int ntiles, int grid, int per, int cluster, unsigned *cnt, unsigned long long *rec,
                 float *sink, int smem, std::vector<unsigned long long> &h, bool print) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cluster; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.attrs = at; cfg.numAttrs = cluster > 1 ? 1 : 0;
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> ts;
    for (int r = 0; r < 25; r++) {
        cudaMemsetAsync(cnt, 0, 4);
        cudaEventRecord(e0);
        cudaLaunchKernelEx(&cfg, walk<MODE>, src, ntiles, per, cnt, rec, sink);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        if (r >= 5) ts.push_back(ms);
    }
    cudaError_t err = cudaGetLastError();
    if (err) { printf("error %s\n", cudaGetErrorString(err)); exit(1); }
    std::sort(ts.begin(), ts.end());
    h.resize(grid * 4);
    cudaMemcpy(h.data(), rec, grid * 32, cudaMemcpyDeviceToHost);
    return ts[ts.size() / 2];
}

int main(int argc, char **argv) {
    int ntiles = 16384;  // 537 MB
    size_t bytes = (size_t)ntiles * TILE;
    char *src; cudaMalloc(&src, bytes); cudaMemset(src, 1, bytes);
    unsigned *cnt; cudaMalloc(&cnt, 64);
    unsigned long long *rec; cudaMalloc(&rec, 4096 * 32);
    float *sink; cudaMalloc(&sink, 64);
    int smem = STAGES * TILE;
    cudaFuncSetAttribute(walk<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(walk<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(walk<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(walk<2>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    int nsm; cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);

    // GPC map: clusters of 16 (non-portable), union of smids seen together
    {
        unsigned *o; cudaMalloc(&o, 4096 * 4);
        cudaFuncSetAttribute(gpc_probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        std::vector<int> parent(nsm); for (int i = 0; i < nsm; i++) parent[i] = i;
        auto find = [&](int x) { while (parent[x] != x) x = parent[x] = parent[parent[x]]; return x; };
        for (int cs : {16, 8, 4, 2}) {
            cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(4096 / cs * cs); cfg.blockDim = dim3(32);
            cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeClusterDimension;
            at[0].val.clusterDim.x = cs; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
            cfg.attrs = at; cfg.numAttrs = 1;
            for (int rep = 0; rep < 20; rep++) {
                if (cudaLaunchKernelEx(&cfg, gpc_probe, o) != cudaSuccess) { printf("probe cs %d failed\n", cs); cudaGetLastError(); break; }
                std::vector<unsigned> h(4096); cudaMemcpy(h.data(), o, 4096 * 4, cudaMemcpyDeviceToHost);
                for (int c = 0; c < 4096 / cs; c++)
                    for (int k = 1; k < cs; k++) { int a = find(h[c * cs]), b = find(h[c * cs + k]); if (a != b) parent[a] = b; }
            }
        }
        std::map<int, std::vector<int>> g;
        for (int i = 0; i < nsm; i++) g[find(i)].push_back(i);
        printf("GPC groups (%zu):", g.size());
        for (auto &kv : g) { printf(" [%zu:", kv.second.size()); for (int s : kv.second) printf(" %d", s); printf("]"); }
        printf("\n");
        // save group id per sm
        FILE *f = fopen(argc > 1 ? argv[1] : "/tmp/gpc.txt", "w");
        for (int i = 0; i < nsm; i++) fprintf(f, "%d %d\n", i, find(i));
        fclose(f);
    }

    struct Cfg { const char *name; int mode, grid, cluster; };
    Cfg cfgs[] = {{"static 256", 0, 256, 1}, {"static 264", 0, 264, 1}, {"global 256", 1, 256, 1},
                  {"global 264", 1, 264, 1}, {"cluster8 256", 2, 256, 8}, {"cluster4 256", 2, 256, 4},
                  {"cluster2 264", 2, 264, 2}};
    for (int rep = 0; rep < 2; rep++)
    for (auto &c : cfgs) {
        int per = (ntiles + c.grid - 1) / c.grid;
        std::vector<unsigned long long> h;
        float ms = c.mode == 0 ? run<0>(src, ntiles, c.grid, per, c.cluster, cnt, rec, sink, smem, h, false)
                 : c.mode == 1 ? run<1>(src, ntiles, c.grid, per, c.cluster, cnt, rec, sink, smem, h, false)
                               : run<2>(src, ntiles, c.grid, per, c.cluster, cnt, rec, sink, smem, h, false);
        unsigned long long tmin = ~0ull, tmax = 0;
        for (int b = 0; b < c.grid; b++) { tmin = std::min(tmin, h[b * 4 + 1]); tmax = std::max(tmax, h[b * 4 + 2]); }
        std::vector<double> ends, starts; long tot = 0;
        for (int b = 0; b < c.grid; b++) { ends.push_back((h[b * 4 + 2] - tmin) / 1e3); starts.push_back((h[b * 4 + 1] - tmin) / 1e3); tot += h[b*4+3]; }
        std::sort(ends.begin(), ends.end()); std::sort(starts.begin(), starts.end());
        printf("%-14s %8.2f us %6.3f TB/s | last run: starts max %.2f; ends min %.2f p10 %.2f p50 %.2f p90 %.2f max %.2f us; tiles %ld\n",
               c.name, ms * 1e3, bytes / (ms * 1e-3) / 1e12, starts.back(), ends[0], ends[ends.size() / 10],
               ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back(), tot);
        if (rep == 1 && c.mode == 0 && c.grid == 256) {
            // per-SM mean block duration (static ranges: same work per block)
            std::map<int, std::vector<double>> bysm;
            for (int b = 0; b < c.grid; b++) bysm[(int)h[b * 4]].push_back((h[b * 4 + 2] - h[b * 4 + 1]) / 1e3);
            printf("per-SM block durations (us):\n");
            for (auto &kv : bysm) { printf("sm %3d:", kv.first); for (double d : kv.second) printf(" %.1f", d); printf("\n"); }
        }
    }
    return 0;
}
