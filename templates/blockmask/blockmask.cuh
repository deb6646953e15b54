/*
 * blockmask.cuh -- the GPU block-mask builder (FG_KERNEL_BLOCK_MASK).
 *
 * What the generated code provides. src/codegen/source.c builds the source
 * as: config macros, common.cuh, the emitted mod, this file (no split mods,
 * no prelude). Before this file, then:
 *   config macros (source.c):
 *     FG_KERNEL_BLOCK_MASK (1)  which kernel; not tested here
 *     FG_Q_BLOCK, FG_KV_BLOCK   the block sizes, powers of two in [16, 256]
 *                               (no dtype and no head dim: the builder reads
 *                               no tensor)
 *   the mod (src/codegen/emit.c):
 *     struct fg_mod_params      the mod's parameters, the classify kernel's
 *                               first argument, by value
 *     fg_mask_mod(p, b, h, q_idx, kv_idx)
 *                               the mask, called per position (true where
 *                               the mod has no mask_mod)
 *     FG_HAS_MASK_MOD, FG_HAS_SCORE_MOD and fg_score_mod are there too,
 *     unused here.
 * Nothing of common.cuh is used directly; the mod calls its helpers.
 *
 * Two kernels, launched back to back on one stream with no host round trip
 * between them:
 *
 *   fg_block_mask_classify  one warp per (b, h, q block, kv block) tile.
 *       Lane l owns the tile's columns l, l+32, ... and walks the rows; every
 *       few rows the warp votes, and as soon as some lane saw a true and some
 *       lane saw a false the tile is partial and the warp stops. Full and
 *       empty tiles must be evaluated everywhere (nothing else proves them),
 *       but those evaluations are independent, branch-free and spread over
 *       every lane of the GPU. Positions past q_len / kv_len are never
 *       evaluated: the last row / column block is judged on the part that
 *       exists. Interior tiles take a path without per-element bounds tests.
 *       Result: one byte per tile, 0 empty / 1 partial / 2 full.
 *
 *   fg_block_mask_compact  one warp per list: first the (b, h, q block) rows
 *       (-> kv_num_blocks / kv_indices and the full_ pair), then the
 *       (b, h, kv block) columns (-> the q_* transposes). The warp reads 32
 *       tiles at a time, and a ballot plus a popcount of the lanes below
 *       gives each partial / full tile its slot, so indices come out
 *       ascending; the unused tail of every index row is written with zeros.
 *       A mask that reads neither b nor h (per_b / per_h = 0) was
 *       classified for b = 0 / h = 0 only; every list reads those tiles.
 *
 * The layout and the classification rule are the CPU builder's
 * (src/blockmask/blockmask.c); the two must agree bit for bit.
 */

#ifndef FG_Q_BLOCK
#error "FG_Q_BLOCK must be defined"
#endif
#ifndef FG_KV_BLOCK
#error "FG_KV_BLOCK must be defined"
#endif

#define FG_BM_WARPS 8
#define FG_BM_FULL_WARP 0xffffffffu
/* Rows evaluated between two votes: enough independent evaluations per lane
 * to hide latency, few enough that a partial tile stops early. */
#define FG_BM_ROWS_PER_VOTE 8
#define FG_BM_COLS ((FG_KV_BLOCK + 31) / 32)

/* Walk rows [i0, i0 + FG_BM_ROWS_PER_VOTE) of a tile. Interior tiles
 * (checked = false) unroll two rows by all of a lane's columns:
 * independent evaluations for the scheduler, without so many inlined copies
 * of a heavy mask that compile time explodes. Ragged tiles are rare (one
 * row and one column of blocks) and test every position against the
 * clipped extent (nq, nk) in a plain loop. */
template <bool checked>
__device__ __forceinline__ void fg_bm_rows(const fg_mod_params &p, int b, int h, int q0, int k0,
                                           int i0, int nq, int nk, int lane, bool &any, bool &all) {
    if (checked) {
#pragma unroll 1
        for (int di = 0; di < FG_BM_ROWS_PER_VOTE * FG_BM_COLS; di++) {
            int i = i0 + di / FG_BM_COLS, j = lane + 32 * (di % FG_BM_COLS);
            if (i < nq && j < nk) {
                bool m = fg_mask_mod(p, b, h, q0 + i, k0 + j);
                any |= m;
                all &= m;
            }
        }
    } else {
#pragma unroll 2
        for (int di = 0; di < FG_BM_ROWS_PER_VOTE; di++) {
            int i = i0 + di;
#pragma unroll
            for (int c = 0; c < FG_BM_COLS; c++) {
                int j = lane + 32 * c;
                if (FG_KV_BLOCK >= 32 || j < FG_KV_BLOCK) {
                    bool m = fg_mask_mod(p, b, h, q0 + i, k0 + j);
                    any |= m;
                    all &= m;
                }
            }
        }
    }
}

