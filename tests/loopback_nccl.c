/* loopback_nccl.c -- a stand-in for libnccl that really moves data, between
 * ranks that are threads of one process, all on one GPU if need be, so the
 * ring's GPU test (gpu_cp.c) runs its two ranks on a machine with one GPU.
 * NCCL itself refuses two ranks on one device, and without a second GPU
 * the ring's buffers, events and side streams would go unchecked.
 *
 * The entry points driver/nccl.c looks up, and ncclCommInitAll /
 * ncclCommDestroy for the test, with NCCL's ABI (ints for the enums,
 * pointers for the communicator and the stream). ncclCommInitAll makes the
 * ranks of one world, any devices, repeats allowed. The library also
 * exports `flexgen_loopback_nccl` (1), so a test can tell it from NCCL.
 *
 * Semantics are NCCL's, on the GPU and stream-ordered, through the CUDA
 * Driver API (loaded with dlopen, as the library under test loads it:
 * $FLEXGEN_LIBCUDA, else libcuda.so.1):
 *  - Sends and receives between one ordered pair of ranks match in the
 *    order each posts them, and their sizes must agree (ncclInvalidUsage
 *    on both ends, with a line on stderr, otherwise).
 *  - ncclGroupStart / ncclGroupEnd nest; the group (its depth and queued
 *    calls) belongs to the calling thread, since every rank is a thread.
 *    A call outside a group is a group of its own.
 *  - At the outermost ncclGroupEnd: every send of the group is posted
 *    first, with a "ready" event recorded on the sender's stream after
 *    the work that produced it; then every receive waits (on the host)
 *    for its send, makes its stream wait for "ready", copies the bytes on
 *    its own stream (cuMemcpyAsync: one address space, the same device)
 *    and records "done" there; then every send makes its stream wait for
 *    "done", so later work on the sender's stream cannot overwrite the
 *    buffer before the copy. Posting all sends before waiting on any
 *    receive lets a group that sends to rank r + 1 and receives from
 *    rank r - 1 (or the same peer) meet its peers' groups without
 *    deadlock, as long as every rank posts its groups in the same order,
 *    which NCCL requires too. ncclGroupEnd thus returns once each of its
 *    receives' sends and each of its sends' receives has been posted;
 *    the data moves later, on the streams.
 *  - ncclAllReduce (sum of int8, uint8, int32, uint32, int64, uint64,
 *    float32 or float64) is a rendezvous of the world's ranks, each from
 *    its own thread, after the group's sends and receives: each rank
 *    synchronises its stream, publishes its input, and once all have,
 *    copies every input to the host, adds them in rank order and, after a
 *    second barrier (everyone has read every input; so in place works),
 *    writes its output on its stream and synchronises it. Count 0 does
 *    nothing.
 * Events are made in the calling thread's current context (the device's
 * primary context is retained and made current where there is none).
 * Errors: a CUDA failure is ncclUnhandledCudaError, a bad argument
 * ncclInvalidArgument. A wait that lasts longer than
 * $FLEXGEN_LOOPBACK_NCCL_TIMEOUT seconds (300 unless set) gives up with a
 * line on stderr naming the call and ncclSystemError, so a mismatched ring
 * fails instead of hanging. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "the loopback uses the legacy default stream: do not define CUDA_API_PER_THREAD_DEFAULT_STREAM"
#endif

/* ncclResult_t */
enum { OK = 0, UNHANDLED_CUDA_ERROR = 1, SYSTEM_ERROR = 2, INTERNAL_ERROR = 3, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };
/* ncclDataType_t, with the sizes of its elements */
enum { INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16, NTYPES };
static const size_t type_size[NTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
/* ncclRedOp_t: the one supported */
enum { SUM = 0 };

int flexgen_loopback_nccl = 1;

/* ---- the CUDA Driver API, through dlopen ---------------------------------- */

/* cuda.h maps some names to versioned symbols (cuEventDestroy ->
 * cuEventDestroy_v2): the macro-expanded name is both the member and the
 * symbol looked up, so pointer type and function agree. */
#define STR2(x) #x
#define STR(x) STR2(x)
#define CU_FNS(X)                                                                                    \
    X(cuInit) X(cuGetErrorString) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain)                           \
    X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuEventCreate) X(cuEventDestroy) \
    X(cuEventRecord) X(cuStreamWaitEvent) X(cuStreamSynchronize) X(cuMemcpyAsync) X(cuMemcpyDtoHAsync)    \
    X(cuMemcpyHtoDAsync)

