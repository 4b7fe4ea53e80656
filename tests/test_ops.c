/* Tests of the numerical ops (ops.h) on the current device.
 *
 * Each op's float forward is checked against a small double-precision reference written
 * here, and its float backward against central finite differences of that double
 * reference: for L = sum(G * forward(x)) with a random G, dL/dx is what backward must
 * return given dout = G. The double reference makes the finite differences accurate to
 * ~1e-10, so the tolerances below measure the float code, not the check.
 *
 * A difference is |got - want| / max(1, |want|): absolute for values up to 1, relative
 * above. Each op prints the largest one it saw and the tolerance it must stay under. */
#include <check.h>
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "check_run.h"

/* ---- helpers --------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static void rng_seed(uint64_t seed) { rng_state = seed * 0x9e3779b97f4a7c15ull + 1; }

/* xorshift64*: uniform in [0, 1), reproducible everywhere */
static double urand(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

static void fill(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * urand());
}

static float *falloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    ck_assert_ptr_nonnull(p);
    return p;
}

static double *dalloc(size_t n) {
    double *p = calloc(n ? n : 1, sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

static double *to_double(const float *x, size_t n) {
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float *fcopy(const float *x, size_t n) {
    float *p = falloc(n);
    memcpy(p, x, n * sizeof(float));
    return p;
}

static double diff(double got, double want) {
    return fabs(got - want) / fmax(1.0, fabs(want));
}

/* Largest diff between got[i] and base[i] + want[i] (base may be NULL): accumulating
 * gradients are checked as "what was there + the true gradient". */
static double max_diff(const float *got, const float *base, const double *want,
                       size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double w = want[i] + (base ? base[i] : 0.0);
        double d = diff(got[i], w);
        if (!(d <= m)) m = d;   /* a NaN becomes the maximum */
    }
    return m;
}

/* One line per op, then the verdict. */
static void report(const char *what, double maxdiff, double tol) {
    printf("%s: max |diff| %.1e (tol %.2g)\n", what, maxdiff, tol);
    fflush(stdout);
    ck_assert_msg(maxdiff <= tol, "%s: max |diff| %g above tolerance %g", what, maxdiff,
                  tol);
}

/* ---- finite differences ---------------------------------------------------------- */

/* A double reference forward: reads its inputs through ctx, writes nout outputs. */
typedef void (*ref_forward)(const void *ctx, double *out);

#define FD_STEP 1e-5

/* grad[i] = dL/dx[i] for L = sum_k G[k] out[k], by central differences; x is one of
 * the arrays ctx points to, nudged in place and restored. */
static void fd_gradient(ref_forward f, const void *ctx, double *x, size_t n,
                        const double *G, size_t nout, double *grad) {
    double *out = dalloc(nout);
    for (size_t i = 0; i < n; i++) {
        double save = x[i], lp = 0.0, lm = 0.0;
        x[i] = save + FD_STEP;
        f(ctx, out);
        for (size_t k = 0; k < nout; k++) lp += G[k] * out[k];
        x[i] = save - FD_STEP;
        f(ctx, out);
        for (size_t k = 0; k < nout; k++) lm += G[k] * out[k];
        x[i] = save;
        grad[i] = (lp - lm) / (2.0 * FD_STEP);
    }
    free(out);
}

/* ---- double references ----------------------------------------------------------- */

typedef struct {
    const double *wte;
    const int *tokens;
    int N, C, vocab_start, vocab_len;
} embedding_ctx;

static void embedding_ref(const void *p, double *out) {
    const embedding_ctx *e = p;
    for (int n = 0; n < e->N; n++) {
        int row = e->tokens[n] - e->vocab_start;
        for (int c = 0; c < e->C; c++)
            out[n * e->C + c] =
                (row >= 0 && row < e->vocab_len) ? e->wte[row * e->C + c] : 0.0;
    }
}

typedef struct {
    const double *inp, *wpe;
    int B, T, C;
} position_ctx;

static void position_ref(const void *p, double *out) {
    const position_ctx *e = p;
    for (int b = 0; b < e->B; b++)
        for (int i = 0; i < e->T * e->C; i++)
            out[b * e->T * e->C + i] = e->inp[b * e->T * e->C + i] + e->wpe[i];
}

typedef struct {
    const double *inp, *weight, *bias;
    int N, C;
} layernorm_ctx;

static void layernorm_ref(const void *p, double *out) {
    const layernorm_ctx *e = p;
    for (int n = 0; n < e->N; n++) {
        const double *x = e->inp + n * e->C;
        double mean = 0.0, var = 0.0;
        for (int c = 0; c < e->C; c++) mean += x[c];
        mean /= e->C;
        for (int c = 0; c < e->C; c++) var += (x[c] - mean) * (x[c] - mean);
        var /= e->C;
        double rstd = 1.0 / sqrt(var + 1e-5);
        for (int c = 0; c < e->C; c++)
            out[n * e->C + c] = (x[c] - mean) * rstd * e->weight[c] + e->bias[c];
    }
}

typedef struct {
    const double *inp, *weight, *bias;   /* bias may be NULL */
    int N, IC, OC;
} linear_ctx;

static void linear_ref(const void *p, double *out) {
    const linear_ctx *e = p;
    for (int n = 0; n < e->N; n++)
        for (int o = 0; o < e->OC; o++) {
            double s = e->bias ? e->bias[o] : 0.0;
            for (int i = 0; i < e->IC; i++)
                s += e->inp[n * e->IC + i] * e->weight[o * e->IC + i];
            out[n * e->OC + o] = s;
        }
}

typedef struct {
    const double *qkv;
    int B, T, C, NH;
} attention_ctx;

/* The textbook loops: per query, scores over keys 0..t, softmax, weighted values. */
static void attention_ref(const void *p, double *out) {
    const attention_ctx *e = p;
    int B = e->B, T = e->T, C = e->C, NH = e->NH, hs = C / NH;
    double *w = dalloc((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = e->qkv + (b * T + t) * 3 * C + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    const double *k = e->qkv + (b * T + j) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    w[j] = s / sqrt((double)hs);
                    mx = fmax(mx, w[j]);
                }
                for (int j = 0; j <= t; j++) sum += (w[j] = exp(w[j] - mx));
                for (int i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int j = 0; j <= t; j++) {
                        const double *v = e->qkv + (b * T + j) * 3 * C + 2 * C + h * hs;
                        s += w[j] / sum * v[i];
                    }
                    out[(b * T + t) * C + h * hs + i] = s;
                }
            }
    free(w);
}

typedef struct {
    const double *inp;
    size_t n;
} gelu_ctx;

/* The tanh form as written in the brief (the float code uses the sigmoid form). */
static void gelu_ref(const void *p, double *out) {
    const gelu_ctx *e = p;
    for (size_t i = 0; i < e->n; i++) {
        double x = e->inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    }
}

typedef struct {
    const double *logits;
    const int *targets;
    int N, V;
} crossentropy_ctx;

/* losses only: out[n] = logsumexp(logits[n]) - logits[n, target] */
static void crossentropy_ref(const void *p, double *out) {
    const crossentropy_ctx *e = p;
    for (int n = 0; n < e->N; n++) {
        const double *x = e->logits + n * e->V;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < e->V; v++) mx = fmax(mx, x[v]);
        for (int v = 0; v < e->V; v++) sum += exp(x[v] - mx);
        out[n] = mx + log(sum) - x[e->targets[n]];
    }
}

