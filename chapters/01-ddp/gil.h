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

void gil_init(gil *g);
void gil_destroy(gil *g);
void gil_acquire(gil *g, gil_account *a);
void gil_release(gil *g, gil_account *a);

#endif
