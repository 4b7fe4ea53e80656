/* The CPU's elementwise transcendentals against double precision, in ulps: GELU and
 * its derivative (cpu_gelu_forward), the cross-entropy's softmax and the attention's
 * (cpu_crossentropy_forward, cpu_attention_forward). Each runs on 2^20 points spread
 * over its useful range and on the extremes, prints the largest error it saw, and fails
 * above ULP_BOUND. Each has a negative control that the bound rejects.
 *
 * An error is |got - want| / ulp(want), want the double reference (libm's exp) and
 * ulp(want) the spacing of floats at want: 2^-149 below FLT_MIN, so a probability or a
 * GELU that underflows is held to the subnormal it should round to. NaN must stay NaN,
 * and a masked (-FLT_MAX) softmax entry must give exactly 0. */
#include <check.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "exp_float.h"
#include "ops_cpu.h"

#define ULP_BOUND 4.0

/* ---- helpers --------------------------------------------------------------------- */

static uint64_t rng_state;

static void rng_seed(uint64_t seed) { rng_state = seed * 0x9e3779b97f4a7c15ull + 1; }

/* xorshift64*: uniform in [0, 1) */
static double urand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static float *falloc(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* The spacing of floats at |w|: 2^(e - 23) for a normal float of exponent e, 2^-149
 * below FLT_MIN. */
static double ulp_at(double w) {
    w = fabs(w);
    if (w < FLT_MIN) return ldexp(1.0, -149);
    int e;
    frexp(w, &e);   /* w = m 2^e, m in [0.5, 1) */
    return ldexp(1.0, e - 1 - 23);
}

/* |got - want| in ulps of want; infinite where one is NaN and the other is not. */
static double ulp_error(float got, double want) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got) ? 0.0 : INFINITY;
    if ((double)got == want) return 0.0;   /* infinities included */
    return fabs((double)got - want) / ulp_at(want);
}

/* The largest error and where it was. */
typedef struct {
    double ulps, at;
} worst;

static void note(worst *w, float got, double want, double at) {
    double e = ulp_error(got, want);
    if (!(e <= w->ulps)) {   /* a NaN counts */
        w->ulps = e;
        w->at = at;
    }
}

static void report(const char *what, worst w) {
    printf("%-52s max %.2f ulp (at %.7g; bound %.0f)\n", what, w.ulps, w.at, ULP_BOUND);
    fflush(stdout);
    ck_assert_msg(w.ulps <= ULP_BOUND, "%s: %g ulp at %g, above %g", what, w.ulps, w.at,
                  ULP_BOUND);
}

/* ---- the float exponential ------------------------------------------------------- */

/* e^(a - b) against libm's exp in double, on 2^20 pairs: a - b from 0 down to -110 (its
 * subnormal results and the zeros below them included), neither a nor b exact in the
 * other's ulps. */
START_TEST(exp_f_within_bound) {
    rng_seed(42);
    worst w = {0};
    for (int i = 0; i < 1 << 20; i++) {
        float b = (float)(200.0 * (urand() - 0.5)), a = (float)(b - 110.0 * urand());
        note(&w, exp_f_diff(a, b, EXP_F_LO, EXP_F_HI), exp((double)a - b), (double)a - b);
    }
    note(&w, exp_f_diff(3.0f, 3.0f, EXP_F_LO, EXP_F_HI), 1.0, 0.0);
    note(&w, exp_f_diff(-INFINITY, 3.0f, EXP_F_LO, EXP_F_HI), 0.0, -INFINITY);
    note(&w, exp_f_diff(NAN, 3.0f, EXP_F_LO, EXP_F_HI), NAN, NAN);
    report("exp_f_diff (2^20 points, a - b in [-110, 0])", w);
    /* a masked entry gives exactly 0, whatever the maximum (a negative one makes the
     * difference's low part positive) */
    const float maxima[] = {-3.0f, -0.75f, -1e-3f, 0.0f, 2.0f, 1e30f, FLT_MAX};
    for (size_t i = 0; i < sizeof maxima / sizeof maxima[0]; i++) {
        float e = exp_f_diff(-FLT_MAX, maxima[i], EXP_F_LO, EXP_F_HI);
        ck_assert_msg(e == 0.0f, "e^(-FLT_MAX - %g) = %g", maxima[i], e);
    }
}
END_TEST

