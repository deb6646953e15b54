/*
 * ring_plan.h -- the shard planner of context parallelism (ring_plan.c).
 *
 * Pure CPU: from the world size, the global lengths, a layout and a way to
 * classify a (q chunk, kv chunk) pair, it says for every rank which rows it
 * holds and, for every step of the K/V ring, which pairs to compute with
 * which offsets, and whether to send / receive the K/V shard. Every rank
 * computes the same plan from the same inputs, so the ranks agree on it
 * without talking. The essay on the schedule is at the top of ring_plan.c;
 * docs/context_parallel.md has the whole design.
 *
 * Terms:
 *  - a chunk: a run of consecutive global rows [start, start + len); len
 *    may be 0 when the sequence is shorter than the number of chunks;
 *  - a rank's shard: its chunks of q (and of K/V, with the same layout),
 *    stored back to back in the rank's local buffer (chunk 0 first);
 *  - a pair: one of the rank's q chunks against one chunk of the K/V shard
 *    it holds at a step, an attention call with q_offset / kv_offset set to
 *    the chunks' global starts.
 */
#ifndef FLEXGEN_RING_PLAN_H
#define FLEXGEN_RING_PLAN_H

#include "internal.h"

#define FGI_RING_MAX_WORLD 64
#define FGI_RING_MAX_ALIGN (1 << 20)
/* Chunks per rank (zig-zag: 2), pairs per step (2 q x 2 kv chunks). */
#define FGI_RING_MAX_CHUNKS 2
#define FGI_RING_MAX_PAIRS 4

typedef enum fgi_ring_layout {
    /* Rank r holds chunk r of N: [start_r, start_r + len_r). */
    FGI_RING_CONTIGUOUS = 1,
    /* The sequence cut into 2N chunks; rank r holds chunks r and 2N-1-r. */
    FGI_RING_ZIGZAG = 2
} fgi_ring_layout;

/* The values of the block-mask tile map (blockmask.c): what a pair needs. */
typedef enum fgi_ring_class {
    FGI_RING_EMPTY = 0,   /* the mask is false everywhere: skip the pair     */
    FGI_RING_PARTIAL = 1, /* mixed: compute with the mask evaluated          */
    FGI_RING_FULL = 2     /* true everywhere: compute, no mask evaluation    */
} fgi_ring_class;

/* Classify the pair of global q rows [q_start, q_start + q_len) and kv rows
 * [kv_start, kv_start + kv_len) (both lengths >= 1) into *cls. A status
 * other than FG_OK stops the planner, which returns it (the callback
 * records its message on its own context). Called once per (q chunk, kv
 * chunk) pair of the whole plan. */
typedef fg_status (*fgi_ring_class_fn)(void *user, int64_t q_start, int64_t q_len, int64_t kv_start,
                                       int64_t kv_len, fgi_ring_class *cls);

typedef struct fgi_ring_desc {
    int world;               /* N, 1..FGI_RING_MAX_WORLD                      */
    int64_t q_len, kv_len;   /* global lengths, 1..INT32_MAX (the mods see
                                int positions); equal for self-attention     */
    fgi_ring_layout layout;  /* the same layout for q and K/V                */
    int64_t align;           /* 0 or 1: chunks of any length; else chunk
                                starts fall on multiples of align rows (the
                                kernels' block, 128: no ragged blocks inside
                                the sequence), 1..2^20. With fewer than C
                                units of align rows the last chunks are
                                empty (zig-zag then degrades to contiguous):
                                keep len >= C * align                       */
    fgi_ring_class_fn pair_class; /* NULL: every pair FULL (no mask)         */
    void *user;
} fgi_ring_desc;

typedef struct fgi_ring_chunk {
    int64_t start;  /* global row of the chunk's first row                   */
    int64_t len;    /* rows, possibly 0                                      */
    int64_t local;  /* its first row in the owning rank's local buffer       */
    int index;      /* its global chunk number (0..N-1 or 0..2N-1)           */
} fgi_ring_chunk;

