// initcheck_bulk_store.cu -- does compute-sanitizer initcheck count a cp.async.bulk store
// (shared -> global) as writing global memory? nvcc -arch=sm_90a -o ic initcheck_bulk_store.cu;
// compute-sanitizer --tool initcheck ./ic (bulk store) and ./ic 1 (the same bytes stored by a thread).
// On the H100 (2026-11-24): the bulk case is flagged, the thread case is clean (attention_notes v35).
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(float *dst, float *out, int generic) {
    __shared__ __align__(128) float s[1024];
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) s[i] = i;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
        if (generic) {
            for (int i = 0; i < 1024; i++) dst[i] = s[i];
        } else {
            unsigned a = (unsigned)__cvta_generic_to_shared(s);
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(a), "r"(4096) : "memory");
            asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
        }
    }
}
__global__ void rd(const float *dst, float *out) { out[threadIdx.x] = dst[threadIdx.x * 4]; }
int main(int argc, char **argv) {
    int generic = argc > 1;
    float *d, *o;
    cudaMalloc(&d, 4096); cudaMalloc(&o, 4096);
    k<<<1, 128>>>(d, o, generic);
    rd<<<1, 256>>>(d, o);
    float h[256];
    cudaMemcpy(h, o, sizeof h, cudaMemcpyDeviceToHost);
    printf("%s: out[255] = %g (expect 1020), err %s\n", generic ? "generic" : "bulk", h[255], cudaGetErrorString(cudaGetLastError()));
    return 0;
}
