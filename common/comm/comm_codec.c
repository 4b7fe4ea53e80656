/* The wire's element types: sizes and names, fp32 <-> bf16 / fp16 / fp8 (e4m3)
 * conversions rounding to nearest even, and the reductions the host-side backends
 * apply to buffers of any of them (widened to fp32, rounded back once per call). */
#include "comm_internal.h"

#include <math.h>
#include <string.h>

/* ---- element types ------------------------------------------------------------------ */
size_t comm_dtype_size(comm_dtype dt) {
    static const size_t sizes[] = {4, 2, 2, 1};
    return (dt >= COMM_F32 && dt <= COMM_F8E4M3) ? sizes[dt] : 0;
}

const char *comm_dtype_name(comm_dtype dt) {
    static const char *names[] = {"f32", "bf16", "f16", "f8e4m3"};
    return (dt >= COMM_F32 && dt <= COMM_F8E4M3) ? names[dt] : "?";
}

static inline uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static inline float bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* Rounding to nearest even by integer arithmetic: add just under half a unit of the
 * kept last bit, plus one when that bit is odd, then drop the low bits. A carry out of
 * the mantissa correctly bumps the exponent. */
static inline uint16_t to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);  /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

static inline uint16_t to_f16(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                /* >= 65520: infinity */
    if (a < 0x38800000u)                                        /* < 2^-14: subnormal, */
        return sign | (uint16_t)nearbyintf(bits_f32(a) * 0x1p24f);   /* units of 2^-24 */
    a -= 112u << 23;                                            /* exponent bias 127 -> 15 */
    return sign | (uint16_t)((a + 0x0fffu + ((a >> 13) & 1u)) >> 13);
}
static inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { float v = (float)m * 0x1p-24f; return sign ? -v : v; }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint8_t to_f8(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return sign | 0x7fu;                   /* NaN */
    if (a >= 0x43e00000u) return sign | 0x7eu;                  /* >= 448: saturate */
    if (a < 0x3c800000u)                                        /* < 2^-6: subnormal, */
        return sign | (uint8_t)nearbyintf(bits_f32(a) * 512.0f);   /* units of 2^-9 */
    a -= 120u << 23;                                            /* exponent bias 127 -> 7 */
    return sign | (uint8_t)((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20);
}
static inline float from_f8(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
    if (e == 0) { float v = (float)m * 0x1p-9f; return sign ? -v : v; }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

uint16_t comm_f32_to_bf16(float x) { return to_bf16(x); }
float comm_bf16_to_f32(uint16_t h) { return from_bf16(h); }
uint16_t comm_f32_to_f16(float x) { return to_f16(x); }
float comm_f16_to_f32(uint16_t h) { return from_f16(h); }
uint8_t comm_f32_to_f8e4m3(float x) { return to_f8(x); }
float comm_f8e4m3_to_f32(uint8_t b) { return from_f8(b); }

static inline float load(const void *p, size_t i, comm_dtype dt) {
    switch (dt) {
    case COMM_BF16: return from_bf16(((const uint16_t *)p)[i]);
    case COMM_F16: return from_f16(((const uint16_t *)p)[i]);
    case COMM_F8E4M3: return from_f8(((const uint8_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}
static inline void store(void *p, size_t i, comm_dtype dt, float x) {
    switch (dt) {
    case COMM_BF16: ((uint16_t *)p)[i] = to_bf16(x); break;
    case COMM_F16: ((uint16_t *)p)[i] = to_f16(x); break;
    case COMM_F8E4M3: ((uint8_t *)p)[i] = to_f8(x); break;
    default: ((float *)p)[i] = x;
    }
}

void comm_convert(void *dst, comm_dtype dst_dt, const void *src, comm_dtype src_dt,
                  size_t count) {
    if (dst_dt == src_dt) {
        if (count) memmove(dst, src, count * comm_dtype_size(dst_dt));
        return;
    }
    for (size_t i = 0; i < count; i++) store(dst, i, dst_dt, load(src, i, src_dt));
}

/* dst = a op b. The 16- and 8-bit types are widened to fp32, combined and rounded back
 * once per call, i.e. once per hop of a ring. One loop per type so that the compiler
 * vectorises each. */
#define REDUCE_LOOP(T, FROM, TO)                                                      \
    do {                                                                              \
        T *d = dst; const T *x = a, *y = b;                                           \
        if (op == COMM_MAX)                                                           \
            for (size_t i = 0; i < count; i++) {                                      \
                float p = FROM(x[i]), q = FROM(y[i]);                                 \
                d[i] = TO(p > q ? p : q);                                             \
            }                                                                         \
        else                                                                          \
            for (size_t i = 0; i < count; i++) d[i] = TO(FROM(x[i]) + FROM(y[i]));    \
    } while (0)
#define SAME(v) (v)

void comm_reduce_buffers(void *dst, const void *a, const void *b, size_t count,
                         comm_dtype dt, comm_op op) {
    switch (dt) {
    case COMM_F32: REDUCE_LOOP(float, SAME, SAME); break;
    case COMM_BF16: REDUCE_LOOP(uint16_t, from_bf16, to_bf16); break;
    case COMM_F16: REDUCE_LOOP(uint16_t, from_f16, to_f16); break;
    case COMM_F8E4M3: REDUCE_LOOP(uint8_t, from_f8, to_f8); break;
    }
}

void comm_divide_buffer(void *buf, size_t count, comm_dtype dt, int divisor) {
    float d = (float)divisor;
    if (dt == COMM_F32) {
        float *x = buf;
        for (size_t i = 0; i < count; i++) x[i] /= d;
        return;
    }
    for (size_t i = 0; i < count; i++) store(buf, i, dt, load(buf, i, dt) / d);
}