#define CU_MEMBER(fn) __typeof__(&fn) fn;
typedef struct cu_api {
    CU_FNS(CU_MEMBER)
} cu_api;
#undef CU_MEMBER

#define CU_SYM(fn) {STR(fn), offsetof(cu_api, fn)},
static const struct {
    const char *name;
    size_t offset;
} cu_syms[] = {CU_FNS(CU_SYM)};
#undef CU_SYM

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static int cu_status = INTERNAL_ERROR;
static cu_api cu;

static void cu_load(void) {
    const char *forced = getenv("FLEXGEN_LIBCUDA");
    const char *name = forced && *forced ? forced : "libcuda.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        fprintf(stderr, "loopback NCCL: %s could not be opened (%s)\n", name, why ? why : "no reason given");
        cu_status = SYSTEM_ERROR;
        return;
    }
    for (size_t i = 0; i < sizeof cu_syms / sizeof cu_syms[0]; i++) {
        void *fn = dlsym(h, cu_syms[i].name);
        if (!fn) {
            fprintf(stderr, "loopback NCCL: %s has no %s\n", name, cu_syms[i].name);
            cu_status = SYSTEM_ERROR;
            return; /* left open: the process has it anyway */
        }
        memcpy((char *)&cu + cu_syms[i].offset, &fn, sizeof fn);
    }
    const CUresult r = cu.cuInit(0);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "loopback NCCL: cuInit failed (CUDA error %d)\n", (int)r);
        cu_status = UNHANDLED_CUDA_ERROR;
        return;
    }
    cu_status = OK;
}

static int cu_ready(void) {
    pthread_once(&cu_once, cu_load);
    return cu_status;
}

/* A CUDA failure, said on stderr: ncclUnhandledCudaError. */
static int cu_fail(CUresult r, const char *what, int rank) {
    const char *s = NULL;
    if (cu.cuGetErrorString) cu.cuGetErrorString(r, &s);
    fprintf(stderr, "loopback NCCL: rank %d: %s failed: CUDA error %d (%s)\n", rank, what, (int)r,
            s ? s : "no text");
    return UNHANDLED_CUDA_ERROR;
}

/* ---- worlds and communicators ------------------------------------------------ */

/* One send, from its posting until its receive has been posted. */
typedef struct msg {
    struct msg *next;
    int src, dst;
    unsigned long long seq; /* the send's number among src's sends to dst */
    const void *buf;
    size_t bytes;
    CUevent ready;          /* after the data, on the sender's stream; NULL: the sender failed */
    bool taken;             /* the receive has been posted (done and result set) */
    CUevent done;           /* after the copy, on the receiver's stream; NULL when none */
    int result;             /* the receive's verdict */
} msg;

/* An all-reduce input, published for the world. */
typedef struct slot {
    const void *buf;
    size_t count;
    int dtype, op;
    bool ok;
} slot;

typedef struct world {
    int size, refs;
    unsigned long long *sent, *received; /* [src * size + dst]: how many posted */
    msg *msgs;                           /* posted sends not yet finished      */
    slot *slots;                         /* per rank                            */
    int arrived;                         /* at the barrier                      */
    unsigned long long generation;       /* barriers passed                     */
} world;

typedef struct lb_comm {
    world *w;
    int rank, device;
    CUcontext retained; /* the device's primary context, when none was current */
} lb_comm;

