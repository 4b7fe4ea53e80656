/* Tests of the ops in a run's precision (ops_mixed.h).
 *
 * What each op must compute is pinned exactly: in fp32 a mixed op is its ops.h twin,
 * bit for bit; in bf16 and fp16 every op but the linears is "widen the 16-bit inputs,
 * run the fp32 op, round the outputs", bit for bit, which this suite does by hand with
 * precision.h's conversions and ops.h's ops. Odd shapes (N = 7, C = 12, T = 5, NH = 3),
 * and sizes that cross the ops' chunks of rows and the attention's causal block.
 *
 * The 16-bit linears multiply through matmul16, so they are checked against an fp64
 * product of the same 16-bit inputs with test_matmul16.c's bound for the fp32 sum,
 *     |sum - ref| <= c eps32 (sum_k |a_ik b_kj| + |C0_ij|),  c = (K / 2) / (1 - K 2^-24),
 * plus one rounding of the output to 16 bits: at most half an ulp, u16 |value| with
 * u16 = 2^-8 (bf16: 8 significant bits) or 2^-11 (fp16: 11), and below fp16's normal
 * range half its subnormal spacing, 2^-25, in absolute terms. Each prints its
 * worst |error| / bound (at most 1). The negative controls must fail both checks: an
 * fp32 reference of the inputs before rounding differs from a 16-bit op, and a product
 * of the unrounded weights lies outside the bound. */
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
#include "ops.h"
#include "ops_mixed.h"
#include "precision.h"
#include "rng.h"

/* ---- helpers --------------------------------------------------------------------- */

static uint64_t rng_stream_seed, rng_next;

static void rng_seed(uint64_t seed) { rng_stream_seed = seed, rng_next = 0; }

static double urand(void) { return rng_uniform(rng_stream_seed, 0, rng_next++); }

/* Every buffer of a check, freed together at its end. */
#define MAX_HELD 64
static void *held[MAX_HELD];
static int n_held;

static void *xcalloc(size_t n, size_t size) {
    ck_assert_int_lt(n_held, MAX_HELD);
    void *p = calloc(n ? n : 1, size);
    ck_assert_ptr_nonnull(p);
    return held[n_held++] = p;
}

static void free_held(void) {
    while (n_held > 0) free(held[--n_held]);
}

static float *random_f32(size_t n, double lo, double hi) {
    float *x = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
    return x;
}

/* x (fp32) in precision p: rounded, or copied for fp32. */
static void *narrow(precision p, const float *x, size_t n) {
    void *y = xcalloc(n, precision_bytes(p));
    if (p == PRECISION_FP32) memcpy(y, x, n * sizeof(float));
    else precision_to16(p, y, x, n);
    return y;
}

/* x (of p) in fp32: widened, or copied for fp32. */
static float *wide(precision p, const void *x, size_t n) {
    float *y = xcalloc(n, sizeof(float));
    if (p == PRECISION_FP32) memcpy(y, x, n * sizeof(float));
    else precision_from16(p, y, x, n);
    return y;
}

/* n random values of p, drawn in [lo, hi) and rounded to p */
static void *random_p(precision p, size_t n, double lo, double hi) {
    return narrow(p, random_f32(n, lo, hi), n);
}

static float *copy_f32(const float *x, size_t n) {
    return memcpy(xcalloc(n, sizeof(float)), x, n * sizeof(float));
}

/* The first element where got and want differ in their bits, or -1. */
static long first_difference(precision p, const void *got, const void *want, size_t n) {
    const size_t b = precision_bytes(p);
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * b, (const char *)want + i * b, b) != 0)
            return (long)i;
    return -1;
}

static void same_bits(const char *what, precision p, const void *got, const void *want,
                      size_t n) {
    long i = first_difference(p, got, want, n);
    ck_assert_msg(i < 0, "%s (%s): element %ld differs from the reference", what,
                  precision_name(p), i);
}

