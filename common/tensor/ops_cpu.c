/* CPU implementation of ops.h. Every matmul goes to OpenBLAS (cblas_sgemm), the linears'
 * to oneDNN instead when the process's engine is oneDNN (matmul_engine.h); the rest
 * are plain loops written so that gcc -O3 -march=native vectorises them. Nothing here
 * allocates (but oneDNN's first call of a shape, which makes its primitive), spawns
 * threads or depends on timing, so equal inputs give bit-identical outputs (OpenBLAS
 * runs single-threaded: the program sets that once). */
#include "ops_cpu.h"

#include "exp_float.h"
#include "matmul_engine.h"
#include "matmul_f32.h"
#include "ops_observe.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------- */

/* Reductions use LANES independent accumulators: gcc will not vectorise a serial float
 * sum (that would reorder it), but it does vectorise lanes, and the order stays fixed. */
#define LANES 8

/* Sum of x[0..n) in double. */
static double sum_f(const float *x, int n) {
    double acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    double s = 0.0;
    for (; i < n; i++) s += x[i];
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* Sum of x[i]*y[i] in double. */
static double dot_f(const float *x, const float *y, int n) {
    double acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += (double)x[i + j] * y[i + j];
    double s = 0.0;
    for (; i < n; i++) s += (double)x[i] * y[i];
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* Largest of x[0..n). NaNs are skipped here but still poison the softmax that uses the
 * maximum, so they are not hidden. */
static float max_f(const float *x, int n) {
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int j = 0; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

/* dst[c] += sum over rows r of x[r*ld + c], accumulated in double so that summing many
 * rows loses nothing. Rows are read whole and in order (a column walk would stride by
 * ld and thrash the cache); the accumulators, COLCHUNK of them, stay in L1. */
#define COLCHUNK 1024
_Static_assert(COLCHUNK == CPU_LAYERNORM_SUM_MAX_C, "layer norm's sums: one width");
static void add_column_sums(float *dst, const float *x, int rows, int cols, size_t ld) {
    for (int c0 = 0; c0 < cols; c0 += COLCHUNK) {
        int w = cols - c0 < COLCHUNK ? cols - c0 : COLCHUNK;
        double acc[COLCHUNK];
        for (int j = 0; j < w; j++) acc[j] = 0.0;
        for (int r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * ld + c0;
            for (int j = 0; j < w; j++) acc[j] += xr[j];
        }
        for (int j = 0; j < w; j++) dst[c0 + j] += (float)acc[j];
    }
}

/* The clamp bounds of exp_d and exp_f are read through volatiles. With constant bounds
 * gcc folds the clamped branch to a constant, and since under -ftrapping-math it may not
 * then compute the polynomial speculatively, the whole loop stays scalar (4x slower). */
static volatile double exp_lo_bound = -700.0, exp_hi_bound = 700.0;
static volatile float expf_lo_bound = EXP_F_LO, expf_hi_bound = EXP_F_HI;

/* fma() where the CPU has it (faster and one rounding fewer); where it does not, fma()
 * would be a slow library call, so plain multiply-add. */
#ifdef __FP_FAST_FMA
#define MADD(a, b, c) fma(a, b, c)
#else
#define MADD(a, b, c) ((a) * (b) + (c))
#endif

/* e^x in double with relative error ~1e-10 on [lo, hi] (x is clamped there; NaN stays
 * NaN): x = n ln2 + r with |r| <= ln2/2; e^r by the degree-7 polynomial interpolating it
 * at the Chebyshev nodes of that interval (relative error < 6e-11, below Taylor's to
 * degree 8 with one term less); 2^n put straight into the exponent bits. Rounded to
 * float this is the correctly rounded e^x except in rare near-ties (0.02%, then 1 ulp
 * off), and unlike expf() it vectorises. lo and hi must lie within about +-700. */
static inline double exp_d(double x, double lo, double hi) {
    x = x < lo ? lo : x;
    x = x > hi ? hi : x;
    const double shift = 0x1.8p52;   /* adding it rounds to an integer in the low bits */
    double t = MADD(x, 1.4426950408889634, shift);   /* x / ln2 */
    double n = t - shift;
    double r = MADD(-n, 0.6931471805599453, x);
    double p = 0.00019907569629271373;
    p = MADD(p, r, 0.00139485783305163);
    p = MADD(p, r, 0.008333283538018982);
    p = MADD(p, r, 0.04166621831919977);
    p = MADD(p, r, 0.16666666786313042);
    p = MADD(p, r, 0.5000000107729227);
    p = MADD(p, r, 0.9999999999955084);
    p = MADD(p, r, 0.9999999999595617);
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits + 1023) << 52;      /* the low bits of t hold n: exponent field n+1023 */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* len rounded up to a whole number of LANES, but not past width. */
static int lane_padded(int len, int width) {
    const int padded = (len + LANES - 1) / LANES * LANES;
    return padded < width ? padded : width;
}

/* In-place softmax of row[0..len), and zeros in row[len..width): the attention rows'
 * masked part and the tail of a causal row must read as zero downstream. The loops
 * run over len rounded up to LANES, the masked places set to -FLT_MAX first (their
 * exp is exactly 0 in float), so that a short causal row vectorises whole instead of
 * ending in scalar tails: at T = 64 the average row is 32 long. e^x stays exp_d's here:
 * exp_float.h's measured no faster on bench256's attention (rows this short, the
 * sgemms around them), and it changed the bf16 loss curves' bits for nothing. */
static void softmax_row(float *row, int len, int width, double lo, double hi) {
    const int padded = lane_padded(len, width);
    for (int j = len; j < padded; j++) row[j] = -FLT_MAX;
    double mx = max_f(row, padded);
    for (int j = 0; j < padded; j++) row[j] = (float)exp_d((double)row[j] - mx, lo, hi);
    double inv = 1.0 / sum_f(row, padded);
    for (int j = 0; j < padded; j++) row[j] = (float)(row[j] * inv);
    for (int j = padded; j < width; j++) row[j] = 0.0f;
}

/* ---- embeddings ------------------------------------------------------------------ */

void cpu_embedding_forward(float *out, const int *tokens, const float *wte, int N, int C,
                           int vocab_start, int vocab_len) {
    for (int n = 0; n < N; n++) {
        /* unsigned compare: one test for both ends of the slice */
        unsigned row = (unsigned)(tokens[n] - vocab_start);
        float *o = out + (size_t)n * C;
        if (row < (unsigned)vocab_len)
            memcpy(o, wte + (size_t)row * C, (size_t)C * sizeof(float));
        else
            memset(o, 0, (size_t)C * sizeof(float));
    }
}

void cpu_embedding_backward(float *dwte, const float *dout, const int *tokens, int N,
                            int C, int vocab_start, int vocab_len) {
    /* rows in token order: a repeated token always sums in the same order */
    for (int n = 0; n < N; n++) {
        unsigned row = (unsigned)(tokens[n] - vocab_start);
        if (row >= (unsigned)vocab_len) continue;
        float *d = dwte + (size_t)row * C;
        const float *g = dout + (size_t)n * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

void cpu_position_forward(float *out, const float *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++) {
        float *o = out + (size_t)b * T * C;
        for (size_t i = 0; i < (size_t)T * C; i++) o[i] += wpe[i];
    }
}

void cpu_position_backward(float *dwpe, const float *dout, int B, int T, int C) {
    for (int t = 0; t < T; t++)
        add_column_sums(dwpe + (size_t)t * C, dout + (size_t)t * C, B, C, (size_t)T * C);
}

/* ---- layer norm ------------------------------------------------------------------ */

#define LN_EPS 1e-5

void cpu_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                           const float *weight, const float *bias, int N, int C) {
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        /* two passes in double: no cancellation in the variance */
        double mu = sum_f(x, C) / C;
        double acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int j = 0; j < LANES; j++) {
                double d = x[i + j] - mu;
                acc[j] += d * d;
            }
        double var = 0.0;
        for (; i < C; i++) var += (x[i] - mu) * (x[i] - mu);
        for (int j = 0; j < LANES; j++) var += acc[j];
        var /= C;
        /* the output uses the stored float mean and rstd, exactly as backward will */
        float m = (float)mu, s = (float)(1.0 / sqrt(var + LN_EPS));
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

/* dx row n += rstd * (g - mean(g) - xhat * mean(g*xhat)), g = dout*weight,
 * xhat = (x-mean)*rstd. With sum_b and sum_w (C doubles each, or NULL), the row's
 * dbias and dweight terms are added there too, so that the row is read once. */
static void layernorm_backward_row(float *dx, const float *dy, const float *x,
                                   const float *weight, float m, float s, int C,
                                   double *sum_b, double *sum_w) {
    double sg = dot_f(dy, weight, C);
    /* lanes again; fused with the sum above, gcc would not vectorise it */
    double acc[LANES] = {0}, sgx = 0.0;
    int i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int j = 0; j < LANES; j++)
            acc[j] += (double)(dy[i + j] * weight[i + j]) * ((x[i + j] - m) * s);
    for (; i < C; i++) sgx += (double)(dy[i] * weight[i]) * ((x[i] - m) * s);
    for (int j = 0; j < LANES; j++) sgx += acc[j];
    float mg = (float)(sg / C), mgx = (float)(sgx / C);
    for (int c = 0; c < C; c++) {
        float xhat = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - mg - xhat * mgx);
    }
    if (!sum_b) return;
    for (int c = 0; c < C; c++) {
        sum_b[c] += dy[c];
        sum_w[c] += (double)dy[c] * ((x[c] - m) * s);
    }
}

void cpu_layernorm_backward_rows(float *dinp, const float *dout, const float *inp,
                                 const float *weight, const float *mean, const float *rstd,
                                 int N, int C, double *sum_b, double *sum_w) {
    for (int n = 0; n < N; n++)
        layernorm_backward_row(dinp + (size_t)n * C, dout + (size_t)n * C,
                               inp + (size_t)n * C, weight, mean[n], rstd[n], C, sum_b,
                               sum_w);
}

void cpu_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, const float *mean,
                            const float *rstd, int N, int C) {
    /* dweight and dbias are column sums over all rows, in double and in row order (see
     * add_column_sums). Rows up to COLCHUNK wide add them in the row pass, while the
     * row is in L1; wider rows (whose sums would not stay in L1) in passes of their own.
     * The order of every sum is the same both ways. */
    const int fused = C <= COLCHUNK;
    double sum_b[COLCHUNK], sum_w[COLCHUNK];
    if (fused)
        for (int c = 0; c < C; c++) sum_b[c] = sum_w[c] = 0.0;
    cpu_layernorm_backward_rows(dinp, dout, inp, weight, mean, rstd, N, C,
                                fused ? sum_b : NULL, fused ? sum_w : NULL);
    if (fused) {
        for (int c = 0; c < C; c++) {
            dbias[c] += (float)sum_b[c];
            dweight[c] += (float)sum_w[c];
        }
        return;
    }
    add_column_sums(dbias, dout, N, C, (size_t)C);
    for (int c0 = 0; c0 < C; c0 += COLCHUNK) {
        int w = C - c0 < COLCHUNK ? C - c0 : COLCHUNK;
        double acc[COLCHUNK];
        for (int j = 0; j < w; j++) acc[j] = 0.0;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C + c0, *dy = dout + (size_t)n * C + c0;
            float m = mean[n], s = rstd[n];
            for (int j = 0; j < w; j++) acc[j] += (double)dy[j] * ((x[j] - m) * s);
        }
        for (int j = 0; j < w; j++) dweight[c0 + j] += (float)acc[j];
    }
}

/* ---- linear ---------------------------------------------------------------------- */

/* cblas_sgemm, row-major, told to the thread's watchers (a profiler wants the shapes). */
static void sgemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                  float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                  float *Cm, int ldc) {
    ops_gemm_begin(ta == CblasTrans, tb == CblasTrans, M, N, K);
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
    ops_gemm_end();
}

/* A product with a layer's weight as B (beta 0 or 1, alpha 1) on the process's engine:
 * oneDNN keeps the weight in its own layout between weight updates. The weight gradient
 * (dout^T inp, no weight operand) stays on OpenBLAS: oneDNN 2.6's AVX2 sgemm ran that
 * transposed product at 40-70 GFLOP/s against OpenBLAS's 93 (bench256's shapes, one
 * core, AMD EPYC without AVX-512). */
static void weight_gemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N,
                        int K, const float *A, int lda, const float *B, int ldb, float beta,
                        float *Cm, int ldc) {
    if (matmul_engine_current() == MATMUL_OPENBLAS) {
        sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, Cm, ldc);
        return;
    }
    ops_gemm_begin(ta == CblasTrans, tb == CblasTrans, M, N, K);
    matmul_f32(ta == CblasTrans, tb == CblasTrans, M, N, K, A, lda, B, ldb, beta, Cm, ldc, 1);
    ops_gemm_end();
}

