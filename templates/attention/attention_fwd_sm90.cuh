/*
 * attention_fwd_sm90.cuh -- the Hopper forward attention kernel (sm_90a):
 * the portable kernel's algorithm with the matrix products on wgmma, the
 * warp-group-wide asynchronous tensor-core instruction that reads its B
 * operand (and here also A for Q K^T) straight from shared memory.
 *
 * Shape. A thread block is a producer warp group and FGH_CONSUMERS
 * consumer warp groups (two at D = 96, 128, 192 and 256: 384 threads and
 * a q tile of 128 rows; three at D = 64: 512 threads and 192 rows, unless
 * score_mod does costly work per score) for one (batch, head).
 * Warp group 0 is the producer: one of its threads moves every tile with
 * the Tensor Memory Accelerator (TMA, cp.async.bulk.tensor) and the group
 * gives most of its registers to the others (setmaxnreg). The consumers
 * take 64 q rows each (16 per warp); K and V stream past in tiles of
 * FGH_BLOCK_N rows (128; 64 past D = 128; 176 in the kernel for calls
 * without a block mask at D = 128, FGH_WIDE). Per consumer and tile:
 *     S (64 x N) = Q (64 x D) K^T           wgmma, A and B in shared memory
 *     P = online softmax of mods(S)         registers (attention_common.cuh)
 *     O (64 x D) += P (64 x N) V            wgmma, A (P) in registers,
 *                                           n128 products (and an n64)
 * The accumulator layouts are the mma.sync ones per warp, so the mods, the
 * softmax and the epilogue are attention_common.cuh's, with one 16-row slab
 * per warp and N / 8 n8 fragments per tile.
 *
 * Pipeline. Q takes one tile of shared memory, K two stages and V three
 * (three and four at D = 64, where a tile is half the size and a step
 * half as long: +2-4% measured with ping-pong; two and two at D = 256,
 * whose 64-row tiles are 32 KB, and in the 176-row kernel).
 * Each stage has a "full" mbarrier (the producer arms it with the bytes it
 * expects; the TMA unit completes it when they have landed) and an "empty"
 * one (each consumer warp arrives when its matrix products no longer read
 * the stage). The producer loads K of tile j as soon as both consumers'
 * S of tile j - K_STAGES has finished, and V of tile j once their P V of
 * tile j - V_STAGES has (that product is deferred by one iteration, see
 * below), so loads run ahead and the consumers never meet at a
 * block-wide barrier: each runs at its own pace.
 *
 * Overlap inside a consumer. wgmma runs asynchronously to the issuing
 * threads. In iteration j a consumer issues S_j = Q K_j^T, then
 * O += P_{j-1} V_{j-1} (the product of the previous tile, deferred by one
 * iteration), waits for S_j only, and computes the mods and softmax of tile
 * j while the tensor cores still work on P_{j-1} V_{j-1}; it then waits for
 * that product and rescales O by the new row maxima. (So the source reads.
 * ptxas moves that wait up through straight-line arithmetic: in the SASS
 * every kernel waits for P V before its row maxima and exponentials, and
 * only the mods and the other consumers' work run beside the product;
 * bench/attention_notes.md f19, f22.) The last tile's P V
 * is issued after the loop. Where the mask's column parts are worth
 * sharing (FGA_SHARED_COLS: costly, and small enough), a partial tile's are
 * computed between the two issues, one column per consumer thread, and
 * shared through shared memory. Nothing but the mods and the softmax may
 * sit between the second issue and its wait: a barrier or that column-part
 * block there makes ptxas serialise the wgmma pipeline (its report C7514),
 * which tests/test_emit.c checks for every gallery mod. The one exception
 * is the ping-pong hand-over (bar.arrive), which is accepted only because
 * the wait after it is the same in every iteration (the first iteration
 * commits an empty group instead of P V): with a branch between two waits
 * there, ptxas serialised the pipeline.
 *
 * Ping-pong (FGH_PINGPONG, D = 64). The two consumers take turns issuing
 * their two products, as FlashAttention-3 does: a consumer waits for its
 * turn (named barrier 3 + c), issues S_j and P_{j-1} V_{j-1}, and hands the
 * turn over before it waits for anything, so the tensor cores run one
 * consumer's products while the other is in its softmax. Left alone, the
 * two drift into issuing at the same time and both wait for products that
 * share the tensor cores (bench/attention_notes.md, ncu at D = 64).
 *
 * Shared memory. Every tile is stored as the wgmma canonical layout with
 * the 128-byte swizzle, which is also what TMA writes with
 * CU_TENSOR_MAP_SWIZZLE_128B: the head dim is cut into 64-element column
 * blocks ("regions": one for D = 64, two for D = 96 and 128, three for 192,
 * four for 256; see FGH_DS for 96), each region holds
 * the tile's rows as 128-byte lines, and the 16-byte chunk c of row r sits
 * at chunk c ^ (r % 8) of its line (regions start on 1024-byte
 * boundaries). Q K^T reads Q and K K-major (descriptor stride between 8-row
 * groups: 1024 bytes; a k step of 16 elements moves the start by 32 bytes
 * inside the line); P V reads V N-major ("transposed"), which is the same
 * bytes: the leading offset steps from one 64-column region to the next,
 * the stride steps 8 kv rows. Rows past Q_LEN or KV_LEN are zero-filled by
 * TMA (the tensor maps end there) and masked by the kernel.
 *
 * Registers. wgmma's accumulators are plain registers to the compiler,
 * which would happily read them before the instruction has finished; every
 * wait is followed by an empty asm that "redefines" the accumulators it
 * waited for (fgh_fence_regs), so no read of S or O moves above its wait.
 *
 * Everything else -- the block-mask walk, partial and full tiles, offsets,
 * GQA, fully masked rows -- is the portable kernel's, through
 * attention_common.cuh; the PTX wrappers are wgmma_sm90.cuh's, which the
 * source puts before this file. The host (src/attention/forward.c) encodes
 * the three tensor maps (q, k, v as [batch, heads, len, D] with the
 * caller's strides, boxes of 64 columns by the tiles' rows) and passes them as the
 * third kernel argument; fwd_sm90_geometry in src/codegen/kernels.c mirrors
 * the tile sizes and the shared-memory size.
 */

#if FG_HEAD_DIM != 64 && FG_HEAD_DIM != 96 && FG_HEAD_DIM != 128 && FG_HEAD_DIM != 192 && FG_HEAD_DIM != 256
#error "the Hopper kernel supports head dims 64, 96, 128, 192 and 256"
#endif

