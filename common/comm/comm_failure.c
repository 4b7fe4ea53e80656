/* When something goes wrong: the flight recorder (the last operations of each rank),
 * the TIMEOUT and MISMATCH reports built from it, comm_fail / comm_abort, and how a
 * rank thread of an in-process backend is stopped. */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- flight recorder: the last COMM_FLIGHT_LEN operations of each rank ------------- */
uint64_t comm_flight_begin(comm *c, const comm_call *call, int state) {
    comm_rank_state *rs = c->rs;
    pthread_mutex_lock(&rs->lock);
    uint64_t id = ++rs->flight_count;
    comm_flight_entry *e = &rs->flight[id % COMM_FLIGHT_LEN];
    *e = (comm_flight_entry){.id = id, .call = *call, .state = state,
                             .t_start = comm_now()};
    snprintf(e->group, sizeof e->group, "%s", c->name);
    pthread_mutex_unlock(&rs->lock);
    return id;
}

void comm_flight_set(comm *c, uint64_t id, int state) {
    comm_rank_state *rs = c->rs;
    if (id == 0) return;
    pthread_mutex_lock(&rs->lock);
    comm_flight_entry *e = &rs->flight[id % COMM_FLIGHT_LEN];
    if (e->id == id && e->state != FLIGHT_DONE) {
        e->state = state;
        if (state == FLIGHT_DONE) e->t_end = comm_now();
    }
    pthread_mutex_unlock(&rs->lock);
}

/* One line for where the rank is, then its recorded operations, oldest first. */
static void flight_report(comm_rank_state *rs) {
    comm_flight_entry log[COMM_FLIGHT_LEN];
    pthread_mutex_lock(&rs->lock);
    memcpy(log, rs->flight, sizeof log);
    uint64_t last = rs->flight_count;
    pthread_mutex_unlock(&rs->lock);
    double now = comm_now();
    char where[160] = "busy outside comm";
    if (atomic_load(&rs->finished) && atomic_load(&rs->status) < 0) {
        snprintf(where, sizeof where, "stopped by this failure");
    } else if (atomic_load(&rs->finished)) {
        snprintf(where, sizeof where, "returned %d from rank_main",
                 atomic_load(&rs->status));
    } else {
        for (uint64_t id = last; id > 0 && id + COMM_FLIGHT_LEN > last; id--) {
            const comm_flight_entry *e = &log[id % COMM_FLIGHT_LEN];
            if (e->id != id || e->state == FLIGHT_DONE) continue;
            char what[96];
            if (e->call.kind == COMM_KIND_SENDRECV) comm_call_describe(&e->call, what, sizeof what);
            else snprintf(what, sizeof what, "%s #%llu", comm_kind_name((comm_kind)e->call.kind),
                          (unsigned long long)e->call.seq);
            snprintf(where, sizeof where, "stuck in %s on group '%s' for %.2f s", what,
                     e->group, now - e->t_start);
            break;
        }
    }
    fprintf(stderr, "comm:   rank %d: %s; last operations:%s\n", rs->world_rank, where,
            last ? "" : " none");
    uint64_t first = last >= COMM_FLIGHT_LEN ? last - COMM_FLIGHT_LEN + 1 : 1;
    for (uint64_t id = first; id <= last; id++) {
        const comm_flight_entry *e = &log[id % COMM_FLIGHT_LEN];
        if (e->id != id) continue;
        char what[96], state[48], number[24] = "";
        comm_call_describe(&e->call, what, sizeof what);
        if (e->call.kind != COMM_KIND_SENDRECV)
            snprintf(number, sizeof number, "#%llu ", (unsigned long long)e->call.seq);
        if (e->state == FLIGHT_DONE)
            snprintf(state, sizeof state, "done in %.3f ms", 1e3 * (e->t_end - e->t_start));
        else
            snprintf(state, sizeof state, "%s for %.2f s",
                     e->state == FLIGHT_QUEUED ? "queued" : "RUNNING", now - e->t_start);
        fprintf(stderr, "comm:     '%s' %s%s %s\n", e->group, number, what, state);
    }
}

/* ---- failures ------------------------------------------------------------------------ */
int comm_claim_failure(comm_job *job) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&job->failed, &expected, 1)) return 1;
    /* Another failure is being reported: let it finish before this rank stops, so the
     * report shows where every rank was, not the ranks that stopped since. */
    for (int i = 0; i < 200 && !atomic_load(&job->reported); i++) {
        struct timespec pause = {.tv_nsec = 5000000};
        nanosleep(&pause, NULL);
    }
    return 0;
}

void comm_note_exit_status(comm_job *job, int status) {
    int unset = 0;
    atomic_compare_exchange_strong(&job->exit_status, &unset, status);
}

int comm_job_exit_status(comm_job *job) {
    const int status = atomic_load(&job->exit_status);
    return status ? status : COMM_EXIT_FAILED;
}