void cpu_linear_forward(float *out, const float *inp, const float *weight,
                        const float *bias, int N, int IC, int OC) {
    if (N <= 0 || OC <= 0) return;
    float beta = 0.0f;
    if (bias) {
        /* start from the bias and let sgemm add onto it (beta 1): no second pass */
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    weight_gemm(CblasNoTrans, CblasTrans, N, OC, IC, inp, IC, weight, IC, beta, out, OC);
}

void cpu_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int N, int IC, int OC) {
    if (N <= 0) return;
    if (dinp)   /* dinp[N,IC] = dout[N,OC] @ weight[OC,IC] */
        weight_gemm(CblasNoTrans, CblasNoTrans, N, IC, OC, dout, OC, weight, IC, 0.0f, dinp,
                    IC);
    if (dweight)   /* dweight[OC,IC] += dout^T @ inp */
        sgemm(CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight,
              IC);
    if (dbias) add_column_sums(dbias, dout, N, OC, (size_t)OC);
}

/* ---- attention ------------------------------------------------------------------- */

/* Causality is exploited in row blocks: rows [r0,r1) of the scores only need keys
 * [0,r1), and the products with V and K only sum over those. Smaller blocks skip more
 * of the masked half but make more, smaller sgemm calls; at T = 64 blocks of 32
 * measured ~15% faster than one block of 64. Blocks of 16 at T <= 64 measured 3-14%
 * faster for a layer (about 1% of bench256's step), but they change the order of every
 * run's sums at ctx 64, and the default model's 200-step bf16 loss curve then sat at
 * 0.098 of its 0.1 nat band with its negative control inside it (measured when that
 * 4-layer curve was the one tested): kept at 32. */
