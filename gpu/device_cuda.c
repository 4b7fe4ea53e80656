/* The GPU build's device layer: what gpu/backend.c's table gives common/device.c.
 *
 * Ranks are threads (or processes), and each one picks its GPU for itself, so the CUDA
 * objects that go with the choice (the GPU index, a stream, a cuBLAS handle, the ops'
 * scratch) are per-thread state. When a thread exits its objects are not destroyed but
 * kept for the next thread on that GPU: DP's replica threads, started every step, then
 * create no stream and no cuBLAS handle after the first step.
 *
 * Device memory goes through a cache (block_cache.h): a freed block waits, with an event
 * marking where its stream was, for the next allocation of about its size. Zero-filling
 * a block runs on a fill stream of its own, so an allocation waits for that memset only,
 * never for the compute the thread has queued. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "block_cache.h"
#include "cuda_check.h"
#include "ops_cuda.h"

typedef struct thread_gpu {
    int gpu;
    cudaStream_t stream;        /* everything the thread's ops queue */
    cudaStream_t fill_stream;   /* zero-filling new blocks, waited for at once */
    cublasHandle_t cublas;
    void *scratch;              /* the fp32 ops' (cuda_thread_scratch) */
    size_t scratch_bytes;
    void *mixed_scratch;        /* the 16-bit ops' widenings, around the fp32 ops */
    size_t mixed_scratch_bytes;
    struct thread_gpu *next;    /* in the spare list while no thread holds it */
} thread_gpu;

static _Thread_local thread_gpu *current_gpu;

/* Process-wide, under one lock: the per-thread objects no thread holds now, and the
 * device memory cache. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static thread_gpu *spare_gpus;
static block_cache memory_cache;

/* The key exists only for its destructor, which runs at thread exit. */
static pthread_key_t gpu_key;
static pthread_once_t gpu_key_once = PTHREAD_ONCE_INIT;

/* A thread lets go of its objects: once its queued work is done they are another's. */
static void thread_gpu_release(void *ptr) {
    thread_gpu *g = ptr;
    if (!g) return;
    /* Unchecked: at thread exit the process may be tearing down. */
    cudaSetDevice(g->gpu);
    cudaStreamSynchronize(g->stream);
    if (current_gpu == g) current_gpu = NULL;
    pthread_mutex_lock(&pool_lock);
    g->next = spare_gpus;
    spare_gpus = g;
    pthread_mutex_unlock(&pool_lock);
}

static void make_gpu_key(void) {
    if (pthread_key_create(&gpu_key, thread_gpu_release) != 0) {
        fprintf(stderr, "error: pthread_key_create failed\n");
        exit(1);
    }
}

static thread_gpu *take_spare(int gpu) {
    pthread_mutex_lock(&pool_lock);
    thread_gpu *found = NULL;
    for (thread_gpu **link = &spare_gpus; *link; link = &(*link)->next) {
        if ((*link)->gpu != gpu) continue;
        found = *link;
        *link = found->next;
        found->next = NULL;
        break;
    }
    pthread_mutex_unlock(&pool_lock);
    return found;
}

static thread_gpu *thread_gpu_create(int gpu) {
    thread_gpu *g = calloc(1, sizeof *g);
    if (!g) { fprintf(stderr, "error: out of host memory\n"); exit(1); }
    g->gpu = gpu;
    /* Non-blocking: ranks sharing a GPU must not serialise through the legacy
     * default stream. Everything the ops do is ordered on this stream. */
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->fill_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&g->cublas));
    CUBLAS_CHECK(cublasSetStream(g->cublas, g->stream));
    return g;
}

/* What a student should read when CUDA finds no GPU: the runtime's own words ("CUDA
 * driver version is insufficient") suggest an upgrade where there is no driver at all. */
static const char *cuda_no_gpu_in_words(cudaError_t err) {
    switch (err) {
    case cudaErrorInsufficientDriver:
        return "no NVIDIA GPU driver is installed here, or it is older than this build's CUDA";
    case cudaErrorNoDevice: return "the NVIDIA driver sees no GPU on this machine";
    default: return "CUDA cannot use a GPU here";
    }
}

int cuda_gpu_count(char *why, size_t why_size) {
    int count = 0;
    /* No driver (error 35 on a machine without a GPU), no device, a broken install:
     * all mean "no GPU here". Clear the sticky error so later calls start clean. */
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_size, "%s (CUDA error %d: %s)", cuda_no_gpu_in_words(err), (int)err,
                 cudaGetErrorString(err));
        return 0;
    }
    if (count == 0) snprintf(why, why_size, "the driver reports no CUDA device");
    return count;
}

