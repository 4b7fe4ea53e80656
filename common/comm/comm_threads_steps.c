/* The threads backend's steps: what its collectives are written with.
 *
 * How ranks keep in step: each member of a group publishes a progress counter.
 * Entering a collective, a rank publishes its call and its buffers (step 0), then
 * checks its left neighbour's call against its own before touching its bytes: around
 * the ring everybody then agrees, so a mismatch is caught before any byte moves.
 * After step k of the algorithm a rank publishes k. A rank that needs its neighbour's
 * step k waits until the neighbour's counter gets there: spin a few microseconds, then
 * sleep on a futex. Counters only grow (each collective continues from where the last
 * one ended), so a rank that runs ahead into the next collective confuses nobody.
 * Before returning, a rank waits for its right neighbour, the one that reads its
 * buffers, to finish.
 *
 * Also the waits that notice a stop, and the modelled link. */
#include "comm_threads_steps.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define YIELDS 20           /* sched_yield()s before sleeping */

/* ---- moving bytes: host code, or the rank's GPU ------------------------------------ */
#ifdef USE_CUDA
static comm_gpu *gpu_of(comm *c) { return ((threads_comm *)c->impl)->gpu; }
#endif

/* memmove: an in-place all-gather's own piece may overlap (a plain copy otherwise) */
void threads_move_bytes(comm *c, void *dst, const void *src, size_t bytes,
                        int may_overlap) {
#ifdef USE_CUDA
    if (gpu_of(c)) {
        comm_gpu_copy(gpu_of(c), dst, src, bytes);
        return;
    }
#endif
    (void)c;
    if (may_overlap) memmove(dst, src, bytes);
    else memcpy(dst, src, bytes);
}

void threads_divide(comm *c, void *buf, size_t count, const comm_call *call,
                    int divisor) {
#ifdef USE_CUDA
    if (gpu_of(c)) {
        comm_gpu_divide(gpu_of(c), buf, count, (comm_dtype)call->dt, divisor);
        return;
    }
#endif
    (void)c;
    comm_divide_buffer(buf, count, (comm_dtype)call->dt, divisor);
}

/* The rank's own compute wrote the buffers it hands over: let it finish (a blocking
 * call on the rank's thread). */
void threads_compute_done(comm *c) {
#ifdef USE_CUDA
    if (gpu_of(c)) comm_gpu_compute_done();
#endif
    (void)c;
}

void threads_cond_init(pthread_cond_t *cond) {
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
}

static struct timespec abs_time(double t) {
    struct timespec ts = {.tv_sec = (time_t)t};
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    return ts;
}

void threads_timed_wait(pthread_cond_t *cond, pthread_mutex_t *lock, double seconds) {
    struct timespec until = abs_time(comm_now() + seconds);
    pthread_cond_timedwait(cond, lock, &until);
}

/* The modelled link: hold the copier until the transfer could have finished. */
void threads_sleep_until(double t) {
    if (t <= comm_now()) return;
    struct timespec until = abs_time(t);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL)) {}
}

/* The modelled time of one transfer; longer than the timeout, it would only look like
 * a hang (every rank asleep on the wire, none waiting long enough to report). */
