/*
 * attention_common.cuh -- what the forward attention kernels share: the
 * argument block, the PTX wrappers both use, the walk over the block mask,
 * and the per-tile steps that do not depend on how S and O were computed
 * (scale and mods, the online softmax, the epilogue).
 *
 * Both kernels hold S and O as the tensor cores leave them: per warp, slabs
 * of 16 rows; per slab, n8 fragments of 4 values where value e sits at row
 * g + 8 * (e >> 1) and column 8 * i + 2 * t4 + (e & 1) (g = lane / 4,
 * t4 = lane % 4). mma.sync m16n8 and wgmma m64nN (per warp of the warp
 * group) both use that layout, so one set of tile steps serves the portable
 * kernel (attention_fwd.cuh: FGA_MT slabs per warp) and the Hopper kernel
 * (attention_fwd_sm90.cuh: one slab per warp, 128-column tiles).
 *
 * The online softmax keeps, per row, the largest score seen so far (m, in
 * log2 units: the scale and log2(e) are folded into one multiply so the
 * exponential is a single ex2.approx) and the sum of exp2(s - m) (l). A new
 * tile that raises m rescales l and the accumulator by exp2(m_old - m_new).
 * A row that has seen only masked scores keeps m = -inf; exponentials are
 * then taken against 0 instead of m, so -inf - -inf never happens and such a
 * row ends with l = 0: output 0 and LSE -inf, as FlexAttention defines a
 * fully masked row. l is summed per thread and reduced across the quad of
 * threads that share a row only at the end (the rescale factor is the same
 * for all four, so the partial sums stay consistent).
 *
 * The argument block fga_args is defined once, in src/attention/abi.def,
 * for the host (src/attention/attention.h) and for this file.
 *
 * What the generated code provides. src/codegen/source.c builds the source
 * as: config macros, common.cuh, the emitted mod, the split mods, this
 * file, the kernel template. Before this file, then:
 *   config macros (source.c):
 *     FG_KERNEL_ATTENTION_FWD or FG_KERNEL_ATTENTION_FWD_SM90 (1)
 *                          which kernel; no template tests it
 *     FG_DTYPE_BF16 or FG_DTYPE_FP16 (1)
 *                          the input type: picks the mma, wgmma and
 *                          conversion instructions (only FG_DTYPE_FP16 is
 *                          tested; bf16 is the default)
 *     FG_HEAD_DIM          D, a multiple of 16 in [16, 256] (checked below;
 *                          the Hopper kernel takes 64 and 128)
 *     FG_Q_BLOCK, FG_KV_BLOCK
 *                          the block sizes of the block masks the kernel is
 *                          made for: the portable kernel's q tile follows
 *                          FG_Q_BLOCK; FG_KV_BLOCK is read by neither
 *                          attention template (the sizes the walk uses
 *                          come in fga_args)
 *   the mod (src/codegen/emit.c):
 *     FG_HAS_MASK_MOD, FG_HAS_SCORE_MOD (0 or 1)
 *                          whether the mod has a mask_mod / a score_mod
 *                          (FGA_MASK_MOD, FGA_SCORE_MOD below)
 *     struct fg_mod_params the mod's parameters, the kernel's second
 *                          argument, by value
 *     fg_mask_mod, fg_score_mod
 *                          the whole mods (true / the score where the mod
 *                          has none); these kernels call the split ones
 *   the split mods (src/codegen/emit_split.c, always emitted for these
 *   kernels; FG_HAS_SPLIT_MODS is defined to 1 with them):
 *     struct fg_mask_head, fg_mask_row, fg_mask_col
 *                          the mask's values that read only b, h and
 *                          parameters / also q_idx / also kv_idx (a struct
 *                          may be empty)
 *     fg_mask_head_init(p, b, h), fg_mask_row_init(p, hd, b, h, q_idx),
 *     fg_mask_col_init(p, hd, b, h, kv_idx)
 *                          compute them
 *     fg_mask_split(p, hd, b, h, q_idx, kv_idx, row, col)
 *                          the mask from them, bit for bit fg_mask_mod
 *     FG_MASK_ROW_COSTLY, FG_MASK_COL_COSTLY (0 or 1)
 *                          whether fg_mask_row_init / fg_mask_col_init
 *                          does costly work (a division, a buffer read, a
 *                          transcendental call): FGA_SHARED_COLS below,
 *                          the Hopper backward's FGS_ROWS_SHARED and
 *                          FGS_COLS_FIRST
 *     FG_MASK_COL_READS (0 or 1)
 *                          whether fg_mask_col_init reads a buffer: the
 *                          Hopper forward's FGH_COLS_AHEAD
 *     FG_MASK_ELEM_COSTLY (0 or 1)
 *                          whether what fg_mask_split does per element,
 *                          the hoisted parts aside, is costly: the Hopper
 *                          backward's mask by diagonals
 *     FG_SCORE_ELEM_CALLS (0 or 1)
 *                          whether that per-score rest divides or calls a
 *                          costly builtin (softcap's tanh): FGA_DIST_TILES
 *     FG_MASK_DIST (0 or 1), fg_mask_dist(p, hd, b, h, d)
 *                          whether the mask reads q_idx and kv_idx only
 *                          through d = q_idx - kv_idx, and then the mask
 *                          as a function of d (fga_tile_mask_dist)
 *     struct fg_score_head, fg_score_row, fg_score_col, fg_score_head_init,
 *     fg_score_row_init, fg_score_col_init,
 *     fg_score_split(p, hd, score, b, h, q_idx, kv_idx, row, col)
 *                          the same for score_mod
 *     FG_SCORE_ELEM_COSTLY (0 or 1)
 *                          whether what fg_score_split does per score, the
 *                          hoisted parts aside, is costly (with
 *                          FG_SCORE_DIST: what fg_score_dist does): the
 *                          Hopper forward's FGH_CONSUMERS
 *     FG_SCORE_DIST (0 or 1), struct fg_score_diag,
 *     fg_score_diag_init(p, hd, b, h, d, fd), fg_score_dist(p, hd, score, b,
 *     h, d, dg)            whether score_mod reads q_idx and kv_idx only
 *                          through d, and then its part made once per
 *                          diagonal and the rest per score
 *                          (fga_tile_score_dist)
 *     FG_SCORE_ADDS (0 or 1), fg_score_addend(p, hd, b, h, d, dg)
 *                          with FG_SCORE_DIST: whether score_mod is
 *                          score + Y, and then Y (FGA_SCORE_FMA)
 *   common.cuh:            fg_u16, fg_u32, fg_i64, fg_u64, fg_pack2
 * and the library itself (scripts/embed_templates.py) prints the fields of
 * struct fga_args from src/attention/abi.def where this file says so.
 */

