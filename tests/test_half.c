/* test_half.c -- the 16-bit float conversions (base/half.c): tables of
 * (float bits, 16-bit bits) for rounding ties to even, overflow, subnormals,
 * zeros, inf and NaN; then every 16-bit pattern: widening against the
 * format's definition, the round trip, and the midpoints between neighbours
 * (a tie goes to the even pattern, a float either side of it to the nearer
 * neighbour). */
#include "testutil.h"

#include <math.h>
#include <string.h>

#include "internal.h"

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

typedef struct narrow_row {
    uint32_t in;  /* float bits */
    uint16_t out; /* 16-bit bits */
    const char *why;
} narrow_row;

static const narrow_row bf16_rows[] = {
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x3f800000u, 0x3f80, "1"},
    {0xbf800000u, 0xbf80, "-1"},
    {0x3f808000u, 0x3f80, "1 + 2^-8: tie, to even 1"},
    {0x3f818000u, 0x3f82, "1 + 3 * 2^-8: tie, to even 1 + 2^-6"},
    {0x3f808001u, 0x3f81, "just over the tie: up"},
    {0x3f807fffu, 0x3f80, "just under the tie: down"},
    {0xbf818000u, 0xbf82, "negative tie, to even"},
    {0x7f7f7fffu, 0x7f7f, "under the tie at the top: largest finite"},
    {0x7f7f8000u, 0x7f80, "tie at the top, to even: inf"},
    {0x7f7fffffu, 0x7f80, "FLT_MAX: inf"},
    {0xff7fffffu, 0xff80, "-FLT_MAX: -inf"},
    {0x7f800000u, 0x7f80, "inf"},
    {0xff800000u, 0xff80, "-inf"},
    {0x00000001u, 0x0000, "least float subnormal: 0"},
    {0x00010000u, 0x0001, "least bf16 subnormal, exact"},
    {0x00008000u, 0x0000, "half of it: tie, to even 0"},
    {0x00018000u, 0x0002, "1.5 of it: tie, to even 2"},
    {0x007fffffu, 0x0080, "largest float subnormal: least normal"},
    {0x7fc00000u, 0x7fc0, "quiet NaN"},
    {0xffc00000u, 0xffc0, "-quiet NaN"},
    {0x7f800001u, 0x7fc0, "signalling NaN, low payload: quiet"},
    {0xff812345u, 0xffc1, "-NaN: top of the payload kept, quiet"},
    {0x7fffffffu, 0x7fff, "NaN with every payload bit"},
};

static const narrow_row fp16_rows[] = {
    {0x00000000u, 0x0000, "+0"},
    {0x80000000u, 0x8000, "-0"},
    {0x3f800000u, 0x3c00, "1"},
    {0xc0000000u, 0xc000, "-2"},
    {0x3eaaaaabu, 0x3555, "1/3"},
    {0x3f801000u, 0x3c00, "1 + 2^-11: tie, to even 1"},
    {0x3f803000u, 0x3c02, "1 + 3 * 2^-11: tie, to even"},
    {0x3f801001u, 0x3c01, "just over the tie: up"},
    {0x3f800fffu, 0x3c00, "just under the tie: down"},
    {0x477fe000u, 0x7bff, "65504, the largest finite"},
    {0x477fefffu, 0x7bff, "just under 65520: 65504"},
    {0x477ff000u, 0x7c00, "65520: tie, to even: inf"},
    {0xc77ff000u, 0xfc00, "-65520: -inf"},
    {0x49742400u, 0x7c00, "1e6: inf"},
    {0x7f7fffffu, 0x7c00, "FLT_MAX: inf"},
    {0x7f800000u, 0x7c00, "inf"},
    {0xff800000u, 0xfc00, "-inf"},
    {0x38800000u, 0x0400, "2^-14, the least normal"},
    {0x387fc000u, 0x03ff, "1023 * 2^-24, the largest subnormal"},
    {0x387fe000u, 0x0400, "1023.5 * 2^-24: tie, to even: least normal"},
    {0x38000000u, 0x0200, "2^-15, subnormal"},
    {0x33800000u, 0x0001, "2^-24, the least subnormal"},
    {0xb3800000u, 0x8001, "-2^-24"},
    {0x33000000u, 0x0000, "2^-25: tie, to even 0"},
    {0xb3000000u, 0x8000, "-2^-25: tie, to -0"},
    {0x33000001u, 0x0001, "just over 2^-25: up"},
    {0x32ffffffu, 0x0000, "just under 2^-25: 0"},
    {0x33c00000u, 0x0002, "1.5 * 2^-24: tie, to even 2"},
    {0x34200000u, 0x0002, "2.5 * 2^-24: tie, to even 2"},
    {0x34600000u, 0x0004, "3.5 * 2^-24: tie, to even 4"},
    {0x32800000u, 0x0000, "2^-26: 0"},
    {0x00000001u, 0x0000, "least float subnormal: 0"},
    {0x7fc00000u, 0x7e00, "quiet NaN"},
    {0xffc00000u, 0xfe00, "-quiet NaN"},
    {0x7f800001u, 0x7e00, "signalling NaN"},
    {0xff812345u, 0xfe00, "-NaN with a payload"},
};

