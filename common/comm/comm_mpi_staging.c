/* Device buffers under the MPI backend, for processes that share GPUs (GPU=1): this
 * Open MPI cannot read device memory, so a call on device buffers runs on host copies,
 * staged in before and out after. Without GPU=1 nothing is ever staged. */
#include "comm_mpi_staging.h"

#include <stdlib.h>

#ifdef USE_CUDA
comm_gpu *mpi_staging_gpu(comm *c) { return c->job->impl; }

void *mpi_host_block(comm *c, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) comm_fail(c, "out of memory staging %zu bytes", bytes);
    return p;
}

/* Bytes of a call's send side (recv_side 0) or receive side on this rank. */
static size_t side_bytes(const comm *c, const comm_call *call, int recv_side) {
    const size_t es = comm_dtype_size(call->dt);
    if (call->kind == COMM_KIND_ALLTOALL)
        return comm_alltoall_extent(call, recv_side, c->size) * es;
    const int shard = recv_side ? call->kind == COMM_KIND_REDUCE_SCATTER
                                : call->kind == COMM_KIND_ALLGATHER;
    return (shard ? comm_shard(call->count, c->size, c->rank, NULL) : call->count) * es;
}

int mpi_stage_in(comm *c, const comm_call *call, comm_call *host) {
    *host = *call;
    comm_gpu *g = mpi_staging_gpu(c);
    if (!g || !((call->send && comm_gpu_is_device(call->send)) ||
                (call->recv && comm_gpu_is_device(call->recv))))
        return 0;
    const size_t send_bytes = side_bytes(c, call, 0), recv_bytes = side_bytes(c, call, 1);
    comm_gpu_compute_done();   /* the rank's kernels made the data */
    host->send = mpi_host_block(c, send_bytes);
    comm_gpu_copy(g, (void *)host->send, call->send, send_bytes);
    /* in place (all-reduce, broadcast, reduce): one buffer, as the caller had */
    host->recv = call->send == call->recv ? (void *)host->send : mpi_host_block(c, recv_bytes);
    return 1;
}

void mpi_stage_out(comm *c, const comm_call *call, comm_call *host) {
    const size_t recv_bytes = side_bytes(c, call, 1);
    /* a non-root of reduce keeps its buffer as it was */
    if (!(call->kind == COMM_KIND_REDUCE && c->rank != call->root))
        comm_gpu_copy(mpi_staging_gpu(c), call->recv, host->recv, recv_bytes);
    if (host->recv != host->send) free(host->recv);
    free((void *)host->send);
}
#else
int mpi_stage_in(comm *c, const comm_call *call, comm_call *host) {
    (void)c;
    *host = *call;
    return 0;
}
void mpi_stage_out(comm *c, const comm_call *call, comm_call *host) {
    (void)c, (void)call, (void)host;
}
#endif
