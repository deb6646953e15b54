/*
 * attention_fwd.cuh -- the portable forward attention kernel (sm_80 and
 * newer): FlashAttention-2's schedule written with mma.sync, ldmatrix and
 * cp.async in inline PTX, so NVRTC compiles it without any CUDA header.
 *
 * The idea. One thread block owns FGA_BLOCK_M query rows of one (batch, head)
 * and streams the keys and values past them FGA_BLOCK_N at a time. Each warp
 * owns 16 or 32 of the rows: it computes its slice of S = Q K^T on the tensor
 * cores, turns it into probabilities with the running ("online") softmax,
 * and adds P V into an accumulator of its rows x D that stays in registers
 * for the whole sweep. Nothing of size Q_LEN x KV_LEN ever exists; HBM sees Q,
 * K, V once per q tile and the output once.
 *
 * The online softmax, the walk over the block mask and the epilogue are in
 * attention_common.cuh, shared with the Hopper kernel.
 *
 * Which tiles are visited comes from the block mask (FlexAttention's
 * layout): for the q block, the partial kv blocks (mask_mod evaluated
 * inside) and then the full ones (no mask evaluation). A mask block of
 * kv_block columns is kv_block / BLOCK_N kernel tiles; the host checks that BLOCK_M
 * divides q_block, so a kernel q tile never straddles two mask rows.
 * Without a block mask every tile is visited, as partial when the mod has a
 * mask_mod and as full otherwise. Independently of the mask, positions past
 * Q_LEN or KV_LEN are masked by the kernel, and the mods are called only
 * inside [0, Q_LEN) x [0, KV_LEN), so a buffer a mod reads is never indexed
 * out of range because of tile padding. The scale is applied before
 * score_mod (score_mod sees q.k * scale, as in FlexAttention).
 *
 * Memory. K and V tiles are double-buffered in shared memory with cp.async,
 * with one barrier per tile: after it, tile j is in shared memory and every
 * warp is done with tile j - 1, so tile j + 1 is then loaded into that
 * buffer (issued after the products of Q K_j^T) while tile j is computed. Tiles inside [0, KV_LEN)
 * are copied without per-row checks; in the last one rows past the end are
 * zero-filled by cp.async's src-size operand (a zero V row times a zero
 * probability is 0, whereas stale shared memory could hold a NaN). Each
 * shared row is padded by 16 bytes so that the eight 16-byte rows an
 * ldmatrix phase reads fall into different banks. Q is loaded once; where
 * registers allow it is kept there as mma A fragments, otherwise it is
 * re-read from shared memory with ldmatrix. The ldmatrix fragments of the
 * next k step (next V slice) are loaded before the products of the current
 * one, and the block mask's index is read two tiles ahead, so neither
 * shared- nor global-memory latency sits in front of the tensor cores. All
 * global offsets are 64-bit.
 *
 * Mods. The kernel calls the mods split by what each part reads
 * (src/codegen/emit_split.c): the parts that read only b, h and parameters once per
 * thread, the parts that read q_idx but not kv_idx once per row the thread
 * owns (before the sweep), the parts that read kv_idx but not q_idx once
 * per column it owns in a tile, and only the rest per score -- what
 * Triton's broadcasting gives FlexAttention. The split gives the same bits
 * as the whole mod.
 *
 * The host mirrors FGA_BLOCK_M / FGA_BLOCK_N and the shared memory size
 * (fgi_attn_geometry, src/attention/attention.h); the fga_args layout
 * comes from src/attention/abi.def for both, checked by the static_assert
 * in attention_common.cuh. The Hopper kernel (attention_fwd_sm90.cuh,
 * wgmma + TMA) has the same entry name and first two arguments, and the
 * tensor maps as a third.
 */

/* Four warps. Each warp owns FGA_MT slabs of 16 query rows, so every K or
 * V fragment it reads from shared memory feeds FGA_MT tensor-core ops: with
 * two slabs (32 rows) a warp reads half the shared-memory bytes per FLOP
 * that one slab needs, and a 128-row q tile halves the K/V traffic from L2.
 * Two slabs need q blocks of at least 128 (FG_Q_BLOCK, part of the
 * configuration) and a head dim up to 128. At D = 128 Q is re-read from
 * shared memory instead of being held in registers, and K/V tiles of 64
 * rows cost a few dozen bytes of spill per thread but measured 3-6% faster
 * than 32-row tiles without spills (bench/attention_notes.md v10); over
 * D = 128 they are 32 rows. */
