/* The threads backend's collectives (comm_threads_algorithms.c). */
#ifndef COMM_THREADS_ALGORITHMS_H
#define COMM_THREADS_ALGORITHMS_H
#include "comm_threads_steps.h"

/* Scratch one collective needs on a rank, and the collective run on this thread. */
size_t threads_scratch_bytes(const comm *c, const comm_call *call);
void threads_execute(comm *c, const comm_call *call, void *scratch);
void threads_barrier(comm *c, const comm_call *call);

#endif