/* ---- embeddings ------------------------------------------------------------------ */

START_TEST(test_embedding) {
    enum { N = 10, C = 8, V = 11 };
    rng_seed(1);
    int tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = (int)(urand() * V);
    tokens[3] = tokens[7];   /* a repeated token sums both gradients */
    float *wte = falloc(V * C), *out = falloc(N * C), *dout = falloc(N * C),
          *dwte = falloc(V * C);
    fill(wte, V * C, -1, 1);
    fill(dout, N * C, -1, 1);
    fill(dwte, V * C, -1, 1);
    float *dwte0 = fcopy(dwte, V * C);
    double *wte_d = to_double(wte, V * C), *G = to_double(dout, N * C);
    double *ref = dalloc(N * C), *grad = dalloc(V * C);
    embedding_ctx ctx = {wte_d, tokens, N, C, 0, V};

    embedding_forward(out, tokens, wte, N, C, 0, V);
    embedding_ref(&ctx, ref);
    report("embedding_forward", max_diff(out, NULL, ref, N * C), 0.0);

    embedding_backward(dwte, dout, tokens, N, C, 0, V);
    fd_gradient(embedding_ref, &ctx, wte_d, V * C, G, N * C, grad);
    report("embedding_backward", max_diff(dwte, dwte0, grad, V * C), 1e-6);

    free(wte); free(out); free(dout); free(dwte); free(dwte0);
    free(wte_d); free(G); free(ref); free(grad);
}
END_TEST

/* A rank holding vocabulary rows [start, start+len) embeds only its tokens and leaves
 * zeros elsewhere, so that summing the slices of all ranks gives the full embedding. */
START_TEST(test_embedding_vocab_slice) {
    enum { N = 12, C = 8, V = 11 };
    const int cuts[] = {0, 3, 8, V};   /* three slices, one of them length 5 */
    rng_seed(2);
    int tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = n % V;   /* every token, some twice */
    float *wte = falloc(V * C), *full = falloc(N * C), *sum = falloc(N * C),
          *part = falloc(N * C), *dout = falloc(N * C), *dfull = falloc(V * C),
          *dpart = falloc(V * C);
    fill(wte, V * C, -1, 1);
    fill(dout, N * C, -1, 1);
    embedding_forward(full, tokens, wte, N, C, 0, V);
    embedding_backward(dfull, dout, tokens, N, C, 0, V);
    for (int s = 0; s < 3; s++) {
        int start = cuts[s], len = cuts[s + 1] - cuts[s];
        fill(part, N * C, 5, 6);   /* must be overwritten, zeros included */
        embedding_forward(part, tokens, wte + start * C, N, C, start, len);
        for (int n = 0; n < N; n++) {
            int inside = tokens[n] >= start && tokens[n] < start + len;
            for (int c = 0; c < C; c++) {
                float want = inside ? wte[tokens[n] * C + c] : 0.0f;
                ck_assert_msg(part[n * C + c] == want, "slice %d row %d", s, n);
                sum[n * C + c] += part[n * C + c];
            }
        }
        /* backward: this slice's rows get exactly the full-vocabulary gradient rows,
         * written at offset 0 of the slice; nothing lands outside it */
        memset(dpart, 0, V * C * sizeof(float));
        embedding_backward(dpart, dout, tokens, N, C, start, len);
        ck_assert(memcmp(dpart, dfull + start * C, (size_t)len * C * sizeof(float)) == 0);
        for (int i = len * C; i < V * C; i++) ck_assert(dpart[i] == 0.0f);
    }
    ck_assert(memcmp(sum, full, N * C * sizeof(float)) == 0);
    printf("embedding vocab slices [0,3) [3,8) [8,11): exact\n");
    fflush(stdout);
    free(wte); free(full); free(sum); free(part); free(dout); free(dfull); free(dpart);
}
END_TEST

