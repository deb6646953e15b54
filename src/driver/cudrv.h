/*
 * cudrv.h -- the CUDA Driver API through dlopen (cuda.c).
 *
 * libcuda is never linked. cuda.c opens libcuda.so.1 on first use and looks
 * every entry point up by its versioned symbol name (cuda.h's macros map
 * cuMemAlloc to cuMemAlloc_v2 and so on, so a member named after the plain
 * function resolves the symbol the header means). Call through fgi_cu():
 *     FGI_CU_TRY(ctx, fgi_cu()->cuMemAlloc(&ptr, bytes), "cuMemAlloc");
 * after fgi_cuda_ready(ctx) has returned FG_OK (it also makes ctx's device's
 * primary context current on the calling thread).
 */
#ifndef FLEXGEN_CUDRV_H
#define FLEXGEN_CUDRV_H

#include <cuda.h>

#include "internal.h"

#define FGI_CU_FN(name) __typeof__(&name) name
typedef struct fgi_cu_api {
    FGI_CU_FN(cuInit);
    FGI_CU_FN(cuDriverGetVersion);
    FGI_CU_FN(cuGetErrorName);
    FGI_CU_FN(cuGetErrorString);
    FGI_CU_FN(cuDeviceGet);
    FGI_CU_FN(cuDeviceGetCount);
    FGI_CU_FN(cuDeviceGetAttribute);
    FGI_CU_FN(cuDeviceGetName);
    FGI_CU_FN(cuDevicePrimaryCtxRetain);
    FGI_CU_FN(cuDevicePrimaryCtxRelease);
    FGI_CU_FN(cuCtxGetCurrent);
    FGI_CU_FN(cuCtxSetCurrent);
    FGI_CU_FN(cuCtxGetDevice);
    FGI_CU_FN(cuCtxSynchronize);
    FGI_CU_FN(cuModuleLoadData);
    FGI_CU_FN(cuModuleUnload);
    FGI_CU_FN(cuModuleGetFunction);
    FGI_CU_FN(cuFuncSetAttribute);
    FGI_CU_FN(cuFuncGetAttribute);
    FGI_CU_FN(cuLaunchKernel);
    FGI_CU_FN(cuMemAlloc);
    FGI_CU_FN(cuMemFree);
    FGI_CU_FN(cuMemcpyHtoD);
    FGI_CU_FN(cuMemcpyDtoH);
    FGI_CU_FN(cuMemcpyDtoD);
    FGI_CU_FN(cuMemcpyHtoDAsync);
    FGI_CU_FN(cuMemcpyDtoHAsync);
    FGI_CU_FN(cuMemsetD8);
    FGI_CU_FN(cuMemsetD32);
    FGI_CU_FN(cuMemsetD8Async);
    FGI_CU_FN(cuMemsetD32Async);
    FGI_CU_FN(cuStreamCreate);
    FGI_CU_FN(cuStreamDestroy);
    FGI_CU_FN(cuStreamSynchronize);
    FGI_CU_FN(cuEventCreate);
    FGI_CU_FN(cuEventDestroy);
    FGI_CU_FN(cuEventRecord);
    FGI_CU_FN(cuEventSynchronize);
    FGI_CU_FN(cuEventElapsedTime);
    FGI_CU_FN(cuPointerGetAttribute);
    /* Optional (NULL when the driver predates CUDA 12.0, or 11.2 for the
     * stream-ordered allocator). */
    FGI_CU_FN(cuCtxGetId);
    FGI_CU_FN(cuTensorMapEncodeTiled);
    FGI_CU_FN(cuMemAllocAsync);
    FGI_CU_FN(cuMemFreeAsync);
    FGI_CU_FN(cuMemPoolCreate);
    FGI_CU_FN(cuMemPoolSetAttribute);
    FGI_CU_FN(cuMemAllocFromPoolAsync);
    /* Stream capture into CUDA graphs (CUDA 10+; 11.4 for
     * cuGraphInstantiateWithFlags): for the tests and tools that capture
     * the library's calls. */
    FGI_CU_FN(cuStreamBeginCapture);
    FGI_CU_FN(cuStreamEndCapture);
    FGI_CU_FN(cuStreamIsCapturing);
    FGI_CU_FN(cuGraphInstantiateWithFlags);
    FGI_CU_FN(cuGraphLaunch);
    FGI_CU_FN(cuGraphDestroy);
    FGI_CU_FN(cuGraphExecDestroy);
    FGI_CU_FN(cuGraphGetNodes);
    FGI_CU_FN(cuGraphNodeGetType);
    /* Two streams ordered by events, and strided copies (context
     * parallelism's ring). */
    FGI_CU_FN(cuStreamWaitEvent);
    FGI_CU_FN(cuMemcpy2DAsync);
    /* A function loaded when it is looked up rather than at its first
     * launch (CUDA 12.4+; jit/cache.c says why). */
    FGI_CU_FN(cuFuncLoad);
    /* Launches with attributes: a programmatic dependent launch (CUDA
     * 12.0+; fgi_kernel_run_dependent). */
    FGI_CU_FN(cuLaunchKernelEx);
    /* Pinned host memory: a GPU-built block mask's counts, copied to the
     * host behind its build (fgi_block_mask_counts). */
    FGI_CU_FN(cuMemAllocHost);
    FGI_CU_FN(cuMemFreeHost);
    /* How many thread block clusters of a launch fit on the GPU at once
     * (CUDA 11.8+; the decode walk's splits as one cluster). */
    FGI_CU_FN(cuOccupancyMaxActiveClusters);
} fgi_cu_api;
#undef FGI_CU_FN

/* The loaded table; only valid after fgi_cuda_ready returned FG_OK. */
const fgi_cu_api *fgi_cu(void);

/* Map a driver result to a status: FG_OK for CUDA_SUCCESS, FG_ERR_NO_DEVICE
 * for CUDA_ERROR_NO_DEVICE / NOT_INITIALIZED / SYSTEM_DRIVER_MISMATCH /
 * STUB_LIBRARY, else
 * FG_ERR_CUDA with "<what>: <CUDA_ERROR_NAME>: <driver's string>" recorded
 * on ctx. */
fg_status fgi_cu_status(fg_ctx *ctx, CUresult r, const char *what);
/* The CUDA context current on this thread (after fgi_cuda_ready) and an id
 * that no other context in this process ever had (cuCtxGetId; the handle
 * value where the driver lacks it). Modules are cached per id. */
fg_status fgi_cuda_current(fg_ctx *ctx, CUcontext *cu, uint64_t *id);
/* True when `cu` is a device's primary context that flexgen keeps retained
 * for the life of the process, so modules loaded into it stay valid. */
bool fgi_cuda_context_is_pinned(CUcontext cu);
/* The library's workspace pool on the current context's device (cuda.c),
 * or NULL where the driver has no memory pools. */
fg_status fgi_cuda_ws_pool(fg_ctx *ctx, CUmemoryPool *pool);
/* Per-context CUDA state (api/ctx.c calls it from fg_ctx_destroy). */
void fgi_cuda_state_free(struct fgi_cuda_state *s);

#define FGI_CU_TRY(ctx, call, what)                                   \
    do {                                                              \
        CUresult fgi_r_ = (call);                                     \
        if (fgi_r_ != CUDA_SUCCESS) return fgi_cu_status((ctx), fgi_r_, (what)); \
    } while (0)

#endif
