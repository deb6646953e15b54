/*
 * serving_loop.c -- the attention of a small inference server: a paged KV
 * cache, sequences that join and leave a ragged batch, one launch per decode
 * step, and nothing compiled or loaded once the loop runs.
 *
 * A server keeps the keys and values of every running sequence in a pool of
 * fixed-size pages (vLLM's PagedAttention): a sequence owns a list of pages,
 * not a contiguous range, so sequences of any length share one pool without
 * copying, each wastes at most the unused rows of its last page, and a
 * finished sequence's pages go straight to the next one. Here:
 *
 *  - The pool. K and V are [NUM_PAGES][PAGE_SIZE][Hkv][D] bf16 on the device,
 *    the layout of vLLM and FlashInfer (flexgen reads it when the k / v
 *    strides are left zero). The host keeps the free pages on a stack and
 *    the block table, int32 [MAX_BATCH][MAX_PAGES]: entry [b][i] is the page
 *    that holds keys i * PAGE_SIZE .. (i + 1) * PAGE_SIZE - 1 of slot b. The
 *    table is uploaded (cuMemcpyHtoD) whenever it changes; the kernel reads
 *    it at run time.
 *  - Prefill. A new sequence takes pages for its prompt; the prompt's keys
 *    and values are built on the host and copied page by page into their
 *    slots of the pool (a server writes them from its K/V projection
 *    instead), and the prompt's attention reads them through the same paged
 *    arguments: batch 1, q_len = the prompt's length, pointing at the slot's
 *    row of the table and at its entries of kv_lens and q_offsets.
 *  - Decode. Each step every running sequence appends its newest token's K/V
 *    (taking a page off the free stack when its last page is full), and one
 *    fg_attention_forward serves the whole batch: q_len = 1, kv_lens[b] the
 *    sequence's length and q_offsets[b] = kv_lens[b] - 1, the position of
 *    its query. Every slot has its own length (a ragged batch in one
 *    launch), and the mod sees each query at its true position, so the
 *    sliding window below is measured from there; without q_offsets every
 *    query would be position 0 and see only key 0.
 *  - Joining and leaving. A sequence that has generated its tokens gives
 *    its pages back; the next request joins the free slot and takes pages
 *    off the stack, the last ones freed first, so after a while a sequence's
 *    pages are scattered over the pool. A slot with no sequence stays in
 *    the batch with kv_len 0 (the kernel reads nothing for it and writes
 *    output 0, LSE -inf): the launch keeps one shape, as a server that
 *    replays a CUDA graph needs, and the batch is never compacted.
 *  - The kernel cache. Lengths, offsets and the table are device arrays
 *    read at run time, not part of a kernel's cache key: the kernels
 *    fetched once before the loop (fg_attention_kernel_for, which also says
 *    which kernel the library picks for a prefill and for a decode step)
 *    serve every later call. The cache counters must not move after that.
 *    (fg_kernel_launch with those kernels would skip even the in-memory
 *    lookup of each fg_attention_forward; --graph, below, skips the call.)
 *  - The workspace. A decode step splits each sequence's walk over thread
 *    blocks and merges the parts; their workspace is allocated once, sized
 *    by fg_attention_workspace_size for the longest a sequence can grow,
 *    and passed in every call, so a step allocates nothing.
 *
 * --graph: the decode step as a CUDA graph. A server replays its decode
 * step instead of launching it, so that a step costs the host one
 * cuGraphLaunch, not the checks, cache lookup, argument packing and
 * kernel launches of fg_attention_forward. With --graph the step's
 * attention call is captured once, after step 0, with the driver's stream
 * capture (cuStreamBeginCapture on a stream of the example's, the call on
 * that stream, cuStreamEndCapture, cuGraphInstantiate), and steps 1.. launch
 * the graph instead of calling fg_attention_forward. A graph replays the
 * launches it captured exactly -- kernels, grids, every argument by value --
 * and that is valid here only because:
 *  - Nothing is compiled, loaded or allocated inside the capture. The
 *    kernels were fetched before the loop, and step 0 is an ordinary call
 *    with the same arguments on the same stream, so the captured call finds
 *    its kernel in memory; the workspace is the caller's, allocated once
 *    and passed in the call, so the library takes none from its pool.
 *  - Everything that changes per step lives in device memory at the
 *    addresses the captured call was given: the step's q, the K/V pool,
 *    kv_lens, q_offsets, the block table, out and lse (and the workspace).
 *    The per-step uploads -- the new tokens' K/V into the pool, lengths and
 *    offsets, the table when it changed, q, and the NaN poison of out and
 *    lse -- stay outside the graph, as today: synchronous copies and
 *    memsets on the legacy default stream before the replay. The graph's
 *    stream is created blocking (CU_STREAM_DEFAULT, not NON_BLOCKING), so
 *    it and the legacy stream wait for each other: the uploads are ordered
 *    before the replay, the downloads after it, and the timing events
 *    (recorded on the legacy stream) bracket it. Asynchronous uploads from
 *    host memory would go on the graph's stream, before cuGraphLaunch.
 *  - The call's scalars are baked into the graph: the shapes, the scale,
 *    and kv_len, which also sets how many thread blocks split each walk
 *    (the grid). Without --graph a step passes the longest running
 *    sequence's length, a new value almost every step; with --graph every
 *    call (step 0, the captured one) passes MAX_KV, the longest a sequence
 *    can grow and what the workspace is sized for, and each sequence's own
 *    length comes from kv_lens at run time (its keys past that are never
 *    read). The launch keeps one shape, all MAX_BATCH slots, an empty one
 *    with kv_len 0.
 * The capture mode is CU_STREAM_CAPTURE_MODE_GLOBAL, the strictest: while
 * the stream captures, a call that cannot be captured (cuMemAlloc, a
 * synchronous copy, a synchronisation) made by this or any other thread
 * fails, so anything of the kind inside fg_attention_forward would show as
 * an error rather than be left out of the graph. This program has one
 * thread, so THREAD_LOCAL would do the same; a server whose other threads
 * go on allocating while one captures would choose THREAD_LOCAL. A captured
 * call that fails ends the capture before the error is reported, so the
 * stream is never left capturing; the graph and its executable are
 * destroyed at the end. Every check below runs on every step in both modes.
 * The GPU time per step is taken as without --graph, between events around
 * the launch, so it also holds what the GPU waits for the host's launch:
 * less with the graph.
 *
 * PAGE_SIZE is 16, vLLM's default: a sequence wastes at most 15 rows, and
 * the decode kernel reads K/V in tiles of 64 keys, so each tile gathers 4
 * pages from anywhere in the pool and page boundaries inside a tile are
 * crossed on every step. Any power of two from 16 to 256 works (64 makes a
 * tile one page and the table 4 times shorter).
 *
 * Admission: a request joins when a slot is free and the pool can hold its
 * whole life (prompt + tokens to generate); its pages are taken as it
 * grows, the rest stays reserved, so a running sequence never finds the
 * pool empty (vLLM preempts a sequence instead). The pool is smaller than
 * MAX_BATCH full-length sequences, so a request now and then waits with a
 * slot empty. Shapes: 8 slots, GQA with 16 query heads over 4 KV heads,
 * head dim 128, prompts of 32 to 2048 tokens, 16 to 160 tokens generated
 * each, 200 decode steps.
 *
 * Checks. The outputs are filled with 0xFF bytes (NaN) before every call,
 * so an element the kernel did not write cannot pass; so is the pool once
 * at the start, so reading a row nobody has written yet (past a length, in
 * a fresh page) would show too. After every step every row is checked (finite
 * for a running sequence; 0 and LSE -inf for an empty slot), and every
 * second step one running sequence, in turn, against fg_attention_reference,
 * the float64 CPU reference, on the host mirror of the pool through the
 * host copy of the block table: the same paged layout the GPU read (the
 * reference, not the GPU, is what keeps the run from checking more). The
 * last rows of every prompt are compared the same way. The table is
 * checked with fg_block_table_check before every launch.
 *
 * What it prints: the mod; the pool; the kernel taken for a prefill and for
 * a decode step and what fetching them cost; joins and departures with their
 * pages; the decode loop's GPU time per step, host time per call and tokens
 * per second (with --graph, the host time per step of cuGraphLaunch beside
 * that of fg_attention_forward with the same arguments, timed on as many
 * plain calls after step 0, before the capture); the prefills' totals; the
 * pool at the end; the cache counters; the errors against the reference.
 * It exits 0 only when every check passes and nothing was compiled or
 * loaded after the kernels were fetched.
 *
 * Build: cc serving_loop.c $(pkg-config --cflags --libs flexgen) -lm
 * Run:   ./serving_loop [--graph]
 */