static void same_f32(const char *what, const float *got, const float *want, size_t n) {
    long i = first_difference(PRECISION_FP32, got, want, n);
    ck_assert_msg(i < 0, "%s: fp32 element %ld is %a, the reference %a", what, i,
                  i < 0 ? 0.0 : (double)got[i], i < 0 ? 0.0 : (double)want[i]);
}

/* Runs check(p) in every precision, one line each. */
static void in_every_precision(const char *what, void (*check)(precision p)) {
    for (int p = 0; p < PRECISION_COUNT; p++) {
        rng_seed(100 + (uint64_t)p);
        check((precision)p);
        free_held();
        printf("  %-22s %s: the reference's bits\n", what, precision_name((precision)p));
    }
    fflush(stdout);
}

/* ---- embeddings ------------------------------------------------------------------ */

static void check_embedding(precision p) {
    enum { N = 7, C = 12, START = 3, LEN = 9 };   /* a vocabulary slice: some tokens out */
    int tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = (int)(urand() * 15) % 15;
    tokens[N - 1] = tokens[0];   /* a repeated token */
    void *wte = random_p(p, LEN * C, -1, 1), *out = random_p(p, N * C, 1, 2);
    mixed_embedding_forward(p, out, tokens, wte, N, C, START, LEN);
    float *out32 = xcalloc(N * C, sizeof(float));
    embedding_forward(out32, tokens, wide(p, wte, LEN * C), N, C, START, LEN);
    same_bits("embedding_forward", p, out, narrow(p, out32, N * C), N * C);

    void *dout = random_p(p, N * C, -1, 1);
    float *dwte = random_f32(LEN * C, -1, 1), *dwte_ref = copy_f32(dwte, LEN * C);
    mixed_embedding_backward(p, dwte, dout, tokens, N, C, START, LEN);
    embedding_backward(dwte_ref, wide(p, dout, N * C), tokens, N, C, START, LEN);
    same_f32("embedding_backward", dwte, dwte_ref, LEN * C);
}

static void check_position(precision p) {
    enum { B = 3, T = 5, C = 12, n = B * T * C };
    void *out = random_p(p, n, -1, 1), *wpe = random_p(p, T * C, -1, 1);
    float *out32 = wide(p, out, n);
    mixed_position_forward(p, out, wpe, B, T, C);
    position_forward(out32, wide(p, wpe, T * C), B, T, C);
    same_bits("position_forward", p, out, narrow(p, out32, n), n);

    void *dout = random_p(p, n, -1, 1);
    float *dwpe = random_f32(T * C, -1, 1), *dwpe_ref = copy_f32(dwpe, T * C);
    mixed_position_backward(p, dwpe, dout, B, T, C);
    position_backward(dwpe_ref, wide(p, dout, n), B, T, C);
    same_f32("position_backward", dwpe, dwpe_ref, T * C);
}

START_TEST(test_embeddings) {
    in_every_precision("embedding", check_embedding);
    in_every_precision("position", check_position);
}
END_TEST

/* ---- layer norm ------------------------------------------------------------------ */

/* N rows of C: C > 1024 takes the fp32 op's unfused backward, and with N = 40 the
 * forward's chunks of rows (16384 / C of them) end in a partial one; N = 700 of C = 64
 * is three chunks (256, 256, 188 rows) of the backward, its sums carried across them. */
