/*
 * attention_bwd_sm90.cuh -- the Hopper dK/dV pass (sm_90a): the portable
 * pass's algorithm (attention_bwd.cuh) with every matrix product on wgmma
 * and every load on the TMA unit. The source is attention_bwd.cuh's (its
 * preprocess, dQ conversion, deterministic dQ pass and fixed-point
 * conversion are kept; its own dK/dV pass is left out) followed by
 * wgmma_sm90.cuh and this file.
 *
 * Shape. A thread block owns 128 kv rows of one (kv head, batch) and is
 * three warp groups (384 threads). Warp group 0 is the producer: one thread
 * loads K and V once, then, for every q step (64 rows, 128 at head dim
 * 64) of every query head of the KV group that the block mask's
 * transposed arrays list, Q, dO and their lse * log2(e) and delta rows
 * into one of two stages; one thread each of warps 1 and 2 is a
 * consumer's dQ storer (below); the group gives most of its registers to
 * the others (setmaxnreg). Warp groups 1
 * and 2 are the consumers, 64 kv rows each, holding dK and dV (64 x D fp32)
 * in registers. Per consumer and q step, with S^T = K Q^T (kv rows, q
 * columns: dK and dV accumulate straight from wgmma's accumulator layout):
 *     S^T  = K Q^T,  dP^T = V dO^T           wgmma, A and B in shared memory
 *     P^T  = exp2(mods(S^T) log2(e) - lse2),
 *     dR^T = P^T (dP^T - delta) d score_mod / d score
 *                                            registers, element by element
 *     dV  += P^T dO,  dK += dR^T Q           wgmma, A in registers, B (dO,
 *                                            Q) read transposed
 *     dQ   = dR K                            wgmma, A (dR^T from shared
 *                                            memory) and B (K) transposed
 * and dQ goes to the fp32 accumulator through shared memory and one bulk
 * copy per consumer and step, issued by that consumer's storer (a thread
 * of the producer warp group): the TMA unit adds a contiguous 16 KB tile
 * (cp.reduce.async.bulk .add.f32), where per-thread atomics would send
 * 2048 requests to L2, or stores it if it is the tile's first (below).
 *
 * Splitting dQ. At head dim 128 each consumer computes 64 of dQ's 128
 * columns over all 128 kv rows (so each reads the other's dR^T: the
 * consumers meet at a named barrier once per step, and dR^T has two
 * buffers, so one consumer's next step cannot overwrite what the other
 * still reads); a 64 x 128 dQ per consumer would not fit in registers
 * beside dK and dV. At head dim 64 (FGS_WIDE_Q) a step is 128 q rows and
 * each consumer computes dQ for 64 of them over all 128 kv rows, from the
 * q columns of both consumers' dR^T that are its rows: the same meeting
 * per step, one reduction per consumer and 64 q rows, where 64-row steps
 * with dQ over each consumer's own kv rows added two tiles to the same
 * place per 64 q rows.
 *
 * Pipeline. Each stage has a "full" mbarrier (the producer arms it with the
 * bytes it expects; the TMA unit completes it), an "empty" one (one lane
 * of each consumer warp arrives once the stage's last product, which
 * read Q and dO, is done) and a "rows" one for its lse2 / delta rows
 * (every consumer thread arrives: the element loop reads them with plain
 * shared loads, thread by thread, and the sanitizer's race check orders
 * those reads before the producer's next bulk copy into the rows only
 * through each thread's own arrival). Inside a
 * step the work is in order: the element loop needs S^T and dP^T, the
 * products after it need its results. The two consumers overlap each
 * other, and the loads of the next step overlap this one.
 *
 * Shared memory. K, V, Q and dO tiles are stored in the 128-byte-swizzled
 * layout wgmma_sm90.cuh describes (regions of 128 rows for K and V, 64 for
 * Q and dO); dR^T too, one 128-byte line (64 q columns) per kv row. The
 * dQ staging tile is [64 rows][64 columns] fp32 in the accumulator's own
 * order with the float pairs permuted per row (fgb_dq_index), which is
 * also the global layout, so the bulk reduction copies it as it is. At the
 * end a consumer's dV and dK (bf16 / fp16) take its rows of V and its
 * tile of the stage the last step left free (its dQ staging tile in the
 * deterministic pass), in K's swizzled layout, and leave by TMA store.
 *
 * The dQ accumulator without zeros. Nothing zeroes the accumulator:
 * each 64 x 64 tile has a flag (a.dq_flags, fgb_dq_flag), which the
 * preprocess sets to FGS_TILE_EMPTY. The storer that finds a tile empty
 * claims it (compare-and-swap to FGS_TILE_CLAIMED), stores its tile
 * instead of adding it, waits for the store to complete and publishes the
 * tile (FGS_TILE_HELD, release); a storer that finds it claimed waits for
 * that, then adds. The conversion reads a tile's flag and gives 0 for a
 * tile still empty (no kv block reached its rows). This saves writing
 * the zeros (the whole accumulator, 268 MB at B=4 H=16 S=8192 D=128) and
 * reading them back into L2 at the first reduction. A storer claims a
 * tile only once its consumer's tile is in shared memory, so a claimed
 * tile's store depends on nothing else and a waiting storer never waits
 * for a claim that waits in turn: no cycle between thread blocks.
 *
 * Everything else -- the block-mask walk, the pairs kept, the mods'
 * arguments, fully masked rows, GQA, buffer gradients -- is the portable
 * pass's. The host (src/attention/backward.c) encodes tensor maps of q,
 * k, v and dout (boxes of 64 columns by a q step's rows for q and dout,
 * 128 for k and v), and of dk and dv (64 rows: a consumer's) when both are
 * 16-byte aligned, and passes them as the fourth argument;
 * bwd_sm90_geometry in src/codegen/kernels.c mirrors the sizes.
 */

#if FG_HEAD_DIM != 64 && FG_HEAD_DIM != 128
#error "the Hopper backward supports head dims 64 and 128"
#endif

#define FGS_THREADS 384                         /* producer + two consumers       */
#define FGS_BLOCK_N 128                         /* kv rows per block, 64 a consumer */
/* FlashAttention-3's layout at head dim 64: q steps of 128 rows, S^T and
 * dP^T of 64 kv rows x 128 q columns per consumer (wgmma n128), dQ split
 * by q rows between the consumers (each over all 128 kv rows, as at head
 * dim 128): per q row half the waits, barriers and dQ reductions of
 * 64-row steps. */
#define FGS_WIDE_Q (FGB_D == 64)
#define FGS_BLOCK_M (FGS_WIDE_Q ? 128 : 64)     /* q rows per step                */
#define FGS_NF (FGS_BLOCK_M / 8)                /* n8 fragments of S^T and dP^T   */
#define FGS_KC (FGS_BLOCK_M / 16)               /* k chunks of P^T and dR^T       */
#define FGS_REGIONS (FGB_D / 64)                /* 64-column regions of a row     */
#define FGS_KV_REGION (FGS_BLOCK_N * 128)       /* one region of K or V: 16 KB   */
#define FGS_Q_REGION (FGS_BLOCK_M * 128)        /* one region of Q or dO          */
#define FGS_KV_TILE (FGS_KV_REGION * FGS_REGIONS)
#define FGS_Q_TILE (FGS_Q_REGION * FGS_REGIONS)
#define FGS_STAGE_BYTES (2 * FGS_Q_TILE)        /* Q and dO                       */
#define FGS_DS_REGION (FGS_BLOCK_N * 128)       /* dR^T: 128 kv rows x 64 q, bf16 */
#define FGS_DS_BYTES (FGS_DS_REGION * (FGS_BLOCK_M / 64))
#define FGS_DQ_BYTES (64 * 64 * 4)              /* one consumer's dQ tile, fp32  */
#define FGS_ROWS_BYTES (2 * FGS_BLOCK_M * 4)    /* lse2 and delta of a step       */
#define FGS_ROWP_SIZE 16                        /* a shared mask row part, at most */
#define FGS_ROWP_BYTES (2 * 2 * FGS_BLOCK_M * FGS_ROWP_SIZE) /* [consumer][2] x 64 */
#define FGS_DT (FGB_D / 8)                      /* n8 fragments of dK / dV        */
#define FGS_PRODUCER_REGS 24
#define FGS_CONSUMER_REGS 240
#define FGS_DQ_KSTEPS (FGS_BLOCK_N / 16)       /* dQ over all 128 kv rows        */
/* K, V, two stages, two dR^T buffers, two dQ tiles, two stages of lse2 and
 * delta, two buffers of mask row parts per consumer, 128 bytes of
 * mbarriers and posted dQ tile numbers, 1 KB to align the base to the
 * swizzle's 1024-byte period; bwd_sm90_geometry computes the same. */
