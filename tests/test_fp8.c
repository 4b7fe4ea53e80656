/* FP8 numerics (common/tensor/fp8*.h): the codec against a table of all 256 codes of
 * E4M3 and E5M2 built here from the bit fields alone, rounding to nearest even at every
 * midpoint of the grid, saturation, NaN and the subnormals; the scaling recipes on a
 * small matrix scaled, rounded and multiplied by hand (block scales along the inner
 * dimension, partial sums rescaled per chunk); the emulated product against the
 * dequantized operands' product in double; delayed scaling's history and margin.
 *
 * Negative controls: a truncating and a ties-away encoder fail the table; the hand
 * matrix with the scale applied after rounding misses the hand product; per-tensor
 * scaling of activations with outlier channels loses what block scaling keeps. */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "fp8.h"
#include "fp8_matmul.h"
#include "fp8_scaling.h"
#include "rng.h"

/* ---- the table, from the bit fields -------------------------------------------------- */

/* value = (-1)^s 2^(e - bias) (1 + m / 2^mbits), or m / 2^mbits 2^(1 - bias) for e = 0;
 * E4M3: S.1111.111 is NaN (no infinity); E5M2: exponent 31 is inf (m = 0) or NaN. */
static float table_value(fp8_format f, int code) {
    const int e4 = f == FP8_E4M3, ebits = e4 ? 4 : 5, mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    const int s = code >> 7, e = (code >> mbits) & ((1 << ebits) - 1);
    const int m = code & ((1 << mbits) - 1), top = (1 << ebits) - 1;
    double v;
    if (e4 && e == top && m == (1 << mbits) - 1) return NAN;
    if (!e4 && e == top) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, 1 - bias - mbits);
    else v = ldexp((1 << mbits) + m, e - bias - mbits);
    return (float)(s ? -v : v);
}

static int same_value(float a, float b) {
    return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b));
}

typedef uint8_t (*encoder)(fp8_format f, float x);

/* The positive finite codes sorted by value (they sort as integers): count them. */
static int positive_grid(fp8_format f, int codes[128]) {
    int n = 0;
    for (int c = 0; c < 128; c++)
        if (isfinite(table_value(f, c))) codes[n++] = c;
    return n;
}

/* Mismatches of enc against the table: every finite code's value, both neighbours of
 * every midpoint and the midpoint itself (to the even code) on both signs, past the
 * max (saturates), infinities and NaN. *checked counts the cases. */
static int encode_mismatches(fp8_format f, encoder enc, int *checked) {
    int codes[128], bad = 0;
    const int n = positive_grid(f, codes);
    *checked = 0;
    for (int sign = 0; sign <= 0x80; sign += 0x80) {
        const float s = sign ? -1.0f : 1.0f;
        for (int i = 0; i < n; i++) {
            bad += enc(f, s * table_value(f, codes[i])) != (sign | codes[i]);
            ++*checked;
            if (i + 1 == n) break;
            const float lo = table_value(f, codes[i]), hi = table_value(f, codes[i + 1]);
            const float mid = (lo + hi) / 2;   /* exact: a few bits of one binade */
            const int even = (codes[i] & 1) ? codes[i + 1] : codes[i];
            bad += enc(f, s * nextafterf(mid, 0)) != (sign | codes[i]);
            bad += enc(f, s * mid) != (sign | even);
            bad += enc(f, s * nextafterf(mid, INFINITY)) != (sign | codes[i + 1]);
            *checked += 3;
        }
        const float max = table_value(f, codes[n - 1]), beyond[] = {nextafterf(max, INFINITY),
                                                                   2 * max, 1e30f, INFINITY};
        for (int b = 0; b < 4; b++, ++*checked) bad += enc(f, s * beyond[b]) != (sign | codes[n - 1]);
    }
    bad += !isnan(table_value(f, enc(f, NAN)));
    ++*checked;
    return bad;
}

