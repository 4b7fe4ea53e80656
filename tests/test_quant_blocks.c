/* ZeRO++'s block codecs (quant_blocks.h): int8 and int4 with an fp32 scale a block, the
 * round trip against a serial reference written here without bit packing (equal to
 * the bit), every element within the per-block bound max|x| / (2 Q) (+ float
 * rounding), the encoded size against its formula, on data with outliers, zero blocks,
 * negative values and a short last block; negative control: int4's round trip held to
 * int8's bound fails. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_run.h"
#include "quant_blocks.h"

enum { COUNT = 1000, BLOCK = 64 };   /* 15 full blocks and one of 40 */

/* Deterministic data: a smooth wave, an outlier every 97 elements, a block of zeros. */
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        x[i] = 0.01f * sinf(0.37f * (float)i) - 0.004f * (float)(i % 7);
        if (i % 97 == 0) x[i] = 3.0f * (i % 2 ? 1 : -1);
        if (i >= 128 && i < 192) x[i] = 0;
    }
}

/* The reference: block by block, in plain loops. */
static float reference(quant_bits bits, const float *x, size_t n, size_t block, size_t i) {
    const size_t at = i / block * block, end = at + block < n ? at + block : n;
    float absmax = 0;
    for (size_t j = at; j < end; j++) absmax = fmaxf(absmax, fabsf(x[j]));
    const int Q = bits == QUANT_INT4 ? 7 : 127;
    const float scale = absmax / (float)Q;
    if (scale == 0) return 0;
    float q = nearbyintf(x[i] / scale);
    if (q > Q) q = (float)Q;
    if (q < -Q) q = (float)-Q;
    return q * scale;
}

/* Largest error / bound over the elements (<= 1: within), and whether the round trip
 * equals the reference to the bit. bound_bits: the bound held to (the negative control
 * holds int4 to int8's). */
static double round_trip(quant_bits bits, quant_bits bound_bits, int *equal) {
    static float x[COUNT], back[COUNT];
    static unsigned char enc[COUNT * 2];
    fill(x, COUNT);
    quant_encode(bits, BLOCK, x, COUNT, enc);
    quant_decode(bits, BLOCK, enc, COUNT, back);
    double worst = 0;
    *equal = 1;
    for (size_t i = 0; i < COUNT; i++) {
        *equal &= back[i] == reference(bits, x, COUNT, BLOCK, i);
        const size_t at = i / BLOCK * BLOCK, end = at + BLOCK < COUNT ? at + BLOCK : COUNT;
        float absmax = 0;
        for (size_t j = at; j < end; j++) absmax = fmaxf(absmax, fabsf(x[j]));
        const double bound = quant_block_bound(bound_bits, absmax), err = fabs(x[i] - back[i]);
        const double f = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
        if (f > worst) worst = f;
    }
    return worst;
}

static void check_codec(quant_bits bits) {
    int equal;
    const double worst = round_trip(bits, bits, &equal);
    const size_t blocks = (COUNT + BLOCK - 1) / BLOCK;
    const size_t want = blocks * 4 + (bits == QUANT_INT4 ? (COUNT + 1) / 2 : COUNT);
    printf("int%d, blocks of %d: round trip %s the reference; largest error %.3f of the"
           " per-block bound max|x|/%d; %zu bytes for %d floats (formula %zu, %.2f of fp16's)\n",
           bits == QUANT_INT4 ? 4 : 8, BLOCK, equal ? "equals" : "DIFFERS FROM", worst,
           2 * quant_levels(bits), quant_encoded_bytes(bits, COUNT, BLOCK), COUNT, want,
           (double)quant_encoded_bytes(bits, COUNT, BLOCK) / (2.0 * COUNT));
    ck_assert(equal);
    ck_assert(worst <= 1);
    ck_assert_uint_eq(quant_encoded_bytes(bits, COUNT, BLOCK), want);
}

START_TEST(int8_round_trip) { check_codec(QUANT_INT8); }
END_TEST
START_TEST(int4_round_trip) { check_codec(QUANT_INT4); }
END_TEST

START_TEST(int4_held_to_int8s_bound_fails) {
    int equal;
    const double worst = round_trip(QUANT_INT4, QUANT_INT8, &equal);
    printf("negative control: int4's round trip against int8's bound: %.1fx it (must be > 1)\n",
           worst);
    ck_assert(worst > 1);
}
END_TEST

/* Every int4 code survives packing: -7..7 in both nibbles. */
START_TEST(int4_codes_pack_and_unpack) {
    float x[16], back[16];
    unsigned char enc[4 + 8];
    for (int i = 0; i < 15; i++) x[i] = (float)(i - 7);
    x[15] = 0;
    quant_encode(QUANT_INT4, 16, x, 16, enc);
    quant_decode(QUANT_INT4, 16, enc, 16, back);
    for (int i = 0; i < 16; i++) ck_assert_float_eq(back[i], x[i]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("quant_blocks");
    TCase *tc = tcase_create("codecs");
    tcase_add_test(tc, int8_round_trip);
    tcase_add_test(tc, int4_round_trip);
    tcase_add_test(tc, int4_held_to_int8s_bound_fails);
    tcase_add_test(tc, int4_codes_pack_and_unpack);
    suite_add_tcase(s, tc);
    return check_run(s, 0);
}
