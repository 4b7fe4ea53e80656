/* fp32 <-> bf16 / fp16 / fp8 (e4m3, e5m2) element conversions, rounding to nearest even by
 * integer arithmetic, written once for the host (common/comm/comm_codec.c) and the
 * device (gpu/comm_gpu_kernels.cu), so that a value gives the same bits on either side.
 * Here in tensor/, below comm/, so that the tensor ops can use them too.
 * Header-only: static inline, and __host__ __device__ when nvcc compiles it. */
#ifndef NUMBER_FORMATS_H
#define NUMBER_FORMATS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define NUMBER_FORMAT_FN static inline __host__ __device__
#else
#define NUMBER_FORMAT_FN static inline
#endif

NUMBER_FORMAT_FN uint32_t number_f32_bits(float x) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
#endif
}
NUMBER_FORMAT_FN float number_bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, 4);
    return x;
#endif
}

/* Rounding to nearest even: add just under half a unit of the kept last bit, plus one
 * when that bit is odd, then drop the low bits. A carry out of the mantissa correctly
 * bumps the exponent. */
NUMBER_FORMAT_FN uint16_t number_to_bf16(float x) {
    uint32_t u = number_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
NUMBER_FORMAT_FN float number_from_bf16(uint16_t h) {
    return number_bits_f32((uint32_t)h << 16);
}

NUMBER_FORMAT_FN uint16_t number_to_f16(float x) {
    uint32_t u = number_f32_bits(x), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                /* >= 65520: infinity */
    if (a < 0x38800000u)                                        /* < 2^-14: subnormal, */
        return sign | (uint16_t)nearbyintf(number_bits_f32(a) * 0x1p24f);   /* 2^-24 units */
    a -= 112u << 23;                                            /* exponent bias 127 -> 15 */
    return sign | (uint16_t)((a + 0x0fffu + ((a >> 13) & 1u)) >> 13);
}
/* Leading zero bits of a nonzero x. */
NUMBER_FORMAT_FN uint32_t number_clz32(uint32_t x) {
#ifdef __CUDA_ARCH__
    return (uint32_t)__clz((int)x);
#else
    return (uint32_t)__builtin_clz(x);
#endif
}

/* Integer selects only, no branch and no float arithmetic (which gcc will not
 * speculate), so that a host loop over it vectorises. A subnormal m 2^-24 is normalised
 * by its top bit: m = 2^top (1 + f), stored with exponent top - 24 + 127. */
NUMBER_FORMAT_FN float number_from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t top = 31u - number_clz32(m | 1u);
    uint32_t subnormal = (((top + 103u) << 23) | ((m << (23u - top)) & 0x7fffffu)) * (m != 0);
    uint32_t exponent = e + 112u + (e == 31u) * 112u;    /* rebias; 31 (inf, NaN) -> 255 */
    uint32_t normal = (exponent << 23) | (m << 13);
    return number_bits_f32(sign | (e == 0 ? subnormal : normal));
}

/* FP8 (fp8.h), rounding to nearest even and saturating at the format's max. One
 * routine for both formats, given as constants: the fp32 bits of the max, of the
 * smallest normal, the exponent rebias, the mantissa bits dropped and the subnormals'
 * unit (2^-9, 2^-16); inlined with them, it is two branch-light loops. */
NUMBER_FORMAT_FN uint8_t number_to_f8(float x, uint32_t max_bits, uint8_t max_code,
                                      uint32_t min_normal_bits, uint32_t rebias,
                                      uint32_t dropped, float per_subnormal) {
    uint32_t u = number_f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return sign | 0x7fu;                   /* NaN */
    if (a >= max_bits) return sign | max_code;                  /* >= max: saturate */
    if (a < min_normal_bits)                                    /* subnormal: in units */
        return sign | (uint8_t)nearbyintf(number_bits_f32(a) * per_subnormal);
    a -= rebias << 23;
    const uint32_t half = (1u << (dropped - 1)) - 1u;
    return sign | (uint8_t)((a + half + ((a >> dropped) & 1u)) >> dropped);
}
/* E4M3: bias 7, no infinity, S.1111.111 is NaN; max 448, normal from 2^-6. */
NUMBER_FORMAT_FN uint8_t number_to_f8e4m3(float x) {
    return number_to_f8(x, 0x43e00000u, 0x7eu, 0x3c800000u, 120u, 20u, 512.0f);
}
NUMBER_FORMAT_FN float number_from_f8e4m3(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 15 && m == 7) return number_bits_f32(sign | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f;
        return sign ? -v : v;
    }
    return number_bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}
/* E5M2: fp16's exponent (bias 15, infinities and NaNs) with 2 mantissa bits; max 57344,
 * normal from 2^-14. Converting saturates as E4M3 does (finite inputs past 57344 and
 * infinities give +-57344): the conversion FP8 training uses, where an overflow to inf
 * would poison the product. */
NUMBER_FORMAT_FN uint8_t number_to_f8e5m2(float x) {
    return number_to_f8(x, 0x47600000u, 0x7bu, 0x38800000u, 112u, 21u, 65536.0f);
}
NUMBER_FORMAT_FN float number_from_f8e5m2(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 2) & 0x1fu, m = b & 3u;
    if (e == 31) return number_bits_f32(sign | (m ? 0x7fc00000u : 0x7f800000u));
    if (e == 0) {
        float v = (float)m * 0x1p-16f;
        return sign ? -v : v;
    }
    return number_bits_f32(sign | ((e + 112u) << 23) | (m << 21));
}

#endif