#define FGH_D FG_HEAD_DIM
/* The head dim as stored in shared memory and accumulated: whole 64-column
 * regions. Head dim 96 is stored as 128: TMA zero-fills the second
 * region's last 32 columns (the tensor maps end at column 96), Q K^T steps
 * over the 96 real columns only, P V computes 32 columns of zeros and the
 * store leaves them out. */
#define FGH_DS ((FGH_D + 63) / 64 * 64)
/* Consumer warp groups: three at D = 64 (a 192-row q tile), where one
 * consumer's softmax is a chain of dependent instructions as long as the
 * other's products and a third one hides it (FlashAttention-3's choice);
 * two at D = 128, whose registers would not fit three, and two where
 * score_mod does costly work per score (softcap's tanhf and division
 * spilled 384 bytes in three consumers' 160 registers and ran 4% slower
 * than in two). fwd_sm90_geometry decides the same on the host. */
#define FGH_CONSUMERS (FGH_D == 64 && !FG_SCORE_ELEM_COSTLY ? 3 : 2)
#define FGH_THREADS (128 * (1 + FGH_CONSUMERS)) /* producer + consumers            */
#define FGH_BLOCK_M (64 * FGH_CONSUMERS)   /* q rows per block, 64 per consumer     */
/* kv rows per tile: 128, or 64 past head dim 128, where O takes 96 or 128
 * registers a thread and a 128-row S with P's fragments would not fit
 * beside it, nor two stages of 128-row K and V tiles in shared memory.
 * The kernel for calls without a block mask (FG_DENSE, config.dense; the
 * host makes it only at head dim 128 for mods without a mask_mod) walks
 * 176-row tiles, FlashAttention-3's for dense head dim 128: a step's
 * fixed work (the waits, the row maxima's shuffles, the O rescale, the
 * hand-offs) is spread over 176 keys instead of 128. S takes 88 registers
 * and P's fragments 44; K and V take two stages each (44 KB a tile).
 * Measured +2.8% on the dense forward (attention_notes f5). The dense walk
 * steps by any tile size; the last tile's keys past KV_LEN are masked as
 * every edge tile's are. */
#ifdef FG_DENSE
#define FGH_WIDE (FGH_D == 128 && !FGA_MASK_MOD)
#else
#define FGH_WIDE 0
#endif
#define FGH_BLOCK_N (FGH_D > 128 ? 64 : FGH_WIDE ? 176 : 128)
#define FGH_TILE_BYTES (FGH_BLOCK_N * FGH_DS * 2) /* one tile of K or V              */
#define FGH_REGION_BYTES (FGH_BLOCK_N * 128)   /* a tile's rows of one 64-column region */
#define FGH_Q_BYTES (FGH_BLOCK_M * FGH_DS * 2)
#define FGH_Q_REGION (FGH_BLOCK_M * 128)   /* the q tile's rows of one region       */
#define FGH_Q_BOX (FGH_BLOCK_M % 128 ? 64 : 128) /* rows per TMA box of q (host: the same) */
/* A 192-row q tile crosses the block mask's 128-row rows: its walk merges
 * two rows (fgh_walk) through per-block states in shared memory, for up to
 * FGH_MERGE_MAX_KB kv blocks (the host sends longer masks to the portable
 * kernel). */
#define FGH_MERGE (FGH_BLOCK_M % 128 != 0)
#define FGH_MERGE_MAX_KB 4096
#define FGH_MERGE_BYTES (FGH_MERGE ? 10 * FGH_MERGE_MAX_KB : 0) /* two state rows, two int lists */
#define FGH_NT (FGH_BLOCK_N / 8)           /* n8 fragments of S per warp            */
#define FGH_DT (FGH_DS / 8)                /* n8 fragments of O per warp            */
#define FGH_QK_STEPS (FGH_D / 16)          /* k steps of Q K^T                      */
#define FGH_PV_STEPS (FGH_BLOCK_N / 16)    /* k steps of P V                        */
#define FGH_K_STAGES (FGH_D == 64 ? 3 : 2)
#define FGH_V_STAGES (FGH_D == 64 ? 4 : FGH_D == 256 || FGH_WIDE ? 2 : 3)
#define FGH_PRODUCER_REGS (FGH_CONSUMERS == 3 ? 32 : 24) /* 24 + 2 x 240, 32 + 3 x 160 */
#define FGH_CONSUMER_REGS (FGH_CONSUMERS == 3 ? 160 : 240) /* per thread fit 64K  */
/* Ping-pong (the consumers take turns issuing their products, see the
 * loop) at D = 64 only: there it measured +14% (noop) and +2-11% (causal,
 * sliding window, prefix LM); at D = 128 it was flat (-1% to +4%). */
#define FGH_PINGPONG (FGH_D == 64)
#define FGH_TURN_BAR (1 + FGH_CONSUMERS)   /* the turns' named barriers; 1 + c: cols */
#define FGH_BUILD_BAR (1 + 2 * FGH_CONSUMERS) /* the merged walk's builders            */
#define FGH_BAR_BYTES 256                  /* the mbarriers                         */
/* Q, the K stages, the V stages, the mbarriers (128 bytes), the shared
 * mask column parts (FGA_SHARED_COLS: two buffers per consumer of 128
 * columns, FGA_COL_BYTES each), the merged walk's states and list, and 1
 * KB to align the base to 1024 bytes (the swizzle pattern's period);
 * fwd_sm90_geometry computes the same, and reserves the column parts
 * whether or not a mod uses them. */
#define FGH_SMEM_BYTES (FGH_Q_BYTES + FGH_TILE_BYTES * (FGH_K_STAGES + FGH_V_STAGES) + FGH_O_BUF_BYTES + \
                        FGH_BAR_BYTES + 2 * FGH_CONSUMERS * 128 * FGA_COL_BYTES + FGH_MERGE_BYTES + 1024)
/* Three consumers (D=64) store O through a buffer of their own, laid out
 * as Q (fgh_store_o<true>): 24 KB, which fits beside the stages there, for
 * mods with a mask_mod. Measured (H200, 2026-11-29, attention_notes f31):
 * document -3.0% time, local_global -2.4%, causal -1.6%, sliding_window
 * level, but noop +0.9% (its long walks store rarely), which keeps fga_store. */
#define FGH_O_BUF (FGH_CONSUMERS == 3 && FGA_MASK_MOD)
#define FGH_O_BUF_BYTES (FGH_O_BUF ? FGH_Q_BYTES : 0)

/* Shared column parts that read a buffer (flamingo's kv_image[kv],
 * document's document_id[kv]) are read a partial tile ahead, into a
 * register that is stored at the tile's turn: made at their tile, the
 * read's latency stalled the consumer before the tile's barrier (D=128
 * flamingo's forward -1.8%, document's flat). Only with two consumers and only
 * for reads: a part that computes (natten's divisions) gained nothing and
 * its register across the softmax cost 2.8%, and three consumers (D=64)
 * lost 1-2% (attention_notes v40). */
