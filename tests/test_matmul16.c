/* Tests of the 16-bit matmuls (matmul16.h) and the precision conversions (precision.h).
 *
 * The matmul is checked against an fp64 product of the SAME 16-bit inputs, so that the
 * only difference left is the fp32 accumulation. Its bound, derived: a product of two
 * bf16 values (8 + 8 significant bits) or two fp16 values (11 + 11) fits fp32's 24
 * bits, so every product is exact (vdpbf16ps and FMA form them exactly too); what
 * rounds is the sum. Summing n terms in ANY order (oneDNN blocks K its own way) takes
 * n - 1 additions along a tree of height at most n - 1, each rounding by at most
 * u = 2^-24 = eps32 / 2, so (Higham, Accuracy and Stability, 4.2)
 *     |fl(sum) - sum| <= gamma(n-1) sum |term|,   gamma(m) = m u / (1 - m u).
 * Here the terms are the K products, plus C itself with beta = 1: n - 1 <= K, so
 *     |C - ref| <= c eps32 (sum_k |a_ik b_kj| + |C0_ij|),  c = (K / 2) / (1 - K u),
 * the fp64 reference's own error (K 2^-53) being far below it. Each check prints its
 * worst |C - ref| / bound ("ratio", at most 1).
 *
 * The negative control rounds fp32 inputs to bf16 and compares the product with the
 * fp64 product of the UNROUNDED inputs: the input rounding (2^-9 relative per input)
 * is far above the accumulation bound, and the test must see it (ratio > 1). */
#include <check.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "matmul16.h"
#include "number_formats.h"
#include "precision.h"
#include "rng.h"

/* ---- helpers --------------------------------------------------------------------- */

/* The project's counter-based generator (rng.h), read as a stream: uniform in (0, 1). */
static uint64_t rng_stream_seed, rng_next;

static void rng_seed(uint64_t seed) {
    rng_stream_seed = seed;
    rng_next = 0;
}

