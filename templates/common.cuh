/*
 * common.cuh -- what every generated kernel source starts with: fixed-width
 * types, the arithmetic helpers the emitted mods call, bounds-checked buffer
 * loads, and 16-bit float conversions. Self-contained on purpose: it
 * includes nothing, so NVRTC reads no header from disk and a compile depends
 * only on the text flexgen hands it (which is what the cache key hashes).
 * Only the config macros (src/codegen/source.c) come before it.
 *
 * What it provides, and to whom:
 *   to the emitted mod (src/codegen/emit.c and emit_split.c print every
 *   expression through cuda_expr.c, builtins by src/mod/builtins.def's CUDA
 *   names):
 *     fg_iadd fg_isub fg_imul fg_ineg   int + - * and unary -, wrapping
 *     fg_idiv fg_imod                   int / and %, total
 *     fg_idiv_by fg_imod_by             the same by a scalar parameter
 *                                       (fg_divisor, made on the host)
 *     fg_divides_by                     x % P == 0 by such a parameter
 *     fg_shl fg_shr                     int << and >>, count & 31
 *     fg_fadd fg_fsub fg_fmul fg_fdiv   float + - * /, never fused
 *     fg_fdiv_by                        float / by a scalar parameter
 *                                       (its reciprocal made on the host)
 *     fg_f2i                            float -> int
 *     fg_load_i32 fg_load_f32           buffer reads, 0 outside [0, len)
 *     fg_and fg_or                      && and || with both sides evaluated
 *     fg_iabs fg_imin fg_imax fg_iclamp fg_fclamp fg_rsqrt fg_sigmoid
 *                                       builtins with a spelling of their own
 *     FG_INT_MIN                        the int literal -2147483648
 *     fg_offsetof                       in emit.c's layout checks of
 *                                       struct fg_mod_params
 *   to the templates: fg_u16, fg_u32, fg_i64 and fg_u64 (the last two also
 *   type the fields of the argument blocks embed_templates.py prints),
 *   FG_DEV, and the 16-bit storage types with their conversions, named for
 *   the configured dtype as fg_elem, fg_elem_to_f32, fg_f32_to_elem and
 *   fg_pack2.
 * A helper no emitted mod and no template calls does not belong here: every
 * kernel's source carries this file.
 *
 * Why helpers instead of plain operators. The emitted CUDA must compute what
 * the CPU evaluator (src/mod/eval.c) computes, and the rules of the mod language
 * are not C++'s:
 *   - int + - * wrap (two's complement). Signed overflow is undefined in
 *     C++, and the optimiser uses that (`x + 1 > x` folds to true), so the
 *     wrapping forms go through unsigned arithmetic.
 *   - int / and % by zero give 0, INT_MIN / -1 gives INT_MIN and
 *     INT_MIN % -1 gives 0, where C++ has undefined behaviour and the GPU
 *     would produce garbage; the CPU evaluator reports these as errors, the
 *     GPU cannot report, so it yields a fixed value.
 *   - shift counts are taken & 31; >> of a negative value is arithmetic.
 *   - float -> int truncates and saturates, NaN -> 0 (__float2int_rz), where
 *     a C++ cast of an out-of-range float is undefined. int -> float is a
 *     plain C cast, which rounds to nearest.
 *   - float + - * / are single IEEE operations rounded to nearest. Without
 *     the _rn intrinsics the compiler may contract a * b + c into one fused
 *     multiply-add, whose single rounding differs from the evaluator's two.
 *     Division by a scalar parameter gives the same quotient without a
 *     division (fg_fdiv_by, below, says where exactly).
 *   - exp, log, tanh ... are the accurate device functions (expf, logf,
 *     tanhf), never the __expf-style intrinsics; rsqrt and sigmoid are
 *     spelled out with an IEEE division for the same reason.
 *   - a buffer read outside [0, length) gives 0 instead of faulting.
 * All helpers are tiny and force-inlined: the generated code costs the same
 * instructions a hand-written kernel would use.
 *
 * The 16-bit float types are storage only (a struct around the bits); the
 * conversions are single PTX instructions (sm_80 and newer), so neither
 * cuda_fp16.h nor cuda_bf16.h is needed.
 */

/* ---- types -------------------------------------------------------------- */

typedef unsigned int fg_u32;       /* 32-bit unsigned                       */
typedef long long fg_i64;          /* 64-bit signed                         */
typedef unsigned long long fg_u64; /* 64-bit unsigned                       */
typedef unsigned short fg_u16;     /* 16-bit unsigned                       */

static_assert(sizeof(int) == 4 && sizeof(fg_i64) == 8 && sizeof(fg_u16) == 2,
              "flexgen needs 32-bit int and 64-bit long long");
static_assert(sizeof(void *) == 8, "flexgen kernels use 64-bit pointers");

#define FG_INT_MIN (-2147483647 - 1)   /* INT_MIN without <climits>        */

#define FG_DEV __device__ __forceinline__