#define FGH_COLS_AHEAD (FGA_SHARED_COLS && FG_MASK_COL_READS && FGH_CONSUMERS == 2)

/* The kernel's third argument: q, k, v and out as [batch, heads, len, D]
 * (out's boxes of 64 rows: a consumer's). */
struct fgh_maps {
    fgh_tmap q, k, v, o;
};
static_assert(sizeof(fgh_maps) == 512, "fgh_maps must match the host's four CUtensorMaps");
/* The host's launch geometry (fwd_sm90_geometry, printed by the source
 * generator) against this file's. */
static_assert(FG_LAUNCH_THREADS_fg_attention_fwd == FGH_THREADS, "fwd_sm90_geometry: threads");
static_assert(FG_LAUNCH_SMEM_fg_attention_fwd >= FGH_SMEM_BYTES, "fwd_sm90_geometry: shared memory");
static_assert(FG_LAUNCH_BLOCK_M_fg_attention_fwd == FGH_BLOCK_M, "fwd_sm90_geometry: q rows per block");
static_assert(FG_LAUNCH_BLOCK_N_fg_attention_fwd == FGH_BLOCK_N, "fwd_sm90_geometry: kv rows per tile");

/* ---- the tiles' descriptors and loads ---------------------------------------- */

/* N-major operand (V rows, read transposed): the next 64 columns are one
 * region further; the next 8 kv rows 1024 bytes further. */
static __device__ __forceinline__ fg_u64 fgh_desc_v(fg_u32 addr) {
    return fgh_desc(addr, FGH_REGION_BYTES, 1024);
}

/* A whole tile: one box (FGH_BLOCK_N rows) per 64-column region. */
static __device__ __forceinline__ void fgh_tma_tile(fg_u32 dst, const fgh_tmap *map, int row, int head, int batch,
                                                    fg_u32 bar) {
    fgh_bar_expect(bar, FGH_TILE_BYTES);
#pragma unroll
    for (int r = 0; r < FGH_DS / 64; r++) fgh_tma_load(dst + r * FGH_REGION_BYTES, map, r * 64, row, head, batch, bar);
}

/* ---- tiles ------------------------------------------------------------------ */

/* O += P V for one tile: P as A fragments (16 kv columns per k step), V
 * from the stage whose descriptor is dv. A descriptor plus (bytes >> 4)
 * addresses `bytes` further: the start-address field cannot carry over,
 * shared memory being under 256 KB. */
static __device__ __forceinline__ void fgh_issue_pv(float (&o)[1][FGH_DT][4],
                                                    const fg_u32 (&pa)[FGH_PV_STEPS][4], fg_u64 dv) {
#pragma unroll
    for (int kk = 0; kk < FGH_PV_STEPS; kk++)
        fgh_mma_rs_cols<FGH_DS>(&o[0][0][0], pa[kk], dv + ((kk * 16 * 128) >> 4), FGH_REGION_BYTES);
    fgh_commit();
}

/* A tile's exponentials against the running row maxima as they stand, no
 * new maxima taken: P packed straight into its wgmma A fragments, s left
 * as it is, the row sums added to l_run. The result is
 * the same: out = O / l and LSE = m + log2 l hold for whatever m both O and
 * l are taken against, as long as no exponential overflows. So the warp
 * takes this path only where every one of its rows has a finite running
 * maximum (a row that has met no key takes its first maximum the usual
 * way) and the scale is positive, and keeps it only where each thread's
 * partial sums stay under 2^12 (no score more than 12 log2 units over its
 * row's maximum: P stays far inside fp16's range, whose largest value is
 * under 2^16, and O's float accumulators). Otherwise it returns false
 * and the caller runs the tile the usual way (fga_tile_softmax, O
 * rescaled, P packed again) from s, which this left unchanged. A tile on
 * this path skips the maxima's FMNMX and shuffles, alpha's two
 * exponentials and O's rescale: with random data
 * every tile after the first few. Measured (H200, attention_notes f36,
 * two rounds): D=64 noop -10 to -12% time, causal -3 to -11%, prefix_lm
 * -12 to -14%, alibi -7 to -10%, document -7 to -8%; D=128 noop -3 to -5%,
 * softcap -5 to -7%, the rest level to -5%. */
#define FGH_STALE_BOUND 4096.f
static __device__ __forceinline__ bool fgh_tile_exp_stale(const float (&s)[1][FGH_NT][4], const float (&m_run)[1][2],
                                                          float (&l_run)[1][2], fg_u32 (&pa)[FGH_PV_STEPS][4],
                                                          float mult) {
    if (!__all_sync(0xffffffffu, m_run[0][0] > FGA_NEG_INF && m_run[0][1] > FGA_NEG_INF && mult > 0.f)) return false;
    float t0 = 0.f, t1 = 0.f;
#pragma unroll
    for (int kk = 0; kk < FGH_PV_STEPS; kk++) {
        float p[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            p[h][0] = fga_exp2(fmaf(s[0][2 * kk + h][0], mult, -m_run[0][0]));
            p[h][1] = fga_exp2(fmaf(s[0][2 * kk + h][1], mult, -m_run[0][0]));
            p[h][2] = fga_exp2(fmaf(s[0][2 * kk + h][2], mult, -m_run[0][1]));
            p[h][3] = fga_exp2(fmaf(s[0][2 * kk + h][3], mult, -m_run[0][1]));
            t0 += p[h][0] + p[h][1];
            t1 += p[h][2] + p[h][3];
        }
        fga_pack_p_step(pa[kk], p[0], p[1]);
    }
    if (!__all_sync(0xffffffffu, t0 < FGH_STALE_BOUND && t1 < FGH_STALE_BOUND)) return false;
    l_run[0][0] += t0;
    l_run[0][1] += t1;
    return true;
}

/* Wait for every product issued (O is defined from here on); lane 0 then
 * releases the V stage whose empty barrier is `v_empty` when `release`. */
static __device__ __forceinline__ void fgh_wait_pv(float (&o)[1][FGH_DT][4], bool release, fg_u32 v_empty,
                                                   int lane) {
    fgh_wait<0>();
    fgh_fence_regs<FGH_DT * 4>(&o[0][0][0]);
    if (release && lane == 0) fgh_bar_arrive(v_empty);
}

