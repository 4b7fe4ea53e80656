/* All-to-all over Open MPI (comm_mpi_alltoall.c), for the MPI backend. */
#ifndef COMM_MPI_ALLTOALL_H
#define COMM_MPI_ALLTOALL_H
#include <mpi.h>

#include "comm_internal.h"

/* The -v form: every rank learns what each peer will send it (one count each, on
 * `check`) and a receiver whose recv_counts disagree stops the job naming both ranks,
 * before MPI could truncate or mix up a message. Returns MPI's error code. */
int mpi_check_alltoallv_counts(comm *c, const comm_call *call, MPI_Comm check);
/* Issues MPI_Alltoall(v) on `data`: blocking, or not when req is given. The int
 * counts and displacements go in *counts (malloc'd; the caller frees them after
 * completion). Counts or offsets above INT_MAX are refused, naming the count. */
int mpi_issue_alltoall(comm *c, const comm_call *call, MPI_Comm data, MPI_Datatype type,
                       int **counts, MPI_Request *req);

#endif