/* offsetof without <cstddef>: NVRTC's front end (EDG) folds __INTADDR__ of
 * a member address to a constant, so it works in static_assert. */
#define fg_offsetof(T, m) ((unsigned long long)__INTADDR__(&(((T *)0)->m)))

/* ---- int arithmetic: wrapping, total ------------------------------------ */

/* a + b, a - b, a * b and -a modulo 2^32. */
FG_DEV int fg_iadd(int a, int b) { return (int)((fg_u32)a + (fg_u32)b); }
FG_DEV int fg_isub(int a, int b) { return (int)((fg_u32)a - (fg_u32)b); }
FG_DEV int fg_imul(int a, int b) { return (int)((fg_u32)a * (fg_u32)b); }
FG_DEV int fg_ineg(int a) { return (int)(0u - (fg_u32)a); }
/* a / b truncated toward zero; 0 when b == 0; INT_MIN / -1 == INT_MIN.
 * Selects, not branches: the division always runs on a safe divisor, so a
 * mod inlined into an unrolled loop stays one straight-line block (with
 * branches around each division NVVM's optimiser takes minutes). */
FG_DEV int fg_idiv(int a, int b) {
    const bool odd = b == 0 || b == -1;
    const int q = a / (odd ? 1 : b);
    return b == 0 ? 0 : b == -1 ? fg_ineg(a) : q;
}
/* a % b with the sign of a; 0 when b == 0 or b == -1 (x % 1 is 0). */
FG_DEV int fg_imod(int a, int b) { return a % ((b == 0 || b == -1) ? 1 : b); }
/* Division by a scalar parameter, strength-reduced on the host once per
 * launch (fgi_divisor_of in src/mod/bind.c, which proves it exact): for
 * n = |a|, n / |d| is (n * m) >> shift, then the sign of a * d. d == 0 comes
 * as d = 1 with `zero` set. The same results as fg_idiv and fg_imod, in a
 * handful of instructions instead of a software division. */
struct fg_divisor {
    fg_u32 m, shift;
    int d, zero;
    fg_u32 inv, rot, bound; /* the test a % d == 0 (fg_divides_by) */
};
FG_DEV int fg_iquot_by(int a, fg_divisor v) {
    const fg_u32 n = a < 0 ? 0u - (fg_u32)a : (fg_u32)a;
    const fg_u32 q = (fg_u32)(((unsigned long long)n * v.m) >> v.shift);
    return (a < 0) != (v.d < 0) ? (int)(0u - q) : (int)q;
}
FG_DEV int fg_idiv_by(int a, fg_divisor v) { return v.zero ? 0 : fg_iquot_by(a, v); }
FG_DEV int fg_imod_by(int a, fg_divisor v) { return fg_isub(a, fg_imul(fg_iquot_by(a, v), v.d)); }
/* a % d == 0, as a multiply-add by the inverse of d's odd part, a rotate
 * and a compare on a as it is, sign and all (fgi_divisor_of says why it is
 * exact; the offset is per launch, hoisted out of the loops); what the
 * mods' x % P == 0 prints as. */
FG_DEV bool fg_divides_by(int a, fg_divisor v) {
    const fg_u32 t = (fg_u32)a * v.inv + ((v.bound >> 1) << v.rot);
    return __funnelshift_r(t, t, v.rot) <= v.bound;
}
/* a << (n & 31), bits shifted out are lost. */
FG_DEV int fg_shl(int a, int n) { return (int)((fg_u32)a << (n & 31)); }
/* a >> (n & 31), arithmetic (sign-filling), spelled so it is for any a. */
FG_DEV int fg_shr(int a, int n) {
    const int c = n & 31;
    return a < 0 ? ~(~a >> c) : a >> c;
}
/* a && b and a || b with both operands already evaluated (the emitter's
 * spelling where evaluating the right one is harmless): no branch. */
FG_DEV bool fg_and(bool a, bool b) { return a && b; }
FG_DEV bool fg_or(bool a, bool b) { return a || b; }
/* |a|, with |INT_MIN| == INT_MIN (wrapping). */
FG_DEV int fg_iabs(int a) { return a < 0 ? fg_ineg(a) : a; }
/* min, max and clamp(x, lo, hi) == min(max(x, lo), hi) on ints. */
FG_DEV int fg_imin(int a, int b) { return a < b ? a : b; }
FG_DEV int fg_imax(int a, int b) { return a > b ? a : b; }
FG_DEV int fg_iclamp(int x, int lo, int hi) { return fg_imin(fg_imax(x, lo), hi); }

/* ---- float arithmetic: one IEEE rounding per operation ------------------ */

