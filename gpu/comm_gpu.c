/* GPU buffers in the communicator's host-side backends: the threads backend when ranks
 * share GPUs (NCCL refuses two ranks on one GPU), and the MPI backend when processes
 * do. Those backends move bytes with host code; on CUDA ranks they call these instead.
 *
 * Each (rank, group) has a stream of its own, so that its copies and reductions queue
 * behind nothing of the rank's compute, and a staging buffer. A copy is one
 * cudaMemcpyAsync in whatever direction the pointers ask (unified addressing); a
 * reduction is a kernel on this GPU over the inputs that lie on it, with any other
 * input (host memory, another GPU) staged in first and the result staged out. Every
 * call waits for its own stream before returning: the backend publishes the step right
 * after, and a peer then reads the result. Work that touches host memory only runs on
 * the host, as on the CPU path (a rank's stack scalars, its host vectors).
 *
 * Copies have memmove semantics, as the host backends' copies do (an in-place
 * all-gather's own piece may overlap): cudaMemcpyAsync on overlapping ranges is
 * undefined, so an overlapping copy goes through the staging buffer.
 *
 * common/ reaches these through the hooks of comm_internal.h (gpu/backend.c). */
#include <stdlib.h>
#include <string.h>

#include "comm_gpu.h"
#include "comm_gpu_kernels.h"
#include "cuda_check.h"
#include "device.h"
#include "ops_cuda.h"
#include "overlap.h"

struct comm_gpu {
    int gpu;
    cudaStream_t stream;
    char *stage;   /* device memory on gpu: inputs a kernel there cannot read in place */
    size_t stage_bytes;
};

/* The GPU that holds ptr, or -1 for host memory (pageable or pinned). */
static int location(const void *ptr) {
    struct cudaPointerAttributes attr;
    if (!ptr || cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError();   /* older runtimes report plain host memory as an error */
        return -1;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged
               ? attr.device
               : -1;
}

int comm_cuda_is_device(const void *ptr) { return location(ptr) >= 0; }

comm_gpu *comm_cuda_open(void) {
    comm_gpu *g = calloc(1, sizeof *g);
    if (!g) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    g->gpu = cuda_thread_gpu();   /* exits with a message unless the thread chose a GPU */
    CUDA_CHECK(cudaSetDevice(g->gpu));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    return g;
}

void comm_cuda_close(comm_gpu *g) {
    if (!g) return;
    /* best effort: at the end of a job the process may be on its way out */
    cudaSetDevice(g->gpu);
    cudaStreamSynchronize(g->stream);
    cudaStreamDestroy(g->stream);
    cudaFree(g->stage);
    free(g);
}

static void finish(comm_gpu *g) { CUDA_CHECK(cudaStreamSynchronize(g->stream)); }

/* Staging of at least `bytes`; what the stream queued before has finished (finish()
 * ends every call), so the old buffer may go. */
static char *stage(comm_gpu *g, size_t bytes) {
    if (bytes > g->stage_bytes) {
        CUDA_CHECK(cudaFree(g->stage));
        g->stage = NULL;
        g->stage_bytes = 0;
        CUDA_CHECK(cudaMalloc((void **)&g->stage, bytes));
        g->stage_bytes = bytes;
    }
    return g->stage;
}

void comm_cuda_copy(comm_gpu *g, void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    if (location(dst) < 0 && location(src) < 0) {
        memmove(dst, src, bytes);   /* an in-place all-gather may overlap */
        return;
    }
    CUDA_CHECK(cudaSetDevice(g->gpu));
    if (ranges_overlap(dst, src, bytes)) {   /* one allocation: memmove through staging */
        char *staged = stage(g, bytes);
        CUDA_CHECK(cudaMemcpyAsync(staged, src, bytes, cudaMemcpyDefault, g->stream));
        src = staged;
    }
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->stream));
    finish(g);
}

static size_t aligned(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

void comm_cuda_reduce(comm_gpu *g, void *dst, const void *a, const void *b, size_t count,
                      comm_dtype dt, comm_op op) {
    if (count == 0) return;
    const int on_dst = location(dst), on_a = location(a), on_b = location(b);
    if (on_dst < 0 && on_a < 0 && on_b < 0) {
        comm_reduce_buffers(dst, a, b, count, dt, op);
        return;
    }
    CUDA_CHECK(cudaSetDevice(g->gpu));
    const size_t bytes = count * comm_dtype_size(dt), slot = aligned(bytes);
    const int away_a = on_a != g->gpu, away_b = on_b != g->gpu, away_dst = on_dst != g->gpu;
    char *staged = away_a || away_b || away_dst
                       ? stage(g, slot * (size_t)(away_a + away_b + away_dst))
                       : NULL;
    const void *ka = a, *kb = b;
    void *kd = dst;
    if (away_a) {
        CUDA_CHECK(cudaMemcpyAsync(staged, a, bytes, cudaMemcpyDefault, g->stream));
        ka = staged;
        staged += slot;
    }
    if (away_b) {
        CUDA_CHECK(cudaMemcpyAsync(staged, b, bytes, cudaMemcpyDefault, g->stream));
        kb = staged;
        staged += slot;
    }
    if (away_dst) kd = staged;
    cuda_comm_reduce(kd, ka, kb, count, (int)dt, (int)op, g->stream);
    if (away_dst) CUDA_CHECK(cudaMemcpyAsync(dst, kd, bytes, cudaMemcpyDefault, g->stream));
    finish(g);
}

void comm_cuda_divide(comm_gpu *g, void *buf, size_t count, comm_dtype dt, int divisor) {
    if (count == 0) return;
    const int on = location(buf);
    if (on < 0) {
        comm_divide_buffer(buf, count, dt, divisor);
        return;
    }
    CUDA_CHECK(cudaSetDevice(g->gpu));
    const size_t bytes = count * comm_dtype_size(dt);
    void *work = buf;
    if (on != g->gpu) {   /* another GPU's buffer: divide a copy here */
        work = stage(g, bytes);
        CUDA_CHECK(cudaMemcpyAsync(work, buf, bytes, cudaMemcpyDefault, g->stream));
    }
    cuda_comm_divide(work, count, (int)dt, divisor, g->stream);
    if (work != buf) CUDA_CHECK(cudaMemcpyAsync(buf, work, bytes, cudaMemcpyDefault, g->stream));
    finish(g);
}

void comm_cuda_compute_done(void) {
    if (device_current() == DEVICE_CUDA) cuda_ops_synchronize();
}

void *comm_cuda_compute_mark(void) {
    if (device_current() != DEVICE_CUDA) return NULL;
    cudaEvent_t mark;
    CUDA_CHECK(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(mark, cuda_thread_stream()));
    return mark;
}

void comm_cuda_wait_mark(void *mark) {
    if (!mark) return;
    CUDA_CHECK(cudaEventSynchronize((cudaEvent_t)mark));
    CUDA_CHECK(cudaEventDestroy((cudaEvent_t)mark));
}
