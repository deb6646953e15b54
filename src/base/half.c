/*
 * half.c -- the two 16-bit float formats of attention inputs and outputs,
 * bf16 and IEEE binary16 (fp16), to and from float, for the host code that
 * reads or writes them: the CPU references and the flexgen tool. One copy,
 * so that a tool's inputs and the reference that checks them agree on every
 * bit.
 *
 * Widening is exact: every bf16 and every fp16 value is a float. Narrowing
 * rounds to nearest, ties to even, as the GPU's __float2bfloat16_rn and
 * __float2half_rn do: bf16 overflows to inf past its largest finite value,
 * fp16 keeps subnormals and overflows to inf from 65520 up (what rounds past
 * 65504). NaN stays NaN of the same sign: bf16 keeps the top of the payload
 * and sets the quiet bit; fp16 has no use for payloads, so a NaN narrows to
 * 0x7e00 and widens to the default quiet NaN.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bf16 is the top half of a float. */
float fgi_bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

/* Adding 0x7fff plus the lowest kept bit carries into the kept half exactly
 * when the dropped half is over one half, or one half with the kept part
 * odd; the largest finite floats carry into the exponent and give inf. */
uint16_t fgi_float_to_bf16(float f) {
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fgi_fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in float */
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31) {
        if (m) return sign ? -NAN : NAN;
        return bits_float(sign | 0x7f800000u);
    }
    return bits_float(sign | ((e + 112) << 23) | (m << 13)); /* rebias 15 -> 127 */
}

/* Keep the top bits of `m` above bit `shift`, rounding the rest to nearest
 * even (1 <= shift <= 24). */
static uint32_t round_shift(uint32_t m, int shift) {
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    return r + (rem > half || (rem == half && (r & 1u)));
}

uint16_t fgi_float_to_fp16(float f) {
    uint32_t u = float_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, mag = u & 0x7fffffffu;
    if (mag > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (mag >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: inf */
    if (mag >= 0x38800000u) /* normal: rebias 127 -> 15, drop 13 bits; a carry may reach inf */
        return (uint16_t)(sign | round_shift(mag - 0x38000000u, 13));
    if (mag < 0x33000000u) return (uint16_t)sign; /* under 2^-25, half the least subnormal: 0 */
    /* Subnormal: the value is m * 2^(e - 150) with the hidden bit in m, in
     * units of 2^-24 that is m >> (126 - e); e in [102, 112] keeps the shift
     * in [14, 24]. Rounding up from the largest subnormal gives the smallest
     * normal, 0x0400, which is right. */
    uint32_t e = mag >> 23, m = (mag & 0x7fffffu) | 0x800000u;
    return (uint16_t)(sign | round_shift(m, 126 - (int)e));
}