START_TEST(test_position) {
    enum { B = 2, T = 5, C = 8 };
    rng_seed(3);
    float *inp = falloc(B * T * C), *wpe = falloc(T * C), *dout = falloc(B * T * C),
          *dwpe = falloc(T * C);
    fill(inp, B * T * C, -1, 1);
    fill(wpe, T * C, -1, 1);
    fill(dout, B * T * C, -1, 1);
    fill(dwpe, T * C, -1, 1);
    float *out = fcopy(inp, B * T * C), *dwpe0 = fcopy(dwpe, T * C);
    double *inp_d = to_double(inp, B * T * C), *wpe_d = to_double(wpe, T * C);
    double *G = to_double(dout, B * T * C), *ref = dalloc(B * T * C),
           *grad = dalloc(T * C);
    position_ctx ctx = {inp_d, wpe_d, B, T, C};

    position_forward(out, wpe, B, T, C);
    position_ref(&ctx, ref);
    report("position_forward", max_diff(out, NULL, ref, B * T * C), 1e-7);

    position_backward(dwpe, dout, B, T, C);
    fd_gradient(position_ref, &ctx, wpe_d, T * C, G, B * T * C, grad);
    report("position_backward", max_diff(dwpe, dwpe0, grad, T * C), 1e-6);

    free(inp); free(wpe); free(dout); free(dwpe); free(out); free(dwpe0);
    free(inp_d); free(wpe_d); free(G); free(ref); free(grad);
}
END_TEST

/* ---- layer norm ------------------------------------------------------------------ */

/* C = 8 takes the fused row pass of the backward; C > 1024 the column passes after it */
static void check_layernorm(int N, int C, const char *fwd_name, const char *bwd_name) {
    float *inp = falloc(N * C), *w = falloc(C), *b = falloc(C), *out = falloc(N * C),
          *mean = falloc(N), *rstd = falloc(N), *dout = falloc(N * C),
          *dinp = falloc(N * C), *dw = falloc(C), *db = falloc(C);
    fill(inp, N * C, -2, 3);   /* off-centre rows: the mean matters */
    fill(w, C, 0.5, 1.5);
    fill(b, C, -0.5, 0.5);
    fill(dout, N * C, -1, 1);
    /* all three gradients accumulate: start them from random values */
    fill(dinp, N * C, -1, 1);
    fill(dw, C, -1, 1);
    fill(db, C, -1, 1);
    float *dinp0 = fcopy(dinp, N * C), *dw0 = fcopy(dw, C), *db0 = fcopy(db, C);
    double *inp_d = to_double(inp, N * C), *w_d = to_double(w, C), *b_d = to_double(b, C);
    double *G = to_double(dout, N * C), *ref = dalloc(N * C);
    double *gi = dalloc(N * C), *gw = dalloc(C), *gb = dalloc(C);
    layernorm_ctx ctx = {inp_d, w_d, b_d, N, C};

    layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    layernorm_ref(&ctx, ref);
    report(fwd_name, max_diff(out, NULL, ref, N * C), 1e-6);

    layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    fd_gradient(layernorm_ref, &ctx, inp_d, N * C, G, N * C, gi);
    fd_gradient(layernorm_ref, &ctx, w_d, C, G, N * C, gw);
    fd_gradient(layernorm_ref, &ctx, b_d, C, G, N * C, gb);
    double d = fmax(max_diff(dinp, dinp0, gi, N * C),
                    fmax(max_diff(dw, dw0, gw, C), max_diff(db, db0, gb, C)));
    report(bwd_name, d, 1e-5);

    free(inp); free(w); free(b); free(out); free(mean); free(rstd); free(dout);
    free(dinp); free(dw); free(db); free(dinp0); free(dw0); free(db0);
    free(inp_d); free(w_d); free(b_d); free(G); free(ref); free(gi); free(gw); free(gb);
}

START_TEST(test_layernorm) {
    rng_seed(4);
    check_layernorm(10, 8, "layernorm_forward", "layernorm_backward");
    check_layernorm(3, 1030, "layernorm_forward (C 1030)", "layernorm_backward (C 1030)");
}
END_TEST

/* ---- linear ---------------------------------------------------------------------- */