/* Everything shared between ranks is under one lock; every change is
 * broadcast. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;

static void world_free(world *w) {
    if (!w) return;
    while (w->msgs) {
        msg *m = w->msgs;
        w->msgs = m->next;
        free(m);
    }
    free(w->sent);
    free(w->received);
    free(w->slots);
    free(w);
}

/* The end of a wait that starts now. */
static struct timespec deadline(void) {
    const char *e = getenv("FLEXGEN_LOOPBACK_NCCL_TIMEOUT");
    long s = e && *e ? strtol(e, NULL, 10) : 300;
    if (s < 1) s = 1;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += s;
    return t;
}

/* Wait on `changed` (lock held) until the deadline: false when it passed. */
static bool wait_changed(const struct timespec *until) {
    return pthread_cond_timedwait(&changed, &lock, until) != ETIMEDOUT;
}

/* Every rank of the world here, or SYSTEM_ERROR after the timeout. */
static int barrier(world *w, int rank, const char *what) {
    const struct timespec until = deadline();
    pthread_mutex_lock(&lock);
    const unsigned long long gen = w->generation;
    if (++w->arrived == w->size) {
        w->arrived = 0;
        w->generation++;
        pthread_cond_broadcast(&changed);
    }
    bool in_time = true;
    while (w->generation == gen && in_time) in_time = wait_changed(&until) || w->generation != gen;
    if (!in_time) w->arrived--;
    pthread_mutex_unlock(&lock);
    if (in_time) return OK;
    fprintf(stderr, "loopback NCCL: rank %d of %d: gave up waiting for the other ranks at %s\n", rank, w->size, what);
    return SYSTEM_ERROR;
}

/* ---- the thread's group ----------------------------------------------------- */

enum { SEND, RECV, ALL_REDUCE };

typedef struct op {
    int kind;
    lb_comm *c;
    const void *src; /* a send's buffer, an all-reduce's input */
    void *dst;       /* a receive's buffer, an all-reduce's output */
    size_t count;
    int dtype, redop, peer;
    CUstream stream;
    msg *m;          /* a send's posting */
} op;

static _Thread_local struct {
    int depth;
    op *ops;
    int n, cap;
} grp;

static int enqueue(const op *o) {
    if (grp.n == grp.cap) {
        const int cap = grp.cap ? 2 * grp.cap : 16;
        op *ops = realloc(grp.ops, (size_t)cap * sizeof *ops);
        if (!ops) return SYSTEM_ERROR;
        grp.ops = ops, grp.cap = cap;
    }
    grp.ops[grp.n++] = *o;
    return OK;
}

static void note(int *first, int r) {
    if (*first == OK) *first = r;
}

/* A current context on this thread: the caller's, else the device's
 * primary one (retained for the communicator, as NCCL sets its device). */
static int ensure_context(lb_comm *c) {
    CUcontext cur = NULL;
    CUresult r = cu.cuCtxGetCurrent(&cur);
    if (r != CUDA_SUCCESS) return cu_fail(r, "cuCtxGetCurrent", c->rank);
    if (cur) return OK;
    if (!c->retained) {
        CUdevice dev;
        r = cu.cuDeviceGet(&dev, c->device);
        if (r == CUDA_SUCCESS) r = cu.cuDevicePrimaryCtxRetain(&c->retained, dev);
        if (r != CUDA_SUCCESS) {
            c->retained = NULL;
            return cu_fail(r, "cuDevicePrimaryCtxRetain", c->rank);
        }
    }
    r = cu.cuCtxSetCurrent(c->retained);
    return r == CUDA_SUCCESS ? OK : cu_fail(r, "cuCtxSetCurrent", c->rank);
}

/* Phase 1: a send posted, with its "ready" event (NULL when that failed:
 * its receive then fails too rather than waiting). */