START_TEST(test_decode_every_code) {
    for (int f = 0; f < FP8_FORMATS; f++) {
        int finite = 0;
        for (int c = 0; c < 256; c++) {
            const float want = table_value((fp8_format)f, c), got = fp8_decode((fp8_format)f, (uint8_t)c);
            ck_assert_msg(same_value(got, want), "%s code 0x%02x: %g, table %g",
                          fp8_info((fp8_format)f)->name, c, got, want);
            finite += isfinite(want);
        }
        const fp8_format_info *in = fp8_info((fp8_format)f);
        printf("%s: 256 codes decoded as the bit fields say; %d finite, max %g, normal from %g,"
               " subnormal from %g\n", in->name, finite, in->max, in->min_normal, in->min_subnormal);
        ck_assert_int_eq(finite, in->finite_codes);
        int codes[128];
        const int n = positive_grid((fp8_format)f, codes);
        ck_assert_float_eq(table_value((fp8_format)f, codes[n - 1]), in->max);
        ck_assert_float_eq(table_value((fp8_format)f, 1), in->min_subnormal);
        ck_assert_float_eq(table_value((fp8_format)f, 1 << in->mantissa_bits), in->min_normal);
    }
    ck_assert_float_eq(fp8_info(FP8_E4M3)->max, 448.0f);
    ck_assert_float_eq(fp8_info(FP8_E5M2)->max, 57344.0f);
}
END_TEST

START_TEST(test_encode_every_midpoint) {
    for (int f = 0; f < FP8_FORMATS; f++) {
        int checked;
        const int bad = encode_mismatches((fp8_format)f, fp8_encode, &checked);
        printf("%s: %d encodings checked against the table, %d wrong\n",
               fp8_info((fp8_format)f)->name, checked, bad);
        ck_assert_int_eq(bad, 0);
    }
    /* the vector form is the scalar one, scale first */
    const float x[4] = {0.3f, -1000.0f, 0x1p-12f, 5.0f};
    uint8_t v[4];
    fp8_encode_scaled(FP8_E4M3, v, x, 4, 4.0f);
    for (int i = 0; i < 4; i++) ck_assert_int_eq(v[i], fp8_encode(FP8_E4M3, x[i] * 4.0f));
}
END_TEST

/* Negative controls: rounding toward zero, and ties away from zero (the table's
 * neighbour of a value, found by search, not by the code under test). */
static uint8_t nearest_by_search(fp8_format f, float x, int ties_away) {
    int codes[128];
    const int n = positive_grid(f, codes);
    const float a = fabsf(x);
    int best = codes[0];
    for (int i = 0; i < n; i++) {
        const float v = table_value(f, codes[i]), d = fabsf(v - a);
        const float bd = fabsf(table_value(f, best) - a);
        if (d < bd || (d == bd && ties_away)) best = codes[i];
    }
    return (uint8_t)((signbit(x) ? 0x80 : 0) | best);
}
static uint8_t ties_away(fp8_format f, float x) {
    return isnan(x) ? fp8_encode(f, x) : nearest_by_search(f, x, 1);
}
static uint8_t truncating(fp8_format f, float x) {
    uint8_t c = fp8_encode(f, x);
    const float v = fp8_decode(f, c);
    if (fabsf(v) > fabsf(x) && (c & 0x7f) != 0) c--;   /* one code toward zero */
    return c;
}

START_TEST(test_encode_negative_controls) {
    for (int f = 0; f < FP8_FORMATS; f++) {
        int checked;
        const int away = encode_mismatches((fp8_format)f, ties_away, &checked);
        const int trunc = encode_mismatches((fp8_format)f, truncating, &checked);
        printf("negative controls, %s: ties away from zero %d wrong, truncation %d wrong of %d\n",
               fp8_info((fp8_format)f)->name, away, trunc, checked);
        ck_assert_int_gt(away, 0);
        ck_assert_int_gt(trunc, 0);
    }
}
END_TEST

/* ---- block scaling by hand ------------------------------------------------------------- */

