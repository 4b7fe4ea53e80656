/* The threads backend's point to point messages (comm_threads_p2p.c). */
#ifndef COMM_THREADS_P2P_H
#define COMM_THREADS_P2P_H
#include "comm_threads_steps.h"

void threads_send(comm *c, const comm_call *call);
void threads_recv(comm *c, const comm_call *call);

#endif