#define FGS_SMEM_BYTES (2 * FGS_KV_TILE + 2 * FGS_STAGE_BYTES + 2 * FGS_DS_BYTES + 2 * FGS_DQ_BYTES + \
                        2 * FGS_ROWS_BYTES + FGS_ROWP_BYTES + 128 + 1024)

/* The kernel's fourth argument: q, k, v and dout as [batch, heads, len, D],
 * and dk, dv (a consumer's 64 rows a box) when a.dkdv_tma. */
struct fgs_maps {
    fgh_tmap q, k, v, o, dk, dv;
};
static_assert(sizeof(fgs_maps) == 768, "fgs_maps must match the host's six CUtensorMaps");
/* The host's launch geometry of this pass (bwd_sm90_geometry, printed by
 * the source generator) against this file's. */
static_assert(FG_LAUNCH_THREADS_fg_attention_bwd_dkdv == FGS_THREADS, "bwd_sm90_geometry: threads");
static_assert(FG_LAUNCH_SMEM_fg_attention_bwd_dkdv >= FGS_SMEM_BYTES, "bwd_sm90_geometry: shared memory");
static_assert(FG_LAUNCH_BLOCK_M_fg_attention_bwd_dkdv == FGS_BLOCK_M, "bwd_sm90_geometry: q rows per step");
static_assert(FG_LAUNCH_BLOCK_N_fg_attention_bwd_dkdv == FGS_BLOCK_N, "bwd_sm90_geometry: kv rows per block");

/* Costly mask parts made before the element loop instead of once per
 * element in it: a thread's two column parts once per head (FGS_COLS_FIRST,
 * in registers) and a partial tile's 64 row parts once per tile, one per
 * thread of a consumer's first two warps, shared through shared memory
 * (FGS_ROWS_SHARED; document's document_id[q]: in registers, 16 per
 * thread, they spill at head dim 128). Made inside the element loop they
 * are loads under its branches, each waited for where it is used. */
#define FGS_COLS_FIRST (FG_MASK_COL_COSTLY && !__is_empty(fg_mask_col))
#define FGS_ROWS_SHARED (FG_MASK_ROW_COSTLY && !__is_empty(fg_mask_row) && sizeof(fg_mask_row) <= FGS_ROWP_SIZE)

/* S^T's and dP^T's first k step writes its accumulators only
 * (fgh_mma_ss_n64_first) for mods with a score_mod and at most one float
 * buffer read with a gradient.
 * With the accumulators read as well, ptxas moves the element loop's 64
 * results out of their registers after every step's wait, and those mods'
 * loops, with more values live, spilled (at head dim 128 alibi 44 bytes,
 * sasa 16, natten 12, document 8; none with this). Measured (attention_notes
 * v22): alibi +5-7% and document +2-4% at both head dims; the cheap mods
 * (noop, causal) lost 3-5% at head dim 64 with it, so they keep the read,
 * and a score_mod with two buffer gradients (test_emit_grad's two_reads)
 * spilled more with it (252 bytes stored at head dim 128 against 152), so
 * it does too. Mods whose only costly work is in mask parts (document,
 * flamingo, natten, sasa, jagged) took it too until the kernel around it
 * changed; measured again (v39) they ran 1% faster with the read at head
 * dim 128 (flamingo, document, two rounds each) and spill with neither,
 * so only a score_mod takes it now. Head dim 64's 128-row steps write
 * only in any case. */
#define FGS_FIRST_WRITE_ONLY (FG_HAS_SCORE_MOD && FG_GRAD_SITES <= 1)

/* K step kk of S^T or dP^T (both operands K-major), the first one as
 * FGS_FIRST_WRITE_ONLY says. */
static __device__ __forceinline__ void fgs_mma_kstep(float *d, fg_u64 da, fg_u64 db, int kk) {
    if (FGS_WIDE_Q && kk == 0)
        fgh_mma_ss_n128_first(d, da, db); /* 128 q columns */
    else if (FGS_WIDE_Q)
        fgh_mma_ss_n128(d, da, db, 1);
    else if (FGS_FIRST_WRITE_ONLY && kk == 0)
        fgh_mma_ss_n64_first<0, 0>(d, da, db);
    else
        fgh_mma_ss_n64<0, 0>(d, da, db, kk > 0);
}

/* The element loop of one step for one consumer thread: S^T and dP^T in
 * wgmma's accumulator layout (n8 fragment i, element e at kv row
 * kvr0 + 8 (e >> 1), q column 8 i + 2 t4 + (e & 1)) become P^T and dR^T in
 * place. CHECK false: a tile of a full block inside Q_LEN x kv_end, where
 * every pair is kept and every row has a finite lse. EDGE false (with
 * CHECK): a partial block's tile inside Q_LEN x kv_end, where only the
 * mask and the lse are checked, not the ranges.
 *
 * Without buffer gradients the loop has no branch: whether a pair is kept
 * (in range, a finite lse, the mask on a partial tile) is one bool made
 * eagerly (every mod expression is total, out-of-range rows' parts are
 * clamped), and P and dR are selected by it. With an `if` per element
 * ptxas made a branch region per element (the range check, the mask),
 * each one's exp2 and shared loads waited for in turn, and a tile that is
 * partial everywhere (dilated) ran at a fraction of a full one's speed.
 * The buffer gradients' accumulation has side effects and stays behind
 * its branch. */
/* The score_mod by diagonals in the element loop (see its end), at head
 * dim 64 only: ALiBi's backward there -1.7% a call, at 128 +0.9%
 * (attention_notes v52). */
#if FG_HAS_SCORE_MOD && FG_SCORE_DIST && (!FG_HAS_MASK_MOD || FG_MASK_DIST) && FG_HEAD_DIM == 64
#define FGS_SCORE_DIAG 1
#else
#define FGS_SCORE_DIAG 0
#endif

