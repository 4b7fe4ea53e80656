/* Tests of the fp32 matmul engine (matmul_engine.h) and oneDNN's fp32 products with
 * weights kept in its layout (matmul_f32.h).
 *
 * Products: oneDNN's and OpenBLAS's against an fp64 product of the same fp32 inputs.
 * A product a b of two fp32 values rounds once (or not at all inside an FMA), and the
 * sum of the n = K terms (plus C0 with beta 1) in any order rounds along a tree of
 * height at most n, so (Higham, 3.1 and 4.2; u = 2^-24)
 *     |C - ref| <= gamma(K + 1) (sum_k |a_ik b_kj| + |C0_ij|),  gamma(m) = m u / (1 - m u),
 * the fp64 reference's own error far below it. Each check prints its worst
 * |C - ref| / bound ("ratio", at most 1), and oneDNN's product against OpenBLAS's, which
 * differ by at most the two bounds together.
 *
 * Negative control: the fp64 reference of B rounded to bf16 (2^-9 relative per
 * element, what a product silently run in 16 bits would see) must be seen (ratio > 1).
 *
 * Weight layouts: a linear's forward through the oneDNN engine keeps its weight's
 * layout across micro-batches (no reorder after the first), re-makes it after an
 * optimizer step that changed one element only (no sampled element: the generation
 * alone must catch it), and a change without matmul_weights_changed() is seen stale
 * (the control: the freshness check fails on it).
 *
 * Rows: a call's rows get the same bits in any split of 16 rows or more. */
#include <check.h>
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "matmul_engine.h"
#include "matmul_f32.h"
#include "number_formats.h"
#include "ops.h"
#include "rng.h"

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    ck_assert_ptr_nonnull(p);
    return p;
}

static float *random_floats(size_t n, uint64_t seed) {
    float *x = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(2.0 * rng_uniform(seed, 0, i) - 1.0);
    return x;
}

/* One product: A stored [M,K] or [K,M] (ta), B [K,N] or [N,K] (tb), padded by pad. */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    float beta;
    float *a, *b, *c0;
} product;

static product product_make(int ta, int tb, int M, int N, int K, float beta, int pad,
                            uint64_t seed) {
    product q = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .beta = beta};
    q.lda = (ta ? M : K) + pad;
    q.ldb = (tb ? K : N) + pad;
    q.ldc = N + pad;
    q.a = random_floats((size_t)(ta ? K : M) * q.lda, 3 * seed);
    q.b = random_floats((size_t)(tb ? N : K) * q.ldb, 3 * seed + 1);
    q.c0 = random_floats((size_t)M * q.ldc, 3 * seed + 2);
    return q;
}

static void product_free(product *q) { free(q->a); free(q->b); free(q->c0); }

/* C = op(A) op(B) (+ C0) by the engine e into a fresh buffer (the caller frees it). */
static float *product_run(const product *q, matmul_engine e) {
    float *c = xcalloc((size_t)q->M * q->ldc, sizeof(float));
    memcpy(c, q->c0, (size_t)q->M * q->ldc * sizeof(float));
    if (e == MATMUL_ONEDNN)
        matmul_f32(q->ta, q->tb, q->M, q->N, q->K, q->a, q->lda, q->b, q->ldb, q->beta, c,
                   q->ldc, 1);
    else
        cblas_sgemm(CblasRowMajor, q->ta ? CblasTrans : CblasNoTrans,
                    q->tb ? CblasTrans : CblasNoTrans, q->M, q->N, q->K, 1.0f, q->a, q->lda,
                    q->b, q->ldb, q->beta, c, q->ldc);
    return c;
}

static double op_a(const product *q, int i, int k) {
    return q->a[q->ta ? (size_t)k * q->lda + i : (size_t)i * q->lda + k];
}

/* op(B)(k, j); bf16: rounded to bf16 first (the negative control's reference) */
static double op_b(const product *q, int k, int j, int bf16) {
    const float x = q->b[q->tb ? (size_t)j * q->ldb + k : (size_t)k * q->ldb + j];
    return bf16 ? number_from_bf16(number_to_bf16(x)) : x;
}

