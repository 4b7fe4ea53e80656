/* Names, sizes and whole-vector conversions of the run's precision (precision.h). */
#include "precision.h"

#include "number_formats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const precision_names[PRECISION_COUNT] = {"fp32", "bf16", "fp16"};

const char *precision_name(precision p) {
    return (unsigned)p < PRECISION_COUNT ? precision_names[p] : "?";
}

int precision_parse(const char *name, precision *out) {
    for (int p = 0; p < PRECISION_COUNT; p++)
        if (name && strcmp(name, precision_names[p]) == 0) {
            *out = (precision)p;
            return 0;
        }
    return -1;
}

size_t precision_bytes(precision p) { return p == PRECISION_FP32 ? 4 : 2; }

/* The loops below are the scalar conversions inlined: branch-free enough (selects) that
 * gcc vectorises them, 16 elements per AVX-512 instruction. */
void precision_f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = number_to_bf16(src[i]);
}

void precision_bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = number_from_bf16(src[i]);
}

void precision_f32_to_f16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = number_to_f16(src[i]);
}

void precision_f16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = number_from_f16(src[i]);
}

static void not_16_bits(const char *what, precision p) {
    fprintf(stderr, "%s: precision %s is not a 16-bit format\n", what, precision_name(p));
    exit(1);
}

void precision_to16(precision p, uint16_t *dst, const float *src, size_t n) {
    if (p == PRECISION_BF16)
        precision_f32_to_bf16(dst, src, n);
    else if (p == PRECISION_FP16)
        precision_f32_to_f16(dst, src, n);
    else
        not_16_bits("precision_to16", p);
}

void precision_from16(precision p, float *dst, const uint16_t *src, size_t n) {
    if (p == PRECISION_BF16)
        precision_bf16_to_f32(dst, src, n);
    else if (p == PRECISION_FP16)
        precision_f16_to_f32(dst, src, n);
    else
        not_16_bits("precision_from16", p);
}