template <bool CHECK, bool EDGE, bool GRADS>
static __device__ __forceinline__ void fgs_elements(float (&s)[FGS_NF][4], float (&dp)[FGS_NF][4], const fgb_args &a,
                                                    const fg_mod_params &p, const fg_mod_grads &gr,
                                                    fg_grad_cache &gcache, const float *s_lse2,
                                                    const float *s_delta, const fg_mask_head &mhd,
                                                    const fg_score_head &shd, const fg_mask_col (&mcol)[2],
                                                    const fg_mask_row *rows, int b, int h, int q0, int kvr0,
                                                    int kv_end, int t4, bool partial) {
    /* One element: fragment i, register e; `md` is the mask there where
     * the distance form made it (MD), else it is made here; `dg`, where
     * not null, the score_mod's part of the element's distance `d`
     * (FGS_SCORE_DIAG). */
    const auto one = [&](const int i, const int e, const bool MD, const bool md, const int d, const auto *dg) {
            const int kv = kvr0 + 8 * (e >> 1), qc = 8 * i + 2 * t4 + (e & 1), q = q0 + qc;
            const float lse2 = s_lse2[qc];
            const int qi = q + a.q_offset, ki = kv + a.kv_offset;
            /* the split mods: head parts (mhd, shd) made once per head,
             * costly column parts (mcol) once per head and costly row parts
             * once per tile (rows), the rest here; what leaves the element
             * loop is alibi's slopes[h] and document's document_id[q] and
             * [kv], and the result is what fg_mask_mod and fg_score_mod
             * compute, bit for bit */
            const auto mask = [&]() {
                if (MD) return md;
                return fg_mask_split(p, mhd, b, h, qi, ki,
                                     FGS_ROWS_SHARED ? rows[qc] : fg_mask_row_init(p, mhd, b, h, qi),
                                     FGS_COLS_FIRST ? mcol[e >> 1] : fg_mask_col_init(p, mhd, b, h, ki));
            };
            const auto prob = [&](float raw) {
#if FGS_SCORE_DIAG
                if (dg) return fgb_exp2(fg_score_dist(p, shd, raw, b, h, d, *dg) * FGB_LOG2E - lse2);
#endif
#if FG_HAS_SCORE_MOD
                return fgb_exp2(fg_score_split(p, shd, raw, b, h, qi, ki, fg_score_row_init(p, shd, b, h, qi),
                                               fg_score_col_init(p, shd, b, h, ki)) *
                                    FGB_LOG2E -
                                lse2);
#else
                return fgb_exp2(s[i][e] * a.scale_log2 - lse2);
#endif
            };
            /* A row no key reaches has lse2 +inf (the preprocess): without
             * a score_mod every raw score is finite and its P is 0 there
             * already; a score_mod's value may not be, so those rows are
             * kept out by a test. */
            const bool in_range =
                (!EDGE || ((q < a.q_len) & (kv < kv_end))) & (!FG_HAS_SCORE_MOD || lse2 != FGB_POS_INF);
            float pr = 0.f, dr = 0.f;
            if (GRADS) {
                if (!CHECK || in_range)
                    if (!CHECK || !partial || mask()) {
                        const float raw = s[i][e] * a.scale;
                        pr = prob(raw);
                        if (pr != 0.f) {
                            const float ds = pr * (dp[i][e] - s_delta[qc]);
                            dr = ds * fg_score_grad(p, raw, b, h, qi, ki);
                            fg_accumulate_grads(p, gr, gcache, ds, raw, b, h, qi, ki);
                        }
                    }
            } else {
                const bool keep = !CHECK || (in_range & (!partial | mask()));
                const float raw = s[i][e] * a.scale, pv = prob(raw); /* made either way: no branch */
                pr = keep ? pv : 0.f;
                const float ds = pr * (dp[i][e] - s_delta[qc]);
                /* A P of 0 (masked or underflowed) gives dR 0, whatever dP,
                 * delta or the derivative are there: a derivative may be
                 * infinite where P underflowed, and an edge tile's rows
                 * past Q_LEN read delta where nothing was written. With a
                 * constant derivative (1 without a score_mod) and off the
                 * edges, dP and delta are finite, so dS = P (dP - delta)
                 * is 0 there already and dR is dS times the constant (two
                 * instructions fewer per element, attention_notes v33). */
                if (FG_SCORE_GRAD_CONST && !EDGE)
                    dr = ds * fg_score_grad(p, raw, b, h, qi, ki);
                else
                    dr = pr != 0.f ? ds * fg_score_grad(p, raw, b, h, qi, ki) : 0.f;
            }
            s[i][e] = pr;
            dp[i][e] = dr;
    };
#if FGS_SCORE_DIAG
    /* A score_mod of the distance (FG_SCORE_DIST: ALiBi) beside no mask or
     * a mask of the distance: the score's part of each distance (ALiBi's
     * IADD, I2F and FMUL) and the mask there once per diagonal, carried
     * to the next fragment as below, and only the rest (ALiBi's FADD) per
     * element. */
    struct at_dist {
        fg_score_diag dg;
        bool md;
    };
    const int d0 = (q0 + 2 * t4 + a.q_offset) - (kvr0 + a.kv_offset);
    const bool check = CHECK && partial;
    const auto at = [&](int d) {
        at_dist v{fg_score_diag_init(p, shd, b, h, d, (float)d), true};
#if FG_MASK_DIST
        v.md = !check || fg_mask_dist(p, mhd, b, h, d);
#endif
        return v;
    };
    at_dist lo[2] = {at(d0 - 8), at(d0 - 7)};
#pragma unroll
    for (int i = 0; i < FGS_NF; i++) {
        const at_dist up[2] = {at(d0 + 8 * i), at(d0 + 8 * i + 1)};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const at_dist &v = e < 2 ? up[e & 1] : lo[e & 1];
            one(i, e, true, v.md, d0 + 8 * (i - (e >> 1)) + (e & 1), &v.dg);
        }
#pragma unroll
        for (int c = 0; c < 2; c++) lo[c] = up[c];
    }
#elif FG_MASK_DIST && FG_MASK_ELEM_COSTLY && !FG_HAS_SCORE_MOD
    /* A costly mask of q_idx - kv_idx alone, once per diagonal: element (i, e)
     * (kv row kvr0 + 8 (e >> 1), q column q0 + 8 i + 2 t4 + (e & 1)) lies at
     * distance d0 + 8 (i - (e >> 1)) + (e & 1), so fragment i's upper
     * elements (e < 2) share their two distances with fragment i + 1's
     * lower ones: 2 (FGS_NF + 1) mask evaluations for 4 FGS_NF elements
     * (the forward's fga_tile_mask_dist, transposed), the elements in
     * their usual order, each distance's value carried to the next
     * fragment. dilated's pass -4 to -9%; not for cheap masks
     * (sliding_window's lost 1-2%), nor with a score_mod (alibi's and
     * softcap's D=64 passes spilled 8-16 more bytes with it). */
    const int d0 = (q0 + 2 * t4 + a.q_offset) - (kvr0 + a.kv_offset);
    const bool check = CHECK && partial;
    bool md_low[2]; /* the lower elements' distances: d0 + 8 (i - 1) + c */
#pragma unroll
    for (int c = 0; c < 2; c++) md_low[c] = !check || fg_mask_dist(p, mhd, b, h, d0 - 8 + c);
#pragma unroll
    for (int i = 0; i < FGS_NF; i++) {
        bool md_up[2];
#pragma unroll
        for (int c = 0; c < 2; c++) md_up[c] = !check || fg_mask_dist(p, mhd, b, h, d0 + 8 * i + c);
#pragma unroll
        for (int e = 0; e < 4; e++) one(i, e, true, e < 2 ? md_up[e & 1] : md_low[e & 1], 0, (const int *)0);
#pragma unroll
        for (int c = 0; c < 2; c++) md_low[c] = md_up[c];
    }
#else
#pragma unroll
    for (int i = 0; i < FGS_NF; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) one(i, e, false, false, 0, (const int *)0);
#endif
}

/* Named barriers. At head dim 128 each consumer's dQ reads the other's
 * dR^T, so consumer c arrives at fgs_drt_bar(c, st) once its dR^T of a step
 * is stored and the other syncs on it right before its dQ: a consumer can
 * run its dV / dK products (and the tensor cores the other's) while the
 * other is still in its element loop, where one barrier for both would keep
 * the two in lockstep. One barrier per consumer and dR^T buffer (ids 1-4):
 * a consumer arrives for step n + 2 only after it synced on the other's
 * step n + 1, which the other stores after its own sync for step n, so a
 * barrier never gets a second arrival before its sync. The same at head
 * dim 64, whose 128-row steps split dQ by q rows (each consumer's q
 * columns of both consumers' dR^T). Ids 5 and 6: each consumer's dQ
 * staging tile is in place; 7 and 8: its mask row parts; 9 and 10
 * (fgs_read_bar): its storer has read its dQ staging tile (the storer's
 * warp arrives once at its start and once per tile read, the consumer's
 * four warps sync once per step before writing the tile and once at the
 * end; the storer reads tile n only after the consumer's sync of step n,
 * so the two alternate). */
static __device__ __forceinline__ int fgs_drt_bar(int consumer, int st) { return 1 + 2 * consumer + st; }
static __device__ __forceinline__ int fgs_read_bar(int consumer) { return 9 + consumer; }

/* The storers and the tiles' flags at head dim 128 (FGB_DQ_FLAGS); at
 * head dim 64 each consumer's first thread adds its tiles itself and the
 * preprocess zeroes the accumulator: with a storer, even one that only
 * copies what its consumer posts, ptxas allocated the consumers'
 * registers differently there (alibi spilled 272 instructions' worth
 * instead of 110, +14% time), and the zeros' bytes weigh less (half the
 * columns) where the pass is bound by L2 (attention_notes v35). */
#define FGS_DQ_STORER FGB_DQ_FLAGS

/* A dQ tile's flag (the protocol: "The dQ accumulator without zeros"). */
#define FGS_TILE_EMPTY 0
#define FGS_TILE_CLAIMED 1
#define FGS_TILE_HELD 2

/* The flag's loads and compare-and-swap are relaxed, not acquire: an
 * acquire at GPU scope invalidates the SM's whole L1 (CCTL.IVALL) for the
 * loads after it, the consumers' block-mask and buffer reads included,
 * and cost the dK/dV pass 3-4% (attention_notes v35). Nothing here needs
 * it: what follows a flag seen held is a bulk add, performed in L2 after
 * the load it depends on, not a load that L1 could answer stale. */
