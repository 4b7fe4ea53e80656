/* A global interpreter lock, as torch.nn.DataParallel's threads meet it in CPython.
 *
 * One lock for the whole process; a thread must hold it to run any op. It is handed
 * over first come, first served (a ticket lock), which is what CPython's "forced
 * switching" amounts to: a waiting thread asks, the holder lets go at its next op
 * boundary, and the waiter runs next. Each thread keeps its own count of how long it
 * waited for the lock and how long it held it, so the table can show the queue. */
#ifndef GIL_H
#define GIL_H
#include <pthread.h>

#include "ops.h"

typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t turn_changed;
    unsigned long next_ticket;   /* handed to the next thread that asks */
    unsigned long now_serving;   /* the ticket that may hold the lock */
} gil;

/* What one thread spent on the lock. */
typedef struct {
    double wait_seconds;   /* asking for the lock while another thread held it */
    double held_seconds;   /* holding it */
    double held_since;
    long acquisitions;
} gil_account;

/* A thread that runs a replica: the lock it must take and what it spent on it. */
typedef struct {
    gil *lock;
    int release_in_kernels;   /* --gil release: matmuls and attention run without it */
    gil_account account;
} gil_thread;

/* The model's ops, each taken under the lock as Python calls them (ops_observe): the
 * light ops (LayerNorm, GELU, residual adds, embedding, loss) keep the lock while they
 * run; the kernels (matmuls, attention) are called with it and, with
 * release_in_kernels, let it go while they run, like C++ code between
 * Py_BEGIN/END_ALLOW_THREADS. The ops and their order are the model's own
 * (common/model.c): only the lock around each op is new. */
ops_observer gil_op_observer(gil_thread *t);

void gil_init(gil *g);
void gil_destroy(gil *g);
void gil_acquire(gil *g, gil_account *a);
void gil_release(gil *g, gil_account *a);

#endif
