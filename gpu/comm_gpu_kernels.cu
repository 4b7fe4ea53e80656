// Element-wise reduction and division for the communicator's host-side backends when
// their buffers live on a GPU (threads over a shared GPU, MPI processes sharing one).
// The conversions are those of common/comm.c written for the device, so a reduction
// gives the same bits whichever side ran it: a shared-GPU run matches the CPU one.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "comm_gpu_kernels.h"
#include "cuda_check.h"

namespace {

// comm_dtype and comm_op values (common/comm.h), which this C++ file does not include.
enum { kF32 = 0, kBF16 = 1, kF16 = 2, kF8E4M3 = 3 };
enum { kMax = 2 };

constexpr int kThreads = 256;

unsigned grid_for(size_t n) {
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)std::min<size_t>(std::max<size_t>(blocks, 1), size_t(1) << 16);
}

__device__ inline uint32_t f32_bits(float x) { return __float_as_uint(x); }
__device__ inline float bits_f32(uint32_t u) { return __uint_as_float(u); }

// Round to nearest even by integer arithmetic, as comm.c does.
__device__ inline uint16_t to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
__device__ inline float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }

__device__ inline uint16_t to_f16(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    if (a > 0x7f800000u) return sign | 0x7e00u;                 // NaN
    if (a >= 0x477ff000u) return sign | 0x7c00u;                // >= 65520: infinity
    if (a < 0x38800000u)                                        // subnormal: units of 2^-24
        return sign | (uint16_t)rintf(bits_f32(a) * 0x1p24f);
    a -= 112u << 23;
    return sign | (uint16_t)((a + 0x0fffu + ((a >> 13) & 1u)) >> 13);
}
__device__ inline float from_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ inline uint8_t to_f8(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return sign | 0x7fu;                   // NaN
    if (a >= 0x43e00000u) return sign | 0x7eu;                  // >= 448: saturate
    if (a < 0x3c800000u)                                        // subnormal: units of 2^-9
        return sign | (uint8_t)rintf(bits_f32(a) * 512.0f);
    a -= 120u << 23;
    return sign | (uint8_t)((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20);
}
__device__ inline float from_f8(uint8_t b) {
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
    if (e == 15 && m == 7) return bits_f32(sign | 0x7fc00000u);
    if (e == 0) {
        float v = (float)m * 0x1p-9f;
        return sign ? -v : v;
    }
    return bits_f32(sign | ((e + 120u) << 23) | (m << 20));
}

// One element type: how it is stored and how it widens.
struct f32_type {
    using T = float;
    __device__ static float load(T v) { return v; }
    __device__ static T store(float x) { return x; }
};
struct bf16_type {
    using T = uint16_t;
    __device__ static float load(T v) { return from_bf16(v); }
    __device__ static T store(float x) { return to_bf16(x); }
};
struct f16_type {
    using T = uint16_t;
    __device__ static float load(T v) { return from_f16(v); }
    __device__ static T store(float x) { return to_f16(x); }
};
struct f8_type {
    using T = uint8_t;
    __device__ static float load(T v) { return from_f8(v); }
    __device__ static T store(float x) { return to_f8(x); }
};

#define GRID_STRIDE(i, n)                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (size_t)gridDim.x * blockDim.x)

// The same expressions as comm.c's REDUCE_LOOP, so that NaNs and ties come out alike.
template <typename Type>
__global__ void reduce_kernel(typename Type::T *dst, const typename Type::T *a,
                              const typename Type::T *b, size_t n, int is_max) {
    GRID_STRIDE(i, n) {
        const float p = Type::load(a[i]), q = Type::load(b[i]);
        dst[i] = Type::store(is_max ? (p > q ? p : q) : p + q);
    }
}

template <typename Type>
__global__ void divide_kernel(typename Type::T *buf, size_t n, float divisor) {
    GRID_STRIDE(i, n) { buf[i] = Type::store(Type::load(buf[i]) / divisor); }
}

template <typename Type>
void launch_reduce(void *dst, const void *a, const void *b, size_t n, int is_max,
                   cudaStream_t stream) {
    using T = typename Type::T;
    reduce_kernel<Type><<<grid_for(n), kThreads, 0, stream>>>((T *)dst, (const T *)a,
                                                              (const T *)b, n, is_max);
    CUDA_CHECK_LAUNCH();
}

template <typename Type>
void launch_divide(void *buf, size_t n, float divisor, cudaStream_t stream) {
    divide_kernel<Type><<<grid_for(n), kThreads, 0, stream>>>((typename Type::T *)buf, n,
                                                              divisor);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

extern "C" {

void cuda_comm_reduce(void *dst, const void *a, const void *b, size_t count, int dt, int op,
                      struct CUstream_st *stream) {
    if (count == 0) return;
    const int is_max = op == kMax;
    switch (dt) {
    case kBF16: launch_reduce<bf16_type>(dst, a, b, count, is_max, stream); break;
    case kF16: launch_reduce<f16_type>(dst, a, b, count, is_max, stream); break;
    case kF8E4M3: launch_reduce<f8_type>(dst, a, b, count, is_max, stream); break;
    default: launch_reduce<f32_type>(dst, a, b, count, is_max, stream); break;
    }
}

void cuda_comm_divide(void *buf, size_t count, int dt, int divisor,
                      struct CUstream_st *stream) {
    if (count == 0) return;
    const float d = (float)divisor;
    switch (dt) {
    case kBF16: launch_divide<bf16_type>(buf, count, d, stream); break;
    case kF16: launch_divide<f16_type>(buf, count, d, stream); break;
    case kF8E4M3: launch_divide<f8_type>(buf, count, d, stream); break;
    default: launch_divide<f32_type>(buf, count, d, stream); break;
    }
}

}  // extern "C"