/* Classify one tile with the calling warp; returns 0 / 1 / 2. */
template <bool checked>
__device__ __forceinline__ int fg_bm_classify_tile(const fg_mod_params &p, int b, int h, int q0,
                                                   int k0, int nq, int nk, int lane) {
    bool any = false, all = true;
    for (int i0 = 0; i0 < nq; i0 += FG_BM_ROWS_PER_VOTE) {
        fg_bm_rows<checked>(p, b, h, q0, k0, i0, nq, nk, lane, any, all);
        bool seen_true = __any_sync(FG_BM_FULL_WARP, any);
        bool seen_false = __any_sync(FG_BM_FULL_WARP, !all);
        if (seen_true && seen_false) return 1;
    }
    if (__any_sync(FG_BM_FULL_WARP, any)) return 2;
    return 0;
}

extern "C" __global__ void __launch_bounds__(FG_BM_WARPS * 32)
fg_block_mask_classify(const fg_mod_params p, int B, int H, int q_len, int kv_len, int q_off, int kv_off,
                       int QB, int KB, unsigned char *tiles) {
    int lane = threadIdx.x & 31;
    long long tile = (long long)blockIdx.x * FG_BM_WARPS + (threadIdx.x >> 5);
    long long ntiles = (long long)B * H * QB * KB;
    if (tile >= ntiles) return; /* whole warps leave together */
    int kb = (int)(tile % KB);
    long long r = tile / KB;
    int qb = (int)(r % QB);
    r /= QB;
    int h = (int)(r % H);
    int b = (int)(r / H);
    int q0 = qb * FG_Q_BLOCK, k0 = kb * FG_KV_BLOCK;
    int nq = q_len - q0 < FG_Q_BLOCK ? q_len - q0 : FG_Q_BLOCK;
    int nk = kv_len - k0 < FG_KV_BLOCK ? kv_len - k0 : FG_KV_BLOCK;
    int cls = (nq == FG_Q_BLOCK && nk == FG_KV_BLOCK)
                  ? fg_bm_classify_tile<false>(p, b, h, q_off + q0, kv_off + k0, nq, nk, lane)
                  : fg_bm_classify_tile<true>(p, b, h, q_off + q0, kv_off + k0, nq, nk, lane);
    if (lane == 0) tiles[tile] = (unsigned char)cls;
}

/* Compact one list of n tiles (tile i at t[i * stride]) into the partial and
 * full index lists and their counts. */
__device__ __forceinline__ void fg_bm_compact_list(const unsigned char *t, int n, int stride,
                                                   int lane, int *num_p, int *idx_p, int *num_f,
                                                   int *idx_f) {
    unsigned below = (1u << lane) - 1u;
    int cp = 0, cf = 0;
    for (int i0 = 0; i0 < n; i0 += 32) {
        int i = i0 + lane;
        int c = i < n ? t[(long long)i * stride] : 0;
        unsigned mp = __ballot_sync(FG_BM_FULL_WARP, c == 1);
        unsigned mf = __ballot_sync(FG_BM_FULL_WARP, c == 2);
        if (c == 1) idx_p[cp + __popc(mp & below)] = i;
        if (c == 2) idx_f[cf + __popc(mf & below)] = i;
        cp += __popc(mp);
        cf += __popc(mf);
    }
    for (int i = cp + lane; i < n; i += 32) idx_p[i] = 0;
    for (int i = cf + lane; i < n; i += 32) idx_f[i] = 0;
    if (lane == 0) {
        *num_p = cp;
        *num_f = cf;
    }
}

extern "C" __global__ void __launch_bounds__(FG_BM_WARPS * 32)
fg_block_mask_compact(int B, int H, int per_b, int per_h, int QB, int KB,
                      const unsigned char *tiles, int *kv_num, int *kv_idx, int *full_kv_num,
                      int *full_kv_idx, int *q_num, int *q_idx, int *full_q_num,
                      int *full_q_idx) {
    int lane = threadIdx.x & 31;
    long long w = (long long)blockIdx.x * FG_BM_WARPS + (threadIdx.x >> 5);
    long long rows = (long long)B * H * QB, cols = (long long)B * H * KB;
    bool is_row = w < rows;
    if (!is_row && w >= rows + cols) return;
    long long list = is_row ? w : w - rows;
    int inner = is_row ? QB : KB;
    long long bh = list / inner;
    int o = (int)(list % inner);
    /* the tile map holds [per_b ? B : 1][per_h ? H : 1] */
    long long src = (per_b ? bh / H : 0) * (per_h ? H : 1) + (per_h ? bh % H : 0);
    const unsigned char *t = tiles + src * QB * KB;
    if (is_row)
        fg_bm_compact_list(t + (long long)o * KB, KB, 1, lane, kv_num + list, kv_idx + list * KB,
                           full_kv_num + list, full_kv_idx + list * KB);
    else
        fg_bm_compact_list(t + o, QB, KB, lane, q_num + list, q_idx + list * QB, full_q_num + list,
                           full_q_idx + list * QB);
}