/* Where O goes through Q's rows and a TMA store (fgh_store_o<false>): with
 * two consumers, which end their walks together. Measured (H200, 2026-11-29,
 * attention_notes f30): D=128 document -7.6% time, flamingo -3.9%, causal
 * -1.8%, noop level; with three consumers in turns (D=64) mixed: document
 * -2.7%, local_global +2.0%, sliding_window +2.5% (the later Q release), so
 * those release Q after their last S and store through FGH_O_BUF or by
 * fga_store. */
#define FGH_O_SMEM (FGH_CONSUMERS == 2)
static_assert(FG_LAUNCH_O_MAP_fg_attention_fwd == (FGH_O_SMEM || FGH_O_BUF),
              "fwd_sm90_geometry's o_map: forward.c encodes out's map for the kernels that read it");

/* Lane 0: K_j's stage is no longer read, nor (after the walk's last item,
 * where O does not go through Q's rows) Q. */
static __device__ __forceinline__ void fgh_release_k(int lane, fg_u32 k_empty, bool last, fg_u32 q_empty) {
    if (lane == 0) {
        fgh_bar_arrive(k_empty);
        if (!FGH_O_SMEM && last) fgh_bar_arrive(q_empty);
    }
}

/* A consumer's 64 rows of O, normalised, written to `sO` in the layout the
 * tensor maps' boxes describe (64-column regions, 128-byte swizzle), then
 * stored by the TMA unit, one box a region (rows past q_len are not
 * written). Without OWN, `sO` is the consumer's own rows of Q (its last S
 * has read them), released to the loader once the TMA unit has read them:
 * one thread arrives for the consumer's four warps. With OWN, `sO` is its
 * rows of FGH_O_BUF, whose previous store (a walk ago) the same thread
 * waits for first; Q was released after the last S. Through shared
 * memory, a warp's stores are FGH_DT / 2 stmatrix instead of FGH_DT * 2
 * four-byte global stores, whose queue stalled the walk's end (ncu: 13% of
 * document's consumer samples at D=128). The LSE as fga_store writes it. */
template <bool OWN>
static __device__ __forceinline__ void fgh_store_o(const float (&o)[1][FGH_DT][4], const float (&m_run)[1][2],
                                                   const float (&l_run)[1][2], const fga_args &a,
                                                   const fgh_tmap *omap, fg_u32 sO, int b, int h, int q0c, int cw,
                                                   int warp, int lane, fg_u32 q_empty) {
    if (OWN) {
        /* the buffer's last store has been read (long since: a walk ago) */
        if (warp == 0 && lane == 0) fgh_bulk_wait<0, true>();
        fgh_named_sync(1 + cw, 128);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const float l = fga_quad_sum(l_run[0][r]);
        const float inv = fga_row_inv(l);
        /* lane's address: row lane % 8 of tile lane / 8, tiles the column groups i0 .. i0 + 3 */
        const int row = warp * 16 + 8 * r + (lane & 7);
#pragma unroll
        for (int i0 = 0; i0 < FGH_DT; i0 += 4) {
            const int g = i0 + (lane >> 3);
            fgh_stmatrix_x4(sO + (g >> 3) * FGH_Q_REGION + fgh_swz128(row, (g & 7) * 16),
                            fg_pack2(o[0][i0][2 * r] * inv, o[0][i0][2 * r + 1] * inv),
                            fg_pack2(o[0][i0 + 1][2 * r] * inv, o[0][i0 + 1][2 * r + 1] * inv),
                            fg_pack2(o[0][i0 + 2][2 * r] * inv, o[0][i0 + 2][2 * r + 1] * inv),
                            fg_pack2(o[0][i0 + 3][2 * r] * inv, o[0][i0 + 3][2 * r + 1] * inv));
        }
        const int qi = q0c + warp * 16 + 8 * r + (lane >> 2);
        if ((lane & 3) == 0 && qi < a.q_len) fga_store_lse(a, b, h, qi, m_run[0][r], l);
    }
    fgh_fence_async_smem();
    fgh_named_sync(1 + cw, 128);
    if (warp == 0 && lane == 0) {
#pragma unroll
        for (int r = 0; r < FGH_DS / 64; r++) fgh_tma_store(omap, sO + r * FGH_Q_REGION, r * 64, q0c, h, b);
        fgh_bulk_commit();
        if (!OWN) {
            fgh_bulk_wait<0, true>();
            fgh_bar_arrive_n(q_empty, 4);
        }
    }
}

/* ---- the walk ---------------------------------------------------------------- */

/* The kv tiles a q tile visits, in the same order for the producer and
 * every consumer, each as one int: the tile's first kv index (a multiple
 * of 128) with its block's state in the q tile's first block-mask row in
 * bits 0-1 and in its second in bits 2-3 (FGH_ABSENT, FGH_PARTIAL,
 * FGH_FULL). A consumer's 64 rows lie in one of the two rows and take that
 * row's state: an absent block is all -inf for it.
 *
 * Without FGH_MERGE (128-row q tiles, one mask row) the items come from
 * fga_plan: the row's partial blocks, then its full ones. With it (192-row
 * tiles) and a block mask, fgh_walk_make writes them to shared memory: the
 * first row's blocks (partial, then full), then the blocks of the second
 * row that the first lacks, in the second row's order. */
#define FGH_ABSENT 0
#define FGH_PARTIAL 1
#define FGH_FULL 2
#define FGH_BOTH(st) ((st) | (st) << 2) /* one state for both rows */

/* A q tile's walk as every party reads it: from the list in shared memory
 * that the producer's builder warps wrote (FGH_MERGE with a block mask),
 * else from the block mask's row (fga_plan) or every tile in order. */
struct fgh_walk {
    const int *list; /* the merged list, or NULL */
    fga_plan pl;
    int n_items;
};

/* Item j of the walk, at cursor c (a list is indexed by j, a block-mask
 * row or the dense walk stepped by the cursor: no division per item). */
static __device__ __forceinline__ int fgh_walk_item(const fgh_walk &w, int j, const fga_cursor &c) {
    if (FGH_MERGE && w.list) return w.list[j];
    bool partial;
    const int kv0 = fga_cursor_kv0<FGH_BLOCK_N>(w.pl, c, partial);
    return kv0 | FGH_BOTH(partial ? FGH_PARTIAL : FGH_FULL);
}

/* Item j of the walk, then the cursor on to the next. */
static __device__ __forceinline__ int fgh_walk_take(const fgh_walk &w, int j, fga_cursor &c) {
    const int item = fgh_walk_item(w, j, c);
    fga_cursor_next(w.pl, c);
    return item;
}

/* A ring of N stages walked one item at a time, as counters (the stage,
 * the parity of its current use, and whether every stage has been used
 * once) instead of g % N and g / N per item. */