static void check_rows(const narrow_row *rows, size_t n, uint16_t (*narrow)(float), const char *what) {
    for (size_t i = 0; i < n; i++) {
        uint16_t got = narrow(from_bits(rows[i].in));
        if (got != rows[i].out)
            fail_msg("%s(0x%08x) = 0x%04x, want 0x%04x (%s)", what, rows[i].in, got, rows[i].out, rows[i].why);
    }
}

static void test_bf16_narrow_table(void **state) {
    (void)state;
    check_rows(bf16_rows, sizeof bf16_rows / sizeof bf16_rows[0], fgi_float_to_bf16, "float_to_bf16");
}

static void test_fp16_narrow_table(void **state) {
    (void)state;
    check_rows(fp16_rows, sizeof fp16_rows / sizeof fp16_rows[0], fgi_float_to_fp16, "float_to_fp16");
}

typedef struct widen_row {
    uint16_t in;
    uint32_t out; /* float bits */
    const char *why;
} widen_row;

static void test_widen_table(void **state) {
    (void)state;
    static const widen_row bf16[] = {
        {0x3f80, 0x3f800000u, "1"},         {0x8000, 0x80000000u, "-0"},
        {0x0001, 0x00010000u, "subnormal"}, {0x7f80, 0x7f800000u, "inf"},
        {0xff80, 0xff800000u, "-inf"},      {0x7fc1, 0x7fc10000u, "NaN: payload kept"},
    };
    static const widen_row fp16[] = {
        {0x3c00, 0x3f800000u, "1"},           {0x8000, 0x80000000u, "-0"},
        {0x0001, 0x33800000u, "2^-24"},       {0x03ff, 0x387fc000u, "largest subnormal"},
        {0x0400, 0x38800000u, "least normal"}, {0x7bff, 0x477fe000u, "65504"},
        {0x7c00, 0x7f800000u, "inf"},         {0xfc00, 0xff800000u, "-inf"},
        {0x3555, 0x3eaaa000u, "0.333251953125"},
    };
    for (size_t i = 0; i < sizeof bf16 / sizeof bf16[0]; i++)
        if (to_bits(fgi_bf16_to_float(bf16[i].in)) != bf16[i].out)
            fail_msg("bf16_to_float(0x%04x) = 0x%08x (%s)", bf16[i].in, to_bits(fgi_bf16_to_float(bf16[i].in)),
                     bf16[i].why);
    for (size_t i = 0; i < sizeof fp16 / sizeof fp16[0]; i++)
        if (to_bits(fgi_fp16_to_float(fp16[i].in)) != fp16[i].out)
            fail_msg("fp16_to_float(0x%04x) = 0x%08x (%s)", fp16[i].in, to_bits(fgi_fp16_to_float(fp16[i].in)),
                     fp16[i].why);
    /* fp16 NaN widens to the default quiet NaN, sign kept. */
    assert_int_equal(to_bits(fgi_fp16_to_float(0x7e00)), to_bits(NAN));
    assert_int_equal(to_bits(fgi_fp16_to_float(0xfc01)), to_bits(-NAN));
}

