/* Which device this rank computes on. CPU builds only ever have DEVICE_CPU; a GPU=1
 * build picks CUDA at run time when a GPU is present (see gpu/). */
#ifndef DEVICE_H
#define DEVICE_H
#include <stddef.h>

typedef enum { DEVICE_CPU, DEVICE_CUDA } device_kind;

device_kind device_current(void);          /* per thread (= per rank) */
void device_select(device_kind kind, int gpu_index);
int device_gpu_count(void);                /* 0 without a GPU or in a CPU build */
const char *device_name(device_kind kind);

/* Raw device memory; use mem_alloc_on() instead so that bytes are counted. */
void *device_malloc(size_t bytes);
void device_free(void *ptr);

#endif
