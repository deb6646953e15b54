/* fake_nccl.c -- a stand-in for libnccl, for the loader's tests
 * (test_cp_plan.c): the entry points driver/nccl.c looks up, with NCCL's
 * ABI (ints for the enums, pointers for the communicator and the stream)
 * and no communication at all. A communicator is the address of three ints
 * the test owns: rank, size, device. Send and receive check the peer and
 * append what they were asked to a log the test reads back, so the test
 * sees the calls a ring step makes and how an NCCL error comes back.
 *
 * Built twice (tests/meson.build): as it is, and with FAKE_NCCL_NO_RECV,
 * a library that lacks ncclRecv, for the missing-symbol message. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };

static int version = 22304; /* 2.23.4 */
static int group_depth;
static char log_text[4096];

static void note(const char *fmt, int a, size_t b, int c) {
    size_t n = strlen(log_text);
    snprintf(log_text + n, sizeof log_text - n, fmt, a, b, c);
}

/* For the test: what ncclGetVersion reports, the log, a reset. */
void fake_nccl_set_version(int v) { version = v; }
const char *fake_nccl_log(void) { return log_text; }
void fake_nccl_reset(void) {
    log_text[0] = 0;
    group_depth = 0;
}

int ncclGetVersion(int *v) {
    if (!v) return INVALID_ARGUMENT;
    *v = version;
    return OK;
}

const char *ncclGetErrorString(int r) {
    switch (r) {
    case OK: return "no error (fake NCCL)";
    case SYSTEM_ERROR: return "system error (fake NCCL)";
    case INVALID_ARGUMENT: return "invalid argument (fake NCCL)";
    case INVALID_USAGE: return "invalid usage (fake NCCL)";
    }
    return "unknown result (fake NCCL)";
}

static int field(const void *comm, int i, int *out) {
    if (!comm || !out) return INVALID_ARGUMENT;
    *out = ((const int *)comm)[i];
    return OK;
}

int ncclCommUserRank(const void *comm, int *rank) { return field(comm, 0, rank); }
int ncclCommCount(const void *comm, int *count) { return field(comm, 1, count); }
int ncclCommCuDevice(const void *comm, int *device) { return field(comm, 2, device); }

int ncclGroupStart(void) {
    group_depth++;
    note("start;", 0, 0, 0);
    return OK;
}

int ncclGroupEnd(void) {
    if (group_depth == 0) return INVALID_USAGE;
    group_depth--;
    note("end;", 0, 0, 0);
    return OK;
}

static int transfer(const char *fmt, const void *buf, size_t count, int dtype, int peer, const void *comm) {
    int size = 0;
    if (!buf || field(comm, 1, &size) != OK || peer < 0 || peer >= size) return INVALID_ARGUMENT;
    note(fmt, peer, count, dtype);
    return OK;
}

int ncclSend(const void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
    (void)stream;
    return transfer("send(%d,%zu,%d);", buf, count, dtype, peer, comm);
}

#ifndef FAKE_NCCL_NO_RECV
int ncclRecv(void *buf, size_t count, int dtype, int peer, void *comm, void *stream) {
    (void)stream;
    return transfer("recv(%d,%zu,%d);", buf, count, dtype, peer, comm);
}
#endif

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream) {
    (void)stream;
    int size = 0;
    if (!send || !recv || field(comm, 1, &size) != OK) return INVALID_ARGUMENT;
    note("allreduce(%d,%zu,%d);", op, count, dtype);
    return OK;
}