#ifndef FG_HEAD_DIM
#error "FG_HEAD_DIM must be defined by the code generator"
#endif
#if (FG_HEAD_DIM % 16) != 0 || FG_HEAD_DIM < 16 || FG_HEAD_DIM > 256
#error "FG_HEAD_DIM must be a multiple of 16 in [16, 256]"
#endif

/* The kernel's first argument, the host's fgi_attn_abi: its fields are
 * printed here from src/attention/abi.def when the templates are embedded
 * into the library (scripts/embed_templates.py). Strides are in elements
 * for (b, h, s). */
struct fga_args {
/* @abi src/attention/abi.def */
};
static_assert(sizeof(fga_args) == 320, "fga_args must match fgi_attn_abi");

#define FGA_NEG_INF __int_as_float(0xff800000)

#define FGA_LOG2E 1.4426950408889634f
#define FGA_LN2 0.6931471805599453f
#if defined(FG_HAS_MASK_MOD) && FG_HAS_MASK_MOD
#define FGA_MASK_MOD 1
#else
#define FGA_MASK_MOD 0
#endif
#if defined(FG_HAS_SCORE_MOD) && FG_HAS_SCORE_MOD
#define FGA_SCORE_MOD 1
#else
#define FGA_SCORE_MOD 0
#endif

/* ---- PTX wrappers --------------------------------------------------------- */

static __device__ __forceinline__ fg_u32 fga_smem_addr(const void *p) {
    fg_u32 r;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
    return r;
}

/* Programmatic dependent launch (compute capability 9.0; elsewhere, and
 * under an ordinary launch, both do nothing): fga_grid_launch_dependents
 * lets the launch queued after this one by fgi_kernel_run_dependent place
 * its blocks as this one's leave; that launch's fga_grid_wait holds its
 * block until this grid has finished and its writes are visible. Not
 * static: a kernel that calls neither would have NVRTC warn. */
__device__ __forceinline__ void fga_grid_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void fga_grid_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

