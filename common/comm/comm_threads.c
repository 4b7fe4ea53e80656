/* The threads backend: ranks are threads of one process and a rank reads its
 * neighbour's buffers directly, so the collective algorithms are written out here.
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
 * Every wait wakes at least every 50 ms to notice a stop (another rank failed) and
 * the timeout. Each (rank, group) has a communication thread, started on the first
 * asynchronous call, that runs the queued requests in order.
 *
 * Ranks that compute on a GPU (GPU=1, more ranks than GPUs, so no NCCL) run the same
 * algorithms over device buffers: a rank's comm then has a comm_gpu (gpu/comm_gpu.c)
 * and every copy, reduction and division goes through it (cudaMemcpy, a reduction
 * kernel) instead of memcpy and the host loops. Before a rank publishes its buffers
 * the compute it queued has finished: a blocking call waits for the rank's stream, an
 * async one marks it with an event that the communication thread waits for. */
#include "comm_threads_internal.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "device.h"

#define YIELDS 20           /* sched_yield()s before sleeping */

static const comm_backend threads_backend;

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

static void cond_init(pthread_cond_t *cond) {
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
double threads_link_seconds(comm *c, const comm_call *call, size_t bytes) {
    const double seconds = comm_link_seconds(c->job, bytes);
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
    comm_count(c, member_of(c, peer)->owner, call->kind, bytes);
    if (c->job->opts.link != LINK_NONE)
        threads_sleep_until(t0 + threads_link_seconds(c, call, bytes));
}

/* ---- asynchronous requests: a communication thread per (rank, group) --------------- */
static int run_request(comm *c, comm_request *req) {
    jmp_buf stopped_here;
    comm_thread_escape = &stopped_here;
    if (setjmp(stopped_here)) {
        comm_thread_escape = NULL;
        return 1;
    }
    comm_flight_set(c, req->flight, FLIGHT_RUNNING);
#ifdef USE_CUDA
    comm_gpu_wait_mark(req->ready);   /* the compute that made the buffers */
    req->ready = NULL;
#endif
    threads_execute(c, &req->call, req->impl);
    comm_flight_set(c, req->flight, FLIGHT_DONE);
    comm_thread_escape = NULL;
    return 0;
}

/* Called with the lock held: the head request is finished (or abandoned). */
static void complete_head(threads_comm *tc) {
    comm_request *req = tc->head;
    tc->head = req->next;
    if (!tc->head) tc->tail = NULL;
#ifdef USE_CUDA
    comm_gpu_wait_mark(req->ready);   /* abandoned before it ran: release the event */
    req->ready = NULL;
#endif
    req->t_done = comm_now();
    req->done = 1;
    tc->pending--;
    pthread_cond_broadcast(&tc->done);
}

static void *worker_main(void *arg) {
    comm *c = arg;
    threads_comm *tc = c->impl;
    mem_stats_bind(&c->rs->mem);
    prctl(PR_SET_TIMERSLACK, 1000UL);   /* 1 us: the link model sleeps precisely */
    pthread_mutex_lock(&tc->lock);
    for (;;) {
        while (!tc->head && !tc->closing) pthread_cond_wait(&tc->wake, &tc->lock);
        comm_request *req = tc->head;
        if (!req) break;
        pthread_mutex_unlock(&tc->lock);
        int stopped = run_request(c, req);
        pthread_mutex_lock(&tc->lock);
        complete_head(tc);
        while (stopped && tc->head) complete_head(tc);   /* abandon the rest */
    }
    pthread_mutex_unlock(&tc->lock);
    return NULL;
}

static void threads_start(comm *c, comm_request *req) {
    threads_comm *tc = c->impl;
    size_t bytes = threads_scratch_bytes(c, &req->call);
#ifdef USE_CUDA
    if (tc->gpu) {   /* peers read the scratch: keep it beside the buffers, on the GPU */
        req->impl = bytes ? mem_alloc_on(MEM_DEVICE, MEM_COMM, bytes) : NULL;
        req->ready = comm_gpu_compute_mark();
    } else
#endif
    req->impl = bytes ? mem_alloc(MEM_COMM, bytes) : NULL;   /* on the rank's thread */
    req->next = NULL;
    pthread_mutex_lock(&tc->lock);
    if (tc->tail) tc->tail->next = req;
    else tc->head = req;
    tc->tail = req;
    tc->pending++;
    if (!tc->has_worker) {
        if (pthread_create(&tc->worker, NULL, worker_main, c)) {
            pthread_mutex_unlock(&tc->lock);
            comm_fail(c, "cannot start a communication thread");
        }
        tc->has_worker = 1;
    }
    pthread_cond_signal(&tc->wake);
    pthread_mutex_unlock(&tc->lock);
}

static void threads_wait(comm *c, comm_request *req) {
    threads_comm *tc = c->impl;
    pthread_mutex_lock(&tc->lock);
    while (!req->done) {
        if (comm_job_stopping(c->job)) {
            pthread_mutex_unlock(&tc->lock);
            comm_leave_thread();
        }
        threads_timed_wait(&tc->done, &tc->lock, POLL_SECONDS);
    }
    pthread_mutex_unlock(&tc->lock);
    mem_free(req->impl);
    req->impl = NULL;
    if (comm_job_stopping(c->job)) comm_leave_thread();
}

/* A blocking call = start + wait; when nothing is queued the rank's own thread runs
 * it, which is the same thing minus two thread switches. */
static void threads_run(comm *c, const comm_call *call) {
    threads_comm *tc = c->impl;
    pthread_mutex_lock(&tc->lock);
    int busy = tc->pending > 0;
    pthread_mutex_unlock(&tc->lock);
    if (!busy) {
        size_t bytes = threads_scratch_bytes(c, call);
        if (bytes > tc->scratch_bytes) {
            mem_free(tc->scratch);
#ifdef USE_CUDA
            if (tc->gpu) tc->scratch = mem_alloc_on(MEM_DEVICE, MEM_COMM, bytes);
            else
#endif
            tc->scratch = mem_alloc(MEM_COMM, bytes);
            tc->scratch_bytes = bytes;
        }
        threads_compute_done(c);
        threads_execute(c, call, tc->scratch);
        return;
    }
    comm_request req = {.c = c, .call = *call};
    threads_start(c, &req);
    threads_wait(c, &req);
}

/* ---- groups ------------------------------------------------------------------------- */
static group *group_create(threads_job *tj, int size) {
    group *g = calloc(1, sizeof *g);
    member *members = aligned_alloc(64, (size_t)size * sizeof *members);
    mailbox *boxes = calloc((size_t)size, sizeof *boxes);
    if (!g || !members || !boxes) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    memset(members, 0, (size_t)size * sizeof *members);
    for (int i = 0; i < size; i++) {
        pthread_mutex_init(&boxes[i].lock, NULL);
        cond_init(&boxes[i].arrived);
    }
    g->size = size;
    atomic_init(&g->refs, size);
    g->members = members;
    g->boxes = boxes;
    pthread_mutex_lock(&tj->groups_lock);
    g->next_made = tj->groups;
    tj->groups = g;
    pthread_mutex_unlock(&tj->groups_lock);
    return g;
}

static void group_destroy(group *g) {
    for (int i = 0; i < g->size; i++) {
        for (message *m = g->boxes[i].head, *next; m; m = next) {
            next = m->next;
            free(m);
        }
        pthread_mutex_destroy(&g->boxes[i].lock);
        pthread_cond_destroy(&g->boxes[i].arrived);
    }
    free(g->boxes);
    free(g->members);
    free(g);
}

static void group_release(threads_job *tj, group *g) {
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    pthread_mutex_lock(&tj->groups_lock);
    group **link = &tj->groups;
    while (*link != g) link = &(*link)->next_made;
    *link = g->next_made;
    pthread_mutex_unlock(&tj->groups_lock);
    group_destroy(g);
}

/* Groups split on a rank's thread take its device; the world is bound in
 * threads_run_rank, because launch makes it before the rank has chosen one. */
static void bind_device(threads_comm *tc) {
#ifdef USE_CUDA
    if (device_current() == DEVICE_CUDA && !tc->gpu) tc->gpu = comm_gpu_open();
    if (device_current() != DEVICE_CUDA && tc->gpu) {
        comm_gpu_close(tc->gpu);
        tc->gpu = NULL;
    }
#else
    (void)tc;
#endif
}

static comm *make_comm(comm_job *job, comm_rank_state *rs, group *g, int rank,
                       const int *world_ranks, const char *name) {
    comm *c = comm_create(job, rs, &threads_backend, rank, g->size, world_ranks, name);
    threads_comm *tc = calloc(1, sizeof *tc);
    if (!tc) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    tc->g = g;
    tc->spin_seconds = ((threads_job *)job->impl)->spin_seconds;
    pthread_mutex_init(&tc->lock, NULL);
    cond_init(&tc->wake);
    cond_init(&tc->done);
    c->impl = tc;
    g->members[rank].owner = c;
    return c;
}

/* Everyone posts (color, key); the first member of each new group (in key order)
 * creates it; everyone joins the group of its color. Two barriers, no more: a rank
 * rewrites its posted values only in the next split, after everyone has read them. */
static comm *threads_split(comm *c, int color, int key, const char *name, uint64_t seq) {
    comm_call call = {.kind = COMM_KIND_SPLIT, .op = -1, .root = -1, .seq = seq};
    member *all = ((threads_comm *)c->impl)->g->members, *me = &all[c->rank];
    int n = c->size, members = 0, index = -1;
    me->split_color = color;
    me->split_key = key;
    threads_barrier(c, &call);
    /* charged to the rank: one stopped in the second barrier gives it back */
    int *order = mem_alloc(MEM_OTHER, (size_t)n * sizeof *order);
    for (int q = 0; q < n && color >= 0; q++) {
        if (all[q].split_color != color) continue;
        int i = members++;   /* insertion sort by (key, rank) */
        while (i > 0 && all[order[i - 1]].split_key > all[q].split_key) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = q;
    }
    for (int i = 0; i < members; i++)
        if (order[i] == c->rank) index = i;
    if (index == 0) me->split_result = group_create(c->job->impl, members);
    threads_barrier(c, &call);
    comm *result = NULL;
    if (color >= 0) {
        int *world = malloc((size_t)members * sizeof *world);
        if (!world) comm_fail(c, "out of memory");
        for (int i = 0; i < members; i++) world[i] = c->world_ranks[order[i]];
        result = make_comm(c->job, c->rs, all[order[0]].split_result, index, world, name);
        bind_device(result->impl);
        free(world);
    }
    mem_free(order);
    return result;
}

/* The worker finishes what is queued (or, after a failure, abandons it), then leaves. */
static void stop_worker(threads_comm *tc) {
    if (!tc->has_worker) return;
    pthread_mutex_lock(&tc->lock);
    tc->closing = 1;
    pthread_cond_signal(&tc->wake);
    pthread_mutex_unlock(&tc->lock);
    pthread_join(tc->worker, NULL);
    tc->has_worker = 0;
}

static void threads_free(comm *c) {
    threads_comm *tc = c->impl;
    stop_worker(tc);
    mem_free(tc->scratch);
#ifdef USE_CUDA
    comm_gpu_close(tc->gpu);
#endif
    group_release(c->job->impl, tc->g);
    pthread_mutex_destroy(&tc->lock);
    pthread_cond_destroy(&tc->wake);
    pthread_cond_destroy(&tc->done);
    free(tc);
}

static void threads_stop(comm *c, double grace_seconds) {
    (void)grace_seconds;   /* the other ranks notice within POLL_SECONDS */
    atomic_store(&c->job->failed, 1);
    atomic_store(&c->job->stop, 1);
    comm_leave_thread();
}

static const comm_backend threads_backend = {
    .name = "threads",
    .bytes_modelled = 0,
    .run = threads_run,
    .start = threads_start,
    .wait = threads_wait,
    .send = threads_send,
    .recv = threads_recv,
    .split = threads_split,
    .free = threads_free,
    .stop = threads_stop,
};

/* ---- launch support --------------------------------------------------------------- */
void threads_job_init(comm_job *job) {
    threads_job *tj = calloc(1, sizeof *tj);
    if (!tj) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    pthread_mutex_init(&tj->groups_lock, NULL);
    tj->world = group_create(tj, job->nranks);
    /* Spin before sleeping only when every rank can have a core of its own. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    tj->spin_seconds = job->nranks <= cores ? 50e-6 : 0;
    job->impl = tj;
}

comm *threads_world(comm_job *job, int rank) {
    int *world = malloc((size_t)job->nranks * sizeof *world);
    if (!world) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    for (int r = 0; r < job->nranks; r++) world[r] = r;
    comm *c = make_comm(job, &job->ranks[rank], ((threads_job *)job->impl)->world, rank,
                        world, "world");
    free(world);
    return c;
}

void threads_job_free(comm_job *job) {
    threads_job *tj = job->impl;
    /* Every communication thread ends before any comm is freed: after a failure one may
     * still be copying out of another rank's comm and buffers. */
    for (int r = 0; r < job->nranks; r++)
        for (comm *c = job->ranks[r].groups; c; c = c->next_of_rank) stop_worker(c->impl);
    comm_job_free(job);   /* frees every comm, and with the last one each group */
    while (tj->groups) {   /* left by a failed split: some members never joined */
        group *g = tj->groups;
        tj->groups = g->next_made;
        group_destroy(g);
    }
    pthread_mutex_destroy(&tj->groups_lock);
    free(tj);
}

int threads_run_rank(comm *world, rank_main_fn fn, void *args) {
    prctl(PR_SET_TIMERSLACK, 1000UL);
    bind_device(world->impl);   /* launch has selected this rank's device by now */
    return comm_run_rank_thread(world, fn, args);
}
