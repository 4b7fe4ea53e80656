/* What the threads backend's files share: a group's state as every member sees it,
 * and the steps the collectives are written with (comm_threads_steps.c). Above it:
 * comm_threads_p2p.c (the mailboxes), comm_threads_algorithms.c (the collectives),
 * comm_threads.c (requests, groups, the backend's table). */
#ifndef COMM_THREADS_STEPS_H
#define COMM_THREADS_STEPS_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm_internal.h"

/* ---- a group's shared state -------------------------------------------------------- */
typedef struct group group;

typedef struct {
    _Alignas(64) _Atomic uint32_t progress;
    _Atomic uint32_t waiters;   /* ranks sleeping on progress: wake them */
    comm_call call;             /* the collective it is in, and its buffers for it */
    const void *send;           /* (valid from step 0 of that collective) */
    void *recv, *scratch;
    comm *owner;                /* its comm: peers count the bytes they copy from it */
    int split_color, split_key;
    group *split_result;
} member;

typedef struct message {
    struct message *next;
    int source, tag;
    size_t bytes;
    double arrival;             /* when the modelled link delivers the last byte */
    int rendezvous;             /* the sender waits until taken (under the box's lock) */
    int taken;
    _Atomic int refs;           /* sender (rendezvous) and receiver: the last one frees */
    char data[];
} message;

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t arrived;
    message *head;
} mailbox;

struct group {
    int size;
    _Atomic int refs;           /* members that have not freed their comm */
    member *members;            /* [size], one cache line each */
    mailbox *boxes;             /* [size]: messages to each member */
    group *next_made;           /* the job's list of the groups not yet freed */
};

/* ---- one rank's view of a group ---------------------------------------------------- */
typedef struct {
    group *g;
    uint32_t base;              /* progress value at the end of the last collective */
    double spin_seconds;
    void *scratch;              /* for collectives run on the rank's own thread */
    size_t scratch_bytes;
    pthread_mutex_t lock;       /* the queue of started requests: */
    pthread_cond_t wake, done;
    comm_request *head, *tail;
    int pending;                /* started, not finished */
    int closing, has_worker;
    pthread_t worker;
#ifdef USE_CUDA
    comm_gpu *gpu;              /* the rank computes on a GPU: buffers may be device memory */
#endif
} threads_comm;

typedef struct {
    group *world;
    double spin_seconds;
    /* Every group not yet freed: a split that fails half-way (a rank stopped between
     * its barriers) leaves a group some members never joined, freed with the job. */
    pthread_mutex_t groups_lock;
    group *groups;
} threads_job;


static inline int mod(int a, int n) { return ((a % n) + n) % n; }
static inline member *member_of(comm *c, int rank) {
    return &((threads_comm *)c->impl)->g->members[rank];
}
static inline char *at(const void *base, size_t index, const comm_call *call) {
    return (char *)base + index * comm_dtype_size((comm_dtype)call->dt);
}


/* pthread_cond_init on CLOCK_MONOTONIC, as threads_timed_wait expects. */
void threads_cond_init(pthread_cond_t *cond);

#define POLL_SECONDS 0.05   /* how often a sleeping wait looks around */

/* ---- waiting, and the modelled link ----------------------------------------------- */
/* The rank's own compute wrote the buffers it hands over: let it finish. */
void threads_compute_done(comm *c);
/* pthread_cond_timedwait for at most `seconds` (the conditions use CLOCK_MONOTONIC). */
void threads_timed_wait(pthread_cond_t *cond, pthread_mutex_t *lock, double seconds);
/* Holds the copier until comm_now() reaches t: the transfer on the modelled link. */
void threads_sleep_until(double t);
/* The modelled time of one transfer, refused when it is longer than the timeout. */
double threads_link_seconds(comm *c, const comm_call *call, int peer, size_t bytes);

/* ---- what the algorithms use ------------------------------------------------------- */
void threads_move_bytes(comm *c, void *dst, const void *src, size_t bytes, int may_overlap);
void threads_divide(comm *c, void *buf, size_t count, const comm_call *call, int divisor);
/* Step k of this rank's collective is done: its peers may read what it wrote. */
void threads_publish(comm *c, int step);
/* Until rank `peer` of the group has published `step` (a stop or the timeout ends it). */
void threads_wait_step(comm *c, const comm_call *call, int peer, int step);
/* Publishes the call and its buffers (step 0) and checks the left neighbour's call. */
void threads_enter(comm *c, const comm_call *call, const void *send, void *recv,
                   void *scratch);
/* Waits until the right neighbour, which reads this rank's buffers, is done. */
void threads_finish(comm *c, const comm_call *call, int steps);
/* Copies `count` elements of a peer's buffer `theirs` into dst (or, with own, their
 * reduction with own), counting the bytes and holding for the modelled link. */
void threads_pull(comm *c, int peer, void *dst, const void *own, const void *theirs,
                  size_t count, const comm_call *call);

#endif
