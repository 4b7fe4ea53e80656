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