static __device__ __forceinline__ int fgs_flag_load(const int *flag) {
    int v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    return v;
}
/* Whether this storer's copy is the tile's first (then it holds the claim
 * and stores); else the tile is held and the copy adds. `seen` is a load
 * of the flag made earlier: a tile seen held stays held. */
static __device__ __forceinline__ bool fgs_dq_claim(int *flag, int seen) {
    int v = seen;
    if (v != FGS_TILE_HELD) {
        asm volatile("atom.relaxed.gpu.global.cas.b32 %0, [%1], %2, %3;\n"
                     : "=r"(v)
                     : "l"(flag), "r"(FGS_TILE_EMPTY), "r"(FGS_TILE_CLAIMED)
                     : "memory");
        while (v == FGS_TILE_CLAIMED) { /* another block's store is in flight */
            __nanosleep(32);
            v = fgs_flag_load(flag);
        }
    }
    /* the first store (async proxy, another block) before this add */
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    return v == FGS_TILE_EMPTY;
}
/* The claimed tile's store has completed (fgh_bulk_wait<0, false>): the
 * others may add to it. */
static __device__ __forceinline__ void fgs_dq_publish(int *flag) {
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(FGS_TILE_HELD) : "memory");
}

/* The plan of query head h's q steps for the kv block at kv0. */
static __device__ __forceinline__ fgb_plan fgs_plan(const fgb_args &a, int b, int h, int kv0) {
    return a.has_block_mask ? fgb_plan_make(a, a.q_num, a.q_idx, a.full_q_num, a.full_q_idx,
                                            fgb_bm_row(a, b, h, kv0 / a.bm_kv_block, a.bm_kv_blocks),
                                            a.bm_q_blocks, a.bm_q_block, FGS_BLOCK_M, a.q_len)
                            : fgb_plan_make(a, 0, 0, 0, 0, 0, 0, 0, FGS_BLOCK_M, a.q_len);
}

/* Item j of a plan in this block's order. Blocks whose transposed rows
 * list the same q tiles in the same order (no block mask; flamingo's kv
 * blocks of one image) would reach each q tile in the same step, and all
 * but one of their storers would wait there for the tile's first store
 * (fgs_dq_claim). Such a block starts its walk at item tile % n_items
 * instead, so that each reaches a tile in a step of its own. A block
 * rotates where its row has as many partial and full q blocks as its left
 * neighbour's (the counts only: comparing the rows' first q blocks cost a
 * chain of global loads before the first step, and document 1-2%).
 * Banded masks whose counts match too (sliding_window) rotate with no
 * gain or loss to speak of; those whose counts differ (causal, document)
 * keep their order, whose visits of a tile are spread already
 * (attention_notes v40). */
static __device__ __forceinline__ int fgs_rotation(const fgb_args &a, const fgb_plan &pl, int b, int h, int tile) {
    if (pl.n_items == 0 || tile == 0) return 0;
    if (a.has_block_mask) {
        const int blk = tile * FGS_BLOCK_N / a.bm_kv_block, left = (tile - 1) * FGS_BLOCK_N / a.bm_kv_block;
        const fg_i64 row = fgb_bm_row(a, b, h, left, a.bm_kv_blocks);
        if (blk != left && (((const int *)a.q_num)[row] != pl.n_partial ||
                            ((const int *)a.full_q_num)[row] * pl.per_block != pl.n_items - pl.n_partial * pl.per_block))
            return 0;
    }
    return tile % pl.n_items;
}

/* A walk over a plan's items in this block's order (from item `rot` on,
 * wrapping), one item a step. fgb_item_start's division of the item's
 * index by the items per mask block, and its load of the block's entry of
 * the transposed row, came before every step's products: a chain of
 * dependent instructions and a global load (5-8% of a consumer's time in
 * ncu's samples, attention_notes v42). The walk keeps the block and the
 * item within it as counters, and loads the entry of the block after the
 * current one as soon as it enters a block, so the load has a step or more
 * to land. */
struct fgs_walk {
    int blk, sub; /* the next item: its mask block (its index in the plan's
                     blocks, partial ones first) and its tile in it */
    int ob, ob_next; /* the block's q block, and the next block's */
    int blocks;      /* the plan's mask blocks */
};
static __device__ __forceinline__ int fgs_walk_entry(const fgb_plan &pl, int blk) {
    return blk < pl.n_partial ? pl.part[blk] : pl.full[blk - pl.n_partial];
}
/* At head dim 64 the walk's registers cost alibi's element loop a spill
 * (110 -> 257 instructions, -5% time); there the walk divides and loads
 * per step as fgb_item_start does (FGS_WALK_AHEAD 0). */
#define FGS_WALK_AHEAD (FGB_D == 128)
static __device__ __forceinline__ fgs_walk fgs_walk_start(const fgb_plan &pl, int rot) {
    fgs_walk w = {rot, 0, 0, 0, 0};
    if (!FGS_WALK_AHEAD) return w;
    w.blk = rot / pl.per_block;
    w.sub = rot - w.blk * pl.per_block;
    w.blocks = pl.n_items / pl.per_block;
    if (pl.part && pl.n_items > 0) {
        w.ob = fgs_walk_entry(pl, w.blk);
        w.ob_next = fgs_walk_entry(pl, w.blk + 1 < w.blocks ? w.blk + 1 : 0);
    }
    return w;
}
/* The walk's first item when it skips the first j0 of its order from
 * `rot` (a tail piece; j0 0 elsewhere). */
static __device__ __forceinline__ int fgs_walk_first(const fgb_plan &pl, int rot, int j0) {
#if FG_LEAD_FIRST
    if (j0 > 0) return (rot + j0) % pl.n_items;
#endif
    (void)pl, (void)j0;
    return rot;
}
/* The first row of the walk's next item and whether it is partial (what
 * fgb_item_start says of it); the walk moves on. */
static __device__ __forceinline__ int fgs_walk_next(const fgb_plan &pl, fgs_walk &w, bool &partial) {
    if (!FGS_WALK_AHEAD) { /* w.blk counts items here */
        const int k = w.blk;
        if (++w.blk == pl.n_items) w.blk = 0;
        return fgb_item_start(pl, k, partial);
    }
    if (!pl.part) {
        partial = FG_HAS_MASK_MOD;
        const int q0 = w.blk * pl.tile;
        if (++w.blk == pl.n_items) w.blk = 0;
        return q0;
    }
    partial = w.blk < pl.n_partial;
    const int q0 = w.ob * pl.block + w.sub * pl.tile;
    if (++w.sub == pl.per_block) {
        w.sub = 0;
        if (++w.blk == w.blocks) w.blk = 0;
        w.ob = w.ob_next;
        w.ob_next = fgs_walk_entry(pl, w.blk + 1 < w.blocks ? w.blk + 1 : 0);
    }
    return q0;
}

/* Consumer cw's storer (warp 1: consumer 0, warp 2: consumer 1): the
 * tiles its consumer posts (tile numbers in sJob[k & 1], announced on the
 * mbarrier post[k & 1] at the start of step k; -1 ends) into the
 * accumulator, once the tile is in shared memory at sT (mbarrier ready),
 * by lane 0; the warp arrives at fgs_read_bar together. The tile number
 * comes early so that the flag's load runs under the step. */
static __device__ __forceinline__ void fgs_store_dq(const fgb_args &a, int cw, fg_u32 sT, fg_u32 post, fg_u32 ready,
                                                    const volatile int *sJob) {
    const bool lead = (threadIdx.x & 31) == 0;
    fgh_named_arrive(fgs_read_bar(cw), 160); /* the tile is free for step 0 */
    for (int k = 0;; k++) {
        fgh_bar_wait(post + 8 * (k & 1), (k >> 1) & 1);
        const int tile = sJob[k & 1];
        if (tile < 0) break;
        bool first = false;
        int *const flag = fgb_dq_flag_at(a, tile);
        if (lead) {
            float *const dst = (float *)a.dq_accum + (fg_i64)tile * (64 * 64);
            const int seen = fgs_flag_load(flag); /* its latency under the wait */
            fgh_bar_wait(ready, k & 1);
            first = fgs_dq_claim(flag, seen);
            if (first)
                fgh_bulk_store(dst, sT, FGS_DQ_BYTES);
            else
                fgh_bulk_add_f32(dst, sT, FGS_DQ_BYTES);
            fgh_bulk_commit();
            fgh_bulk_wait<0, true>();
        }
        __syncwarp();
        fgh_named_arrive(fgs_read_bar(cw), 160); /* the consumer may write its tile again */
        if (lead && first) {
            fgh_bulk_wait<0, false>();
            fgs_dq_publish(flag);
        }
    }
    if (lead) fgh_bulk_wait<0, false>();
}