/* a + b, a - b, a * b, a / b rounded to nearest, never fused into an FMA. */
FG_DEV float fg_fadd(float a, float b) { return __fadd_rn(a, b); }
FG_DEV float fg_fsub(float a, float b) { return __fsub_rn(a, b); }
FG_DEV float fg_fmul(float a, float b) { return __fmul_rn(a, b); }
FG_DEV float fg_fdiv(float a, float b) { return __fdiv_rn(a, b); }
/* a / b where b is a scalar parameter (`score / SOFTCAP`) and y = RN(1 / b)
 * its reciprocal, made on the host (fgi_param_pack). The IEEE division's
 * code (__fdiv_rn) checks each a for its slow path: a divergent branch per
 * element, which keeps the element loop from interleaving its elements,
 * and a MUFU.RCP each time. This is straight-line code without MUFU:
 * q0 = RN(a y) is within one ulp of a / b, and one correction with the
 * exact remainder r = a - b q0 (an FMA) gives RN(a / b) whenever nothing
 * over- or underflows (Markstein's theorem), which |a| and |b| in
 * [2^-60, 2^60] ensure: there the result is the IEEE quotient, bit for bit
 * (test_float_divisors in tests/test_emit.c checks this sequence, spelled
 * in C, on 50 million pairs). Elsewhere it is q0: IEEE's zeros, infinities
 * and NaN, within one ulp otherwise. fgi_bind refuses a divisor parameter
 * whose reciprocal would not be a normal float (|b| below 2^-126 or above
 * 2^126, other than 0 and inf), where q0 could not keep that promise. */
FG_DEV float fg_fdiv_by(float a, float b, float y) {
    const float q0 = __fmul_rn(a, y);
    const float r = __fmaf_rn(-q0, b, a);
    const float q1 = __fmaf_rn(r, y, q0);
    const float aa = fabsf(a), ab = fabsf(b);
    const bool exact = aa >= 0x1p-60f && aa <= 0x1p60f && ab >= 0x1p-60f && ab <= 0x1p60f;
    return exact ? q1 : q0;
}
/* clamp(x, lo, hi) == fminf(fmaxf(x, lo), hi) (NaN bounds are ignored). */
FG_DEV float fg_fclamp(float x, float lo, float hi) { return fminf(fmaxf(x, lo), hi); }
/* 1 / sqrt(x) with an IEEE square root and division (rsqrtf is approximate). */
FG_DEV float fg_rsqrt(float x) { return __fdiv_rn(1.0f, __fsqrt_rn(x)); }
/* 1 / (1 + exp(-x)) with the accurate expf. */
FG_DEV float fg_sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

/* ---- conversions ------------------------------------------------------- */

/* float -> int: truncate toward zero, saturate, NaN -> 0. */
FG_DEV int fg_f2i(float x) { return __float2int_rz(x); }

/* ---- buffers ------------------------------------------------------------ */

/* p[i] when 0 <= i < len, else 0: a mod may index with any int. */
FG_DEV int fg_load_i32(const int *__restrict__ p, fg_i64 len, int i) {
    return (i >= 0 && (fg_i64)i < len) ? __ldg(p + i) : 0;
}
FG_DEV float fg_load_f32(const float *__restrict__ p, fg_i64 len, int i) {
    return (i >= 0 && (fg_i64)i < len) ? __ldg(p + i) : 0.0f;
}

/* ---- 16-bit floats (storage) -------------------------------------------- */

/* The bits of one bfloat16 / IEEE half value. */
struct fg_bf16 {
    fg_u16 bits;
};
struct fg_fp16 {
    fg_u16 bits;
};

/* bf16 -> float is exact: the bits are the high half of the float. */
FG_DEV float fg_bf16_to_f32(fg_bf16 x) { return __int_as_float((int)((fg_u32)x.bits << 16)); }
/* float -> bf16 rounded to nearest even (NaN stays NaN). */
FG_DEV fg_bf16 fg_f32_to_bf16(float x) {
    fg_bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}
/* half -> float (exact) and float -> half rounded to nearest even. */
FG_DEV float fg_fp16_to_f32(fg_fp16 x) {
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(x.bits));
    return r;
}
FG_DEV fg_fp16 fg_f32_to_fp16(float x) {
    fg_fp16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(x));
    return r;
}

/* Two floats -> one register of two 16-bit values, `lo` in the low half
 * (the layout of mma fragments and of consecutive elements in memory). */
FG_DEV fg_u32 fg_pack_bf16x2(float lo, float hi) {
    fg_u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
FG_DEV fg_u32 fg_pack_fp16x2(float lo, float hi) {
    fg_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* The configured input type (FG_DTYPE_BF16 / FG_DTYPE_FP16), for templates
 * that are written once for both. */
#if defined(FG_DTYPE_FP16)
typedef fg_fp16 fg_elem;
#define fg_elem_to_f32 fg_fp16_to_f32
#define fg_f32_to_elem fg_f32_to_fp16
#define fg_pack2 fg_pack_fp16x2
#else
typedef fg_bf16 fg_elem;
#define fg_elem_to_f32 fg_bf16_to_f32
#define fg_f32_to_elem fg_f32_to_bf16
#define fg_pack2 fg_pack_bf16x2
#endif