#include "example_util.h"

#define PAGE_SIZE 16 /* tokens per page (see above) */

enum {
    MAX_BATCH = 8, HQ = 16, HKV = 4, D = 128, WINDOW = 512,
    MIN_PROMPT = 32, MAX_PROMPT = 2048, MIN_GEN = 16, MAX_GEN = 160,
    MAX_PAGES = (MAX_PROMPT + MAX_GEN + PAGE_SIZE - 1) / PAGE_SIZE, /* per sequence      */
    MAX_KV = MAX_PAGES * PAGE_SIZE, /* the longest a sequence can grow               */
    NUM_PAGES = 704,  /* the pool: under two thirds of MAX_BATCH * MAX_PAGES           */
    STEPS = 200,
    CHECK_EVERY = 2,  /* decode steps per reference check (the reference is the cost) */
    CHECK_ROWS = 4,   /* rows of each prompt checked against the reference         */
    MAX_EVENT_LINES = 24
};

#define ROW ((size_t)HKV * D) /* elements of one token's keys (or values) */

static const char *const MOD_SOURCE =
    "/* Causal attention to the keys at most WINDOW positions back. */\n"
    "int WINDOW = 512;\n"
    "\n"
    "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
    "    return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW;\n"
    "}\n";

/* A request waiting to join: its prompt and how many tokens it generates. */
typedef struct request {
    int id, prompt_len, gen_target;
} request;

/* What the server knows of the sequence in one slot. */
typedef struct sequence {
    int active;
    request req;
    int generated;    /* decode steps done                                 */
    int kv_len;       /* tokens in its pages                               */
    int pages_held;   /* entries of its table row in use                   */
    int pages_needed; /* for prompt + gen_target, reserved when it joined  */
} sequence;

/* The paged KV cache: host bookkeeping, the host mirror the reference
 * reads, and the device arrays the kernels read. */
typedef struct kv_pool {
    int32_t free_pages[NUM_PAGES];       /* a stack of page ids            */
    int nfree;
    int reserved;                        /* promised, not yet taken        */
    int32_t table[MAX_BATCH][MAX_PAGES]; /* -1: no page                    */
    int32_t kv_lens[MAX_BATCH], q_offsets[MAX_BATCH];
    int table_changed;
    uint16_t *k, *v;                     /* [NUM_PAGES][PAGE_SIZE][HKV][D] */
    ex_dptr dk, dv, dtable, dkv_lens, dq_offsets;
} kv_pool;

/* Everything the loop works with. */
typedef struct server {
    fg_ctx *ctx;
    const fg_mod *mod;
    fg_binding window;
    kv_pool pool;
    sequence seq[MAX_BATCH];
    uint64_t seed;
    /* one decode step: q, out [MAX_BATCH][HQ][D], lse [MAX_BATCH][HQ] */
    uint16_t *step_q, *step_out;
    float *step_lse;
    ex_dptr d_step_q, d_step_out, d_step_lse;
    ex_dptr d_workspace; /* the decode step's, allocated once            */
    size_t workspace_size;
    /* one prompt: q, out [prompt][HQ][D] (BSHD), lse [HQ][prompt] */
    uint16_t *pre_q, *pre_out;
    float *pre_lse;
    ex_dptr d_pre_q, d_pre_out, d_pre_lse;
    ex_timer timer;
    /* what happened */
    int event_lines, joined, finished, waited;
    int prefills;
    long long prefill_tokens;
    double prefill_gpu_ms;
    ex_error prefill_err, decode_err;
    size_t bad_rows; /* rows that failed the every-row check */
    /* --graph: the decode step's attention, captured once and replayed */
    int use_graph;
    void *graph_stream;     /* CUstream, blocking (see above)    */
    void *graph;            /* CUgraph: what the capture recorded */
    void *graph_exec;       /* CUgraphExec: what cuGraphLaunch runs */
} server;