static void check_layernorm_shape(precision p, int N, int C) {
    const size_t n = (size_t)N * C;
    void *inp = random_p(p, n, -2, 2), *weight = random_p(p, C, 0.5, 1.5);
    void *bias = random_p(p, C, -0.5, 0.5), *out = xcalloc(n, precision_bytes(p));
    float *mean = xcalloc(N, sizeof(float)), *rstd = xcalloc(N, sizeof(float));
    float *inp32 = wide(p, inp, n), *w32 = wide(p, weight, C), *out32 = xcalloc(n, 4);
    float *mean32 = xcalloc(N, sizeof(float)), *rstd32 = xcalloc(N, sizeof(float));
    mixed_layernorm_forward(p, out, mean, rstd, inp, weight, bias, N, C);
    layernorm_forward(out32, mean32, rstd32, inp32, w32, wide(p, bias, C), N, C);
    same_bits("layernorm_forward", p, out, narrow(p, out32, n), n);
    same_f32("layernorm_forward mean", mean, mean32, N);
    same_f32("layernorm_forward rstd", rstd, rstd32, N);

    void *dout = random_p(p, n, -1, 1), *dinp = random_p(p, n, -1, 1);
    float *dinp32 = wide(p, dinp, n);
    float *dw = random_f32(C, -1, 1), *db = random_f32(C, -1, 1);
    float *dw_ref = copy_f32(dw, C), *db_ref = copy_f32(db, C), *dout32 = wide(p, dout, n);
    mixed_layernorm_backward(p, dinp, dw, db, dout, inp, weight, mean, rstd, N, C);
    layernorm_backward(dinp32, dw_ref, db_ref, dout32, inp32, w32, mean, rstd, N, C);
    same_bits("layernorm_backward dinp", p, dinp, narrow(p, dinp32, n), n);
    same_f32("layernorm_backward dweight", dw, dw_ref, C);
    same_f32("layernorm_backward dbias", db, db_ref, C);
}

static void check_layernorm(precision p) {
    const int shapes[][2] = {{7, 12}, {40, 1100}, {700, 64}};
    for (int i = 0; i < 3; i++) {
        check_layernorm_shape(p, shapes[i][0], shapes[i][1]);
        free_held();   /* each shape's buffers */
    }
}

START_TEST(test_layernorm) { in_every_precision("layernorm", check_layernorm); }
END_TEST

/* ---- attention ------------------------------------------------------------------- */

static void check_attention_shape(precision p, int B, int T, int C, int NH) {
    const size_t n_qkv = (size_t)B * T * 3 * C, n = (size_t)B * T * C;
    const size_t n_att = (size_t)B * NH * T * T;
    void *qkv = random_p(p, n_qkv, -1.5, 1.5), *out = xcalloc(n, precision_bytes(p));
    void *att = xcalloc(n_att, precision_bytes(p));
    float *qkv32 = wide(p, qkv, n_qkv), *out32 = xcalloc(n, 4), *att32 = xcalloc(n_att, 4);
    mixed_attention_forward(p, out, att, qkv, B, T, C, NH);
    attention_forward(out32, att32, qkv32, B, T, C, NH);
    same_bits("attention_forward out", p, out, narrow(p, out32, n), n);
    same_bits("attention_forward att", p, att, narrow(p, att32, n_att), n_att);

    void *dout = random_p(p, n, -1, 1), *dqkv = xcalloc(n_qkv, precision_bytes(p));
    void *datt = xcalloc(n_att, precision_bytes(p));
    float *dqkv32 = xcalloc(n_qkv, 4), *datt32 = xcalloc(n_att, 4);
    mixed_attention_backward(p, dqkv, datt, dout, qkv, att, B, T, C, NH);
    /* the reference reads the 16-bit probabilities the forward stored, widened */
    attention_backward(dqkv32, datt32, wide(p, dout, n), qkv32, wide(p, att, n_att), B, T,
                       C, NH);
    same_bits("attention_backward", p, dqkv, narrow(p, dqkv32, n_qkv), n_qkv);
}

static void check_attention(precision p) {
    check_attention_shape(p, 2, 5, 12, 3);
    check_attention_shape(p, 2, 37, 12, 3);   /* past one causal block of 32 rows */
}

START_TEST(test_attention) { in_every_precision("attention", check_attention); }
END_TEST

/* ---- GELU, cross-entropy, vectors -------------------------------------------------- */