#define FGA_NWARPS 4
#define FGA_THREADS (FGA_NWARPS * 32)
#if FG_HEAD_DIM <= 128 && !(defined(FG_Q_BLOCK) && FG_Q_BLOCK < 128)
#define FGA_MT 2
#else
#define FGA_MT 1
#endif
#define FGA_BLOCK_M (16 * FGA_MT * FGA_NWARPS)
#if FG_HEAD_DIM > 128
#define FGA_BLOCK_N 32
#else
#define FGA_BLOCK_N 64
#endif
#if FG_HEAD_DIM > 128 || (FGA_MT == 2 && FG_HEAD_DIM > 64)
#define FGA_Q_IN_REGS 0
#else
#define FGA_Q_IN_REGS 1
#endif
#define FGA_D FG_HEAD_DIM
/* The host's launch geometry (fwd_geometry, printed by the source
 * generator) against this file's. */
static_assert(FG_LAUNCH_THREADS_fg_attention_fwd == FGA_THREADS, "fwd_geometry: threads");
static_assert(FG_LAUNCH_BLOCK_M_fg_attention_fwd == FGA_BLOCK_M, "fwd_geometry: q rows per block");
static_assert(FG_LAUNCH_BLOCK_N_fg_attention_fwd == FGA_BLOCK_N, "fwd_geometry: kv rows per tile");
/* Skip the accumulator rescale when no row maximum of the warp moved: at
 * D >= 128 that saves D multiplies per row and tile; at D = 64 the vote and
 * the branch cost more than they save (bench/attention_notes.md v13). */
#define FGA_LAZY_RESCALE (FG_HEAD_DIM >= 128)
#define FGA_KSTEPS (FGA_D / 16)      /* k steps of Q K^T over the head dim */
#define FGA_NTILES (FGA_BLOCK_N / 8) /* n tiles of S                       */
#define FGA_DTILES (FGA_D / 8)       /* n tiles of O                       */
#define FGA_ROW (FGA_D + 8)          /* padded shared row, in elements     */
#define FGA_CHUNKS (FGA_D / 8)       /* 16-byte chunks per row             */
/* ---- tiles ------------------------------------------------------------------ */

/* Copy `rows` rows of a [len, D] slab starting at row r0 into shared memory
 * (padded rows); rows at or past `len` are zero-filled. */
template <int ROWS>
static __device__ __forceinline__ void fga_load_tile(fg_u32 smem, const fg_u16 *base,
                                                     fg_i64 row_stride, int r0, int len) {
    const int tid = threadIdx.x;
#if FGA_THREADS % FGA_CHUNKS == 0
    /* Each thread keeps one chunk column and steps down the rows, its
     * source address advanced by a constant; a tile inside [0, len) -- all
     * but the last -- needs no per-row check. */
    constexpr int STEP = FGA_THREADS / FGA_CHUNKS;
    static_assert(ROWS % STEP == 0, "tile rows per pass");
    const int r = tid / FGA_CHUNKS, ch = tid % FGA_CHUNKS;
    const fg_u32 dst = smem + (fg_u32)((r * FGA_ROW + ch * 8) * 2);
    const fg_u16 *src = base + (fg_i64)(r0 + r) * row_stride + ch * 8;
    const fg_i64 step = (fg_i64)STEP * row_stride;
    if (r0 + ROWS <= len) {
#pragma unroll
        for (int i = 0; i < ROWS / STEP; i++, src += step)
            fga_cp16(dst + (fg_u32)(i * STEP * FGA_ROW * 2), src, true);
    } else {
#pragma unroll
        for (int i = 0; i < ROWS / STEP; i++, src += step) {
            const bool ok = r0 + r + i * STEP < len;
            fga_cp16(dst + (fg_u32)(i * STEP * FGA_ROW * 2), ok ? src : base, ok);
        }
    }
#else
#pragma unroll
    for (int c = tid; c < ROWS * FGA_CHUNKS; c += FGA_THREADS) {
        const int r = c / FGA_CHUNKS, ch = c % FGA_CHUNKS;
        const bool ok = r0 + r < len;
        const fg_u16 *src = ok ? base + (fg_i64)(r0 + r) * row_stride + ch * 8 : base;
        fga_cp16(smem + (fg_u32)((r * FGA_ROW + ch * 8) * 2), src, ok);
    }
#endif
}

