/* The threads backend's point-to-point messages: a mailbox per receiver, in which a
 * send leaves a copy of its bytes (buffered, the default) or waits until the receiver
 * has taken them (rendezvous, as NCCL's send). The receiver takes the oldest message of
 * its (source, tag) and holds for the modelled link. */
#include "comm_threads_p2p.h"

#include <stdlib.h>

#ifndef USE_MPI
/* A receiver copies the bytes itself: a sender has nothing to move (an MPI build: see
 * comm_mpi_progress.c, which serves this backend too). */
void comm_progress(comm *c) { (void)c; }
#endif

static void message_release(message *msg) {
    if (atomic_fetch_sub(&msg->refs, 1) == 1) free(msg);
}

/* Rendezvous: the sender holds until the receiver has taken msg (or the deadline). A
 * message still in the box when the job stops is freed with the group. */
static void wait_taken(comm *c, const comm_call *call, mailbox *box, message *msg) {
    double start = comm_now();
    pthread_mutex_lock(&box->lock);
    while (!msg->taken) {
        double waited = comm_now() - start;
        if (comm_job_stopping(c->job) || waited > c->job->opts.timeout_seconds) {
            pthread_mutex_unlock(&box->lock);
            message_release(msg);
            if (comm_job_stopping(c->job)) comm_leave_thread();
            comm_fail_timeout(c, call, call->root, waited);
        }
        threads_timed_wait(&box->arrived, &box->lock, POLL_SECONDS);
    }
    pthread_mutex_unlock(&box->lock);
    message_release(msg);
}

void threads_send(comm *c, const comm_call *call) {
    size_t bytes = call->count * comm_dtype_size(call->dt);
    if (comm_job_stopping(c->job)) comm_leave_thread();
    /* before the message exists: a link slower than the timeout stops the rank here */
    const double arrival = comm_now() + threads_link_seconds(c, call, call->root, bytes);
    /* Plain malloc: the receiver (or, rendezvous, the last of the two) frees it, and the
     * memory accounting is per rank. */
    message *msg = malloc(sizeof *msg + bytes);
    if (!msg) comm_fail(c, "out of memory sending %zu bytes", bytes);
    int rendezvous = c->job->opts.send_mode == COMM_SEND_RENDEZVOUS;
    *msg = (message){.source = c->rank, .tag = call->tag, .bytes = bytes,
                     .arrival = arrival, .rendezvous = rendezvous};
    atomic_init(&msg->refs, rendezvous ? 2 : 1);
    threads_compute_done(c);
    if (bytes) threads_move_bytes(c, msg->data, call->send, bytes, 0);
    mailbox *box = &((threads_comm *)c->impl)->g->boxes[call->root];
    pthread_mutex_lock(&box->lock);
    message **link = &box->head;
    while (*link) link = &(*link)->next;
    *link = msg;
    pthread_cond_broadcast(&box->arrived);
    pthread_mutex_unlock(&box->lock);
    comm_count(NULL, c, COMM_KIND_SENDRECV, comm_tier_to(c, call->root), bytes);
    if (rendezvous) wait_taken(c, call, box, msg);
}

void threads_recv(comm *c, const comm_call *call) {
    size_t bytes = call->count * comm_dtype_size(call->dt);
    mailbox *box = &((threads_comm *)c->impl)->g->boxes[c->rank];
    double start = comm_now();
    message *msg = NULL;
    pthread_mutex_lock(&box->lock);
    while (!msg) {
        for (message **link = &box->head; *link; link = &(*link)->next)
            if ((*link)->source == call->root && (*link)->tag == call->tag) {
                msg = *link;        /* the oldest message of this (source, tag) */
                *link = msg->next;
                break;
            }
        if (msg) break;
        double waited = comm_now() - start;
        if (comm_job_stopping(c->job) || waited > c->job->opts.timeout_seconds) {
            pthread_mutex_unlock(&box->lock);
            if (comm_job_stopping(c->job)) comm_leave_thread();
            comm_fail_timeout(c, call, call->root, waited);
        }
        threads_timed_wait(&box->arrived, &box->lock, POLL_SECONDS);
    }
    pthread_mutex_unlock(&box->lock);
    if (msg->bytes != bytes) {
        const size_t sent = msg->bytes;
        message_release(msg);   /* out of the box: nobody else would free it */
        comm_fail(c, "recv on '%s': rank %d sent %zu bytes with tag %d, rank %d expects %zu",
                  c->name, c->world_ranks[call->root], sent, call->tag,
                  comm_world_rank(c), bytes);
    }
    threads_compute_done(c);   /* queued compute may still read the old contents */
    if (bytes) threads_move_bytes(c, call->recv, msg->data, bytes, 0);
    const comm_tier tier = comm_tier_to(c, call->root);
    comm_count(c, NULL, COMM_KIND_SENDRECV, tier, bytes);
    comm_count_link(c, tier, comm_link_seconds(c->job, tier, bytes));
    if (!msg->rendezvous) {
        threads_sleep_until(msg->arrival);
        message_release(msg);
        return;
    }
    /* Rendezvous: the bytes start moving once both ranks are here; both finish then. */
    double link = comm_link_seconds(c->job, tier, bytes), sent_at = msg->arrival - link;
    threads_sleep_until((start > sent_at ? start : sent_at) + link);
    pthread_mutex_lock(&box->lock);
    msg->taken = 1;
    pthread_cond_broadcast(&box->arrived);
    pthread_mutex_unlock(&box->lock);
    message_release(msg);
}
