/* The GPU side of the communicator (gpu/comm_gpu.c, gpu/comm_nccl.c): what
 * gpu/backend.c puts into the comm_gpu_hooks table of comm_internal.h. The semantics of
 * each are those documented there for the hook of the same name. */
#ifndef COMM_GPU_H
#define COMM_GPU_H
#include "comm_internal.h"

/* Device buffers in the host-side backends (comm_gpu.c) */
comm_gpu *comm_cuda_open(void);
void comm_cuda_close(comm_gpu *g);
int comm_cuda_is_device(const void *ptr);
void comm_cuda_copy(comm_gpu *g, void *dst, const void *src, size_t bytes);
void comm_cuda_reduce(comm_gpu *g, void *dst, const void *a, const void *b, size_t count,
                      comm_dtype dt, comm_op op);
void comm_cuda_divide(comm_gpu *g, void *buf, size_t count, comm_dtype dt, int divisor);
void comm_cuda_compute_done(void);
void *comm_cuda_compute_mark(void);
void comm_cuda_wait_mark(void *mark);

/* The NCCL backend's launcher hooks (comm_nccl.c) */
void nccl_backend_unique_id(unsigned char id[NCCL_ID_BYTES]);
comm *nccl_backend_world(comm_job *job, comm_rank_state *rs, int world_rank, int world_size,
                         const unsigned char id[NCCL_ID_BYTES]);
int nccl_backend_run_rank(comm *world, rank_main_fn fn, void *args);

#endif