typedef struct fgi_ring_pair {
    int q_chunk, kv_chunk;    /* which of the rank's q chunks / of the held
                                 shard's kv chunks (0 or 1)                  */
    int64_t q_local, q_len;   /* rows [q_local, q_local + q_len) of the local
                                 q (and out, lse) buffer                     */
    int64_t kv_local, kv_len; /* rows of the held K/V shard's buffer         */
    int64_t q_offset, kv_offset; /* global positions of the first rows: the
                                 attention call's q_offset / kv_offset       */
    fgi_ring_class cls;       /* EMPTY also for a pair with a 0-row side    */
} fgi_ring_pair;

/* One rank at one step. At step s rank r holds the K/V shard that started
 * on rank (r - s) mod N, when `holds` says so (step 0 always; later steps
 * only when it was received at the step before). Sends go to rank r + 1,
 * receives come from rank r - 1 (mod N). What rank r sends at step s is the
 * shard it holds (kv_source); what it receives at step s is the shard it
 * holds at step s + 1 (steps[s + 1].kv_source, steps[s + 1].kv_rows rows).
 * The transfer of step s runs while step s computes. */
typedef struct fgi_ring_step {
    int kv_source;    /* (r - s) mod N                                        */
    int64_t kv_rows;  /* rows of that shard (its chunks back to back)         */
    bool holds;       /* the shard is here (received, or own at step 0)       */
    bool send;        /* send the held shard to rank r + 1 during this step   */
    bool recv;        /* receive rank r - 1's shard during this step          */
    int npairs;       /* q chunks x kv chunks, EMPTY ones included            */
    fgi_ring_pair pairs[FGI_RING_MAX_PAIRS];
} fgi_ring_step;

typedef struct fgi_ring_rank {
    int nchunks;                             /* 1 contiguous, 2 zig-zag     */
    fgi_ring_chunk q[FGI_RING_MAX_CHUNKS];   /* the rank's q rows            */
    fgi_ring_chunk kv[FGI_RING_MAX_CHUNKS];  /* its own K/V rows             */
    int64_t q_rows, kv_rows;                 /* local buffer rows            */
    fgi_ring_step *steps;                    /* [world]                      */
    /* Totals over the steps, for balance and for sizing. */
    int64_t pairs_computed;    /* FULL + PARTIAL pairs                        */
    int64_t pairs_full, pairs_partial;
    int64_t elements;          /* sum of q_len * kv_len over computed pairs:
                                  the scores the kernels visit at chunk
                                  granularity (the mask then skips blocks)   */
    int sends, recvs;
} fgi_ring_rank;

typedef struct fgi_ring_plan {
    int world;
    fgi_ring_layout layout;
    int64_t q_len, kv_len;
    int64_t align;             /* >= 1                                        */
    int nchunks;               /* chunks per rank                             */
    int64_t max_q_rows;        /* the largest local q buffer                  */
    int64_t max_kv_rows;       /* the largest K/V shard: a receive buffer     */
    fgi_ring_rank *ranks;      /* [world]                                     */
} fgi_ring_plan;

/* The rows `rank` holds of a sequence of `len` rows under `layout` across
 * `world` ranks: chunks[0..*nchunks) (1 or 2), each with its global start,
 * length and local row. The sequence is cut into units of `align` rows
 * (the last one possibly short) and the units into C chunks (C = world, or
 * 2 * world for zig-zag), the first (units % C) chunks taking one unit
 * more; with align 1 that is "the first len % C chunks one row more". The
 * arguments are trusted (the planner checks them). */
void fgi_ring_split(fgi_ring_layout layout, int world, int64_t len, int64_t align, int rank,
                    fgi_ring_chunk chunks[FGI_RING_MAX_CHUNKS], int *nchunks);

