/* Runs a Check suite the way every test program here does. */
#ifndef CHECK_RUN_H
#define CHECK_RUN_H
#include <check.h>

/* Runs every test of suite and returns the exit status (0: all passed). Under MPI
 * (under_mpi = 1) tests run without fork(), which MPI does not survive, and only world
 * rank 0's process prints Check's report. */
int check_run(Suite *suite, int under_mpi);

#endif