/* Copy K and V rows [r0, r0 + ROWS) of a paged sequence into their stages
 * (`kbase` / `vbase` at page 0 of the KV head, `table` the sequence's row
 * of the block table); rows at or past `len` and rows of bad pages are
 * zero-filled. Returns whether this thread met a bad page. K and V share
 * the table lookups. */
template <int ROWS>
static __device__ __forceinline__ bool fga_load_kv_paged(const fga_args &a, fg_u32 sk, fg_u32 sv, const fg_u16 *kbase,
                                                         const fg_u16 *vbase, const int *table, int r0, int len) {
    bool bad = false;
#pragma unroll
    for (int c = threadIdx.x; c < ROWS * FGA_CHUNKS; c += FGA_THREADS) {
        const int r = c / FGA_CHUNKS, ch = c % FGA_CHUNKS, j = r0 + r;
        const fg_u16 *kr = 0, *vr = 0;
        if (j < len) {
            kr = fga_paged_row(a, kbase, a.k_stride[0], a.k_stride[2], table, j);
            vr = fga_paged_row(a, vbase, a.v_stride[0], a.v_stride[2], table, j);
            bad |= !kr;
        }
        const fg_u32 off = (fg_u32)((r * FGA_ROW + ch * 8) * 2);
        fga_cp16(sk + off, kr ? kr + ch * 8 : kbase, kr != 0);
        fga_cp16(sv + off, vr ? vr + ch * 8 : vbase, vr != 0);
    }
    return bad;
}

/* One K/V tile of the walk into its stages: through the block table when
 * the sequence is paged (SEQ calls only), else as rows of the slabs kp /
 * vp. Whether this thread met a bad page. */
template <bool SEQ>
static __device__ __forceinline__ bool fga_load_kv(const fga_args &a, fg_u32 sk, fg_u32 sv, const fg_u16 *kp,
                                                   const fg_u16 *vp, const int *table, int kv0) {
    if (SEQ && a.paged) return fga_load_kv_paged<FGA_BLOCK_N>(a, sk, sv, kp, vp, table, kv0, a.kv_len);
    fga_load_tile<FGA_BLOCK_N>(sk, kp, a.k_stride[2], kv0, a.kv_len);
    fga_load_tile<FGA_BLOCK_N>(sv, vp, a.v_stride[2], kv0, a.kv_len);
    return false;
}

/* Where a lane's ldmatrix reads Q's A fragment of slab mt, k step kk. */
static __device__ __forceinline__ fg_u32 fga_q_frag(fg_u32 q_lane, int mt, int kk) {
    return q_lane + (fg_u32)(mt * 16 * FGA_ROW * 2 + kk * 32);
}

/* One k step's fragments for Q K^T (16 columns of the head dim): Q's A
 * fragments for each slab, unless Q is held in registers, and K's B
 * fragments for every n8 tile of S. */
static __device__ __forceinline__ void fga_load_kstep(fg_u32 (&qa)[FGA_MT][4], fg_u32 (&kf)[FGA_NTILES / 2][4],
                                                      fg_u32 q_lane, fg_u32 k_lane, int kk) {
#if !FGA_Q_IN_REGS
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
        fga_ldsm4(fga_q_frag(q_lane, mt, kk), qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3]);
#endif
#pragma unroll
    for (int np = 0; np < FGA_NTILES / 2; np++)
        fga_ldsm4(k_lane + (fg_u32)((np * 16 * FGA_ROW + kk * 16) * 2), kf[np][0], kf[np][1], kf[np][2],
                  kf[np][3]);
}

/* Step t of P V: the V fragments (transposed) for 16 rows of the tile (kc)
 * and 16 columns of the head dim (dp). */