static void reported(comm_job *job) {
    fflush(stderr);
    atomic_store(&job->reported, 1);
}

static _Noreturn void stop_rank(comm *c, double grace_seconds) {
    fflush(stderr);
    c->backend->stop(c, grace_seconds);
    abort();   /* stop never returns */
}

_Noreturn void comm_fail_timeout(comm *c, const comm_call *call, int peer, double waited) {
    comm_note_exit_status(c->job, COMM_EXIT_RANK_LOST);   /* a rank stuck: a restart may cure it */
    if (comm_claim_failure(c->job)) {
        char what[128], waiting[64] = "";
        comm_call_describe(call, what, sizeof what);
        if (call->kind != COMM_KIND_SENDRECV)
            snprintf(what + strlen(what), sizeof what - strlen(what), " #%llu",
                     (unsigned long long)call->seq);
        if (peer >= 0)
            snprintf(waiting, sizeof waiting, " waiting for rank %d", c->world_ranks[peer]);
        fprintf(stderr,
                "comm: TIMEOUT: rank %d waited %.1f s in %s on group '%s' (rank %d of %d)%s; "
                "%s:\n",
                comm_world_rank(c), waited, what, c->name, c->rank, c->size, waiting,
                c->job->nranks > 1 ? "where every rank is" : "its state (every rank reports its own)");
        for (int r = 0; r < c->job->nranks; r++) flight_report(&c->job->ranks[r]);
        if (c->backend->name_silent_ranks) c->backend->name_silent_ranks(c);
        reported(c->job);
    }
    stop_rank(c, 1.0);
}

_Noreturn void comm_fail_slow_link(comm *c, const comm_call *call, size_t bytes,
                                   double seconds) {
    static const char *const links[] = {"none", "nvlink", "ib", "ethernet"};
    comm_note_exit_status(c->job, COMM_EXIT_FAILED);   /* the flags' doing: it comes again */
    if (comm_claim_failure(c->job)) {
        char what[96];
        comm_call_describe(call, what, sizeof what);
        fprintf(stderr, "comm: the modelled link is slower than the timeout: a %zu-byte"
                " transfer of %s on group '%s' takes %.3g s on --link %s x --link-scale %g,"
                " more than --comm-timeout %g s; lower --link-scale or raise --comm-timeout\n",
                bytes, what, c->name, seconds, links[c->job->opts.link],
                c->job->opts.link_scale, c->job->opts.timeout_seconds);
        reported(c->job);
    }
    stop_rank(c, 0.5);
}

_Noreturn void comm_fail_mismatch(comm *c, int other, const comm_call *mine,
                                  const comm_call *theirs) {
    comm_note_exit_status(c->job, COMM_EXIT_FAILED);   /* a bug: it comes again */
    if (comm_claim_failure(c->job)) {
        char a[96], b[96];
        comm_call_describe(mine, a, sizeof a);
        comm_call_describe(theirs, b, sizeof b);
        fprintf(stderr,
                "comm: collective MISMATCH on group '%s' #%llu: rank %d calls %s but rank %d "
                "calls %s\n",
                c->name, (unsigned long long)mine->seq, comm_world_rank(c), a,
                c->world_ranks[other], b);
        reported(c->job);
    }
    stop_rank(c, 0.5);
}

static _Noreturn void vfail(comm *c, int exit_status, const char *fmt, va_list ap) {
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    comm_note_exit_status(c->job, exit_status);
    atomic_store(&c->job->failed, 1);
    fprintf(stderr, "rank %d failed: %s\n", comm_world_rank(c), msg);
    stop_rank(c, 0.0);
}

_Noreturn void comm_fail(comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, COMM_EXIT_FAILED, fmt, ap);
}

_Noreturn void comm_abort(comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, COMM_EXIT_FAILED, fmt, ap);
}

_Noreturn void comm_abort_lost(comm *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfail(c, COMM_EXIT_RANK_LOST, fmt, ap);
}

/* ---- rank threads of in-process backends ------------------------------------------ */

_Thread_local jmp_buf *comm_thread_escape;

_Noreturn void comm_leave_thread(void) {
    if (comm_thread_escape) longjmp(*comm_thread_escape, 1);
    fprintf(stderr, "comm: stopping a thread that launch() did not start: exiting\n");
    exit(1);
}

int comm_run_rank_thread(comm *world, rank_main_fn fn, void *args) {
    jmp_buf stopped_here;
    comm_thread_escape = &stopped_here;
    if (setjmp(stopped_here)) {
        comm_thread_escape = NULL;
        return -1;
    }
    int status = fn(world, args);
    comm_thread_escape = NULL;
    if (status != 0) {
        atomic_store(&world->job->failed, 1);
        fprintf(stderr, "rank %d failed: rank_main returned %d\n", comm_world_rank(world),
                status);
        atomic_store(&world->job->stop, 1);
    }
    return status;
}