static void check_gelu_size(precision p, size_t n) {
    void *x = random_p(p, n, -5, 5), *out = xcalloc(n, precision_bytes(p));
    float *x32 = wide(p, x, n), *out32 = xcalloc(n, sizeof(float));
    mixed_gelu_forward(p, out, x, n);
    gelu_forward(out32, x32, n);
    same_bits("gelu_forward out", p, out, narrow(p, out32, n), n);
    same_bits("gelu_forward gelu'", p, x, narrow(p, x32, n), n);

    void *dout = random_p(p, n, -1, 1), *dinp = xcalloc(n, precision_bytes(p));
    float *dinp32 = xcalloc(n, sizeof(float)), *dout32 = wide(p, dout, n);
    mixed_gelu_backward(p, dinp, x, dout, n);
    gelu_backward(dinp32, wide(p, x, n), dout32, n);
    void *want = narrow(p, dinp32, n);
    same_bits("gelu_backward", p, dinp, want, n);
    mixed_gelu_backward(p, dout, x, dout, n);   /* in place */
    same_bits("gelu_backward in place", p, dout, want, n);
}

static void check_gelu(precision p) {
    check_gelu_size(p, 1003);
    check_gelu_size(p, 40000);   /* past the 16384-element chunks */
}

static void check_crossentropy_shape(precision p, int N, int V) {
    const size_t n = (size_t)N * V;
    int *targets = xcalloc(N, sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = (int)(urand() * V) % V;
    void *logits = random_p(p, n, -4, 4), *probs = xcalloc(n, precision_bytes(p));
    float *losses = xcalloc(N, 4), *losses32 = xcalloc(N, 4), *probs32 = xcalloc(n, 4);
    mixed_crossentropy_forward(p, losses, probs, logits, targets, N, V);
    crossentropy_forward(losses32, probs32, wide(p, logits, n), targets, N, V);
    void *want = narrow(p, probs32, n);
    same_bits("crossentropy_forward probs", p, probs, want, n);
    same_f32("crossentropy_forward losses", losses, losses32, N);
    mixed_crossentropy_forward(p, losses, logits, logits, targets, N, V);   /* in place */
    same_bits("crossentropy_forward in place", p, logits, want, n);

    void *dlogits = xcalloc(n, precision_bytes(p));
    float *dlogits32 = xcalloc(n, sizeof(float));
    mixed_crossentropy_backward(p, dlogits, probs, targets, 1.0f / N, N, V);
    crossentropy_backward(dlogits32, wide(p, probs, n), targets, 1.0f / N, N, V);
    want = narrow(p, dlogits32, n);
    same_bits("crossentropy_backward", p, dlogits, want, n);
    mixed_crossentropy_backward(p, probs, probs, targets, 1.0f / N, N, V);   /* in place */
    same_bits("crossentropy_backward in place", p, probs, want, n);
}

static void check_crossentropy(precision p) {
    check_crossentropy_shape(p, 7, 37);
    check_crossentropy_shape(p, 3, 20000);   /* rows wider than a chunk: one at a time */
}

static void check_vectors(precision p) {
    enum { n = 40000 + 13 };   /* chunks, and a tail */
    void *x = random_p(p, n, -1, 1), *y = random_p(p, n, -1, 1), *z = xcalloc(n, 4);
    float *y32 = wide(p, y, n);
    mixed_vec_add(p, y, x, n);
    vec_add(y32, wide(p, x, n), n);
    same_bits("vec_add", p, y, narrow(p, y32, n), n);
    mixed_vec_copy(p, z, x, n);
    same_bits("vec_copy", p, z, x, n);
    mixed_vec_zero(p, z, n);
    for (size_t i = 0; i < n * precision_bytes(p); i++) ck_assert(((char *)z)[i] == 0);
    float *f = random_f32(n, -3, 3), *back = xcalloc(n, sizeof(float));
    void *r = xcalloc(n, precision_bytes(p));
    mixed_round(p, r, f, n);
    same_bits("mixed_round", p, r, narrow(p, f, n), n);
    mixed_widen(p, back, r, n);
    same_f32("mixed_widen", back, wide(p, r, n), n);
    ck_assert_ptr_eq(precision_at(p, x, 5), (char *)x + 5 * precision_bytes(p));
}

START_TEST(test_elementwise) {
    in_every_precision("gelu", check_gelu);
    in_every_precision("crossentropy", check_crossentropy);
    in_every_precision("vectors", check_vectors);
}
END_TEST

/* ---- linear ---------------------------------------------------------------------- */

/* Worst |got - ref| / bound over got[M,N], ref = C0 + A[M,K] B[K,N] in fp64 (C0 may be
 * NULL), the bound as at the top of this file; u16 = 0 for an fp32 output. */
static double product_ratio(const float *got, const double *A, const double *B,
                            const double *C0, int M, int N, int K, double u16,
                            double tiny) {
    const double c = (K / 2.0) / (1.0 - K * 0x1p-24), eps32 = FLT_EPSILON;
    double worst = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = C0 ? C0[(size_t)i * N + j] : 0.0, mag = fabs(ref);
            for (int k = 0; k < K; k++) {
                double t = A[(size_t)i * K + k] * B[(size_t)k * N + j];
                ref += t;
                mag += fabs(t);
            }
            double sum_bound = c * eps32 * mag;
            double bound = sum_bound * (1.0 + u16) + u16 * fabs(ref) + tiny;
            double r = fabs(got[(size_t)i * N + j] - ref) / fmax(bound, DBL_MIN);
            if (!(r <= worst)) worst = r;   /* a NaN becomes the maximum */
        }
    return worst;
}