static double urand(void) { return rng_uniform(rng_stream_seed, 0, rng_next++); }

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* One product's operands: A stored [M,K] or [K,M] (trans_a), B [K,N] or [N,K], with
 * leading dimensions padded by pad elements (strided operands, as the attention's). */
typedef struct {
    precision p;
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    float *a32, *b32;      /* the fp32 values before rounding */
    uint16_t *a16, *b16;   /* the same rounded to p */
    float *c0, *c;         /* C before (beta 1: random; beta 0: NaN, must be ignored) */
} product;

static size_t a_rows(const product *q) { return (size_t)(q->ta ? q->K : q->M); }
static size_t b_rows(const product *q) { return (size_t)(q->tb ? q->N : q->K); }

static product product_make(precision p, int ta, int tb, int M, int N, int K,
                            float beta, int pad) {
    product q = {.p = p, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .beta = beta};
    q.lda = (ta ? M : K) + pad;
    q.ldb = (tb ? K : N) + pad;
    q.ldc = N + pad;
    size_t na = a_rows(&q) * q.lda, nb = b_rows(&q) * q.ldb, nc = (size_t)M * q.ldc;
    q.a32 = xcalloc(na, sizeof(float));
    q.b32 = xcalloc(nb, sizeof(float));
    for (size_t i = 0; i < na; i++) q.a32[i] = (float)(2.0 * urand() - 1.0);
    for (size_t i = 0; i < nb; i++) q.b32[i] = (float)(2.0 * urand() - 1.0);
    q.a16 = xcalloc(na, sizeof(uint16_t));
    q.b16 = xcalloc(nb, sizeof(uint16_t));
    precision_to16(p, q.a16, q.a32, na);
    precision_to16(p, q.b16, q.b32, nb);
    q.c0 = xcalloc(nc, sizeof(float));
    q.c = xcalloc(nc, sizeof(float));
    for (size_t i = 0; i < nc; i++) q.c0[i] = beta != 0.0f ? (float)(urand() - 0.5) : NAN;
    memcpy(q.c, q.c0, nc * sizeof(float));
    return q;
}

static void product_free(product *q) {
    free(q->a32); free(q->b32); free(q->a16); free(q->b16); free(q->c0); free(q->c);
}

static void product_run(product *q) {
    matmul16(q->p, q->ta, q->tb, q->M, q->N, q->K, q->a16, q->lda, q->b16, q->ldb,
             q->beta, q->c, q->ldc);
}

/* op(X) element (r, k) of a stored operand, as a double: the 16-bit value widened, or
 * (rounded = 0) the fp32 value it was rounded from. */
static double element(const product *q, int is_a, int r, int k, int rounded) {
    /* B is read as op(B)^T [N,K]: stored [K,N] is then the transposed case */
    int trans = is_a ? q->ta : !q->tb, ld = is_a ? q->lda : q->ldb;
    size_t at = trans ? (size_t)k * ld + r : (size_t)r * ld + k;
    if (!rounded) return (is_a ? q->a32 : q->b32)[at];
    uint16_t h = (is_a ? q->a16 : q->b16)[at];
    return q->p == PRECISION_BF16 ? number_from_bf16(h) : number_from_f16(h);
}

/* op(A) as [M,K] and op(B) as [K,N], packed, in double. */
static void widen_operands(const product *q, int rounded, double *a, double *b) {
    for (int i = 0; i < q->M; i++)
        for (int k = 0; k < q->K; k++)
            a[(size_t)i * q->K + k] = element(q, 1, i, k, rounded);
    for (int k = 0; k < q->K; k++)
        for (int j = 0; j < q->N; j++)
            b[(size_t)k * q->N + j] = element(q, 0, j, k, rounded);
}

/* Worst |C - ref| / bound over C, ref = beta C0 + op(A) op(B) in fp64 (of the rounded
 * inputs, or of the fp32 ones for the negative control). */
static double worst_ratio(const product *q, int rounded) {
    const int M = q->M, N = q->N, K = q->K;
    double *a = xcalloc((size_t)M * K, sizeof(double));
    double *b = xcalloc((size_t)K * N, sizeof(double));
    double *ref = xcalloc((size_t)N, sizeof(double)), *mag = xcalloc(N, sizeof(double));
    widen_operands(q, rounded, a, b);
    const double c = (K / 2.0) / (1.0 - K * 0x1p-24), eps32 = FLT_EPSILON;
    double worst = 0.0;
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double c0 = q->beta != 0.0f ? q->c0[(size_t)i * q->ldc + j] : 0.0;
            ref[j] = c0;
            mag[j] = fabs(c0);
        }
        for (int k = 0; k < K; k++) {
            const double aik = a[(size_t)i * K + k], *bk = b + (size_t)k * N;
            for (int j = 0; j < N; j++) {   /* row i of the product, vectorised over j */
                ref[j] += aik * bk[j];
                mag[j] += fabs(aik * bk[j]);
            }
        }
        for (int j = 0; j < N; j++) {
            double err = fabs(q->c[(size_t)i * q->ldc + j] - ref[j]);
            double r = err / fmax(c * eps32 * mag[j], DBL_MIN);
            if (!(r <= worst)) worst = r;   /* a NaN becomes the maximum */
        }
    }
    free(a); free(b); free(ref); free(mag);
    return worst;
}

/* ---- the product against fp64 ------------------------------------------------------ */

typedef struct { int M, N, K; } shape;
/* odd shapes, then bench256's: qkv / fc forward, and fc-proj's forward (K = 4C) */
static const shape shapes[] = {{1, 1, 1},      {7, 13, 5},      {33, 65, 17},
                               {512, 768, 256}, {512, 1024, 256}, {512, 256, 1024}};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Shape s in every transpose and beta, in precision p: the worst ratio. */
static double check_shape(precision p, int s) {
    const shape sh = shapes[s];
    const int pad = sh.M * sh.N < 10000 ? 3 : 0;   /* strided operands when small */
    double worst = 0.0;
    for (int t = 0; t < 4; t++)
        for (int beta = 0; beta <= 1; beta++) {
            rng_seed(1000 * s + 10 * t + beta);
            product q = product_make(p, t & 1, t >> 1, sh.M, sh.N, sh.K, (float)beta, pad);
            product_run(&q);
            double r = worst_ratio(&q, 1);
            ck_assert_msg(r <= 1.0, "%s %dx%dx%d trans_a %d trans_b %d beta %d: ratio %g > 1",
                          precision_name(p), sh.M, sh.N, sh.K, t & 1, t >> 1, beta, r);
            if (r > worst) worst = r;
            product_free(&q);
        }
    return worst;
}

