/* The GPU path's rules that a CPU can check, in every build (no GPU needed):
 *
 *  - TF32 tolerance: the error that TF32's input rounding alone gives in linear at
 *    test_gpu_ops.c's shapes, simulated here (10 of 23 mantissa bits kept, rounded to
 *    nearest and, the worse case, truncated), must stay below that suite's TF32
 *    tolerance (2e-3). Negative control: keeping 7 bits (bfloat16) must exceed it.
 *
 * Each check prints the largest difference it saw. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "rng.h"

/* ---- TF32 input rounding ------------------------------------------------------------ */

#define TOL_TF32 2e-3   /* tests/test_gpu_ops.c */

/* x with only `bits` of its 23 mantissa bits: rounded to nearest (ties away, as the
 * tensor cores' conversion) or truncated. */
static float keep_mantissa(float x, int bits, int truncate) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int drop = 23 - bits;
    const uint32_t mask = ((uint32_t)1 << drop) - 1;
    if (!truncate) u += (uint32_t)1 << (drop - 1);
    u &= ~mask;
    float y;
    memcpy(&y, &u, sizeof y);
    return y;
}

static float *uniform(size_t n, uint64_t stream) {
    float *x = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * rng_uniform(7, stream, i) - 1.0);
    return x;
}

/* C[M,N] = A[M,K] B[K,N] (row strides lda, ldb) with A and B first cut to `bits`
 * mantissa bits (bits 23: exact), summed in double: what is left is the rounding of
 * the inputs. Returns max |C_bits - C_exact| / max |C_exact|. */
static double product_error(const float *A, size_t a_row, size_t a_col, const float *B,
                            size_t b_row, size_t b_col, int M, int N, int K, int bits,
                            int truncate) {
    double worst = 0.0, scale = 0.0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double exact = 0.0, cut = 0.0;
            for (int k = 0; k < K; k++) {
                const float a = A[m * a_row + k * a_col], b = B[k * b_row + n * b_col];
                exact += (double)a * b;
                cut += (double)keep_mantissa(a, bits, truncate) * keep_mantissa(b, bits, truncate);
            }
            const double d = fabs((double)(float)cut - exact);
            if (d > worst) worst = d;
            if (fabs(exact) > scale) scale = fabs(exact);
        }
    return worst / scale;
}

/* The worst of linear's three products at one shape: out = inp W^T, dinp = dout W,
 * dweight = dout^T inp (inp [N,IC], W [OC,IC], dout [N,OC]). */
static double linear_error(int N, int IC, int OC, int bits, int truncate) {
    float *inp = uniform((size_t)N * IC, 1), *w = uniform((size_t)OC * IC, 2),
          *dout = uniform((size_t)N * OC, 3);
    double e = product_error(inp, IC, 1, w, 1, IC, N, OC, IC, bits, truncate);
    double e2 = product_error(dout, OC, 1, w, IC, 1, N, IC, OC, bits, truncate);
    double e3 = product_error(dout, 1, OC, inp, IC, 1, OC, IC, N, bits, truncate);
    free(inp), free(w), free(dout);
    return fmax(e, fmax(e2, e3));
}

static double tf32_shapes_error(int bits, int truncate) {
    return fmax(linear_error(111, 72, 200, bits, truncate),
                linear_error(256, 384, 128, bits, truncate));
}

START_TEST(tf32_rounding_fits_the_tolerance) {
    const double nearest = tf32_shapes_error(10, 0), truncated = tf32_shapes_error(10, 1);
    printf("  TF32 inputs, rounded to nearest: rel error %.3e; truncated: %.3e"
           " (tolerance %.0e; the former 1e-03 left %.0f%% headroom)\n",
           nearest, truncated, TOL_TF32, 100.0 * (1.0 - truncated / 1e-3));
    ck_assert_msg(truncated < TOL_TF32, "TF32 rounding alone gives %.3e >= %.0e",
                  truncated, TOL_TF32);
    ck_assert_msg(nearest <= truncated, "rounding to nearest %.3e worse than truncating %.3e",
                  nearest, truncated);
}
END_TEST

START_TEST(bf16_rounding_exceeds_the_tolerance) {
    /* negative control: the same check with 7 mantissa bits must fail */
    const double bf16 = tf32_shapes_error(7, 0);
    printf("  negative control, bfloat16 inputs (7 bits): rel error %.3e (must exceed %.0e)\n",
           bf16, TOL_TF32);
    ck_assert_msg(bf16 > TOL_TF32, "7-bit inputs give only %.3e", bf16);
}
END_TEST

int main(void) {
    Suite *suite = suite_create("gpu_host");
    TCase *tf32 = tcase_create("tf32_tolerance");
    tcase_set_timeout(tf32, 60);
    tcase_add_test(tf32, tf32_rounding_fits_the_tolerance);
    tcase_add_test(tf32, bf16_rounding_exceeds_the_tolerance);
    suite_add_tcase(suite, tf32);
    return check_run(suite, 0);
}