static void post_send(op *o, int *first) {
    lb_comm *c = o->c;
    world *w = c->w;
    CUevent ready = NULL;
    CUresult r = cu.cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS) {
        r = cu.cuEventRecord(ready, o->stream);
        if (r != CUDA_SUCCESS) cu.cuEventDestroy(ready);
    }
    if (r != CUDA_SUCCESS) {
        note(first, cu_fail(r, "cuEventCreate / cuEventRecord (send)", c->rank));
        ready = NULL;
    }
    msg *m = calloc(1, sizeof *m);
    if (!m) {
        if (ready) cu.cuEventDestroy(ready);
        note(first, SYSTEM_ERROR);
        o->m = NULL;
        return;
    }
    m->src = c->rank, m->dst = o->peer, m->buf = o->src, m->bytes = o->count * type_size[o->dtype];
    m->ready = ready;
    pthread_mutex_lock(&lock);
    m->seq = w->sent[(size_t)m->src * (size_t)w->size + (size_t)m->dst]++;
    m->next = w->msgs;
    w->msgs = m;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    o->m = m;
}

static msg *find(const world *w, int src, int dst, unsigned long long seq) {
    for (msg *m = w->msgs; m; m = m->next)
        if (m->src == src && m->dst == dst && m->seq == seq && !m->taken) return m;
    return NULL;
}

/* Phase 2: a receive meets its send (waiting for it on the host), and the
 * copy goes on the receiver's stream after the sender's "ready". */
static void take_recv(op *o, int *first) {
    lb_comm *c = o->c;
    world *w = c->w;
    const int src = o->peer, dst = c->rank;
    const size_t bytes = o->count * type_size[o->dtype];
    const struct timespec until = deadline();
    pthread_mutex_lock(&lock);
    const unsigned long long seq = w->received[(size_t)src * (size_t)w->size + (size_t)dst]++;
    msg *m;
    bool in_time = true;
    while (!(m = find(w, src, dst, seq)) && in_time) in_time = wait_changed(&until);
    pthread_mutex_unlock(&lock);
    if (!m) {
        fprintf(stderr,
                "loopback NCCL: rank %d of %d: gave up waiting for rank %d's send number %llu (%zu bytes): its "
                "groups do not match this rank's\n",
                dst, w->size, src, seq, bytes);
        note(first, SYSTEM_ERROR);
        return;
    }
    int verdict = OK;
    CUevent done = NULL;
    if (!m->ready) {
        fprintf(stderr, "loopback NCCL: rank %d: rank %d's matching send failed\n", dst, src);
        verdict = UNHANDLED_CUDA_ERROR;
    } else if (m->bytes != bytes) {
        fprintf(stderr,
                "loopback NCCL: rank %d receives %zu bytes from rank %d (its receive number %llu from that rank), "
                "which sends %zu\n",
                dst, bytes, src, seq, m->bytes);
        verdict = INVALID_USAGE;
    } else {
        CUresult r = cu.cuStreamWaitEvent(o->stream, m->ready, 0);
        const char *what = "cuStreamWaitEvent (receive)";
        if (r == CUDA_SUCCESS && bytes) {
            r = cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)o->dst, (CUdeviceptr)(uintptr_t)m->buf, bytes, o->stream);
            what = "cuMemcpyAsync (receive)";
        }
        if (r == CUDA_SUCCESS) {
            r = cu.cuEventCreate(&done, CU_EVENT_DISABLE_TIMING);
            what = "cuEventCreate (receive)";
            if (r == CUDA_SUCCESS) {
                r = cu.cuEventRecord(done, o->stream);
                what = "cuEventRecord (receive)";
                if (r != CUDA_SUCCESS) cu.cuEventDestroy(done);
            }
        }
        if (r != CUDA_SUCCESS) {
            verdict = cu_fail(r, what, dst);
            done = NULL;
        }
    }
    pthread_mutex_lock(&lock);
    m->done = done;
    m->result = verdict;
    m->taken = true;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    note(first, verdict);
}

/* Phase 3: a send waits (on the host) for its receive to be posted, then
 * its stream for the copy; the send is finished. */