/* x[rows,cols] (fp32) in double, transposed when asked ([cols,rows]). */
static double *as_double(const float *x, int rows, int cols, int transpose) {
    double *d = xcalloc((size_t)rows * cols, sizeof(double));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            d[transpose ? (size_t)c * rows + r : (size_t)r * cols + c] =
                x[(size_t)r * cols + c];
    return d;
}

static double output_rounding(precision p) {
    return p == PRECISION_BF16 ? 0x1p-8 : 0x1p-11;
}
static double output_tiny(precision p) { return p == PRECISION_FP16 ? 0x1p-25 : 0.0; }

/* The forward, with and without a bias: the worst ratio. With the weights' fp32 values
 * before rounding in the reference (negative = 1), the ratio must exceed 1 instead. */
static double check_linear_forward(precision p, int N, int IC, int OC, int negative) {
    float *w_f32 = random_f32((size_t)OC * IC, -1, 1);
    void *inp = random_p(p, (size_t)N * IC, -1, 1);
    void *weight = narrow(p, w_f32, (size_t)OC * IC);
    void *bias = random_p(p, OC, -1, 1), *out = xcalloc((size_t)N * OC, precision_bytes(p));
    double *A = as_double(wide(p, inp, (size_t)N * IC), N, IC, 0);
    double *B = as_double(negative ? w_f32 : wide(p, weight, (size_t)OC * IC), OC, IC, 1);
    double *C0 = xcalloc((size_t)N * OC, sizeof(double));
    float *bias32 = wide(p, bias, OC);
    for (size_t i = 0; i < (size_t)N * OC; i++) C0[i] = bias32[i % OC];
    double worst = 0.0;
    for (int with_bias = 0; with_bias <= 1; with_bias++) {
        mixed_linear_forward(p, out, inp, weight, with_bias ? bias : NULL, N, IC, OC);
        double r = product_ratio(wide(p, out, (size_t)N * OC), A, B, with_bias ? C0 : NULL,
                                 N, OC, IC, output_rounding(p), output_tiny(p));
        worst = fmax(worst, r);
    }
    return worst;
}

/* The backward: dinp and dweight (on top of a non-zero start) within their bounds, the
 * worse ratio returned; dbias is the fp32 op's column sums of dout widened, exactly. */
