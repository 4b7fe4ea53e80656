/* comm_progress in an MPI build, for every backend it may run (threads, MPI, NCCL).
 *
 * Open MPI sends a message larger than its eager limit (./run raises the shared-memory
 * one to 256 KB) in pieces, and moves the next piece only inside an MPI call of the
 * sender's. A sender that leaves comm for long, as a rank sleeping out a modelled pass
 * does (pp_execute.c), leaves its receiver waiting. Any call that enters Open MPI's
 * progress engine moves every outstanding request of the process: MPI_Iprobe on
 * MPI_COMM_SELF, where no message is ever sent, matches nothing and disturbs nothing. */
#include "comm_internal.h"

#include <mpi.h>
#include <string.h>

void comm_progress(comm *c) {
    /* threads and NCCL move messages without the sender: nothing to do */
    if (strcmp(c->backend->name, "mpi") != 0) return;
    int found = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &found, MPI_STATUS_IGNORE);
}
