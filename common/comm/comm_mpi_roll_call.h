/* Which ranks said nothing when this one timed out, under MPI.
 *
 * Each process reports only its own state, so a rank stopped outright (SIGSTOP, a
 * debugger) would be named by nobody. Every rank that times out says so to all the
 * others on a communicator of its own, then listens for a second; a rank that has
 * returned from rank_main answers that it has. The lowest rank that timed out names
 * the ranks it did not hear from, and those that had returned. */
#ifndef COMM_MPI_ROLL_CALL_H
#define COMM_MPI_ROLL_CALL_H
#include <mpi.h>

/* A rank waiting for the others after rank_main: answers a roll call that it returned. */
void mpi_roll_call_answer(MPI_Comm roll);
/* A rank that timed out: calls the roll and, if it is the lowest such, names the silent
 * and the returned ranks on stderr. No-op for MPI_COMM_NULL or a single rank. */
void mpi_roll_call_name_silent(MPI_Comm roll);

#endif