static void check_linear(int N, int IC, int OC, int with_bias, const char *fwd_name,
                         const char *bwd_name) {
    float *inp = falloc(N * IC), *w = falloc(OC * IC), *b = falloc(OC),
          *out = falloc(N * OC), *dout = falloc(N * OC), *dinp = falloc(N * IC),
          *dw = falloc(OC * IC), *db = falloc(OC);
    fill(inp, N * IC, -1, 1);
    fill(w, OC * IC, -1, 1);
    fill(b, OC, -1, 1);
    fill(dout, N * OC, -1, 1);
    fill(out, N * OC, 1e3, 2e3);   /* stale contents must not leak into the result */
    fill(dinp, N * IC, 1e3, 2e3);  /* overwritten */
    fill(dw, OC * IC, -1, 1);      /* accumulated */
    fill(db, OC, -1, 1);
    float *dw0 = fcopy(dw, OC * IC), *db0 = fcopy(db, OC);
    double *inp_d = to_double(inp, N * IC), *w_d = to_double(w, OC * IC),
           *b_d = to_double(b, OC), *G = to_double(dout, N * OC), *ref = dalloc(N * OC);
    double *gi = dalloc(N * IC), *gw = dalloc(OC * IC), *gb = dalloc(OC);
    linear_ctx ctx = {inp_d, w_d, with_bias ? b_d : NULL, N, IC, OC};

    linear_forward(out, inp, w, with_bias ? b : NULL, N, IC, OC);
    linear_ref(&ctx, ref);
    report(fwd_name, max_diff(out, NULL, ref, N * OC), 1e-6);

    linear_backward(dinp, dw, with_bias ? db : NULL, dout, inp, w, N, IC, OC);
    fd_gradient(linear_ref, &ctx, inp_d, N * IC, G, N * OC, gi);
    fd_gradient(linear_ref, &ctx, w_d, OC * IC, G, N * OC, gw);
    double d = fmax(max_diff(dinp, NULL, gi, N * IC), max_diff(dw, dw0, gw, OC * IC));
    if (with_bias) {
        fd_gradient(linear_ref, &ctx, b_d, OC, G, N * OC, gb);
        d = fmax(d, max_diff(db, db0, gb, OC));
    } else {
        ck_assert(memcmp(db, db0, OC * sizeof(float)) == 0);   /* no bias: untouched */
    }
    report(bwd_name, d, 1e-5);

    /* dinp NULL: the weight gradient alone, the same as with dinp */
    float *dw2 = fcopy(dw0, OC * IC);
    linear_backward(NULL, dw2, NULL, dout, inp, w, N, IC, OC);
    ck_assert(memcmp(dw2, dw, OC * IC * sizeof(float)) == 0);

    free(inp); free(w); free(b); free(out); free(dout); free(dinp); free(dw); free(db);
    free(dw0); free(db0); free(dw2);
    free(inp_d); free(w_d); free(b_d); free(G); free(ref);
    free(gi); free(gw); free(gb);
}

START_TEST(test_linear) {
    rng_seed(5);
    check_linear(10, 8, 6, 1, "linear_forward", "linear_backward");
    check_linear(7, 5, 9, 0, "linear_forward (no bias)", "linear_backward (no bias)");
}
END_TEST

/* ---- attention ------------------------------------------------------------------- */

static void check_attention(int B, int T, int C, int NH, const char *fwd_name,
                            const char *bwd_name) {
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
           natt = (size_t)B * NH * T * T;
    float *qkv = falloc(nqkv), *out = falloc(nout), *att = falloc(natt),
          *dout = falloc(nout), *dqkv = falloc(nqkv), *datt = falloc(natt);
    fill(qkv, nqkv, -2, 2);   /* scores of a few units: a softmax far from uniform */
    fill(dout, nout, -1, 1);
    /* stale buffers must not matter: att, the output, the overwritten dqkv and the
     * scratch are all filled with NaN first */
    for (size_t i = 0; i < natt; i++) att[i] = datt[i] = NAN;
    for (size_t i = 0; i < nout; i++) out[i] = NAN;
    for (size_t i = 0; i < nqkv; i++) dqkv[i] = NAN;
    double *qkv_d = to_double(qkv, nqkv), *G = to_double(dout, nout), *ref = dalloc(nout),
           *grad = dalloc(nqkv);
    attention_ctx ctx = {qkv_d, B, T, C, NH};

    attention_forward(out, att, qkv, B, T, C, NH);
    attention_ref(&ctx, ref);
    report(fwd_name, max_diff(out, NULL, ref, nout), 1e-6);
    /* att: probabilities on and below the diagonal that sum to 1, exact zeros above */
    for (int bh = 0; bh < B * NH; bh++)
        for (int t = 0; t < T; t++) {
            const float *row = att + ((size_t)bh * T + t) * T;
            double s = 0.0;
            for (int j = 0; j < T; j++) {
                if (j > t)
                    ck_assert_msg(row[j] == 0.0f, "att[%d,%d,%d] above diag", bh, t, j);
                else
                    ck_assert(row[j] >= 0.0f && row[j] <= 1.0f);
                s += row[j];
            }
            ck_assert_msg(fabs(s - 1.0) < 1e-6, "att row sums to %g", s);
        }

    attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
    fd_gradient(attention_ref, &ctx, qkv_d, nqkv, G, nout, grad);
    report(bwd_name, max_diff(dqkv, NULL, grad, nqkv), 1e-5);

    free(qkv); free(out); free(att); free(dout); free(dqkv); free(datt);
    free(qkv_d); free(G); free(ref); free(grad);
}

START_TEST(test_attention) {
    rng_seed(6);
    check_attention(2, 5, 8, 2, "attention_forward", "attention_backward");
}
END_TEST

/* Longer than two of the CPU code's causal row blocks (16 up to T = 64, 32 above),
 * ending in a partial one. */
START_TEST(test_attention_long) {
    rng_seed(7);
    check_attention(1, 70, 8, 2, "attention_forward (T=70)", "attention_backward (T=70)");
    check_attention(1, 40, 8, 2, "attention_forward (T=40)", "attention_backward (T=40)");
}
END_TEST

/* Changing every input of token t0 (its q, k and v) leaves the outputs of earlier tokens
 * and of the other sequence bit for bit unchanged, and does change token t0's. */
static void check_causal(int B, int T, int C, int NH, int t0) {
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C,
           natt = (size_t)B * NH * T * T;
    float *qkv = falloc(nqkv), *out1 = falloc(nout), *out2 = falloc(nout),
          *att = falloc(natt);
    fill(qkv, nqkv, -2, 2);
    attention_forward(out1, att, qkv, B, T, C, NH);
    fill(qkv + (size_t)t0 * 3 * C, 3 * C, -2, 2);   /* batch 0, token t0 */
    attention_forward(out2, att, qkv, B, T, C, NH);
    size_t before = (size_t)t0 * C;
    ck_assert_msg(memcmp(out1, out2, before * sizeof(float)) == 0,
                  "T=%d: a token changed the output before it", T);
    ck_assert_msg(memcmp(out1 + (size_t)T * C, out2 + (size_t)T * C,
                         (nout - (size_t)T * C) * sizeof(float)) == 0,
                  "T=%d: batch 0 changed batch 1", T);
    ck_assert(memcmp(out1 + before, out2 + before, C * sizeof(float)) != 0);
    free(qkv); free(out1); free(out2); free(att);
}

