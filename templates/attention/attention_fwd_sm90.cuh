/*
 * attention_fwd_sm90.cuh -- the Hopper forward attention kernel (sm_90a):
 * the portable kernel's algorithm with the matrix products on wgmma, the
 * warp-group-wide asynchronous tensor-core instruction that reads its B
 * operand (and here also A for Q K^T) straight from shared memory.
 *
 * Shape. A thread block is three warp groups (384 threads) and owns a q tile
 * of 128 rows of one (batch, head). Warp group 0 is the producer: one of
 * its threads moves every tile with the Tensor Memory Accelerator (TMA,
 * cp.async.bulk.tensor) and the group gives most of its registers to the
 * others (setmaxnreg). Warp groups 1 and 2 are the consumers, 64 q rows
 * each (16 per warp); K and V stream past in tiles of 128 rows. Per
 * consumer and tile:
 *     S (64 x 128) = Q (64 x D) K^T         wgmma, A and B in shared memory
 *     P = online softmax of mods(S)         registers (attention_common.cuh)
 *     O (64 x D) += P (64 x 128) V          wgmma, A (P) in registers
 * The accumulator layouts are the mma.sync ones per warp, so the mods, the
 * softmax and the epilogue are attention_common.cuh's, with one 16-row slab
 * per warp and 16 n8 fragments per tile.
 *
 * Pipeline. Q takes one tile of shared memory, K two stages and V three
 * (three and four at D = 64, where a tile is half the size and a step
 * half as long: +2-4% measured with ping-pong).
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
 * that product and rescales O by the new row maxima. The last tile's P V
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
 * blocks ("regions", one for D = 64, two for D = 128), each region holds
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
 * caller's strides, boxes of 128 rows x 64 columns) and passes them as the
 * third kernel argument; fwd_sm90_geometry in src/codegen/kernels.c mirrors
 * the tile sizes and the shared-memory size.
 */

#if FG_HEAD_DIM != 64 && FG_HEAD_DIM != 128
#error "the Hopper kernel supports head dims 64 and 128"
#endif

#define FGH_THREADS 384                    /* producer + two consumer warp groups   */
#define FGH_BLOCK_M 128                    /* q rows per block, 64 per consumer     */
#define FGH_BLOCK_N 128                    /* kv rows per tile                      */
#define FGH_D FG_HEAD_DIM
#define FGH_TILE_BYTES (128 * FGH_D * 2)   /* one 128-row tile of Q, K or V         */
#define FGH_REGION_BYTES (128 * 128)       /* 128 rows of one 64-column region      */
#define FGH_NT (FGH_BLOCK_N / 8)           /* n8 fragments of S per warp            */
#define FGH_DT (FGH_D / 8)                 /* n8 fragments of O per warp            */
#define FGH_QK_STEPS (FGH_D / 16)          /* k steps of Q K^T                      */
#define FGH_PV_STEPS (FGH_BLOCK_N / 16)    /* k steps of P V                        */
#define FGH_K_STAGES (FGH_D == 64 ? 3 : 2)
#define FGH_V_STAGES (FGH_D == 64 ? 4 : 3)
#define FGH_PRODUCER_REGS 24               /* setmaxnreg: 24 + 2 x 240 per thread   */
#define FGH_CONSUMER_REGS 240              /* of the 3 x 128 threads fit 64K        */
/* Ping-pong (the consumers take turns issuing their products, see the
 * loop) at D = 64 only: there it measured +14% (noop) and +2-11% (causal,
 * sliding window, prefix LM); at D = 128 it was flat (-1% to +4%). */
#define FGH_PINGPONG (FGH_D == 64)
#define FGH_TURN_BAR 3                     /* named barriers 3 and 4: the turns     */
/* Q, the K stages, the V stages, the mbarriers (128 bytes), the shared
 * mask column parts (FGA_SHARED_COLS: two buffers per consumer of 128
 * columns, FGA_COL_BYTES each, 8 KB in all), and 1 KB to align the base to
 * 1024 bytes (the swizzle pattern's period); fgi_attn_geometry computes the
 * same, and reserves the column parts whether or not a mod uses them. */