template <int N>
struct fgh_ring {
    int s, ph;
    bool lap;
};
template <int N>
static __device__ __forceinline__ void fgh_ring_next(fgh_ring<N> &r) {
    if (++r.s == N) {
        r.s = 0;
        r.ph ^= 1;
        r.lap = true;
    }
}

/* The walk from the block mask's row (128-row q tiles) or, without a block
 * mask, every tile in order; with FGH_MERGE and a block mask the list
 * (written by fgh_walk_build, published by the list barriers). */
static __device__ __forceinline__ fgh_walk fgh_walk_of(const fga_args &a, int b, int h, int q0, const int *list) {
    fgh_walk w;
    w.list = FGH_MERGE && a.has_block_mask ? list : 0;
    if (w.list) {
        w.pl.part = w.pl.full = 0;
        w.pl.n_partial = 0;
        w.pl.per_block = 1;
        w.pl.kv_block = FGH_BLOCK_N;
        w.n_items = list[FGH_MERGE_MAX_KB - 1];
    } else {
        w.pl = fga_plan_make<FGH_BLOCK_N>(a, b, h, q0);
        w.n_items = w.pl.n_items;
    }
    return w;
}

/* The merged list of a 192-row q tile (FGH_MERGE, a block mask), written by
 * the `n` threads with index `t` of one group (the producer's builder
 * warps) that synchronise on named barrier `bar`: both rows' block states
 * into st0 / st1, then the first row's tiles by every thread, then the
 * second row's blocks that the first lacks, compacted in order by the
 * group's first warp with a ballot per 32 blocks (the same order every
 * launch, so the sums' order is too). The count goes to the list's last
 * slot. */
/* Entry i of a block-mask row whose index rows start at `base`: its
 * partial blocks, then its full ones. */
static __device__ __forceinline__ int fgh_row_block(const fga_args &a, fg_i64 base, int n_partial, int i) {
    return i < n_partial ? ((const int *)a.kv_idx)[base + i] : ((const int *)a.full_idx)[base + i - n_partial];
}

/* (Written for the producer's 32 registers: the rows are kept as offsets
 * and counts, not as two fga_plans.) */
static __device__ __forceinline__ void fgh_walk_build(const fga_args &a, int b, int h, int q0, unsigned char *st,
                                                      int *list, int t, int n, int bar) {
    const int mb = a.bm_batch == 1 ? 0 : b, mh = a.bm_heads == 1 ? 0 : h;
    const fg_i64 rows = ((fg_i64)mb * a.bm_heads + mh) * a.bm_q_blocks;
    const int r0 = q0 / a.bm_q_block;
    const int r1 = min(min(q0 + FGH_BLOCK_M, a.q_len) - 1, a.bm_q_blocks * a.bm_q_block - 1) / a.bm_q_block;
    const bool two = r1 != r0;
    const fg_i64 base0 = (rows + r0) * a.bm_kv_blocks, base1 = (rows + r1) * a.bm_kv_blocks;
    const int np0 = ((const int *)a.kv_num)[rows + r0], nb0 = np0 + ((const int *)a.full_num)[rows + r0];
    const int np1 = ((const int *)a.kv_num)[rows + r1], nb1 = two ? np1 + ((const int *)a.full_num)[rows + r1] : 0;
    const int per = a.bm_kv_block / FGH_BLOCK_N;
    unsigned char *st0 = st, *st1 = st + FGH_MERGE_MAX_KB;
    if (two) {
        for (int i = t; i < a.bm_kv_blocks; i += n) st0[i] = st1[i] = FGH_ABSENT;
        fgh_named_sync(bar, n);
        for (int i = t; i < nb0; i += n) st0[fgh_row_block(a, base0, np0, i)] = i < np0 ? FGH_PARTIAL : FGH_FULL;
        for (int i = t; i < nb1; i += n) st1[fgh_row_block(a, base1, np1, i)] = i < np1 ? FGH_PARTIAL : FGH_FULL;
        fgh_named_sync(bar, n);
    }
    for (int i = t; i < nb0 * per; i += n) {
        const int blk = i / per, sub = i - blk * per;
        const int kb = fgh_row_block(a, base0, np0, blk);
        const int s0 = blk < np0 ? FGH_PARTIAL : FGH_FULL;
        list[i] = (kb * a.bm_kv_block + sub * FGH_BLOCK_N) | s0 | (two ? st1[kb] : s0) << 2;
    }
    if (t < 32) {
        const int lane = t;
        int m = nb0 * per;
        for (int i0 = 0; i0 < nb1; i0 += 32) {
            const int i = i0 + lane;
            int kb = 0;
            bool take = false;
            if (i < nb1) {
                kb = fgh_row_block(a, base1, np1, i);
                take = st0[kb] == FGH_ABSENT;
            }
            const unsigned bal = __ballot_sync(0xffffffffu, take);
            if (take) {
                const int at = m + __popc(bal & ((1u << lane) - 1u)) * per, s1 = st1[kb];
                for (int sub = 0; sub < per; sub++)
                    list[at + sub] = (kb * a.bm_kv_block + sub * FGH_BLOCK_N) | FGH_ABSENT | s1 << 2;
            }
            m += __popc(bal) * per;
        }
        if (lane == 0) list[FGH_MERGE_MAX_KB - 1] = m;
    }
    fgh_named_sync(bar, n);
}

/* Work tile t of the launch, in the order the tile counter hands them
 * out: sections of a.l2_heads (batch, head) pairs whose K and V fit in L2
 * together, and in a section the q blocks from the heaviest (the last
 * rows of a causal mask) to the lightest across the section's heads, so
 * that the longest tiles start first and a late light tile fills in
 * (longest-processing-time first); the last section takes the pairs left. */
static __device__ __forceinline__ void fgh_tile_of(const fga_args &a, int t, int &b, int &h, int &q0) {
    const int pairs = a.heads_q * a.batch, per = a.l2_heads * a.q_tiles;
    const int sec = t / per, r = t - sec * per;
    const int width = min(a.l2_heads, pairs - sec * a.l2_heads); /* pairs in this section */
    const int qblk = r / width, bh = sec * a.l2_heads + (r - qblk * width);
    h = bh % a.heads_q;
    b = bh / a.heads_q;
    q0 = (a.q_tiles - 1 - qblk) * FGH_BLOCK_M;
}

/* The n-th tile of this block's walk, as the scheduler published it in
 * slot n & 1 (released through that slot's list barrier): its batch, head
 * and first q row, or false past the last tile. */
