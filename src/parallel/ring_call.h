/*
 * ring_call.h -- what the sharded forward (ring_forward.c) and backward
 * (ring_backward.c) share: one call's checks, communicator, pair masks,
 * plan, streams and events, each pair's attention arguments, and the K/V
 * step of the ring.
 *
 * Opening a call (fgi_ring_call_open):
 *   1. the checks of fg_cp_args' fields against the rank's shard, NCCL
 *      (driver/nccl.c) and what the communicator says of itself (rank,
 *      size, device);
 *   2. a block mask for every (q chunk, kv chunk) pair of the whole
 *      sequence, built on the GPU at the pair's global offsets, and its
 *      class (empty, full, partial) from the per-row block counts, copied
 *      back after one synchronisation. Every rank builds all of them, not
 *      only its own: the transfer schedule depends on which ranks need each
 *      shard, and ranks that disagreed would leave a send without its
 *      receive;
 *   3. the plan (ring_plan.c) from those classes;
 *   4. a stream of the call's for NCCL, and the events the operation asks
 *      for.
 * Steps 2 and 3 are what fg_cp_plan_create keeps across calls: given a
 * plan, a call checks it was made for this one and builds nothing. Without
 * one, closing the call frees the pair masks only after the caller's
 * stream has used them: a second synchronisation.
 */
#ifndef FLEXGEN_RING_CALL_H
#define FLEXGEN_RING_CALL_H

#include "parallel/ring_plan.h"

#include "attention/attention.h"
#include "driver/cudrv.h"
#include "driver/nccl.h"

/* The chunks' unit: the kernels' block. */
#define FGI_CP_BLOCK 128
#define FGI_RING_MAX_EVENTS 16

/* Every chunk of the sequence, by global chunk number, and a block mask and
 * class per (q chunk, kv chunk). */
typedef struct fgi_ring_masks {
    int nchunks;                       /* C: world, or 2 * world            */
    int64_t start[2 * FGI_RING_MAX_WORLD], len[2 * FGI_RING_MAX_WORLD];
    fg_block_mask **mask;              /* [C * C], NULL: no mask_mod or a 0-row side */
    fgi_ring_class *cls;               /* [C * C]                           */
} fgi_ring_masks;

/* The public fg_cp_plan: the pair masks and the plan, with what they were
 * made for (a call with a plan checks it). */
struct fg_cp_plan {
    int world, rank, device;
    int64_t global_len;
    fg_cp_layout layout;
    uint64_t mod_hash;
    int batch, heads_q;
    fgi_ring_masks pm;
    fgi_ring_plan *plan;
};

typedef struct fgi_ring_call {
    fg_ctx *ctx;
    const fg_mod *mod;
    const fg_attention_args *a;  /* the rank's shard (the forward's view)   */
    fgi_attn_strides st;         /* its element strides, checked            */
    const fgi_nccl_lib *nccl;
    void *comm;
    fgi_nccl_comm_info who;
    const fgi_ring_plan *plan;   /* the caller's plan's or own->plan        */
    const fgi_ring_masks *pm;    /* likewise                                */
    fg_cp_plan *own;             /* built by this call, freed at close      */
    CUstream stream, comm_stream;
    CUstream side_stream;        /* FG_OPT_CP_STREAMS 2: the pairs of a
                                    step's second q chunk; else NULL      */
    CUevent fork, join;          /* the side stream's, around a step      */
    CUevent ev[FGI_RING_MAX_EVENTS]; /* the operation's, by its own names   */
    int nev;
} fgi_ring_call;

/* The sharded call's arguments beside the shard: the communicator, the
 * global length and the layout (fg_cp_args' and fg_cp_bwd_args' fields). */
typedef struct fgi_ring_call_desc {
    void *comm;
    int64_t global_len;
    fg_cp_layout layout;
    const fg_cp_plan *plan; /* the caller's, or NULL                        */
    const char *what;  /* the public struct, for messages: "fg_cp_args"     */
    int nevents;       /* events the operation needs, <= FGI_RING_MAX_EVENTS */
} fgi_ring_call_desc;

/* Steps 1-4 above for shard `a` (already through fgi_attn_args_in and
 * fgi_attn_check_args, with its strides in `st`). On failure everything
 * opened is closed again. *c is valid for fgi_ring_call_close either way. */
