/*
 * attention_merge.cuh -- the merge of partial attention results
 * (fg_attention_merge): parts computed over disjoint sets of keys for the
 * same queries, each an output normalised over its own keys and that
 * normalisation's log-sum-exp, combined exactly into the attention over
 * all of them:
 *     M = max_s lse_s,  w_s = e^(lse_s - M),
 *     out = sum_s w_s out_s / sum_s w_s,  LSE = M + log sum_s w_s.
 * Cascade (shared-prefix) attention and attention split over GPUs are built
 * from it. A part with LSE -inf (its keys all masked) has weight 0; a row
 * whose parts all are gets output 0 and LSE -inf.
 *
 * One thread per output element; the loops over the parts are unrolled so
 * their loads are in flight together. Every thread of a row reads the
 * row's LSEs (L1 serves them once); the row's first column writes the
 * merged LSE. No mod: the source is common.cuh and this file.
 */

struct fgm_args {
/* @abi src/attention/abi_merge.def */
};
static_assert(sizeof(fgm_args) == 344, "fgm_args must match fgi_attn_merge_abi");

#define FGM_THREADS 128
#define FGM_LOG2E 1.4426950408889634f
#define FGM_LN2 0.6931471805599453f
#define FGM_NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void __launch_bounds__(FGM_THREADS) fg_attention_merge(const __grid_constant__ fgm_args a) {
    const fg_i64 e = (fg_i64)blockIdx.x * FGM_THREADS + threadIdx.x;
    if (e >= (fg_i64)a.batch * a.heads * a.q_len * a.head_dim) return;
    const fg_i64 row = e / a.head_dim;
    const int d = (int)(e - row * a.head_dim);
    const int i = (int)(row % a.q_len);
    const fg_i64 bh = row / a.q_len;
    const int h = (int)(bh % a.heads), b = (int)(bh / a.heads);
    const fg_i64 at = (fg_i64)b * a.part_stride[0] + (fg_i64)h * a.part_stride[1] + (fg_i64)i * a.part_stride[2] + d;
    float M = FGM_NEG_INF;
#pragma unroll 4
    for (int s = 0; s < a.nparts; s++) M = fmaxf(M, ((const float *)a.lses[s])[row]);
    const float Mu = M == FGM_NEG_INF ? 0.f : M;
    float L = 0.f, x = 0.f;
#pragma unroll 4
    for (int s = 0; s < a.nparts; s++) {
        const float w = exp2f((((const float *)a.lses[s])[row] - Mu) * FGM_LOG2E);
        L += w;
        x += w * fg_elem_to_f32(((const fg_elem *)a.outs[s])[at]);
    }
    fg_elem *out = (fg_elem *)a.out + (fg_i64)b * a.o_stride[0] + (fg_i64)h * a.o_stride[1] + (fg_i64)i * a.o_stride[2];
    out[d] = fg_f32_to_elem(L > 0.f ? x / L : 0.f);
    if (d == 0 && a.lse) ((float *)a.lse)[row] = L > 0.f ? Mu + logf(L) : FGM_NEG_INF;
}
