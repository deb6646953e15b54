/*
 * attention_decode.cuh -- the decode kernel (portable, sm_80 and newer):
 * few queries per sequence against a long KV cache, contiguous or paged,
 * with the KV walk split over thread blocks and the partial results merged
 * exactly afterwards.
 *
 * Why a kernel of its own. A decode step has one to a few queries per
 * sequence, so the forward kernel's 128-row q tiles are nearly empty and its
 * grid (q tiles x heads x batch) is a few dozen thread blocks on a GPU of
 * 132 SMs: it reads K and V once per query head and leaves most of the
 * memory system idle. Decoding is bound by reading the KV cache, and this
 * kernel is shaped for that:
 *   - Packing. The query heads that share a KV head (the GQA group) and the
 *     queries of a sequence become the rows of one tile: packed row
 *     r = g * q_len + i is query i of head hkv * group + g. Every K/V byte
 *     is then read once per group instead of once per query head.
 *   - Split. The KV walk of each (sequence, KV head, row tile) is cut into
 *     n_split ranges of tiles, one thread block each, so the grid fills the
 *     GPU whatever the batch; each block leaves its rows normalised with
 *     their LSE, and fg_attention_decode_merge combines the n_split parts of
 *     each row exactly: out = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M)
 *     with M the largest lse_s (log2 units), LSE = M + log2 of that sum.
 *     With n_split 1 the block writes out and lse itself; with 2 to 8 on a
 *     Hopper GPU the splits of a walk are one thread block cluster and
 *     merge the same way among themselves (fgd_cluster_sync).
 *   - Warps along KV. Four warps (eight in the -pairs walk of 32 rows over
 *     128-row tiles); each 16-row slab of the tile's packed rows is shared
 *     by WK warps that each take a quarter (WK 4), half (WK 2) or all (WK 1)
 *     of each K/V tile, so small row counts do not leave warps idle.
 *     Each warp keeps its own online softmax (attention_common.cuh) over the
 *     rows x its columns; at the end the warps' (m, l, O) are merged in
 *     shared memory the same way the splits are. Three entry points, one
 *     per tile height: fg_attention_decode_r16 (16 rows), _r32, _r64.
 *   - Memory. K/V tiles of FGD_BLOCK_N rows (64; 128 at walk rows of 128
 *     and under with kv blocks of a multiple of 128: fgi_dec_block_n) stream
 *     through FGD_STAGES stages of cp.async (wait for tile t, refill the
 *     stage of tile t - 1 with tile t + FGD_STAGES - 1), so several tiles
 *     per block are always in flight;
 *     shared memory is sized so that two blocks fit on an SM up to head dim
 *     128; rows are unpadded with their 16-byte chunks swizzled (fgd_at).
 *     Q is loaded once into the last stage before the walk starts and
 *     kept in registers (head dim 256: in a shared region of its own).
 *     At walk rows of 128, K and V take turns in a ring of slots instead
 *     (FGD_KV_RING).
 *   - Pipelined (FGD_PIPE_S, 64-row tiles of 256-byte rows: head dim 128,
 *     or 64 in pairs): step t waits for tile t + 1
 *     instead and issues its Q K^T before tile t's softmax and P V, so
 *     each warp has two independent chains in flight.
 *   - KV heads in pairs (FG_HEAD_PAIRS, head dim 64, a cache whose two
 *     neighbouring KV heads' rows lie side by side: the paged
 *     [page, row, KV head, d] layout). In such a cache a head's 128-byte
 *     rows sit 1 KB apart, between the other heads' rows, which other
 *     blocks read at other times, and the DRAM serves that at 85% of its
 *     peak against 88% for rows back to back (bench/attention_notes.md,
 *     decode d17). Here a block walks a pair of KV heads: the host passes
 *     the head stride doubled, so each K/V row of the walk is the pair's two
 *     rows, 128 columns (256 bytes), and the walk is the head-dim-128 one.
 *     The tile's rows are the pair's query heads (the group passed is
 *     twice the heads' own); each row's Q fills its KV head's half of the
 *     columns and is zero in the other, so Q K^T gives it its own head's
 *     scores, and it keeps its half of P V. With more than 8 rows a head
 *     9 to 16 rows a head take the walk of 32 rows, each head's rows padded
 *     to 16 (plan_decode), so every warp's 16 rows are one head's; a warp
 *     then runs that head's half of the columns only (HALF), the products
 *     of the one-head walk, at eight warps, a warp the one-head walk's
 *     share of a tile (decode d31-d34). With 8 or fewer (one query, a
 *     group of 4) the two heads share the 16-row slab, and with more than
 *     16 the 64-row walk's slabs may mix them: their products double (half
 *     of each is zeros). The element loop runs once per pair
 *     instead of once per head, and the bytes read are the same.
 *
 * Positions. Query i of sequence b sees q_idx = q_offsets[b] + i (or
 * q_offset + i), key j sees kv_idx = kv_offset + j for j < kv_lens[b] (or
 * kv_len); keys past a sequence's length are masked and the mods are never
 * called there (indices are clamped into range before the call, as in the
 * forward). A block mask applies as in the forward: its row is the one of
 * the tile's first local query row (the host takes the decode path with a
 * block mask only when every row of a tile reads that one row), partial
 * blocks evaluate mask_mod, full ones skip it. mask_mod and score_mod are
 * called whole per score: the packed rows of one tile may belong to
 * different heads, so the forward's head/row/column split does not apply,
 * and decoding is bound by memory, not by the element loop.
 *
 * Paged K/V. With `paged`, key j of sequence b is row j & (page - 1) of page
 * block_table[b][j >> page_shift], at k + page * k_stride[0] + hkv *
 * k_stride[1] + row * k_stride[2]. A table entry outside [0, num_pages) --
 * or a key past max_pages pages -- is never dereferenced: its rows are
 * zero-filled in shared memory and masked like keys past the length, so a
 * bad page costs its keys, never a read outside the cache (the host offers
 * fg_block_table_check to find such entries before a call).
 *
 * Fully masked rows (or empty sequences) end with l = 0: output 0 and LSE
 * -inf, and the merge gives a part with LSE -inf weight 0.
 */

/* A walk's warps are its entry's launch geometry (FG_LAUNCH_THREADS_<entry>,
 * decode_geometry): four, or eight for the -pairs walk of 32 rows over
 * 128-row tiles; the functions of the walk take the thread count NT. */
#define FGD_BLOCK_N FG_LAUNCH_BLOCK_N_fg_attention_decode_r16 /* K/V rows per tile: 64 or 128 */
#ifdef FG_HEAD_PAIRS
#define FGD_PAIRS 1
#else
#define FGD_PAIRS 0
#endif
#define FGD_OUT_D FG_HEAD_DIM                    /* a query head's output row      */
#define FGD_D (FG_HEAD_DIM * (FGD_PAIRS ? 2 : 1)) /* the walk's K/V row (pairs: two heads') */
#define FGD_ROW FGD_D                /* shared row, in elements (swizzled) */
#define FGD_CHUNKS (FGD_D / 8)       /* 16-byte chunks per row             */
#define FGD_KSTEPS (FGD_D / 16)
#define FGD_DTILES (FGD_D / 8)
/* Head dim 64 with 128-row tiles: two stages (64 KB), so without
 * FGD_PIPE_S; against three with it, +0.5-2% at B=1, +3-4% on short
 * sliding-window walks, every contiguous row level or ahead (H200,
 * bench/attention_notes.md, decode d40). The host keeps such a walk at
 * two blocks an SM (decode_geometry): with room for a third, softcap
 * B=8 lost 13%, most likely its split walks' clusters packed onto fewer
 * SMs. */
#if FGD_D <= 64
#define FGD_STAGES (FGD_BLOCK_N == 64 ? 5 : 2)
#elif FGD_D <= 128
#define FGD_STAGES 3
#else
#define FGD_STAGES 2
#endif
#define FGD_Q_IN_REGS (FGD_D <= 128)
/* A tile holds 16 KB of K or more (head dim 128 and over, or 64 with
 * 128-row tiles): where the walk's per-tile work is worth overlapping
 * (FGD_PIPE_S, FGD_PAGE_AHEAD). */
#define FGD_TILE_16K (FGD_D * FGD_BLOCK_N * 2 >= 16384)
/* The walk software-pipelined by one tile (fgd_decode) where a tile holds
 * 16 KB of K: at head dim 128 +1-7%; at head dim 64 with 64-row tiles
 * within +-1.5%, with 128-row tiles (three stages) +1-2% contiguous and
 * paged 64 +4-10% over 64-row tiles without it (bench/attention_notes.md,
 * decode d8, d15), but two stages without it did better still (d40); it
 * needs a stage beyond the two in use, which head dim 256 and 64 with
 * 128-row tiles do not have. */
