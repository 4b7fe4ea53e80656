/* Reduction kernels of the host-side backends on CUDA ranks (gpu/comm_gpu_kernels.cu),
 * called by gpu/comm_gpu.c. dt and op are comm_dtype and comm_op values; the results
 * are bit-identical to comm_reduce_buffers and comm_divide_buffer (common/comm/comm_codec.c):
 * 16- and 8-bit types are widened to fp32, combined and rounded back the same way. */
#ifndef COMM_GPU_KERNELS_H
#define COMM_GPU_KERNELS_H
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
/* dst = a op b elementwise (op COMM_MAX: max, else sum), queued on stream. */
void cuda_comm_reduce(void *dst, const void *a, const void *b, size_t count, int dt, int op,
                      struct CUstream_st *stream);
/* buf /= divisor elementwise, queued on stream. */
void cuda_comm_divide(void *buf, size_t count, int dt, int divisor,
                      struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif
