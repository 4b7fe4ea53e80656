/* The device layer of every build: which device each thread computes on, and the calls
 * into the GPU backend's table (device.h) when there is one. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>

/* Per thread, because a rank is a thread (or the one thread of a process). */
static _Thread_local device_kind current_kind = DEVICE_CPU;

const char *device_check(device_kind requested, char *why, size_t why_len) {
    if (requested != DEVICE_CUDA) return NULL;
    if (!device_gpu_backend()) {
        snprintf(why, why_len, "--device cuda: this build has no GPU support (build with"
                 " GPU=1, or use --device cpu)");
        return why;
    }
    if (device_gpu_count() > 0) return NULL;
    char cuda[160];
    snprintf(why, why_len, "--device cuda: no GPU is visible to this process (CUDA says: %s);"
             " use --device cpu or auto", device_no_gpu_reason(cuda, sizeof cuda));
    return why;
}

/* A GPU asked for where device_check would have refused it: the caller's bug (the
 * command line checks --device before any rank starts). */
static _Noreturn void no_such_gpu(const char *what) {
    fprintf(stderr, "error: %s\n", what);
    abort();
}

/* The GPU backend, or stops naming what needed it. */
static const device_backend *require_gpu_backend(const char *what) {
    const device_backend *gpu = device_gpu_backend();
    if (!gpu) {
        fprintf(stderr, "error: %s: this build has no GPU support (rebuild with GPU=1)\n",
                what);
        abort();
    }
    return gpu;
}

device_kind device_current(void) { return current_kind; }

void device_select(device_kind kind, int gpu_index) {
    if (kind != DEVICE_CUDA) {   /* the GPU's objects stay: the thread may come back */
        current_kind = DEVICE_CPU;
        return;
    }
    const device_backend *gpu = require_gpu_backend("a GPU was selected");
    const int count = device_gpu_count();
    if (gpu_index < 0 || gpu_index >= count) {
        char what[96];
        snprintf(what, sizeof what, "GPU %d requested, but %d GPU%s visible", gpu_index,
                 count, count == 1 ? " is" : "s are");
        no_such_gpu(what);
    }
    gpu->select(gpu_index);
    current_kind = DEVICE_CUDA;
}

const struct ops_table *device_ops(void) {
    return current_kind == DEVICE_CUDA ? device_gpu_backend()->ops : NULL;
}

const struct mixed_ops_table *device_mixed_ops(void) {
    return current_kind == DEVICE_CUDA ? device_gpu_backend()->mixed : NULL;
}

int device_gpu_count(void) {
    const device_backend *gpu = device_gpu_backend();
    char why[8];
    return gpu ? gpu->gpu_count(why, sizeof why) : 0;
}

const char *device_no_gpu_reason(char *out, size_t size) {
    const device_backend *gpu = device_gpu_backend();
    if (!gpu) snprintf(out, size, "this build has no GPU support (GPU=1)");
    else if (gpu->gpu_count(out, size) > 0 && size) out[0] = '\0';
    return out;
}

void device_gpu_name(int gpu, char *out, size_t size) {
    const device_backend *backend = device_gpu_backend();
    if (backend) backend->gpu_name(gpu, out, size);
    else snprintf(out, size, "?");
}

const char *device_name(device_kind kind) {
    return kind == DEVICE_CUDA ? "cuda" : kind == DEVICE_AUTO ? "auto" : "cpu";
}

device_kind device_resolve(device_kind requested) {
    if (requested != DEVICE_AUTO) return requested;
    return device_gpu_count() > 0 ? DEVICE_CUDA : DEVICE_CPU;
}

device_kind device_select_for_rank(device_kind requested, int tf32, int index) {
    if (device_resolve(requested) != DEVICE_CUDA) {
        device_select(DEVICE_CPU, 0);
        return DEVICE_CPU;
    }
    const device_backend *gpu = require_gpu_backend("--device cuda");
    const int gpus = device_gpu_count();
    char why[256];
    if (gpus == 0) no_such_gpu(device_check(DEVICE_CUDA, why, sizeof why));
    device_select(DEVICE_CUDA, index % gpus);
    gpu->set_tf32(tf32);
    return DEVICE_CUDA;
}

void *device_malloc(size_t bytes) {
    if (current_kind != DEVICE_CUDA) {
        fprintf(stderr, "error: device_malloc on a thread that computes on the CPU\n");
        abort();
    }
    return device_gpu_backend()->malloc(bytes);
}

void device_free(void *ptr) {
    if (!ptr) return;
    require_gpu_backend("device_free")->free(ptr);
}