static void finish_send(op *o, int *first) {
    msg *m = o->m;
    if (!m) return;
    world *w = o->c->w;
    const struct timespec until = deadline();
    pthread_mutex_lock(&lock);
    bool in_time = true;
    while (!m->taken && in_time) in_time = wait_changed(&until) || m->taken;
    if (in_time) {
        msg **p = &w->msgs;
        while (*p != m) p = &(*p)->next;
        *p = m->next;
    }
    pthread_mutex_unlock(&lock);
    if (!in_time) {
        /* left posted: a late receive may still read it */
        fprintf(stderr,
                "loopback NCCL: rank %d of %d: gave up waiting for rank %d to receive send number %llu (%zu bytes): "
                "its groups do not match this rank's\n",
                m->src, w->size, m->dst, m->seq, m->bytes);
        note(first, SYSTEM_ERROR);
        return;
    }
    if (m->done) {
        const CUresult r = cu.cuStreamWaitEvent(o->stream, m->done, 0);
        if (r != CUDA_SUCCESS) note(first, cu_fail(r, "cuStreamWaitEvent (send)", m->src));
        cu.cuEventDestroy(m->done);
    }
    if (m->ready) cu.cuEventDestroy(m->ready);
    note(first, m->result); /* a size mismatch fails both ends */
    free(m);
}

/* acc += x, elementwise (integers wrap, as NCCL's do). */
static void add_into(void *acc, const void *x, size_t n, int dtype) {
    switch (dtype) {
    case INT8:
    case UINT8:
        for (size_t i = 0; i < n; i++) ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] + ((const uint8_t *)x)[i]);
        break;
    case INT32:
    case UINT32:
        for (size_t i = 0; i < n; i++) ((uint32_t *)acc)[i] += ((const uint32_t *)x)[i];
        break;
    case INT64:
    case UINT64:
        for (size_t i = 0; i < n; i++) ((uint64_t *)acc)[i] += ((const uint64_t *)x)[i];
        break;
    case FLOAT32:
        for (size_t i = 0; i < n; i++) ((float *)acc)[i] += ((const float *)x)[i];
        break;
    case FLOAT64:
        for (size_t i = 0; i < n; i++) ((double *)acc)[i] += ((const double *)x)[i];
        break;
    }
}

/* Phase 4: an all-reduce, a rendezvous of the world's ranks. */
static void all_reduce(op *o, int *first) {
    lb_comm *c = o->c;
    world *w = c->w;
    const int n = w->size, me = c->rank;
    const size_t bytes = o->count * type_size[o->dtype];
    int verdict = OK;
    /* the input (and whatever the stream did before) is ready */
    CUresult r = cu.cuStreamSynchronize(o->stream);
    if (r != CUDA_SUCCESS) verdict = cu_fail(r, "cuStreamSynchronize (all-reduce)", me);
    pthread_mutex_lock(&lock);
    w->slots[me] = (slot){o->src, o->count, o->dtype, o->redop, verdict == OK};
    pthread_mutex_unlock(&lock);
    int b = barrier(w, me, "an all-reduce (inputs)");
    if (b != OK) {
        note(first, b);
        return;
    }
    /* every input is published and stays until the second barrier */
    slot *all = malloc((size_t)n * sizeof *all);
    void *acc = malloc(bytes ? bytes : 1), *tmp = malloc(bytes ? bytes : 1);
    if (!all || !acc || !tmp) verdict = verdict == OK ? SYSTEM_ERROR : verdict;
    if (all) {
        pthread_mutex_lock(&lock);
        memcpy(all, w->slots, (size_t)n * sizeof *all);
        pthread_mutex_unlock(&lock);
        for (int k = 0; k < n && verdict == OK; k++) {
            if (!all[k].ok) {
                fprintf(stderr, "loopback NCCL: rank %d: rank %d failed its part of an all-reduce\n", me, k);
                verdict = UNHANDLED_CUDA_ERROR;
            } else if (all[k].count != o->count || all[k].dtype != o->dtype || all[k].op != o->redop) {
                fprintf(stderr,
                        "loopback NCCL: rank %d: an all-reduce of %zu elements of type %d (op %d) meets rank %d's "
                        "of %zu of type %d (op %d)\n",
                        me, o->count, o->dtype, o->redop, k, all[k].count, all[k].dtype, all[k].op);
                verdict = INVALID_USAGE;
            }
        }
        /* every input to the host, added in rank order */
        for (int k = 0; k < n && verdict == OK; k++) {
            r = cu.cuMemcpyDtoHAsync(k ? tmp : acc, (CUdeviceptr)(uintptr_t)all[k].buf, bytes, o->stream);
            if (r == CUDA_SUCCESS) r = cu.cuStreamSynchronize(o->stream);
            if (r != CUDA_SUCCESS) verdict = cu_fail(r, "cuMemcpyDtoHAsync (all-reduce)", me);
            else if (k) add_into(acc, tmp, o->count, o->dtype);
        }
    }
    /* nobody writes before everyone has read (in place) */
    b = barrier(w, me, "an all-reduce (outputs)");
    if (verdict == OK && b == OK) {
        r = cu.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)o->dst, acc, bytes, o->stream);
        if (r == CUDA_SUCCESS) r = cu.cuStreamSynchronize(o->stream);
        if (r != CUDA_SUCCESS) verdict = cu_fail(r, "cuMemcpyHtoDAsync (all-reduce)", me);
    }
    free(all), free(acc), free(tmp);
    note(first, verdict);
    note(first, b);
}