/* Worst |C - ref| / bound over C (ref: fp64, of B rounded to bf16 when bf16 is set). */
static double worst_ratio(const product *q, const float *c, int bf16) {
    const double m = q->K + 1.0, gamma = m * 0x1p-24 / (1.0 - m * 0x1p-24);
    double worst = 0.0;
    for (int i = 0; i < q->M; i++)
        for (int j = 0; j < q->N; j++) {
            const double c0 = q->beta != 0.0f ? q->c0[(size_t)i * q->ldc + j] : 0.0;
            double ref = c0, mag = fabs(c0);
            for (int k = 0; k < q->K; k++) {
                const double t = op_a(q, i, k) * op_b(q, k, j, bf16);
                ref += t;
                mag += fabs(t);
            }
            const double r = fabs(c[(size_t)i * q->ldc + j] - ref) / fmax(gamma * mag, 1e-300);
            if (!(r <= worst)) worst = r;   /* a NaN becomes the maximum */
        }
    return worst;
}

/* Worst |C1 - C2| / (2 bound) between two products of q. */
static double worst_between(const product *q, const float *c1, const float *c2) {
    const double m = q->K + 1.0, gamma = m * 0x1p-24 / (1.0 - m * 0x1p-24);
    double worst = 0.0;
    for (int i = 0; i < q->M; i++)
        for (int j = 0; j < q->N; j++) {
            double mag = q->beta != 0.0f ? fabs(q->c0[(size_t)i * q->ldc + j]) : 0.0;
            for (int k = 0; k < q->K; k++) mag += fabs(op_a(q, i, k) * op_b(q, k, j, 0));
            const size_t at = (size_t)i * q->ldc + j;
            const double r = fabs((double)c1[at] - c2[at]) / fmax(2.0 * gamma * mag, 1e-300);
            if (!(r <= worst)) worst = r;
        }
    return worst;
}

typedef struct { int M, N, K; } shape;
/* odd shapes and a strided one; then one of bench256's per-sequence rows (64 x 768 x 256) */
static const shape shapes[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 17}, {130, 70, 200},
                               {64, 768, 256}};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

START_TEST(test_products_against_fp64) {
    printf("  oneDNN fp32 (%s) and OpenBLAS against fp64, 4 transposes x beta 0/1:\n",
           matmul_f32_impl(0, 1, 64, 768, 256));
    for (int s = 0; s < N_SHAPES; s++) {
        const shape sh = shapes[s];
        const int pad = sh.M * sh.N < 10000 ? 3 : 0;
        double worst[3] = {0, 0, 0};   /* oneDNN, OpenBLAS, between them */
        for (int t = 0; t < 4; t++)
            for (int beta = 0; beta <= 1; beta++) {
                product q = product_make(t & 1, t >> 1, sh.M, sh.N, sh.K, (float)beta, pad,
                                         100 * s + 10 * t + beta);
                float *dnnl = product_run(&q, MATMUL_ONEDNN);
                float *blas = product_run(&q, MATMUL_OPENBLAS);
                const double r[3] = {worst_ratio(&q, dnnl, 0), worst_ratio(&q, blas, 0),
                                     worst_between(&q, dnnl, blas)};
                for (int k = 0; k < 3; k++) {
                    ck_assert_msg(r[k] <= 1.0, "%dx%dx%d ta %d tb %d beta %d: ratio %d = %g",
                                  sh.M, sh.N, sh.K, t & 1, t >> 1, beta, k, r[k]);
                    if (r[k] > worst[k]) worst[k] = r[k];
                }
                free(dnnl);
                free(blas);
                product_free(&q);
            }
        printf("    %4d x %4d x %4d  worst / bound: oneDNN %.4f, OpenBLAS %.4f,"
               " oneDNN - OpenBLAS %.4f (each <= 1)\n",
               sh.M, sh.N, sh.K, worst[0], worst[1], worst[2]);
    }
}
END_TEST

START_TEST(test_negative_control) {
    product q = product_make(0, 1, 33, 65, 200, 0.0f, 0, 7);
    float *dnnl = product_run(&q, MATMUL_ONEDNN);
    const double r = worst_ratio(&q, dnnl, 1);
    printf("  control: oneDNN's product against fp64 of B rounded to bf16: %.1f (> 1: seen)\n",
           r);
    ck_assert_msg(r > 1.0, "the control's bf16 inputs went unseen: ratio %g", r);
    free(dnnl);
    product_free(&q);
}
END_TEST

/* ---- weight layouts kept, and re-made --------------------------------------------- */

enum { LIN_IN = 96, LIN_OUT = 160, LIN_ROWS = 64, LIN_MICRO = 4 };