#define ATT_BLOCK 32

/* Cm = alpha op(A) op(B), row-major. Zeroing Cm here and asking for beta = 1 gives the
 * same bits as beta = 0 and measured ~10% faster on the attention's small, strided
 * blocks, where OpenBLAS's own beta = 0 pass over C is slow. */
static void gemm(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                 float alpha, const float *A, int lda, const float *B, int ldb, float *Cm,
                 int ldc) {
    for (int i = 0; i < M; i++)
        memset(Cm + (size_t)i * ldc, 0, (size_t)N * sizeof(float));
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, Cm, ldc);
}

void cpu_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C,
                           int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const double lo = exp_lo_bound, hi = exp_hi_bound;
    const int block = ATT_BLOCK;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            /* Q, K, V of this head, read in place from qkv (leading dimension 3C) */
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += block) {
                const int r1 = r0 + block < T ? r0 + block : T, nr = r1 - r0;
                float *ab = a + (size_t)r0 * T;
                /* scores[r0:r1, 0:r1] = scale * Q K^T */
                gemm(CblasNoTrans, CblasTrans, nr, r1, hs, scale, q + (size_t)r0 * C3, C3,
                     k, C3, ab, T);
                for (int t = r0; t < r1; t++)
                    softmax_row(a + (size_t)t * T, t + 1, T, lo, hi);
                /* out[r0:r1] = att[r0:r1, 0:r1] @ V[0:r1] (the masked part is zero) */
                gemm(CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f, ab, T, v, C3,
                     o + (size_t)r0 * C, C);
            }
        }
}

