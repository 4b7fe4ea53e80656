/* The two FP8 formats of FP8 training, as numbers: what they can hold and how an fp32
 * value rounds into them.
 *
 *   E4M3  4 exponent bits (bias 7), 3 mantissa bits: +-448 at most, normal down to
 *         2^-6, subnormal down to 2^-9; no infinity, one NaN code a sign (S.1111.111).
 *         Forward tensors (activations, weights): more precision, less range.
 *   E5M2  5 exponent bits (bias 15), 2 mantissa bits: +-57344, normal down to 2^-14,
 *         subnormal down to 2^-16; infinities and NaNs as in fp16. Gradients in the
 *         "hybrid" recipe: range before precision.
 *
 * Encoding rounds to nearest, ties to even, and saturates: a finite value (or an
 * infinity) past the format's max becomes +-max, as FP8 training converts (an inf would
 * poison every sum it enters); a NaN stays a NaN. Below the smallest normal the grid is
 * the subnormals', evenly spaced. The element conversions are number_formats.h's.
 * This machine has no FP8 arithmetic: these are exact models of the formats, for
 * accuracy and bytes, never for speed. */
#ifndef FP8_H
#define FP8_H
#include <stddef.h>
#include <stdint.h>

typedef enum { FP8_E4M3, FP8_E5M2, FP8_FORMATS } fp8_format;

typedef struct {
    const char *name;             /* "e4m3", "e5m2" */
    int exponent_bits, mantissa_bits, bias;
    float max;                    /* largest finite value */
    float min_normal, min_subnormal;
    int has_infinity;
    int finite_codes;             /* of the 256: positive and negative, both zeros */
} fp8_format_info;

const fp8_format_info *fp8_info(fp8_format f);
/* The format named name ("e4m3", "e5m2"); -1 when there is none. */
int fp8_format_parse(const char *name, fp8_format *out);

uint8_t fp8_encode(fp8_format f, float x);
float fp8_decode(fp8_format f, uint8_t code);
/* All 256 codes decoded, table[code]. */
void fp8_decode_table(fp8_format f, float table[256]);

/* dst[i] = encode(src[i] * scale): the scale is applied before rounding (that is what
 * lets a tensor of any magnitude use the format's whole grid). */
void fp8_encode_scaled(fp8_format f, uint8_t *dst, const float *src, size_t n, float scale);

#endif