#define FGH_SMEM_BYTES (FGH_TILE_BYTES * (1 + FGH_K_STAGES + FGH_V_STAGES) + 128 + 4 * 128 * FGA_COL_BYTES + 1024)

/* The kernel's third argument: q, k and v as [batch, heads, len, D]. */
struct fgh_maps {
    fgh_tmap q, k, v;
};
static_assert(sizeof(fgh_maps) == 384, "fgh_maps must match the host's three CUtensorMaps");

/* ---- the tiles' descriptors and loads ---------------------------------------- */

/* N-major operand (V rows, read transposed): the next 64 columns are one
 * region further; the next 8 kv rows 1024 bytes further. */
static __device__ __forceinline__ fg_u64 fgh_desc_v(fg_u32 addr) {
    return fgh_desc(addr, FGH_REGION_BYTES, 1024);
}

/* A whole 128-row tile: one box per 64-column region. */
static __device__ __forceinline__ void fgh_tma_tile(fg_u32 dst, const fgh_tmap *map, int row, int head, int batch,
                                                    fg_u32 bar) {
    fgh_bar_expect(bar, FGH_TILE_BYTES);
#pragma unroll
    for (int r = 0; r < FGH_D / 64; r++) fgh_tma_load(dst + r * FGH_REGION_BYTES, map, r * 64, row, head, batch, bar);
}

/* ---- tiles ------------------------------------------------------------------ */

/* O += P V for one tile: P as A fragments (16 kv columns per k step), V
 * from the stage whose descriptor is dv. A descriptor plus (bytes >> 4)
 * addresses `bytes` further: the start-address field cannot carry over,
 * shared memory being under 256 KB. */
static __device__ __forceinline__ void fgh_issue_pv(float (&o)[1][FGH_DT][4],
                                                    const fg_u32 (&pa)[FGH_PV_STEPS][4], fg_u64 dv) {
#pragma unroll
    for (int kk = 0; kk < FGH_PV_STEPS; kk++) fgh_mma_rs_d(&o[0][0][0], pa[kk], dv + ((kk * 16 * 128) >> 4));
    fgh_commit();
}

/* ---- the kernel ------------------------------------------------------------- */