/* The K/V ring (FGD_KV_RING): 128-row tiles at walk rows of 128 (head dim
 * 128, or 64 in pairs) with K and V as units of their own in three 32 KB
 * slots (unit 2t is K of tile t, 2t + 1 its V, in slot u % 3), so a block
 * holds what three stages of 64-row tiles held and two blocks still fit an
 * SM. Step t waits for K_t, refills V_{t-1}'s slot with K_{t+1}, makes S_t
 * and its softmax, waits for V_t, refills K_t's slot with V_{t+1} and adds
 * P V: two barriers per 128 keys, as there were per 64, and half the
 * softmax steps and row reductions. Against 64-row tiles in three stages
 * with FGD_PIPE_S: paged 16 +1.3-2.5%, the -pairs walk at head dim 64
 * +2-2.2% (paged 16) and +0.8-1.3% (64), contiguous level to +0.6%
 * (bench/attention_notes.md, decode d26). */
#define FGD_KV_RING (FGD_D > 64 && FGD_D <= 128 && FGD_BLOCK_N == 128)
#define FGD_PIPE_S (FGD_TILE_16K && FGD_STAGES >= 3 && !FGD_KV_RING)
/* Blocks resident per SM, as the stages' shared memory allows (the host's
 * split count assumes the same): the register budget ptxas may use. */
#define FGD_BLOCKS_PER_SM (FGD_D <= 128 ? 2 : 1)
#define FGD_KV_BYTES (FGD_BLOCK_N * FGD_ROW * 2)  /* one K or V tile       */
#define FGD_STAGE_BYTES (2 * FGD_KV_BYTES)
#define FGD_BUF_BYTES (FGD_KV_RING ? 3 * FGD_KV_BYTES : FGD_STAGES * FGD_STAGE_BYTES) /* the stages or the ring */

static_assert(FGD_BLOCK_N == 64 || FGD_BLOCK_N == 128, "decode tiles of 64 or 128 K/V rows");
/* A walk's shared memory with NW warps (decode_geometry's, checked at each
 * entry): the stages, Q's region over head dim 128, the warps' row maxima
 * and sums, the rows' LSEs. */
/* Q in registers where the walk rows are 128 columns or fewer and four
 * warps share a block; else Q stays in a shared region past the stages, of
 * 64 rows (head dim 256) or the tile's (eight warps: their 128 registers a
 * thread do not hold Q's fragments beside the walk's). */
#define FGD_Q_REGS(NW) (FGD_Q_IN_REGS && (NW) <= 4)
#define FGD_Q_BYTES(NW, RB) (FGD_Q_REGS(NW) ? 0 : (FGD_Q_IN_REGS ? (RB) : 64) * FGD_ROW * 2)
#define FGD_SMEM_BYTES(NW, RB) (FGD_BUF_BYTES + FGD_Q_BYTES(NW, RB) + (2 * (NW) * 16 + 64) * 4)

/* Shared K, V and Q rows are unpadded, their 16-byte chunks swizzled:
 * logical chunk c of row r lies at chunk c ^ (r & 7). The eight rows an
 * ldmatrix reads then fall on eight different 16-byte bank groups, and a
 * copy's eight threads that read one 128-byte line of a global row write
 * one aligned 128-byte line of shared memory. With rows padded by 16 bytes
 * instead (the first layout), row r started 16 r bytes into a shared line,
 * so a global line's eight chunks mostly landed in two shared lines: the
 * L1 split each warp's copy into about 7 wavefronts instead of 4 and
 * fetched 1.5 times the sectors from L2 (ncu, bench/attention_notes.md,
 * decode d9). fgd_at gives the byte offset of (row, logical chunk). */
static_assert(FGD_CHUNKS >= 8, "fgd_at swizzles a row's chunks by row & 7: rows of 8 chunks or more (decode_check)");
static __device__ __forceinline__ fg_u32 fgd_at(int row, int chunk) {
    return (fg_u32)((row * FGD_ROW + ((chunk ^ (row & 7)) << 3)) * 2);
}
/* An address in fgd_smem from `at`, a lane's address of (row, c0) in a
 * region that starts on a multiple of a row's bytes (fgd_smem is
 * 1024-aligned, every stage, ring slot and Q region a multiple of 8 KB):
 * `rows` rows on, its swizzled chunk's bits flipped by `flip`. A chunk's
 * bits lie below the row's, so that is one XOR and an add -- where the
 * compiler made each ldmatrix's or copy's swizzle again from the thread
 * index (the -pairs ring did, in its tile loop). The callers' identities:
 *   (row + 16 m, c0 + d), d sharing no bit with c0 (d an even step of an
 *   unrolled loop, c0 a lane's 0 / 1 plus a half's chunks): rows 16 m,
 *   flip d (row & 7 does not change, and c0 + d = c0 ^ d);
 *   (r0 + i, c) for i < RUN, r0 a multiple of RUN (a power of two): rows
 *   i, flip i & 7 ((r0 + i) & 7 = (r0 & 7) ^ (i & 7)). */
static_assert(FGD_KV_BYTES % 1024 == 0 && FGD_ROW * 2 <= 1024, "fgd_at_step: regions on multiples of a row's bytes");
static __device__ __forceinline__ fg_u32 fgd_at_step(fg_u32 at, int rows, int flip) {
    return (at ^ (fg_u32)(flip << 4)) + (fg_u32)(rows * FGD_ROW * 2);
}

/* 16 bytes global -> shared. With FG_L2_PREFETCH (the host's choice per
 * device, FG_OPT_DECODE_L2_PREFETCH) each copy also asks the L2 for the
 * surrounding 256 bytes (PREFETCH 256) or its 128-byte line (PREFETCH 128:
 * a paged cache's rows under 256 bytes, whose neighbours in the cache are
 * another KV head's rows, FGD_PAGED_PREFETCH); without it, fga_cp16.
 * K/V rows are read once, front to back: fetching the rest of a row
 * pair's sectors early measured 1-2% faster on the H100 (decode d1, d9),
 * but on the H200, whose DRAM is 1.45 times faster against the same L2,
 * it made the L2 work about 8% harder per byte read (its throughput at
 * 93% with DRAM's at 85.5%, where cuDNN's kernel, asking for no prefetch,
 * reads at 92%) and the walk 2.7-5.2% slower (bench/attention_notes.md,
 * decode d25). */