/* The outermost ncclGroupEnd: the thread's queued calls, in phases. */
static int run_group(op *ops, int n) {
    if (n == 0) return OK;
    int first = cu_ready();
    if (first != OK) return first;
    for (int i = 0; i < n; i++) note(&first, ensure_context(ops[i].c));
    for (int i = 0; i < n; i++)
        if (ops[i].kind == SEND) post_send(&ops[i], &first);
    for (int i = 0; i < n; i++)
        if (ops[i].kind == RECV) take_recv(&ops[i], &first);
    for (int i = 0; i < n; i++)
        if (ops[i].kind == SEND) finish_send(&ops[i], &first);
    for (int i = 0; i < n; i++)
        if (ops[i].kind == ALL_REDUCE) all_reduce(&ops[i], &first);
    return first;
}

/* ---- NCCL's entry points ------------------------------------------------------ */

int ncclGetVersion(int *v) {
    if (!v) return INVALID_ARGUMENT;
    *v = 22304; /* 2.23.4 */
    return OK;
}

const char *ncclGetErrorString(int r) {
    switch (r) {
    case OK: return "no error (loopback NCCL)";
    case UNHANDLED_CUDA_ERROR: return "unhandled cuda error (loopback NCCL; see stderr)";
    case SYSTEM_ERROR: return "unhandled system error (loopback NCCL; see stderr)";
    case INTERNAL_ERROR: return "internal error (loopback NCCL)";
    case INVALID_ARGUMENT: return "invalid argument (loopback NCCL)";
    case INVALID_USAGE: return "invalid usage (loopback NCCL; see stderr)";
    }
    return "unknown result (loopback NCCL)";
}

int ncclCommInitAll(void **comms, int ndev, const int *devlist) {
    if (!comms || ndev < 1) return INVALID_ARGUMENT;
    for (int i = 0; devlist && i < ndev; i++)
        if (devlist[i] < 0) return INVALID_ARGUMENT;
    world *w = calloc(1, sizeof *w);
    if (!w) return SYSTEM_ERROR;
    w->size = w->refs = ndev;
    w->sent = calloc((size_t)ndev * (size_t)ndev, sizeof *w->sent);
    w->received = calloc((size_t)ndev * (size_t)ndev, sizeof *w->received);
    w->slots = calloc((size_t)ndev, sizeof *w->slots);
    lb_comm **made = calloc((size_t)ndev, sizeof *made);
    bool ok = w->sent && w->received && w->slots && made;
    for (int i = 0; ok && i < ndev; i++) {
        made[i] = calloc(1, sizeof *made[i]);
        ok = made[i] != NULL;
        if (ok) *made[i] = (lb_comm){w, i, devlist ? devlist[i] : i, NULL};
    }
    if (!ok) {
        for (int i = 0; made && i < ndev; i++) free(made[i]);
        free(made);
        world_free(w);
        return SYSTEM_ERROR;
    }
    for (int i = 0; i < ndev; i++) comms[i] = made[i];
    free(made);
    return OK;
}

