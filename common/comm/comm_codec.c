/* The wire's element types: sizes and names, fp32 <-> bf16 / fp16 / fp8 (e4m3)
 * conversions rounding to nearest even (common/tensor/number_formats.h, shared with the
 * GPU kernels and the tensor ops), and the reductions the host-side backends apply to buffers of any of them
 * (the narrow types widened to fp32 and rounded back once per call; f64 in double). */
#include "comm_internal.h"

#include <math.h>
#include <string.h>

#include "number_formats.h"

/* ---- element types ------------------------------------------------------------------ */
size_t comm_dtype_size(comm_dtype dt) {
    static const size_t sizes[] = {4, 2, 2, 1, 8};
    return (dt >= COMM_F32 && dt < COMM_NDTYPES) ? sizes[dt] : 0;
}

comm_dtype comm_dtype_of(precision p) {
    return p == PRECISION_BF16 ? COMM_BF16 : p == PRECISION_FP16 ? COMM_F16 : COMM_F32;
}

const char *comm_dtype_name(comm_dtype dt) {
    static const char *names[] = {"f32", "bf16", "f16", "f8e4m3", "f64"};
    return (dt >= COMM_F32 && dt < COMM_NDTYPES) ? names[dt] : "?";
}

#define to_bf16 number_to_bf16
#define from_bf16 number_from_bf16
#define to_f16 number_to_f16
#define from_f16 number_from_f16
#define to_f8 number_to_f8e4m3
#define from_f8 number_from_f8e4m3

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

/* f64 keeps its bits; the other types meet it through fp32. */
static inline double load_wide(const void *p, size_t i, comm_dtype dt) {
    return dt == COMM_F64 ? ((const double *)p)[i] : (double)load(p, i, dt);
}
static inline void store_wide(void *p, size_t i, comm_dtype dt, double x) {
    if (dt == COMM_F64) ((double *)p)[i] = x;
    else store(p, i, dt, (float)x);
}

void comm_convert(void *dst, comm_dtype dst_dt, const void *src, comm_dtype src_dt,
                  size_t count) {
    if (dst_dt == src_dt) {
        if (count) memmove(dst, src, count * comm_dtype_size(dst_dt));
        return;
    }
    if (dst_dt == COMM_F64 || src_dt == COMM_F64) {
        for (size_t i = 0; i < count; i++) store_wide(dst, i, dst_dt, load_wide(src, i, src_dt));
        return;
    }
    for (size_t i = 0; i < count; i++) store(dst, i, dst_dt, load(src, i, src_dt));
}

/* dst = a op b, computed in W. The 16- and 8-bit types are widened to fp32, combined
 * and rounded back once per call, i.e. once per hop of a ring. One loop per type so
 * that the compiler vectorises each. */
#define REDUCE_LOOP(T, W, FROM, TO)                                                   \
    do {                                                                              \
        T *d = dst; const T *x = a, *y = b;                                           \
        if (op == COMM_MAX)                                                           \
            for (size_t i = 0; i < count; i++) {                                      \
                W p = FROM(x[i]), q = FROM(y[i]);                                     \
                d[i] = TO(p > q ? p : q);                                             \
            }                                                                         \
        else                                                                          \
            for (size_t i = 0; i < count; i++) d[i] = TO(FROM(x[i]) + FROM(y[i]));    \
    } while (0)
#define SAME(v) (v)

void comm_reduce_buffers(void *dst, const void *a, const void *b, size_t count,
                         comm_dtype dt, comm_op op) {
    switch (dt) {
    case COMM_F32: REDUCE_LOOP(float, float, SAME, SAME); break;
    case COMM_BF16: REDUCE_LOOP(uint16_t, float, from_bf16, to_bf16); break;
    case COMM_F16: REDUCE_LOOP(uint16_t, float, from_f16, to_f16); break;
    case COMM_F8E4M3: REDUCE_LOOP(uint8_t, float, from_f8, to_f8); break;
    case COMM_F64: REDUCE_LOOP(double, double, SAME, SAME); break;
    case COMM_NDTYPES: break;
    }
}

void comm_divide_buffer(void *buf, size_t count, comm_dtype dt, int divisor) {
    float d = (float)divisor;
    if (dt == COMM_F32) {
        float *x = buf;
        for (size_t i = 0; i < count; i++) x[i] /= d;
        return;
    }
    if (dt == COMM_F64) {
        double *x = buf;
        for (size_t i = 0; i < count; i++) x[i] /= (double)divisor;
        return;
    }
    for (size_t i = 0; i < count; i++) store(buf, i, dt, load(buf, i, dt) / d);
}