static double check_linear_backward(precision p, int N, int IC, int OC) {
    const size_t n_in = (size_t)N * IC, n_out = (size_t)N * OC, n_w = (size_t)OC * IC;
    void *inp = random_p(p, n_in, -1, 1), *weight = random_p(p, n_w, -1, 1);
    void *dout = random_p(p, n_out, -1, 1), *dinp = xcalloc(n_in, precision_bytes(p));
    float *dw = random_f32(n_w, -1, 1), *db = random_f32(OC, -1, 1);
    double *dw0 = as_double(dw, OC, IC, 0);
    float *db_ref = copy_f32(db, OC), *dout32 = wide(p, dout, n_out);
    mixed_linear_backward(p, dinp, dw, db, dout, inp, weight, N, IC, OC);
    linear_backward(NULL, NULL, db_ref, dout32, NULL, NULL, N, IC, OC);
    same_f32("linear_backward dbias", db, db_ref, OC);
    double r_dinp = product_ratio(wide(p, dinp, n_in), as_double(dout32, N, OC, 0),
                                  as_double(wide(p, weight, n_w), OC, IC, 0), NULL, N, IC,
                                  OC, output_rounding(p), output_tiny(p));
    double r_dw = product_ratio(dw, as_double(dout32, N, OC, 1),
                                as_double(wide(p, inp, n_in), N, IC, 0), dw0, OC, IC, N,
                                0.0, 0.0);
    return fmax(r_dinp, r_dw);
}

/* fp32: the ops.h linears, bit for bit (every pointer of the backward given). */
static void check_linear_fp32(int N, int IC, int OC) {
    const precision p = PRECISION_FP32;
    const size_t n_in = (size_t)N * IC, n_out = (size_t)N * OC, n_w = (size_t)OC * IC;
    float *inp = random_f32(n_in, -1, 1), *w = random_f32(n_w, -1, 1);
    float *bias = random_f32(OC, -1, 1), *out = xcalloc(n_out, 4);
    float *out_ref = xcalloc(n_out, 4);
    mixed_linear_forward(p, out, inp, w, bias, N, IC, OC);
    linear_forward(out_ref, inp, w, bias, N, IC, OC);
    same_f32("linear_forward", out, out_ref, n_out);
    float *dout = random_f32(n_out, -1, 1), *dinp = xcalloc(n_in, 4);
    float *dinp_ref = xcalloc(n_in, 4);
    float *dw = random_f32(n_w, -1, 1), *db = random_f32(OC, -1, 1);
    float *dw_ref = copy_f32(dw, n_w), *db_ref = copy_f32(db, OC);
    mixed_linear_backward(p, dinp, dw, db, dout, inp, w, N, IC, OC);
    linear_backward(dinp_ref, dw_ref, db_ref, dout, inp, w, N, IC, OC);
    same_f32("linear_backward dinp", dinp, dinp_ref, n_in);
    same_f32("linear_backward dweight", dw, dw_ref, n_w);
    same_f32("linear_backward dbias", db, db_ref, OC);
}

typedef struct { int N, IC, OC; } linear_shape;
static const linear_shape linear_shapes[] = {{7, 12, 9}, {33, 65, 17}, {128, 256, 384}};
#define N_LINEAR_SHAPES (int)(sizeof linear_shapes / sizeof linear_shapes[0])

START_TEST(test_linear) {
    for (int s = 0; s < N_LINEAR_SHAPES; s++) {
        const linear_shape sh = linear_shapes[s];
        rng_seed(300 + (uint64_t)s);
        check_linear_fp32(sh.N, sh.IC, sh.OC);
        free_held();
        for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
            double fwd = check_linear_forward((precision)p, sh.N, sh.IC, sh.OC, 0);
            double bwd = check_linear_backward((precision)p, sh.N, sh.IC, sh.OC);
            free_held();
            printf("  linear %3d x %3d -> %3d %s: worst |error| / bound forward %.4f, "
                   "backward %.4f (<= 1); fp32 bit for bit\n", sh.N, sh.IC, sh.OC,
                   precision_name((precision)p), fwd, bwd);
            ck_assert_msg(fwd <= 1.0 && bwd <= 1.0, "%s linear: ratio %g / %g above 1",
                          precision_name((precision)p), fwd, bwd);
        }
    }
    fflush(stdout);
}
END_TEST

/* Both checks can fail: the unrounded weights' product lies outside the linear's bound,
 * and an fp32 reference of the inputs before rounding differs from the 16-bit op. */