int ncclCommDestroy(void *comm) {
    lb_comm *c = comm;
    if (!c) return INVALID_ARGUMENT;
    if (c->retained && cu_ready() == OK) {
        CUdevice dev;
        if (cu.cuDeviceGet(&dev, c->device) == CUDA_SUCCESS) cu.cuDevicePrimaryCtxRelease(dev);
    }
    pthread_mutex_lock(&lock);
    const bool last = --c->w->refs == 0;
    pthread_mutex_unlock(&lock);
    if (last) world_free(c->w);
    free(c);
    return OK;
}

int ncclCommCount(const void *comm, int *count) {
    if (!comm || !count) return INVALID_ARGUMENT;
    *count = ((const lb_comm *)comm)->w->size;
    return OK;
}

int ncclCommUserRank(const void *comm, int *rank) {
    if (!comm || !rank) return INVALID_ARGUMENT;
    *rank = ((const lb_comm *)comm)->rank;
    return OK;
}

int ncclCommCuDevice(const void *comm, int *device) {
    if (!comm || !device) return INVALID_ARGUMENT;
    *device = ((const lb_comm *)comm)->device;
    return OK;
}

int ncclGroupStart(void) {
    grp.depth++;
    return OK;
}

int ncclGroupEnd(void) {
    if (grp.depth <= 0) return INVALID_USAGE;
    if (--grp.depth > 0) return OK;
    const int r = run_group(grp.ops, grp.n);
    free(grp.ops);
    grp.ops = NULL, grp.n = grp.cap = 0;
    return r;
}

/* A call queued in the thread's group, or run as a group of its own. */
static int submit(const op *o) {
    if (grp.depth > 0) return enqueue(o);
    ncclGroupStart();
    const int q = enqueue(o);
    const int r = ncclGroupEnd();
    return q != OK ? q : r;
}

/* A count whose bytes do not fit, or a negative one passed as size_t. */
static bool too_many(size_t count, int dtype) { return count > SIZE_MAX / 2 / type_size[dtype]; }

static int point_to_point(int kind, const void *src, void *dst, size_t count, int dtype, int peer, void *comm,
                          void *stream) {
    lb_comm *c = comm;
    if (!c || dtype < 0 || dtype >= NTYPES || too_many(count, dtype) || peer < 0 ||
        peer >= c->w->size || (count && !(kind == SEND ? src : dst)))
        return INVALID_ARGUMENT;
    const op o = {kind, c, src, dst, count, dtype, SUM, peer, (CUstream)stream, NULL};
    return submit(&o);
}

int ncclSend(const void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
    return point_to_point(SEND, buf, NULL, count, dtype, peer, comm, stream);
}

int ncclRecv(void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
    return point_to_point(RECV, NULL, buf, count, dtype, peer, comm, stream);
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int redop, void *comm, void *stream) {
    lb_comm *c = comm;
    if (!c || redop != SUM || dtype < 0 || dtype >= NTYPES || dtype == FLOAT16 || dtype == BFLOAT16 ||
        too_many(count, dtype) || (count && (!send || !recv)))
        return INVALID_ARGUMENT;
    if (count == 0) return OK;
    const op o = {ALL_REDUCE, c, send, recv, count, dtype, redop, 0, (CUstream)stream, NULL};
    return submit(&o);
}
