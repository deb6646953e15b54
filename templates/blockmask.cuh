/*
 * blockmask.cuh -- the GPU block-mask builder (FG_KERNEL_BLOCK_MASK).
 *
 * Spliced after the emitted mod, so fg_mod_params and
 * fg_mask_mod(p, b, h, q_idx, kv_idx) exist; FG_Q_BLOCK and FG_KV_BLOCK are
 * the block sizes. Two kernels, launched back to back on one stream with no
 * host round trip between them:
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
 *
 * The layout and the classification rule are the CPU builder's
 * (src/blockmask.c); the two must agree bit for bit.
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

/* Walk rows [i0, i0 + FG_BM_ROWS_PER_VOTE) of a tile; `checked` tiles test
 * every position against the clipped extent (nq, nk). */
template <bool checked>
__device__ __forceinline__ void fg_bm_rows(const fg_mod_params &p, int b, int h, int q0, int k0,
                                           int i0, int nq, int nk, int lane, bool &any, bool &all) {
#pragma unroll
    for (int di = 0; di < FG_BM_ROWS_PER_VOTE; di++) {
        int i = i0 + di;
#pragma unroll
        for (int c = 0; c < FG_BM_COLS; c++) {
            int j = lane + 32 * c;
            bool in = checked ? (i < nq && j < nk) : (FG_KV_BLOCK >= 32 || j < FG_KV_BLOCK);
            if (in) {
                bool m = fg_mask_mod(p, b, h, q0 + i, k0 + j);
                any |= m;
                all &= m;
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
fg_block_mask_classify(const fg_mod_params p, int B, int H, int q_len, int kv_len, int QB, int KB,
                       unsigned char *tiles) {
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
                  ? fg_bm_classify_tile<false>(p, b, h, q0, k0, nq, nk, lane)
                  : fg_bm_classify_tile<true>(p, b, h, q0, k0, nq, nk, lane);
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
fg_block_mask_compact(int BH, int QB, int KB, const unsigned char *tiles, int *kv_num,
                      int *kv_idx, int *full_kv_num, int *full_kv_idx, int *q_num, int *q_idx,
                      int *full_q_num, int *full_q_idx) {
    int lane = threadIdx.x & 31;
    long long w = (long long)blockIdx.x * FG_BM_WARPS + (threadIdx.x >> 5);
    long long rows = (long long)BH * QB, cols = (long long)BH * KB;
    if (w < rows) {
        /* row w = (bh, qb): its KB tiles are contiguous */
        const unsigned char *t = tiles + w * KB;
        fg_bm_compact_list(t, KB, 1, lane, kv_num + w, kv_idx + w * KB, full_kv_num + w,
                           full_kv_idx + w * KB);
    } else if (w < rows + cols) {
        long long c = w - rows; /* column c = (bh, kb): stride KB */
        long long bh = c / KB;
        int kb = (int)(c % KB);
        const unsigned char *t = tiles + bh * QB * KB + kb;
        fg_bm_compact_list(t, QB, KB, lane, q_num + c, q_idx + c * QB, full_q_num + c,
                           full_q_idx + c * QB);
    }
}