template <int PREFETCH = 256>
static __device__ __forceinline__ void fgd_cp16(fg_u32 dst, const void *src, bool valid) {
    static_assert(PREFETCH == 128 || PREFETCH == 256, "L2 prefetch of 128 or 256 bytes");
#ifdef FG_L2_PREFETCH
    int n = valid ? 16 : 0;
    if (PREFETCH == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
    else
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
#else
    fga_cp16(dst, src, valid);
#endif
}

/* ---- K/V rows ---------------------------------------------------------------- */

/* Copy the K and V rows of a paged tile [kv0, kv0 + 64) into a stage
 * (`kbase` / `vbase` at page 0 of the KV head, `table` the sequence's row
 * of the block table); rows at or past `len` and rows of bad pages
 * (fga_page_ok) are zero-filled. Returns whether this thread met a bad
 * page. Each thread copies one 16-byte chunk column of RUN consecutive
 * rows (4, 8 or 16 at head dims 64, 128 and 256), starting at a multiple
 * of RUN; a tile starts at a multiple of 64 and a page holds at least 16
 * rows, a multiple of RUN, so a thread's rows lie in one page: it reads
 * and checks one table entry per tile and makes one address per page,
 * then steps down the rows by the row stride. (A warp's copy still reads
 * whole rows, RUN rows apart.) Rows r, r + 8, r + 16, ... per thread, the
 * contiguous walk's order, made each row pick its page among the tile's
 * four and two 64-bit addresses: 28% more instructions than the contiguous
 * walk and 4% of its speed at pages of 16 (bench/attention_notes.md,
 * decode d10). Where a tile holds 16 KB of K (head dim 128, or 64 with
 * 128-row tiles) the table entry (fgd_page_of) is read a step before the
 * copy that uses it: read at the copy, its latency stalled the warp before
 * every tile's copies (paged 16 +1-1.5% at head dim 128, +1-2% at 64); with
 * 64-row tiles at head dim 64 reading it ahead measured 1-2% slower
 * (decode d14, d15). */
#define FGD_PAGE_AHEAD FGD_TILE_16K
/* The L2 prefetch of a paged copy: a row's 256 bytes, or its 128-byte
 * line where a row is shorter. In the cache's [page, row, KV head, d]
 * layout the other half of 256 bytes around a 128-byte row is the next KV
 * head's row, which another block reads at another time: asking for the
 * line alone made paged 16 at head dim 64 +1-1.5% (paged 64 flat;
 * bench/attention_notes.md, decode d17). */
#define FGD_PAGED_PREFETCH (FGD_D * 2 >= 256 ? 256 : 128)
/* Rows of a tile each thread of NT copies (a run of rows of one page). */
#define FGD_PAGE_RUN(NTH) (FGD_BLOCK_N / ((NTH) / FGD_CHUNKS))

/* The page of this thread's rows of the tile at kv0 (the table entry), or
 * -1 past `len` or past max_pages pages. */
template <int NTH>
static __device__ __forceinline__ int fgd_page_of(const fga_args &a, const int *table, int kv0, int len) {
    const int j0 = kv0 + threadIdx.x / FGD_CHUNKS * FGD_PAGE_RUN(NTH), pi = j0 >> a.page_shift;
    return j0 < len && pi < a.max_pages ? table[pi] : -1;
}

/* WHICH rows a copy takes: 1 K, 2 V, 3 both (a stage: V FGD_KV_BYTES after
 * K); K, or V alone (a slot of the ring, FGD_KV_RING), at `stage` itself. */
#define FGD_V_AT(WHICH) ((WHICH) & 1 ? FGD_KV_BYTES : 0)

template <int WHICH, int NTH>
static __device__ __forceinline__ bool fgd_load_kv_paged(const fga_args &a, fg_u32 stage, const fg_u16 *kbase,
                                                         const fg_u16 *vbase, int page, int kv0, int len) {
    constexpr int RUN = FGD_PAGE_RUN(NTH);
    static_assert(16 % RUN == 0, "a thread's rows must lie in one page of 16 or more rows");
    const int r0 = threadIdx.x / FGD_CHUNKS * RUN, ch = threadIdx.x % FGD_CHUNKS;
    const int j0 = kv0 + r0, shift = a.page_shift;
    /* fga_page_ok's test, written out (as a call, with a second table
     * read for the CSE to find, it cost paged softcap 3-6%: decode d7) */
    const bool page_ok = page >= 0 && page < a.num_pages;
    const fg_i64 row = j0 & ((1 << shift) - 1);
    const fg_u16 *kr = kbase + (page_ok ? (fg_i64)page * a.k_stride[0] + row * a.k_stride[2] + ch * 8 : 0);
    const fg_u16 *vr = vbase + (page_ok ? (fg_i64)page * a.v_stride[0] + row * a.v_stride[2] + ch * 8 : 0);
    /* Row i of the run is read when i < nv: one compare a row against a
     * constant. The addresses step down the rows by the row stride (an
     * add each, the stride read from the argument block), as the
     * contiguous copy's do; a row made as kr + i * stride cost a 64-bit
     * multiply, the stride reloaded and two moves a row (decode d30).
     * A row not read still passes its own address, with no select: it
     * lies inside the cache, since the run's rows lie in one page, which
     * is the thread's page or, for a bad page or a run past `len`, page 0
     * (kr = kbase); and a copy of 0 source bytes reads nothing. */
    const int nv = page_ok ? len - j0 : 0;
    const fg_i64 ks = a.k_stride[2], vs = a.v_stride[2];
    const fg_u32 d0 = stage + fgd_at(r0, ch);
#pragma unroll
    for (int i = 0; i < RUN; i++) {
        const bool ok = i < nv;
        const fg_u32 d = fgd_at_step(d0, i, i & 7);
        if (WHICH & 1) fgd_cp16<FGD_PAGED_PREFETCH>(d, kr, ok);
        if (WHICH & 2) fgd_cp16<FGD_PAGED_PREFETCH>(d + FGD_V_AT(WHICH), vr, ok);
        if (WHICH & 1) kr += ks;
        if (WHICH & 2) vr += vs;
    }
    return j0 < len && !page_ok;
}

/* Copy K and V rows [kv0, kv0 + 64) into a stage; rows at or past `len`
 * are zero-filled (and with PAGED, rows of bad pages: the return says
 * whether this thread met one). Each thread keeps one 16-byte chunk
 * column and steps down the rows: its first row's addresses are made once
 * a tile (one 64-bit multiply each for K and V), the next rows' by adding
 * STEP rows' stride, so a chunk costs a compare, two selects and an add
 * where it cost a 64-bit multiply of its own (its row's address; a row
 * past `len` reads nothing and is given the base address). */
template <bool PAGED, int WHICH, int NTH>
static __device__ __forceinline__ bool fgd_load_kv(const fga_args &a, fg_u32 stage, const fg_u16 *kbase,
                                                   const fg_u16 *vbase, int page, int kv0, int len) {
    if (PAGED) return fgd_load_kv_paged<WHICH, NTH>(a, stage, kbase, vbase, page, kv0, len);
    constexpr int STEP = NTH / FGD_CHUNKS;
    const int r = threadIdx.x / FGD_CHUNKS, ch = threadIdx.x % FGD_CHUNKS;
    const fg_i64 ks = a.k_stride[2], vs = a.v_stride[2];
    const int j0 = kv0 + r;
    const fg_u16 *kr = kbase + (fg_i64)j0 * ks + ch * 8;
    const fg_u16 *vr = vbase + (fg_i64)j0 * vs + ch * 8;
#pragma unroll
    for (int i = 0; i < FGD_BLOCK_N / STEP; i++) {
        const bool in = j0 + i * STEP < len;
        const fg_u32 d = stage + fgd_at(r + i * STEP, ch);
        if (WHICH & 1) fgd_cp16(d, in ? kr : kbase, in);
        if (WHICH & 2) fgd_cp16(d + FGD_V_AT(WHICH), in ? vr : vbase, in);
        if (WHICH & 1) kr += STEP * ks;
        if (WHICH & 2) vr += STEP * vs;
    }
    return false;
}

/* ---- the rows a thread owns ---------------------------------------------------- */

/* One packed row: whether it exists, its head and the q_idx the mods see
 * (clamped to the last row when it does not exist, so a mod never sees an
 * index out of range), and with kv heads in pairs which half of the walk's
 * 128-wide rows is its KV head's (the host passes the pair's group, twice
 * the heads' own: its first half reads the pair's first head). PADDED
 * (the -pairs walk of 32 rows, HALF): a.rows is two halves of 16, the
 * first head's group x q_len rows, then the second's, each padded to 16
 * (plan_decode), so that each 16-row slab is one head's. */
struct fgd_row_info {
    bool valid;
    int h, q_idx, half;
};

template <bool PADDED>
static __device__ __forceinline__ fgd_row_info fgd_row_of(const fga_args &a, int hk, int qpos, int r) {
    fgd_row_info ri;
    if (PADDED) {
        /* the pair's rows: two halves of a.rows / 2, each its head's group
         * x q_len rows, padded (plan_decode) */
        const int ph = a.rows >> 1, per_head = (a.group >> 1) * a.q_len;
        ri.half = r >= ph;
        const int w = r - ri.half * ph;
        ri.valid = r < a.rows && w < per_head;
        const int ww = min(w, per_head - 1);
        const int g = ww / a.q_len, i = ww - g * a.q_len;
        ri.h = hk * a.group + ri.half * (a.group >> 1) + g;
        ri.q_idx = qpos + i;
    } else {
        ri.valid = r < a.rows;
        const int rr = ri.valid ? r : a.rows - 1;
        const int g = rr / a.q_len, i = rr - g * a.q_len;
        ri.h = hk * a.group + g;
        ri.q_idx = qpos + i;
        ri.half = FGD_PAIRS && g >= (a.group >> 1);
    }
    return ri;
}

/* Local key j of a tile: whether a row may see it at all (inside the
 * sequence and, in a tile that met a bad page, in a good page) and the
 * kv_idx the mods see, clamped into the sequence. */
struct fgd_key {
    bool ok;
    int kv_idx;
};
template <bool PAGED>
static __device__ __forceinline__ fgd_key fgd_key_of(const fga_args &a, const int *table, int j, int len,
                                                      bool bad_tile) {
    bool ok = j < len;
    if (PAGED && bad_tile && ok) ok = fga_page_ok(a, table, j);
    return fgd_key{ok, min(j, len - 1) + a.kv_offset};
}

/* One score v of row ri at key `key`: mask_mod (partial tiles), score_mod,
 * -inf where masked. */
static __device__ __forceinline__ void fgd_mod_score(float &v, const fgd_key &key, const fgd_row_info &ri,
                                                     const fga_args &a, const fg_mod_params &p, int b,
                                                     bool partial) {
    bool keep = key.ok;
    if (FGA_MASK_MOD && partial && keep) keep = fg_mask_mod(p, b, ri.h, ri.q_idx, key.kv_idx);
#if FGA_SCORE_MOD
    /* made for every element and selected, not behind a branch per element
     * (score_mod is total; kv_idx is clamped into the sequence) */
    const float sv = fg_score_mod(p, v * a.scale, b, ri.h, ri.q_idx, key.kv_idx);
    v = keep ? sv : FGA_NEG_INF;
#else
    if (!keep) v = FGA_NEG_INF;
#endif
}

/* Scale, mods and range for this warp's NT n8 fragments of a tile (columns
 * starting at local key j0): with score_mod the values become score_mod(q.k
 * * scale), without it they stay raw q.k (the softmax's multiplier folds
 * the scale in); masked positions, keys past the sequence's length and keys
 * of bad pages (`bad_tile`: only then is the block table read here) become
 * -inf. Rows that do not exist are left as they are: their Q is zero, they
 * never meet the other rows, and they are not written. So a full tile
 * inside the sequence without score_mod -- most of a decode step under a
 * block mask -- needs nothing here. */
template <int NT, bool PAGED>
static __device__ __forceinline__ void fgd_tile_mods(float (&s)[NT][4], const fgd_row_info (&ri)[2],
                                                     const fga_args &a, const fg_mod_params &p, int b,
                                                     int j0, int len, bool partial, bool bad_tile,
                                                     const int *table) {
    if (!FGA_SCORE_MOD && !(FGA_MASK_MOD && partial) && !bad_tile && j0 + NT * 8 <= len) return;
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < NT; i++) {
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const fgd_key key = fgd_key_of<PAGED>(a, table, j0 + i * 8 + t4 * 2 + c, len, bad_tile);
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) fgd_mod_score(s[i][e2 * 2 + c], key, ri[e2], a, p, b, partial);
        }
    }
}