START_TEST(test_attention_causal) {
    rng_seed(8);
    check_causal(2, 5, 8, 2, 3);
    check_causal(2, 70, 8, 2, 20);   /* inside the CPU code's first row block */
    check_causal(2, 70, 8, 2, 40);   /* the second */
    check_causal(2, 70, 8, 2, 66);   /* the last, partial one */
    check_causal(2, 40, 8, 2, 20);   /* blocks of 16: the second */
    check_causal(2, 40, 8, 2, 36);   /* the last, partial one */
    printf("attention causality: earlier outputs bit-identical\n");
    fflush(stdout);
}
END_TEST

/* ---- GELU ------------------------------------------------------------------------ */

START_TEST(test_gelu) {
    enum { n = 64 };
    rng_seed(9);
    float *inp = falloc(n), *out = falloc(n), *dout = falloc(n), *dinp = falloc(n);
    fill(inp, n, -6, 6);
    /* the tails and the middle: far negative, exactly zero, large */
    inp[0] = -30.0f; inp[1] = -9.0f; inp[2] = 0.0f; inp[3] = 1e-4f; inp[4] = 20.0f;
    fill(dout, n, -1, 1);
    fill(dinp, n, 1e3, 2e3);   /* overwritten */
    double *inp_d = to_double(inp, n), *G = to_double(dout, n), *ref = dalloc(n),
           *grad = dalloc(n);
    gelu_ctx ctx = {inp_d, n};

    float *dgelu = fcopy(inp, n);   /* gelu_forward leaves the derivative there */
    gelu_forward(out, dgelu, n);
    gelu_ref(&ctx, ref);
    report("gelu_forward", max_diff(out, NULL, ref, n), 1e-7);
    /* Relative accuracy, tiny values included: against x * sigmoid(2u), the same
     * function rewritten so that double does not lose the tail (1 + tanh(u) cancels
     * for negative x). Float rounding is 6e-8; allow one more ulp. */
    double rel = 0.0;
    for (int i = 0; i < n; i++) {
        double x = inp_d[i], u = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
        double want = x / (1.0 + exp(-2.0 * u));
        if (want != 0.0) rel = fmax(rel, fabs(out[i] - want) / fabs(want));
    }
    report("gelu_forward (relative)", rel, 1.2e-7);

    gelu_backward(dinp, dgelu, dout, n);
    fd_gradient(gelu_ref, &ctx, inp_d, n, G, n, grad);
    report("gelu_backward", max_diff(dinp, NULL, grad, n), 1e-6);

    free(inp); free(out); free(dout); free(dinp); free(dgelu);
    free(inp_d); free(G); free(ref); free(grad);
}
END_TEST

/* GELU's relative error against long double on a dense grid of [-12, 12] (the
 * activations' whole useful range: beyond it the output is x or underflows), where
 * the result is a normal float. */
typedef void (*gelu_fn)(float *out, float *x, size_t n);

static double gelu_dense_error(gelu_fn f) {
    enum { n = 1 << 20 };
    float *inp = falloc(n), *out = falloc(n);
    for (int i = 0; i < n; i++) inp[i] = (float)(-12.0 + 24.0 * i / (n - 1));
    float *x = fcopy(inp, n);   /* overwritten by the derivative */
    f(out, x, n);
    free(x);
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        long double x = inp[i], u = sqrtl(2.0L / acosl(-1.0L)) * (x + 0.044715L * x * x * x);
        long double want = x / (1.0L + expl(-2.0L * u));
        if (fabsl(want) < FLT_MIN) continue;   /* float underflows there: no relative digits */
        double rel = (double)fabsl(((long double)out[i] - want) / want);
        if (!(rel <= worst)) worst = rel;
    }
    free(inp); free(out);
    return worst;
}

/* The negative control: GELU computed in float, as a naive vectorised version would. */
static void gelu_in_float(float *out, float *inp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = 0.7978845608f * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + expf(-2.0f * u));
    }
}

START_TEST(test_gelu_dense) {
    report("gelu_forward (relative, 2^20 points in [-12, 12])", gelu_dense_error(gelu_forward),
           1.2e-7);
    double naive = gelu_dense_error(gelu_in_float);
    printf("negative control: GELU in float: relative error %.1e, must exceed 1.2e-07\n",
           naive);
    ck_assert_double_gt(naive, 1.2e-7);
}
END_TEST

/* ---- cross-entropy --------------------------------------------------------------- */

