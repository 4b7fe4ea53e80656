/* The MPI backend's watchdog: one thread per process that ends the job when a blocking
 * MPI call has not returned by its deadline (see comm_mpi_watchdog.h). */
#include "comm_mpi_watchdog.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int running, quit, armed;
    uint64_t generation;
    double started, deadline;
    comm *c;
    comm_call call;
} watchdog = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *watchdog_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&watchdog.lock);
    while (!watchdog.quit) {
        if (!watchdog.armed) {
            pthread_cond_wait(&watchdog.changed, &watchdog.lock);
            continue;
        }
        uint64_t generation = watchdog.generation;
        double deadline = watchdog.deadline;
        struct timespec until = {.tv_sec = (time_t)deadline};
        until.tv_nsec = (long)((deadline - (double)until.tv_sec) * 1e9);
        pthread_cond_timedwait(&watchdog.changed, &watchdog.lock, &until);
        if (watchdog.armed && watchdog.generation == generation && comm_now() >= deadline) {
            comm *c = watchdog.c;
            comm_call call = watchdog.call;
            double waited = comm_now() - watchdog.started;
            pthread_mutex_unlock(&watchdog.lock);
            comm_fail_timeout(c, &call, -1, waited);   /* reports, then MPI_Abort */
        }
    }
    pthread_mutex_unlock(&watchdog.lock);
    return NULL;
}

void mpi_watchdog_arm(comm *c, const comm_call *call) {
    pthread_mutex_lock(&watchdog.lock);
    watchdog.armed = 1;
    watchdog.generation++;
    watchdog.c = c;
    watchdog.call = *call;
    watchdog.started = comm_now();
    watchdog.deadline = watchdog.started + c->job->opts.timeout_seconds;
    pthread_cond_signal(&watchdog.changed);
    pthread_mutex_unlock(&watchdog.lock);
}

void mpi_watchdog_disarm(void) {
    pthread_mutex_lock(&watchdog.lock);
    watchdog.armed = 0;
    pthread_mutex_unlock(&watchdog.lock);
}

void mpi_watchdog_start(void) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&watchdog.changed, &attr);
    pthread_condattr_destroy(&attr);
    if (pthread_create(&watchdog.thread, NULL, watchdog_main, NULL)) {
        fprintf(stderr, "error: cannot start the MPI watchdog thread\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    watchdog.running = 1;
}

void mpi_watchdog_stop(void) {
    if (!watchdog.running) return;
    pthread_mutex_lock(&watchdog.lock);
    watchdog.quit = 1;
    pthread_cond_signal(&watchdog.changed);
    pthread_mutex_unlock(&watchdog.lock);
    pthread_join(watchdog.thread, NULL);
    watchdog.running = 0;
}