/* ---- the transposed walk: keys as the products' rows ------------------------------ */

/* A tile of 8 packed rows or fewer (one query, a group of up to 8: most
 * decode steps) wastes 12 of the 16 rows of Q K^T's m16 fragments where it
 * has 4. The transposed walk (fgd_decode's TR) makes the keys the rows
 * instead: S^T = K Q^T (m16 = 16 keys, n8 = the tile's 8 rows), and
 * O^T += V^T P^T (m16 = 16 columns of V, n8 the rows, k16 = 16 keys). A
 * warp's 32 keys a tile then take 2 x D/16 products each way instead of
 * 4 x D/16, its softmax runs on 8 values a thread instead of 16, and O^T
 * holds half of O's registers. A thread's accumulator holds two rows
 * (2 * (lane & 3) and the next) of keys or columns lane / 4 and lane / 4
 * + 8; the row maxima and sums are over the lane / 4 groups. P^T reaches
 * the B operand of P V through movmatrix: the accumulator's 8 x 8 halves
 * (keys x rows) are the transposes of the B fragments (rows x keys). */
static __device__ __forceinline__ fg_u32 fgd_movt(fg_u32 x) {
    fg_u32 y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
    return y;
}
/* Over the eight lanes that share lane & 3 (a row of the transposed tile). */
static __device__ __forceinline__ float fgd_keys_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}
static __device__ __forceinline__ float fgd_keys_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 8);
    return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

/* fgd_tile_mods on the transposed tile: MT m16 fragments of keys from
 * local key j0, value s[mt][2 * e + r] at key j0 + mt * 16 + lane / 4 +
 * 8 * e of row ri[r]. */
template <int MT, bool PAGED>
static __device__ __forceinline__ void fgd_tile_mods_t(float (&s)[MT][4], const fgd_row_info (&ri)[2],
                                                       const fga_args &a, const fg_mod_params &p, int b,
                                                       int j0, int len, bool partial, bool bad_tile,
                                                       const int *table) {
    if (!FGA_SCORE_MOD && !(FGA_MASK_MOD && partial) && !bad_tile && j0 + MT * 16 <= len) return;
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const fgd_key key = fgd_key_of<PAGED>(a, table, j0 + mt * 16 + g + 8 * e, len, bad_tile);
#pragma unroll
            for (int r = 0; r < 2; r++) fgd_mod_score(s[mt][2 * e + r], key, ri[r], a, p, b, partial);
        }
    }
}

/* fga_tile_softmax on the transposed tile (ss[0]): row r's values are
 * s[mt][2 * e + r]; its maximum and sum are over the thread's 2 x MT and
 * then the eight lanes of its lane & 3 (the sum stays the thread's share:
 * the walk adds the lanes' shares at its end, as the plain walk adds the
 * quad's). */
template <int MT>
static __device__ __forceinline__ void fgd_tile_softmax_t(float (&ss)[1][MT][4], float (&m_run)[2], float (&l_run)[2],
                                                          float (&alpha)[2], float mult) {
    mult = fga_tile_prescale(ss, mult);
    float (&s)[MT][4] = ss[0];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = FGA_NEG_INF;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) mx = fmaxf(mx, fmaxf(s[mt][r], s[mt][2 + r]));
        const float m_use = fga_row_max_step(m_run[r], fgd_keys_max(mx) * mult, alpha[r]);
        float sum = 0.f;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            s[mt][r] = fga_exp2(fmaf(s[mt][r], mult, -m_use));
            s[mt][2 + r] = fga_exp2(fmaf(s[mt][2 + r], mult, -m_use));
            sum += s[mt][r] + s[mt][2 + r];
        }
        l_run[r] = l_run[r] * alpha[r] + sum;
    }
}

/* ---- the splits of a walk as one cluster (sm_90 and newer) ----------------------- */

/* Where the host launches a walk's n_split blocks as one thread block
 * cluster (2 to 8 splits, a Hopper GPU, this code compiled for it), the
 * blocks merge their parts among themselves through distributed shared
 * memory instead of writing them for fg_attention_decode_merge: after every
 * block has its rows (the warps' parts in `red`, the LSEs in sm_lse) the
 * cluster meets at a barrier, each block merges a share of the rows from
 * every block's shared memory and writes them, and a second barrier keeps
 * each block's shared memory alive until the others have read it. A merge
 * launch costs a step 4-7 us (bench/attention_notes.md, decode d18); the
 * two barriers and the remote reads, about a microsecond. fgd_cluster_size
 * is 1 in an ordinary launch and in code for older GPUs, which the host
 * never launches as clusters. */
static __device__ __forceinline__ int fgd_cluster_size() {
#if __CUDA_ARCH__ >= 900
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return (int)n;
#else
    return 1;
#endif
}
static __device__ __forceinline__ int fgd_cluster_rank() {
#if __CUDA_ARCH__ >= 900
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
#else
    return 0;
#endif
}
/* Every thread of every block of the cluster: the shared memory writes
 * before it are visible to the reads after it in any block. */
static __device__ __forceinline__ void fgd_cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
/* The float at shared address `addr` (this block's layout) in block `rank`
 * of the cluster. */
static __device__ __forceinline__ float fgd_cluster_ld(fg_u32 addr, int rank) {
#if __CUDA_ARCH__ >= 900
    fg_u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
#else
    (void)addr, (void)rank;
    return 0.f;
#endif
}

/* ---- the kernel ------------------------------------------------------------------ */

