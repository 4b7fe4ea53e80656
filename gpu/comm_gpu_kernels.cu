// Element-wise reduction and division for the communicator's host-side backends when
// their buffers live on a GPU (threads over a shared GPU, MPI processes sharing one).
// The conversions are the host's own (common/tensor/number_formats.h, compiled here
// for the device), so a reduction gives the same bits whichever side ran it: a
// shared-GPU run matches the CPU one.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "comm_gpu_kernels.h"
#include "number_formats.h"
#include "cuda_check.h"

namespace {

// comm_dtype and comm_op values (common/comm.h), which this C++ file does not include.
enum { kF32 = 0, kBF16 = 1, kF16 = 2, kF8E4M3 = 3, kF64 = 4 };
enum { kMax = 2 };

constexpr int kThreads = 256;

unsigned grid_for(size_t n) {
    size_t blocks = (n + kThreads - 1) / kThreads;
    return (unsigned)std::min<size_t>(std::max<size_t>(blocks, 1), size_t(1) << 16);
}

// One element type: how it is stored (T), what it is computed in (W), how it widens.
struct f32_type {
    using T = float;
    using W = float;
    __device__ static W load(T v) { return v; }
    __device__ static T store(W x) { return x; }
};
struct f64_type {
    using T = double;
    using W = double;
    __device__ static W load(T v) { return v; }
    __device__ static T store(W x) { return x; }
};
struct bf16_type {
    using T = uint16_t;
    using W = float;
    __device__ static W load(T v) { return number_from_bf16(v); }
    __device__ static T store(W x) { return number_to_bf16(x); }
};
struct f16_type {
    using T = uint16_t;
    using W = float;
    __device__ static W load(T v) { return number_from_f16(v); }
    __device__ static T store(W x) { return number_to_f16(x); }
};
struct f8_type {
    using T = uint8_t;
    using W = float;
    __device__ static W load(T v) { return number_from_f8e4m3(v); }
    __device__ static T store(W x) { return number_to_f8e4m3(x); }
};

#define GRID_STRIDE(i, n)                                                          \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);        \
         i += (size_t)gridDim.x * blockDim.x)

// The same expressions as comm_codec.c's REDUCE_LOOP, so that NaNs and ties come out alike.
template <typename Type>
__global__ void reduce_kernel(typename Type::T *dst, const typename Type::T *a,
                              const typename Type::T *b, size_t n, int is_max) {
    GRID_STRIDE(i, n) {
        const typename Type::W p = Type::load(a[i]), q = Type::load(b[i]);
        dst[i] = Type::store(is_max ? (p > q ? p : q) : p + q);
    }
}

template <typename Type>
__global__ void divide_kernel(typename Type::T *buf, size_t n, int divisor) {
    const typename Type::W d = (typename Type::W)divisor;
    GRID_STRIDE(i, n) { buf[i] = Type::store(Type::load(buf[i]) / d); }
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
void launch_divide(void *buf, size_t n, int divisor, cudaStream_t stream) {
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
    case kF64: launch_reduce<f64_type>(dst, a, b, count, is_max, stream); break;
    default: launch_reduce<f32_type>(dst, a, b, count, is_max, stream); break;
    }
}

void cuda_comm_divide(void *buf, size_t count, int dt, int divisor,
                      struct CUstream_st *stream) {
    if (count == 0) return;
    switch (dt) {
    case kBF16: launch_divide<bf16_type>(buf, count, divisor, stream); break;
    case kF16: launch_divide<f16_type>(buf, count, divisor, stream); break;
    case kF8E4M3: launch_divide<f8_type>(buf, count, divisor, stream); break;
    case kF64: launch_divide<f64_type>(buf, count, divisor, stream); break;
    default: launch_divide<f32_type>(buf, count, divisor, stream); break;
    }
}

}  // extern "C"