/* Every shape in precision p; the worst ratio of each printed. */
static void check_all(precision p) {
    printf("  %s (%s) against fp64 of the same inputs, 4 transposes x beta 0/1:\n",
           precision_name(p), matmul16_impl(p, 0, 1, 512, 768, 256));
    for (int s = 0; s < N_SHAPES; s++)
        printf("    %4d x %4d x %4d  worst |error| / bound %.4f (<= 1)\n", shapes[s].M,
               shapes[s].N, shapes[s].K, check_shape(p, s));
}

START_TEST(test_bf16_products) { check_all(PRECISION_BF16); }
END_TEST

START_TEST(test_fp16_products) { check_all(PRECISION_FP16); }
END_TEST

/* The negative control: bf16-rounded inputs against the fp32 inputs' exact product. */
/* matmul16_out16: the product plus a bias row, rounded once to 16 bits by the product
 * itself. Against fp64 of the same inputs its error is the fp32 sum's (the bound
 * above, the bias counted as C0) plus one rounding of the output: at most one unit of
 * the 16-bit format's relative spacing, 2^-8 in bf16, 2^-11 in fp16 (plus fp16's
 * subnormal step). Every transpose, with and without the bias, at odd shapes (strided)
 * and at one of bench256's; the fp16 ones run the widen + fp32 matmul fallback. */
static double out16_worst(precision p, int ta, int tb, shape sh, int with_bias, int pad) {
    product q = product_make(p, ta, tb, sh.M, sh.N, sh.K, with_bias ? 1.0f : 0.0f, pad);
    uint16_t *bias16 = xcalloc((size_t)sh.N, sizeof(uint16_t));
    uint16_t *c16 = xcalloc((size_t)sh.M * q.ldc, sizeof(uint16_t));
    for (int j = 0; j < sh.N; j++) {
        bias16[j] = p == PRECISION_BF16 ? number_to_bf16(q.c0[j]) : number_to_f16(q.c0[j]);
        for (int i = 0; i < sh.M && with_bias; i++)   /* the reference's C0: the bias row */
            q.c0[(size_t)i * q.ldc + j] = p == PRECISION_BF16 ? number_from_bf16(bias16[j])
                                                              : number_from_f16(bias16[j]);
    }
    matmul16_out16(p, ta, tb, sh.M, sh.N, sh.K, q.a16, q.lda, q.b16, q.ldb,
                   with_bias ? bias16 : NULL, c16, q.ldc);
    for (size_t i = 0; i < (size_t)sh.M * q.ldc; i++)
        q.c[i] = p == PRECISION_BF16 ? number_from_bf16(c16[i]) : number_from_f16(c16[i]);
    /* the output rounding, on top of worst_ratio's fp32 bound: recompute against both */
    const double u16 = p == PRECISION_BF16 ? 0x1p-8 : 0x1p-11, tiny = 0x1p-24;
    double *a = xcalloc((size_t)sh.M * sh.K, sizeof(double));
    double *b = xcalloc((size_t)sh.K * sh.N, sizeof(double));
    widen_operands(&q, 1, a, b);
    const double c = (sh.K / 2.0) / (1.0 - sh.K * 0x1p-24);
    double worst = 0;
    for (int i = 0; i < sh.M; i++)
        for (int j = 0; j < sh.N; j++) {
            double ref = with_bias ? q.c0[(size_t)i * q.ldc + j] : 0, mag = fabs(ref);
            for (int k = 0; k < sh.K; k++) {
                ref += a[(size_t)i * sh.K + k] * b[(size_t)k * sh.N + j];
                mag += fabs(a[(size_t)i * sh.K + k] * b[(size_t)k * sh.N + j]);
            }
            const double bound = c * FLT_EPSILON * mag + u16 * (fabs(ref) + c * FLT_EPSILON * mag) + tiny;
            const double r = fabs(q.c[(size_t)i * q.ldc + j] - ref) / bound;
            if (!(r <= worst)) worst = r;
        }
    free(a); free(b); free(bias16); free(c16);
    product_free(&q);
    return worst;
}