void cpu_attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                            const float *att, int B, int T, int C, int NH) {
    const int hs = C / NH, C3 = 3 * C;
    const float scale = (float)(1.0 / sqrt((double)hs));
    const int block = ATT_BLOCK;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs;
            float *dk = dq + C, *dv = dq + 2 * C;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *da = datt + ((size_t)b * NH + h) * T * T;
            const float *dy = dout + (size_t)b * T * C + h * hs;
            for (int r0 = 0; r0 < T; r0 += block) {
                const int r1 = r0 + block < T ? r0 + block : T, nr = r1 - r0;
                /* datt[r0:r1, 0:r1] = dout V^T */
                gemm(CblasNoTrans, CblasTrans, nr, r1, hs, 1.0f, dy + (size_t)r0 * C, C,
                     v, C3, da + (size_t)r0 * T, T);
                /* through the softmax, in place: dpre = att * (datt - sum(att * datt));
                 * the rest of the row is zeroed for the sgemms below */
                for (int t = r0; t < r1; t++) {
                    const float *ar = a + (size_t)t * T;
                    float *dr = da + (size_t)t * T;
                    /* over whole lanes, as the forward: att is 0 past t */
                    const int padded = lane_padded(t + 1, T);
                    float s = (float)dot_f(ar, dr, padded);
                    for (int j = 0; j < padded; j++) dr[j] = ar[j] * (dr[j] - s);
                    for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
                }
                /* dq[r0:r1] = scale * dpre[r0:r1, 0:r1] @ K[0:r1] */
                gemm(CblasNoTrans, CblasNoTrans, nr, hs, r1, scale, da + (size_t)r0 * T,
                     T, k, C3, dq + (size_t)r0 * C3, C3);
            }
            /* key/value rows [c0,c1) receive from query rows [c0,T) only */
            for (int c0 = 0; c0 < T; c0 += block) {
                const int c1 = c0 + block < T ? c0 + block : T, nc = c1 - c0;
                const size_t blk = (size_t)c0 * T + c0;   /* [c0, c0] of att / dpre */
                /* dv[c0:c1] = att[c0:T, c0:c1]^T @ dout[c0:T] */
                gemm(CblasTrans, CblasNoTrans, nc, hs, T - c0, 1.0f, a + blk, T,
                     dy + (size_t)c0 * C, C, dv + (size_t)c0 * C3, C3);
                /* dk[c0:c1] = scale * dpre[c0:T, c0:c1]^T @ Q[c0:T] */
                gemm(CblasTrans, CblasNoTrans, nc, hs, T - c0, scale, da + blk, T,
                     q + (size_t)c0 * C3, C3, dk + (size_t)c0 * C3, C3);
            }
        }
}

/* ---- GELU ------------------------------------------------------------------------ */

/* 0.5 x (1 + tanh(u)) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): one exp
 * and no cancellation for negative x. It runs in double so that the float result is the
 * correctly rounded one (but for rare near-ties): in float, the rounding of u alone puts
 * the negative tail tens of ulp off, for about half the time of this version. With -2u
 * and its range reduction in double and the rest in float (exp_float.h's polynomial),
 * GELU was 3.1 ulp (2.2e-7 relative) off on test_ops's 2^20 points, over its 1.2e-7,
 * and a float GELU that ignores the tail measured only 1.5x faster than this one. */
#define GELU_K0 0.7978845608028654   /* sqrt(2/pi) */
#define GELU_K1 0.044715

/* -2u = x (a + b x^2): the constants folded, one multiply-add and two multiplies in
 * place of six operations (in double, the different rounding of u is far below the
 * float result's). */
static inline double gelu_minus_2u(double x) {
    const double a = -2.0 * GELU_K0, b = -2.0 * GELU_K0 * GELU_K1;
    return x * MADD(b, x * x, a);
}

void cpu_gelu_forward(float *out, float *x, size_t n) {
    const double lo = exp_lo_bound, hi = exp_hi_bound;
    const double c = 2.0 * GELU_K0, d = 6.0 * GELU_K0 * GELU_K1;   /* 2u' = c + d x^2 */
    for (size_t i = 0; i < n; i++) {
        /* with s = 1/(1+e), e = e^(-2u): gelu = x s, and
         * gelu' = d/dx [x s] = s + 2 x u' e s^2 (e s = 1 - s) */
        double v = x[i];
        double e = exp_d(gelu_minus_2u(v), lo, hi);
        double s = 1.0 / (1.0 + e);
        out[i] = (float)(v * s);
        x[i] = (float)MADD(v * MADD(d, v * v, c), e * s * s, s);
    }
}