/* Build the plan. FG_ERR_INVALID_ARGUMENT for a NULL pointer, a world
 * outside 1..64, an unknown layout, an align outside 0..2^20 or a class
 * the callback made up;
 * FG_ERR_SHAPE for a length outside 1..INT32_MAX; FG_ERR_OUT_OF_MEMORY;
 * else the callback's status. ctx may be NULL (then nothing is recorded). */
fg_status fgi_ring_plan_create(fg_ctx *ctx, const fgi_ring_desc *desc, fgi_ring_plan **out);
void fgi_ring_plan_destroy(fgi_ring_plan *plan);

/* ---- the backward's dK/dV sums ------------------------------------------ */

/* In the backward each shard's dK / dV travel as running sums beside its
 * K / V (ring_backward.c): the holder at step s adds its pairs' shares and
 * sends the sums on with the shard; after the shard's last use (the last
 * step it is held) the holder sends them home to the shard's owner
 * instead, unless that is itself (a shard that never leaves). A rank's
 * dK/dV group at step s is these messages, each two NCCL ops (dK, dV), in
 * this order; a send's receive is in its peer's group of the same step. */
typedef enum fgi_ring_msg_kind {
    FGI_RING_SUM_ON = 1,   /* send the held shard's sums to rank r + 1       */
    FGI_RING_SUM_HOME = 2, /* send the held shard's final sums to its owner   */
    FGI_RING_SUM_NEXT = 3, /* receive from rank r - 1 the sums of the shard
                              held at step s + 1                             */
    FGI_RING_SUM_MINE = 4  /* receive the own shard's final sums from its
                              last holder                                    */
} fgi_ring_msg_kind;

typedef struct fgi_ring_msg {
    fgi_ring_msg_kind kind;
    bool send;
    int peer;
    int64_t rows; /* of the shard whose sums move                           */
} fgi_ring_msg;

#define FGI_RING_MAX_MSGS 3
/* The messages of `rank`'s dK/dV group at step s into out; their count. */
int fgi_ring_sum_msgs(const fgi_ring_plan *p, int rank, int s, fgi_ring_msg out[FGI_RING_MAX_MSGS]);
/* The step at which `rank`'s own shard is last held and the rank holding
 * it then: 0 and `rank` when it never leaves. */
void fgi_ring_home(const fgi_ring_plan *p, int rank, int *step, int *from);

/* "empty", "partial", "full". */
const char *fgi_ring_class_name(fgi_ring_class cls);

/* ---- classifiers ---------------------------------------------------------- */

/* The causal mask q_idx >= kv_idx from the ranges alone (user unused). */
fg_status fgi_ring_class_causal(void *user, int64_t q_start, int64_t q_len, int64_t kv_start,
                                int64_t kv_len, fgi_ring_class *cls);

/* Any mod's mask on the CPU: `user` is a fgi_ring_mod_classifier. Each pair
 * gets a CPU block mask (fg_block_mask_create) of q_len x kv_len with
 * desc.q_offset / kv_offset at the chunks' global starts, so the mod sees
 * global positions, and buffers bound to host memory hold the values of
 * the whole sequence (document ids of every token). The pair is EMPTY when
 * no block is visited, FULL when every block of every (b, h) is full, else
 * PARTIAL. A block is full / empty when the mask is true / false at all of
 * its in-range positions, so this is the element-wise answer for any block
 * size; the block size only decides the work. Costs one evaluation of the
 * mask per element: for tests and small sequences (the GPU builder serves
 * long ones). A mod without mask_mod is FULL everywhere. */
typedef struct fgi_ring_mod_classifier {
    fg_ctx *ctx;               /* errors are recorded here                    */
    const fg_mod *mod;
    const fg_binding *binds;   /* host memory                                 */
    size_t nbinds;
    int batch, heads;          /* 0 = 1 (a mask that ignores b / h)           */
    int q_block, kv_block;     /* 0 = 128                                     */
} fgi_ring_mod_classifier;
fg_status fgi_ring_class_mod(void *user, int64_t q_start, int64_t q_len, int64_t kv_start,
                             int64_t kv_len, fgi_ring_class *cls);

#endif