static bool fp16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
static bool bf16_is_nan(uint16_t h) { return (h & 0x7f80) == 0x7f80 && (h & 0x7f); }

/* Widening gives the value the format defines, for every pattern. */
static void test_widen_every_pattern(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
        float f = fgi_fp16_to_float((uint16_t)h);
        if (e == 31) {
            assert_true(m ? isnan(f) : isinf(f));
        } else {
            double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
            assert_true((double)f == (sign ? -v : v));
        }
        assert_int_equal(signbit(f) != 0, sign);
        int be = (h >> 7) & 255, bm = h & 127;
        float g = fgi_bf16_to_float((uint16_t)h);
        if (be == 255) {
            assert_true(bm ? isnan(g) : isinf(g));
        } else {
            double v = be == 0 ? ldexp(bm, -133) : ldexp(128 + bm, be - 134);
            assert_true((double)g == (sign ? -v : v));
        }
        assert_int_equal(signbit(g) != 0, sign);
    }
}

/* Narrowing what was widened gives the pattern back: exactly for numbers
 * (both zeros included), a NaN of the same sign for NaN (bf16: the same
 * payload, quiet). */
static void test_round_trip_every_pattern(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        uint16_t f = fgi_float_to_fp16(fgi_fp16_to_float(h));
        if (fp16_is_nan(h)) {
            assert_true(fp16_is_nan(f));
            assert_int_equal(f & 0x8000, h & 0x8000);
        } else if (f != h) {
            fail_msg("fp16 0x%04x comes back as 0x%04x", h, f);
        }
        uint16_t b = fgi_float_to_bf16(fgi_bf16_to_float(h));
        if (bf16_is_nan(h)) assert_int_equal(b, h | 0x40);
        else if (b != h) fail_msg("bf16 0x%04x comes back as 0x%04x", h, b);
    }
}

/* Between two neighbouring finite values of one sign, the midpoint (exact
 * in float, which has bits to spare: the sum is taken in double, as the
 * largest bf16 values would overflow) goes to the one with the even
 * pattern, and the floats either side of it to the nearer. */
static void check_midpoints(uint16_t (*narrow)(float), float (*widen)(uint16_t), uint16_t first_inf) {
    for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        for (uint32_t a = 0; a + 1 < first_inf; a++) {
            uint16_t lo = (uint16_t)(sign | a), hi = (uint16_t)(sign | (a + 1));
            float x = widen(lo), y = widen(hi);
            float mid = (float)(((double)x + (double)y) / 2);
            assert_true((double)mid == ((double)x + (double)y) / 2);
            uint16_t even = (a & 1) ? hi : lo;
            if (narrow(mid) != even)
                fail_msg("midpoint of 0x%04x and 0x%04x gives 0x%04x", lo, hi, narrow(mid));
            assert_int_equal(narrow(nextafterf(mid, x)), lo);
            assert_int_equal(narrow(nextafterf(mid, y)), hi);
        }
    }
}

static void test_ties_every_midpoint(void **state) {
    (void)state;
    check_midpoints(fgi_float_to_fp16, fgi_fp16_to_float, 0x7c00);
    check_midpoints(fgi_float_to_bf16, fgi_bf16_to_float, 0x7f80);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_narrow_table),     cmocka_unit_test(test_fp16_narrow_table),
        cmocka_unit_test(test_widen_table),           cmocka_unit_test(test_widen_every_pattern),
        cmocka_unit_test(test_round_trip_every_pattern), cmocka_unit_test(test_ties_every_midpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