template <int NW, int WK, bool PAGED, bool HALF, bool TR = false>
static __device__ __forceinline__ void fgd_decode(const fga_args &a, const fg_mod_params &p, unsigned char *smem) {
    constexpr int NTH = NW * 32;        /* threads                     */
    constexpr int WR = NW / WK;         /* warps along rows            */
    static_assert(NTH % FGD_CHUNKS == 0, "a tile's chunk columns per thread");
    static_assert(NW * 16 * FGD_D * 4 <= FGD_BUF_BYTES, "the warps' merge region inside the stages");
    /* TR: the transposed walk of 8 rows (see fgd_movt), one slab */
    static_assert(!TR || (WR == 1 && !HALF), "the transposed walk: one slab of 8 rows, whole rows");
    constexpr int RB = TR ? 8 : 16 * WR; /* packed rows of the tile     */
    constexpr int KW = FGD_BLOCK_N / WK; /* K/V rows a warp takes a tile */
    constexpr int NT = KW / 8;
    constexpr int SN = TR ? KW / 16 : NT; /* a warp's score fragments: m16 of keys (TR) or n8 */
    static_assert(KW % 16 == 0, "P V steps of 16 keys");
    /* HALF (fgd_row_of): each warp's 16 rows are queries of one KV head
     * of the pair, so it reads and writes only that head's half of the
     * walk's columns: its k steps of Q K^T and its output tiles of P V. */
    static_assert(!HALF || FGD_PAIRS, "half slabs are a walk of KV heads in pairs");
    constexpr int WKSTEPS = HALF ? FGD_KSTEPS / 2 : FGD_KSTEPS; /* k steps of Q K^T a warp runs */
    constexpr int WDTILES = TR ? FGD_D / 16 : HALF ? FGD_DTILES / 2 : FGD_DTILES; /* output tiles a warp keeps (TR: m16 of columns) */

    const fg_u32 s0 = fga_smem_addr(smem);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int wr = warp / WK, wk = warp % WK;
    const int g = lane >> 2, t4 = lane & 3;
    const int split = blockIdx.x, b = blockIdx.z;
    const int hk = (int)blockIdx.y / a.row_tiles, rt = (int)blockIdx.y - hk * a.row_tiles;
    const int row0 = rt * RB;
    const int len = fga_seq_kv_len(a, b);
    const int qpos = fga_seq_q_offset(a, b);
    /* HALF: the warp's half of the columns, in 16-byte chunks */
    const int half_ch = HALF ? fgd_row_of<HALF>(a, hk, qpos, row0 + wr * 16).half * (FGD_OUT_D / 8) : 0;

    const fg_u16 *kbase = (const fg_u16 *)a.k + (fg_i64)hk * a.k_stride[1];
    const fg_u16 *vbase = (const fg_u16 *)a.v + (fg_i64)hk * a.v_stride[1];
    const int *table = 0;
    if (PAGED) {
        table = (const int *)a.block_table + (fg_i64)b * a.max_pages;
    } else {
        kbase += (fg_i64)b * a.k_stride[0];
        vbase += (fg_i64)b * a.v_stride[0];
    }

    /* This block's range of the walk: items [it0, it1) of the row's plan
     * (a plan over `len` keys without a block mask). */
    fga_plan pl = fga_plan_make<FGD_BLOCK_N>(a, b, hk * a.group, a.group == 1 ? row0 : 0);
    if (!pl.part) pl.n_items = (len + FGD_BLOCK_N - 1) / FGD_BLOCK_N;
    const int per = (pl.n_items + a.n_split - 1) / a.n_split;
    const int it0 = min(pl.n_items, split * per), it1 = min(pl.n_items, it0 + per);
    const int n = it1 - it0;

    /* Q rows of the tile: into the last stage (head dim 256: after the
     * stages), zero past the packed rows. With kv heads in pairs a row's
     * query fills its KV head's half of the 128 columns and the other half
     * is zero, so Q K^T over the pair's rows gives each row its own head's
     * scores. */
    constexpr bool QREGS = FGD_Q_REGS(NW);
    static_assert(!TR || QREGS, "the transposed walk keeps Q in registers");
    const fg_u32 sQ = !QREGS ? s0 + FGD_BUF_BYTES /* a region of its own */
                      : FGD_KV_RING ? s0 + 2 * FGD_KV_BYTES /* the ring's last slot */
                                    : s0 + (FGD_STAGES - 1) * FGD_STAGE_BYTES;
    for (int c = tid; c < RB * FGD_CHUNKS; c += NTH) {
        const int r = c / FGD_CHUNKS, ch = c % FGD_CHUNKS;
        const fgd_row_info ri = fgd_row_of<HALF>(a, hk, qpos, row0 + r);
        const int qi = ri.q_idx - qpos;
        const int qch = ch - ri.half * (FGD_OUT_D / 8); /* the chunk of the query's own row */
        const bool mine = (unsigned)qch < (unsigned)(FGD_OUT_D / 8);
        const fg_u16 *src = (const fg_u16 *)a.q + (fg_i64)b * a.q_stride[0] + (fg_i64)ri.h * a.q_stride[1] +
                            (fg_i64)qi * a.q_stride[2] + (mine ? qch : 0) * 8;
        fga_cp16(sQ + fgd_at(r, ch), src, ri.valid && mine);
    }
    fga_cp_commit();

    /* The first FGD_STAGES - 1 tiles, one commit group each (empty groups
     * past the range keep the count uniform). Two cursors walk the range:
     * `issue` for the copies, `use` for the products, FGD_STAGES - 1
     * tiles behind it. */
    const fga_cursor start = {pl.per_block ? it0 / pl.per_block : 0, pl.per_block ? it0 % pl.per_block : 0};
    fga_cursor issue = start, use = start;
    int badbits = 0; /* bit st: this thread met a bad page in stage st */
    /* Paged: the page of the issue cursor's tile (FGD_PAGE_AHEAD: read a
     * tile ahead, else just before its copy). */
    int page = -1;
    auto read_page = [&](int tn) {
        if (PAGED && tn < n) {
            bool part;
            page = fgd_page_of<NTH>(a, table, fga_cursor_kv0<FGD_BLOCK_N>(pl, issue, part), len);
        }
    };
    if (FGD_PAGE_AHEAD) read_page(0);
    /* Copy tile `tn` (the issue cursor's next) into its stage when it is
     * in the range; one commit group either way. */
    auto issue_tile = [&](int tn) {
        if (tn < n) {
            const int sn = tn % FGD_STAGES;
            bool part;
            const int kvn = fga_cursor_kv0<FGD_BLOCK_N>(pl, issue, part);
            fga_cursor_next(pl, issue);
            const int pg = FGD_PAGE_AHEAD || !PAGED ? page : fgd_page_of<NTH>(a, table, kvn, len);
            if (fgd_load_kv<PAGED, 3, NTH>(a, s0 + sn * FGD_STAGE_BYTES, kbase, vbase, pg, kvn, len)) badbits |= 1 << sn;
            if (FGD_PAGE_AHEAD) read_page(tn + 1);
        }
        fga_cp_commit();
    };
#if FGD_KV_RING
    /* Unit u of the ring (K of tile u / 2 for even u, else its V) into
     * slot u % 3, one commit group either way. A tile's page, read a tile
     * ahead (a ring's tile holds 32 KB of K: FGD_PAGE_AHEAD), serves its K
     * and V; a bad page marks bit (tile & 1) of badbits. */
    static_assert(FGD_PAGE_AHEAD, "the ring reads page ids a tile ahead");
    auto issue_unit = [&](int u) {
        const int tn = u >> 1;
        if (tn < n) {
            bool part;
            const int kvn = fga_cursor_kv0<FGD_BLOCK_N>(pl, issue, part);
            const fg_u32 dst = s0 + (u % 3) * FGD_KV_BYTES;
            if (u & 1) {
                fga_cursor_next(pl, issue);
                fgd_load_kv<PAGED, 2, NTH>(a, dst, kbase, vbase, page, kvn, len);
                read_page(tn + 1);
            } else {
                if (fgd_load_kv<PAGED, 1, NTH>(a, dst, kbase, vbase, page, kvn, len)) badbits |= 1 << (tn & 1);
            }
        }
        fga_cp_commit();
    };
    issue_unit(0);
    issue_unit(1);
#else
#pragma unroll
    for (int st = 0; st < FGD_STAGES - 1; st++) issue_tile(st);
#endif

    /* ldmatrix lane addressing, as in the forward, in logical chunks: each
     * lane's row is a multiple of 8 plus lane & 7 in every read below, so
     * fgd_at(row, chunk) is its address. */
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_ch = lane >> 4;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_ch = (lane >> 3) & 1;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_ch = lane >> 4;

    fga_cp_wait<FGD_KV_RING ? 2 : FGD_STAGES - 1>(); /* Q */
    __syncthreads();
    fg_u32 qf[QREGS ? WKSTEPS : 1][4];
    if constexpr (QREGS && TR) {
        /* Q^T's B fragments: rows 0-7, four 16-byte chunks (two k steps) a
         * read */
#pragma unroll
        for (int kp = 0; kp < WKSTEPS / 2; kp++) {
            fg_u32 r0, r1, r2, r3;
            fga_ldsm4(sQ + fgd_at(lane & 7, 4 * kp + (lane >> 3)), r0, r1, r2, r3);
            qf[2 * kp][0] = r0, qf[2 * kp][1] = r1, qf[2 * kp + 1][0] = r2, qf[2 * kp + 1][1] = r3;
        }
        __syncthreads(); /* the last stage is refilled in the first step */
    } else if (QREGS) {
#pragma unroll
        for (int kk = 0; kk < (QREGS ? WKSTEPS : 1); kk++)
            fga_ldsm4(sQ + fgd_at(wr * 16 + a_row, half_ch + a_ch + 2 * kk), qf[kk][0], qf[kk][1], qf[kk][2],
                      qf[kk][3]);
        __syncthreads(); /* the last stage is refilled in the first step */
    }

    float o[WDTILES][4];
#pragma unroll
    for (int i = 0; i < WDTILES; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[1][2] = {{FGA_NEG_INF, FGA_NEG_INF}}, l_run[1][2] = {{0.f, 0.f}};
    /* The tile's rows of this thread's accumulator values e2 = 0, 1 (TR: O^T's columns) */
    auto tile_row = [&](int e2) { return TR ? 2 * t4 + e2 : wr * 16 + g + 8 * e2; };
    fgd_row_info ri[2];
    ri[0] = fgd_row_of<HALF>(a, hk, qpos, row0 + tile_row(0));
    ri[1] = fgd_row_of<HALF>(a, hk, qpos, row0 + tile_row(1));
    const float mult = fga_log2_mult(a);

    /* S = Q K^T over this warp's KW keys of the tile in `stage` (one
     * 16-row slab, as the shared softmax counts them). */
    auto scores_at = [&](float (&s)[SN][4], fg_u32 k_tile) {
#pragma unroll
        for (int i = 0; i < SN; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
        /* the lane's K address of the first slab and k step */
        const fg_u32 k_at = k_tile + (TR ? fgd_at(wk * KW + a_row, a_ch) : fgd_at(wk * KW + k_row, half_ch + k_ch));
        if constexpr (TR) {
            /* S^T = K Q^T: K's 16-key slabs as A fragments, Q^T from qf */
#pragma unroll
            for (int kk = 0; kk < WKSTEPS; kk++)
#pragma unroll
                for (int mt = 0; mt < SN; mt++) {
                    fg_u32 kf[4];
                    fga_ldsm4(fgd_at_step(k_at, 16 * mt, 2 * kk), kf[0], kf[1], kf[2], kf[3]);
                    fga_mma(s[mt], kf, qf[kk][0], qf[kk][1]);
                }
        } else {
            /* Q's, where it is not in registers */
            const fg_u32 q_at = QREGS ? 0 : sQ + fgd_at(wr * 16 + a_row, half_ch + a_ch);
#pragma unroll
            for (int kk = 0; kk < WKSTEPS; kk++) {
                fg_u32 qa[4];
                if (QREGS) {
                    qa[0] = qf[QREGS ? kk : 0][0], qa[1] = qf[QREGS ? kk : 0][1];
                    qa[2] = qf[QREGS ? kk : 0][2], qa[3] = qf[QREGS ? kk : 0][3];
                } else {
                    fga_ldsm4(fgd_at_step(q_at, 0, 2 * kk), qa[0], qa[1], qa[2], qa[3]);
                }
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    fg_u32 kf[4];
                    fga_ldsm4(fgd_at_step(k_at, 16 * np, 2 * kk), kf[0], kf[1], kf[2], kf[3]);
                    fga_mma(s[2 * np], qa, kf[0], kf[1]);
                    fga_mma(s[2 * np + 1], qa, kf[2], kf[3]);
                }
            }
        }
    };
    auto scores = [&](float (&s)[SN][4], int stage) { scores_at(s, s0 + stage * FGD_STAGE_BYTES); };
    /* The mods and the online softmax of a tile whose scores are in ss[0]
     * (first key kv0), then O += P V with its V at v_tile. */
    auto soft = [&](float (&ss)[1][SN][4], int kv0, bool partial, bool bad_tile) {
        float alpha[1][2];
        if constexpr (TR) {
            fgd_tile_mods_t<SN, PAGED>(ss[0], ri, a, p, b, kv0 + wk * KW, len, partial, bad_tile, table);
            fgd_tile_softmax_t<SN>(ss, m_run[0], l_run[0], alpha[0], mult);
            /* O^T's columns are the rows: c0 / c2 row 2 * t4, c1 / c3 the next */
            if (__any_sync(0xffffffffu, alpha[0][0] != 1.f || alpha[0][1] != 1.f)) {
#pragma unroll
                for (int i = 0; i < WDTILES; i++) {
                    o[i][0] *= alpha[0][0];
                    o[i][1] *= alpha[0][1];
                    o[i][2] *= alpha[0][0];
                    o[i][3] *= alpha[0][1];
                }
            }
        } else {
            fgd_tile_mods<NT, PAGED>(ss[0], ri, a, p, b, kv0 + wk * KW, len, partial, bad_tile, table);
            fga_tile_softmax<1, NT>(ss, m_run, l_run, alpha, mult);
            /* Once the row maxima settle most tiles leave every alpha at 1:
             * the warp then skips the accumulator's multiplies. */
            if (__any_sync(0xffffffffu, alpha[0][0] != 1.f || alpha[0][1] != 1.f)) {
#pragma unroll
                for (int i = 0; i < WDTILES; i++) {
                    o[i][0] *= alpha[0][0];
                    o[i][1] *= alpha[0][0];
                    o[i][2] *= alpha[0][1];
                    o[i][3] *= alpha[0][1];
                }
            }
        }
    };
    auto pv_at = [&](float (&ss)[1][SN][4], fg_u32 v_tile) {
        /* the lane's V address of the first 16 keys and columns */
        const fg_u32 v_at = v_tile + (TR ? fgd_at(wk * KW + k_row, k_ch) : fgd_at(wk * KW + v_row, half_ch + v_ch));
        if constexpr (TR) {
            /* O^T += V^T P^T: V^T's A fragments by transposing ldmatrix (16
             * columns x 16 keys), P^T's B fragments by movmatrix of the
             * accumulator's halves (keys 0-7, 8-15 of the slab) */
#pragma unroll
            for (int mt = 0; mt < SN; mt++) {
                const fg_u32 pb0 = fgd_movt(fg_pack2(ss[0][mt][0], ss[0][mt][1]));
                const fg_u32 pb1 = fgd_movt(fg_pack2(ss[0][mt][2], ss[0][mt][3]));
#pragma unroll
                for (int i = 0; i < WDTILES; i++) {
                    fg_u32 vf[4];
                    fga_ldsm4t(fgd_at_step(v_at, 16 * mt, 2 * i), vf[0], vf[1], vf[2], vf[3]);
                    fga_mma(o[i], vf, pb0, pb1);
                }
            }
        } else {
            /* O += P V: P from accumulator layout to A fragments, V^T by
             * transposing ldmatrix. */
#pragma unroll
            for (int kc = 0; kc < KW / 16; kc++) {
                fg_u32 pa[4];
                fga_pack_p_step(pa, ss[0][2 * kc], ss[0][2 * kc + 1]);
#pragma unroll
                for (int dp = 0; dp < WDTILES / 2; dp++) {
                    fg_u32 vf[4];
                    fga_ldsm4t(fgd_at_step(v_at, 16 * kc, 2 * dp), vf[0], vf[1], vf[2], vf[3]);
                    fga_mma(o[2 * dp], pa, vf[0], vf[1]);
                    fga_mma(o[2 * dp + 1], pa, vf[2], vf[3]);
                }
            }
        }
    };
    auto consume = [&](float (&ss)[1][SN][4], int stage, int kv0, bool partial, bool bad_tile) {
        soft(ss, kv0, partial, bad_tile);
        pv_at(ss, s0 + stage * FGD_STAGE_BYTES + FGD_KV_BYTES);
    };
    /* After this barrier the tile of `stage` is in shared memory (waited
     * for before it) and every warp is done with what it read before it;
     * returns whether some thread met a bad page in that tile (bit `stage`
     * of badbits: in the ring, the tile's parity). */
    auto arrive = [&](int stage) {
        const bool bad = PAGED ? __syncthreads_or((badbits >> stage) & 1) != 0 : (__syncthreads(), false);
        badbits &= ~(1 << stage);
        return bad;
    };

#if FGD_KV_RING
    /* Commit groups: Q, units 0 and 1, then one unit after each wait, so
     * the unit waited for is always the second newest. */
    for (int t = 0; t < n; t++) {
        fga_cp_wait<1>(); /* K_t */
        const bool bad_tile = arrive(t & 1); /* and every warp is done with V_{t-1}, whose slot takes K_{t+1} */
        bool partial;
        const int kv0 = fga_cursor_kv0<FGD_BLOCK_N>(pl, use, partial);
        fga_cursor_next(pl, use);
        issue_unit(2 * t + 2);
        float ss[1][SN][4];
        scores_at(ss[0], s0 + ((2 * t) % 3) * FGD_KV_BYTES);
        soft(ss, kv0, partial, bad_tile);
        fga_cp_wait<1>(); /* V_t */
        __syncthreads();  /* every warp is done with K_t, whose slot takes V_{t+1} */
        issue_unit(2 * t + 3);
        pv_at(ss, s0 + ((2 * t + 1) % 3) * FGD_KV_BYTES);
    }
#elif FGD_PIPE_S
    /* Software-pipelined by one tile: each step issues the next tile's
     * Q K^T before the mods, softmax and P V of its own, so two
     * independent chains are in flight per warp (the walk is bound by the
     * latency of the warps' dependent chains, not by issue slots or bytes
     * in flight: bench/attention_notes.md, decode). The cost: one stage
     * fewer streams ahead (tile t + 1 must have landed at step t), so it
     * needs three stages or more. Commit groups: Q, tiles 0 .. STAGES - 2
     * (the prologue), then one per step (tile t + STAGES - 1 at step t). */
    float sa[1][SN][4], sb[1][SN][4];
    bool part_cur = false, bad_cur = false;
    int kv0_cur = 0;
    if (n > 0) {
        fga_cp_wait<FGD_STAGES - 2>(); /* tile 0 */
        bad_cur = arrive(0);
        kv0_cur = fga_cursor_kv0<FGD_BLOCK_N>(pl, use, part_cur);
        fga_cursor_next(pl, use);
        scores(sa[0], 0);
    }
    /* Two steps per trip, so the current and next scores stay in fixed
     * registers (sa, sb) instead of being copied every step. */
    auto step = [&](int t, float (&cur)[1][SN][4], float (&nxt)[1][SN][4]) {
        bool part_nxt = false, bad_nxt = false;
        int kv0_nxt = 0;
        if (t + 1 < n) {
            fga_cp_wait<FGD_STAGES - 3>(); /* tile t + 1 */
            bad_nxt = arrive((t + 1) % FGD_STAGES); /* and every warp is done with tile t - 1 */
            issue_tile(t + FGD_STAGES - 1);         /* into tile t - 1's stage */
            kv0_nxt = fga_cursor_kv0<FGD_BLOCK_N>(pl, use, part_nxt);
            fga_cursor_next(pl, use);
            scores(nxt[0], (t + 1) % FGD_STAGES);
        }
        consume(cur, t % FGD_STAGES, kv0_cur, part_cur, bad_cur);
        kv0_cur = kv0_nxt, part_cur = part_nxt, bad_cur = bad_nxt;
    };
    for (int t = 0; t < n; t += 2) {
        step(t, sa, sb);
        if (t + 1 < n) step(t + 1, sb, sa);
    }
#else
    for (int t = 0; t < n; t++) {
        const int st = t % FGD_STAGES;
        fga_cp_wait<FGD_STAGES - 2>();
        /* After this barrier tile t is in shared memory and every warp is
         * done with tile t - 1, whose stage is refilled below. */
        const bool bad_tile = arrive(st);
        bool partial;
        const int kv0 = fga_cursor_kv0<FGD_BLOCK_N>(pl, use, partial);
        fga_cursor_next(pl, use);
        issue_tile(t + FGD_STAGES - 1);
        float ss[1][SN][4];
        scores(ss[0], st);
        consume(ss, st, kv0, partial, bad_tile);
    }
#endif

    /* Merge the WK warps that share rows: each leaves (m, l) per row, then
     * its O scaled by 2^(m - M) / L into a region of its own; the block
     * sums the regions. The stages are free once every copy has landed. */
    fga_cp_wait<0>();
    __syncthreads();
    float *red = (float *)smem;                                   /* [WK][RB][D] */
    float *sm_m = (float *)(smem + FGD_BUF_BYTES + FGD_Q_BYTES(NW, RB));
    float *sm_l = sm_m + NW * 16, *sm_lse = sm_l + NW * 16;       /* [WK][RB] each, [RB] */
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        const float l = TR ? fgd_keys_sum(l_run[0][e2]) : fga_quad_sum(l_run[0][e2]);
        if (TR ? g == 0 : t4 == 0) {
            const int rl = tile_row(e2);
            sm_m[wk * RB + rl] = m_run[0][e2];
            sm_l[wk * RB + rl] = l;
        }
    }
    __syncthreads();
#pragma unroll
    for (int e2 = 0; e2 < 2; e2++) {
        const int rl = tile_row(e2);
        float M = FGA_NEG_INF;
#pragma unroll
        for (int w = 0; w < WK; w++) M = fmaxf(M, sm_m[w * RB + rl]);
        const float Mu = M == FGA_NEG_INF ? 0.f : M;
        float L = 0.f;
#pragma unroll
        for (int w = 0; w < WK; w++) L += sm_l[w * RB + rl] * fga_exp2(sm_m[w * RB + rl] - Mu);
        const float f = L > 0.f ? fga_exp2(m_run[0][e2] - Mu) / L : 0.f;
        /* HALF: only the warp's half; the rows' reads below take that half */
        if (TR) {
            /* O^T: columns 16 i + g and + 8 of row rl */
            float *dst = red + ((fg_i64)wk * RB + rl) * FGD_D + g;
#pragma unroll
            for (int i = 0; i < WDTILES; i++) {
                dst[i * 16] = o[i][e2] * f;
                dst[i * 16 + 8] = o[i][2 + e2] * f;
            }
        } else {
            float *dst = red + ((fg_i64)wk * RB + rl) * FGD_D + half_ch * 8 + t4 * 2;
#pragma unroll
            for (int i = 0; i < WDTILES; i++) {
                dst[i * 8] = o[i][2 * e2] * f;
                dst[i * 8 + 1] = o[i][2 * e2 + 1] * f;
            }
        }
        /* LSE in log2 units */
        if (wk == 0 && (TR ? g == 0 : t4 == 0)) sm_lse[rl] = L > 0.f ? Mu + fga_log2(L) : FGA_NEG_INF;
    }
    __syncthreads();

    /* A cluster of the walk's splits: merge the parts here and write out
     * and lse (see fgd_cluster_sync). Block `rank` takes every csize-th
     * pair of columns; each part's weight is 2^(lse_s - M) over the parts'
     * largest LSE M (log2 units), as in fg_attention_decode_merge. */
    const int csize = fgd_cluster_size();
    if (csize > 1) {
        fgd_cluster_sync();
        const int rank = fgd_cluster_rank();
        const fg_u32 red_a = fga_smem_addr(red), lse_a = fga_smem_addr(sm_lse);
        for (int c = tid + rank * NTH; c < RB * (FGD_OUT_D / 2); c += NTH * csize) {
            const int rl = c / (FGD_OUT_D / 2), d = (c % (FGD_OUT_D / 2)) * 2;
            const fgd_row_info rw = fgd_row_of<HALF>(a, hk, qpos, row0 + rl);
            if (!rw.valid) continue;
            const int dw = d + rw.half * FGD_OUT_D;
            float M = FGA_NEG_INF;
            for (int s = 0; s < csize; s++) M = fmaxf(M, fgd_cluster_ld(lse_a + rl * 4, s));
            const float Mu = M == FGA_NEG_INF ? 0.f : M;
            float L = 0.f, x0 = 0.f, x1 = 0.f;
            for (int s = 0; s < csize; s++) {
                const float w = fga_exp2(fgd_cluster_ld(lse_a + rl * 4, s) - Mu); /* 0 for an empty part */
                L += w;
#pragma unroll
                for (int wq = 0; wq < WK; wq++) {
                    const fg_u32 at = red_a + (fg_u32)(((wq * RB + rl) * FGD_D + dw) * 4);
                    x0 += w * fgd_cluster_ld(at, s);
                    x1 += w * fgd_cluster_ld(at + 4, s);
                }
            }
            const float f = L > 0.f ? 1.f / L : 0.f;
            const int qi = rw.q_idx - qpos;
            fg_u16 *op = (fg_u16 *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)rw.h * a.o_stride[1] +
                         (fg_i64)qi * a.o_stride[2];
            *(fg_u32 *)(op + d) = fg_pack2(x0 * f, x1 * f);
            if (d == 0 && a.lse) {
                const fg_i64 prow = ((fg_i64)b * a.heads_q + rw.h) * a.q_len + qi;
                ((float *)a.lse)[prow] = L > 0.f ? (Mu + fga_log2(L)) * FGA_LN2 : FGA_NEG_INF;
            }
        }
        fgd_cluster_sync(); /* the other blocks have read this one's shared memory */
        return;
    }

    /* Write the rows: out and lse when the walk is not split, else this
     * split's part. Two columns per thread and step; with kv heads in
     * pairs a row's columns are its KV head's half of the walk's. */
    for (int c = tid; c < RB * (FGD_OUT_D / 2); c += NTH) {
        const int rl = c / (FGD_OUT_D / 2), d = (c % (FGD_OUT_D / 2)) * 2;
        const fgd_row_info rw = fgd_row_of<HALF>(a, hk, qpos, row0 + rl);
        if (!rw.valid) continue;
        const int dw = d + rw.half * FGD_OUT_D;
        float x0 = 0.f, x1 = 0.f;
#pragma unroll
        for (int w = 0; w < WK; w++) {
            x0 += red[((fg_i64)w * RB + rl) * FGD_D + dw];
            x1 += red[((fg_i64)w * RB + rl) * FGD_D + dw + 1];
        }
        const int qi = rw.q_idx - qpos;
        if (a.n_split == 1) {
            fg_u16 *op = (fg_u16 *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)rw.h * a.o_stride[1] +
                         (fg_i64)qi * a.o_stride[2];
            *(fg_u32 *)(op + d) = fg_pack2(x0, x1);
        } else {
            const fg_i64 prow = ((fg_i64)b * a.heads_q + rw.h) * a.q_len + qi;
            float *op = (float *)a.o_part + (prow * a.n_split + split) * FGD_OUT_D;
            *(float2 *)(op + d) = make_float2(x0, x1);
        }
    }
    const fgd_row_info rw = fgd_row_of<HALF>(a, hk, qpos, row0 + tid);
    if (tid < RB && rw.valid) {
        const int qi = rw.q_idx - qpos;
        const fg_i64 prow = ((fg_i64)b * a.heads_q + rw.h) * a.q_len + qi;
        const float lse2 = sm_lse[tid];
        if (a.n_split == 1) {
            if (a.lse) ((float *)a.lse)[prow] = lse2 == FGA_NEG_INF ? FGA_NEG_INF : lse2 * FGA_LN2;
        } else {
            ((float *)a.lse_part)[prow * a.n_split + split] = lse2;
        }
    }
}