/* The kv tile, kv head and batch of this block. The hardware starts
 * blocks in linear index order, x fastest: a head's kv tiles in order
 * (its Q and dO stay in L2 across them), the heads one after another.
 * Where the first tiles of every head are much heavier than the rest
 * (keys every query sees: global tokens, attention sinks), the last
 * heads' heavy tiles would start near the end and run on alone (local_-
 * global: a tail of 23-28% of this pass in a schedule simulation,
 * attention_notes v33). The -lead kernel (FG_LEAD_FIRST) starts the first
 * a.lead_tiles tiles of every head first, head after head, then the other
 * tiles head after head; the host chose the count (fgi_bwd_lead_tiles),
 * under 2^32 blocks and kv_tiles, so 32 bits hold the index (a 64-bit
 * division costs ptxas a spill here). The plain kernel reads blockIdx
 * alone: its coordinates as values cost others' element loops spills
 * (document at head dim 64: 40 instructions), and a run-time choice of
 * order in it cost the masks that never took it 2-17% (attention_notes
 * v43). The -pairs kernel (FG_HEAD_PAIRS) runs the kv heads in pairs,
 * tile t of both before tile t + 1, which under causal masks puts the
 * heaviest tiles of the last heads earlier (bwd_order.c); its grid is
 * (2 kv_tiles, Hkv / 2, B), so its mapping is a shift and a mask of
 * blockIdx. */
static __device__ __forceinline__ void fgs_block_of(const fgb_args &a, int &tile, int &hk, int &b, int &piece,
                                                    int &tail_block) {
    piece = -1, tail_block = 0;
#if FG_LEAD_FIRST
    /* A one-dimensional grid: block index lin is the lin-th block of the
     * order below, and past a.tail_from, piece (lin - tail_from) %
     * tail_pieces of block tail_from + (lin - tail_from) / tail_pieces
     * (the tail split, "The last wave" below). */
    const unsigned lead = (unsigned)a.lead_tiles, tiles = (unsigned)a.kv_tiles;
    const unsigned heads = (unsigned)a.heads_kv * (unsigned)a.batch;
    unsigned lin = blockIdx.x;
    if (a.tail_pieces > 0 && lin >= (unsigned)a.tail_from) {
        const unsigned t = lin - (unsigned)a.tail_from, tb = t / (unsigned)a.tail_pieces;
        piece = (int)(t - tb * (unsigned)a.tail_pieces);
        tail_block = (int)tb;
        lin = (unsigned)a.tail_from + tb;
    }
    unsigned hb;
    if (lin < lead * heads) {
        hb = lin / lead;
        tile = (int)(lin - hb * lead);
    } else {
        const unsigned r = lin - lead * heads, rest = tiles - lead;
        hb = r / rest;
        tile = (int)(lead + r - hb * rest);
    }
    hk = (int)(hb % (unsigned)a.heads_kv), b = (int)(hb / (unsigned)a.heads_kv);
#elif FG_HEAD_PAIRS
    /* block x of pair y: tile x / 2 of kv head 2 y + x % 2 */
    tile = (int)(blockIdx.x >> 1), hk = (int)(2 * blockIdx.y + (blockIdx.x & 1)), b = (int)blockIdx.z;
#else
    tile = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
#endif
}

/* The last wave. A pass whose blocks all weigh the same (no block mask)
 * runs in waves of one block per SM; where the block count is not a
 * multiple of the SMs, the last wave's few blocks run on alone while the
 * other SMs idle: B=4 H=16 S=8192 is 4096 blocks on 132 SMs, 31 waves and
 * 4 blocks, 3% of the pass (attention_notes v43). The -lead kernel can
 * split those last blocks (abi tail_from, tail_pieces; the host chooses,
 * tail_pieces_of in backward.c): piece p of a block walks items
 * [p T / P, (p + 1) T / P) of the block's T (its query heads' q steps in
 * walk order), so the last wave fills the SMs. Each piece adds its dK
 * and dV (fp32, dK scaled) into the block's accumulator in tail_acc,
 * zeroed before the pass; the piece that counts last (an int32 per block
 * after the accumulators, an atomic add after every piece thread's adds
 * and a fence) converts the accumulator into dk and dv. dQ and the buffer
 * gradients are sums already and need nothing more. The items' ranges
 * assume every query head of the group has the same plan: the host splits
 * only passes without a block mask. */
static __device__ __forceinline__ void fgs_piece_span(const fgb_args &a, int piece, int group, int gi, int n_items,
                                                      int &j0, int &j1) {
    j0 = 0, j1 = n_items;
#if FG_LEAD_FIRST
    if (piece >= 0) {
        const fg_i64 T = (fg_i64)group * n_items, base = (fg_i64)gi * n_items;
        const fg_i64 lo = (fg_i64)piece * T / a.tail_pieces, hi = (fg_i64)(piece + 1) * T / a.tail_pieces;
        j0 = (int)min(max(lo - base, (fg_i64)0), (fg_i64)n_items);
        j1 = (int)min(max(hi - base, (fg_i64)0), (fg_i64)n_items);
    }
#endif
}

#define FGS_TAIL_BAR 11 /* the consumers' named barrier of the tail's count */

/* A tail piece's dK (scaled) and dV into its block's accumulator; the
 * last piece to count converts the accumulator into dk and dv (rows
 * before kv_end). `flag` is a shared int the consumers may use. */
static __device__ __forceinline__ void fgs_tail_add(const fgb_args &a, const float (&dk)[FGS_DT][4],
                                                    const float (&dv)[FGS_DT][4], int tail_block, int cw, int ctid,
                                                    int hk, int b, int kv0, int kv_end, volatile int *flag) {
    const int warp = ctid >> 5, g = (ctid & 31) >> 2, t4 = ctid & 3;
    const fg_i64 blk_floats = 2 * FGS_BLOCK_N * FGB_D;
    float *const acc = (float *)a.tail_acc + tail_block * blk_floats;
#pragma unroll
    for (int i = 0; i < FGS_DT; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = cw * 64 + warp * 16 + g + 8 * half, c = 8 * i + 2 * t4;
            float *const pk = acc + r * FGB_D + c, *const pv = pk + FGS_BLOCK_N * FGB_D;
            fgb_red2(pk, dk[i][2 * half] * a.scale, dk[i][2 * half + 1] * a.scale);
            fgb_red2(pv, dv[i][2 * half], dv[i][2 * half + 1]);
        }
    __threadfence(); /* this thread's adds before the count */
    fgh_named_sync(FGS_TAIL_BAR, 256);
    if (cw == 0 && ctid == 0) {
        const int n_tail = (int)((gridDim.x - (unsigned)a.tail_from) / (unsigned)a.tail_pieces);
        int *const count = (int *)((float *)a.tail_acc + (fg_i64)n_tail * blk_floats) + tail_block;
        *flag = atomicAdd(count, 1) == a.tail_pieces - 1;
    }
    fgh_named_sync(FGS_TAIL_BAR, 256);
    if (!*flag) return;
    __threadfence(); /* the other pieces' adds, counted before this one */
    fg_elem *dkp = (fg_elem *)a.dk + (fg_i64)b * a.dk_stride[0] + (fg_i64)hk * a.dk_stride[1];
    fg_elem *dvp = (fg_elem *)a.dv + (fg_i64)b * a.dv_stride[0] + (fg_i64)hk * a.dv_stride[1];
    for (int e = cw * 128 + ctid; e < FGS_BLOCK_N * (FGB_D / 2); e += 256) {
        const int r = e / (FGB_D / 2), c = (e % (FGB_D / 2)) * 2, kv = kv0 + r;
        if (kv >= kv_end) break; /* rows go up with e */
        const float2 k2 = __ldcg((const float2 *)(acc + r * FGB_D + c));
        const float2 v2 = __ldcg((const float2 *)(acc + (FGS_BLOCK_N + r) * FGB_D + c));
        *(fg_u32 *)(dkp + (fg_i64)kv * a.dk_stride[2] + c) = fg_pack2(k2.x, k2.y);
        *(fg_u32 *)(dvp + (fg_i64)kv * a.dv_stride[2] + c) = fg_pack2(v2.x, v2.y);
    }
}