double threads_link_seconds(comm *c, const comm_call *call, int peer, size_t bytes) {
    const double seconds = comm_link_seconds(c->job, comm_tier_to(c, peer), bytes);
    if (seconds > c->job->opts.timeout_seconds) comm_fail_slow_link(c, call, bytes, seconds);
    return seconds;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* ---- progress: publish and wait ----------------------------------------------------- */
/* Step k of the current collective has counter value base + 1 + k. */
static uint32_t step_value(comm *c, int step) {
    return ((threads_comm *)c->impl)->base + 1 + (uint32_t)step;
}

static int reached(member *m, uint32_t target) {
    return (int32_t)(atomic_load(&m->progress) - target) >= 0;
}

void threads_publish(comm *c, int step) {
    member *me = member_of(c, c->rank);
    atomic_store(&me->progress, step_value(c, step));
    if (atomic_load(&me->waiters))
        syscall(SYS_futex, (uint32_t *)&me->progress, FUTEX_WAKE_PRIVATE, INT_MAX, NULL,
                NULL, 0);
}

/* Returns once rank `peer` has published `step` of this collective (or gone further). */
void threads_wait_step(comm *c, const comm_call *call, int peer, int step) {
    member *m = member_of(c, peer);
    uint32_t target = step_value(c, step);
    if (reached(m, target)) return;
    /* Spin while every rank has a core; otherwise hand the core over (to the rank we
     * wait for, perhaps) a few times. Then sleep. */
    double start = comm_now(), spin_until = start + ((threads_comm *)c->impl)->spin_seconds;
    while (comm_now() < spin_until)
        for (int i = 0; i < 64; i++) {
            if (reached(m, target)) return;
            cpu_relax();
        }
    for (int i = 0; i < YIELDS; i++) {
        if (reached(m, target)) return;
        sched_yield();
    }
    struct timespec poll = {.tv_nsec = (long)(POLL_SECONDS * 1e9)};
    for (;;) {
        atomic_fetch_add(&m->waiters, 1);
        uint32_t seen = atomic_load(&m->progress);
        if ((int32_t)(seen - target) < 0)
            syscall(SYS_futex, (uint32_t *)&m->progress, FUTEX_WAIT_PRIVATE, seen, &poll,
                    NULL, 0);
        atomic_fetch_sub(&m->waiters, 1);
        if (reached(m, target)) return;
        if (comm_job_stopping(c->job)) comm_leave_thread();
        double waited = comm_now() - start;
        if (waited > c->job->opts.timeout_seconds) comm_fail_timeout(c, call, peer, waited);
    }
}

/* Publishes the call and buffers, then checks the left neighbour's call. Its call
 * stays put meanwhile: no rank leaves a collective before its right neighbour has
 * completed a step after this check (finish waits for that). */
void threads_enter(comm *c, const comm_call *call, const void *send, void *recv,
                   void *scratch) {
    int left = mod(c->rank - 1, c->size);
    member *me = member_of(c, c->rank);
    if (comm_job_stopping(c->job)) comm_leave_thread();
    me->call = *call;
    me->send = send;
    me->recv = recv;
    me->scratch = scratch;
    threads_publish(c, 0);
    threads_wait_step(c, call, left, 0);
    const comm_call *theirs = &member_of(c, left)->call;
    if (!comm_call_matches(call, theirs)) comm_fail_mismatch(c, left, call, theirs);
}

/* Waits until the right neighbour is done with our buffers, then closes the books. */
void threads_finish(comm *c, const comm_call *call, int steps) {
    threads_wait_step(c, call, mod(c->rank + 1, c->size), steps);
    ((threads_comm *)c->impl)->base += 1 + (uint32_t)steps;
}

/* The one place where data crosses between ranks: copy (or reduce) `count` elements
 * out of rank `peer`'s buffer, count the bytes, and hold for the modelled link. */
void threads_pull(comm *c, int peer, void *dst, const void *own, const void *theirs,
                  size_t count, const comm_call *call) {
    double t0 = comm_now();
    size_t bytes = count * comm_dtype_size((comm_dtype)call->dt);
#ifdef USE_CUDA
    if (gpu_of(c)) {
        if (own)
            comm_gpu_reduce(gpu_of(c), dst, own, theirs, count, (comm_dtype)call->dt,
                            (comm_op)call->op);
        else if (bytes) threads_move_bytes(c, dst, theirs, bytes, 0);
    } else
#endif
    if (own) comm_reduce_buffers(dst, own, theirs, count, (comm_dtype)call->dt,
                                 (comm_op)call->op);
    else if (bytes) memcpy(dst, theirs, bytes);
    const comm_tier tier = comm_tier_to(c, peer);
    comm_count(c, member_of(c, peer)->owner, call->kind, tier, bytes);
    if (comm_tier_link(&c->job->opts, tier) != LINK_NONE) {
        const double link = threads_link_seconds(c, call, peer, bytes);
        comm_count_link(c, tier, link);
        threads_sleep_until(t0 + link);
    }
}