START_TEST(test_out16_products) {
    const shape odd[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {512, 1024, 256}};
    for (int pi = 0; pi < 2; pi++) {
        const precision p = pi ? PRECISION_FP16 : PRECISION_BF16;
        double worst = 0;
        for (int s = 0; s < 4; s++)
            for (int t = 0; t < 4; t++)
                for (int with_bias = 0; with_bias <= 1; with_bias++) {
                    rng_seed(7000 + 100 * s + 10 * t + with_bias);
                    const double r = out16_worst(p, t & 1, t >> 1, odd[s], with_bias,
                                                 odd[s].M < 100 ? 3 : 0);
                    ck_assert_msg(r <= 1.0, "%s out16 %dx%dx%d t %d bias %d: ratio %g",
                                  precision_name(p), odd[s].M, odd[s].N, odd[s].K, t,
                                  with_bias, r);
                    worst = fmax(worst, r);
                }
        printf("%s matmul16_out16: worst |C - ref| / bound %.3f (fp32 sum + one 16-bit"
               " rounding)\n", precision_name(p), worst);
    }
    /* K = 0: the bias alone, or zeros */
    uint16_t bias[3] = {0x3f80, 0x4000, 0xbf80}, c[6] = {1, 1, 1, 1, 1, 1};
    matmul16_out16(PRECISION_BF16, 0, 1, 2, 3, 0, NULL, 1, NULL, 1, bias, c, 3);
    ck_assert(c[0] == 0x3f80 && c[4] == 0x4000 && c[5] == 0xbf80);
    matmul16_out16(PRECISION_BF16, 0, 1, 2, 3, 0, NULL, 1, NULL, 1, NULL, c, 3);
    ck_assert(c[0] == 0 && c[5] == 0);
}
END_TEST

START_TEST(test_negative_control) {
    const shape cases[] = {{7, 13, 5}, {33, 65, 17}, {512, 256, 1024}};
    for (int s = 0; s < 3; s++) {
        rng_seed(77 + s);
        product q = product_make(PRECISION_BF16, 0, 1, cases[s].M, cases[s].N, cases[s].K,
                                 0.0f, 0);
        product_run(&q);
        double same = worst_ratio(&q, 1), unrounded = worst_ratio(&q, 0);
        printf("  negative control %dx%dx%d: vs rounded inputs %.4f, vs unrounded %.1f "
               "(must be > 1)\n", cases[s].M, cases[s].N, cases[s].K, same, unrounded);
        ck_assert(same <= 1.0);
        ck_assert_msg(unrounded > 1.0, "the bound does not see bf16 rounding: %g",
                      unrounded);
        product_free(&q);
    }
}
END_TEST

/* Repeating known shapes creates nothing; the implementation is named. */
START_TEST(test_cached_and_named) {
    rng_seed(5);
    product q = product_make(PRECISION_BF16, 0, 1, 33, 65, 17, 1.0f, 0);
    product_run(&q);
    unsigned long made = matmul16_creations();
    for (int i = 0; i < 10; i++) product_run(&q);
    ck_assert_uint_eq(matmul16_creations(), made);
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        const char *impl = matmul16_impl((precision)p, 0, 0, 512, 1024, 256);
        printf("  %s 512x1024x256 runs on: %s\n", precision_name((precision)p), impl);
        ck_assert(strlen(impl) > 0);
    }
    /* K = 0: an empty sum (C = 0 with beta 0, C kept with beta 1) */
    float c[2] = {NAN, 5.0f};
    matmul16(PRECISION_BF16, 0, 0, 1, 1, 0, NULL, 1, NULL, 1, 0.0f, c, 1);
    matmul16(PRECISION_BF16, 0, 0, 1, 1, 0, NULL, 1, NULL, 1, 1.0f, c + 1, 1);
    ck_assert(c[0] == 0.0f && c[1] == 5.0f);
    product_free(&q);
    matmul16_release_thread();
}
END_TEST

