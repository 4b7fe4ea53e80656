/* Where a rank computes, and the one seam between common/ and a GPU backend.
 *
 * device_kind is the project's one device enum: the command line, comm_options and the
 * ops all use it. DEVICE_AUTO is only ever a request ("CUDA when a GPU is visible, else
 * the CPU"); a thread always computes on DEVICE_CPU or DEVICE_CUDA.
 *
 * A GPU backend hands common/ one table, device_gpu_backend(): its device functions, its
 * ops (ops.h's ops_table) and its communicator hooks (comm_internal.h). gpu/ provides it
 * in GPU=1 builds, device_cpu.c (NULL: no GPU) in CPU builds; the link picks, as it picks
 * the communicator backends. common/ includes no header of gpu/. */
#ifndef DEVICE_H
#define DEVICE_H
#include <stddef.h>

typedef enum { DEVICE_CPU, DEVICE_CUDA, DEVICE_AUTO } device_kind;

struct ops_table;        /* ops.h */
struct mixed_ops_table;  /* ops_mixed_table.h */
struct comm_gpu_hooks;   /* comm_internal.h */

typedef struct device_backend {
    const char *name;   /* "cuda" */
    /* GPUs visible to this process; 0 with the driver's reason written to why */
    int (*gpu_count)(char *why, size_t why_size);
    void (*select)(int gpu);            /* the calling thread computes on this GPU */
    void *(*malloc)(size_t bytes);      /* zero-filled, on the calling thread's GPU */
    void (*free)(void *ptr);
    void (*set_tf32)(int on);           /* process-wide: matmuls may use TF32 */
    void (*gpu_name)(int gpu, char *out, size_t size);   /* "NVIDIA H200" */
    const struct ops_table *ops;
    const struct mixed_ops_table *mixed;   /* the 16-bit ops (bf16, fp16) */
    const struct comm_gpu_hooks *comm;
} device_backend;

/* The GPU backend linked into this program, or NULL in a CPU-only build. */
const device_backend *device_gpu_backend(void);

/* ---- the calling thread's device (a rank's; common/device.c) ----------------------- */
device_kind device_current(void);
/* DEVICE_CPU, or DEVICE_CUDA on GPU gpu_index (one there: device_check first). */
void device_select(device_kind kind, int gpu_index);
/* The ops of the thread's GPU, or NULL when it computes on the CPU (ops.c). */
const struct ops_table *device_ops(void);
/* Its 16-bit ops (ops_mixed_table.h), or NULL on the CPU. */
const struct mixed_ops_table *device_mixed_ops(void);

/* ---- the machine ------------------------------------------------------------------- */
int device_gpu_count(void);   /* 0 without a GPU or in a CPU build */
/* Why no GPU is visible, in one phrase: "this build has no GPU support (GPU=1)" or
 * what CUDA said; "" when there is one. */
const char *device_no_gpu_reason(char *out, size_t size);
/* The GPU's name for run headers; "?" when unknown. */
void device_gpu_name(int gpu, char *out, size_t size);
const char *device_name(device_kind kind);   /* "cpu", "cuda", "auto" */
/* Why `requested` cannot be had on this machine (--device cuda without a GPU build or a
 * visible GPU): one line in why, returned; NULL when it can (cpu and auto always). */
const char *device_check(device_kind requested, char *why, size_t why_len);
/* AUTO made concrete: CUDA when a GPU is visible, else CPU; the others as they are. */
device_kind device_resolve(device_kind requested);

/* Makes the calling thread compute where `requested` says, as launch does for every
 * rank: the index-th rank of a process gets GPU index % GPUs, and tf32 is applied.
 * Returns DEVICE_CPU or DEVICE_CUDA; CUDA asked for must be there (device_check). */
device_kind device_select_for_rank(device_kind requested, int tf32, int index);

/* Raw device memory; use mem_alloc_on() instead so that bytes are counted. */
void *device_malloc(size_t bytes);
void device_free(void *ptr);

#endif