/* The walk entries: contiguous and paged K/V are entry points of their
 * own (NAME and NAME_paged), so that neither shapes the other's register
 * allocation: in one function the paged loads cost the contiguous walk of
 * softcap 4% (bench/attention_notes.md, decode d5). ROWS packed rows a
 * tile in ROWS / 16 slabs, the warps along the keys the rest. In the
 * -pairs walk the 32-row walk takes half slabs (every slab one head's:
 * fgd_row_of); the 16-row walk (8 rows a head or fewer) mixes the two
 * heads in its slab and takes every column, and so does the 64-row walk
 * (with half slabs its registers spilled past the head-dim-128 walk's:
 * test_emit's test_decode_pairs). The 16-row entry takes the transposed
 * walk (TR) when the call's packed rows are 8 or fewer and Q sits in
 * registers, a choice made per launch from the argument block: the entry
 * holds both walks, so its registers are the larger walk's. */
#define FGD_ENTRY_ONE(FN, ROWS, PAGED)                                                                       \
    extern "C" __global__ void __launch_bounds__(FG_LAUNCH_THREADS_##FN, FGD_BLOCKS_PER_SM)                \
        FN(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p) {                   \
        constexpr int NW = FG_LAUNCH_THREADS_##FN / 32, WK = NW / ((ROWS) / 16);                          \
        static_assert(FG_LAUNCH_SMEM_##FN >= FGD_SMEM_BYTES(NW, ROWS), "decode_geometry: shared memory");        \
        extern __shared__ __align__(1024) unsigned char fgd_smem[];                                         \
        fga_grid_launch_dependents(); /* the merge's blocks wait on the SMs, not in the launch queue */     \
        if ((ROWS) == 16 && FGD_Q_IN_REGS && a.rows <= 8)                                                   \
            fgd_decode<NW, WK, PAGED, false, (ROWS) == 16 && FGD_Q_IN_REGS>(a, p, fgd_smem);               \
        else                                                                                                \
            fgd_decode<NW, WK, PAGED, FGD_PAIRS && (ROWS) == 32>(a, p, fgd_smem);                          \
    }
#define FGD_ENTRY(NAME, ROWS) FGD_ENTRY_ONE(NAME, ROWS, false) FGD_ENTRY_ONE(NAME##_paged, ROWS, true)
FGD_ENTRY(fg_attention_decode_r16, 16)
FGD_ENTRY(fg_attention_decode_r32, 32)
FGD_ENTRY(fg_attention_decode_r64, 64)

/* ---- the merge of the splits ------------------------------------------------------- */

/* One thread block per output row (b, h, i). The row's n_split part LSEs
 * are read once, a part per thread: M, their largest (log2 units), each
 * part's weight 2^(lse_s - M) into shared memory and L, their sum. Then
 * each thread takes a group of 4 columns and every FGD_MERGE_PG-th part,
 * and issues its loads of o_s eight at a time before summing, so the row
 * costs a few memory latencies (the LSEs, then the parts), not one per
 * part; the part groups are summed through shared memory and
 * out = sum_s w_s o_s / L, LSE = (M + log2 L) ln 2. A row whose parts are all empty (LSE -inf) gets
 * 0 and -inf. (A thread per output element looping over the parts took
 * 8.7 us after the 128k-key walk at B=1, 33 parts; a warp per row with
 * dependent loads 17 us; bench/attention_notes.md, decode d2, d12.) */
#define FGD_MERGE_THREADS FG_LAUNCH_THREADS_fg_attention_decode_merge
#define FGD_MERGE_NWARPS (FGD_MERGE_THREADS / 32)
#define FGD_MERGE_CG (FGD_OUT_D / 4)            /* 4-column groups of a row */
#define FGD_MERGE_PG (FGD_MERGE_THREADS / FGD_MERGE_CG) /* part groups: 8, 4 or 2  */
#define FGD_MERGE_LOADS 8                        /* part loads per thread in flight */
static_assert(FGD_MERGE_THREADS % FGD_MERGE_CG == 0 && FGD_MERGE_PG >= 1, "the merge's thread groups");

/* The block's largest (max) or summed (!max) x; `red` holds a value per warp. */
static __device__ __forceinline__ float fgd_block_reduce(float x, bool max, float *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float y = __shfl_xor_sync(0xffffffffu, x, o);
        x = max ? fmaxf(x, y) : x + y;
    }
    __syncthreads(); /* red's previous use is over */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    x = red[0];
#pragma unroll
    for (int w = 1; w < FGD_MERGE_NWARPS; w++) x = max ? fmaxf(x, red[w]) : x + red[w];
    return x;
}

/* __launch_bounds__'s 1: without it ptxas holds the merge to 32 registers
 * and sinks each load of a part to its use, two in flight. */
extern "C" __global__ void __launch_bounds__(FGD_MERGE_THREADS, 1)
fg_attention_decode_merge(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p) {
    (void)p;
    __shared__ float w_sm[FGD_MERGE_THREADS];
    __shared__ float red[FGD_MERGE_NWARPS];
    __shared__ float4 acc_sm[FGD_MERGE_PG][FGD_MERGE_CG];
    const fg_i64 prow = blockIdx.x;
    const int tid = threadIdx.x, n = a.n_split;
    const int cg = tid % FGD_MERGE_CG, pg = tid / FGD_MERGE_CG;
    const float *lp = (const float *)a.lse_part + prow * n;
    const float4 *op = (const float4 *)((const float *)a.o_part + prow * n * FGD_OUT_D) + cg;
    fga_grid_wait(); /* launched as the walk's dependent: its parts are written from here on */

    float m = FGA_NEG_INF;
    for (int s = tid; s < n; s += FGD_MERGE_THREADS) m = fmaxf(m, lp[s]);
    const float M = fgd_block_reduce(m, true, red);
    const float Mu = M == FGA_NEG_INF ? 0.f : M;

    /* The parts in chunks of FGD_MERGE_THREADS (the host splits a walk at most
     * FGI_DEC_MAX_SPLIT ways: one chunk). */
    float l = 0.f;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < n; s0 += FGD_MERGE_THREADS) {
        const int cnt = min(n - s0, FGD_MERGE_THREADS);
        __syncthreads(); /* w_sm's previous chunk is read */
        if (tid < cnt) {
            const float w = fga_exp2(lp[s0 + tid] - Mu);
            w_sm[tid] = w;
            l += w;
        }
        __syncthreads();
        /* eight parts' loads issued before any is used; past the count a
         * load repeats the last part (weight 0), so none is conditional and
         * the remainder does not become a chain of single loads */
        for (int s = pg; s < cnt; s += FGD_MERGE_LOADS * FGD_MERGE_PG) {
            float4 o[FGD_MERGE_LOADS];
            float w[FGD_MERGE_LOADS];
#pragma unroll
            for (int j = 0; j < FGD_MERGE_LOADS; j++) {
                const int sj = min(s + j * FGD_MERGE_PG, cnt - 1);
                o[j] = __ldg(op + (fg_i64)(s0 + sj) * FGD_MERGE_CG);
                const float wj = w_sm[sj]; /* read whatever the count: a select, not a branch */
                w[j] = s + j * FGD_MERGE_PG < cnt ? wj : 0.f;
            }
#pragma unroll
            for (int j = 0; j < FGD_MERGE_LOADS; j++) x.x += w[j] * o[j].x, x.y += w[j] * o[j].y, x.z += w[j] * o[j].z, x.w += w[j] * o[j].w;
        }
    }
    const float L = fgd_block_reduce(l, false, red);
    acc_sm[pg][cg] = x;
    __syncthreads();
    if (pg != 0) return;
#pragma unroll
    for (int g = 1; g < FGD_MERGE_PG; g++) {
        const float4 y = acc_sm[g][cg];
        x.x += y.x, x.y += y.y, x.z += y.z, x.w += y.w;
    }
    if (L > 0.f) x.x /= L, x.y /= L, x.z /= L, x.w /= L;
    const int qi = (int)(prow % a.q_len);
    const fg_i64 bh = prow / a.q_len;
    const int h = (int)(bh % a.heads_q), b = (int)(bh / a.heads_q);
    fg_u16 *out = (fg_u16 *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)h * a.o_stride[1] + (fg_i64)qi * a.o_stride[2];
    /* out rows are 4-byte aligned (fgi_attn_check_io_aligned) */
    *(fg_u32 *)(out + cg * 4) = fg_pack2(x.x, x.y);
    *(fg_u32 *)(out + cg * 4 + 2) = fg_pack2(x.z, x.w);
    if (tid == 0 && a.lse) ((float *)a.lse)[prow] = L > 0.f ? (Mu + fga_log2(L)) * FGA_LN2 : FGA_NEG_INF;
}