/* Largest |out - fp64(inp @ weight^T)| over a forward's rows, relative to the bound. */
static double forward_ratio(const float *out, const float *inp, const float *weight,
                            int rows) {
    product q = {.ta = 0, .tb = 1, .M = rows, .N = LIN_OUT, .K = LIN_IN, .lda = LIN_IN,
                 .ldb = LIN_IN, .ldc = LIN_OUT, .a = (float *)inp, .b = (float *)weight};
    return worst_ratio(&q, out, 0);
}

/* The forward of LIN_MICRO micro-batches (the engine's layout of weight reused by each):
 * the worst ratio over them. */
static double micro_batches(float *out, const float *inp, const float *weight) {
    double worst = 0.0;
    for (int m = 0; m < LIN_MICRO; m++) {
        const float *x = inp + (size_t)m * LIN_ROWS * LIN_IN;
        float *y = out + (size_t)m * LIN_ROWS * LIN_OUT;
        linear_forward(y, x, weight, NULL, LIN_ROWS, LIN_IN, LIN_OUT);
        const double r = forward_ratio(y, x, weight, LIN_ROWS);
        if (r > worst) worst = r;
    }
    return worst;
}

START_TEST(test_layout_kept_and_remade) {
    const matmul_engine was = matmul_engine_current();
    matmul_engine_set(MATMUL_ONEDNN);
    const size_t nw = (size_t)LIN_OUT * LIN_IN;
    float *weight = random_floats(nw, 41), *inp = random_floats((size_t)LIN_MICRO * LIN_ROWS * LIN_IN, 42);
    float *out = xcalloc((size_t)LIN_MICRO * LIN_ROWS * LIN_OUT, sizeof(float));
    float *grad = xcalloc(nw, sizeof(float)), *m = xcalloc(nw, sizeof(float));
    float *v = xcalloc(nw, sizeof(float));
    /* step 1: the first micro-batch makes the layout, the others reuse it */
    const unsigned long packs0 = matmul_f32_packs();
    const double r1 = micro_batches(out, inp, weight);
    const unsigned long packs1 = matmul_f32_packs();
    ck_assert_msg(r1 <= 1.0, "step 1's forward: ratio %g", r1);
    ck_assert_msg(packs1 - packs0 == 1, "%lu layouts made over %d micro-batches (1 expected)",
                  packs1 - packs0, LIN_MICRO);
    /* an optimizer step that moves element 1 alone (no decay; the other gradients 0):
     * none of the layout's sampled elements changes, only the generation says so */
    grad[1] = 1.0f;
    adamw_config cfg = {.lr = 0.25f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    const float before = weight[1];
    adamw_update(weight, grad, m, v, nw, &cfg, 1);
    ck_assert_msg(weight[1] != before, "the update moved nothing");
    const double r2 = micro_batches(out, inp, weight);
    const unsigned long packs2 = matmul_f32_packs();
    printf("  layouts: %lu made over %d micro-batches, %lu after the update; forward / bound"
           " %.4f before, %.4f after (<= 1)\n", packs1 - packs0, LIN_MICRO, packs2 - packs1,
           r1, r2);
    ck_assert_msg(r2 <= 1.0, "the forward after the update read a stale layout: ratio %g", r2);
    ck_assert_msg(packs2 - packs1 == 1, "%lu layouts made after the update (1 expected)",
                  packs2 - packs1);
    /* control: the same one-element change without the hook reads the stale layout, and
     * the check above would fail on it */
    weight[1] += 0.5f;
    linear_forward(out, inp, weight, NULL, LIN_ROWS, LIN_IN, LIN_OUT);
    const double stale = forward_ratio(out, inp, weight, LIN_ROWS);
    printf("  control: a weight changed without matmul_weights_changed(): %.1f (> 1: stale,"
           " seen)\n", stale);
    ck_assert_msg(stale > 1.0, "the stale layout went unseen: ratio %g", stale);
    matmul_weights_changed();
    linear_forward(out, inp, weight, NULL, LIN_ROWS, LIN_IN, LIN_OUT);
    ck_assert(forward_ratio(out, inp, weight, LIN_ROWS) <= 1.0);
    matmul_engine_set(was);
    free(weight); free(inp); free(out); free(grad); free(m); free(v);
}
END_TEST

/* Creating nothing once the shapes are known: a second step's micro-batches make no
 * primitive and, on unchanged weights, no layout; a weight at a new address makes one
 * layout and no primitive. */
START_TEST(test_no_creation_when_warm) {
    const matmul_engine was = matmul_engine_current();
    matmul_engine_set(MATMUL_ONEDNN);
    float *weight = random_floats((size_t)LIN_OUT * LIN_IN, 51);
    float *inp = random_floats((size_t)LIN_MICRO * LIN_ROWS * LIN_IN, 52);
    float *out = xcalloc((size_t)LIN_MICRO * LIN_ROWS * LIN_OUT, sizeof(float));
    float *dinp = xcalloc((size_t)LIN_ROWS * LIN_IN, sizeof(float));
    micro_batches(out, inp, weight);
    linear_backward(dinp, NULL, NULL, out, inp, weight, LIN_ROWS, LIN_IN, LIN_OUT);
    const unsigned long made = matmul_f32_creations(), packs = matmul_f32_packs();
    micro_batches(out, inp, weight);
    linear_backward(dinp, NULL, NULL, out, inp, weight, LIN_ROWS, LIN_IN, LIN_OUT);
    ck_assert_uint_eq(matmul_f32_creations(), made);
    ck_assert_uint_eq(matmul_f32_packs(), packs);
    /* the weight gathered into a fresh buffer (as ZeRO-3 does each micro-batch): its
     * layout is re-made in a stale one's place, creating nothing, and is right */
    float *gathered = random_floats((size_t)LIN_OUT * LIN_IN, 53);
    matmul_weights_changed();
    const double r = micro_batches(out, inp, gathered);
    ck_assert_msg(r <= 1.0, "the forward on the gathered weight: ratio %g", r);
    ck_assert_uint_eq(matmul_f32_creations(), made);
    ck_assert_uint_eq(matmul_f32_packs(), packs + 1);
    matmul_engine_set(was);
    free(weight); free(inp); free(out); free(dinp); free(gathered);
}
END_TEST

/* A rank's or a micro-batch's rows (16 or more, from a multiple of 16) get the bits the
 * whole batch's rows get, forward (the kept layout) and input gradient: what lets a
 * DDP rank or a 1F1B micro-batch match the baseline's products exactly. Calls of 8 rows
 * run another kernel here and may differ (printed, not held). */
static long rows_differing(int tb, int split) {
    const int M = 128, N = 96, K = 80, ldb = tb ? K : N;
    float *a = random_floats((size_t)M * K, 61), *b = random_floats((size_t)N * K, 62);
    float *whole = xcalloc((size_t)M * N, sizeof(float)), *parts = xcalloc((size_t)M * N, sizeof(float));
    matmul_f32(0, tb, M, N, K, a, K, b, ldb, 0.0f, whole, N, 1);
    for (int r0 = 0; r0 < M; r0 += split)
        matmul_f32(0, tb, split, N, K, a + (size_t)r0 * K, K, b, ldb, 0.0f,
                   parts + (size_t)r0 * N, N, 1);
    long differ = 0;
    for (size_t i = 0; i < (size_t)M * N; i++) differ += memcmp(&whole[i], &parts[i], 4) != 0;
    free(a); free(b); free(whole); free(parts);
    return differ;
}

START_TEST(test_rows_same_bits_in_any_split) {
    for (int tb = 0; tb <= 1; tb++) {
        const long at64 = rows_differing(tb, 64), at16 = rows_differing(tb, 16);
        printf("  %s: elements differing from one 128-row call: calls of 64 rows %ld, of 16"
               " %ld (0 each), of 8 %ld (another kernel)\n", tb ? "forward" : "input grad",
               at64, at16, rows_differing(tb, 8));
        ck_assert_int_eq(at64, 0);
        ck_assert_int_eq(at16, 0);
    }
}
END_TEST

START_TEST(test_names) {
    ck_assert_str_eq(matmul_engine_names[MATMUL_OPENBLAS], "openblas");
    ck_assert_str_eq(matmul_engine_names[MATMUL_ONEDNN], "onednn");
    ck_assert_ptr_null(matmul_engine_names[MATMUL_ENGINES]);
    ck_assert(strlen(matmul_engine_default_reason()) > 0);
}
END_TEST

static Suite *engine_suite(void) {
    Suite *s = suite_create("matmul_engine");
    TCase *tc = tcase_create("matmul_engine");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_products_against_fp64);
    tcase_add_test(tc, test_negative_control);
    tcase_add_test(tc, test_layout_kept_and_remade);
    tcase_add_test(tc, test_no_creation_when_warm);
    tcase_add_test(tc, test_rows_same_bits_in_any_split);
    tcase_add_test(tc, test_names);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);   /* one thread, as the programs run it */
    return check_run(engine_suite(), 0);
}
