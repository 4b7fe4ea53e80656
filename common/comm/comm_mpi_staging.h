/* Device buffers under the MPI backend: calls on them run on host copies
 * (comm_mpi_staging.c). */
#ifndef COMM_MPI_STAGING_H
#define COMM_MPI_STAGING_H
#include "comm_internal.h"

/* When a call touches device memory: `host` becomes the same call on host copies (its
 * send side filled in) and 1 is returned; mpi_stage_out brings the result back and
 * frees the copies. Otherwise `host` is the call itself and 0 is returned. */
int mpi_stage_in(comm *c, const comm_call *call, comm_call *host);
void mpi_stage_out(comm *c, const comm_call *call, comm_call *host);

#ifdef USE_CUDA
/* The process's GPU staging, set by mpi_launch on CUDA ranks that are not NCCL's. */
comm_gpu *mpi_staging_gpu(comm *c);
/* malloc, or a failure naming the bytes. */
void *mpi_host_block(comm *c, size_t bytes);
#endif

#endif
