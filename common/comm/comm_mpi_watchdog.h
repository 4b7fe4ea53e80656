/* The MPI backend's timeouts for blocking calls. MPI has none: a collective whose
 * peer is stuck never returns. Around every blocking MPI call the caller arms the
 * watchdog, a thread of its own; if the call has not returned by the deadline
 * (comm_options.timeout_seconds), it reports where this rank is stuck
 * (comm_fail_timeout) and that ends the job. */
#ifndef COMM_MPI_WATCHDOG_H
#define COMM_MPI_WATCHDOG_H
#include "comm_internal.h"

void mpi_watchdog_start(void);   /* once per process, after MPI_Init_thread */
void mpi_watchdog_stop(void);    /* at exit: the thread joined */
void mpi_watchdog_arm(comm *c, const comm_call *call);   /* before a blocking call */
void mpi_watchdog_disarm(void);                          /* after it returned */

#endif