/* ---- softmax --------------------------------------------------------------------- */

/* probs = softmax(x) in double, from the float logits. */
static void softmax_ref(double *p, const float *x, int V) {
    double mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = fmax(mx, x[j]);
    double sum = 0.0;
    for (int j = 0; j < V; j++) sum += p[j] = exp((double)x[j] - mx);
    for (int j = 0; j < V; j++) p[j] /= sum;
}

typedef void (*softmax_fn)(float *probs, const float *logits, int N, int V);

/* The cross-entropy's softmax, its losses dropped. */
static void crossentropy_probs(float *probs, const float *logits, int N, int V) {
    int *targets = calloc((size_t)N, sizeof(int));
    float *losses = falloc((size_t)N);
    cpu_crossentropy_forward(losses, probs, logits, targets, N, V);
    free(targets); free(losses);
}

/* Largest error of f's probabilities on N rows of V logits. */
static worst softmax_error(softmax_fn f, const float *logits, int N, int V) {
    float *probs = falloc((size_t)N * V);
    double *ref = malloc((size_t)V * sizeof(double));
    f(probs, logits, N, V);
    worst w = {0};
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        softmax_ref(ref, x, V);
        for (int j = 0; j < V; j++) note(&w, probs[(size_t)n * V + j], ref[j], x[j]);
    }
    free(probs); free(ref);
    return w;
}

/* 2^20 logits, rows of 4096 (a vocabulary's width): each row's spread from 0.5 (all
 * probabilities alike) to 240 (down through the subnormals to 0), around an offset of
 * up to +-100, so that x - max is never exact in float. */
enum { SM_N = 256, SM_V = 4096 };

static float *spread_logits(void) {
    static const double spreads[] = {0.5, 4.0, 16.0, 40.0, 90.0, 240.0};
    float *x = falloc((size_t)SM_N * SM_V);
    rng_seed(40);
    for (int n = 0; n < SM_N; n++) {
        double spread = spreads[n % 6], offset = 200.0 * (urand() - 0.5);
        for (int j = 0; j < SM_V; j++)
            x[(size_t)n * SM_V + j] = (float)(offset + spread * (urand() - 0.5));
    }
    return x;
}

START_TEST(softmax_of_crossentropy_within_bound) {
    float *x = spread_logits();
    report("crossentropy softmax (2^20 logits)",
           softmax_error(crossentropy_probs, x, SM_N, SM_V));
    free(x);
}
END_TEST

/* The extremes, a row each: masked entries (-FLT_MAX) and -inf beside ordinary ones,
 * the largest floats, one NaN, one entry alone. */
START_TEST(softmax_extremes) {
    enum { V = 11 };
    const float M = -FLT_MAX, rows[][V] = {
        {M, 1.5f, M, 0.25f, M, -3.0f, M, 2.0f, M, M, 0.0f},
        /* a negative maximum: x - max's low part is then positive */
        {M, -0.75f, M, -1.5f, M, M, -2.5f, M, M, -0.5f, M},
        {-INFINITY, 1.5f, -INFINITY, 0.25f, -90.0f, -103.0f, -104.5f, -120.0f, 2.0f,
         -1e30f, 0.0f},
        {FLT_MAX, M, FLT_MAX, 1e30f, -1e30f, 0.0f, 1e-45f, -1e-45f, 3e38f, 1.0f, 2.0f},
        {1.0f, 2.0f, NAN, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f},
    };
    const int N = (int)(sizeof rows / sizeof rows[0]);
    float *probs = falloc((size_t)N * V);
    crossentropy_probs(probs, &rows[0][0], N, V);
    for (int n = 0; n < 2; n++)
        for (int j = 0; j < V; j++)
            if (rows[n][j] == -FLT_MAX)
                ck_assert_msg(probs[n * V + j] == 0.0f, "masked entry [%d,%d] gave %g", n,
                              j, probs[n * V + j]);
    for (int j = 0; j < V; j++) ck_assert(isnan(probs[4 * V + j]));   /* NaN poisons */
    report("crossentropy softmax (extremes)",
           softmax_error(crossentropy_probs, &rows[0][0], N, V));
    float one = 7.0f, p1;
    crossentropy_probs(&p1, &one, 1, 1);
    ck_assert(p1 == 1.0f);
    free(probs);
}
END_TEST