/* ---- a row's bits, whatever rows share its call and wherever they sit ------------- */

/* Rows [r0, r0 + m) of q's product into c, or rounded to 16 bits with a bias into c16
 * (q's layout, rows r0 on), computed from copies of A, B and C placed `shift` elements
 * past the start of their allocations: another alignment than the whole product's. */
static void run_rows(const product *q, const uint16_t *bias, int r0, int m, int shift,
                     float *c, uint16_t *c16) {
    const size_t na = a_rows(q) * q->lda, nb = b_rows(q) * q->ldb;
    const size_t nc = (size_t)q->M * q->ldc, first = (size_t)r0 * q->ldc;
    uint16_t *a = xcalloc(na + shift, sizeof *a), *b = xcalloc(nb + shift, sizeof *b);
    memcpy(a + shift, q->a16, na * sizeof *a);
    memcpy(b + shift, q->b16, nb * sizeof *b);
    const uint16_t *rows = a + shift + (q->ta ? (size_t)r0 : (size_t)r0 * q->lda);
    if (c16) {
        uint16_t *out = xcalloc(nc + shift, sizeof *out);
        matmul16_out16(q->p, q->ta, q->tb, m, q->N, q->K, rows, q->lda, b + shift, q->ldb,
                       bias, out + shift + first, q->ldc);
        memcpy(c16 + first, out + shift + first, (size_t)m * q->ldc * sizeof *out);
        free(out);
    } else {
        float *out = xcalloc(nc + shift, sizeof *out);
        memcpy(out + shift, q->c0, nc * sizeof *out);
        matmul16(q->p, q->ta, q->tb, m, q->N, q->K, rows, q->lda, b + shift, q->ldb,
                 q->beta, out + shift + first, q->ldc);
        memcpy(c + first, out + shift + first, (size_t)m * q->ldc * sizeof *out);
        free(out);
    }
    free(a);
    free(b);
}

/* Splits of 128 rows into pieces of 16 rows or more (a rank's tokens are whole
 * sequences): two ranks' halves, and uneven pieces at odd offsets. Under 16 rows oneDNN
 * runs other kernels, which sum differently (measured: a 1-row piece in bf16, pieces of
 * 1-15 rows in fp32 with B transposed). Every kernel holds pieces of a multiple of 16
 * rows at a multiple of 16 (matmul16.h); the last split, odd pieces, is held where a
 * native kernel is found to hold any piece (matmul16_rows_invariant): not by the
 * fallback's kernels (oneDNN's sgemm 16 rows a call without AVX-512; its AVX-512
 * brgemm, measured: one row of 128 in fp16, beta 1) nor by AMX's bf16. */
static const int row_splits[][5] = {{64, 64}, {48, 16, 64}, {16, 32, 80}, {16, 16, 17, 79}};
#define ROW_SPLITS (int)(sizeof row_splits / sizeof row_splits[0])
static int row_splits_held(precision p) {
    return !matmul16_widens(p) && matmul16_rows_invariant(p) ? ROW_SPLITS : ROW_SPLITS - 1;
}

/* Rows of q's product (out16: rounded, with a bias) that differ, in their bits, from the
 * whole product's when computed in the pieces of split, each at its own alignment. */
static int rows_differing(const product *q, int out16, const int *split) {
    const size_t nc = (size_t)q->M * q->ldc;
    uint16_t *bias = xcalloc((size_t)q->N, sizeof *bias);
    precision_to16(q->p, bias, q->c0, out16 ? (size_t)q->N : 0);
    float *whole = xcalloc(nc, sizeof(float)), *pieces = xcalloc(nc, sizeof(float));
    uint16_t *whole16 = xcalloc(nc, 2), *pieces16 = xcalloc(nc, 2);
    run_rows(q, bias, 0, q->M, 0, whole, out16 ? whole16 : NULL);
    for (int i = 0, r0 = 0; r0 < q->M; r0 += split[i], i++)
        run_rows(q, bias, r0, split[i], 1 + 7 * i, pieces, out16 ? pieces16 : NULL);
    int differ = 0;
    for (int r = 0; r < q->M; r++) {
        const size_t at = (size_t)r * q->ldc, n = (size_t)q->N;
        differ += out16 ? memcmp(whole16 + at, pieces16 + at, n * 2) != 0
                        : memcmp(whole + at, pieces + at, n * sizeof(float)) != 0;
    }
    free(bias); free(whole); free(pieces); free(whole16); free(pieces16);
    return differ;
}

