/*
 * split_check.h -- the CUDA program test_split (compiles it) and gpu_split
 * (runs it) use to hold the split mods to the whole ones: for every (q_idx,
 * kv_idx) of a square, fg_mask_split must give what fg_mask_mod gives and
 * fg_score_split the same bits as fg_score_mod, with the row, column and
 * head parts computed once, as the attention kernel does; and a mask of
 * the distance alone (FG_MASK_DIST) the same from fg_mask_dist at q_idx -
 * kv_idx, and a score_mod of the distance (FG_SCORE_DIST) the same bits
 * from fg_score_dist and its per-diagonal part.
 */
#ifndef FLEXGEN_SPLIT_CHECK_H
#define FLEXGEN_SPLIT_CHECK_H

#include <stdlib.h>

#include "codegen.h"

/* One block per q row, threads over kv: indices base .. base + n - 1.
 * bad[0]: mask mismatches, bad[1]: score mismatches (two NaNs count as
 * equal). Where the mask folds over a tile (FG_MASK_TILE), each position
 * is checked in the boxes of three shapes (16 x 128, 64 x 16, 8 x 64 rows
 * by columns, cut from the square) that hold it: fg_mask_fold<false> where
 * the box's atoms of q_idx or kv_idx alone are the same, and
 * fg_mask_fold<true> where all are, must give fg_mask_mod's result there;
 * bad[2], bad[3], bad[4] count the boxes fg_mask_tile_init answered 2, 1
 * and 0 for. */
static const char split_check_kernel[] =
    "extern \"C\" __global__ void fg_split_check(const __grid_constant__ fg_mod_params p,\n"
    "                                            int b, int h, int n, int base, int *bad) {\n"
    "    const int q_idx = base + (int)blockIdx.x;\n"
    "    const fg_mask_head mhd = fg_mask_head_init(p, b, h);\n"
    "    const fg_score_head shd = fg_score_head_init(p, b, h);\n"
    "    const fg_mask_row mr = fg_mask_row_init(p, mhd, b, h, q_idx);\n"
    "    const fg_score_row sr = fg_score_row_init(p, shd, b, h, q_idx);\n"
    "    for (int kv_idx = base + (int)threadIdx.x; kv_idx < base + n; kv_idx += blockDim.x) {\n"
    "        const fg_mask_col mc = fg_mask_col_init(p, mhd, b, h, kv_idx);\n"
    "        const fg_score_col sc = fg_score_col_init(p, shd, b, h, kv_idx);\n"
    "        if (fg_mask_mod(p, b, h, q_idx, kv_idx) !=\n"
    "            fg_mask_split(p, mhd, b, h, q_idx, kv_idx, mr, mc))\n"
    "            atomicAdd(&bad[0], 1);\n"
    "#if FG_MASK_DIST\n"
    "        if (fg_mask_mod(p, b, h, q_idx, kv_idx) != fg_mask_dist(p, mhd, b, h, q_idx - kv_idx))\n"
    "            atomicAdd(&bad[0], 1);\n"
    "#endif\n"
    "#if FG_MASK_TILE\n"
    "        for (int k = 0; k < 3; k++) {\n"
    "            const int hq = k == 0 ? 16 : k == 1 ? 64 : 8, hk = k == 0 ? 128 : k == 1 ? 16 : 64;\n"
    "            const int q_lo = base + (q_idx - base) / hq * hq, kv_lo = base + (kv_idx - base) / hk * hk;\n"
    "            fg_mask_tile t;\n"
    "            const int u = fg_mask_tile_init(p, mhd, b, h, q_lo, min(q_lo + hq - 1, base + n - 1), kv_lo,\n"
    "                                            min(kv_lo + hk - 1, base + n - 1), t);\n"
    "            const bool whole = fg_mask_mod(p, b, h, q_idx, kv_idx);\n"
    "            if (u >= 1 && fg_mask_fold<false>(p, mhd, b, h, q_idx - kv_idx, t) != whole)\n"
    "                atomicAdd(&bad[0], 1);\n"
    "            if (u == 2 && fg_mask_fold<true>(p, mhd, b, h, q_idx - kv_idx, t) != whole)\n"
    "                atomicAdd(&bad[0], 1);\n"
    "            atomicAdd(&bad[4 - u], 1);\n"
    "        }\n"
    "#endif\n"
    "        const float s = (float)(q_idx * 31 + kv_idx * 17 - 4000) * 0.0137f;\n"
    "        const float x = fg_score_mod(p, s, b, h, q_idx, kv_idx);\n"
    "        const float y = fg_score_split(p, shd, s, b, h, q_idx, kv_idx, sr, sc);\n"
    "        if (__float_as_int(x) != __float_as_int(y) && !(x != x && y != y))\n"
    "            atomicAdd(&bad[1], 1);\n"
    "#if FG_SCORE_DIST\n"
    "        const fg_score_diag dg = fg_score_diag_init(p, shd, b, h, q_idx - kv_idx, (float)(q_idx - kv_idx));\n"
    "        const float z = fg_score_dist(p, shd, s, b, h, q_idx - kv_idx, dg);\n"
    "        if (__float_as_int(x) != __float_as_int(z) && !(x != x && z != z))\n"
    "            atomicAdd(&bad[1], 1);\n"
    "#if FG_SCORE_ADDS\n"
    "        /* score + Y under a power-of-two scale: one fma, the same bits */\n"
    "        const float x8 = fg_score_mod(p, s * 0.125f, b, h, q_idx, kv_idx);\n"
    "        const float z8 = fmaf(s, 0.125f, fg_score_addend(p, shd, b, h, q_idx - kv_idx, dg));\n"
    "        if (__float_as_int(x8) != __float_as_int(z8) && !(x8 != x8 && z8 != z8))\n"
    "            atomicAdd(&bad[1], 1);\n"
    "#endif\n"
    "#endif\n"
    "    }\n"
    "}\n";