void cuda_select(int gpu) {
    CUDA_CHECK(cudaSetDevice(gpu));
    if (current_gpu && current_gpu->gpu == gpu) return;
    pthread_once(&gpu_key_once, make_gpu_key);
    if (current_gpu) {   /* a thread moving to another GPU: its objects stay with the old */
        thread_gpu_release(current_gpu);
        CUDA_CHECK(cudaSetDevice(gpu));
    }
    thread_gpu *g = take_spare(gpu);
    current_gpu = g ? g : thread_gpu_create(gpu);
    pthread_setspecific(gpu_key, current_gpu);
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

/* *buffer grown to at least bytes. Queued kernels may still use the old buffer, so the
 * stream is waited for first; growing geometrically, a run settles after a few calls. */
static void *grow_scratch(thread_gpu *g, void **buffer, size_t *size, size_t bytes) {
    if (bytes > *size) {
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        CUDA_CHECK(cudaFree(*buffer));
        size_t grown = *size * 2 > bytes ? *size * 2 : bytes;
        *buffer = NULL;
        *size = 0;
        CUDA_CHECK(cudaMalloc(buffer, grown));
        *size = grown;
    }
    return *buffer;
}

void *cuda_thread_scratch(size_t bytes) {
    thread_gpu *g = require_gpu("scratch");
    return grow_scratch(g, &g->scratch, &g->scratch_bytes, bytes);
}

void *cuda_thread_mixed_scratch(size_t bytes) {
    thread_gpu *g = require_gpu("16-bit scratch");
    return grow_scratch(g, &g->mixed_scratch, &g->mixed_scratch_bytes, bytes);
}

/* ---- device memory through the cache ---------------------------------------------- */

/* A block's memory back to CUDA, once the stream that freed it is past its last use. */
static void give_back(cached_block *b) {
    if (b->freed_event) {
        CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)b->freed_event));
        CUDA_CHECK(cudaEventDestroy((cudaEvent_t)b->freed_event));
    }
    CUDA_CHECK(cudaFree(b->ptr));
    free(b);
}

/* cudaMalloc, after giving the idle blocks of this GPU back when memory runs short. */
static cached_block *allocate_block(thread_gpu *g, size_t capacity) {
    cached_block *b = calloc(1, sizeof *b);
    if (!b) { fprintf(stderr, "error: out of host memory\n"); exit(1); }
    b->gpu = g->gpu;
    b->capacity = capacity;
    cudaError_t err = cudaMalloc(&b->ptr, capacity);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        pthread_mutex_lock(&pool_lock);
        cached_block *idle = block_cache_drain(&memory_cache, g->gpu);
        pthread_mutex_unlock(&pool_lock);
        while (idle) {
            cached_block *next = idle->next;
            give_back(idle);
            idle = next;
        }
        err = cudaMalloc(&b->ptr, capacity);
    }
    if (err != cudaSuccess) {
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        fprintf(stderr, "error: cudaMalloc of %zu bytes on GPU %d failed (%s); "
                        "%zu of %zu bytes free\n",
                capacity, g->gpu, cudaGetErrorString(err), free_bytes, total_bytes);
        exit(1);
    }
    return b;
}

void *cuda_device_malloc(size_t bytes) {
    thread_gpu *g = require_gpu("device_malloc");
    pthread_mutex_lock(&pool_lock);
    cached_block *b = block_cache_take(&memory_cache, g->gpu, bytes);
    pthread_mutex_unlock(&pool_lock);
    if (b && b->freed_event)   /* usually long past: the freeing stream moved on */
        CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)b->freed_event));
    if (!b) b = allocate_block(g, block_cache_round(bytes));
    /* mem_alloc_on promises zero-filled memory, like the host allocator; accumulated
     * gradients rely on it. Waited for here, so the block is ready for any stream. */
    CUDA_CHECK(cudaMemsetAsync(b->ptr, 0, b->capacity, g->fill_stream));
    CUDA_CHECK(cudaStreamSynchronize(g->fill_stream));
    pthread_mutex_lock(&pool_lock);
    block_cache_track(&memory_cache, b);
    pthread_mutex_unlock(&pool_lock);
    return b->ptr;
}

void cuda_device_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&pool_lock);
    cached_block *b = block_cache_release(&memory_cache, ptr);
    pthread_mutex_unlock(&pool_lock);
    if (!b) {
        fprintf(stderr, "error: device_free of %p, which device_malloc did not give\n", ptr);
        abort();
    }
    thread_gpu *g = current_gpu;
    if (!g || g->gpu != b->gpu) {
        /* Freed from a thread of no GPU or another one (a job's teardown): no stream of
         * this thread orders the block's uses, so it goes back to CUDA, which waits. */
        if (g) CUDA_CHECK(cudaStreamSynchronize(g->stream));
        give_back(b);
        return;
    }
    /* Work queued on this thread's stream may still use the block: the event marks
     * the point after which it is free; the next user waits for it. */
    if (!b->freed_event)
        CUDA_CHECK(cudaEventCreateWithFlags((cudaEvent_t *)&b->freed_event,
                                            cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord((cudaEvent_t)b->freed_event, g->stream));
    pthread_mutex_lock(&pool_lock);
    block_cache_keep(&memory_cache, b);
    pthread_mutex_unlock(&pool_lock);
}