static __device__ __forceinline__ float fga_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ float fga_log2(float x) {
    float r;
    asm("lg2.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
    return r;
}

static __device__ __forceinline__ float fga_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float fga_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* ---- the walk over the block mask ------------------------------------------- */

/* The kv tiles one q tile visits: items [0, n_partial * per_block) are
 * sub-tiles of partial blocks, the rest sub-tiles of full blocks. A mask
 * block of kv_block columns is kv_block / BLOCK_N kernel tiles; the host
 * checks that the kernel's q tile divides the mask's q block, so a q tile
 * never straddles two mask rows. Without a block mask every tile is
 * visited, as partial when the mod has a mask_mod and as full otherwise. */
struct fga_plan {
    const int *part, *full; /* index rows of the block mask (NULL: dense) */
    int n_partial, n_items, per_block, kv_block;
};

template <int BLOCK_N>
static __device__ __forceinline__ fga_plan fga_plan_make(const fga_args &a, int b, int h, int q0) {
    fga_plan pl;
    if (a.has_block_mask) {
        const int mb = a.bm_batch == 1 ? 0 : b, mh = a.bm_heads == 1 ? 0 : h;
        const fg_i64 row = ((fg_i64)mb * a.bm_heads + mh) * a.bm_q_blocks + q0 / a.bm_q_block;
        pl.part = (const int *)a.kv_idx + row * a.bm_kv_blocks;
        pl.full = (const int *)a.full_idx + row * a.bm_kv_blocks;
        pl.n_partial = ((const int *)a.kv_num)[row];
        pl.per_block = a.bm_kv_block / BLOCK_N;
        pl.kv_block = a.bm_kv_block;
        pl.n_items = (pl.n_partial + ((const int *)a.full_num)[row]) * pl.per_block;
    } else {
        pl.part = pl.full = 0;
        pl.n_partial = 0;
        pl.per_block = 1;
        pl.kv_block = BLOCK_N;
        pl.n_items = (a.kv_len + BLOCK_N - 1) / BLOCK_N;
    }
    return pl;
}

/* A position in the walk: mask block `blk` of the row (partial ones first),
 * kernel tile `sub` inside it. Stepping it costs no division. */
struct fga_cursor {
    int blk, sub;
};

/* First kv index of the cursor's tile, and whether that tile is partial. */
template <int BLOCK_N>
static __device__ __forceinline__ int fga_cursor_kv0(const fga_plan &pl, fga_cursor c, bool &partial) {
    if (!pl.part) {
        partial = FGA_MASK_MOD;
        return c.blk * BLOCK_N;
    }
    int kb;
    if (c.blk < pl.n_partial) {
        partial = true;
        kb = pl.part[c.blk];
    } else {
        partial = false;
        kb = pl.full[c.blk - pl.n_partial];
    }
    return kb * pl.kv_block + c.sub * BLOCK_N;
}

static __device__ __forceinline__ void fga_cursor_next(const fga_plan &pl, fga_cursor &c) {
    if (++c.sub == pl.per_block) {
        c.sub = 0;
        c.blk++;
    }
}

/* First kv index of item j, and whether its tile is partial. */
template <int BLOCK_N>
static __device__ __forceinline__ int fga_item_kv0(const fga_plan &pl, int j, bool &partial) {
    const int blk = j / pl.per_block;
    return fga_cursor_kv0<BLOCK_N>(pl, fga_cursor{blk, j - blk * pl.per_block}, partial);
}

/* ---- ragged and paged sequences ---------------------------------------------- */

/* For the kernels that read per-sequence lengths, positions and block
 * tables: the decode kernel and the forward's ragged form (FG_RAGGED).
 * Not static: a kernel that never calls them (the plain forward) would
 * have NVRTC warn about unused static functions. */

/* Sequence b's KV length: kv_lens[b] clamped into [0, kv_len], or kv_len. */
__device__ __forceinline__ int fga_seq_kv_len(const fga_args &a, int b) {
    if (!a.kv_lens) return a.kv_len;
    return max(0, min(((const int *)a.kv_lens)[b], a.kv_len));
}

/* The position of sequence b's first query: q_offsets[b], or q_offset. */
__device__ __forceinline__ int fga_seq_q_offset(const fga_args &a, int b) {
    return a.q_offsets ? ((const int *)a.q_offsets)[b] : a.q_offset;
}

/* Whether key j of a sequence (its row of the block table: `table`) lies
 * in a page the table names correctly: inside max_pages and an id in
 * [0, num_pages). Keys of any other page are never read and are masked. */
__device__ __forceinline__ bool fga_page_ok(const fga_args &a, const int *table, int j) {
    const int pi = j >> a.page_shift;
    if (pi >= a.max_pages) return false;
    const int page = table[pi];
    return page >= 0 && page < a.num_pages;
}

/* Where key j's row lives in a paged K or V (`base` at page 0 of the
 * sequence's KV head), or NULL when its page is bad (fga_page_ok). */
__device__ __forceinline__ const fg_u16 *fga_paged_row(const fga_args &a, const fg_u16 *base, fg_i64 page_stride,
                                                              fg_i64 row_stride, const int *table, int j) {
    if (!fga_page_ok(a, table, j)) return 0;
    const int page = table[j >> a.page_shift];
    return base + (fg_i64)page * page_stride + (fg_i64)(j & ((1 << a.page_shift) - 1)) * row_stride;
}

/* Keys of bad pages (fga_page_ok) in a tile of MT slabs x NT n8 fragments
 * from column kv0 become -inf; keys past the sequence are the range
 * pass's. Only tiles where some thread met a bad page come here. */
template <int MT, int NT>
static __device__ __forceinline__ void fga_mask_bad_pages(float (&s)[MT][NT][4], const fga_args &a, const int *table,
                                                          int kv0) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int j = kv0 + i * 8 + t4 * 2 + c;
            if (j >= a.kv_len || fga_page_ok(a, table, j)) continue;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) s[mt][i][c] = s[mt][i][2 + c] = FGA_NEG_INF;
        }
}

/* ---- mods split by dependency ------------------------------------------------ */

/* What one thread knows of its rows for the whole sweep: the parts of the
 * mods that do not depend on kv_idx, computed once per (b, h) and once per
 * row it owns (rows qrow0 + 16 * mt + {0, 8}). Rows past Q_LEN are masked by
 * the kernel; their parts are computed at the last row so that a mod never
 * sees an index out of range. */