static int pages_for(int tokens) { return (tokens + PAGE_SIZE - 1) / PAGE_SIZE; }

/* Element offset of (page, row in page) in the pool. */
static size_t pool_offset(int page, int row) { return ((size_t)page * PAGE_SIZE + row) * ROW; }

/* Strides in elements, (b, h, s, d) order, for [B][len][heads][D]. */
static void bshd_strides(int64_t st[4], int len, int heads) {
    st[0] = (int64_t)len * heads * D, st[1] = D, st[2] = (int64_t)heads * D, st[3] = 1;
}

static void fill_random(uint16_t *p, size_t n, uint64_t *seed) {
    for (size_t i = 0; i < n; i++) p[i] = ex_bf16((float)(2.0 * ex_uniform(seed) - 1.0));
}

/* Requests arrive without end. Their lengths come from a seed of their own,
 * so the schedule does not depend on how much K/V data was drawn. */
static request next_request(uint64_t *seed) {
    static int next_id = 0;
    request r;
    r.id = next_id++;
    r.prompt_len = MIN_PROMPT + (int)(ex_uniform(seed) * (MAX_PROMPT - MIN_PROMPT + 1));
    r.gen_target = MIN_GEN + (int)(ex_uniform(seed) * (MAX_GEN - MIN_GEN + 1));
    return r;
}

/* Printed while there are few: the log of joins and departures. */
static int event_line(server *sv) {
    if (sv->event_lines == MAX_EVENT_LINES) printf("  ... (further joins and departures not shown)\n");
    return sv->event_lines++ < MAX_EVENT_LINES;
}

/* ---- the pool ------------------------------------------------------------ */

/* The next page of slot b's table row, off the free stack. */
static int take_page(kv_pool *pool, sequence *s, int b) {
    if (pool->nfree == 0 || s->pages_held == MAX_PAGES) return 0;
    pool->table[b][s->pages_held++] = pool->free_pages[--pool->nfree];
    pool->reserved--; /* it was promised when the sequence joined */
    pool->table_changed = 1;
    return 1;
}

/* Slot b's pages back onto the stack and its promise dropped; the slot is
 * then empty (kv_len 0). */
static void release_slot(kv_pool *pool, sequence *s, int b) {
    for (int i = 0; i < s->pages_held; i++) {
        pool->free_pages[pool->nfree++] = pool->table[b][i];
        pool->table[b][i] = -1;
    }
    pool->reserved -= s->pages_needed - s->pages_held;
    pool->kv_lens[b] = 0, pool->q_offsets[b] = 0;
    pool->table_changed = 1;
    memset(s, 0, sizeof *s);
}

/* Tokens [from, to) of slot b: pages taken as needed, the keys and values
 * built in the host mirror (random: the model would compute them), and
 * each page's new rows copied to the same place on the device, one copy
 * for K and one for V. */
static int append_tokens(server *sv, int b, int from, int to) {
    kv_pool *pool = &sv->pool;
    sequence *s = &sv->seq[b];
    while (s->pages_held * PAGE_SIZE < to)
        if (!take_page(pool, s, b)) {
            fprintf(stderr, "slot %d: no free page (a bug in the reservation)\n", b);
            return 0;
        }
    for (int i = from / PAGE_SIZE; i * PAGE_SIZE < to; i++) {
        const int r0 = i * PAGE_SIZE > from ? 0 : from - i * PAGE_SIZE;
        const int r1 = (i + 1) * PAGE_SIZE < to ? PAGE_SIZE : to - i * PAGE_SIZE;
        const size_t off = pool_offset(pool->table[b][i], r0), n = (size_t)(r1 - r0) * ROW;
        fill_random(pool->k + off, n, &sv->seed);
        fill_random(pool->v + off, n, &sv->seed);
        if (!ex_upload(pool->dk + off * 2, pool->k + off, n * 2) ||
            !ex_upload(pool->dv + off * 2, pool->v + off, n * 2))
            return 0;
    }
    s->kv_len = to;
    pool->kv_lens[b] = to;
    return 1;
}

/* kv_lens and q_offsets every call, the table when it changed. */
static int upload_metadata(kv_pool *pool) {
    if (!ex_upload(pool->dkv_lens, pool->kv_lens, sizeof pool->kv_lens) ||
        !ex_upload(pool->dq_offsets, pool->q_offsets, sizeof pool->q_offsets))
        return 0;
    if (pool->table_changed) {
        if (!ex_upload(pool->dtable, pool->table, sizeof pool->table)) return 0;
        pool->table_changed = 0;
    }
    return 1;
}

/* "17 16 15 14 ... (77 pages)" */
static void format_pages(const int32_t *row, int n, char *buf, size_t size) {
    int used = 0;
    for (int i = 0; i < n && i < 4 && used < (int)size; i++)
        used += snprintf(buf + used, size - (size_t)used, "%d ", row[i]);
    if (used < (int)size) snprintf(buf + used, size - (size_t)used, "%s(%d pages)", n > 4 ? "... " : "", n);
}

/* ---- the attention calls --------------------------------------------------- */

/* What every call shares: shapes, the pool (strides zero: the paged
 * layout), the window. */
