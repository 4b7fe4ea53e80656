/* The CPU-only build: there is no GPU, and asking for one is a programming error. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>

device_kind device_current(void) { return DEVICE_CPU; }

void device_select(device_kind kind, int gpu_index) {
    (void)gpu_index;
    if (kind != DEVICE_CPU) {
        fprintf(stderr, "error: this build has no GPU support (rebuild with GPU=1)\n");
        exit(2);
    }
}

int device_gpu_count(void) { return 0; }
const char *device_name(device_kind kind) { return kind == DEVICE_CUDA ? "cuda" : "cpu"; }

void *device_malloc(size_t bytes) {
    (void)bytes;
    fprintf(stderr, "error: device_malloc in a CPU build\n");
    abort();
}

void device_free(void *ptr) {
    (void)ptr;
    fprintf(stderr, "error: device_free in a CPU build\n");
    abort();
}
