/*
 * partial_sum.cuh -- sums of partial results in fp32 (fgi_partial_sum):
 *     x = acc_in + parts[0] + ... + parts[nparts - 1]
 * written to acc_out (fp32) and/or out (the dtype). Context parallelism
 * sums gradients with it: a shard's dK / dV gather one contribution per
 * rank they visit, and a rank's dQ one per step, each a backward call's
 * output in the dtype; the running sums stay in fp32 so the sum is
 * rounded once, when it is stored in the dtype at the end.
 *
 * One thread per pair of adjacent columns (the host checks the head dim
 * is even and every row 8-byte aligned for fp32, 4-byte for the dtype);
 * acc_in may be acc_out (each thread reads its own elements before it
 * writes them). No mod: the source is common.cuh and this file.
 */

struct fgs_args {
/* @abi src/parallel/abi_sum.def */
};
static_assert(sizeof(fgs_args) == 152, "fgs_args must match fgi_sum_abi");

#define FGS_THREADS 256
#define FGS_MAX_PARTS 4

extern "C" __global__ void __launch_bounds__(FGS_THREADS) fg_partial_sum(const __grid_constant__ fgs_args a) {
    const int half = a.head_dim / 2;
    const fg_i64 e = (fg_i64)blockIdx.x * FGS_THREADS + threadIdx.x;
    if (e >= (fg_i64)a.batch * a.heads * a.rows * half) return;
    const fg_i64 row = e / half;
    const int d = (int)(e - row * half) * 2;
    const int i = (int)(row % a.rows);
    const fg_i64 bh = row / a.rows;
    const fg_i64 h = bh % a.heads, b = bh / a.heads;
    const fg_i64 at_acc = b * a.acc_stride[0] + h * a.acc_stride[1] + (fg_i64)i * a.acc_stride[2] + d;
    float2 x = make_float2(0.f, 0.f);
    if (a.acc_in) x = *(const float2 *)((const float *)a.acc_in + at_acc);
    const fg_i64 at = b * a.part_stride[0] + h * a.part_stride[1] + (fg_i64)i * a.part_stride[2] + d;
#pragma unroll
    for (int s = 0; s < FGS_MAX_PARTS; s++)
        if (s < a.nparts) {
            const fg_elem *p = (const fg_elem *)a.parts[s] + at;
            x.x += fg_elem_to_f32(p[0]);
            x.y += fg_elem_to_f32(p[1]);
        }
    if (a.acc_out) *(float2 *)((float *)a.acc_out + at_acc) = x;
    if (a.out) {
        fg_elem *o = (fg_elem *)a.out + b * a.o_stride[0] + h * a.o_stride[1] + (fg_i64)i * a.o_stride[2] + d;
        o[0] = fg_f32_to_elem(x.x);
        o[1] = fg_f32_to_elem(x.y);
    }
}
