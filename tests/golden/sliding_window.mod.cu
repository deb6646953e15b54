/* ---- the mod: sliding_window (mods/sliding_window.c)
 * Emitted by flexgen from the checked syntax tree, not copied from the
 * file. Its canonical text (the kernel cache key's part):
 *
 *   int WINDOW;
 *   bool mask_mod(int b, int h, int q_idx, int kv_idx) {
 *       return q_idx >= kv_idx && q_idx - kv_idx <= WINDOW;
 *   }
 */
#define FG_HAS_MASK_MOD 1
#define FG_HAS_SCORE_MOD 0

/* The mod's parameters, passed by value to every kernel; the host packs
 * the same layout (fgi_param_layout_compute). */
struct __align__(8) fg_mod_params {
    int WINDOW;
    int fg_pad; /* never empty */
};
static_assert(fg_offsetof(fg_mod_params, WINDOW) == 0, "WINDOW");
static_assert(sizeof(fg_mod_params) == 8, "fg_mod_params size");

__device__ __forceinline__ bool fg_mask_mod(const fg_mod_params &p, int b, int h, int q_idx, int kv_idx) {
#line 14 "mods/sliding_window.c"
    return fg_and(q_idx >= kv_idx, fg_isub(q_idx, kv_idx) <= p.WINDOW);
#line 26 "flexgen.cu"
}

/* No score_mod: scores are used as they are. */
__device__ __forceinline__ float fg_score_mod(const fg_mod_params &p, float score, int b, int h, int q_idx, int kv_idx) {
    return score;
}

