/*
 * nccl.h -- NCCL through dlopen (nccl.c), for the K/V ring of context
 * parallelism.
 *
 * libnccl is never linked, so single-GPU users need nothing new. The types
 * below are declared here by their ABI (NCCL's enums are C ints, its
 * communicator an opaque pointer, a stream the driver's CUstream), with the
 * values NCCL documents; flexgen does not include nccl.h.
 *
 * Two ways in:
 *  - fgi_nccl_ready: the process-wide library, opened once (pthread_once)
 *    from $FLEXGEN_NCCL_LIB or the default names; the outcome, a table or
 *    a failure message, is kept, so later calls answer the same without
 *    retrying. What the ring uses.
 *  - fgi_nccl_lib_open: open a given file (or, with NULL, whatever the
 *    environment says now) into a caller-owned fgi_nccl_lib, uncached.
 *    Tests use it to try several files in one process, which the once-only
 *    loader cannot; fgi_nccl_ready is this with NULL, done once.
 * The functions that take a `const fgi_nccl_lib *` use the process-wide
 * library when it is NULL.
 */
#ifndef FLEXGEN_NCCL_H
#define FLEXGEN_NCCL_H

#include "internal.h"

/* ncclResult_t */
typedef int fgi_nccl_result;
enum {
    FGI_NCCL_SUCCESS = 0,
    FGI_NCCL_UNHANDLED_CUDA_ERROR = 1,
    FGI_NCCL_SYSTEM_ERROR = 2,
    FGI_NCCL_INTERNAL_ERROR = 3,
    FGI_NCCL_INVALID_ARGUMENT = 4,
    FGI_NCCL_INVALID_USAGE = 5,
    FGI_NCCL_REMOTE_ERROR = 6,
    FGI_NCCL_IN_PROGRESS = 7
};

/* ncclDataType_t (the ones the ring may send) */
typedef int fgi_nccl_dtype;
enum {
    FGI_NCCL_INT8 = 0,
    FGI_NCCL_UINT8 = 1,
    FGI_NCCL_INT64 = 4,
    FGI_NCCL_FLOAT16 = 6,
    FGI_NCCL_FLOAT32 = 7,
    FGI_NCCL_BFLOAT16 = 9
};

/* ncclRedOp_t (the one used) */
typedef int fgi_nccl_op_kind;
enum { FGI_NCCL_SUM = 0 };

/* ncclComm_t */
typedef struct fgi_nccl_comm_opaque *fgi_nccl_comm;

/* The entry points the ring needs. `stream` is a CUstream (cudaStream_t is
 * the same pointer). */
typedef struct fgi_nccl_api {
    fgi_nccl_result (*ncclGetVersion)(int *version);
    const char *(*ncclGetErrorString)(fgi_nccl_result result);
    fgi_nccl_result (*ncclCommCount)(fgi_nccl_comm comm, int *count);
    fgi_nccl_result (*ncclCommUserRank)(fgi_nccl_comm comm, int *rank);
    fgi_nccl_result (*ncclCommCuDevice)(fgi_nccl_comm comm, int *device);
    fgi_nccl_result (*ncclGroupStart)(void);
    fgi_nccl_result (*ncclGroupEnd)(void);
    fgi_nccl_result (*ncclSend)(const void *buf, size_t count, fgi_nccl_dtype dtype, int peer,
                                fgi_nccl_comm comm, void *stream);
    fgi_nccl_result (*ncclRecv)(void *buf, size_t count, fgi_nccl_dtype dtype, int peer,
                                fgi_nccl_comm comm, void *stream);
    fgi_nccl_result (*ncclAllReduce)(const void *send, void *recv, size_t count, fgi_nccl_dtype dtype,
                                     fgi_nccl_op_kind op, fgi_nccl_comm comm, void *stream);
} fgi_nccl_api;

/* ncclSend / ncclRecv first appeared in NCCL 2.7. */
#define FGI_NCCL_MIN_VERSION 20700

typedef struct fgi_nccl_lib {
    void *handle;       /* dlopen handle                                   */
    fgi_nccl_api api;
    int version;        /* major * 10000 + minor * 100 + patch, whichever
                           encoding the library reports                  */
    char path[512];     /* the file opened (the name dlopen was given)    */
} fgi_nccl_lib;

