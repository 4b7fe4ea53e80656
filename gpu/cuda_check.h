/* Checked CUDA, cuBLAS and NCCL calls. A failing call prints itself, where it was made
 * and the library's reason, then exits 1: a GPU error is never something to carry on
 * from, and naming the exact call is what makes it debuggable on a remote box.
 * Usable from C and from CUDA C++. NCCL_CHECK needs <nccl.h> included first. */
#ifndef CUDA_CHECK_H
#define CUDA_CHECK_H
#include <stdio.h>
#include <stdlib.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define CUDA_CHECK(call)                                                              \
    do {                                                                              \
        cudaError_t cuda_check_err_ = (call);                                         \
        if (cuda_check_err_ != cudaSuccess) {                                         \
            fprintf(stderr, "CUDA error %d (%s) in %s at %s:%d\n",                   \
                    (int)cuda_check_err_, cudaGetErrorString(cuda_check_err_), #call, \
                    __FILE__, __LINE__);                                              \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define CUBLAS_CHECK(call)                                                            \
    do {                                                                              \
        cublasStatus_t cublas_check_st_ = (call);                                     \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS) {                              \
            fprintf(stderr, "cuBLAS error %d (%s) in %s at %s:%d\n",                 \
                    (int)cublas_check_st_, cublasGetStatusString(cublas_check_st_),   \
                    #call, __FILE__, __LINE__);                                       \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

#define NCCL_CHECK(call)                                                              \
    do {                                                                              \
        ncclResult_t nccl_check_res_ = (call);                                        \
        if (nccl_check_res_ != ncclSuccess) {                                         \
            fprintf(stderr, "NCCL error %d (%s) in %s at %s:%d\n",                   \
                    (int)nccl_check_res_, ncclGetErrorString(nccl_check_res_), #call, \
                    __FILE__, __LINE__);                                              \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* After a kernel launch: launch errors (bad configuration) surface here, at the
 * launch that caused them, rather than at some later unrelated call. */
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#endif