/* x [2, 8] in 1 x 4 tiles, w [4, 8] in 4 x 4 blocks (the blockwise recipe's 1 x 128 and
 * 128 x 128, small). Each tile's amax goes to 448: scales 448/7 = 64, 448/(7/1024) =
 * 65536, 448/0.875 = 512, 448/28 = 16; w's blocks 448/0.4375 = 1024 and 448/1.75 = 256.
 * Rounded on the scaled grid: 0.3 x 64 = 19.2 -> 20 (spacing 2 in [16, 32)), so 0.3125;
 * 0.1 x 512 = 51.2 -> 52 (spacing 4), 0.1015625; w's 0.01 x 1024 = 10.24 -> 10,
 * 0.009765625. Every other value lands on the grid. */
static const float hand_x[2][8] = {
    {7, 3.5f, 0.3f, -1, 7.0f / 1024, 0, -3.5f / 1024, 1.0f / 1024},
    {0.875f, 0.5f, -0.25f, 0.1f, 28, 14, -7, 1}};
static const float hand_w[4][8] = {
    {0.4375f, 0, 0, 0, 1, 0, 0, 0},
    {0, 0.25f, 0.01f, 0, 0, 1.75f, 0, 0},
    {0.125f, 0.125f, 0.125f, 0.125f, 0.5f, 0.5f, 0.5f, 0.5f},
    {-0.0625f, 0, 0, 0.25f, 0, 0, 0, -1.75f}};
/* x-hat w-hat^T summed by hand (in exact fractions; every term is a short binary
 * fraction, and so is every partial sum, so fp32 holds them exactly). Without
 * rounding (fp32): 3.0693359375 0.878 1.227197... -0.6892...; 28.38 24.6225 18.153125
 * -1.7796875. */
static const float hand_y[2][4] = {{3.0693359375f, 0.8780517578125f, 1.228759765625f, -0.689208984375f},
                                   {28.3828125f, 24.62255859375f, 18.1533203125f, -1.779296875f}};

static float product_diff(const fp8_matrix *x, const fp8_matrix *w) {
    float y[8], work[64];
    ck_assert(fp8_matmul_workspace(x, w) <= 64);
    ck_assert_ptr_null(fp8_matmul(y, x, w, work));
    float d = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) d = fmaxf(d, fabsf(y[i * 4 + j] - hand_y[i][j]));
    return d;
}

START_TEST(test_block_scaling_by_hand) {
    fp8_matrix x = fp8_matrix_make(FP8_E4M3, 2, 8, 1, 4), w = fp8_matrix_make(FP8_E4M3, 4, 8, 4, 4);
    fp8_quantize(&x, &hand_x[0][0]);
    fp8_quantize(&w, &hand_w[0][0]);
    const float x_scales[4] = {64, 65536, 512, 16}, w_scales[2] = {1024, 256};
    for (int b = 0; b < 4; b++) ck_assert_float_eq(x.scales[b], x_scales[b]);
    for (int b = 0; b < 2; b++) ck_assert_float_eq(w.scales[b], w_scales[b]);
    float xd[16], wd[32];
    fp8_dequantize(&x, xd);
    fp8_dequantize(&w, wd);
    ck_assert_float_eq(xd[2], 0.3125f);
    ck_assert_float_eq(xd[11], 0.1015625f);
    ck_assert_float_eq(wd[8 + 2], 0.009765625f);
    ck_assert_float_eq(xd[7], 1.0f / 1024);   /* 64 on the scaled grid */
    ck_assert_int_eq(fp8_matmul_chunk(&x, &w), 4);   /* rescaled every 4 of K */
    const float d = product_diff(&x, &w);
    printf("block scaling by hand: largest |y - hand| %.3g\n", d);
    ck_assert(d <= 1e-6f * 28);

    /* negative control: rounded first, the scale applied after (as if code = round(x)
     * and the scale then multiplied the rounded value): 1/1024 is half of E4M3's
     * smallest subnormal and rounds to 0, 7/1024 to 4 x 2^-9 */
    for (int i = 0; i < 16; i++) {
        const float rounded = fp8_decode(FP8_E4M3, fp8_encode(FP8_E4M3, (&hand_x[0][0])[i]));
        x.codes[i] = fp8_encode(FP8_E4M3, rounded * x.scales[i / 4]);
    }
    const float bad = product_diff(&x, &w);
    printf("negative control, scale after rounding: largest |y - hand| %.3g\n", bad);
    ck_assert(bad > 1e-6f * 28);
    fp8_matrix_free(&x);
    fp8_matrix_free(&w);
}
END_TEST