START_TEST(test_crossentropy) {
    enum { N = 10, V = 11 };
    const float dloss = 1.0f / N;
    rng_seed(10);
    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int)(urand() * V);
    float *logits = falloc(N * V), *probs = falloc(N * V), *losses = falloc(N),
          *dlogits = falloc(N * V);
    fill(logits, N * V, -3, 3);
    logits[2 * V + targets[2]] = -40.0f;   /* a nearly impossible target: loss ~ 40 */
    fill(dlogits, N * V, 1e3, 2e3);        /* overwritten */
    double *logits_d = to_double(logits, N * V), *G = dalloc(N), *ref = dalloc(N),
           *grad = dalloc(N * V), *pref = dalloc(N * V);
    for (int n = 0; n < N; n++) G[n] = dloss;
    crossentropy_ctx ctx = {logits_d, targets, N, V};

    crossentropy_forward(losses, probs, logits, targets, N, V);
    crossentropy_ref(&ctx, ref);
    for (int n = 0; n < N; n++)   /* probs = exp(-(logsumexp - logit)) */
        for (int v = 0; v < V; v++) {
            int saved = targets[n];
            targets[n] = v;
            double l[N];
            crossentropy_ref(&ctx, l);
            pref[n * V + v] = exp(-l[n]);
            targets[n] = saved;
        }
    double d = fmax(max_diff(losses, NULL, ref, N), max_diff(probs, NULL, pref, N * V));
    report("crossentropy_forward", d, 1e-6);

    crossentropy_backward(dlogits, probs, targets, dloss, N, V);
    fd_gradient(crossentropy_ref, &ctx, logits_d, N * V, G, N, grad);
    report("crossentropy_backward", max_diff(dlogits, NULL, grad, N * V), 1e-6);

    free(logits); free(probs); free(losses); free(dlogits);
    free(logits_d); free(G); free(ref); free(grad); free(pref);
}
END_TEST

/* probs == logits and dlogits == probs give bit for bit what separate buffers give. */
START_TEST(test_crossentropy_inplace) {
    enum { N = 6, V = 37 };
    rng_seed(11);
    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int)(urand() * V);
    float *logits = falloc(N * V), *probs = falloc(N * V), *losses = falloc(N),
          *dlogits = falloc(N * V), *losses2 = falloc(N);
    fill(logits, N * V, -5, 5);
    float *buf = fcopy(logits, N * V);
    crossentropy_forward(losses, probs, logits, targets, N, V);
    crossentropy_backward(dlogits, probs, targets, 0.25f, N, V);
    crossentropy_forward(losses2, buf, buf, targets, N, V);
    ck_assert(memcmp(losses, losses2, N * sizeof(float)) == 0);
    ck_assert(memcmp(probs, buf, N * V * sizeof(float)) == 0);
    crossentropy_backward(buf, buf, targets, 0.25f, N, V);
    ck_assert(memcmp(dlogits, buf, N * V * sizeof(float)) == 0);
    printf("crossentropy in place: bit-identical\n");
    fflush(stdout);
    free(logits); free(probs); free(losses); free(dlogits); free(losses2); free(buf);
}
END_TEST

/* ---- AdamW ----------------------------------------------------------------------- */

START_TEST(test_adamw) {
    enum { n = 21, steps = 3 };
    const adamw_config cfg = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.1f};
    rng_seed(12);
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    double pd[n], md[n] = {0}, vd[n] = {0};
    fill(p, n, -1, 1);
    for (int i = 0; i < n; i++) pd[i] = p[i];
    /* the hyperparameters as the float code sees them */
    double lr = cfg.lr, b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps;
    double wd = cfg.weight_decay;
    double d = 0.0;
    for (int step = 1; step <= steps; step++) {
        fill(g, n, -1, 1);
        g[0] = 1e-9f;   /* sqrt(vhat) below eps: eps matters */
        g[1] = 0.0f;    /* only weight decay moves it (after step 1) */
        adamw_update(p, g, m, v, n, &cfg, step);
        for (int i = 0; i < n; i++) {
            md[i] = b1 * md[i] + (1 - b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - b2) * g[i] * g[i];
            double mhat = md[i] / (1 - pow(b1, step)), vhat = vd[i] / (1 - pow(b2, step));
            pd[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * pd[i]);
        }
        d = fmax(d, fmax(max_diff(p, NULL, pd, n),
                         fmax(max_diff(m, NULL, md, n), max_diff(v, NULL, vd, n))));
    }
    report("adamw_update (3 steps)", d, 1e-6);
    free(p); free(g); free(m); free(v);
}
END_TEST

/* The warm-up schedule itself (every strategy shares it, so comparing them with the
 * baseline cannot see it): step t of W warm-up steps trains with lr * t / W, from
 * step 1 (never with lr 0), and with lr from step W on. The learning rate a step
 * used is read back from two one-element parameters: one with no gradient, which
 * only weight decay moves (p -= lr_t * wd * p), and one with a constant gradient and
 * no decay, which Adam moves by lr_t * mhat / sqrt(vhat) = lr_t. The values are chosen
 * so the decay measurement is exact in fp32; tolerance 1e-6 relative. */
START_TEST(test_adamw_warmup) {
    enum { warmup = 4, steps = 7 };
    const adamw_config decay = {.lr = 0.5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                .weight_decay = 1.0f, .warmup_steps = warmup};
    adamw_config adam = decay;
    adam.weight_decay = 0.0f;
    float p_decay = 1.0f, g_zero = 0.0f, m0 = 0.0f, v0 = 0.0f;
    float p_adam = 0.0f, g_one = 1.0f, m1 = 0.0f, v1 = 0.0f;
    double worst = 0.0, first_lr = 0.0;
    for (int step = 1; step <= steps; step++) {
        const double want = decay.lr * (step < warmup ? (double)step / warmup : 1.0);
        const float before_decay = p_decay, before_adam = p_adam;
        adamw_update(&p_decay, &g_zero, &m0, &v0, 1, &decay, step);
        adamw_update(&p_adam, &g_one, &m1, &v1, 1, &adam, step);
        const double lr_decay = (double)(before_decay - p_decay) / before_decay;
        const double lr_adam = (double)(before_adam - p_adam);
        printf("warm-up step %d: lr used %.7f (decay) %.7f (adam), schedule %.7f\n", step,
               lr_decay, lr_adam, want);
        worst = fmax(worst, fmax(fabs(lr_decay - want), fabs(lr_adam - want)) / decay.lr);
        if (step == 1) first_lr = fmin(lr_decay, lr_adam);
    }
    ck_assert_msg(first_lr > 0, "step 1 trained with lr %g: the warm-up starts at 0",
                  first_lr);
    report("warm-up schedule lr * min(t, W) / W (relative to lr)", worst, 1e-6);
}
END_TEST