void cpu_gelu_backward(float *dinp, const float *dgelu, const float *dout, size_t n) {
    for (size_t i = 0; i < n; i++) dinp[i] = dgelu[i] * dout[i];
}

/* ---- cross-entropy --------------------------------------------------------------- */

void cpu_crossentropy_forward(float *losses, float *probs, const float *logits,
                              const int *targets, int N, int V) {
    const float lo = expf_lo_bound, hi = expf_hi_bound;
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        /* read what the loss needs before an in-place softmax overwrites it */
        const float mx = max_f(x, V);
        const double xt = x[targets[n]];
        if (p != x) memcpy(p, x, (size_t)V * sizeof(float));
        for (int j = 0; j < V; j++) p[j] = exp_f_diff(p[j], mx, lo, hi);
        const double sum = sum_f(p, V);
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < V; j++) p[j] *= inv;
        /* -log softmax from the logits: accurate even where the probability underflows */
        losses[n] = (float)(log(sum) - (xt - mx));
    }
}

void cpu_crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                               float dloss, int N, int V) {
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        int t = targets[n];
        float pt = p[t];   /* before an in-place write */
        for (int j = 0; j < V; j++) d[j] = p[j] * dloss;
        d[t] = (pt - 1.0f) * dloss;
    }
}

/* ---- AdamW ----------------------------------------------------------------------- */

void cpu_adamw_update(float *params, const float *grads, float *m, float *v, size_t n,
                      const adamw_config *cfg, int step) {
    matmul_weights_changed();   /* the weights' kept oneDNN layouts are stale from here */
    const float b1 = cfg->beta1, b2 = cfg->beta2, c1 = 1.0f - b1, c2 = 1.0f - b2;
    /* lr * mhat / (sqrt(vhat) + eps) = step_size * m / (sqrt(v) / sqrt(bc2) + eps), the
     * way PyTorch computes it: one division per element instead of three */
    const double bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    const float step_size = (float)(cfg->lr / bc1);
    const float inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    const float eps = cfg->eps, lr_wd = cfg->lr * cfg->weight_decay;
    /* one vectorised pass: each element's four values are read and three written once */
    for (size_t i = 0; i < n; i++) {
        const float g = grads[i];
        const float mi = b1 * m[i] + c1 * g, vi = b2 * v[i] + c2 * g * g;
        m[i] = mi;
        v[i] = vi;
        /* decoupled decay: lr * wd * p, from the old p */
        params[i] -= step_size * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps) + lr_wd * params[i];
    }
}

/* ---- vectors --------------------------------------------------------------------- */

void cpu_vec_zero(float *x, size_t n) { memset(x, 0, n * sizeof(float)); }

void cpu_vec_copy(float *dst, const float *src, size_t n) {
    if (dst != src) memmove(dst, src, n * sizeof(float));
}

void cpu_vec_add(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

void cpu_residual_forward(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_vec_scale(float *x, float alpha, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= alpha;
}

double cpu_vec_sum(const float *x, size_t n) {
    /* in chunks, so that sizes beyond INT_MAX work with the int-sized helper */
    double s = 0.0;
    for (size_t i = 0; i < n; i += 1u << 30) {
        size_t w = n - i < (1u << 30) ? n - i : (1u << 30);
        s += sum_f(x + i, (int)w);
    }
    return s;
}

/* ---- host <-> device: on the CPU the device is the host -------------------------- */

void cpu_ops_upload(void *device_dst, const void *host_src, size_t bytes) {
    if (bytes) memcpy(device_dst, host_src, bytes);
}

void cpu_ops_download(void *host_dst, const void *device_src, size_t bytes) {
    if (bytes) memcpy(host_dst, device_src, bytes);
}

void cpu_ops_synchronize(void) {}
