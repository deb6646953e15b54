/* ---- the mod: causal (mods/causal.c)
 * Emitted by flexgen from the checked syntax tree, not copied from the
 * file. Its canonical text (the kernel cache key's part):
 *
 *   bool mask_mod(int b, int h, int q_idx, int kv_idx) {
 *       return q_idx >= kv_idx;
 *   }
 */
#define FG_HAS_MASK_MOD 1
#define FG_HAS_SCORE_MOD 0

/* The mod's parameters, passed by value to every kernel; the host packs
 * the same layout (fgi_param_layout_compute). */
struct __align__(8) fg_mod_params {
    int fg_pad; /* never empty */
};
static_assert(sizeof(fg_mod_params) == 8, "fg_mod_params size");

__device__ __forceinline__ bool fg_mask_mod(const fg_mod_params &p, int b, int h, int q_idx, int kv_idx) {
#line 12 "mods/causal.c"
    return q_idx >= kv_idx;
#line 23 "flexgen.cu"
}

/* No score_mod: scores are used as they are. */
__device__ __forceinline__ float fg_score_mod(const fg_mod_params &p, float score, int b, int h, int q_idx, int kv_idx) {
    return score;
}