extern "C" __global__ void __launch_bounds__(FGH_THREADS, 1)
fg_attention_fwd(const __grid_constant__ fga_args a, const __grid_constant__ fg_mod_params p,
                 const __grid_constant__ fgh_maps maps) {
    extern __shared__ __align__(1024) unsigned char fgh_smem[];
    const fg_u32 sQ = (fga_smem_addr(fgh_smem) + 1023u) & ~1023u;
    const fg_u32 sK = sQ + FGH_TILE_BYTES;
    const fg_u32 sV = sK + FGH_K_STAGES * FGH_TILE_BYTES;
    /* mbarriers, 8 bytes each: Q full, K full / empty, V full / empty. */
    const fg_u32 bar_q = sV + FGH_V_STAGES * FGH_TILE_BYTES;
    const fg_u32 bar_kf = bar_q + 8, bar_ke = bar_kf + 8 * FGH_K_STAGES;
    const fg_u32 bar_vf = bar_ke + 8 * FGH_K_STAGES, bar_ve = bar_vf + 8 * FGH_V_STAGES;
    /* Column parts: [consumer][buffer][128 columns], FGA_COL_BYTES each. */
    fg_mask_col *const col_parts =
        (fg_mask_col *)(fgh_smem + (bar_q + 128 - fga_smem_addr(fgh_smem)));

    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    /* Heavier q tiles (late rows of a causal mask) are scheduled first. */
    const int qt = a.q_tiles - 1 - (int)blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int hk = h / (a.heads_q / a.heads_kv);
    const int q0 = qt * FGH_BLOCK_M;
    const fga_plan pl = fga_plan_make<FGH_BLOCK_N>(a, b, h, q0);

    if (tid == 0) {
        fgh_bar_init(bar_q, 1);
#pragma unroll
        for (int i = 0; i < FGH_K_STAGES; i++) {
            fgh_bar_init(bar_kf + 8 * i, 1);
            fgh_bar_init(bar_ke + 8 * i, 8); /* one arrival per consumer warp */
        }
#pragma unroll
        for (int i = 0; i < FGH_V_STAGES; i++) {
            fgh_bar_init(bar_vf + 8 * i, 1);
            fgh_bar_init(bar_ve + 8 * i, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        /* The producer. A use u of a stage (item j = u * stages + stage)
         * waits for the release of use u - 1: the phase of parity
         * (u - 1) & 1 of the stage's empty barrier. */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(FGH_PRODUCER_REGS));
        if (tid == 0) {
            fgh_tma_tile(sQ, &maps.q, q0, h, b, bar_q);
            for (int j = 0; j < pl.n_items; j++) {
                bool partial;
                const int kv0 = fga_item_kv0<FGH_BLOCK_N>(pl, j, partial);
                const int ks = j % FGH_K_STAGES, ku = j / FGH_K_STAGES;
                if (ku > 0) fgh_bar_wait(bar_ke + 8 * ks, (ku - 1) & 1);
                fgh_tma_tile(sK + ks * FGH_TILE_BYTES, &maps.k, kv0, hk, b, bar_kf + 8 * ks);
                const int vs = j % FGH_V_STAGES, vu = j / FGH_V_STAGES;
                if (vu > 0) fgh_bar_wait(bar_ve + 8 * vs, (vu - 1) & 1);
                fgh_tma_tile(sV + vs * FGH_TILE_BYTES, &maps.v, kv0, hk, b, bar_vf + 8 * vs);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(FGH_CONSUMER_REGS));

    /* A consumer: this thread's rows are qrow0 + {0, 8}. */
    const int cw = wg - 1;
    const int qrow0 = q0 + cw * 64 + warp * 16 + (lane >> 2);
    fga_rows<1> rows;
    fga_rows_init(rows, a, p, b, h, qrow0);

    float o[1][FGH_DT][4];
#pragma unroll
    for (int i = 0; i < FGH_DT; i++) o[0][i][0] = o[0][i][1] = o[0][i][2] = o[0][i][3] = 0.f;
    float m_run[1][2] = {{FGA_NEG_INF, FGA_NEG_INF}}, l_run[1][2] = {{0.f, 0.f}};
    float s[1][FGH_NT][4];
    fg_u32 pa[FGH_PV_STEPS][4]; /* P of the previous tile as wgmma A fragments */

    /* Descriptors of this consumer's 64 rows of Q (64 lines into each
     * region) and of the first K and V stages. */
    const fg_u64 dq = fgh_desc_k(sQ + (fg_u32)(cw * 64 * 128));
    const fg_u64 dk = fgh_desc_k(sK), dv = fgh_desc_v(sV);
    fgh_bar_wait(bar_q, 0);

    /* The block mask's index of the next item is read one tile ahead, so
     * its global-memory latency stays off the loop's critical path. */
    bool next_partial = false;
    int next_kv0 = pl.n_items > 0 ? fga_item_kv0<FGH_BLOCK_N>(pl, 0, next_partial) : 0;
    for (int j = 0; j < pl.n_items; j++) {
        const bool partial = next_partial;
        const int kv0 = next_kv0;
        if (j + 1 < pl.n_items) next_kv0 = fga_item_kv0<FGH_BLOCK_N>(pl, j + 1, next_partial);
        const int ks = j % FGH_K_STAGES;
        fgh_bar_wait(bar_kf + 8 * ks, (j / FGH_K_STAGES) & 1);
        /* Ping-pong: wait for this consumer's turn. Consumer 0 goes first;
         * turn barrier 3 + c counts 256 threads, consumer c's own 128
         * waiting and the other's 128 arriving. Both consumers walk the
         * same items, so every arrival meets a wait: consumer 0 skips its
         * first wait, consumer 1 its last hand-over. */
        if (FGH_PINGPONG && (cw == 1 || j > 0)) fgh_named_sync(FGH_TURN_BAR + cw, 256);

        /* S_j = Q K_j^T, then the deferred P_{j-1} V_{j-1}. */
        const fg_u64 dk_j = dk + ((ks * FGH_TILE_BYTES) >> 4);
        fgh_fence();
#pragma unroll
        for (int kk = 0; kk < FGH_QK_STEPS; kk++) {
            const int off = ((kk >> 2) * FGH_REGION_BYTES + (kk & 3) * 32) >> 4;
            fgh_mma_ss_n128(&s[0][0][0], dq + off, dk_j + off, kk > 0);
        }
        fgh_commit();

        /* Where they are shared (FGA_SHARED_COLS), a partial tile's mask
         * column parts, one column per thread of the warp group, while S
         * runs; a barrier of the warp group (named barrier 1 + cw) publishes
         * them. It sits between the two products: between the second one
         * and its wait, ptxas serialises the wgmma pipeline (warning C7514).
         * Two buffers: a buffer is rewritten two tiles later, after every
         * thread has passed the barrier of the tile in between (partial
         * tiles come first in the walk, so that one is partial too), so
         * after its last read. */
        const fg_mask_col *cols = 0;
        if (FGA_SHARED_COLS && partial) {
            fg_mask_col *buf = (fg_mask_col *)((unsigned char *)col_parts +
                                               (cw * 2 + (j & 1)) * 128 * FGA_COL_BYTES);
            const int c = tid & 127;
            buf[c] = fga_mask_col_at<false>(rows, a, p, buf, kv0, c);
            if (cw == 0)
                asm volatile("bar.sync 1, 128;\n" ::: "memory");
            else
                asm volatile("bar.sync 2, 128;\n" ::: "memory");
            cols = buf;
        }

        const int vs = (j + FGH_V_STAGES - 1) % FGH_V_STAGES; /* V_{j-1}'s stage */
        if (j > 0) {
            fgh_bar_wait(bar_vf + 8 * vs, ((j - 1) / FGH_V_STAGES) & 1);
            fgh_issue_pv(o, pa, dv + ((vs * FGH_TILE_BYTES) >> 4));
        } else {
            fgh_commit(); /* an empty group, so the wait below is the same for every j */
        }
        if (FGH_PINGPONG && (cw == 0 || j + 1 < pl.n_items)) fgh_named_arrive(FGH_TURN_BAR + 1 - cw, 256);
        fgh_wait<1>();
        fgh_fence_regs<FGH_NT * 4>(&s[0][0][0]);
        if (lane == 0) fgh_bar_arrive(bar_ke + 8 * ks); /* K_j is no longer read */

        /* Mods and softmax of tile j while P_{j-1} V_{j-1} runs. */
        const bool edge = kv0 + FGH_BLOCK_N > a.kv_len || q0 + FGH_BLOCK_M > a.q_len;
        fga_tile_mods<FGA_SHARED_COLS>(s, rows, a, p, kv0, partial, edge, cols);
        float alpha[1][2];
        fga_tile_softmax(s, m_run, l_run, alpha, fga_log2_mult(a));

        fgh_wait<0>();
        fgh_fence_regs<FGH_DT * 4>(&o[0][0][0]);
        if (j > 0 && lane == 0) fgh_bar_arrive(bar_ve + 8 * vs); /* V_{j-1} is no longer read */
        fga_rescale(o, alpha);
#pragma unroll
        for (int kk = 0; kk < FGH_PV_STEPS; kk++) {
            pa[kk][0] = fg_pack2(s[0][2 * kk][0], s[0][2 * kk][1]);
            pa[kk][1] = fg_pack2(s[0][2 * kk][2], s[0][2 * kk][3]);
            pa[kk][2] = fg_pack2(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
            pa[kk][3] = fg_pack2(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
        }
    }
    if (pl.n_items > 0) {
        const int last = pl.n_items - 1, vs = last % FGH_V_STAGES;
        fgh_bar_wait(bar_vf + 8 * vs, (last / FGH_V_STAGES) & 1);
        fgh_fence();
        fgh_issue_pv(o, pa, dv + ((vs * FGH_TILE_BYTES) >> 4));
        fgh_wait<0>();
        fgh_fence_regs<FGH_DT * 4>(&o[0][0][0]);
    }
    fga_store(o, m_run, l_run, a, b, h, qrow0);
}