/* A mask with more hoistable values than the splitter's table holds (55
 * locals of five row and column divisions each, then a row local and a
 * column division): past the limit values stay per element, and a row
 * local that found no room must not be read by any hoisted value.
 * malloc'd. */
static inline char *split_check_big_mod(void) {
    size_t cap = 16 * 1024, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    n += (size_t)snprintf(s + n, cap - n, "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n");
    for (int k = 0; k < 55; k++)
        n += (size_t)snprintf(s + n, cap - n,
                              "    int a%d = q_idx / %d + kv_idx %% %d + q_idx / %d + kv_idx / %d"
                              " + q_idx %% %d;\n",
                              k, k + 1, k + 2, k + 3, k + 4, k + 5);
    n += (size_t)snprintf(s + n, cap - n, "    int t = q_idx / 7;\n    return (a0");
    for (int k = 1; k < 55; k++) n += (size_t)snprintf(s + n, cap - n, " + a%d", k);
    snprintf(s + n, cap - n, " + t + kv_idx / 5) %% 3 == 0;\n}\n");
    return s;
}

/* common.cuh, the mod, its split with the rewrites `flags` asks for
 * (FGI_SPLIT_*) and the checking kernel (malloc'd). */
static inline fg_status split_check_source_flags(fg_ctx *ctx, const fg_mod *mod, unsigned flags, char **out) {
    const fgi_template *common = fgi_template_find("common.cuh");
    if (!common) return fgi_error(ctx, FG_ERR_NOT_FOUND, "common.cuh is not built in");
    fgi_buf b = {0};
    fgi_buf_puts(&b, common->text);
    fgi_buf_puts(&b, "\n");
    fg_status st = fgi_emit_mod_named(ctx, mod, "split_check.cu", &b);
    if (st == FG_OK) st = fgi_emit_split_math(ctx, mod, FGI_MATH_ACCURATE, flags, &b);
    fgi_buf_puts(&b, split_check_kernel);
    if (st == FG_OK && b.oom) st = FG_ERR_OUT_OF_MEMORY;
    if (st != FG_OK) {
        fgi_buf_free(&b);
        return st;
    }
    *out = fgi_buf_take(&b);
    return *out ? FG_OK : FG_ERR_OUT_OF_MEMORY;
}
static inline fg_status split_check_source(fg_ctx *ctx, const fg_mod *mod, char **out) {
    return split_check_source_flags(ctx, mod, 0, out);
}

/* Mods whose index casts FGI_SPLIT_INDEX_FLOATS rewrites (test_split,
 * gpu_split): ALiBi's form, the other order, one in a mask, and one the
 * rewrite must leave alone (not the bare indices). `rewritten`: how many
 * casts become fg_fsub of a column and a row part. */
static const struct {
    const char *text;
    int rewritten;
} split_check_index_casts[] = {
    {"const float *slopes;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + slopes[h] * (float)(kv_idx - q_idx);\n}\n",
     1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    float d = (float)(q_idx - kv_idx);\n    return score - 0.125f * d + (float)(kv_idx - q_idx) * 0.5f;\n}\n",
     2},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return (float)(q_idx - kv_idx) * 0.75f < 100.0f && q_idx >= kv_idx;\n}\n",
     1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + (float)(kv_idx - q_idx + 1) + (float)(kv_idx - kv_idx);\n}\n",
     0},
};

/* Masks and whether they read the indices through q_idx - kv_idx alone
 * (FG_MASK_DIST; test_split checks the flag and that fg_mask_dist reads
 * neither index, gpu_split that it gives fg_mask_mod's results): both
 * orders of the difference and of comparisons, a buffer read at the
 * distance, a cast of it, a head part; and masks that read an index
 * apart from the other (a bare index, a sum of the two, an index inside
 * a difference of other operands). */