START_TEST(test_negative_controls) {
    rng_seed(7);
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        double r = check_linear_forward((precision)p, 33, 65, 17, 1);
        enum { n = 1003 };
        float *x32 = random_f32(n, -5, 5), *out32 = xcalloc(n, sizeof(float));
        void *x = narrow((precision)p, x32, n), *out = xcalloc(n, 2);
        mixed_gelu_forward((precision)p, out, x, n);
        gelu_forward(out32, x32, n);   /* x32: the values before rounding */
        long at = first_difference((precision)p, out, narrow((precision)p, out32, n), n);
        printf("  negative controls %s: linear vs unrounded weights ratio %.1f (must be "
               "> 1); gelu vs unrounded inputs first differs at %ld (must be >= 0)\n",
               precision_name((precision)p), r, at);
        ck_assert_msg(r > 1.0, "the linear bound does not see the weights' rounding");
        ck_assert_msg(at >= 0, "the bit comparison does not see the inputs' rounding");
        free_held();
    }
}
END_TEST

/* ---- scratch, watchers, threads --------------------------------------------------- */

enum { SN = 48, SIC = 32, SOC = 96, ST = 12, SNH = 2 };   /* a small block's shapes */

/* One step of a small block's ops in precision p on buffers of at least SN x SOC. */
static void block_step(precision p, void *a, void *b, void *c, float *grad, float *stats) {
    static const int targets[SN];   /* zeros: one class */
    mixed_layernorm_forward(p, b, stats, stats + SN, a, c, c, SN, SIC);
    mixed_linear_forward(p, c, b, a, a, SN, SIC, SOC);
    mixed_attention_forward(p, b, a, c, SN / ST, ST, SIC, SNH);
    mixed_gelu_forward(p, b, c, (size_t)SN * SOC);
    mixed_linear_backward(p, b, grad, grad, c, a, a, SN, SIC, SOC);
    mixed_layernorm_backward(p, a, grad, grad, b, c, c, stats, stats + SN, SN, SIC);
    mixed_crossentropy_forward(p, stats, b, c, targets, SN, 1);
}

/* After a first step, repeated steps create no matmul primitive and grow no scratch;
 * ops_mixed_release_thread gives both back. */
START_TEST(test_scratch_steady) {
    const size_t big = (size_t)SN * SOC * 4;
    for (int p = PRECISION_BF16; p <= PRECISION_FP16; p++) {
        rng_seed(11);
        const precision q = (precision)p;
        void *a = random_p(q, big, -1, 1), *b = random_p(q, big, -1, 1);
        void *c = random_p(q, big, -1, 1);
        float *grad = xcalloc(big, sizeof(float)), *stats = xcalloc(2 * SN, sizeof(float));
        block_step(q, a, b, c, grad, stats);
        const unsigned long made = matmul16_creations();
        const size_t bytes = ops_mixed_scratch_bytes();
        for (int i = 0; i < 5; i++) block_step(q, a, b, c, grad, stats);
        printf("  %s: %lu products set up so far, %zu bytes of scratch after one step; the "
               "same after five more\n", precision_name(q), made, bytes);
        ck_assert(bytes > 0);
        ck_assert_uint_eq(matmul16_creations(), made);
        ck_assert_uint_eq(ops_mixed_scratch_bytes(), bytes);
        free_held();
    }
    ops_mixed_release_thread();
    ck_assert_uint_eq(ops_mixed_scratch_bytes(), 0);
    ck_assert_uint_eq(matmul16_creations(), 0);
}
END_TEST

/* A profiler's view: how many ops of each kind, their bytes, and the products. */
typedef struct {
    int calls[OP_KINDS], gemms;
    double bytes[OP_KINDS];
} seen_ops;
static void seen_begin(void *ctx, op_kind kind) { ((seen_ops *)ctx)->calls[kind]++; }
static void seen_end(void *ctx, op_kind kind) { (void)ctx, (void)kind; }
static void seen_traffic(void *ctx, op_kind kind, double bytes) {
    ((seen_ops *)ctx)->bytes[kind] += bytes;
}
static void seen_gemm(void *ctx, int ta, int tb, int M, int N, int K) {
    (void)ta, (void)tb, (void)M, (void)N, (void)K;
    ((seen_ops *)ctx)->gemms++;
}