/* Grid (kv_tiles, Hkv, B), (2 kv_tiles, Hkv / 2, B) in the -pairs kernel,
 * one-dimensional in the -lead kernel; blocks mapped by fgs_block_of. */
extern "C" __global__ void __launch_bounds__(FGS_THREADS, 1)
fg_attention_bwd_dkdv(const __grid_constant__ fgb_args a, const __grid_constant__ fg_mod_params p,
                      const __grid_constant__ fg_mod_grads gr, const __grid_constant__ fgs_maps maps) {
    extern __shared__ __align__(1024) unsigned char fgs_smem[];
    const fg_u32 base = fgb_smem_addr(fgs_smem);
    const fg_u32 sK = (base + 1023u) & ~1023u;
    const fg_u32 sV = sK + FGS_KV_TILE;
    const fg_u32 sStage = sV + FGS_KV_TILE;               /* [2] { Q, dO }        */
    const fg_u32 sDS = sStage + 2 * FGS_STAGE_BYTES;      /* [2] dR^T             */
    const fg_u32 sDQ = sDS + 2 * FGS_DS_BYTES;            /* [consumer] dQ tile   */
    const fg_u32 sRows = sDQ + 2 * FGS_DQ_BYTES;          /* [2] { lse2, delta }  */
    const fg_u32 sRowP = sRows + 2 * FGS_ROWS_BYTES;      /* [consumer][2] rows   */
    const fg_u32 bar_kv = sRowP + FGS_ROWP_BYTES;         /* K and V landed       */
    const fg_u32 bar_full = bar_kv + 8, bar_empty = bar_full + 16; /* [2] each    */
    /* [consumer] its dQ tile is in shared memory, for its storer; then
     * [consumer][2] its tile number is posted in sJob */
    const fg_u32 bar_ready = bar_empty + 16, bar_post = bar_ready + 16;
    volatile int *const sJob = (volatile int *)(fgs_smem + (bar_post + 32 - base)); /* [consumer][2] */
    const fg_u32 bar_rows = bar_post + 48; /* [2] a stage's lse2 / delta rows are read */
    /* bar_kv, full, empty, ready, post, sJob, rows: FGS_SMEM_BYTES's 128 */
    static_assert(8 + 16 + 16 + 16 + 32 + 16 + 16 <= 128, "the mbarriers fit their 128 bytes");
    const float *const rows0 = (const float *)(fgs_smem + (sRows - base));

    const int tid = threadIdx.x, wg = fgh_warp_group(tid);
    int tile, hk, b, piece, tail_block;
    fgs_block_of(a, tile, hk, b, piece, tail_block);
    const int group = a.heads_q / a.heads_kv;
    const int kv0 = tile * FGS_BLOCK_N;
    const int kv_end = min(a.kv_len, kv0 + FGS_BLOCK_N);

    if (tid == 0) {
        fgh_bar_init(bar_kv, 1);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            fgh_bar_init(bar_full + 8 * i, 1);
            fgh_bar_init(bar_empty + 8 * i, 8);  /* one arrival per consumer warp */
            fgh_bar_init(bar_rows + 8 * i, 256); /* one arrival per consumer thread */
            if (FGS_DQ_STORER) {
                fgh_bar_init(bar_ready + 8 * i, 1);
                fgh_bar_init(bar_post + 16 * i, 1);
                fgh_bar_init(bar_post + 16 * i + 8, 1);
            }
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* The producer: step n uses stage n & 1 for the (n >> 1)-th time
         * and first waits for the release of its previous use. */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FGS_PRODUCER_REGS));
        if (tid == 0) {
            fgh_bar_expect(bar_kv, 2 * FGS_KV_TILE);
#pragma unroll
            for (int r = 0; r < FGS_REGIONS; r++) {
                fgh_tma_load(sK + r * FGS_KV_REGION, &maps.k, r * 64, kv0, hk, b, bar_kv);
                fgh_tma_load(sV + r * FGS_KV_REGION, &maps.v, r * 64, kv0, hk, b, bar_kv);
            }
            int n = 0;
            for (int gi = 0; gi < group; gi++) {
                const int h = hk * group + gi;
                const fgb_plan pl = fgs_plan(a, b, h, kv0);
                const fg_i64 row_base = ((fg_i64)b * a.heads_q + h) * a.q_pitch;
                int j0, j1;
                fgs_piece_span(a, piece, group, gi, pl.n_items, j0, j1);
                fgs_walk walk = fgs_walk_start(pl, fgs_walk_first(pl, fgs_rotation(a, pl, b, h, tile), j0));
                for (int j = j0; j < j1; j++) {
                    bool partial;
                    const int q0 = fgs_walk_next(pl, walk, partial);
                    if (q0 >= a.q_len) continue; /* a block's step past Q_LEN: nothing there */
                    const int st = n & 1;
                    if (n >= 2) fgh_bar_wait(bar_empty + 8 * st, ((n >> 1) - 1) & 1);
                    const fg_u32 full = bar_full + 8 * st, sQ = sStage + st * FGS_STAGE_BYTES;
                    fgh_bar_expect(full, FGS_STAGE_BYTES + FGS_ROWS_BYTES);
#pragma unroll
                    for (int r = 0; r < FGS_REGIONS; r++) {
                        fgh_tma_load(sQ + r * FGS_Q_REGION, &maps.q, r * 64, q0, h, b, full);
                        fgh_tma_load(sQ + FGS_Q_TILE + r * FGS_Q_REGION, &maps.o, r * 64, q0, h, b, full);
                    }
                    const fg_u32 rows = sRows + st * FGS_ROWS_BYTES;
                    if (n >= 2) fgh_bar_wait(bar_rows + 8 * st, ((n >> 1) - 1) & 1); /* every thread read them */
                    fgh_bulk_load(rows, (const float *)a.lse2 + row_base + q0, FGS_BLOCK_M * 4, full);
                    fgh_bulk_load(rows + FGS_BLOCK_M * 4, (const float *)a.delta + row_base + q0, FGS_BLOCK_M * 4,
                                  full);
                    n++;
                }
            }
        } else if (FGS_DQ_STORER && a.dq_atomic && (tid >> 5) >= 1 && (tid >> 5) <= 2) {
            const int cw = (tid >> 5) - 1;
            fgs_store_dq(a, cw, sDQ + cw * FGS_DQ_BYTES, bar_post + 16 * cw, bar_ready + 8 * cw, sJob + 2 * cw);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FGS_CONSUMER_REGS));

    /* A consumer: kv rows kv0 + 64 cw + [0, 64), this thread's kvr0 + {0, 8}. */
    const int cw = wg - 1, ctid = tid & 127, warp = ctid >> 5, lane = tid & 31;
    const int g = lane >> 2, t4 = lane & 3;
    const int kvr0 = kv0 + cw * 64 + warp * 16 + g;

    float dk[FGS_DT][4], dv[FGS_DT][4];
