/* number_formats.h's 16-bit conversions, the one code the CPU ops, the wire and the GPU
 * kernels (gpu/ops_cuda_mixed.cu, gpu/comm_gpu_kernels.cu, compiled by nvcc from the same
 * header) run, checked exhaustively on the host against references written here:
 *
 *  - widening: every one of the 65536 bf16 and fp16 codes against its value computed
 *    with ldexp (normals, subnormals, zeros, infinities; NaNs stay NaNs);
 *  - rounding: every code widened and rounded back gives itself (NaNs aside); at every
 *    midpoint between two neighbouring finite codes of either sign (the last one's
 *    neighbour being infinity) the rounding goes to the even code, and one fp32 step
 *    either side goes to the nearer code (round to nearest even).
 *
 * Negative control: truncating (dropping the low bits, the conversion a hurried kernel
 * writes) instead of rounding fails the midpoint rule, counted and printed. Each check
 * prints how many codes it saw and how many were wrong. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "check_run.h"
#include "number_formats.h"

/* The value of a code, from its fields. */
static double bf16_value(uint16_t h) {
    const int e = (h >> 7) & 0xff, m = h & 0x7f;
    const double s = h & 0x8000 ? -1.0 : 1.0;
    if (e == 0xff) return m ? NAN : s * INFINITY;
    return s * (e ? ldexp(128 + m, e - 134) : ldexp(m, -133));
}
static double f16_value(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double s = h & 0x8000 ? -1.0 : 1.0;
    if (e == 0x1f) return m ? NAN : s * INFINITY;
    return s * (e ? ldexp(1024 + m, e - 25) : ldexp(m, -24));
}

typedef struct {
    const char *name;
    double (*value)(uint16_t);
    float (*widen)(uint16_t);
    uint16_t (*round)(float);
    uint16_t inf;   /* +infinity's code: the finite codes lie below it */
} format16;

static float widen_bf16(uint16_t h) { return number_from_bf16(h); }
static float widen_f16(uint16_t h) { return number_from_f16(h); }
static uint16_t round_bf16(float x) { return number_to_bf16(x); }
static uint16_t round_f16(float x) { return number_to_f16(x); }
static uint16_t truncate_bf16(float x) { return (uint16_t)(number_f32_bits(x) >> 16); }

static const format16 formats[] = {
    {"bf16", bf16_value, widen_bf16, round_bf16, 0x7f80},
    {"fp16", f16_value, widen_f16, round_f16, 0x7c00},
};

START_TEST(every_code_widens_to_its_value) {
    for (int f = 0; f < 2; f++) {
        int wrong = 0;
        for (uint32_t c = 0; c <= 0xffff; c++) {
            const double want = formats[f].value((uint16_t)c);
            const float got = formats[f].widen((uint16_t)c);
            wrong += isnan(want) ? !isnan(got)
                                 : (double)got != want || !signbit(got) != !signbit(want);
        }
        printf("  %s: 65536 codes widened, %d wrong\n", formats[f].name, wrong);
        ck_assert_int_eq(wrong, 0);
    }
}
END_TEST

/* Wrong roundings of the codes (back to themselves) and of the midpoints between
 * neighbours, both signs, with round as the conversion. */
static int midpoint_errors(const format16 *fmt, uint16_t (*round)(float), int *roundtrip) {
    int wrong = 0;
    *roundtrip = 0;
    for (uint32_t c = 0; c <= 0xffff; c++) {
        const float x = fmt->widen((uint16_t)c);
        if (!isnan(x) && round(x) != c) ++*roundtrip;
    }
    for (uint16_t sign = 0; sign <= 1; sign++) {
        for (uint16_t a = 0; a < fmt->inf; a++) {
            const uint16_t lo = a | (uint16_t)(sign << 15), hi = (a + 1) | (uint16_t)(sign << 15);
            const double mid = (fmt->value(lo) + (a + 1 == fmt->inf ? 2 * fmt->value(lo) -
                                                  fmt->value(lo - 1) : fmt->value(hi))) / 2;
            const float m = (float)mid;   /* exact: 9 or 12 significant bits */
            const uint16_t even = (a & 1) ? hi : lo;
            const float toward_lo = nextafterf(m, 0.0f), toward_hi = nextafterf(m, m * 2.0f);
            wrong += round(m) != even;
            wrong += round(toward_lo) != lo;
            wrong += round(toward_hi) != hi;
        }
    }
    return wrong;
}

START_TEST(rounding_is_to_nearest_even) {
    for (int f = 0; f < 2; f++) {
        int roundtrip;
        const int wrong = midpoint_errors(&formats[f], formats[f].round, &roundtrip);
        printf("  %s: %d midpoints and neighbours (both signs), %d wrong; codes back to"
               " themselves: %d wrong\n", formats[f].name, 6 * formats[f].inf, wrong, roundtrip);
        ck_assert_int_eq(wrong, 0);
        ck_assert_int_eq(roundtrip, 0);
    }
}
END_TEST

START_TEST(control_truncation_fails) {
    int roundtrip;
    const int wrong = midpoint_errors(&formats[0], truncate_bf16, &roundtrip);
    printf("  control: bf16 by truncation: %d of %d midpoint checks wrong\n", wrong,
           6 * formats[0].inf);
    ck_assert_int_gt(wrong, 0);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("number_formats");
    TCase *tc = tcase_create("exhaustive");
    tcase_add_test(tc, every_code_widens_to_its_value);
    tcase_add_test(tc, rounding_is_to_nearest_even);
    tcase_add_test(tc, control_truncation_fails);
    suite_add_tcase(suite, tc);
    return check_run(suite, 0);
}