/* The attention's softmax, on scores that are exact in float: with head size 4 the
 * scale is 1/2, each query (c, 0, 0, 0) with c a power of two and each key
 * (b_j, 0, 0, 0), so row t's scores are c b_j / 2, j <= t, with no rounding. Every
 * row length from 1 to T runs, so every lane padding and block edge does. */
START_TEST(softmax_of_attention_within_bound) {
    enum { T = 256, C = 4 };
    float *qkv = calloc((size_t)T * 3 * C, sizeof(float)), *out = falloc((size_t)T * C),
          *att = falloc((size_t)T * T), *scores = falloc((size_t)T);
    double *ref = malloc((size_t)T * sizeof(double));
    rng_seed(41);
    for (int t = 0; t < T; t++) {
        qkv[(size_t)t * 3 * C] = ldexpf(1.0f, (int)(urand() * 5) - 2);   /* 1/4 .. 4 */
        qkv[(size_t)t * 3 * C + C] = (float)(120.0 * (urand() - 0.5));
    }
    qkv[C] = -3.0f;   /* row 0: one negative score, then 7 masked lanes that must be 0 */
    for (size_t i = 0; i < (size_t)T * T; i++) att[i] = NAN;   /* stale: must not count */
    cpu_attention_forward(out, att, qkv, 1, T, C, 1);
    worst w = {0};
    for (int t = 0; t < T; t++) {
        for (int j = 0; j <= t; j++)
            scores[j] = 0.5f * qkv[(size_t)t * 3 * C] * qkv[(size_t)j * 3 * C + C];
        softmax_ref(ref, scores, t + 1);
        for (int j = 0; j <= t; j++) note(&w, att[(size_t)t * T + j], ref[j], scores[j]);
        for (int j = t + 1; j < T; j++)
            ck_assert_msg(att[(size_t)t * T + j] == 0.0f, "att[%d,%d] above diag", t, j);
    }
    report("attention softmax (every row length to 256)", w);
    free(qkv); free(out); free(att); free(scores); free(ref);
}
END_TEST

/* The negative control: the softmax with x - max rounded to float before e^x, as a
 * plain float version would take it. Small probabilities then carry |x - max| ulps of
 * the difference: tens of ulps. */
static void softmax_rounded_difference(float *probs, const float *logits, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V, mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = fmaxf(mx, x[j]);
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += p[j] = exp_f(x[j] - mx, 0.0f, EXP_F_LO, EXP_F_HI);
        for (int j = 0; j < V; j++) p[j] = (float)(p[j] / sum);
    }
}

START_TEST(softmax_negative_control) {
    float *x = spread_logits();
    worst w = softmax_error(softmax_rounded_difference, x, SM_N, SM_V);
    printf("negative control: softmax with x - max rounded: max %.2f ulp, must exceed "
           "%.0f\n", w.ulps, ULP_BOUND);
    ck_assert_double_gt(w.ulps, ULP_BOUND);
    free(x);
}
END_TEST

/* ---- GELU ------------------------------------------------------------------------ */

/* GELU and its derivative in double, from x as a float:
 * gelu = x s, s = 1 / (1 + e), e = e^(-2u), u = sqrt(2/pi) (x + 0.044715 x^3),
 * gelu' = s + x 2u' e s^2. e s^2 = e / (1 + e)^2 is taken from 1/e where e > 1, which
 * may be infinite: s then is 1/e / (1 + 1/e). *term is the largest of the derivative
 * and its two terms. */
static double gelu_ref(float xf, double *deriv, double *term) {
    const double x = xf, k0 = sqrt(2.0 / M_PI), k1 = 0.044715;
    const double u = k0 * (x + k1 * x * x * x), du2 = 2.0 * k0 * (1.0 + 3.0 * k1 * x * x);
    double s, es2;
    if (u >= 0.0) {
        double e = exp(-2.0 * u);
        s = 1.0 / (1.0 + e);
        es2 = e * s * s;
    } else {
        double q = exp(2.0 * u);   /* 1/e */
        s = q / (1.0 + q);
        es2 = q / ((1.0 + q) * (1.0 + q));
    }
    double second = x * du2 * es2;
    *deriv = s + second;
    *term = fmax(fabs(*deriv), fmax(fabs(s), fabs(second)));
    return x * s;
}

typedef void (*gelu_fn)(float *out, float *x, size_t n);