template <int MT> struct fga_rows {
    fg_mask_head mhd;
    fg_score_head shd;
    fg_mask_row mrow[MT][2];
    fg_score_row srow[MT][2];
    int b, h, qrow0;
};

template <int MT>
static __device__ __forceinline__ void fga_rows_init(fga_rows<MT> &r, const fga_args &a,
                                                     const fg_mod_params &p, int b, int h, int qrow0) {
    r.b = b;
    r.h = h;
    r.qrow0 = qrow0;
    r.mhd = fg_mask_head_init(p, b, h);
    r.shd = fg_score_head_init(p, b, h);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int qi = min(qrow0 + mt * 16 + e * 8, a.q_len - 1) + a.q_offset;
            r.mrow[mt][e] = fg_mask_row_init(p, r.mhd, b, h, qi);
            r.srow[mt][e] = fg_score_row_init(p, r.shd, b, h, qi);
        }
}

/* ---- the per-tile steps ------------------------------------------------------ */

/* Mask column parts shared between threads: a kernel may compute a partial
 * tile's parts once per column, FGA_COL_BYTES each, into shared memory,
 * instead of in every thread that owns the column. Worth it only for parts
 * the emitter calls costly (FG_MASK_COL_COSTLY: a division, a buffer read,
 * a transcendental call) that fit; one without any has nothing to share. */
#define FGA_COL_BYTES 16
#define FGA_SHARED_COLS                                                                                  \
    (FGA_MASK_MOD && FG_MASK_COL_COSTLY && !__is_empty(fg_mask_col) && sizeof(fg_mask_col) <= FGA_COL_BYTES)

/* The mask's column part of column `col` of the tile: computed once per
 * column by the caller and read from `cols` (COLS), or computed here. A
 * compile-time choice, so that a kernel that always shares the parts does
 * not carry the code that computes them (for natten, two run-time
 * divisions per column) in its element loop. */
template <bool COLS, int MT>
static __device__ __forceinline__ fg_mask_col fga_mask_col_at(const fga_rows<MT> &r, const fga_args &a,
                                                              const fg_mod_params &p, const fg_mask_col *cols,
                                                              int kv0, int col) {
    if (COLS) return cols[col];
    return fg_mask_col_init(p, r.mhd, r.b, r.h, min(kv0 + col, a.kv_len - 1) + a.kv_offset);
}

/* The element loop of fga_tile_mods: the mods at every position of the
 * tile, mask_mod too when MASK. Indices past Q_LEN / KV_LEN are clamped to
 * the last row / column, so a mod only ever sees in-range indices; the
 * caller masks those positions afterwards (fga_tile_range). Fragment by
 * fragment: the column parts of the mods once per column this thread owns
 * (two per n8 fragment, shared by all its rows), then the elements. */
template <int MT, int NT, bool MASK, bool COLS>
static __device__ __forceinline__ void fga_tile_mods_as(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                        const fga_args &a, const fg_mod_params &p, int kv0,
                                                        const fg_mask_col *cols) {
    const int t4 = threadIdx.x & 3, b = r.b, h = r.h;
    int qc[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int e = 0; e < 2; e++) qc[mt][e] = min(r.qrow0 + mt * 16 + e * 8, a.q_len - 1) + a.q_offset;
#pragma unroll
    for (int i = 0; i < NT; i++) {
        fg_mask_col mcol[2];
        fg_score_col scol[2];
        int kc[2];
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int col = i * 8 + t4 * 2 + c;
            kc[c] = min(kv0 + col, a.kv_len - 1) + a.kv_offset;
            if (MASK) mcol[c] = fga_mask_col_at<COLS, MT>(r, a, p, cols, kv0, col);
            if (FGA_SCORE_MOD) scol[c] = fg_score_col_init(p, r.shd, b, h, kc[c]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = qc[mt][e >> 1], ki = kc[e & 1];
                bool keep = true;
                if (MASK) keep = fg_mask_split(p, r.mhd, b, h, qi, ki, r.mrow[mt][e >> 1], mcol[e & 1]);
#if FGA_SCORE_MOD
                float v = s[mt][i][e] * a.scale;
                if (keep) v = fg_score_split(p, r.shd, v, b, h, qi, ki, r.srow[mt][e >> 1], scol[e & 1]);
                s[mt][i][e] = keep ? v : FGA_NEG_INF;
#else
                if (!keep) s[mt][i][e] = FGA_NEG_INF;
#endif
            }
        }
    }
}

/* Partial tiles masked by diagonals (fga_tile_mask_dist): mods whose mask
 * reads the distance alone, without a score_mod (dilated +17%,
 * sliding_window +3.5-4%) or with one whose per-score work a branch would
 * skip, which is then made at every position first (softcap +3-5%: no
 * branch per score). alibi's cheap score_mod lost 2-9% so and keeps the
 * element loop (bench/attention_notes.md f8). */
