/* ---- the mod: alibi (mods/alibi.c)
 * Emitted by flexgen from the checked syntax tree, not copied from the
 * file. Its canonical text (the kernel cache key's part):
 *
 *   const float *slopes;
 *   bool mask_mod(int b, int h, int q_idx, int kv_idx) {
 *       return q_idx >= kv_idx;
 *   }
 *   float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
 *       return score + slopes[h] * (float)(kv_idx - q_idx);
 *   }
 */
#define FG_HAS_MASK_MOD 1
#define FG_HAS_SCORE_MOD 1

/* The mod's parameters, passed by value to every kernel; the host packs
 * the same layout (fgi_param_layout_compute). */
struct __align__(8) fg_mod_params {
    const float *__restrict__ slopes;
    long long fg_len_slopes;
    int fg_pad; /* never empty */
};
static_assert(fg_offsetof(fg_mod_params, slopes) == 0, "slopes");
static_assert(fg_offsetof(fg_mod_params, fg_len_slopes) == 8, "slopes length");
static_assert(sizeof(fg_mod_params) == 24, "fg_mod_params size");

__device__ __forceinline__ bool fg_mask_mod(const fg_mod_params &p, int b, int h, int q_idx, int kv_idx) {
#line 19 "mods/alibi.c"
    return q_idx >= kv_idx;
#line 31 "flexgen.cu"
}

__device__ __forceinline__ float fg_score_mod(const fg_mod_params &p, float score, int b, int h, int q_idx, int kv_idx) {
#line 15 "mods/alibi.c"
    return fg_fadd(score, fg_fmul(fg_load_f32(p.slopes, p.fg_len_slopes, h), (float)fg_isub(kv_idx, q_idx)));
#line 37 "flexgen.cu"
}

