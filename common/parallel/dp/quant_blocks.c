/* Block quantisation, int8 and int4 with an fp32 scale a block (quant_blocks.h). */
#include "quant_blocks.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

int quant_levels(quant_bits bits) { return bits == QUANT_INT4 ? 7 : 127; }

static size_t blocks_of(size_t count, size_t block) { return (count + block - 1) / block; }

static size_t code_bytes(quant_bits bits, size_t count) {
    return bits == QUANT_INT4 ? (count + 1) / 2 : count;
}

size_t quant_encoded_bytes(quant_bits bits, size_t count, size_t block) {
    return blocks_of(count, block) * sizeof(float) + code_bytes(bits, count);
}

/* Code i of the payload: int8 as a byte, int4 in its nibble (the other kept). */
static void put_code(quant_bits bits, uint8_t *codes, size_t i, int q) {
    if (bits == QUANT_INT8) {
        codes[i] = (uint8_t)(int8_t)q;
        return;
    }
    const uint8_t nibble = (uint8_t)(q & 0xF), shift = (uint8_t)(i % 2 ? 4 : 0);
    codes[i / 2] = (uint8_t)((codes[i / 2] & ~(0xF << shift)) | (nibble << shift));
}

static int get_code(quant_bits bits, const uint8_t *codes, size_t i) {
    if (bits == QUANT_INT8) return (int8_t)codes[i];
    const int nibble = (codes[i / 2] >> (i % 2 ? 4 : 0)) & 0xF;
    return nibble >= 8 ? nibble - 16 : nibble;   /* two's complement, 4 bits */
}

void quant_encode(quant_bits bits, size_t block, const float *x, size_t count, void *out) {
    const int Q = quant_levels(bits);
    uint8_t *scales = out;   /* bytes: an encoding may start at any byte of a buffer */
    uint8_t *codes = (uint8_t *)out + blocks_of(count, block) * sizeof(float);
    if (bits == QUANT_INT4) memset(codes, 0, code_bytes(bits, count));
    for (size_t b = 0, at = 0; at < count; b++, at += block) {
        const size_t end = at + block < count ? at + block : count;
        float absmax = 0;
        for (size_t i = at; i < end; i++) absmax = fmaxf(absmax, fabsf(x[i]));
        const float scale = absmax / (float)Q;
        memcpy(scales + b * sizeof scale, &scale, sizeof scale);
        for (size_t i = at; i < end; i++) {
            const long q = scale > 0 ? lrintf(x[i] / scale) : 0;   /* ties to even */
            put_code(bits, codes, i, (int)(q > Q ? Q : q < -Q ? -Q : q));
        }
    }
}

void quant_decode(quant_bits bits, size_t block, const void *in, size_t count, float *x) {
    const uint8_t *scales = in;
    const uint8_t *codes = scales + blocks_of(count, block) * sizeof(float);
    float scale = 0;
    for (size_t i = 0; i < count; i++) {
        if (i % block == 0) memcpy(&scale, scales + i / block * sizeof scale, sizeof scale);
        x[i] = (float)get_code(bits, codes, i) * scale;
    }
}

/* Half a step, plus the roundings of x / scale (a relative FLT_EPSILON / 2 of up to Q
 * steps) and of q x scale (FLT_EPSILON / 2 of |x'| <= absmax). */
double quant_block_bound(quant_bits bits, float absmax) {
    const double Q = quant_levels(bits), step = (double)absmax / Q;
    return step / 2 + step * Q * FLT_EPSILON + (double)absmax * FLT_EPSILON;
}