/* ---- conventions: accumulate vs overwrite ---------------------------------------- */

static int all_close_twice(const float *once, const float *twice, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (diff(twice[i], 2.0 * once[i]) > 1e-6) return 0;
    return 1;
}

/* Parameter gradients (and layernorm's dinp) accumulate: a second backward call from
 * zero doubles them. Input gradients are overwritten: a second call changes nothing. */
START_TEST(test_accumulate_overwrite) {
    enum { B = 2, T = 5, C = 8, NH = 2, N = B * T, OC = 6, V = 11 };
    rng_seed(13);
    float *inp = falloc(N * C), *w = falloc(OC * C), *dout = falloc(N * OC),
          *dinp1 = falloc(N * C), *dinp2 = falloc(N * C), *dw = falloc(OC * C),
          *db = falloc(OC), *dw1, *db1;
    fill(inp, N * C, -1, 1);
    fill(w, OC * C, -1, 1);
    fill(dout, N * OC, -1, 1);

    /* linear: dweight, dbias accumulate; dinp is overwritten */
    linear_backward(dinp1, dw, db, dout, inp, w, N, C, OC);
    dw1 = fcopy(dw, OC * C);
    db1 = fcopy(db, OC);
    linear_backward(dinp2, dw, db, dout, inp, w, N, C, OC);
    ck_assert(all_close_twice(dw1, dw, OC * C) && all_close_twice(db1, db, OC));
    linear_backward(dinp2, dw, db, dout, inp, w, N, C, OC);
    ck_assert(memcmp(dinp1, dinp2, N * C * sizeof(float)) == 0);
    free(dw1); free(db1);

    /* layernorm: dinp, dweight, dbias all accumulate */
    float *lw = falloc(C), *lb = falloc(C), *lout = falloc(N * C), *mean = falloc(N),
          *rstd = falloc(N), *ldout = falloc(N * C), *ldinp = falloc(N * C),
          *ldw = falloc(C), *ldb = falloc(C);
    fill(lw, C, 0.5, 1.5);
    fill(lb, C, -0.5, 0.5);
    fill(ldout, N * C, -1, 1);
    layernorm_forward(lout, mean, rstd, inp, lw, lb, N, C);
    layernorm_backward(ldinp, ldw, ldb, ldout, inp, lw, mean, rstd, N, C);
    float *i1 = fcopy(ldinp, N * C), *w1 = fcopy(ldw, C), *b1 = fcopy(ldb, C);
    layernorm_backward(ldinp, ldw, ldb, ldout, inp, lw, mean, rstd, N, C);
    ck_assert(all_close_twice(i1, ldinp, N * C) && all_close_twice(w1, ldw, C) &&
              all_close_twice(b1, ldb, C));
    free(i1); free(w1); free(b1);

    /* embedding and position: dwte, dwpe accumulate */
    int tokens[N];
    for (int n = 0; n < N; n++) tokens[n] = (int)(urand() * V);
    float *dwte = falloc(V * C), *dwpe = falloc(T * C), *edout = falloc(N * C);
    fill(edout, N * C, -1, 1);
    embedding_backward(dwte, edout, tokens, N, C, 0, V);
    position_backward(dwpe, edout, B, T, C);
    float *e1 = fcopy(dwte, V * C), *p1 = fcopy(dwpe, T * C);
    embedding_backward(dwte, edout, tokens, N, C, 0, V);
    position_backward(dwpe, edout, B, T, C);
    ck_assert(all_close_twice(e1, dwte, V * C) && all_close_twice(p1, dwpe, T * C));
    free(e1); free(p1);

    /* attention's dqkv, gelu's dinp, crossentropy's dlogits: overwritten, whatever was
     * there before (also covered by the NaN-filled buffers in the op tests) */
    size_t nqkv = (size_t)N * 3 * C, natt = (size_t)B * NH * T * T;
    float *qkv = falloc(nqkv), *aout = falloc(N * C), *att = falloc(natt),
          *dqkv1 = falloc(nqkv), *dqkv2 = falloc(nqkv), *datt = falloc(natt);
    fill(qkv, nqkv, -2, 2);
    attention_forward(aout, att, qkv, B, T, C, NH);
    attention_backward(dqkv1, datt, edout, qkv, att, B, T, C, NH);
    fill(dqkv2, nqkv, -9, 9);
    fill(datt, natt, -9, 9);
    attention_backward(dqkv2, datt, edout, qkv, att, B, T, C, NH);
    ck_assert(memcmp(dqkv1, dqkv2, nqkv * sizeof(float)) == 0);

    float *gd1 = falloc(N * C), *gd2 = falloc(N * C);
    gelu_backward(gd1, inp, edout, N * C);
    fill(gd2, N * C, -9, 9);
    gelu_backward(gd2, inp, edout, N * C);
    ck_assert(memcmp(gd1, gd2, N * C * sizeof(float)) == 0);

    int targets[N];
    for (int n = 0; n < N; n++) targets[n] = (int)(urand() * C);
    float *probs = falloc(N * C), *losses = falloc(N), *dl1 = falloc(N * C),
          *dl2 = falloc(N * C);
    crossentropy_forward(losses, probs, inp, targets, N, C);
    crossentropy_backward(dl1, probs, targets, 0.5f, N, C);
    fill(dl2, N * C, -9, 9);
    crossentropy_backward(dl2, probs, targets, 0.5f, N, C);
    ck_assert(memcmp(dl1, dl2, N * C * sizeof(float)) == 0);

    printf("conventions: parameter grads and layernorm dinp accumulate, input grads "
           "are overwritten\n");
    fflush(stdout);
    free(inp); free(w); free(dout); free(dinp1); free(dinp2); free(dw); free(db);
    free(lw); free(lb); free(lout); free(mean); free(rstd); free(ldout); free(ldinp);
    free(ldw); free(ldb); free(dwte); free(dwpe); free(edout); free(qkv); free(aout);
    free(att); free(dqkv1); free(dqkv2); free(datt); free(gd1); free(gd2); free(probs);
    free(losses); free(dl1); free(dl2);
}
END_TEST