#pragma unroll
    for (int i = 0; i < FGS_DT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[i][e] = dv[i][e] = 0.f;
    fg_grad_cache gcache;
    fg_grad_cache_init(gcache);

#if FGB_D == 128
    /* dQ's B: K's columns 64 cw .. 64 cw + 63 (one region), all 128 rows;
     * A: dR^T of both consumers. */
    const fg_u32 dQ_b_addr = sK + cw * FGS_KV_REGION, dS_off = 0;
#else
    /* dQ's B: all of K (64 columns, 128 rows); A: q columns 64 cw .. 64 cw
     * + 63 of both consumers' dR^T (its region cw). */
    const fg_u32 dQ_b_addr = sK, dS_off = cw * FGS_DS_REGION;
#endif
    const bool dq_atomic = a.dq_atomic != 0; /* else the deterministic pass computes dQ */
    /* this consumer's dQ tiles: its 64 columns (head dim 128), its 64 q
     * rows (128-row steps) */
    const int band = FGB_D == 128 ? cw : 0, qrow = FGS_WIDE_Q ? 64 * cw : 0;
    fgh_bar_wait(bar_kv, 0);

    const bool grads = fg_grads_wanted(gr);
    int n = 0;
    for (int gi = 0; gi < group; gi++) {
        const int h = hk * group + gi;
        const fgb_plan pl = fgs_plan(a, b, h, kv0);
        const fg_i64 rb = (fg_i64)b * a.heads_q + h;
        const fg_mask_head mhd = fg_mask_head_init(p, b, h);
        const fg_score_head shd = fg_score_head_init(p, b, h);
        /* the costly mask column parts of this thread's kv rows kvr0 and
         * kvr0 + 8, clamped into the keys (a row past kv_len is never kept) */
        fg_mask_col mcol[2];
        if (FGS_COLS_FIRST) {
#pragma unroll
            for (int half = 0; half < 2; half++)
                mcol[half] = fg_mask_col_init(p, mhd, b, h, min(kvr0 + 8 * half, a.kv_len - 1) + a.kv_offset);
        }
        int j0, j1;
        fgs_piece_span(a, piece, group, gi, pl.n_items, j0, j1);
        fgs_walk walk = fgs_walk_start(pl, fgs_walk_first(pl, fgs_rotation(a, pl, b, h, tile), j0));
        for (int j = j0; j < j1; j++) {
            bool partial;
            const int q0 = fgs_walk_next(pl, walk, partial);
            /* the producer skips these too; past q_pitch the dQ tile would
             * land outside the accumulator */
            if (q0 >= a.q_len) continue;
            const int st = n & 1, phase = (n >> 1) & 1;
            n++;
            if (FGS_DQ_STORER && dq_atomic && ctid == 0) { /* this step's dQ tile, for the storer */
                sJob[2 * cw + st] = (int)fgb_dq_tile(a, rb, q0 + qrow, band * 64);
                fgh_bar_arrive(bar_post + 16 * cw + 8 * st);
            }
            const fg_u32 sQ = sStage + st * FGS_STAGE_BYTES, sO = sQ + FGS_Q_TILE;
            const float *const s_lse2 = rows0 + st * 2 * FGS_BLOCK_M, *const s_delta = s_lse2 + FGS_BLOCK_M;
            fgh_bar_wait(bar_full + 8 * st, phase);

            /* S^T = K Q^T and dP^T = V dO^T. */
            float s[FGS_NF][4], dp[FGS_NF][4];
            /* descriptors made where they are used: kept across the element
             * loop they would take registers it needs */
            const fg_u64 dQ_k = fgh_desc_k(sQ), dO_k = fgh_desc_k(sO);
            /* this consumer's 64 rows of K and V (64 lines into each region) */
            const fg_u64 dK_a = fgh_desc_k(sK + cw * 64 * 128), dV_a = fgh_desc_k(sV + cw * 64 * 128);
            fgh_fence();
#pragma unroll
            for (int kk = 0; kk < FGB_D / 16; kk++) {
                const int oa = ((kk >> 2) * FGS_KV_REGION + (kk & 3) * 32) >> 4;
                const int ob = ((kk >> 2) * FGS_Q_REGION + (kk & 3) * 32) >> 4;
                fgs_mma_kstep(&s[0][0], dK_a + oa, dQ_k + ob, kk);
            }
            fgh_commit();
#pragma unroll
            for (int kk = 0; kk < FGB_D / 16; kk++) {
                const int oa = ((kk >> 2) * FGS_KV_REGION + (kk & 3) * 32) >> 4;
                const int ob = ((kk >> 2) * FGS_Q_REGION + (kk & 3) * 32) >> 4;
                fgs_mma_kstep(&dp[0][0], dV_a + oa, dO_k + ob, kk);
            }
            fgh_commit();
            /* A partial tile's costly mask row parts, made while the
             * products run (their buffer reads waited for under them, not
             * after: attention_notes v33). Buffer st is free: this step's
             * full barrier means every consumer warp released the stage of
             * step n - 2, after its element loop. */
            fg_mask_row *const rows = (fg_mask_row *)(fgs_smem + (sRowP - base)) + (cw * 2 + st) * FGS_BLOCK_M;
            if (FGS_ROWS_SHARED && partial && ctid < FGS_BLOCK_M)
                rows[ctid] = fg_mask_row_init(p, mhd, b, h, min(q0 + ctid, a.q_len - 1) + a.q_offset);
            fgh_wait<0>();
            fgh_fence_regs<FGS_NF * 4>(&s[0][0]);
            fgh_fence_regs<FGS_NF * 4>(&dp[0][0]);
            if (FGS_ROWS_SHARED && partial) fgh_named_sync(7 + cw, 128);

            const bool edge = q0 + FGS_BLOCK_M > a.q_len || kv0 + FGS_BLOCK_N > kv_end;
            /* five element loops: the checks only where a tile needs them
             * (the range checks only on the edges), the buffer gradients'
             * code only where one is wanted (its branches and registers
             * would stay in every loop otherwise) */
            if ((partial || edge) && grads)
                fgs_elements<true, true, true>(s, dp, a, p, gr, gcache, s_lse2, s_delta, mhd, shd, mcol, rows, b, h, q0, kvr0, kv_end, t4, partial);
            else if (edge)
                fgs_elements<true, true, false>(s, dp, a, p, gr, gcache, s_lse2, s_delta, mhd, shd, mcol, rows, b, h, q0, kvr0, kv_end, t4, partial);
            else if (partial)
                fgs_elements<true, false, false>(s, dp, a, p, gr, gcache, s_lse2, s_delta, mhd, shd, mcol, rows, b, h, q0, kvr0, kv_end, t4, true);
            else if (grads)
                fgs_elements<false, false, true>(s, dp, a, p, gr, gcache, s_lse2, s_delta, mhd, shd, mcol, rows, b, h, q0, kvr0, kv_end, t4, partial);
            else
                fgs_elements<false, false, false>(s, dp, a, p, gr, gcache, s_lse2, s_delta, mhd, shd, mcol, rows, b, h, q0, kvr0, kv_end, t4, partial);

            /* P^T and dR^T as A fragments (k steps of 16 q columns), and
             * (for dQ) dR^T into this step's buffer: row r's 16-byte chunk
             * i (q columns 8 i .. 8 i + 7) at chunk i ^ (r % 8). */
            fg_u32 pa[FGS_KC][4], ra[FGS_KC][4];
            const fg_u32 sD = sDS + st * FGS_DS_BYTES;
#pragma unroll
            for (int kc = 0; kc < FGS_KC; kc++) {
                fgb_to_a(pa[kc], s[2 * kc], s[2 * kc + 1]);
                fgb_to_a(ra[kc], dp[2 * kc], dp[2 * kc + 1]);
            }
            /* dV += P^T dO first: the tensor cores run it while dR^T goes
             * to shared memory. Stored first, dR^T's stores and fence held
             * back every product of the step (attention_notes v33). The
             * stores read ra, which no product in flight uses yet. */
            fgh_fence();
            const fg_u64 dO_mn = fgh_desc_mn(sO, FGS_Q_REGION), dQ_mn = fgh_desc_mn(sQ, FGS_Q_REGION);
#pragma unroll
            for (int kc = 0; kc < FGS_KC; kc++) fgh_mma_rs_d(&dv[0][0], pa[kc], dO_mn + ((kc * 16 * 128) >> 4));
            fgh_commit();
            if (dq_atomic) {
#pragma unroll
                for (int i = 0; i < FGS_NF; i++) {
                    const int r = cw * 64 + warp * 16 + g; /* r % 8 == g, also for r + 8 */
                    /* q columns 64 (i >> 3) on: the next 128-row region */
                    /* fgh_swz128(r, 16 (i & 7) + 4 t4), written with g for
                     * r % 8: the helper's r & 7 changes this loop's SASS */
                    const fg_u32 at = sD + (i >> 3) * FGS_DS_REGION + r * 128 + (((i & 7) ^ g) << 4) + 4 * t4;
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(ra[i >> 1][(i & 1) * 2]) : "memory");
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at + 8 * 128), "r"(ra[i >> 1][(i & 1) * 2 + 1])
                                 : "memory");
                }
                fgh_fence_async_smem();
                /* this consumer's dR^T is in place for the other one, which
                 * waits for it only before its dQ (fgs_drt_bar) */
                fgh_named_arrive(fgs_drt_bar(cw, st), 256);
            }

            /* dK += dR^T Q behind dV, then dQ = dR K once both are done,
             * so dQ's accumulators never share the registers with P^T's
             * and dR^T's fragments (the tensor cores run a consumer's
             * products in order anyway; the other consumer fills the gap). */
            fgh_fence();