/* Open NCCL into *lib: `path` when not NULL, else $FLEXGEN_NCCL_LIB when set
 * and not empty, else libnccl.so.2, then libnccl.so. Every entry point is
 * looked up and the version must be FGI_NCCL_MIN_VERSION or newer.
 * FG_ERR_NOT_SUPPORTED with a message naming the file tried and what to do
 * when the library cannot be opened, lacks a symbol or is too old (nothing
 * is left open then). Close with fgi_nccl_lib_close. */
fg_status fgi_nccl_lib_open(fg_ctx *ctx, const char *path, fgi_nccl_lib *lib);
void fgi_nccl_lib_close(fgi_nccl_lib *lib);

/* The process-wide library, loaded on first use (thread-safe); *lib (may be
 * NULL) receives it. Fails the same way every time once it has failed. */
fg_status fgi_nccl_ready(fg_ctx *ctx, const fgi_nccl_lib **lib);

/* A version number from ncclGetVersion as major * 10000 + minor * 100 +
 * patch (NCCL before 2.9 reported major * 1000 + minor * 100 + patch). */
int fgi_nccl_version_normalise(int code);

/* FG_OK for ncclSuccess; otherwise a status with "<what>: NCCL error <n>:
 * <ncclGetErrorString's text>" recorded on ctx: FG_ERR_INVALID_ARGUMENT
 * for ncclInvalidArgument / ncclInvalidUsage (a bad buffer, peer or
 * communicator is the caller's), FG_ERR_CUDA for the rest (CUDA, system,
 * internal and remote errors: the communication failed). */
fg_status fgi_nccl_status(fg_ctx *ctx, const fgi_nccl_lib *lib, fgi_nccl_result r, const char *what);

/* The NCCL data type that moves elements of `dtype` (bf16 / fp16). */
fg_status fgi_nccl_dtype_of(fg_ctx *ctx, fg_dtype dtype, fgi_nccl_dtype *out);

/* What a communicator (an ncclComm_t passed as void *) says of itself. */
typedef struct fgi_nccl_comm_info {
    int rank, size, device;
} fgi_nccl_comm_info;
fg_status fgi_nccl_comm_info_get(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm,
                                 fgi_nccl_comm_info *info);

/* One ring step's transfer: up to FGI_NCCL_MAX_BUFS buffers each way (K
 * and V in the forward; K, V, dK and dV in the backward). nsend buffers go
 * to rank `next`, nrecv come from rank `prev`, all on `stream`, as one NCCL
 * group: grouped, a rank that sends and receives at once cannot deadlock
 * against its neighbours (an ungrouped send may wait for the peer to post
 * its receive). Bytes go as ncclUint8: send and receive do no arithmetic,
 * so the element type does not matter. With nothing to send or receive
 * nothing is called. */
#define FGI_NCCL_MAX_BUFS 4
typedef struct fgi_nccl_transfer {
    int nsend, next;
    const void *send_buf[FGI_NCCL_MAX_BUFS];
    size_t send_bytes[FGI_NCCL_MAX_BUFS];
    int nrecv, prev;
    void *recv_buf[FGI_NCCL_MAX_BUFS];
    size_t recv_bytes[FGI_NCCL_MAX_BUFS];
} fgi_nccl_transfer;
fg_status fgi_nccl_ring_exchange(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm,
                                 const fgi_nccl_transfer *t, void *stream);

/* Sends and receives with any peers as one NCCL group, posted in the
 * order given (NCCL matches a pair of ranks' sends and receives in the
 * order each posts them): the backward's dK/dV step, which may send to
 * rank r + 1 or to a shard's owner and receive from rank r - 1 and from
 * whoever returns its own shard's sums. Ops of 0 bytes are skipped; none
 * at all calls nothing. fgi_nccl_ring_exchange is this with its sends to
 * `next`, then its receives from `prev`. */
#define FGI_NCCL_MAX_OPS 8
typedef struct fgi_nccl_op {
    bool send;      /* else receive                                        */
    int peer;
    void *buf;      /* const for a send                                    */
    size_t bytes;
} fgi_nccl_op;
fg_status fgi_nccl_group(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm, const fgi_nccl_op *ops, int nops,
                         void *stream);

/* In-place int64 sums across the ranks of `comm` of n buffers (counts in
 * int64 elements), as one NCCL group on `stream`: the sharded backward's
 * fixed-point buffer gradients, whose sums are exact in any order. */
fg_status fgi_nccl_sum_i64(fg_ctx *ctx, const fgi_nccl_lib *lib, void *comm, void *const bufs[], const size_t counts[],
                           int n, void *stream);

#endif
