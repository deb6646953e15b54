/*
 * approx_math.cuh -- the fast spellings of a score_mod's float math, for
 * kernels made with approximate math (FG_OPT_APPROX_MATH, or
 * fg_kernel_config.approx_math 1). Only their sources carry this file,
 * right after common.cuh and with FG_APPROX_MATH defined to 1 among the
 * config macros, so a kernel made without it is byte for byte what it was
 * (same source, same cache key).
 *
 * The emitted score_mod and its derivatives call these where
 * src/mod/builtins.def gives a cuda_approx spelling, and fg_fdiv_approx for
 * a float /; mask_mod keeps common.cuh's accurate functions, since it
 * decides which keys are kept. Each helper is one instruction of the PTX
 * ISA's approximate family (with at most a rounded product or sum around
 * it), whose error bound the ISA states (PTX ISA 9.1, "Floating Point
 * Instructions"):
 *   tanh.approx.f32   relative error 2^-11 over the whole range (sm_75 and
 *                     newer; every flexgen kernel needs sm_80)
 *   ex2.approx.f32    2 ulp over the whole range
 *   lg2.approx.f32    absolute error 2^-22 for x in (0.5, 2), relative
 *                     2^-22 elsewhere
 *   rsqrt.approx.f32  relative error 2^-22.9 over the positive finite range
 *   div.full.f32      2 ulp over the whole range (div.approx, a * (1 / b),
 *                     returns 0 for |b| past 2^126; div.full scales)
 * None flushes subnormals (no .ftz), as the accurate functions do not.
 * Inline PTX names the instruction whatever NVRTC's options say; the asm is
 * not volatile, so two calls with the same argument may still be merged.
 * include/flexgen.h states what the bounds mean for attention outputs.
 */

/* ---- approximate math ------------------------------------------------------ */

/* tanh(x), relative error 2^-11. */
FG_DEV float fg_tanh_approx(float x) {
    float r;
    asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* 2^x, 2 ulp. */
FG_DEV float fg_exp2_approx(float x) {
    float r;
    asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* e^x as 2^(x log2 e): ex2's 2 ulp, plus the product's rounding and the
 * constant's, each of which 2^t turns into a relative error of at most
 * |x| 2^-24: 2^-22 + |x| 2^-23 in all, under 2^-16 wherever e^x is a
 * normal float. */
FG_DEV float fg_exp_approx(float x) { return fg_exp2_approx(__fmul_rn(x, 1.442695041f)); }
/* log2(x): absolute error 2^-22 for x in (0.5, 2), relative 2^-22 elsewhere. */
FG_DEV float fg_log2_approx(float x) {
    float r;
    asm("lg2.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* ln(x) = log2(x) ln 2: the same absolute bound in (0.5, 2) (scaled by
 * ln 2), relative 2^-21 elsewhere (lg2's, the product's and the constant's
 * roundings). */
FG_DEV float fg_log_approx(float x) { return __fmul_rn(fg_log2_approx(x), 0.693147181f); }
/* 1 / sqrt(x), relative error 2^-22.9. */
FG_DEV float fg_rsqrt_approx(float x) {
    float r;
    asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
/* a / b, 2 ulp over the whole range. */
FG_DEV float fg_fdiv_approx(float a, float b) {
    float r;
    asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
/* 1 / (1 + e^-x) from the helpers above: e^-x's relative error reaches the
 * result at most as large (the derivative of 1 / (1 + u) scales it by
 * u / (1 + u) < 1), plus the sum's rounding and div.full's 2 ulp: under
 * 2^-16 wherever the result is a normal float. */
FG_DEV float fg_sigmoid_approx(float x) { return fg_fdiv_approx(1.0f, __fadd_rn(1.0f, fg_exp_approx(-x))); }