/* The recipes' blocks: whole tensor, rows, DeepSeek-V3's 1 x 128 and 128 x 128. */
START_TEST(test_recipe_blocks) {
    const int want[FP8_RECIPES][2][2] = {
        {{300, 256}, {200, 256}}, {{300, 256}, {200, 256}}, {{1, 256}, {1, 256}},
        {{1, 128}, {128, 128}}};
    for (int r = 0; r < FP8_RECIPES; r++) {
        int br, bc;
        fp8_recipe_blocks((fp8_recipe)r, FP8_ACTIVATION, 300, 256, &br, &bc);
        ck_assert(br == want[r][0][0] && bc == want[r][0][1]);
        fp8_recipe_blocks((fp8_recipe)r, FP8_WEIGHT, 200, 256, &br, &bc);
        ck_assert(br == want[r][1][0] && bc == want[r][1][1]);
        fp8_recipe got;
        ck_assert_int_eq(fp8_recipe_parse(fp8_recipe_name((fp8_recipe)r), &got), 0);
        ck_assert_int_eq(got, r);
    }
    fp8_recipe got;
    fp8_format fmt;
    ck_assert_int_eq(fp8_recipe_parse("channelwise", &got), -1);
    ck_assert_int_eq(fp8_format_parse("e5m2", &fmt), 0);
    ck_assert_int_eq(fmt, FP8_E5M2);
    ck_assert_int_eq(fp8_format_parse("e4m2", &fmt), -1);
    ck_assert_uint_eq(fp8_scale_count(300, 256, 128, 128), 3 * 2);
}
END_TEST

/* ---- the product against its definition ------------------------------------------------ */

static void gaussian(float *x, size_t n, uint64_t stream, float sd) {
    for (size_t i = 0; i < n; i++) x[i] = sd * rng_normal(42, stream, i);
}

/* x, w quantized by a recipe (x in fx, w in fw); out = the emulated product. */
static void recipe_product(fp8_recipe r, fp8_format fx, fp8_format fw, const float *x,
                           const float *w, int M, int N, int K, float *out) {
    int br, bc;
    fp8_recipe_blocks(r, FP8_ACTIVATION, M, K, &br, &bc);
    fp8_matrix qx = fp8_matrix_make(fx, M, K, br, bc);
    fp8_recipe_blocks(r, FP8_WEIGHT, N, K, &br, &bc);
    fp8_matrix qw = fp8_matrix_make(fw, N, K, br, bc);
    fp8_quantize(&qx, x);
    fp8_quantize(&qw, w);
    float *work = malloc(fp8_matmul_workspace(&qx, &qw) * sizeof(float));
    ck_assert_ptr_nonnull(work);
    ck_assert_ptr_null(fp8_matmul(out, &qx, &qw, work));
    free(work);
    fp8_matrix_free(&qx);
    fp8_matrix_free(&qw);
}

/* ||y - x w^T|| / ||x w^T||, the reference in double. */
static double relative_error(const float *y, const float *x, const float *w, int M, int N, int K) {
    double num = 0, den = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0;
            for (int k = 0; k < K; k++) ref += (double)x[i * K + k] * w[j * K + k];
            num += (y[i * N + j] - ref) * (y[i * N + j] - ref);
            den += ref * ref;
        }
    return sqrt(num / den);
}

/* The emulated product equals the dequantized operands' product (in double) to fp32's
 * summation error, at shapes whose blocks do not divide (N = 130, K = 300: partial
 * chunks and row blocks), for every recipe and for E4M3 x E5M2 (hybrid). */