static fg_attention_args paged_args(const server *sv) {
    fg_attention_args a = FG_ATTENTION_ARGS_INIT;
    a.heads_q = HQ, a.heads_kv = HKV, a.head_dim = D, a.dtype = FG_BF16;
    a.k = ex_ptr(sv->pool.dk), a.v = ex_ptr(sv->pool.dv);
    a.page_size = PAGE_SIZE, a.num_pages = NUM_PAGES, a.max_pages = MAX_PAGES;
    a.binds = &sv->window, a.nbinds = 1;
    return a;
}

/* The prefill of slot b's prompt: a batch of one that is slot b's entries
 * of kv_lens and q_offsets and its row of the table. */
static fg_attention_args prefill_args(const server *sv, int b, int prompt_len) {
    fg_attention_args a = paged_args(sv);
    a.batch = 1, a.q_len = prompt_len, a.kv_len = prompt_len;
    a.q = ex_ptr(sv->d_pre_q), a.out = ex_ptr(sv->d_pre_out), a.lse = (float *)ex_ptr(sv->d_pre_lse);
    bshd_strides(a.q_stride, prompt_len, HQ);
    bshd_strides(a.out_stride, prompt_len, HQ);
    a.kv_lens = (const int32_t *)ex_ptr(sv->pool.dkv_lens + (size_t)b * sizeof(int32_t));
    a.q_offsets = (const int32_t *)ex_ptr(sv->pool.dq_offsets + (size_t)b * sizeof(int32_t));
    a.block_table = (const int32_t *)ex_ptr(sv->pool.dtable + (size_t)b * MAX_PAGES * sizeof(int32_t));
    return a;
}

/* A decode step over every slot; kv_len is the longest sequence's length
 * (with --graph the longest a sequence can grow, MAX_KV). q and out are
 * [MAX_BATCH][HQ][1][D]: with one query per sequence, BHSD and BSHD are
 * the same, so the strides stay zero. */
static fg_attention_args decode_args(const server *sv, int kv_len) {
    fg_attention_args a = paged_args(sv);
    a.batch = MAX_BATCH, a.q_len = 1, a.kv_len = kv_len;
    a.q = ex_ptr(sv->d_step_q), a.out = ex_ptr(sv->d_step_out), a.lse = (float *)ex_ptr(sv->d_step_lse);
    a.kv_lens = (const int32_t *)ex_ptr(sv->pool.dkv_lens);
    a.q_offsets = (const int32_t *)ex_ptr(sv->pool.dq_offsets);
    a.block_table = (const int32_t *)ex_ptr(sv->pool.dtable);
    a.workspace = ex_ptr(sv->d_workspace), a.workspace_size = sv->workspace_size;
    return a;
}

/* The host view of a call for the reference: the host mirror of the pool
 * and the host table, the slot's own length and offset. One slot at a time
 * (batch 1) keeps the reference cheap; the mod sees b = 0 there instead of
 * the slot, which this mod never reads. */
static fg_attention_args host_view(const server *sv, fg_attention_args a, int b) {
    a.k = sv->pool.k, a.v = sv->pool.v;
    a.kv_lens = &sv->pool.kv_lens[b];
    a.q_offsets = &sv->pool.q_offsets[b];
    a.block_table = sv->pool.table[b];
    a.lse = NULL;
    return a;
}

static const char *kind_name(fg_kernel_kind kind) {
    switch (kind) {
    case FG_KERNEL_ATTENTION_DECODE: return "the decode kernel";
    case FG_KERNEL_ATTENTION_FWD: return "the forward kernel";
    case FG_KERNEL_ATTENTION_FWD_SM90: return "the Hopper forward kernel";
    default: return "another kernel";
    }
}

static void print_stats(const char *when) {
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    printf("cache %-22s compiled %llu, disk hits %llu, memory hits %llu\n", when,
           (unsigned long long)s.misses, (unsigned long long)s.disk_hits,
           (unsigned long long)s.memory_hits);
}

static uint64_t fetched(void) {
    fg_cache_stats s;
    fg_cache_get_stats(&s);
    return s.misses + s.disk_hits;
}

/* The CPU evaluator on one query row: which keys does position `pos` see? */
static int show_row(fg_ctx *ctx, const fg_mod *mod, const fg_binding *window, int pos) {
    int rc = 1, first = -1, last = -1;
    uint8_t *row = malloc((size_t)pos + 1);
    EX_REQUIRE(row, "out of host memory");
    EX_TRY(ctx, fg_mod_eval_mask(ctx, mod, window, 1, 0, 0, pos, 1, 0, pos + 1, row));
    for (int j = 0; j <= pos; j++)
        if (row[j]) last = j, first = first < 0 ? j : first;
    printf("the query at position %d sees keys %d..%d\n", pos, first, last);
    rc = 0;
done:
    free(row);
    return rc;
}

/* The every-row check of one slot of a decode step: a running sequence's
 * output and LSE finite, an empty slot's output 0 and LSE -inf. */
static int slot_rows_ok(const server *sv, int b) {
    const uint16_t *o = sv->step_out + (size_t)b * HQ * D;
    const float *l = sv->step_lse + (size_t)b * HQ;
    for (int h = 0; h < HQ; h++) {
        if (sv->seq[b].active ? !isfinite(l[h]) : !(isinf(l[h]) && l[h] < 0)) return 0;
        for (int d = 0; d < D; d++) {
            const float x = ex_float(o[h * D + d]);
            if (sv->seq[b].active ? !isfinite(x) : x != 0.0f) return 0;
        }
    }
    return 1;
}

/* ---- --graph ------------------------------------------------------------------ */

/* The host time of n plain calls with the arguments the graph captures,
 * added up in *host_ms: what a step costs the host without the graph. Each
 * call finds the GPU idle, as a step of the loop does. */
static int time_plain_calls(server *sv, const fg_attention_args *a, int n, double *host_ms) {
    int rc = 1, ok = 0;
    *host_ms = 0;
    for (int i = 0; i < n; i++) {
        const double h0 = ex_now_ms();
        EX_TRY(sv->ctx, fg_attention_forward(sv->ctx, sv->mod, a));
        *host_ms += ex_now_ms() - h0;
        EX_REQUIRE(ex_sync(), "--graph: a plain decode call failed on the GPU");
    }
    ok = 1;
done:
    (void)rc; /* set by EX_TRY / EX_REQUIRE, which have reported already */
    return ok;
}