/* Each mixed op is one op of its kind to a watcher, whatever it runs inside. */
START_TEST(test_one_op_each) {
    enum { N = 7, IC = 12, OC = 9 };
    for (int p = 0; p < PRECISION_COUNT; p++) {
        rng_seed(13);
        seen_ops seen = {0};
        const ops_observer watcher = {seen_begin, seen_end, &seen, seen_traffic, seen_gemm,
                                      NULL};
        const size_t e = precision_bytes((precision)p);
        void *x = random_p((precision)p, N * IC, -1, 1), *y = xcalloc(N * OC, e);
        void *w = random_p((precision)p, OC * IC, -1, 1), *dx = xcalloc(N * IC, e);
        float *dw = xcalloc(OC * IC, sizeof(float)), *db = xcalloc(OC, sizeof(float));
        ops_profile(&watcher);
        mixed_linear_forward((precision)p, y, x, w, NULL, N, IC, OC);
        mixed_linear_backward((precision)p, dx, dw, db, y, x, w, N, IC, OC);
        mixed_vec_add((precision)p, dx, x, N * IC);
        ops_profile(NULL);
        ck_assert_int_eq(seen.calls[OP_LINEAR_FORWARD], 1);
        ck_assert_int_eq(seen.calls[OP_LINEAR_BACKWARD], 1);
        ck_assert_int_eq(seen.calls[OP_RESIDUAL], 1);
        ck_assert_int_eq(seen.gemms, 3);   /* forward; dinp and dweight */
        ck_assert(seen.bytes[OP_LINEAR_FORWARD] == (double)e * (N * IC + N * OC + OC * IC));
        free_held();
    }
}
END_TEST

/* A thread's result is the main thread's, and the thread ends without giving its
 * scratch back: the key's destructor does (LeakSanitizer would see it otherwise). */
static void *forward_in_thread(void *arg) {
    void **io = arg;
    mixed_linear_forward(PRECISION_BF16, io[0], io[1], io[2], io[3], SN, SIC, SOC);
    mixed_gelu_forward(PRECISION_BF16, io[4], io[0], (size_t)SN * SOC);
    return NULL;
}

START_TEST(test_threads) {
    const precision p = PRECISION_BF16;
    rng_seed(17);
    void *x = random_p(p, SN * SIC, -1, 1), *w = random_p(p, SOC * SIC, -1, 1);
    void *bias = random_p(p, SOC, -1, 1);
    void *io[2][5] = {{xcalloc(SN * SOC, 2), x, w, bias, xcalloc(SN * SOC, 2)},
                      {xcalloc(SN * SOC, 2), x, w, bias, xcalloc(SN * SOC, 2)}};
    forward_in_thread(io[0]);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, forward_in_thread, io[1]), 0);
    pthread_join(th, NULL);
    same_bits("thread's linear + gelu", p, io[1][4], io[0][4], SN * SOC);
    same_bits("thread's gelu'", p, io[1][0], io[0][0], SN * SOC);
    free_held();
    ops_mixed_release_thread();
}
END_TEST

/* ---- runner ---------------------------------------------------------------------- */

static Suite *ops_mixed_suite(void) {
    Suite *s = suite_create("ops_mixed");
    TCase *tc = tcase_create("ops_mixed");
    tcase_set_timeout(tc, 120);   /* fp64 references; sanitizer builds */
    tcase_add_test(tc, test_embeddings);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_elementwise);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_negative_controls);
    tcase_add_test(tc, test_scratch_steady);
    tcase_add_test(tc, test_one_op_each);
    tcase_add_test(tc, test_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);   /* one thread, as the program runs it */
    int status = check_run(ops_mixed_suite(), 0);
    ops_mixed_release_thread();
    return status;
}
