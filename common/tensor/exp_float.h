/* e^x for x <= 0 in float arithmetic, for the cross-entropy's softmax: static inline so
 * that gcc vectorises the loops that call it at float width (8 lanes with AVX2, where
 * exp_d in double has 4).
 *
 * x is given as an unevaluated sum hi + lo: a softmax's x - max is not exact in float
 * (|x - max| up to ~100 has ulps of 2^-17), and e^x's relative error is the absolute
 * error of x, so a rounded difference alone would put small probabilities tens of ulp
 * off. exp_f_diff forms the exact difference with two_diff and calls exp_f.
 *
 * Error: within 1 ulp of e^(hi + lo) wherever the result is a normal float (the
 * reduction adds <= 2^-26 to r, the polynomial 4.5e-9, its last rounding 0.5 ulp);
 * subnormal results are rounded once from a normal one; 0 below hi = -106, where
 * e^x < 2^-150. NaN stays NaN. */
#ifndef EXP_FLOAT_H
#define EXP_FLOAT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __FP_FAST_FMAF
#define MADDF(a, b, c) fmaf(a, b, c)
#else
#define MADDF(a, b, c) ((a) * (b) + (c))
#endif

/* Below it e^x rounds to 0 in float, lo as large as its clamp (+1) included:
 * e^(-106 + 1) < 2^-150. Above 0 (a softmax's x - max never is) 2^n's halves below
 * would overflow. */
#define EXP_F_LO (-106.0f)
#define EXP_F_HI 0.0f

/* hi + lo = a - b exactly, hi the rounded difference (Knuth's TwoSum: no condition on
 * the magnitudes, which a softmax's x and max do not meet). */
static inline float two_diff(float a, float b, float *lo) {
    float hi = a - b;
    float bv = a - hi;             /* the part of b that made it into hi */
    float av = hi + bv;            /* the part of a */
    *lo = (a - av) + (bv - b);
    return hi;
}

/* e^(hi + lo), |lo| <= ulp(hi). lo_bound and hi_bound are EXP_F_LO and EXP_F_HI read
 * by the caller through volatiles (ops_cpu.c says why: constant clamps keep gcc from
 * vectorising). */
static inline float exp_f(float hi, float lo, float lo_bound, float hi_bound) {
    /* |lo| < 1 but where two_diff met an infinity (NaN there; the result is then 0).
     * Compares, not fminf/fmaxf: gcc leaves a loop with those scalar. */
    lo = lo > -1.0f ? lo : -1.0f;
    lo = lo < 1.0f ? lo : 1.0f;
    hi = hi < lo_bound ? lo_bound : hi;
    hi = hi > hi_bound ? hi_bound : hi;
    /* hi = n ln2 + r, |r| <= ln2/2: n*LN2_HI is exact (n has 8 bits, LN2_HI 15), and so
     * is hi - n*LN2_HI (it is < 1 and has no bit below hi's); the rest rounds once */
    const float shift = 0x1.8p23f;   /* adding it rounds to an integer in the low bits */
    const float LN2_HI = 0x1.62e4p-1f, LN2_LO = 0x1.7f7d1cp-20f;
    float t = MADDF(hi, 0x1.715476p+0f, shift);   /* hi / ln2 */
    float n = t - shift;
    float r = MADDF(-n, LN2_HI, hi) + MADDF(-n, LN2_LO, lo);
    /* e^r = 1 + r + r^2 q(r): q minimax for relative error on |r| <= ln2/2 (4.5e-9 with
     * these float coefficients); the two leading ones exact */
    float p = 0x1.6a22e4p-10f;
    p = MADDF(p, r, 0x1.123a4cp-7f);
    p = MADDF(p, r, 0x1.5558f4p-5f);
    p = MADDF(p, r, 0x1.55549p-3f);
    p = MADDF(p, r, 0x1.fffffcp-2f);
    p = MADDF(p, r, 1.0f);
    p = MADDF(p, r, 1.0f);
    /* 2^n = 2^(n + 64) 2^-64, the first a normal float for n in [-153, 0]: a subnormal
     * result is rounded once, by the last product. t's low bits hold n; the exponent
     * field of 2^(n + 64) is n + 64 + 127. */
    uint32_t bits;
    memcpy(&bits, &t, sizeof bits);
    bits = (bits - (0x4b400000u - 64u - 127u)) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale * 0x1p-64f;
}

/* e^(a - b), the difference taken exactly. */
static inline float exp_f_diff(float a, float b, float lo_bound, float hi_bound) {
    float lo, hi = two_diff(a, b, &lo);
    return exp_f(hi, lo, lo_bound, hi_bound);
}

#endif