/* A rank multiplies its own rows of the batch (DDP, ZeRO, a pipeline's micro-batch):
 * they must come out as the whole batch's do, or fp16's rounding turns a last fp32 bit
 * into a whole fp16 step and the strategies part (a run resumed from another layout's
 * checkpoint with them). OpenBLAS's sgemm, which fp16 ran through before, fails this
 * under its AVX2 kernels (OPENBLAS_CORETYPE=Haswell: even the halves). Every transpose;
 * beta 0, 1 and the 16-bit output. */
START_TEST(test_rows_same_bits_in_any_split) {
    for (int pi = 0; pi < 2; pi++) {
        const precision p = pi ? PRECISION_FP16 : PRECISION_BF16;
        int checked = 0;
        for (int t = 0; t < 4; t++)
            for (int variant = 0; variant < 3; variant++)   /* beta 0, beta 1, out16 */
                for (int sp = 0; sp < row_splits_held(p); sp++) {
                    rng_seed(900 + 10 * t + variant);
                    product q = product_make(p, t & 1, t >> 1, 128, 96, 40,
                                             variant == 1 ? 1.0f : 0.0f, 3);
                    const int differ = rows_differing(&q, variant == 2, row_splits[sp]);
                    ck_assert_msg(differ == 0, "%s trans_a %d trans_b %d %s, split %d: %d of"
                                  " 128 rows differ from the whole product's", precision_name(p),
                                  t & 1, t >> 1, variant == 2 ? "out16" : variant ? "beta 1"
                                  : "beta 0", sp, differ);
                    checked++;
                    product_free(&q);
                }
        printf("%s (%s): %d products in pieces of rows at other alignments, every row the"
               " whole product's bits\n", precision_name(p), matmul16_impl(p, 0, 1, 128, 96, 40),
               checked);
    }
}
END_TEST

/* matmul16_rows_invariant's verdict on a native kernel is what this test measures:
 * odd pieces (a single row; 17 and 79 rows at odd offsets) of every transpose and
 * variant keep every row's bits exactly where the probe says they do, and some row
 * differs where it says not (AMX's bf16 in a one-row call). The fallback's verdict
 * speaks for nothing (matmul16.h). */
START_TEST(test_rows_probe_agrees) {
    static const int odd[][5] = {{1, 15, 112}, {16, 16, 17, 79}};
    for (int pi = 0; pi < 2; pi++) {
        const precision p = pi ? PRECISION_FP16 : PRECISION_BF16;
        if (matmul16_widens(p)) continue;
        int differ = 0;
        for (int t = 0; t < 4; t++)
            for (int variant = 0; variant < 3; variant++)
                for (int sp = 0; sp < 2; sp++) {
                    rng_seed(700 + 10 * t + variant);
                    product q = product_make(p, t & 1, t >> 1, 128, 96, 40,
                                             variant == 1 ? 1.0f : 0.0f, 3);
                    differ += rows_differing(&q, variant == 2, odd[sp]);
                    product_free(&q);
                }
        const int held = matmul16_rows_invariant(p);
        printf("%s (%s): odd pieces: %d rows differ; the probe says rows are %s\n",
               precision_name(p), matmul16_impl(p, 0, 1, 128, 96, 40), differ,
               held ? "held" : "not held");
        ck_assert_msg(held == (differ == 0), "%s: the probe says %d, %d rows differ",
                      precision_name(p), held, differ);
    }
}
END_TEST

/* Two threads at once (as two ranks): each its own primitives, the same bits as one. */
static void *run_in_thread(void *arg) {
    product *q = arg;
    product_run(q);
    matmul16_release_thread();
    return NULL;
}