fg_status fgi_ring_call_open(fg_ctx *ctx, const fg_mod *mod, const fg_attention_args *a,
                             const fgi_attn_strides *st, const fgi_ring_call_desc *d, fgi_ring_call *c);
void fgi_ring_call_close(fgi_ring_call *c);

/* After an error inside the ring: wait for everything the call queued on
 * its own streams (comm and side), so that the workspace and the masks can
 * be freed. */
void fgi_ring_drain(fgi_ring_call *c);

/* The global chunk numbers of pair p at step s of this rank. */
void fgi_ring_pair_chunks(const fgi_ring_call *c, int s, const fgi_ring_pair *p, int *qc, int *kc);

/* The attention arguments of pair p of step s: the shard's, with q (and
 * out, with lse unset) moved to the pair's q rows, k and v the held shard's
 * kv rows (contiguous [B, Hkv, held_rows, D] at held_k / held_v), the
 * pair's lengths, global offsets and block mask, on the caller's stream.
 * The operation sets where the results go and, with two compute streams,
 * the stream (fgi_ring_stream_of). */
void fgi_ring_pair_args(const fgi_ring_call *c, int s, const fgi_ring_pair *p, CUdeviceptr held_k,
                        CUdeviceptr held_v, int64_t held_rows, fg_attention_args *pa);

/* The K/V transfer of step s on the comm stream: the held shard (held_k,
 * held_v, held_rows rows) to rank r + 1 and the next one from rank r - 1
 * into recv_k / recv_v, as the plan says. The receive first waits for
 * `free_event` (the compute that last read that buffer; 0 for none), and
 * `arrived_event` is recorded after it. */
fg_status fgi_ring_kv_transfer(fgi_ring_call *c, int s, CUdeviceptr held_k, CUdeviceptr held_v, int64_t held_rows,
                               CUdeviceptr recv_k, CUdeviceptr recv_v, CUevent free_event, CUevent arrived_event);

/* Two compute streams (FG_OPT_CP_STREAMS 2): a step's pairs of q chunk 0
 * run on the caller's stream, those of q chunk 1 on the side stream, so
 * that the last wave of thread blocks of one pair's kernel overlaps the
 * other's instead of leaving SMs idle (a pair is a kernel of a few dozen
 * waves: its tail is a few percent of it). Everything of one q chunk stays
 * on one stream, so its results need no more ordering than before.
 * fgi_ring_fork makes the side stream wait for the caller's up to here
 * (call it before a step's pairs), fgi_ring_join_side the caller's for the
 * side stream's work (after them); both do nothing with one stream.
 * fgi_ring_stream_of is the stream of q chunk qc. */
fg_status fgi_ring_fork(fgi_ring_call *c);
fg_status fgi_ring_join_side(fgi_ring_call *c);
CUstream fgi_ring_stream_of(const fgi_ring_call *c, int qc);

/* A strided copy on the caller's stream of `height` rows of `width`
 * bytes, `src_pitch` / `dst_pitch` bytes apart (a chunk's LSE rows into
 * or out of the caller's lse, whose rows are the rank's whole length
 * apart). */
fg_status fgi_ring_copy_rows(fgi_ring_call *c, CUdeviceptr dst, size_t dst_pitch, CUdeviceptr src, size_t src_pitch,
                             size_t width, size_t height);

/* Kernels made and loaded before a call's first transfer. Loading a
 * module or function waits for the device's queued work while holding a
 * driver lock: inside the ring that work can be an NCCL kernel waiting for
 * a peer, and where the peer is another thread of this process (a thread
 * per GPU) its next driver call waits for the lock, so neither finishes.
 * Every kernel a sharded call launches is therefore made (compiled or
 * found, loaded, its functions loaded: jit/cache.c) before the ring
 * starts; inside it they are found in the cache. This one makes a kernel
 * that reads no mod (the merge, the partial sums) for the call's dtype. */
fg_status fgi_ring_load_kernel_modless(fgi_ring_call *c, fgi_kernel_op op);

/* Through event ev: the comm stream waits for the caller's stream up to
 * here (the shard written, the workspace allocated), or, with
 * caller_waits_for_comm, the caller's stream for the comm stream's work so
 * far (before the workspace is given back). */
fg_status fgi_ring_join(fgi_ring_call *c, CUevent ev, bool caller_waits_for_comm);

#endif