/* Largest errors of f on inp[0..n): GELU in ulps of itself, the derivative in ulps of
 * itself or of the larger of its two terms where that is larger. That floor is the
 * derivative's: it crosses 0 at
 * x = -0.7518 (GELU's minimum), where s and x 2u' e s^2 (both about 0.23) cancel, and
 * a float result of that sum is as good as its terms' ulps (even the double code
 * is 280 ulps of the result off there). */
static void gelu_error(gelu_fn f, const float *inp, size_t n, worst *wg, worst *wd) {
    float *out = falloc(n), *x = falloc(n);
    memcpy(x, inp, n * sizeof(float));
    f(out, x, n);   /* x: the derivative */
    for (size_t i = 0; i < n; i++) {
        double d, term, g = gelu_ref(inp[i], &d, &term);
        note(wg, out[i], g, inp[i]);
        double e = isnan(d) || isnan(x[i]) ? ulp_error(x[i], d)
                                            : fabs((double)x[i] - d) / ulp_at(term);
        if (!(e <= wd->ulps)) {
            wd->ulps = e;
            wd->at = inp[i];
        }
    }
    free(out); free(x);
}

/* 2^20 points on [-12, 12] (beyond it GELU is x or underflows to 0; the subnormal
 * results lie near -10.4), then the extremes. */
enum { GELU_N = 1 << 20 };

static float *gelu_points(void) {
    float *x = falloc(GELU_N);
    for (int i = 0; i < GELU_N; i++) x[i] = (float)(-12.0 + 24.0 * i / (GELU_N - 1));
    return x;
}

START_TEST(gelu_within_bound) {
    float *x = gelu_points();
    worst wg = {0}, wd = {0};
    gelu_error(cpu_gelu_forward, x, GELU_N, &wg, &wd);
    report("gelu (2^20 points in [-12, 12])", wg);
    report("gelu' (same points; near 0, ulps of its larger term)", wd);
    free(x);
}
END_TEST

START_TEST(gelu_extremes) {
    const float x[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f, -1e-38f, 1e-20f, -1e-20f,
                       -10.3f, -10.4f, -10.5f, -13.0f, 1e30f, -1e30f, FLT_MAX, -FLT_MAX,
                       NAN};
    const size_t n = sizeof x / sizeof x[0];
    worst wg = {0}, wd = {0};
    gelu_error(cpu_gelu_forward, x, n, &wg, &wd);
    report("gelu (extremes)", wg);
    report("gelu' (extremes)", wd);
}
END_TEST

/* The negative control: the tanh form in float, whose 1 + tanh(u) cancels for x < 0. */
static void gelu_tanh_float(float *out, float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v = x[i], u = 0.7978845608f * (v + 0.044715f * v * v * v);
        float t = tanhf(u), du = 0.7978845608f * (1.0f + 3.0f * 0.044715f * v * v);
        out[i] = 0.5f * v * (1.0f + t);
        x[i] = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    }
}

START_TEST(gelu_negative_control) {
    float *x = gelu_points();
    worst wg = {0}, wd = {0};
    gelu_error(gelu_tanh_float, x, GELU_N, &wg, &wd);
    printf("negative control: tanh form in float: gelu %.3g ulp, gelu' %.3g ulp, "
           "must exceed %.0f\n", wg.ulps, wd.ulps, ULP_BOUND);
    ck_assert_double_gt(wg.ulps, ULP_BOUND);
    ck_assert_double_gt(wd.ulps, ULP_BOUND);
    free(x);
}
END_TEST

/* ---- runner ---------------------------------------------------------------------- */

static Suite *ops_ulp_suite(void) {
    Suite *s = suite_create("ops_ulp");
    TCase *tc = tcase_create("ops_ulp");
    tcase_set_timeout(tc, 60);   /* sanitizer builds are slow */
    tcase_add_test(tc, exp_f_within_bound);
    tcase_add_test(tc, softmax_of_crossentropy_within_bound);
    tcase_add_test(tc, softmax_extremes);
    tcase_add_test(tc, softmax_of_attention_within_bound);
    tcase_add_test(tc, softmax_negative_control);
    tcase_add_test(tc, gelu_within_bound);
    tcase_add_test(tc, gelu_extremes);
    tcase_add_test(tc, gelu_negative_control);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);
    return check_run(ops_ulp_suite(), 0);
}