/* The decode step's attention call `a` (on sv->graph_stream) captured into
 * sv->graph and instantiated as sv->graph_exec. The call runs nothing
 * while captured: its launches are recorded. 1 when done. */
static int capture_decode(server *sv, const fg_attention_args *a) {
    int rc = 1, ok = 0;
    EX_REQUIRE(ex_cu_ok(ex_cu.cuStreamBeginCapture(sv->graph_stream, EX_CU_STREAM_CAPTURE_MODE_GLOBAL),
                        "cuStreamBeginCapture"),
               "--graph: the capture did not begin");
    const fg_status st = fg_attention_forward(sv->ctx, sv->mod, a);
    /* Ended whatever happened, so the stream is not left capturing. After
     * a failure inside the capture the driver returns it invalidated and
     * no graph (a graph it does return is destroyed at the end). */
    const int end = ex_cu.cuStreamEndCapture(sv->graph_stream, &sv->graph);
    if (st != FG_OK) {
        rc = ex_report(sv->ctx, st, "fg_attention_forward (captured into the graph)");
        goto done;
    }
    EX_REQUIRE(ex_cu_ok(end, "cuStreamEndCapture") && sv->graph, "--graph: the capture failed");
    EX_REQUIRE(ex_cu_ok(ex_cu.cuGraphInstantiate(&sv->graph_exec, sv->graph, 0),
                        "cuGraphInstantiateWithFlags"),
               "--graph: the captured graph did not instantiate");
    ok = 1;
done:
    (void)rc;
    return ok;
}

/* ---- the server's work ------------------------------------------------------- */

/* Request r joins empty slot b: its prompt is written into its pages and
 * its attention computed, then its last rows are checked. 1 when done. */
static int prefill(server *sv, int t, int b, request r) {
    int rc = 1, ok = 0;
    kv_pool *pool = &sv->pool;
    sequence *s = &sv->seq[b];
    const int P = r.prompt_len;
    memset(s, 0, sizeof *s);
    s->active = 1, s->req = r, s->pages_needed = pages_for(r.prompt_len + r.gen_target);
    pool->reserved += s->pages_needed;
    pool->q_offsets[b] = 0; /* the prompt starts at position 0 */
    EX_REQUIRE(append_tokens(sv, b, 0, P) && upload_metadata(pool), "prefill: upload failed");
    fill_random(sv->pre_q, (size_t)P * HQ * D, &sv->seed);
    EX_REQUIRE(ex_upload(sv->d_pre_q, sv->pre_q, (size_t)P * HQ * D * 2) &&
                   ex_poison(sv->d_pre_out, (size_t)P * HQ * D * 2) &&
                   ex_poison(sv->d_pre_lse, (size_t)HQ * P * sizeof(float)),
               "prefill: upload failed");

    fg_attention_args a = prefill_args(sv, b, P);
    EX_TRY(sv->ctx, fg_block_table_check(sv->ctx, &a, pool->table[b], &pool->kv_lens[b]));
    ex_timer_begin(&sv->timer);
    EX_TRY(sv->ctx, fg_attention_forward(sv->ctx, sv->mod, &a));
    double ms = ex_timer_end(&sv->timer);
    EX_REQUIRE(ms >= 0, "prefill failed on the GPU");
    sv->prefills++, sv->prefill_tokens += P, sv->prefill_gpu_ms += ms;
    sv->joined++;

    EX_REQUIRE(ex_download(sv->pre_out, sv->d_pre_out, (size_t)P * HQ * D * 2) &&
                   ex_download(sv->pre_lse, sv->d_pre_lse, (size_t)HQ * P * sizeof(float)),
               "prefill: download failed");
    /* every row written: nothing left of the NaN poison */
    ex_checksum sum = ex_checksum_bf16(sv->pre_out, (size_t)P * HQ * D);
    for (int i = 0; i < HQ * P; i++)
        if (!isfinite(sv->pre_lse[i])) sum.nonfinite++;
    /* The last rows against the reference. ex_compare_rows moves q_offset
     * to the first row it checks, and a q_offsets array would override
     * that, so the host view gives the prompt's offset 0 as q_offset. */
    fg_attention_args h = host_view(sv, a, b);
    h.q = sv->pre_q, h.out = sv->pre_out, h.q_offsets = NULL, h.q_offset = 0;
    ex_error e;
    EX_TRY(sv->ctx, ex_compare_rows(sv->ctx, sv->mod, &h, &sv->window, 1, sv->pre_out, sv->pre_lse,
                                    P - CHECK_ROWS, CHECK_ROWS, &e));
    e.nonfinite += sum.nonfinite;
    ex_error_merge(&sv->prefill_err, &e);

    if (event_line(sv)) {
        char pages[96];
        format_pages(pool->table[b], s->pages_held, pages, sizeof pages);
        printf("step %3d: request %2d joins slot %d: prompt %4d, generates %3d, pages %s\n", t, r.id, b, P,
               r.gen_target, pages);
    }
    ok = 1;
done:
    (void)rc; /* set by EX_TRY / EX_REQUIRE, which have reported already */
    return ok;
}