START_TEST(test_product_is_dequantized_product) {
    enum { M = 5, N = 130, K = 300 };
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *y = malloc(sizeof(float) * M * N), *xd = malloc(sizeof(float) * M * K);
    float *wd = malloc(sizeof(float) * N * K);
    gaussian(x, M * K, 1, 1.0f);
    gaussian(w, N * K, 2, 0.02f);
    for (int k = 0; k < K; k++) x[k] *= k < 128 ? 1000.0f : 0.001f;   /* tiles of row 0 apart */
    double worst = 0;
    for (int r = 0; r < FP8_RECIPES; r++)
        for (int fw = 0; fw < FP8_FORMATS; fw++) {
            recipe_product((fp8_recipe)r, FP8_E4M3, (fp8_format)fw, x, w, M, N, K, y);
            int br, bc;
            fp8_recipe_blocks((fp8_recipe)r, FP8_ACTIVATION, M, K, &br, &bc);
            fp8_matrix qx = fp8_matrix_make(FP8_E4M3, M, K, br, bc);
            fp8_recipe_blocks((fp8_recipe)r, FP8_WEIGHT, N, K, &br, &bc);
            fp8_matrix qw = fp8_matrix_make((fp8_format)fw, N, K, br, bc);
            fp8_quantize(&qx, x);
            fp8_quantize(&qw, w);
            fp8_dequantize(&qx, xd);
            fp8_dequantize(&qw, wd);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double ref = 0, mag = 0;
                    for (int k = 0; k < K; k++) {
                        ref += (double)xd[i * K + k] * wd[j * K + k];
                        mag += fabs((double)xd[i * K + k] * wd[j * K + k]);
                    }
                    worst = fmax(worst, fabs(y[i * N + j] - ref) / mag);
                }
            fp8_matrix_free(&qx);
            fp8_matrix_free(&qw);
        }
    printf("emulated product against the dequantized product: largest |d| / sum |x w| %.3g\n", worst);
    ck_assert(worst < 1e-5);   /* fp32 sums of 300 terms: ~300 x 6e-8 at worst */
    free(x); free(w); free(y); free(xd); free(wd);
}
END_TEST

/* ---- outlier channels, delayed scaling ------------------------------------------------- */

/* Activations [64, 256] with 4 channels of the first 128 made `factor` times larger and
 * the weight's matching columns as much smaller, so that x w^T is the same product:
 * only the scaling sees the outliers. Relative errors of the product, per recipe. */
static void outlier_errors(float factor, double err[FP8_RECIPES]) {
    enum { M = 64, N = 64, K = 256 };
    static const int channels[4] = {5, 17, 40, 99};
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K);
    float *y = malloc(sizeof(float) * M * N);
    gaussian(x, M * K, 3, 1.0f);
    gaussian(w, N * K, 4, 0.05f);
    for (int c = 0; c < 4; c++) {
        for (int i = 0; i < M; i++) x[i * K + channels[c]] *= factor;
        for (int j = 0; j < N; j++) w[j * K + channels[c]] /= factor;
    }
    for (int r = 0; r < FP8_RECIPES; r++) {
        recipe_product((fp8_recipe)r, FP8_E4M3, FP8_E4M3, x, w, M, N, K, y);
        err[r] = relative_error(y, x, w, M, N, K);
    }
    free(x); free(w); free(y);
}

/* E4M3 spans 2^-9 .. 448, almost 18 binades: per-tensor scaling gives log2(factor) of
 * them to the outliers. At 100x (6.6 binades) the ordinary channels keep their 3
 * mantissa bits and the error hardly moves; at 10^5x they fall into the subnormals and
 * per-tensor scaling loses them, where 1 x 128 tiles lose only the outliers' tile.
 * Negative control: the 10^5x case fails the bound the other cases meet. */
