/* The FP8 formats' facts and conversions (fp8.h). */
#include "fp8.h"

#include <string.h>

#include "number_formats.h"

static const fp8_format_info infos[FP8_FORMATS] = {
    /* 448 = 1.75 x 2^8 (S.1111.110: S.1111.111 is the NaN, the one code given up for
       it, so 254 finite); the subnormals are multiples of 2^-9 */
    {"e4m3", 4, 3, 7, 448.0f, 0x1p-6f, 0x1p-9f, 0, 254},
    /* 57344 = 1.75 x 2^15; exponent 31 is inf (mantissa 0) or NaN (3 codes a sign),
       so 256 - 8 = 248 finite */
    {"e5m2", 5, 2, 15, 57344.0f, 0x1p-14f, 0x1p-16f, 1, 248},
};

const fp8_format_info *fp8_info(fp8_format f) {
    return (unsigned)f < FP8_FORMATS ? &infos[f] : NULL;
}

int fp8_format_parse(const char *name, fp8_format *out) {
    for (int f = 0; f < FP8_FORMATS; f++)
        if (name && strcmp(name, infos[f].name) == 0) {
            *out = (fp8_format)f;
            return 0;
        }
    return -1;
}

uint8_t fp8_encode(fp8_format f, float x) {
    return f == FP8_E4M3 ? number_to_f8e4m3(x) : number_to_f8e5m2(x);
}

float fp8_decode(fp8_format f, uint8_t code) {
    return f == FP8_E4M3 ? number_from_f8e4m3(code) : number_from_f8e5m2(code);
}

void fp8_decode_table(fp8_format f, float table[256]) {
    for (int c = 0; c < 256; c++) table[c] = fp8_decode(f, (uint8_t)c);
}

void fp8_encode_scaled(fp8_format f, uint8_t *restrict dst, const float *restrict src,
                       size_t n, float scale) {
    if (f == FP8_E4M3)
        for (size_t i = 0; i < n; i++) dst[i] = number_to_f8e4m3(src[i] * scale);
    else
        for (size_t i = 0; i < n; i++) dst[i] = number_to_f8e5m2(src[i] * scale);
}