int main(int argc, char **argv) {
    int rc = 1;
    static server sv; /* large: the block table and the free stack */
    fg_mod *mod = NULL;
    fg_kernel *prefill_kernel = NULL, *decode_kernel = NULL;
    kv_pool *pool = &sv.pool;
    const size_t pool_n = (size_t)NUM_PAGES * PAGE_SIZE * ROW;
    const size_t step_n = (size_t)MAX_BATCH * HQ * D, pre_n = (size_t)MAX_PROMPT * HQ * D;
    uint64_t request_seed = 7;
    double plain_host_ms = 0; /* --graph: STEPS - 1 plain calls */

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--graph") != 0) {
            fprintf(stderr, "usage: %s [--graph]\n", argv[0]);
            return 2;
        }
        sv.use_graph = 1;
    }

    EX_TRY(sv.ctx, fg_ctx_create(&sv.ctx));
    EX_TRY(sv.ctx, fg_mod_from_source(sv.ctx, "serving_window.c", MOD_SOURCE, (size_t)-1, &mod));
    sv.mod = mod;
    printf("mod:\n%s\n", fg_mod_canonical(mod));
    sv.window = fg_bind_int("WINDOW", WINDOW);
    if (show_row(sv.ctx, mod, &sv.window, MAX_PROMPT + MAX_GEN - 1)) goto done;

    if (!ex_gpu_open()) {
        ex_no_gpu();
        rc = 0;
        goto done;
    }
    printf("device: %s\n", ex_cu.device_name);

    /* The pool, poisoned: a key read from a row nobody wrote is a NaN. */
    sv.seed = 99;
    pool->k = malloc(pool_n * 2), pool->v = malloc(pool_n * 2);
    sv.step_q = malloc(step_n * 2), sv.step_out = malloc(step_n * 2);
    sv.step_lse = malloc((size_t)MAX_BATCH * HQ * sizeof(float));
    sv.pre_q = malloc(pre_n * 2), sv.pre_out = malloc(pre_n * 2);
    sv.pre_lse = malloc((size_t)HQ * MAX_PROMPT * sizeof(float));
    EX_REQUIRE(pool->k && pool->v && sv.step_q && sv.step_out && sv.step_lse && sv.pre_q && sv.pre_out &&
                   sv.pre_lse,
               "out of host memory");
    memset(pool->k, 0xFF, pool_n * 2), memset(pool->v, 0xFF, pool_n * 2);
    pool->dk = ex_alloc(pool_n * 2), pool->dv = ex_alloc(pool_n * 2);
    pool->dtable = ex_alloc(sizeof pool->table);
    pool->dkv_lens = ex_alloc(sizeof pool->kv_lens), pool->dq_offsets = ex_alloc(sizeof pool->q_offsets);
    sv.d_step_q = ex_alloc(step_n * 2), sv.d_step_out = ex_alloc(step_n * 2);
    sv.d_step_lse = ex_alloc((size_t)MAX_BATCH * HQ * sizeof(float));
    sv.d_pre_q = ex_alloc(pre_n * 2), sv.d_pre_out = ex_alloc(pre_n * 2);
    sv.d_pre_lse = ex_alloc((size_t)HQ * MAX_PROMPT * sizeof(float));
    EX_REQUIRE(pool->dk && pool->dv && pool->dtable && pool->dkv_lens && pool->dq_offsets && sv.d_step_q &&
                   sv.d_step_out && sv.d_step_lse && sv.d_pre_q && sv.d_pre_out && sv.d_pre_lse,
               "out of device memory");
    EX_REQUIRE(ex_poison(pool->dk, pool_n * 2) && ex_poison(pool->dv, pool_n * 2), "cuMemsetD8 failed");
    EX_REQUIRE(ex_timer_create(&sv.timer), "no CUDA events");
    if (sv.use_graph) {
        EX_REQUIRE(ex_cuda_has_graphs(), "--graph: libcuda lacks the stream capture entry points "
                                         "(CUDA 11.4 has them)");
        EX_REQUIRE(ex_cu_ok(ex_cu.cuStreamCreate(&sv.graph_stream, EX_CU_STREAM_DEFAULT), "cuStreamCreate"),
                   "--graph: no stream");
    }
    /* Every page free, page 0 on top; every table entry empty. */
    for (int i = 0; i < NUM_PAGES; i++) pool->free_pages[i] = NUM_PAGES - 1 - i;
    pool->nfree = NUM_PAGES;
    for (int b = 0; b < MAX_BATCH; b++)
        for (int i = 0; i < MAX_PAGES; i++) pool->table[b][i] = -1;
    pool->table_changed = 1;
    EX_REQUIRE(upload_metadata(pool), "upload failed");
    printf("KV pool: %d pages of %d tokens x %d KV heads x %d (bf16), %.1f MiB each for K and V; %d slots "
           "of up to %d pages (%d tokens); %d query heads\n",
           NUM_PAGES, PAGE_SIZE, HKV, D, pool_n * 2 / 1048576.0, MAX_BATCH, MAX_PAGES, MAX_PAGES * PAGE_SIZE,
           HQ);

    /* The kernels, fetched once: compiled, or loaded from the disk cache
     * of an earlier run. Which one serves a call depends on its shapes
     * (q_len above all), not on lengths, offsets or the table. */
    /* The decode step's workspace (its split walk's parts), once, for the
     * longest a sequence can grow: the call never allocates. */
    fg_attention_args wa = decode_args(&sv, MAX_KV);
    EX_TRY(sv.ctx, fg_attention_workspace_size(sv.ctx, mod, &wa, &sv.workspace_size));
    if (sv.workspace_size) {
        sv.d_workspace = ex_alloc(sv.workspace_size);
        EX_REQUIRE(sv.d_workspace, "out of device memory");
    }
    printf("decode workspace: %.1f KiB, allocated once\n", sv.workspace_size / 1024.0);
    fg_cache_reset_stats();
    fg_attention_args pa = prefill_args(&sv, 0, MAX_PROMPT), da = decode_args(&sv, 1);
    double t0 = ex_now_ms();
    EX_TRY(sv.ctx, fg_attention_kernel_for(sv.ctx, mod, &pa, &prefill_kernel));
    EX_TRY(sv.ctx, fg_attention_kernel_for(sv.ctx, mod, &da, &decode_kernel));
    printf("kernels fetched in %.1f ms: a prefill (q_len = prompt) runs %s, a decode step (q_len = 1) "
           "%s\n",
           ex_now_ms() - t0, kind_name(fg_kernel_kind_of(prefill_kernel)),
           kind_name(fg_kernel_kind_of(decode_kernel)));
    print_stats("after the fetch:");
    const uint64_t fetched_before_loop = fetched();

    request waiting = next_request(&request_seed);
    int waiting_reported = -1, check_slot = -1, decode_checks = 0, empty_slot_steps = 0;
    int min_kv = 1 << 30, max_kv = 0;
    long long tokens = 0, timed_tokens = 0;
    double gpu_ms = 0, host_ms = 0;
    for (int t = 0; t < STEPS; t++) {
        /* Joins: requests in arrival order, while a slot is free and the
         * pool can promise the head of the queue its whole life. */
        for (int b = 0; b < MAX_BATCH; b++) {
            if (sv.seq[b].active) continue;
            const int need = pages_for(waiting.prompt_len + waiting.gen_target);
            if (pool->nfree - pool->reserved < need) {
                if (waiting_reported != waiting.id) {
                    waiting_reported = waiting.id, sv.waited++;
                    if (event_line(&sv))
                        printf("step %3d: request %2d waits: needs %d pages, %d free, %d of them promised\n",
                               t, waiting.id, need, pool->nfree, pool->reserved);
                }
                break;
            }
            if (!prefill(&sv, t, b, waiting)) goto done;
            waiting = next_request(&request_seed);
        }

        /* The newest token of every running sequence goes into its pages;
         * its query sits at the last position. */
        int batch_kv = 1, running = 0;
        for (int b = 0; b < MAX_BATCH; b++) {
            sequence *s = &sv.seq[b];
            if (!s->active) {
                empty_slot_steps++;
                continue;
            }
            EX_REQUIRE(append_tokens(&sv, b, s->kv_len, s->kv_len + 1), "decode: upload failed");
            pool->q_offsets[b] = s->kv_len - 1;
            batch_kv = s->kv_len > batch_kv ? s->kv_len : batch_kv;
            min_kv = s->kv_len < min_kv ? s->kv_len : min_kv;
            max_kv = s->kv_len > max_kv ? s->kv_len : max_kv;
            running++;
        }
        fill_random(sv.step_q, step_n, &sv.seed);
        EX_REQUIRE(upload_metadata(pool) && ex_upload(sv.d_step_q, sv.step_q, step_n * 2) &&
                       ex_poison(sv.d_step_out, step_n * 2) &&
                       ex_poison(sv.d_step_lse, (size_t)MAX_BATCH * HQ * sizeof(float)),
                   "decode: upload failed");

        /* --graph: the arguments the graph bakes in (see above), on its
         * stream; without it the step's longest length, default stream. */
        fg_attention_args a = decode_args(&sv, sv.use_graph ? MAX_KV : batch_kv);
        a.stream = sv.graph_stream;
        EX_TRY(sv.ctx, fg_block_table_check(sv.ctx, &a, &pool->table[0][0], pool->kv_lens));
        ex_timer_begin(&sv.timer);
        double h0 = ex_now_ms();
        if (sv.graph_exec)
            EX_REQUIRE(ex_cu_ok(ex_cu.cuGraphLaunch(sv.graph_exec, sv.graph_stream), "cuGraphLaunch"),
                       "decode step %d: the graph did not launch", t);
        else
            EX_TRY(sv.ctx, fg_attention_forward(sv.ctx, mod, &a));
        double h1 = ex_now_ms();
        double ms = ex_timer_end(&sv.timer);
        EX_REQUIRE(ms >= 0, "decode step %d failed on the GPU", t);
        tokens += running;
        if (t > 0) gpu_ms += ms, host_ms += h1 - h0, timed_tokens += running;

        /* Every row of every slot, then (every CHECK_EVERY steps) one
         * running sequence in turn against the reference. */
        EX_REQUIRE(ex_download(sv.step_out, sv.d_step_out, step_n * 2) &&
                       ex_download(sv.step_lse, sv.d_step_lse, (size_t)MAX_BATCH * HQ * sizeof(float)),
                   "decode: download failed");
        for (int b = 0; b < MAX_BATCH; b++)
            if (!slot_rows_ok(&sv, b)) sv.bad_rows += HQ;
        for (int i = 1; t % CHECK_EVERY == 0 && i <= MAX_BATCH; i++) {
            const int b = (check_slot + i) % MAX_BATCH;
            if (!sv.seq[b].active) continue;
            fg_attention_args h = host_view(&sv, a, b);
            h.batch = 1, h.kv_len = sv.seq[b].kv_len;
            h.q = sv.step_q + (size_t)b * HQ * D, h.out = sv.step_out;
            ex_error e;
            EX_TRY(sv.ctx, ex_compare_rows(sv.ctx, mod, &h, &sv.window, 1, sv.step_out + (size_t)b * HQ * D,
                                           sv.step_lse + (size_t)b * HQ, 0, 1, &e));
            ex_error_merge(&sv.decode_err, &e);
            check_slot = b, decode_checks++;
            break;
        }

        /* --graph: step 0 was the ordinary call (its results checked
         * above); the plain calls timed for comparison, then the capture.
         * Both overwrite out and lse, which the next step poisons. */
        if (sv.use_graph && !sv.graph_exec) {
            if (!time_plain_calls(&sv, &a, STEPS - 1, &plain_host_ms) || !capture_decode(&sv, &a)) goto done;
            printf("step %3d: the decode step's attention captured into a CUDA graph (kv_len %d); "
                   "steps 1..%d replay it\n",
                   t, MAX_KV, STEPS - 1);
        }

        /* Departures: their pages go back to the pool. */
        for (int b = 0; b < MAX_BATCH; b++) {
            sequence *s = &sv.seq[b];
            if (!s->active || ++s->generated < s->req.gen_target) continue;
            if (event_line(&sv))
                printf("step %3d: request %2d leaves slot %d: %4d tokens, %3d pages back to the pool\n", t,
                       s->req.id, b, s->kv_len, s->pages_held);
            release_slot(pool, s, b);
            sv.finished++;
        }
    }

    printf("decode: %d steps over %d slots, %lld tokens generated, KV lengths %d..%d, window %d\n", STEPS,
           MAX_BATCH, tokens, min_kv, max_kv, WINDOW);
    if (!sv.use_graph) {
        printf("  steps 1..%d: %.3f ms GPU per step, %.1f us host per fg_attention_forward, %.0f tokens/s "
               "(attention of one layer, GPU time)\n",
               STEPS - 1, gpu_ms / (STEPS - 1), 1e3 * host_ms / (STEPS - 1),
               gpu_ms > 0 ? timed_tokens / (gpu_ms * 1e-3) : 0.0);
    } else {
        printf("  steps 1..%d: %.3f ms GPU per step (graph replays), %.0f tokens/s (attention of one layer, "
               "GPU time)\n",
               STEPS - 1, gpu_ms / (STEPS - 1), gpu_ms > 0 ? timed_tokens / (gpu_ms * 1e-3) : 0.0);
        printf("  host per decode step: %.1f us fg_attention_forward (%d plain calls after step 0), %.1f us "
               "cuGraphLaunch (steps 1..%d)\n",
               1e3 * plain_host_ms / (STEPS - 1), STEPS - 1, 1e3 * host_ms / (STEPS - 1), STEPS - 1);
    }
    printf("prefill: %d prompts, %lld tokens, %.2f ms GPU, %.0f tokens/s\n", sv.prefills, sv.prefill_tokens,
           sv.prefill_gpu_ms, sv.prefill_gpu_ms > 0 ? sv.prefill_tokens / (sv.prefill_gpu_ms * 1e-3) : 0.0);
    printf("requests: %d joined, %d finished, %d waited for pages; %d slot-steps empty\n", sv.joined,
           sv.finished, sv.waited, empty_slot_steps);

    /* The pool now: how scattered the running sequences' pages are. */
    int in_use = 0, running = 0, breaks = 0, links = 0;
    for (int b = 0; b < MAX_BATCH; b++) {
        const sequence *s = &sv.seq[b];
        if (!s->active) continue;
        running++, in_use += s->pages_held;
        for (int i = 1; i < s->pages_held; i++, links++)
            if (pool->table[b][i] != pool->table[b][i - 1] + 1) breaks++;
    }
    printf("pool at the end: %d pages in use by %d sequences, %d free (%d of them promised); %d of %d "
           "neighbouring pages of a sequence are not neighbours in the pool\n",
           in_use, running, pool->nfree, pool->reserved, breaks, links);
    print_stats("after the last step:");

    /* Every page back, each exactly once. */
    for (int b = 0; b < MAX_BATCH; b++)
        if (sv.seq[b].active) release_slot(pool, &sv.seq[b], b);
    static unsigned char seen[NUM_PAGES];
    int pool_ok = pool->nfree == NUM_PAGES && pool->reserved == 0;
    for (int i = 0; pool_ok && i < NUM_PAGES; i++) {
        const int32_t p = pool->free_pages[i];
        pool_ok = p >= 0 && p < NUM_PAGES && !seen[p];
        if (pool_ok) seen[p] = 1;
    }

    printf("vs CPU reference: prefill (last %d rows of %d prompts): out rel err %.2e, lse err %.2e, "
           "non-finite %zu\n",
           CHECK_ROWS, sv.prefills, sv.prefill_err.out_rel, sv.prefill_err.lse_max, sv.prefill_err.nonfinite);
    printf("                  decode (one sequence every %d steps, %d checks): out rel err %.2e, lse err "
           "%.2e, non-finite %zu\n",
           CHECK_EVERY, decode_checks, sv.decode_err.out_rel, sv.decode_err.lse_max, sv.decode_err.nonfinite);
    printf("every row of every step (finite; empty slots 0 and LSE -inf): %zu rows wrong\n", sv.bad_rows);
    EX_REQUIRE(ex_error_ok(&sv.prefill_err) && ex_error_ok(&sv.decode_err), "FAILED: outside tolerance");
    EX_REQUIRE(sv.bad_rows == 0, "FAILED: rows not written, not finite, or empty slots not 0 / -inf");
    EX_REQUIRE(pool_ok, "FAILED: the pool lost or duplicated a page");
    EX_REQUIRE(fetched() == fetched_before_loop,
               "FAILED: a prefill or decode step compiled or loaded a kernel");
    printf("OK: every prefill and decode step found its kernel in memory; all %d pages back in the pool\n",
           NUM_PAGES);
    rc = 0;