static __device__ __forceinline__ bool fgh_next_tile(const fga_args &a, volatile int *slots, fg_u32 bar_lf, int n,
                                                     int n_tiles, int &b, int &h, int &q0) {
    fgh_bar_wait(bar_lf + 8 * (n & 1), (n >> 1) & 1);
    const int t = slots[n & 1];
    if (t >= n_tiles) return false;
    fgh_tile_of(a, t, b, h, q0);
    return true;
}

/* ---- the kernel ------------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(FGH_THREADS, 1)
fg_attention_fwd(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p,
                 const __grid_constant__ fgh_maps maps) {
    extern __shared__ __align__(1024) unsigned char fgh_smem[];
    const fg_u32 sQ = (fga_smem_addr(fgh_smem) + 1023u) & ~1023u;
    const fg_u32 sK = sQ + FGH_Q_BYTES;
    const fg_u32 sV = sK + FGH_K_STAGES * FGH_TILE_BYTES;
    /* mbarriers, 8 bytes each: Q full / empty, K full / empty, V full /
     * empty, the two list buffers' full / empty. */
    const fg_u32 sOb = sV + FGH_V_STAGES * FGH_TILE_BYTES; /* FGH_O_BUF */
    const fg_u32 bar_q = sOb + FGH_O_BUF_BYTES, bar_qe = bar_q + 8;
    const fg_u32 bar_kf = bar_qe + 8, bar_ke = bar_kf + 8 * FGH_K_STAGES;
    const fg_u32 bar_vf = bar_ke + 8 * FGH_K_STAGES, bar_ve = bar_vf + 8 * FGH_V_STAGES;
    const fg_u32 bar_lf = bar_ve + 8 * FGH_V_STAGES, bar_le = bar_lf + 16;
    /* The two tile slots (the tile of the n-th walk of this block in slot
     * n & 1), published with the list barriers. */
    volatile int *const slots = (volatile int *)(fgh_smem + (bar_le + 16 - fga_smem_addr(fgh_smem)));
    /* Column parts: [consumer][buffer][128 columns], FGA_COL_BYTES each;
     * then the merged walk's block states and its two list buffers. */
    unsigned char *const after_bars = fgh_smem + (bar_q + FGH_BAR_BYTES - fga_smem_addr(fgh_smem));
    fg_mask_col *const col_parts = (fg_mask_col *)after_bars;
    unsigned char *const walk_states = after_bars + 2 * FGH_CONSUMERS * 128 * FGA_COL_BYTES;
    int *const lists = (int *)(walk_states + 2 * FGH_MERGE_MAX_KB); /* [2][FGH_MERGE_MAX_KB] */
    const bool built = FGH_MERGE && a.has_block_mask; /* the walks come from the builders' lists */

    const int tid = threadIdx.x, wg = fgh_warp_group(tid), warp = (tid >> 5) & 3, lane = tid & 31;
    const int n_tiles = a.q_tiles * a.heads_q * a.batch;

    if (tid == 0) {
        fgh_bar_init(bar_q, 1);
        fgh_bar_init(bar_qe, 4 * FGH_CONSUMERS); /* one arrival per consumer warp */
#pragma unroll
        for (int i = 0; i < FGH_K_STAGES; i++) {
            fgh_bar_init(bar_kf + 8 * i, 1);
            fgh_bar_init(bar_ke + 8 * i, 4 * FGH_CONSUMERS);
        }
#pragma unroll
        for (int i = 0; i < FGH_V_STAGES; i++) {
            fgh_bar_init(bar_vf + 8 * i, 1);
            fgh_bar_init(bar_ve + 8 * i, 4 * FGH_CONSUMERS);
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            fgh_bar_init(bar_lf + 8 * i, 96); /* the scheduler warps */
            fgh_bar_init(bar_le + 8 * i, 4 * FGH_CONSUMERS + 1); /* and the loader */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FGH_PRODUCER_REGS));
        if (warp == 0) {
            /* The loader, one thread. Its n-th tile waits for the
             * consumers to release Q (their last S of tile n - 1), loads
             * Q, then every item's K and V. The stages are rings over
             * all of this block's items (fgh_ring): use u of a stage
             * (parity ph = u & 1) waits, from the second lap on, for the
             * release of use u - 1, the phase of parity ph ^ 1 of the
             * stage's empty barrier. */
            if (lane == 0) {
                fgh_ring<FGH_K_STAGES> kr = {0, 0, false};
                fgh_ring<FGH_V_STAGES> vr = {0, 0, false};
                for (int n = 0;; n++) {
                    int b, h, q0;
                    if (!fgh_next_tile(a, slots, bar_lf, n, n_tiles, b, h, q0)) break;
                    const int hk = h / (a.heads_q / a.heads_kv);
                    const fgh_walk w = fgh_walk_of(a, b, h, q0, lists + (n & 1) * FGH_MERGE_MAX_KB);
                    if (n > 0) {
                        /* Where Q's rows take O (FGH_O_SMEM), Q is released
                         * after the walk's store: tile n's Q is asked into
                         * the L2 first, while the consumers end tile n - 1
                         * (the loader gets here once that walk's last K and V
                         * are issued, stages ahead of its end), so that its
                         * load after the release waits for the L2, not DRAM
                         * (Q is read once). */
                        if (FGH_O_SMEM)
#pragma unroll
                            for (int r = 0; r < FGH_DS / 64; r++)
#pragma unroll
                                for (int i = 0; i < FGH_BLOCK_M / FGH_Q_BOX; i++)
                                    fgh_tma_prefetch_l2(&maps.q, r * 64, q0 + i * FGH_Q_BOX, h, b);
                        fgh_bar_wait(bar_qe, (n - 1) & 1);
                    }
                    fgh_bar_expect(bar_q, FGH_Q_BYTES);
#pragma unroll
                    for (int r = 0; r < FGH_DS / 64; r++)
#pragma unroll
                        for (int i = 0; i < FGH_BLOCK_M / FGH_Q_BOX; i++)
                            fgh_tma_load(sQ + r * FGH_Q_REGION + i * FGH_Q_BOX * 128, &maps.q, r * 64,
                                         q0 + i * FGH_Q_BOX, h, b, bar_q);
                    fga_cursor c = {0, 0};
                    for (int j = 0; j < w.n_items; j++) {
                        const int kv0 = fgh_walk_take(w, j, c) & ~15;
                        if (kr.lap) fgh_bar_wait(bar_ke + 8 * kr.s, kr.ph ^ 1);
                        fgh_tma_tile(sK + kr.s * FGH_TILE_BYTES, &maps.k, kv0, hk, b, bar_kf + 8 * kr.s);
                        fgh_ring_next(kr);
                        if (vr.lap) fgh_bar_wait(bar_ve + 8 * vr.s, vr.ph ^ 1);
                        fgh_tma_tile(sV + vr.s * FGH_TILE_BYTES, &maps.v, kv0, hk, b, bar_vf + 8 * vr.s);
                        fgh_ring_next(vr);
                    }
                    fgh_bar_arrive(bar_le + 8 * (n & 1));
                }
            }
        } else {
            /* The scheduler (warps 1-3): the n-th tile of this block is
             * blockIdx.x, then one from the tile counter, in slot n & 1
             * once the walk two before has ended everywhere, with its
             * merged list (FGH_MERGE and a block mask) in buffer n & 1.
             * Past the last tile it publishes the end (t >= n_tiles). */
            const int t3 = tid - 32;
            for (int n = 0;; n++) {
                if (n >= 2) fgh_bar_wait(bar_le + 8 * (n & 1), ((n >> 1) - 1) & 1);
                if (t3 == 0) slots[n & 1] = n == 0 ? (int)blockIdx.x : atomicAdd((int *)a.tile_counter, 1) + (int)gridDim.x;
                fgh_named_sync(FGH_BUILD_BAR, 96);
                const int t = slots[n & 1];
                if (built && t < n_tiles) {
                    int b, h, q0;
                    fgh_tile_of(a, t, b, h, q0);
                    fgh_walk_build(a, b, h, q0, walk_states, lists + (n & 1) * FGH_MERGE_MAX_KB, t3, 96, FGH_BUILD_BAR);
                }
                fgh_bar_arrive(bar_lf + 8 * (n & 1)); /* each releases its own writes */
                if (t >= n_tiles) break;
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FGH_CONSUMER_REGS));

    /* A consumer. Descriptors of its 64 rows of Q (64 lines into each
     * region) and of the first K and V stages. */
    const int cw = wg - 1;
    const fg_u64 dq = fgh_desc_k(sQ + (fg_u32)(cw * 64 * 128));
    const fg_u64 dk = fgh_desc_k(sK), dv = fgh_desc_v(sV);
    /* The K stage of the next S and the V stage of the next P V, over all
     * of this block's items, as the loader walks them. */
    fgh_ring<FGH_K_STAGES> kr = {0, 0, false};
    fgh_ring<FGH_V_STAGES> vr = {0, 0, false};
    int shared_cols = 0; /* tiles so far whose column parts were shared */
    for (int n = 0;; n++) {
        int b, h, q0;
        if (!fgh_next_tile(a, slots, bar_lf, n, n_tiles, b, h, q0)) break;
        /* This thread's rows are qrow0 + {0, 8}; the consumer's 64 rows lie
         * in one block-mask row, the walk's first or (merged) second. */
        const int qrow0 = q0 + cw * 64 + warp * 16 + (lane >> 2);
        const int my_shift = FGH_MERGE && a.has_block_mask && (q0 + cw * 64) / a.bm_q_block != q0 / a.bm_q_block ? 2 : 0;
        const fgh_walk w = fgh_walk_of(a, b, h, q0, lists + (n & 1) * FGH_MERGE_MAX_KB);
        fga_rows<1> rows;
        fga_rows_init(rows, a, p, b, h, qrow0);

        float o[1][FGH_DT][4];
#pragma unroll
        for (int i = 0; i < FGH_DT; i++) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.f;
        float m_run[1][2] = {{FGA_NEG_INF, FGA_NEG_INF}}, l_run[1][2] = {{0.f, 0.f}};
        float s[1][FGH_NT][4];
        fg_u32 pa[FGH_PV_STEPS][4]; /* P of the previous tile as wgmma A fragments */
        fgh_bar_wait(bar_q, n & 1);
        if (!FGH_O_SMEM && w.n_items == 0 && lane == 0) fgh_bar_arrive(bar_qe); /* Q is not read */

        /* The block mask's index of the next item is read one tile ahead, so
         * its global-memory latency stays off the loop's critical path. */
        fga_cursor ahead = {0, 0};
        int next_item = 0;
        if (!built && w.n_items > 0) {
            next_item = fgh_walk_take(w, 0, ahead);
        }
        fg_mask_col col_ahead; /* the next partial item's column part (FGH_COLS_AHEAD) */
        bool prev_absent = false; /* tile j - 1 was absent: no P V to issue for it */
        for (int j = 0; j < w.n_items; j++) {
            /* (lists are in shared memory: no need to read ahead) */
            const int item = built ? w.list[j] : next_item, kv0 = item & ~15;
            const int mine = (item >> my_shift) & 3;
            /* A block that this consumer's mask row lacks (merged walks)
             * adds nothing to its rows: P = 0, and the running maxima, sums
             * and O stay as they are. */
            const bool absent = FGH_MERGE && mine == FGH_ABSENT;
            const bool any_partial = (item & 15) != FGH_BOTH(FGH_FULL);
            const int ks = kr.s;
            fgh_bar_wait(bar_kf + 8 * ks, kr.ph);
            fgh_ring_next(kr);
            /* Ping-pong: wait for this consumer's turn. Consumer 0 goes first,
             * then 1, ...; turn barrier FGH_TURN_BAR + c counts 256 threads,
             * consumer c's own 128 waiting and the previous consumer's 128
             * arriving. All consumers walk the same items, so every arrival
             * meets a wait: consumer 0 skips its first wait, the last consumer
             * its last hand-over, in every tile. */
            if (FGH_PINGPONG && (cw != 0 || j > 0)) fgh_named_sync(FGH_TURN_BAR + cw, 256);

            /* An absent tile issues neither of its products (S_j, and P_j V_j
             * in the next step), only the deferred P_{j-1} V_{j-1}, and
             * hands the turn on at once. It is a path of its own from here
             * to the loop's end: with the products of both paths joined
             * before their wait, ptxas serialised the wgmma pipeline
             * (C7515). Its stages are waited for and released as in the
             * other path. */
            if (FGH_MERGE && absent) {
                const int vs = vr.s, vph = vr.ph;
                if (j > 0) {
                    fgh_ring_next(vr);
                    fgh_bar_wait(bar_vf + 8 * vs, vph);
                    if (!prev_absent) {
                        fgh_fence();
                        fgh_issue_pv(o, pa, dv + ((vs * FGH_TILE_BYTES) >> 4));
                    }
                }
                if (FGH_PINGPONG && (cw != FGH_CONSUMERS - 1 || j + 1 < w.n_items))
                    fgh_named_arrive(FGH_TURN_BAR + (cw + 1) % FGH_CONSUMERS, 256);
                fgh_release_k(lane, bar_ke + 8 * ks, j + 1 == w.n_items, bar_qe);
                if (!built && j + 1 < w.n_items) next_item = fgh_walk_take(w, j + 1, ahead);
                fgh_wait_pv(o, j > 0, bar_ve + 8 * vs, lane);
                prev_absent = true;
                continue;
            }

            /* S_j = Q K_j^T, then the deferred P_{j-1} V_{j-1}. */
            const fg_u64 dk_j = dk + ((ks * FGH_TILE_BYTES) >> 4);
            fgh_fence();
#pragma unroll
            for (int kk = 0; kk < FGH_QK_STEPS; kk++) {
                const int koff = (kk & 3) * 32;
                const fg_u64 da = dq + (((kk >> 2) * FGH_Q_REGION + koff) >> 4);
                const fg_u64 db = dk_j + (((kk >> 2) * FGH_REGION_BYTES + koff) >> 4);
                if (FGH_BLOCK_N == 176)
                    fgh_mma_ss_n176(&s[0][0][0], da, db, kk > 0);
                else if (FGH_BLOCK_N == 128)
                    fgh_mma_ss_n128(&s[0][0][0], da, db, kk > 0);
                else
                    fgh_mma_ss_n64<0, 0>(&s[0][0][0], da, db, kk > 0);
            }
            fgh_commit();
            /* The next item, while S runs (at the top of the loop its
             * block-mask read and cursor arithmetic would delay this
             * consumer's turn, which every other consumer waits for). */
            if (!built && j + 1 < w.n_items) next_item = fgh_walk_take(w, j + 1, ahead);
            asm volatile("" : "+r"(next_item)); /* computed here, not sunk to its use */

            /* Where they are shared (FGA_SHARED_COLS), the mask column parts of
             * a tile that is partial for any consumer, one column per thread of
             * the warp group, while S runs; a barrier of the warp group (named
             * barrier 1 + cw) publishes them. It sits between the two products:
             * between the second one and its wait, ptxas serialises the wgmma
             * pipeline (C7514). Two buffers, taken in turn by those tiles: a
             * buffer is rewritten two such tiles later, after every thread has
             * passed the barrier of the one in between, so after its last
             * read. */
            const fg_mask_col *cols = 0;
            if (FGA_SHARED_COLS) {
                const int c = tid & 127;
                if (any_partial) {
                    fg_mask_col *buf = (fg_mask_col *)((unsigned char *)col_parts +
                                                       (cw * 2 + (shared_cols & 1)) * 128 * FGA_COL_BYTES);
                    shared_cols++;
                    if (c < FGH_BLOCK_N)
                        buf[c] = FGH_COLS_AHEAD && j > 0 ? col_ahead : fga_mask_col_at<false>(rows, a, p, buf, kv0, c);
                    fgh_named_sync(1 + cw, 128);
                    cols = buf;
                }
                if (FGH_COLS_AHEAD && j + 1 < w.n_items && c < FGH_BLOCK_N) {
                    const int nitem = built ? w.list[j + 1] : next_item;
                    if ((nitem & 15) != FGH_BOTH(FGH_FULL))
                        col_ahead = fga_mask_col_at<false>(rows, a, p, (const fg_mask_col *)0, nitem & ~15, c);
                }
            }

            const int vs = vr.s, vph = vr.ph; /* V_{j-1}'s stage */
            if (j > 0) {
                fgh_ring_next(vr);
                fgh_bar_wait(bar_vf + 8 * vs, vph);
            }
            if (j > 0 && !prev_absent)
                fgh_issue_pv(o, pa, dv + ((vs * FGH_TILE_BYTES) >> 4));
            else
                fgh_commit(); /* an empty group, so the wait below is the same for every j */
            if (FGH_PINGPONG && (cw != FGH_CONSUMERS - 1 || j + 1 < w.n_items))
                fgh_named_arrive(FGH_TURN_BAR + (cw + 1) % FGH_CONSUMERS, 256);
            fgh_wait<1>();
            fgh_fence_regs<FGH_NT * 4>(&s[0][0][0]);
            fgh_release_k(lane, bar_ke + 8 * ks, j + 1 == w.n_items, bar_qe);

            /* Mods and softmax of tile j while P_{j-1} V_{j-1} runs. */
            const bool edge = kv0 + FGH_BLOCK_N > a.kv_len || q0 + FGH_BLOCK_M > a.q_len;
            float alpha[1][2] = {{1.f, 1.f}};
            fga_tile_mods<FGA_SHARED_COLS>(s, rows, a, p, kv0, mine == FGH_PARTIAL, edge, cols);
            /* Trees for the row maxima and sums where the mod has no
             * mask_mod (H200, attention_notes f33: noop D=128 -2.9% time,
             * D=64 -1.3%); with one they lost (f32: causal D=128 +4.4%,
             * D=64 +1.0%), where the compiler interleaves them with the
             * mask's work. */
            /* The wait for P_{j-1} V_{j-1} comes first: the exponentials
             * are packed straight into pa, which it reads. */
            fgh_wait_pv(o, j > 0, bar_ve + 8 * vs, lane); /* V_{j-1} is no longer read */
            const float mult = fga_log2_mult(a);
            if (!fgh_tile_exp_stale(s, m_run, l_run, pa, mult)) {
                fga_tile_softmax<1, FGH_NT, !FGA_MASK_MOD>(s, m_run, l_run, alpha, mult);
                fga_rescale(o, alpha);
#pragma unroll
                for (int kk = 0; kk < FGH_PV_STEPS; kk++) fga_pack_p_step(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
            }
            prev_absent = false;
        }
        if (w.n_items > 0) {
            const int vs = vr.s;
            fgh_bar_wait(bar_vf + 8 * vs, vr.ph);
            fgh_ring_next(vr);
            if (!prev_absent) {
                fgh_fence();
                fgh_issue_pv(o, pa, dv + ((vs * FGH_TILE_BYTES) >> 4));
            }
            fgh_wait_pv(o, true, bar_ve + 8 * vs, lane); /* the last V is no longer read */
        }
        if (lane == 0) fgh_bar_arrive(bar_le + 8 * (n & 1)); /* the slot and list are walked */
        if (FGH_O_SMEM || FGH_O_BUF) /* this consumer's 64 rows of Q's rows or of the buffer */
            fgh_store_o<FGH_O_BUF>(o, m_run, l_run, a, &maps.o, (FGH_O_BUF ? sOb : sQ) + (fg_u32)(cw * 64 * 128), b, h,
                                   q0 + cw * 64, cw, warp, lane, bar_qe);
        else
            fga_store(o, m_run, l_run, a, b, h, qrow0);
    }
    /* the last store's shared memory is read before the block ends */
    if (FGH_O_BUF && warp == 0 && lane == 0) fgh_bulk_wait<0, true>();
}