#define FGA_DIST_TILES (FG_MASK_DIST && (!FGA_SCORE_MOD || FG_SCORE_ELEM_CALLS))

/* The diagonals of a thread's fragment: element (mt, i, e) (row qrow0 +
 * 16 mt + 8 (e >> 1), column kv0 + 8 i + 2 t4 + (e & 1)) lies at distance
 * d = q_idx - kv_idx = d0 + 8 (2 mt + (e >> 1) - i) - (e & 1), so the MT x
 * NT x 4 elements share 2 (2 MT + NT - 1) distances: 34 for an m16 x n128
 * fragment's 64 elements. `diag(d, fd)` is made once per distance (fd:
 * d as a float, the tile's (float)d0 plus a constant, one FADD where a
 * conversion of d would take an IADD and an I2F: exact while |d| <= 2^24,
 * which the launch checks where a kernel reads it, FGI_SPLIT_DIST_FLOATS)
 * and `elem(x, v, d)` then runs on each element x on it with diag's value v.
 * Positions past the edges see distances of rows or columns that are not
 * there (a mod's operations are total) and are masked by fga_tile_range. */
template <int MT, int NT, class Diag, class Elem>
static __device__ __forceinline__ void fga_diagonals(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                     const fga_args &a, int kv0, const Diag &diag,
                                                     const Elem &elem) {
    const int t4 = threadIdx.x & 3;
    const int d0 = (r.qrow0 + a.q_offset) - (kv0 + 2 * t4 + a.kv_offset);
    const float fd0 = (float)d0;
#pragma unroll
    for (int j = 0; j < 2 * MT + NT - 1; j++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int d = d0 + 8 * (j - (NT - 1)) - c;
            const auto v = diag(d, fd0 + (float)(8 * (j - (NT - 1)) - c));
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = 2 * mt + hh - (j - (NT - 1));
                    if (i >= 0 && i < NT) elem(s[mt][i][2 * hh + c], v, d);
                }
        }
}

/* A mask of the distance, keep(d), once per diagonal, each element then a
 * select: masked elements become -inf. */
template <int MT, int NT, class Keep>
static __device__ __forceinline__ void fga_tile_mask_by(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                        const fga_args &a, int kv0, const Keep &keep) {
    fga_diagonals(
        s, r, a, kv0, [&](int d, float) { return keep(d); },
        [&](float &x, bool k, int) {
            if (!k) x = FGA_NEG_INF;
        });
}

#if FG_MASK_DIST
/* A mask of the distance alone (fg_mask_dist). */
template <int MT, int NT>
static __device__ __forceinline__ void fga_tile_mask_dist(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                          const fga_args &a, const fg_mod_params &p, int kv0) {
    fga_tile_mask_by(s, r, a, kv0, [&](int d) { return fg_mask_dist(p, r.mhd, r.b, r.h, d); });
}
#endif

#if FG_MASK_TILE
/* Partial tiles of a mask that folds (FG_MASK_TILE: emit_split.c, "the mask
 * folded over a tile"): the mask's monotone comparisons (atoms) made at the
 * ends of this warp's box of the tile (its 16 MT rows, the tile's columns),
 * and then, where those of q_idx or kv_idx alone hold one value over the
 * box (local_global's `kv_idx < GLOBAL` off its first block), the mask is
 * a function of the distance made once per diagonal; where the distance's
 * atoms do too (dilated's window away from its two ends), only what is
 * left of it (the divisibility test) is. A box where they do not takes
 * the element loop (never, for a mask of the distance alone). The box
 * holds in-range indices only; positions past the edges are masked by
 * fga_tile_range. */
template <bool COLS, int MT, int NT>
static __device__ __forceinline__ void fga_tile_mask_fold(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                          const fga_args &a, const fg_mod_params &p, int kv0,
                                                          const fg_mask_col *cols) {
    const int w0 = r.qrow0 - ((threadIdx.x & 31) >> 2); /* the warp's first row */
    fg_mask_tile t;
    const int u = fg_mask_tile_init(p, r.mhd, r.b, r.h, min(w0, a.q_len - 1) + a.q_offset,
                                    min(w0 + 16 * MT - 1, a.q_len - 1) + a.q_offset,
                                    min(kv0, a.kv_len - 1) + a.kv_offset,
                                    min(kv0 + 8 * NT - 1, a.kv_len - 1) + a.kv_offset, t);
    if (u == 2)
        fga_tile_mask_by(s, r, a, kv0, [&](int d) { return fg_mask_fold<true>(p, r.mhd, r.b, r.h, d, t); });
    else if (FG_MASK_DIST || u == 1)
        fga_tile_mask_by(s, r, a, kv0, [&](int d) { return fg_mask_fold<false>(p, r.mhd, r.b, r.h, d, t); });
    else
        fga_tile_mods_as<MT, NT, true, COLS>(s, r, a, p, kv0, cols);
}
#endif

