/* The threads backend: ranks are threads of one process and a rank reads its
 * neighbour's buffers directly, so the collective algorithms are written out here.
 *
 * The step primitives (publish, wait for a peer's step, pull its bytes) are in
 * comm_threads_steps.c, the collectives written over them in
 * comm_threads_algorithms.c; this file runs them: the communication threads that run
 * started requests, groups and splits, and the backend's table.
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
#include "comm_threads_algorithms.h"
#include "comm_threads_p2p.h"
#include "comm_threads_steps.h"

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

static const comm_backend threads_backend;

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
        threads_cond_init(&boxes[i].arrived);
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
    threads_cond_init(&tc->wake);
    threads_cond_init(&tc->done);
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
