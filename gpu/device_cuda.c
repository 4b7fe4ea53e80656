/* The GPU build's device layer: what gpu/backend.c's table gives common/device.c.
 *
 * Ranks are threads (or processes), and each one picks its device for itself, so the
 * choice and the CUDA objects that go with it (the GPU index, a stream, a cuBLAS
 * handle, the ops' scratch) are per-thread state. A thread's objects are destroyed
 * when it exits, so repeated launches of rank threads do not leak handles. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_check.h"
#include "ops_cuda.h"

typedef struct {
    int gpu;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *scratch;
    size_t scratch_bytes;
} thread_gpu;

static _Thread_local thread_gpu *current_gpu;

/* The key exists only for its destructor, which runs at thread exit. */
static pthread_key_t gpu_key;
static pthread_once_t gpu_key_once = PTHREAD_ONCE_INIT;

static void thread_gpu_destroy(void *ptr) {
    thread_gpu *g = ptr;
    if (!g) return;
    /* Best effort and unchecked: at thread exit the process may be tearing down. */
    cudaSetDevice(g->gpu);
    cudaStreamSynchronize(g->stream);
    cudaFree(g->scratch);
    cublasDestroy(g->cublas);
    cudaStreamDestroy(g->stream);
    free(g);
    if (current_gpu == g) current_gpu = NULL;
}

static void make_gpu_key(void) {
    if (pthread_key_create(&gpu_key, thread_gpu_destroy) != 0) {
        fprintf(stderr, "error: pthread_key_create failed\n");
        exit(1);
    }
}

int cuda_gpu_count(char *why, size_t why_size) {
    int count = 0;
    /* No driver (error 35 on a machine without a GPU), no device, a broken install:
     * all mean "no GPU here". Clear the sticky error so later calls start clean. */
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_size, "%s (CUDA error %d)", cudaGetErrorString(err), (int)err);
        return 0;
    }
    if (count == 0) snprintf(why, why_size, "the driver reports no CUDA device");
    return count;
}

void cuda_select(int gpu_index) {
    CUDA_CHECK(cudaSetDevice(gpu_index));
    if (current_gpu && current_gpu->gpu != gpu_index) {
        /* A thread moving to another GPU: its objects belong to the old one. */
        thread_gpu_destroy(current_gpu);
        current_gpu = NULL;
        CUDA_CHECK(cudaSetDevice(gpu_index));
    }
    if (!current_gpu) {
        pthread_once(&gpu_key_once, make_gpu_key);
        thread_gpu *g = calloc(1, sizeof *g);
        if (!g) { fprintf(stderr, "error: out of host memory\n"); exit(1); }
        g->gpu = gpu_index;
        /* Non-blocking: ranks sharing a GPU must not serialise through the legacy
         * default stream. Everything this layer does is ordered on this stream. */
        CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&g->cublas));
        CUBLAS_CHECK(cublasSetStream(g->cublas, g->stream));
        CUBLAS_CHECK(cublasSetMathMode(g->cublas, cuda_tf32_enabled()
                                                      ? CUBLAS_TF32_TENSOR_OP_MATH
                                                      : CUBLAS_DEFAULT_MATH));
        current_gpu = g;
        pthread_setspecific(gpu_key, g);
    }
}

static thread_gpu *require_gpu(const char *what) {
    if (!current_gpu) {
        fprintf(stderr, "error: %s on a thread that has not selected a GPU "
                        "(call device_select(DEVICE_CUDA, i) first)\n", what);
        exit(1);
    }
    return current_gpu;
}

struct CUstream_st *cuda_thread_stream(void) { return require_gpu("CUDA stream")->stream; }
struct cublasContext *cuda_thread_cublas(void) { return require_gpu("cuBLAS")->cublas; }
int cuda_thread_gpu(void) { return require_gpu("GPU index")->gpu; }

void cuda_device_name(int gpu, char *out, size_t size) {
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, gpu) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, size, "?");
        return;
    }
    snprintf(out, size, "%s", prop.name);
}

void *cuda_thread_scratch(size_t bytes) {
    thread_gpu *g = require_gpu("scratch");
    if (bytes > g->scratch_bytes) {
        /* Queued kernels may still use the old buffer. Grow geometrically so that a
         * run settles after a few calls. */
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        CUDA_CHECK(cudaFree(g->scratch));
        size_t grown = g->scratch_bytes * 2 > bytes ? g->scratch_bytes * 2 : bytes;
        g->scratch = NULL;
        g->scratch_bytes = 0;
        CUDA_CHECK(cudaMalloc(&g->scratch, grown));
        g->scratch_bytes = grown;
    }
    return g->scratch;
}

void *cuda_device_malloc(size_t bytes) {
    thread_gpu *g = require_gpu("device_malloc");
    void *ptr = NULL;
    /* a unique pointer even for 0 bytes, as malloc gives: mem_free looks buffers up */
    if (bytes == 0) bytes = 1;
    cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err != cudaSuccess) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fprintf(stderr, "error: cudaMalloc of %zu bytes on GPU %d failed (%s); "
                        "%zu of %zu bytes free\n",
                bytes, g->gpu, cudaGetErrorString(err), free_bytes, total_bytes);
        exit(1);
    }
    /* mem_alloc_on promises zero-filled memory, like the host allocator; accumulated
     * gradients rely on it. Ordered on this thread's stream, then waited for, so the
     * buffer is ready for any stream. */
    CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, g->stream));
    CUDA_CHECK(cudaStreamSynchronize(g->stream));
    return ptr;
}

void cuda_device_free(void *ptr) {
    if (!ptr) return;
    /* Work queued on this thread's stream may still read or write the buffer. */
    if (current_gpu) CUDA_CHECK(cudaStreamSynchronize(current_gpu->stream));
    CUDA_CHECK(cudaFree(ptr));
}
