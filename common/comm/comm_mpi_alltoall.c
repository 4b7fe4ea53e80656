/* All-to-all over Open MPI: MPI_Alltoall for the even form, MPI_Alltoallv for the -v
 * form with the counts checked first (comm_mpi_alltoall.h). The caller runs both under
 * the watchdog, after the mismatch check, on host (or staged) buffers. */
#include "comm_mpi_alltoall.h"

#include <limits.h>
#include <stdlib.h>

static int as_int(comm *c, size_t count) {
    if (count > INT_MAX) comm_fail(c, "%zu elements: more than MPI's int counts allow", count);
    return (int)count;
}

int mpi_check_alltoallv_counts(comm *c, const comm_call *call, MPI_Comm check) {
    uint64_t *sending = malloc(2 * (size_t)c->size * sizeof *sending);
    if (!sending) comm_fail(c, "out of memory");
    uint64_t *arriving = sending + c->size;
    for (int j = 0; j < c->size; j++) sending[j] = call->send_counts[j];
    int err = MPI_Alltoall(sending, 1, MPI_UINT64_T, arriving, 1, MPI_UINT64_T, check);
    char why[256];
    const int differ = err == MPI_SUCCESS &&
                       comm_alltoallv_arrivals_differ(c, call, arriving, why, sizeof why);
    free(sending);
    if (differ) comm_fail(c, "%s", why);
    return err;
}

int mpi_issue_alltoall(comm *c, const comm_call *call, MPI_Comm data, MPI_Datatype type,
                       int **counts, MPI_Request *req) {
    int n = c->size;
    if (!call->send_counts) {
        int count = as_int(c, call->count);
        return req ? MPI_Ialltoall(call->send, count, type, call->recv, count, type, data, req)
                   : MPI_Alltoall(call->send, count, type, call->recv, count, type, data);
    }
    int *all = *counts = malloc(4 * (size_t)n * sizeof(int));
    if (!all) comm_fail(c, "out of memory");
    int *send_counts = all, *send_displs = all + n, *recv_counts = all + 2 * n;
    int *recv_displs = all + 3 * n;
    for (int j = 0; j < n; j++) {
        send_counts[j] = as_int(c, call->send_counts[j]);
        send_displs[j] = as_int(c, call->send_offsets[j]);
        recv_counts[j] = as_int(c, call->recv_counts[j]);
        recv_displs[j] = as_int(c, call->recv_offsets[j]);
    }
    return req ? MPI_Ialltoallv(call->send, send_counts, send_displs, type, call->recv,
                                recv_counts, recv_displs, type, data, req)
               : MPI_Alltoallv(call->send, send_counts, send_displs, type, call->recv,
                               recv_counts, recv_displs, type, data);
}