/* ---- determinism at the model's shapes ------------------------------------------- */

/* The same inputs twice give bit-identical outputs, at shapes where sgemm blocks and the
 * causal row blocks all come into play. */
START_TEST(test_determinism) {
    enum { B = 2, T = 80, C = 64, NH = 4, N = B * T, OC = 3 * C };
    rng_seed(14);
    size_t nqkv = (size_t)N * 3 * C, natt = (size_t)B * NH * T * T;
    float *x = falloc(N * C), *w = falloc(OC * C), *bias = falloc(OC),
          *dout = falloc(N * C);
    fill(x, N * C, -1, 1);
    fill(w, OC * C, -0.3, 0.3);
    fill(bias, OC, -1, 1);
    fill(dout, N * C, -1, 1);
    float *res[2][5];
    for (int r = 0; r < 2; r++) {
        float *qkv = falloc(nqkv), *out = falloc(N * C), *att = falloc(natt),
              *dqkv = falloc(nqkv), *datt = falloc(natt), *dx = falloc(N * C),
              *dw = falloc(OC * C), *db = falloc(OC);
        linear_forward(qkv, x, w, bias, N, C, OC);
        attention_forward(out, att, qkv, B, T, C, NH);
        attention_backward(dqkv, datt, dout, qkv, att, B, T, C, NH);
        linear_backward(dx, dw, db, dqkv, x, w, N, C, OC);
        res[r][0] = out; res[r][1] = dqkv; res[r][2] = dx; res[r][3] = dw; res[r][4] = db;
        free(qkv); free(att); free(datt);
    }
    size_t sizes[5] = {N * C, nqkv, N * C, OC * C, OC};
    for (int i = 0; i < 5; i++) {
        ck_assert_msg(memcmp(res[0][i], res[1][i], sizes[i] * sizeof(float)) == 0,
                      "result %d differs between two identical runs", i);
        free(res[0][i]);
        free(res[1][i]);
    }
    printf("determinism (linear + attention, T=80): bit-identical\n");
    fflush(stdout);
    free(x); free(w); free(bias); free(dout);
}
END_TEST

/* ---- vectors and transfers ------------------------------------------------------- */

START_TEST(test_vectors) {
    enum { n = 1003 };   /* not a multiple of any vector width */
    rng_seed(15);
    float *a = falloc(n), *b = falloc(n), *y = falloc(n), *host = falloc(n);
    fill(a, n, -1, 1);
    fill(b, n, -1, 1);

    residual_forward(y, a, b, n);
    for (int i = 0; i < n; i++) ck_assert(y[i] == a[i] + b[i]);
    vec_add(y, a, n);
    for (int i = 0; i < n; i++) ck_assert(y[i] == (a[i] + b[i]) + a[i]);
    vec_scale(y, 0.5f, n);
    for (int i = 0; i < n; i++) ck_assert(y[i] == ((a[i] + b[i]) + a[i]) * 0.5f);
    vec_copy(y, b, n);
    ck_assert(memcmp(y, b, n * sizeof(float)) == 0);

    double s = 0.0;
    for (int i = 0; i < n; i++) s += a[i];
    double got = vec_sum(a, n);
    report("vec_sum", fabs(got - s), 1e-12);

    vec_zero(y, n);
    for (int i = 0; i < n; i++) ck_assert(y[i] == 0.0f);

    ops_upload(y, a, n * sizeof(float));
    ops_synchronize();
    ops_download(host, y, n * sizeof(float));
    ops_synchronize();
    ck_assert(memcmp(host, a, n * sizeof(float)) == 0);
    free(a); free(b); free(y); free(host);
}
END_TEST

/* ---- runner ---------------------------------------------------------------------- */

static Suite *ops_suite(void) {
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 60);   /* sanitizer builds are slow */
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_embedding_vocab_slice);
    tcase_add_test(tc, test_position);
    tcase_add_test(tc, test_layernorm);
    tcase_add_test(tc, test_linear);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_long);
    tcase_add_test(tc, test_attention_causal);
    tcase_add_test(tc, test_gelu);
    tcase_add_test(tc, test_gelu_dense);
    tcase_add_test(tc, test_crossentropy);
    tcase_add_test(tc, test_crossentropy_inplace);
    tcase_add_test(tc, test_adamw);
    tcase_add_test(tc, test_adamw_warmup);
    tcase_add_test(tc, test_accumulate_overwrite);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_vectors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    openblas_set_num_threads(1);   /* one thread, as the program runs it */
    return check_run(ops_suite(), 0);
}
