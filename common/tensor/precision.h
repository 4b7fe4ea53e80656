/* The precision a run computes in, and whole-vector conversions between fp32 and the
 * 16-bit formats that mixed precision keeps its compute copies in.
 *
 * fp32 is the default and the reference; bf16 keeps fp32's exponent range with 8 bits
 * of mantissa (no overflow where fp32 has none, so no loss scaling); fp16 keeps 11 bits
 * of mantissa but only 2^-24 .. 65504, so small gradients flush to zero and large
 * values overflow to inf (hence loss scaling). 16-bit values are held as uint16_t bit
 * patterns: C11 has no such types, and the bits are what the libraries take.
 *
 * Every conversion rounds to nearest even, keeps a NaN a NaN and an inf an inf; fp16
 * rounds to its subnormals below 2^-14 and overflows to inf from 65520 up. The element
 * conversions are number_formats.h's, the ones the wire and the GPU use, so a value
 * rounds to the same bits wherever it is rounded. */
#ifndef PRECISION_H
#define PRECISION_H
#include <stddef.h>
#include <stdint.h>

typedef enum { PRECISION_FP32, PRECISION_BF16, PRECISION_FP16, PRECISION_COUNT } precision;

const char *precision_name(precision p);   /* "fp32", "bf16", "fp16" */
/* The precision named name (as precision_name writes it); -1 when there is none. */
int precision_parse(const char *name, precision *out);
size_t precision_bytes(precision p);       /* bytes per element: 4, 2, 2 */

/* dst[n] = src[n] rounded (to16) or widened exactly (from16). The buffers must not
 * overlap. Plain loops that gcc -O3 vectorises. */
void precision_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void precision_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void precision_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void precision_f16_to_f32(float *dst, const uint16_t *src, size_t n);
/* The same for p = PRECISION_BF16 or PRECISION_FP16 (any other p is a caller's bug:
 * it exits with a message). */
void precision_to16(precision p, uint16_t *dst, const float *src, size_t n);
void precision_from16(precision p, float *dst, const uint16_t *src, size_t n);

#endif