static const struct {
    const char *text;
    int dist;
} split_check_distance[] = {
    {"int W = 5;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return kv_idx - q_idx <= W && kv_idx <= q_idx && !(q_idx == kv_idx && h == 1);\n}\n",
     1},
    {"const int *bias;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    int d = q_idx - kv_idx;\n"
     "    return kv_idx < q_idx ? bias[d] % 3 != 0 : (float)(kv_idx - q_idx) * 0.75f < (float)(h + 2);\n}\n",
     1},
    {"int S = 3;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return (q_idx - kv_idx) % (S + h) == 0 || q_idx > kv_idx && q_idx != kv_idx;\n}\n",
     1},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return q_idx >= kv_idx && kv_idx > 4;\n}\n",
     0},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return (q_idx + kv_idx) % 7 != 0;\n}\n",
     0},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return (q_idx - 1) - kv_idx >= 0;\n}\n",
     0},
};

/* Masks and whether they fold over a tile (FG_MASK_TILE; test_split checks
 * the flag and that fg_mask_fold reads neither index, gpu_split that it
 * gives fg_mask_mod's results in every box where fg_mask_tile_init allows
 * it): local_global's form, a dilated window through a local, an atom of
 * q_idx, atoms written the other way round and against a buffer, an atom
 * inside a larger column part, a local holding an atom; and masks that
 * do not fold (an index read apart outside a comparison, an equality) or
 * gain nothing from it (causal: atoms alone, of the distance; a window
 * through abs: no atom). */
static const struct {
    const char *text;
    int tile;
} split_check_fold[] = {
    {"int W = 100;\nint G = 40;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return kv_idx <= q_idx && (kv_idx < G || q_idx - kv_idx <= W);\n}\n",
     1},
    {"int D = 3;\nint W = 30;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    int d = q_idx - kv_idx;\n"
     "    return d >= 0 && d <= W * D && d % D == 0;\n}\n",
     1},
    {"int P = 70;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return q_idx < P + h || q_idx >= kv_idx && (q_idx - kv_idx) % 5 != 1;\n}\n",
     1},
    {"const int *lens;\nint W = 90;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return lens[h] > kv_idx || W >= q_idx - kv_idx && 0 <= kv_idx - q_idx + W;\n}\n",
     1},
    {"int G = 50;\nint W = 60;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return kv_idx < G && h != 1 || kv_idx <= q_idx && q_idx - kv_idx <= W;\n}\n",
     1},
    {"int G = 50;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    bool g = kv_idx >= G;\n"
     "    return !g || kv_idx <= q_idx && (q_idx - kv_idx) % 4 == 0;\n}\n",
     1},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return kv_idx % 4 == 0 || q_idx >= kv_idx;\n}\n",
     0},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return kv_idx == 5 || (q_idx - kv_idx) % 3 == 0;\n}\n",
     0},
    {"bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return q_idx >= kv_idx;\n}\n",
     0},
    {"int W = 40;\n"
     "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
     "    return abs(q_idx - kv_idx) < W;\n}\n",
     0},
};

/* score_mods and whether they read the indices through their distance
 * alone (FG_SCORE_DIST; test_split checks the flag and that the diagonal
 * and per-score functions read neither index, gpu_split that they give
 * fg_score_mod's bits, and fg_score_addend, where FG_SCORE_ADDS, its bits as
 * one fma under a scale of 1/8): ALiBi, a relative bias read at the distance, a
 * local of the distance read twice, a comparison choosing between two
 * uses of the score, a head part times the distance; and score_mods that
 * read an index apart or none at all. */
static const struct {
    const char *text;
    int dist, adds; /* FG_SCORE_DIST; FG_SCORE_ADDS (score + Y) */
} split_check_score_distance[] = {
    {"const float *slopes;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + slopes[h] * (float)(kv_idx - q_idx);\n}\n",
     1, 1},
    {"const float *bias;\nint R = 128;\n"
     "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + bias[q_idx - kv_idx + R];\n}\n",
     1, 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    float d = (float)(q_idx - kv_idx);\n"
     "    float w = score * 0.5f;\n"
     "    return w - 0.125f * d + d * d / (score * score + 1.0f);\n}\n",
     1, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return q_idx >= kv_idx ? score * 0.75f : score - (float)(h + 1);\n}\n",
     1, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + (float)(kv_idx - q_idx + 3) * exp2(-(float)(h + 1));\n}\n",
     1, 1},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return score + (float)(kv_idx - q_idx) * 0.5f + (float)kv_idx;\n}\n",
     0, 0},
    {"float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
     "    return 30.0f * tanh(score / 30.0f);\n}\n",
     0, 0},
};

#endif