/* Masks that fold take fga_tile_mask_fold for their partial tiles, beside
 * no score_mod, or beside one FGA_DIST_TILES makes at every position first
 * (a mask of the distance, whose element loop never runs). */
#define FGA_FOLD_TILES                                                                                   \
    (FG_MASK_TILE && FGA_MASK_MOD && (!FGA_SCORE_MOD || FGA_DIST_TILES) && !FGA_SCORE_DIST_TILES)

/* A score_mod of the form score + Y (FG_SCORE_ADDS) under a scale that
 * is a power of two (head dim 64's 1/8): the score's product q.k * scale
 * is then exact, so fma(q.k, scale, Y) rounds once where FADD(q.k *
 * scale, Y) did, the same float, in one instruction instead of two (short
 * of a product below 2^-126, where the fma keeps bits the product would
 * have lost). Carried by the kernels whose head dim makes the default
 * scale 1 / sqrt(D) a power of two (16, 64, 256; ALiBi at 256 -1.2%
 * time): at head dim 128 the unused copy of the loop cost 1.8%
 * (bench/attention_notes.md f11). */
#define FGA_SCORE_FMA (FG_SCORE_ADDS && (FG_HEAD_DIM == 16 || FG_HEAD_DIM == 64 || FG_HEAD_DIM == 256))
#if FGA_SCORE_FMA
static __device__ __forceinline__ bool fga_scale_pow2(const fga_args &a) {
    const unsigned u = __float_as_uint(a.scale), ex = (u >> 23) & 0xffu;
    return (u & 0x807fffffu) == 0 && ex != 0 && ex != 0xffu;
}
#endif

/* Tiles of a score_mod that reads the indices only through their distance
 * (FG_SCORE_DIST: ALiBi, relative biases), with no mask_mod or one of the
 * distance too: the score_mod's per-diagonal part (fg_score_diag_init,
 * ALiBi's I2F and FMUL) once per diagonal of the fragment, the mask
 * (MASK) there too, and only the rest (ALiBi's FADD; with FMA, the fma
 * above) per score. */
#define FGA_SCORE_DIST_TILES (FGA_SCORE_MOD && FG_SCORE_DIST && (!FGA_MASK_MOD || FG_MASK_DIST))

#if FGA_SCORE_DIST_TILES
template <int MT, int NT, bool MASK, bool FMA>
static __device__ __forceinline__ void fga_tile_score_dist(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                           const fga_args &a, const fg_mod_params &p, int kv0) {
    struct at_diag {
        fg_score_diag dg;
        bool keep;
    };
    fga_diagonals(
        s, r, a, kv0,
        [&](int d, float fd) {
            at_diag v{fg_score_diag_init(p, r.shd, r.b, r.h, d, fd), true};
#if FG_MASK_DIST
            if (MASK) v.keep = fg_mask_dist(p, r.mhd, r.b, r.h, d);
#endif
            return v;
        },
        [&](float &x, const at_diag &v, int d) {
#if FGA_SCORE_FMA
            const float sv = FMA ? fmaf(x, a.scale, fg_score_addend(p, r.shd, r.b, r.h, d, v.dg))
                                 : fg_score_dist(p, r.shd, x * a.scale, r.b, r.h, d, v.dg);
#else
            const float sv = fg_score_dist(p, r.shd, x * a.scale, r.b, r.h, d, v.dg);
#endif
            x = v.keep ? sv : FGA_NEG_INF;
        });
}
#endif

/* Positions past Q_LEN or KV_LEN become -inf (a tile crossing an edge). */
template <int MT, int NT>
static __device__ __forceinline__ void fga_tile_range(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                      const fga_args &a, int kv0) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (r.qrow0 + mt * 16 + (e >> 1) * 8 >= a.q_len || kv0 + i * 8 + t4 * 2 + (e & 1) >= a.kv_len)
                    s[mt][i][e] = FGA_NEG_INF;
}

/* Scale, mods and range for a tile of NT n8 fragments starting at column
 * kv0. The result stays in the units the softmax multiplies by
 * fga_log2_mult() on the way into exp2: with a score_mod, score_mod(q.k *
 * scale); without one, the raw q.k (the scale is folded into that
 * multiplier, so a full tile without score_mod costs nothing here). Masked
 * positions become -inf. mask_mod only in `partial` tiles, the range pass
 * only in `edge` ones (crossing Q_LEN or KV_LEN), so full tiles do no mask
 * work and partial ones inside the edges no range work; two element loops
 * in all (with and without mask_mod) keep the unrolled code small. With
 * COLS, the mask's column parts of every partial tile were computed once per
 * column by the caller and are read from `cols`. */