START_TEST(test_threads) {
    product q[3];
    for (int i = 0; i < 3; i++) {
        rng_seed(31);   /* the same operands in all three */
        q[i] = product_make(PRECISION_BF16, 1, 0, 64, 96, 48, 0.0f, 0);
    }
    product_run(&q[0]);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, run_in_thread, &q[i + 1]), 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 1; i < 3; i++)
        ck_assert_mem_eq(q[i].c, q[0].c, (size_t)64 * 96 * sizeof(float));
    for (int i = 0; i < 3; i++) product_free(&q[i]);
}
END_TEST

/* ---- conversions ----------------------------------------------------------------- */

static uint16_t bf16_of(float x) {
    uint16_t h;
    precision_f32_to_bf16(&h, &x, 1);
    return h;
}
static uint16_t f16_of(float x) {
    uint16_t h;
    precision_f32_to_f16(&h, &x, 1);
    return h;
}

START_TEST(test_bf16_rounding) {
    /* bf16 keeps 7 fraction bits: at 1 its unit is 2^-7, a tie is 2^-8 */
    ck_assert_uint_eq(bf16_of(1.0f), 0x3f80);
    ck_assert_uint_eq(bf16_of(1.0f + 0x1p-8f), 0x3f80);              /* tie, to even */
    ck_assert_uint_eq(bf16_of(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);   /* above the tie */
    ck_assert_uint_eq(bf16_of(1.0f + 3 * 0x1p-8f), 0x3f82);          /* tie, to even */
    ck_assert_uint_eq(bf16_of(-1.0f - 0x1p-8f), 0xbf80);
    ck_assert_uint_eq(bf16_of(INFINITY), 0x7f80);
    ck_assert_uint_eq(bf16_of(-INFINITY), 0xff80);
    ck_assert_uint_eq(bf16_of(FLT_MAX), 0x7f80);   /* rounds past the largest: inf */
    /* a NaN whose payload lies only in the dropped bits stays a NaN */
    const uint32_t nans[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu};
    for (int i = 0; i < 4; i++) {
        float x = number_bits_f32(nans[i]), back;
        uint16_t h = bf16_of(x);
        precision_bf16_to_f32(&back, &h, 1);
        ck_assert_msg(isnan(back), "NaN 0x%08x became 0x%04x", nans[i], h);
    }
    /* every bf16 value widens exactly and rounds back to itself */
    for (uint32_t h = 0; h < 65536; h++) {
        float x;
        uint16_t in = (uint16_t)h;
        precision_bf16_to_f32(&x, &in, 1);
        ck_assert_uint_eq(number_f32_bits(x), h << 16);
        if (!isnan(x)) ck_assert_uint_eq(bf16_of(x), h);
    }
}
END_TEST

/* The value of fp16 bits h, computed independently of number_formats.h. */
static double f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

START_TEST(test_fp16_rounding) {
    ck_assert_uint_eq(f16_of(1.0f + 0x1p-11f), 0x3c00);       /* tie, to even */
    ck_assert_uint_eq(f16_of(1.0f + 3 * 0x1p-11f), 0x3c02);   /* tie, to even */
    ck_assert_uint_eq(f16_of(0x1p-24f), 0x0001);              /* smallest subnormal */
    ck_assert_uint_eq(f16_of(0x1p-25f), 0x0000);              /* tie with 0: even */
    ck_assert_uint_eq(f16_of(3 * 0x1p-25f), 0x0002);          /* tie 1 | 2: even */
    ck_assert_uint_eq(f16_of(0x1p-26f), 0x0000);              /* flushes to zero */
    ck_assert_uint_eq(f16_of(-0x1p-24f), 0x8001);
    ck_assert_uint_eq(f16_of(0x1p-14f - 0x1p-24f), 0x03ff);   /* largest subnormal */
    ck_assert_uint_eq(f16_of(0x1p-14f), 0x0400);              /* smallest normal */
    ck_assert_uint_eq(f16_of(65504.0f), 0x7bff);              /* largest finite */
    ck_assert_uint_eq(f16_of(65519.0f), 0x7bff);              /* below the tie */
    ck_assert_uint_eq(f16_of(65520.0f), 0x7c00);              /* tie: overflows */
    ck_assert_uint_eq(f16_of(1e6f), 0x7c00);
    ck_assert_uint_eq(f16_of(-1e6f), 0xfc00);
    ck_assert_uint_eq(f16_of(INFINITY), 0x7c00);
    ck_assert_uint_eq(f16_of(-INFINITY), 0xfc00);
    ck_assert(isnan(f16_value(f16_of(NAN))));
    ck_assert(isnan(f16_value(f16_of(number_bits_f32(0x7f800001u)))));
    /* every fp16 value widens to its exact value and rounds back to itself */
    for (uint32_t h = 0; h < 65536; h++) {
        float x;
        uint16_t in = (uint16_t)h;
        precision_f16_to_f32(&x, &in, 1);
        double want = f16_value(in);
        if (isnan(want)) {
            ck_assert(isnan(x));
            continue;
        }
        ck_assert_msg((double)x == want, "fp16 0x%04x widened to %a, not %a", h, x, want);
        ck_assert_uint_eq(f16_of(x), h);
    }
}
END_TEST

/* The vectorised loops (lengths that leave a tail) give the scalar conversions' bits. */
START_TEST(test_vectors_match_scalars) {
    enum { n = 1000 + 13 };
    float x[n], back[n];
    uint16_t h[n];
    rng_seed(9);
    for (int i = 0; i < n; i++)   /* over fp16's whole range, and past it */
        x[i] = (float)(ldexp(2.0 * urand() - 1.0, (int)(urand() * 44) - 28));
    x[0] = NAN, x[1] = INFINITY, x[2] = -0.0f, x[3] = 70000.0f;
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        precision_to16((precision)p, h, x, n);
        precision_from16((precision)p, back, h, n);
        for (int i = 0; i < n; i++) {
            uint16_t want = p == PRECISION_BF16 ? number_to_bf16(x[i]) : number_to_f16(x[i]);
            float wide = p == PRECISION_BF16 ? number_from_bf16(h[i]) : number_from_f16(h[i]);
            ck_assert_uint_eq(h[i], want);
            ck_assert_uint_eq(number_f32_bits(back[i]), number_f32_bits(wide));
        }
    }
}
END_TEST

