#include "gil.h"

#include "comm.h"   /* comm_now */

void gil_init(gil *g) {
    pthread_mutex_init(&g->mutex, NULL);
    pthread_cond_init(&g->turn_changed, NULL);
    g->next_ticket = 0;
    g->now_serving = 0;
}

void gil_destroy(gil *g) {
    pthread_cond_destroy(&g->turn_changed);
    pthread_mutex_destroy(&g->mutex);
}

void gil_acquire(gil *g, gil_account *a) {
    double asked = comm_now();
    pthread_mutex_lock(&g->mutex);
    unsigned long ticket = g->next_ticket++;
    while (g->now_serving != ticket) pthread_cond_wait(&g->turn_changed, &g->mutex);
    pthread_mutex_unlock(&g->mutex);
    a->held_since = comm_now();
    a->wait_seconds += a->held_since - asked;
    a->acquisitions++;
}

void gil_release(gil *g, gil_account *a) {
    a->held_seconds += comm_now() - a->held_since;
    pthread_mutex_lock(&g->mutex);
    g->now_serving++;
    pthread_cond_broadcast(&g->turn_changed);
    pthread_mutex_unlock(&g->mutex);
}

static void op_begin(void *ctx, op_kind kind) {
    gil_thread *t = ctx;
    gil_acquire(t->lock, &t->account);   /* Python has to reach the op */
    if (op_is_kernel(kind) && t->release_in_kernels) gil_release(t->lock, &t->account);
}

static void op_end(void *ctx, op_kind kind) {
    gil_thread *t = ctx;
    if (!op_is_kernel(kind) || !t->release_in_kernels) gil_release(t->lock, &t->account);
}

ops_observer gil_op_observer(gil_thread *t) {
    return (ops_observer){.begin = op_begin, .end = op_end, .ctx = t};
}