template <bool COLS, int MT, int NT>
static __device__ __forceinline__ void fga_tile_mods(float (&s)[MT][NT][4], const fga_rows<MT> &r,
                                                     const fga_args &a, const fg_mod_params &p,
                                                     int kv0, bool partial, bool edge,
                                                     const fg_mask_col *cols) {
#if FGA_SCORE_DIST_TILES
#if FGA_SCORE_FMA
    if (fga_scale_pow2(a)) {
        if (FGA_MASK_MOD && partial) fga_tile_score_dist<MT, NT, true, true>(s, r, a, p, kv0);
        else fga_tile_score_dist<MT, NT, false, true>(s, r, a, p, kv0);
    } else
#endif
    {
        if (FGA_MASK_MOD && partial) fga_tile_score_dist<MT, NT, true, false>(s, r, a, p, kv0);
        else fga_tile_score_dist<MT, NT, false, false>(s, r, a, p, kv0);
    }
#elif FGA_FOLD_TILES
    /* score_mod at every position, then the mask folded over the tile */
    if (FGA_SCORE_MOD) fga_tile_mods_as<MT, NT, false, false>(s, r, a, p, kv0, cols);
    if (partial) fga_tile_mask_fold<COLS>(s, r, a, p, kv0, cols);
#elif FGA_DIST_TILES
    /* score_mod at every position, then the mask by diagonals */
    if (FGA_SCORE_MOD) fga_tile_mods_as<MT, NT, false, false>(s, r, a, p, kv0, cols);
    if (FGA_MASK_MOD && partial) fga_tile_mask_dist(s, r, a, p, kv0);
#else
    if (FGA_MASK_MOD && partial)
        fga_tile_mods_as<MT, NT, true, COLS>(s, r, a, p, kv0, cols);
    else if (FGA_SCORE_MOD)
        fga_tile_mods_as<MT, NT, false, false>(s, r, a, p, kv0, cols);
#endif
    if (edge) fga_tile_range(s, r, a, kv0);
}

/* What turns fga_tile_mods' values into log2 units. */
static __device__ __forceinline__ float fga_log2_mult(const fga_args &a) {
    return FGA_SCORE_MOD ? FGA_LOG2E : a.scale_log2;
}

/* A row's new running maximum from its tile maximum `mx` (log2 units):
 * alpha, the factor its old sum and O rows take, and the maximum the
 * exponentials subtract (0 while the row has seen no key, so that -inf
 * scores give 0, not NaN). */
static __device__ __forceinline__ float fga_row_max_step(float &m_run, float mx, float &alpha) {
    const float m_new = fmaxf(m_run, mx);
    const float m_use = m_new == FGA_NEG_INF ? 0.f : m_new;
    alpha = fga_exp2(m_run - m_use);
    m_run = m_new;
    return m_use;
}

/* fga_tile_softmax's second half (mult > 0), a row at a time: the row's
 * maximum and sum as chains over the tile's column fragments. */
template <int MT, int NT>
static __device__ __forceinline__ void fga_tile_softmax_chain(float (&s)[MT][NT][4], float (&m_run)[MT][2],
                                                              float (&l_run)[MT][2], float (&alpha)[MT][2],
                                                              float mult) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = FGA_NEG_INF;
#pragma unroll
            for (int i = 0; i < NT; i++) mx = fmaxf(mx, fmaxf(s[mt][i][2 * r], s[mt][i][2 * r + 1]));
            const float m_use = fga_row_max_step(m_run[mt][r], fga_quad_max(mx) * mult, alpha[mt][r]);
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < NT; i++) {
                s[mt][i][2 * r] = fga_exp2(fmaf(s[mt][i][2 * r], mult, -m_use));
                s[mt][i][2 * r + 1] = fga_exp2(fmaf(s[mt][i][2 * r + 1], mult, -m_use));
                sum += s[mt][i][2 * r] + s[mt][i][2 * r + 1];
            }
            l_run[mt][r] = l_run[mt][r] * alpha[mt][r] + sum;
        }
    }
}

/* fga_tile_softmax's second half (mult > 0) with the row maxima and sums
 * as trees over the tile's NT column fragments, the thread's two rows side
 * by side: ceil(log2 NT) levels instead of chains of NT dependent FMNMX /
 * FADD. */
template <int MT, int NT>
static __device__ __forceinline__ void fga_tile_softmax_tree(float (&s)[MT][NT][4], float (&m_run)[MT][2],
                                                             float (&l_run)[MT][2], float (&alpha)[MT][2],
                                                             float mult) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float t[2][NT];
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int i = 0; i < NT; i++) t[r][i] = fmaxf(s[mt][i][2 * r], s[mt][i][2 * r + 1]);
#pragma unroll
        for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int i = 0; i + w < NT; i += 2 * w)
#pragma unroll
                for (int r = 0; r < 2; r++) t[r][i] = fmaxf(t[r][i], t[r][i + w]);
        float m_use[2];
#pragma unroll
        for (int r = 0; r < 2; r++)
            m_use[r] = fga_row_max_step(m_run[mt][r], fga_quad_max(t[r][0]) * mult, alpha[mt][r]);
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                s[mt][i][2 * r] = fga_exp2(fmaf(s[mt][i][2 * r], mult, -m_use[r]));
                s[mt][i][2 * r + 1] = fga_exp2(fmaf(s[mt][i][2 * r + 1], mult, -m_use[r]));
                t[r][i] = s[mt][i][2 * r] + s[mt][i][2 * r + 1];
            }