static __device__ __forceinline__ void fga_load_vstep(fg_u32 (&vf)[4], fg_u32 v_lane, int t) {
    const int kc = t / (FGA_DTILES / 2), dp = t % (FGA_DTILES / 2);
    fga_ldsm4t(v_lane + (fg_u32)((kc * 16 * FGA_ROW + dp * 16) * 2), vf[0], vf[1], vf[2], vf[3]);
}

/* ---- the kernel ------------------------------------------------------------- */

/* The sweep of one q tile. SEQ: a call with per-sequence lengths, query
 * positions or paged K/V, `a` then the sequence's own view (its kv_len and
 * q_offset, fg_attention_fwd below); the plain instance carries none of
 * that code. */
template <bool SEQ>
static __device__ __forceinline__ void fga_forward(const fga_args &a, const fg_mod_params &p, unsigned char *fga_smem) {
    const fg_u32 sQ = fga_smem_addr(fga_smem);
    const fg_u32 sK = sQ + FGA_BLOCK_M * FGA_ROW * 2;
    const fg_u32 sV = sK + 2 * FGA_BLOCK_N * FGA_ROW * 2;
    const fg_u32 kv_stage = FGA_BLOCK_N * FGA_ROW * 2;
    /* Shared mask column parts (FGA_SHARED_COLS): computed once per column by
     * one thread each, a tile ahead, into one of two buffers of FGA_COL_BYTES
     * per column after the K/V stages, instead of by each of the four
     * threads that share a column, for each of its rows' fragments. The host
     * reserves the space whether or not a mod uses it. */
    fg_mask_col *const col_parts = (fg_mask_col *)(fga_smem + (FGA_BLOCK_M + 4 * FGA_BLOCK_N) * FGA_ROW * 2);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2;
    /* Heavier q tiles (late rows of a causal mask) are scheduled first. */
    const int qt = a.q_tiles - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (a.heads_q / a.heads_kv);
    const int q0 = qt * FGA_BLOCK_M;

    const fg_u16 *qp = (const fg_u16 *)a.q + (fg_i64)b * a.q_stride[0] + (fg_i64)h * a.q_stride[1];
    /* Paged K/V: the KV head's slab at page 0, and the sequence's row of
     * the block table. */
    const bool paged = SEQ && a.paged;
    const fg_i64 kb = paged ? 0 : b;
    const fg_u16 *kp = (const fg_u16 *)a.k + kb * a.k_stride[0] + (fg_i64)hk * a.k_stride[1];
    const fg_u16 *vp = (const fg_u16 *)a.v + kb * a.v_stride[0] + (fg_i64)hk * a.v_stride[1];
    const int *table = paged ? (const int *)a.block_table + (fg_i64)b * a.max_pages : 0;

    fga_plan pl = fga_plan_make<FGA_BLOCK_N>(a, b, h, q0);
    /* An empty sequence visits nothing: a block mask's tiles would hand the
     * mods a key index below 0. */
    if (SEQ && a.kv_len == 0) pl.n_items = 0;

    /* Q tile, then the first K/V tile: two commit groups. */
    fga_load_tile<FGA_BLOCK_M>(sQ, qp, a.q_stride[2], q0, a.q_len);
    fga_cp_commit();
    bool first_partial = false;
    const int first_kv0 = pl.n_items > 0 ? fga_item_kv0<FGA_BLOCK_N>(pl, 0, first_partial) : 0;
    /* Whether this thread met a bad page in the tile loaded last. */
    bool bad_pending = false;
    if (pl.n_items > 0) bad_pending = fga_load_kv<SEQ>(a, sK, sV, kp, vp, table, first_kv0);
    fga_cp_commit();

    /* ldmatrix lane addressing: A (Q) fragments and the B tiles of K / V. */
    const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
    const int k_row = (lane & 7) + (lane >> 4) * 8, k_col = ((lane >> 3) & 1) * 8;
    const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8, v_col = (lane >> 4) * 8;
    const fg_u32 q_lane = sQ + (fg_u32)(((warp * 16 * FGA_MT + a_row) * FGA_ROW + a_col) * 2);

    fga_cp_wait<1>(); /* Q */
    __syncthreads();
#if FGA_Q_IN_REGS
    fg_u32 qf[FGA_MT][FGA_KSTEPS][4];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
        for (int kk = 0; kk < FGA_KSTEPS; kk++)
            fga_ldsm4(fga_q_frag(q_lane, mt, kk), qf[mt][kk][0], qf[mt][kk][1], qf[mt][kk][2],
                      qf[mt][kk][3]);
#endif

    float o[FGA_MT][FGA_DTILES][4];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
        for (int i = 0; i < FGA_DTILES; i++) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
    float m_run[FGA_MT][2], l_run[FGA_MT][2];
#pragma unroll
    for (int mt = 0; mt < FGA_MT; mt++) {
        m_run[mt][0] = m_run[mt][1] = FGA_NEG_INF;
        l_run[mt][0] = l_run[mt][1] = 0.f;
    }

    /* This thread's rows: qrow0 + mt * 16 + {0, 8}. */
    const int qrow0 = q0 + warp * 16 * FGA_MT + g;
    fga_rows<FGA_MT> rows;
    fga_rows_init(rows, a, p, b, h, qrow0);

    /* Column parts of partial tile j go to buffer j & 1, written during tile
     * j - 1 (tile 0's here) and published by the barrier that starts tile
     * j; the buffer was last read in tile j - 2, before the barrier that
     * starts tile j - 1. */
    if (FGA_SHARED_COLS && pl.n_items > 0 && first_partial && tid < FGA_BLOCK_N)
        col_parts[tid] = fga_mask_col_at<false>(rows, a, p, col_parts, first_kv0, tid);

    /* One barrier per tile: after it, tile j is in shared memory for every
     * thread and every warp has finished tile j - 1, whose buffer is then
     * refilled with tile j + 1 while this one is computed. The block mask's
     * index of tile j + 2 is read during tile j, so its global-memory
     * latency stays off the path to the next copy. */
    fga_cursor ahead = {0, 0};
    fga_cursor_next(pl, ahead);
    bool partial = first_partial, next_partial = false;
    int kv0 = first_kv0, next_kv0 = pl.n_items > 1 ? fga_cursor_kv0<FGA_BLOCK_N>(pl, ahead, next_partial) : 0;
    for (int j = 0; j < pl.n_items; j++) {
        const int buf = j & 1;
        fga_cp_wait<0>();
        bool bad_tile = false;
        if (SEQ) bad_tile = __syncthreads_or(bad_pending) != 0;
        else __syncthreads();
        const int tile_kv0 = kv0;
        const bool tile_partial = partial;
        kv0 = next_kv0;
        partial = next_partial;
        if (FGA_SHARED_COLS && j + 1 < pl.n_items && partial && tid < FGA_BLOCK_N)
            col_parts[(buf ^ 1) * FGA_BLOCK_N + tid] = fga_mask_col_at<false>(rows, a, p, col_parts, kv0, tid);

        /* S = Q K^T for this warp's rows. The fragments of k step kk + 1 are
         * loaded before the products of step kk, so the products do not wait
         * for shared memory; each K fragment serves every slab. */
        float s[FGA_MT][FGA_NTILES][4];
#pragma unroll
        for (int mt = 0; mt < FGA_MT; mt++)
#pragma unroll
            for (int i = 0; i < FGA_NTILES; i++) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
        const fg_u32 k_lane = sK + buf * kv_stage + (fg_u32)((k_row * FGA_ROW + k_col) * 2);
        fg_u32 qa[2][FGA_MT][4], kf[2][FGA_NTILES / 2][4];
        fga_load_kstep(qa[0], kf[0], q_lane, k_lane, 0);
#pragma unroll
        for (int kk = 0; kk < FGA_KSTEPS; kk++) {
            if (kk + 1 < FGA_KSTEPS) fga_load_kstep(qa[(kk + 1) & 1], kf[(kk + 1) & 1], q_lane, k_lane, kk + 1);
#pragma unroll
            for (int n = 0; n < FGA_NTILES; n++)
#pragma unroll
                for (int mt = 0; mt < FGA_MT; mt++) {
#if FGA_Q_IN_REGS
                    const fg_u32 *qm = qf[mt][kk];
#else
                    const fg_u32 *qm = qa[kk & 1][mt];
#endif
                    fga_mma(s[mt][n], qm, kf[kk & 1][n >> 1][(n & 1) * 2], kf[kk & 1][n >> 1][(n & 1) * 2 + 1]);
                }
        }

        /* Tile j + 1 into the other buffer, issued once the products of
         * this tile are under way so that they start right after the
         * barrier; the softmax and P V leave the copy time to land. */
        if (j + 1 < pl.n_items) {
            bad_pending = fga_load_kv<SEQ>(a, sK + (buf ^ 1) * kv_stage, sV + (buf ^ 1) * kv_stage, kp, vp, table, kv0);
            fga_cp_commit();
        }
        fga_cursor_next(pl, ahead); /* item j + 2 */
        if (j + 2 < pl.n_items) next_kv0 = fga_cursor_kv0<FGA_BLOCK_N>(pl, ahead, next_partial);

        /* Scale, mods and range, then the online softmax (S becomes P). */
        const bool edge = tile_kv0 + FGA_BLOCK_N > a.kv_len || q0 + FGA_BLOCK_M > a.q_len;
        fga_tile_mods<FGA_SHARED_COLS>(s, rows, a, p, tile_kv0, tile_partial, edge, col_parts + buf * FGA_BLOCK_N);
        if (SEQ && bad_tile) fga_mask_bad_pages(s, a, table, tile_kv0);
        float alpha[FGA_MT][2];
        fga_tile_softmax(s, m_run, l_run, alpha, fga_log2_mult(a));
#if FGA_LAZY_RESCALE
        /* Once the row maxima settle, most tiles leave every alpha at
         * exactly 1: the warp then skips the accumulator's multiplies. */
        bool grew = false;
#pragma unroll
        for (int mt = 0; mt < FGA_MT; mt++) grew |= alpha[mt][0] != 1.f || alpha[mt][1] != 1.f;
        if (__any_sync(0xffffffffu, grew)) fga_rescale(o, alpha);
#else
        fga_rescale(o, alpha);
#endif

        /* O += P V: P goes from accumulator layout straight to A fragments,
         * all of it before the products so that S's fp32 registers are free
         * during them (32 registers of P instead of 64 of S next to O's).
         * Each V fragment serves every slab; the next one is loaded before
         * the products of the current one. */
        fg_u32 pa[FGA_BLOCK_N / 16][FGA_MT][4];
#pragma unroll
        for (int kc = 0; kc < FGA_BLOCK_N / 16; kc++)
#pragma unroll
            for (int mt = 0; mt < FGA_MT; mt++) fga_pack_p_step(pa[kc][mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
        const fg_u32 v_lane = sV + buf * kv_stage + (fg_u32)((v_row * FGA_ROW + v_col) * 2);
        constexpr int VSTEPS = (FGA_BLOCK_N / 16) * (FGA_DTILES / 2);
        fg_u32 vf[2][4];
        fga_load_vstep(vf[0], v_lane, 0);
#pragma unroll
        for (int t = 0; t < VSTEPS; t++) {
            const int kc = t / (FGA_DTILES / 2), dp = t % (FGA_DTILES / 2);
            if (t + 1 < VSTEPS) fga_load_vstep(vf[(t + 1) & 1], v_lane, t + 1);
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int mt = 0; mt < FGA_MT; mt++)
                    fga_mma(o[mt][2 * dp + n], pa[kc][mt], vf[t & 1][2 * n], vf[t & 1][2 * n + 1]);
        }
    }

    fga_store(o, m_run, l_run, a, b, h, qrow0);
}

/* FG_RAGGED 1 (the config's `ragged`): the kernel for calls with
 * per-sequence lengths, query positions or paged K/V, each q tile swept
 * with its sequence's view -- its KV length and the position of its first
 * query, where every step reads them. A compile of its own, so that the
 * plain kernel carries none of that code (and compiles in half the time
 * one with both would take). */
extern "C" __global__ void __launch_bounds__(FGA_THREADS)
fg_attention_fwd(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p) {
    extern __shared__ __align__(128) unsigned char fga_smem[];
#if FG_RAGGED
    fga_args seq = a;
    seq.kv_len = fga_seq_kv_len(a, blockIdx.z);
    seq.q_offset = fga_seq_q_offset(a, blockIdx.z);
    fga_forward<true>(seq, p, fga_smem);
#else
    fga_forward<false>(a, p, fga_smem);
#endif
}