START_TEST(test_outlier_channels) {
    const float factors[3] = {1, 100, 1e5f};
    double err[3][FP8_RECIPES];
    for (int f = 0; f < 3; f++) {
        outlier_errors(factors[f], err[f]);
        printf("outliers x%-6g e4m3 relative error:", factors[f]);
        for (int r = 0; r < FP8_RECIPES; r++) printf(" %s %.4f", fp8_recipe_name((fp8_recipe)r), err[f][r]);
        printf("\n");
    }
    for (int r = 0; r < FP8_RECIPES; r++) {
        ck_assert(err[0][r] < 0.05);   /* 3 mantissa bits: a rounding is within 2^-4 */
        ck_assert(err[1][r] < 1.1 * err[0][r]);   /* 100x: absorbed by the range */
    }
    ck_assert(err[2][FP8_TENSORWISE] > 5 * err[0][FP8_TENSORWISE]);   /* the failure */
    ck_assert(err[2][FP8_TENSORWISE] > 2 * err[2][FP8_BLOCKWISE]);
    ck_assert(err[2][FP8_DELAYED] == err[2][FP8_TENSORWISE]);   /* no history: current */
}
END_TEST

/* Delayed scaling: the scale comes from the largest amax of the last `length` steps,
 * divided by 2^margin; a step's own amax counts from the next step on, so a spike past
 * the history saturates, where current scaling does not. */
START_TEST(test_delayed_history) {
    fp8_delayed d;
    ck_assert_ptr_nonnull(fp8_delayed_init(&d, 0, 0));
    ck_assert_ptr_nonnull(fp8_delayed_init(&d, 4, -1));
    ck_assert_ptr_null(fp8_delayed_init(&d, 3, 1));
    ck_assert_float_eq(fp8_delayed_scale(&d, FP8_E4M3, 7), 448.0f / 7 / 2);   /* first step */
    const float amax[4] = {4, 1, 2, 1};
    for (int i = 0; i < 4; i++) fp8_delayed_record(&d, amax[i]);
    ck_assert_float_eq(fp8_delayed_scale(&d, FP8_E4M3, 100), 448.0f / 2 / 2);   /* 4 left */
    fp8_delayed_free(&d);

    /* the spike: history says 1, this step's amax is 10 */
    ck_assert_ptr_null(fp8_delayed_init(&d, 16, 0));
    fp8_delayed_record(&d, 1.0f);
    const float x[4] = {10, 0.5f, -0.25f, 1};
    fp8_matrix q = fp8_matrix_make(FP8_E4M3, 1, 4, 1, 4);
    float out[4];
    ck_assert_float_eq(fp8_quantize_delayed(&q, x, &d), 10.0f);
    fp8_dequantize(&q, out);
    printf("delayed scaling, amax 1 in the history, a spike of 10: comes back as %g\n", out[0]);
    ck_assert_float_eq(out[0], 1.0f);   /* saturated at 448 / scale 448 */
    ck_assert_float_eq(out[1], 0.5f);
    fp8_quantize(&q, x);   /* current scaling keeps it */
    fp8_dequantize(&q, out);
    ck_assert_float_eq(out[0], 10.0f);
    ck_assert_float_eq(fp8_delayed_scale(&d, FP8_E4M3, 0), 44.8f);   /* recorded: 10 */
    fp8_matrix_free(&q);
    fp8_delayed_free(&d);
    ck_assert_float_eq(fp8_scale_for(FP8_E4M3, 0, 0), 1.0f);
    ck_assert_float_eq(fp8_scale_for(FP8_E4M3, NAN, 0), 1.0f);
    ck_assert(isfinite(fp8_scale_for(FP8_E5M2, 1e-40f, 0)));
}
END_TEST

static Suite *fp8_suite(void) {
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("fp8");
    tcase_add_test(tc, test_decode_every_code);
    tcase_add_test(tc, test_encode_every_midpoint);
    tcase_add_test(tc, test_encode_negative_controls);
    tcase_add_test(tc, test_block_scaling_by_hand);
    tcase_add_test(tc, test_recipe_blocks);
    tcase_add_test(tc, test_product_is_dequantized_product);
    tcase_add_test(tc, test_outlier_channels);
    tcase_add_test(tc, test_delayed_history);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);
    return check_run(fp8_suite(), 0);
}