#pragma unroll
        for (int w = 1; w < NT; w *= 2)
#pragma unroll
            for (int i = 0; i + w < NT; i += 2 * w)
#pragma unroll
                for (int r = 0; r < 2; r++) t[r][i] += t[r][i + w];
#pragma unroll
        for (int r = 0; r < 2; r++) l_run[mt][r] = l_run[mt][r] * alpha[mt][r] + t[r][0];
    }
}

/* fga_tile_softmax's first half: where `mult` is not positive the values
 * are multiplied by it here (masked ones stay -inf) and the multiplier
 * left for the exponentials is 1; else the values stay and it is mult. */
template <int MT, int NT>
static __device__ __forceinline__ float fga_tile_prescale(float (&s)[MT][NT][4], float mult) {
    if (mult > 0.f) return mult;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[mt][i][e] = s[mt][i][e] == FGA_NEG_INF ? FGA_NEG_INF : s[mt][i][e] * mult;
    return 1.f;
}

/* Online softmax over one tile of fga_tile_mods' values: new row maxima,
 * the exponentials (in place, S becomes P), the running sums, and the
 * factor alpha by which the caller must rescale its accumulator rows before
 * adding this tile's P V. `mult` (fga_log2_mult) takes the values to log2
 * units; for a positive one the maximum is taken on the values as they are
 * and each exponent is a single fused multiply-add, exp2(s * mult - m). A
 * negative scale without score_mod reverses the order, so then the values
 * are multiplied first (masked ones stay -inf). TREE takes the maxima and
 * sums as trees (fga_tile_softmax_tree): the same terms, summed in another
 * order. */
template <int MT, int NT, bool TREE = false>
static __device__ __forceinline__ void fga_tile_softmax(float (&s)[MT][NT][4], float (&m_run)[MT][2],
                                                        float (&l_run)[MT][2], float (&alpha)[MT][2],
                                                        float mult) {
    mult = fga_tile_prescale(s, mult);
    if (TREE)
        fga_tile_softmax_tree(s, m_run, l_run, alpha, mult);
    else
        fga_tile_softmax_chain(s, m_run, l_run, alpha, mult);
}

/* A 16-key step of P as the A fragment of its P V product, in the dtype:
 * the two n8 column fragments `lo` (keys 0-7) and `hi` (keys 8-15) of a
 * thread's two rows, packed in pairs. */
static __device__ __forceinline__ void fga_pack_p_step(fg_u32 (&pa)[4], const float (&lo)[4], const float (&hi)[4]) {
    pa[0] = fg_pack2(lo[0], lo[1]);
    pa[1] = fg_pack2(lo[2], lo[3]);
    pa[2] = fg_pack2(hi[0], hi[1]);
    pa[3] = fg_pack2(hi[2], hi[3]);
}

template <int MT, int DT>
static __device__ __forceinline__ void fga_rescale(float (&o)[MT][DT][4], const float (&alpha)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < DT; i++) {
            o[mt][i][0] *= alpha[mt][0];
            o[mt][i][1] *= alpha[mt][0];
            o[mt][i][2] *= alpha[mt][1];
            o[mt][i][3] *= alpha[mt][1];
        }
}

/* What a row's O is multiplied by: 1 / l, its sum of exponentials, or 0 for
 * a row without a key (l = 0). */
static __device__ __forceinline__ float fga_row_inv(float l) { return l > 0.f ? 1.f / l : 0.f; }

/* Row qi's LSE (natural log; -inf for a row without a key), where the
 * call asks for it. */
static __device__ __forceinline__ void fga_store_lse(const fga_args &a, int b, int h, int qi, float m, float l) {
    if (!a.lse) return;
    float *lp = (float *)a.lse + ((fg_i64)b * a.heads_q + h) * a.q_len + qi;
    *lp = l > 0.f ? (m + fga_log2(l)) * FGA_LN2 : FGA_NEG_INF;
}

/* Normalise and write: out rows and, from one thread per quad, LSE. */
template <int MT, int DT>
static __device__ __forceinline__ void fga_store(const float (&o)[MT][DT][4], const float (&m_run)[MT][2],
                                                 const float (&l_run)[MT][2], const fga_args &a, int b,
                                                 int h, int qrow0) {
    const int t4 = threadIdx.x & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int qi = qrow0 + mt * 16 + r * 8;
            const float l = fga_quad_sum(l_run[mt][r]);
            if (qi >= a.q_len) continue;
            const float inv = fga_row_inv(l);
            fg_u16 *op = (fg_u16 *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)h * a.o_stride[1] +
                         (fg_i64)qi * a.o_stride[2];
#pragma unroll
            for (int i = 0; i < DT; i++)
                if (i * 8 < FG_HEAD_DIM) /* a kernel may accumulate padding columns */
                    *(fg_u32 *)(op + i * 8 + t4 * 2) = fg_pack2(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
            if (t4 == 0) fga_store_lse(a, b, h, qi, m_run[mt][r], l);
        }
    }
}