done:
    /* The stream drained first: an error may leave a replay running. */
    if (sv.graph_stream) ex_cu_ok(ex_cu.cuStreamSynchronize(sv.graph_stream), "cuStreamSynchronize");
    if (sv.graph_exec) ex_cu_ok(ex_cu.cuGraphExecDestroy(sv.graph_exec), "cuGraphExecDestroy");
    if (sv.graph) ex_cu_ok(ex_cu.cuGraphDestroy(sv.graph), "cuGraphDestroy");
    if (sv.graph_stream) ex_cu_ok(ex_cu.cuStreamDestroy(sv.graph_stream), "cuStreamDestroy");
    fg_kernel_release(prefill_kernel);
    fg_kernel_release(decode_kernel);
    ex_timer_destroy(&sv.timer);
    ex_free(pool->dk), ex_free(pool->dv), ex_free(pool->dtable), ex_free(pool->dkv_lens);
    ex_free(pool->dq_offsets);
    ex_free(sv.d_step_q), ex_free(sv.d_step_out), ex_free(sv.d_step_lse), ex_free(sv.d_workspace);
    ex_free(sv.d_pre_q), ex_free(sv.d_pre_out), ex_free(sv.d_pre_lse);
    free(pool->k), free(pool->v);
    free(sv.step_q), free(sv.step_out), free(sv.step_lse);
    free(sv.pre_q), free(sv.pre_out), free(sv.pre_lse);
    fg_mod_destroy(mod);
    fg_ctx_destroy(sv.ctx);
    return rc;
}