#pragma unroll
            for (int kc = 0; kc < FGS_KC; kc++) fgh_mma_rs_d(&dk[0][0], ra[kc], dQ_mn + ((kc * 16 * 128) >> 4));
            fgh_commit();
            fgh_wait<0>();
            fgh_fence_regs<FGS_DT * 4>(&dv[0][0]);
            fgh_fence_regs<FGS_DT * 4>(&dk[0][0]);
            /* The stage is no longer read. Q and dO were read by the
             * products only: one lane per warp releases them. The lse2 /
             * delta rows were read by every thread's shared loads: each
             * thread releases its own reads (with one lane per warp the
             * race check reported them, a __syncwarp() or named barrier
             * before the arrival notwithstanding). Every thread arriving
             * on the one barrier instead cost ALiBi's pass 5-6% at head
             * dim 128: ptxas moved its stage addresses out of uniform
             * registers (attention_notes v45). */
            if (lane == 0) fgh_bar_arrive(bar_empty + 8 * st);
            fgh_bar_arrive(bar_rows + 8 * st);
            if (!dq_atomic) continue; /* dQ has a pass of its own */
            /* The storer has read the previous step's dQ from this
             * consumer's staging tile, written again below (or, at head
             * dim 64, this thread's own reduction has). A named barrier,
             * not an mbarrier's wait loop, and from step 0 on (the storer
             * arrives once first), not under a condition: both made ptxas
             * spill in the steps. */
            if (FGS_DQ_STORER)
                fgh_named_sync(fgs_read_bar(cw), 160);
            else if (ctid == 0)
                fgh_bulk_wait<0, true>(); /* this thread's own reduction */
            fgh_named_sync(fgs_drt_bar(1 - cw, st), 256); /* the other consumer's dR^T is in place */
            float dq[8][4];
            const fg_u64 dS_a = fgh_desc_mn(sD + dS_off, FGS_DS_REGION);
            const fg_u64 dQ_b = fgh_desc_mn(dQ_b_addr, FGS_KV_REGION);
            fgh_fence();
#pragma unroll
            for (int kk = 0; kk < FGS_DQ_KSTEPS; kk++)
                fgh_mma_ss_n64<1, 1>(&dq[0][0], dS_a + ((kk * 16 * 128) >> 4), dQ_b + ((kk * 16 * 128) >> 4), kk > 0);
            fgh_commit();
            fgh_wait<0>();
            fgh_fence_regs<32>(&dq[0][0]);

            /* dQ to the staging tile (pairs permuted as fgb_dq_index says),
             * then to the storer. */
            const fg_u32 sT = sDQ + cw * FGS_DQ_BYTES;
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int r = warp * 16 + g + 8 * half, pc = ((4 * i + t4) ^ (g << 2)) << 1;
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sT + (r * 64 + pc) * 4),
                                 "f"(dq[i][2 * half]), "f"(dq[i][2 * half + 1])
                                 : "memory");
                }
            fgh_fence_async_smem();
            fgh_named_sync(5 + cw, 128);
            if (FGS_DQ_STORER && ctid == 0) {
                fgh_bar_arrive(bar_ready + 8 * cw);
            } else if (ctid == 0) {
                fgh_bulk_add_f32((float *)a.dq_accum + fgb_dq_index(a, rb, q0 + qrow, band * 64), sT, FGS_DQ_BYTES);
                fgh_bulk_commit();
            }
        }
    }
    fg_grad_flush(gr, gcache);

    /* dK (scaled) and dV leave through shared memory: per-thread stores of
     * 4 bytes from the accumulators were 14% of a document-masked pass's
     * time at head dim 128 (attention_notes v30). dV goes over this
     * consumer's own rows of V (no product reads them any more: dP^T was
     * their last use). dK goes, where dQ is reduced here, over this
     * consumer's tile (Q for consumer 0, dO for 1) of the stage the last
     * step did not use (n & 1): the producer loads nothing more, and the
     * other consumer's reads of it (its products of the step before the
     * last) came before its dR^T of the last step, which this consumer
     * synced on before its last dQ. So the storer's read of the last dQ
     * tile runs under these stores instead of before them. The
     * deterministic pass has no such sync between the consumers; there dK
     * takes the dQ staging tile, which nothing else uses. Both in the
     * 128-byte-swizzled regions of 64 columns that the tensor maps' boxes
     * describe (fgh_swz128). */
#if FG_LEAD_FIRST
    if (piece >= 0) {
        /* a tail piece: into the block's accumulator (the mask row parts'
         * shared words are free: both consumers are past their steps at
         * the count's first barrier) */
        fgs_tail_add(a, dk, dv, tail_block, cw, ctid, hk, b, kv0, kv_end, (volatile int *)(fgs_smem + (sRowP - base)));
    } else
#endif
    {
        const fg_u32 sVc = sV + cw * 64 * 128;
        const fg_u32 sKc = dq_atomic ? sStage + (n & 1) * FGS_STAGE_BYTES + cw * FGS_Q_TILE : sDQ + cw * FGS_DQ_BYTES;
        static_assert(FGS_Q_TILE >= 64 * FGB_D * 2 && FGS_DQ_BYTES >= 64 * FGB_D * 2,
                      "dK fits in a stage's Q or dO tile and in a consumer's dQ staging tile");
    #pragma unroll
        for (int i = 0; i < FGS_DT; i++)
    #pragma unroll
            for (int half = 0; half < 2; half++) {
                const int r = warp * 16 + g + 8 * half;
                const fg_u32 off = fgh_swz128(r, (i & 7) * 16 + 4 * t4);
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sVc + (i >> 3) * FGS_KV_REGION + off),
                             "r"(fg_pack2(dv[i][2 * half], dv[i][2 * half + 1]))
                             : "memory");
                asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sKc + (i >> 3) * 64 * 128 + off),
                             "r"(fg_pack2(dk[i][2 * half] * a.scale, dk[i][2 * half + 1] * a.scale))
                             : "memory");
            }
        if (a.dkdv_tma) {
            /* one TMA store per region and tensor (rows past kv_len are not
             * written) */
            fgh_fence_async_smem();
            fgh_named_sync(5 + cw, 128);
            if (ctid == 0) {
    #pragma unroll
                for (int r = 0; r < FGS_REGIONS; r++) {
                    fgh_tma_store(&maps.dv, sVc + r * FGS_KV_REGION, r * 64, kv0 + cw * 64, hk, b);
                    fgh_tma_store(&maps.dk, sKc + r * 64 * 128, r * 64, kv0 + cw * 64, hk, b);
                }
                fgh_bulk_commit();
            }
        } else {
            /* dK or dV not 16-byte aligned: row by row, 4 bytes a thread, so a
             * warp writes 128 contiguous bytes of a row */
            fgh_named_sync(5 + cw, 128);
            fg_elem *dkp = (fg_elem *)a.dk + (fg_i64)b * a.dk_stride[0] + (fg_i64)hk * a.dk_stride[1];
            fg_elem *dvp = (fg_elem *)a.dv + (fg_i64)b * a.dv_stride[0] + (fg_i64)hk * a.dv_stride[1];
            for (int e = ctid; e < 64 * (FGB_D / 2); e += 128) {
                const int r = e / (FGB_D / 2), c = (e % (FGB_D / 2)) * 2, kv = kv0 + cw * 64 + r;
                if (kv >= kv_end) break; /* rows go up with e */
                const int region = c >> 6;
                const fg_u32 off = fgh_swz128(r, (c & 63) * 2);
                fg_u32 vx, kx;
                asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(vx) : "r"(sVc + region * FGS_KV_REGION + off));
                asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(kx) : "r"(sKc + region * 64 * 128 + off));
                *(fg_u32 *)(dvp + (fg_i64)kv * a.dv_stride[2] + c) = vx;
                *(fg_u32 *)(dkp + (fg_i64)kv * a.dk_stride[2] + c) = kx;
            }
        }
    }
    if (FGS_DQ_STORER && dq_atomic) {
        fgh_named_sync(fgs_read_bar(cw), 160); /* the storer has read the last dQ tile */
        if (ctid == 0) { /* and may stop */
            sJob[2 * cw + (n & 1)] = -1;
            fgh_bar_arrive(bar_post + 16 * cw + 8 * (n & 1));
        }
    }
    /* the block's shared memory outlives the reads of the bulk copies (and,
     * without a storer, this thread's dQ reductions have completed) */
    if (ctid == 0) {
        if (FGS_DQ_STORER)
            fgh_bulk_wait<0, true>();
        else
            fgh_bulk_wait<0, false>();
    }
}