START_TEST(test_names) {
    const char *names[] = {"fp32", "bf16", "fp16"};
    const size_t bytes[] = {4, 2, 2};
    for (int p = 0; p < PRECISION_COUNT; p++) {
        precision got;
        ck_assert_str_eq(precision_name((precision)p), names[p]);
        ck_assert_uint_eq(precision_bytes((precision)p), bytes[p]);
        ck_assert_int_eq(precision_parse(names[p], &got), 0);
        ck_assert_int_eq(got, p);
    }
    precision got;
    ck_assert_int_eq(precision_parse("fp8", &got), -1);
    ck_assert_int_eq(precision_parse(NULL, &got), -1);
}
END_TEST

/* ---- runner ---------------------------------------------------------------------- */

static Suite *matmul16_suite(void) {
    Suite *s = suite_create("matmul16");
    /* fp64 references at bench256's shapes: the arithmetic, checked in the plain build;
     * the AddressSanitizer pass leaves them out (CK_EXCLUDE_TAGS=fp64_references: half a
     * minute there), since the rows case runs the same code at every transpose, beta and
     * output type */
    TCase *products = tcase_create("products");
    tcase_set_tags(products, "fp64_references");
    tcase_set_timeout(products, 120);
    tcase_add_test(products, test_bf16_products);
    tcase_add_test(products, test_fp16_products);
    tcase_add_test(products, test_out16_products);
    suite_add_tcase(s, products);
    TCase *tc = tcase_create("matmul16");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_negative_control);
    tcase_add_test(tc, test_cached_and_named);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_fp16_rounding);
    tcase_add_test(tc, test_vectors_match_scalars);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    /* its own case, so that make test can run it again under OpenBLAS's other kernels */
    TCase *rows = tcase_create("rows");
    tcase_set_timeout(rows, 60);
    tcase_add_test(rows, test_rows_same_bits_in_any_split);
    tcase_add_test(rows, test_rows_probe_agrees);
    suite_add_tcase(s, rows);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);   /* one thread, as the program runs it */
    return check_run(matmul16_suite(), 0);
}
