/* The NCCL backend of the communicator: one rank per GPU, ranks being threads of one
 * process or processes under mpirun. comm.c does the checking, numbering, accounting
 * (bytes are modelled, as for MPI) and failure reports; this file only moves bytes.
 *
 * Streams: every group has its own stream, so that the collectives of a group complete
 * in the order they were issued and can overlap the rank's compute stream. Each
 * collective first waits (on the GPU) for the compute queued so far on the rank's
 * stream, because that is what produced the buffer. A blocking call then waits on the
 * host, polling, so that a timeout, an NCCL error or another rank's failure is noticed
 * instead of hanging; the async ones are polled in comm_wait.
 *
 * Buffers may be device memory (the normal case) or host memory (small exchanges,
 * rows staged through the host); host buffers are copied through a device staging
 * buffer and make an async call complete at once.
 *
 * Uneven shards (comm_shard) have no NCCL collective of their own: reduce-scatter then
 * runs as one grouped ncclReduce per shard, all-gather as one grouped ncclBroadcast
 * per shard; even ones use ncclReduceScatter / ncclAllGather. All-to-all is one grouped
 * ncclSend and ncclRecv per peer.
 *
 * Limits that come from NCCL: a GPU may hold only one rank of a communicator; tags of
 * send/recv are not matched (messages between two ranks pair up in the order they are
 * posted); a send is not buffered as comm.h promises: it returns when the receiver has
 * taken it, so two ranks that both send before they receive wait for each other (until
 * the timeout); creating, splitting and freeing a group are collective and cannot time
 * out.
 *
 * Launcher hooks: nccl_backend_unique_id, _world, _run_rank (comm_gpu.h), reached by
 * common/launch.c (threads) and common/comm_mpi.c (processes) through the hooks table
 * of comm_internal.h (gpu/backend.c). */
#include <nccl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef USE_MPI
#include <mpi.h>
#endif

#include "comm_gpu.h"
#include "cuda_check.h"
#include "device.h"
#include "ops_cuda.h"

_Static_assert(NCCL_UNIQUE_ID_BYTES == NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;       /* this group's collectives, in order */
    cudaEvent_t compute_ready; /* blocking calls: the rank's compute so far */
    cudaEvent_t done;          /* blocking calls: the collective finished */
    int gpu;
    int world_size;            /* > job->nranks: ranks live in other processes too */
    pthread_t owner;           /* the rank thread that made the group */
    char *staging;             /* device copies of host buffers */
    size_t staging_bytes;
} nccl_group;

/* An async collective in flight. */
typedef struct {
    cudaEvent_t compute_ready, done;
} nccl_pending;

static const comm_backend nccl_backend;

/* ---- helpers ------------------------------------------------------------------------ */

static ncclDataType_t nccl_type(int dt) {
    switch (dt) {
    case COMM_BF16: return ncclBfloat16;
    case COMM_F16: return ncclFloat16;
    case COMM_F8E4M3: return ncclFloat8e4m3;
    case COMM_F64: return ncclFloat64;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(int op) {
    switch (op) {
    case COMM_AVG: return ncclAvg;
    case COMM_MAX: return ncclMax;
    default: return ncclSum;
    }
}

/* Device (or managed) memory that NCCL can use as it is. */
static int on_device(const void *ptr) {
    struct cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        (void)cudaGetLastError();   /* plain host memory on older runtimes */
        return 0;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

static char *staging(nccl_group *g, size_t bytes) {
    if (bytes > g->staging_bytes) {
        CUDA_CHECK(cudaStreamSynchronize(g->stream));   /* in use by queued work? */
        CUDA_CHECK(cudaFree(g->staging));
        g->staging = NULL;
        g->staging_bytes = 0;
        CUDA_CHECK(cudaMalloc((void **)&g->staging, bytes));
        g->staging_bytes = bytes;
    }
    return g->staging;
}

static nccl_group *group_create(ncclComm_t nccl, int gpu, int world_size) {
    nccl_group *g = calloc(1, sizeof *g);
    if (!g) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    g->nccl = nccl;
    g->gpu = gpu;
    g->world_size = world_size;
    g->owner = pthread_self();
    CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->compute_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    return g;
}

/* The group's stream waits for what the rank queued on its compute stream so far. */
static void after_compute(nccl_group *g, cudaEvent_t ready) {
    CUDA_CHECK(cudaEventRecord(ready, cuda_thread_stream()));
    CUDA_CHECK(cudaStreamWaitEvent(g->stream, ready, 0));
}

/* Polls until `done` has happened: fails on an error or a timeout, leaves when the job
 * stops. Spins for the first 50 us (small collectives finish in that time), then
 * sleeps in short steps. */
static void wait_event(comm *c, const comm_call *call, cudaEvent_t done) {
    nccl_group *g = c->impl;
    const double t0 = comm_now(), spin_until = t0 + 50e-6;
    for (;;) {
        cudaError_t err = cudaEventQuery(done);
        if (err == cudaSuccess) return;
        char what[96];
        comm_call_describe(call, what, sizeof what);
        if (err != cudaErrorNotReady)
            comm_fail(c, "CUDA error in %s on '%s': %s", what, c->name,
                      cudaGetErrorString(err));
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(g->nccl, &async) != ncclSuccess ||
            (async != ncclSuccess && async != ncclInProgress))
            comm_fail(c, "NCCL error in %s on '%s': %s", what, c->name,
                      ncclGetErrorString(async));
        if (comm_job_stopping(c->job)) comm_leave_thread();
        double now = comm_now();
        if (now - t0 > c->job->opts.timeout_seconds)
            comm_fail_timeout(c, call, -1, now - t0);
        if (now > spin_until) nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
    }
}

/* Bytes of the send and receive sides of a call on this rank. */
static void call_bytes(const comm *c, const comm_call *call, size_t *send_bytes,
                       size_t *recv_bytes) {
    size_t elem = comm_dtype_size((comm_dtype)call->dt);
    size_t all = call->count * elem;
    size_t shard = comm_shard(call->count, c->size, c->rank, NULL) * elem;
    *send_bytes = call->kind == COMM_KIND_ALLGATHER ? shard : all;
    *recv_bytes = call->kind == COMM_KIND_REDUCE_SCATTER ? shard : all;
    if (call->kind == COMM_KIND_ALLTOALL) {   /* as far as the blocks reach */
        *send_bytes = comm_alltoall_extent(call, 0, c->size) * elem;
        *recv_bytes = comm_alltoall_extent(call, 1, c->size) * elem;
    }
}

/* All-to-all: NCCL has none of its own; one grouped launch of a send and a receive per
 * peer (the block to itself is NCCL's local copy). */
static void enqueue_alltoall(comm *c, const comm_call *call, const void *send, void *recv) {
    nccl_group *g = c->impl;
    const ncclDataType_t type = nccl_type(call->dt);
    const size_t elem = comm_dtype_size((comm_dtype)call->dt);
    NCCL_CHECK(ncclGroupStart());
    for (int j = 0; j < c->size; j++) {
        size_t send_offset, recv_offset;
        size_t send_len = comm_alltoall_block(call, 0, j, &send_offset);
        size_t recv_len = comm_alltoall_block(call, 1, j, &recv_offset);
        if (send_len)
            NCCL_CHECK(ncclSend((const char *)send + send_offset * elem, send_len, type, j,
                                g->nccl, g->stream));
        if (recv_len)
            NCCL_CHECK(ncclRecv((char *)recv + recv_offset * elem, recv_len, type, j,
                                g->nccl, g->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
}

/* Queues the NCCL work of one call on the group's stream (device buffers). */
static void enqueue(comm *c, const comm_call *call, const void *send, void *recv) {
    nccl_group *g = c->impl;
    const ncclDataType_t type = nccl_type(call->dt);
    const size_t elem = comm_dtype_size((comm_dtype)call->dt), n = call->count;
    const int size = c->size;
    switch (call->kind) {
    case COMM_KIND_ALLREDUCE:
        NCCL_CHECK(
            ncclAllReduce(send, recv, n, type, nccl_op(call->op), g->nccl, g->stream));
        break;
    case COMM_KIND_REDUCE_SCATTER:
        if (n % (size_t)size == 0) {
            NCCL_CHECK(ncclReduceScatter(send, recv, n / (size_t)size, type,
                                         nccl_op(call->op), g->nccl, g->stream));
        } else {   /* each shard reduced to its owner, as one grouped launch */
            NCCL_CHECK(ncclGroupStart());
            for (int r = 0; r < size; r++) {
                size_t offset, len = comm_shard(n, size, r, &offset);
                if (len == 0) continue;
                NCCL_CHECK(ncclReduce((const char *)send + offset * elem, recv, len, type,
                                      nccl_op(call->op), r, g->nccl, g->stream));
            }
            NCCL_CHECK(ncclGroupEnd());
        }
        break;
    case COMM_KIND_ALLGATHER:
        if (n % (size_t)size == 0) {
            NCCL_CHECK(
                ncclAllGather(send, recv, n / (size_t)size, type, g->nccl, g->stream));
        } else {   /* each shard broadcast from its owner, as one grouped launch */
            NCCL_CHECK(ncclGroupStart());
            for (int r = 0; r < size; r++) {
                size_t offset, len = comm_shard(n, size, r, &offset);
                if (len == 0) continue;
                char *dst = (char *)recv + offset * elem;
                NCCL_CHECK(ncclBroadcast(r == c->rank ? send : dst, dst, len, type, r,
                                         g->nccl, g->stream));
            }
            NCCL_CHECK(ncclGroupEnd());
        }
        break;
    case COMM_KIND_BROADCAST:
        NCCL_CHECK(ncclBroadcast(send, recv, n, type, call->root, g->nccl, g->stream));
        break;
    case COMM_KIND_REDUCE:
        NCCL_CHECK(ncclReduce(send, recv, n, type, nccl_op(call->op), call->root, g->nccl,
                              g->stream));
        break;
    case COMM_KIND_BARRIER: {   /* NCCL has none: a one-element all-reduce is one */
        float *token = (float *)staging(g, sizeof(float));
        NCCL_CHECK(
            ncclAllReduce(token, token, 1, ncclFloat32, ncclSum, g->nccl, g->stream));
        break;
    }
    case COMM_KIND_SENDRECV:
        if (call->op) NCCL_CHECK(ncclRecv(recv, n, type, call->root, g->nccl, g->stream));
        else NCCL_CHECK(ncclSend(send, n, type, call->root, g->nccl, g->stream));
        break;
    case COMM_KIND_ALLTOALL: enqueue_alltoall(c, call, send, recv); break;
    default:
        comm_fail(c, "NCCL backend: unexpected call kind %d", call->kind);
    }
}

/* One call, start to finish, with host buffers staged through the device. */
static void execute(comm *c, const comm_call *call) {
    nccl_group *g = c->impl;
    CUDA_CHECK(cudaSetDevice(g->gpu));
    const int is_send = call->kind == COMM_KIND_SENDRECV && call->op == 0;
    const int is_recv = call->kind == COMM_KIND_SENDRECV && call->op == 1;
    size_t send_bytes, recv_bytes;
    call_bytes(c, call, &send_bytes, &recv_bytes);
    const void *send = call->send;
    void *recv = call->recv;
    const int in_place = send == recv;
    const int stage_send = send_bytes && send && !on_device(send);
    const int stage_recv = recv_bytes && recv && !in_place && !on_device(recv);
    const void *dev_send = send;
    void *dev_recv = recv;
    if (stage_send || stage_recv) {
        /* in place (rank 0 of an in-place all-gather or reduce-scatter has send == recv)
         * one region serves both sides, so it must hold the larger */
        const size_t first = in_place && recv_bytes > send_bytes ? recv_bytes : send_bytes;
        const size_t send_part = stage_send ? (first + 255) & ~(size_t)255 : 0;
        char *buf = staging(g, send_part + (stage_recv ? recv_bytes : 0));
        if (stage_send) {
            dev_send = buf;
            if (!is_recv)   /* a receive's buffer holds nothing to send */
                CUDA_CHECK(cudaMemcpyAsync(buf, send, send_bytes, cudaMemcpyHostToDevice,
                                           g->stream));
        }
        dev_recv = in_place ? (void *)dev_send : stage_recv ? buf + send_part : recv;
        if (stage_recv && call->kind == COMM_KIND_ALLTOALL)   /* the gaps between blocks */
            CUDA_CHECK(cudaMemcpyAsync(dev_recv, recv, recv_bytes, cudaMemcpyHostToDevice,
                                       g->stream));
    }
    after_compute(g, g->compute_ready);
    enqueue(c, call, dev_send, dev_recv);
    CUDA_CHECK(cudaEventRecord(g->done, g->stream));
    wait_event(c, call, g->done);
    /* The result comes back where there is one: not to a non-root of reduce (its
     * buffer stays as it was), not for a send or a barrier. */
    const int has_result = !is_send && call->kind != COMM_KIND_BARRIER &&
                           !(call->kind == COMM_KIND_REDUCE && c->rank != call->root);
    if (has_result && dev_recv != recv && recv_bytes) {
        CUDA_CHECK(cudaMemcpyAsync(recv, dev_recv, recv_bytes, cudaMemcpyDeviceToHost,
                                   g->stream));
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
    }
}

/* ---- the backend -------------------------------------------------------------------- */

/* All-to-all -v: every rank learns what each peer will send it (one count each, as an
 * all-to-all of host words) and a receiver whose recv_counts disagree stops the job
 * naming both ranks, before NCCL could pair a send with a receive of another size. */
static void check_alltoallv_counts(comm *c, const comm_call *call) {
    uint64_t *sending = malloc(2 * (size_t)c->size * sizeof *sending);
    if (!sending) comm_fail(c, "out of memory");
    uint64_t *arriving = sending + c->size;
    for (int j = 0; j < c->size; j++) sending[j] = call->send_counts[j];
    comm_call exchange = {.kind = COMM_KIND_ALLTOALL, .send = sending, .recv = arriving,
                          .count = 1, .dt = COMM_F64, .op = 0, .root = -1,
                          .seq = call->seq};   /* moves bits: no arithmetic */
    execute(c, &exchange);
    char why[256];
    const int differ = comm_alltoallv_arrivals_differ(c, call, arriving, why, sizeof why);
    free(sending);
    if (differ) comm_fail(c, "%s", why);
}

static void nccl_run(comm *c, const comm_call *call) {
    if (comm_job_stopping(c->job)) comm_leave_thread();
    if (call->kind == COMM_KIND_ALLTOALL && call->send_counts) check_alltoallv_counts(c, call);
    execute(c, call);
}

/* Runs on a CUDA thread when the collective has finished: its completion time, for
 * the overlap accounting. No CUDA calls are allowed here. */
static void mark_done(void *arg) {
    comm_request *req = arg;
    req->t_done = comm_now();
}

static void nccl_start(comm *c, comm_request *req) {
    if (comm_job_stopping(c->job)) comm_leave_thread();
    nccl_group *g = c->impl;
    const comm_call *call = &req->call;
    if ((call->send && !on_device(call->send)) || (call->recv && !on_device(call->recv))) {
        execute(c, call);   /* host buffers: staged, and complete now */
        req->t_done = comm_now();
        req->done = 1;
        return;
    }
    CUDA_CHECK(cudaSetDevice(g->gpu));
    nccl_pending *p = calloc(1, sizeof *p);
    if (!p) comm_fail(c, "out of memory");
    CUDA_CHECK(cudaEventCreateWithFlags(&p->compute_ready, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming));
    after_compute(g, p->compute_ready);
    enqueue(c, call, call->send, call->recv);
    CUDA_CHECK(cudaLaunchHostFunc(g->stream, mark_done, req));
    CUDA_CHECK(cudaEventRecord(p->done, g->stream));
    req->impl = p;
}

static void nccl_wait(comm *c, comm_request *req) {
    nccl_pending *p = req->impl;
    if (!p) return;   /* completed in start */
    wait_event(c, &req->call, p->done);
    /* Later compute reads the result: it is queued after this host wait, so it is
     * ordered after the collective without a stream dependency. */
    CUDA_CHECK(cudaEventDestroy(p->compute_ready));
    CUDA_CHECK(cudaEventDestroy(p->done));
    free(p);
    req->impl = NULL;
    req->done = 1;
}

static void nccl_send(comm *c, const comm_call *call) { nccl_run(c, call); }
static void nccl_recv(comm *c, const comm_call *call) { nccl_run(c, call); }

/* Orders members by (key, rank in the parent), as comm_split and ncclCommSplit do. */
static int member_before(const int *all, int a, int b) {
    int key_a = all[3 * a + 1], key_b = all[3 * b + 1];
    return key_a != key_b ? key_a < key_b : a < b;
}

static comm *nccl_split(comm *c, int color, int key, const char *name, uint64_t seq) {
    nccl_group *g = c->impl;
    if (comm_job_stopping(c->job)) comm_leave_thread();
    /* Everyone's (color, key, world rank), to name the new group's members. */
    int mine[3] = {color, key, comm_world_rank(c)};
    int *all = malloc(3 * (size_t)c->size * sizeof *all);
    int *order = malloc((size_t)c->size * sizeof *order);
    if (!all || !order) comm_fail(c, "out of memory");
    comm_call exchange = {.kind = COMM_KIND_ALLGATHER, .send = mine, .recv = all,
                          .count = 3 * (size_t)c->size, .dt = COMM_F32, .op = -1,
                          .root = -1, .seq = seq};   /* moves bits: no arithmetic */
    execute(c, &exchange);

    int members = 0, index = -1;
    for (int r = 0; color >= 0 && r < c->size; r++) {
        if (all[3 * r] != color) continue;
        int at = members++;   /* insertion sort: groups are small */
        while (at > 0 && member_before(all, r, order[at - 1])) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = r;
    }
    int *world = malloc(((size_t)members + 1) * sizeof *world);
    if (!world) comm_fail(c, "out of memory");
    for (int i = 0; i < members; i++) {
        world[i] = all[3 * order[i] + 2];
        if (order[i] == c->rank) index = i;
    }

    CUDA_CHECK(cudaSetDevice(g->gpu));
    ncclComm_t sub = NULL;
    NCCL_CHECK(ncclCommSplit(g->nccl, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &sub,
                             NULL));
    comm *result = NULL;
    if (color >= 0) {
        result = comm_create(c->job, c->rs, &nccl_backend, index, members, world, name);
        result->impl = group_create(sub, g->gpu, g->world_size);
    }
    free(all);
    free(order);
    free(world);
    return result;
}

static void nccl_free(comm *c) {
    nccl_group *g = c->impl;
    if (!g) return;
    cudaSetDevice(g->gpu);
    if (comm_job_stopping(c->job) || !pthread_equal(pthread_self(), g->owner)) {
        /* After a failure (kernels may wait for ranks that left), or at the job's end
         * from the launcher's thread (every rank has finished all its work): nothing
         * may wait for the other ranks, so the group is torn down locally. */
        ncclCommAbort(g->nccl);
    } else {
        /* Freed by its rank while the job runs: ncclCommDestroy waits until the peers
         * are done with it, so every rank of the group must free it. */
        CUDA_CHECK(cudaStreamSynchronize(g->stream));
        NCCL_CHECK(ncclCommDestroy(g->nccl));
    }
    cudaEventDestroy(g->compute_ready);
    cudaEventDestroy(g->done);
    cudaStreamDestroy(g->stream);
    cudaFree(g->staging);
    free(g);
    c->impl = NULL;
}

static void nccl_stop(comm *c, double grace_seconds) {
    nccl_group *g = c->impl;
    atomic_store(&c->job->failed, 1);
    atomic_store(&c->job->stop, 1);
    if (g && g->world_size > c->job->nranks) {
        /* Ranks in other processes cannot see job->stop: end them all, after giving
         * them time to print. */
        if (grace_seconds > 0) {
            struct timespec grace = {.tv_sec = (time_t)grace_seconds};
            grace.tv_nsec = (long)((grace_seconds - (double)grace.tv_sec) * 1e9);
            nanosleep(&grace, NULL);
        }
        fflush(stdout);
        fflush(stderr);
#ifdef USE_MPI
        MPI_Abort(MPI_COMM_WORLD, comm_job_exit_status(c->job));
#endif
        _exit(comm_job_exit_status(c->job));
    }
    comm_leave_thread();   /* the other rank threads notice job->stop in their waits */
}

static const comm_backend nccl_backend = {
    .name = "nccl",
    .bytes_modelled = 1,
    .run = nccl_run,
    .start = nccl_start,
    .wait = nccl_wait,
    .send = nccl_send,
    .recv = nccl_recv,
    .split = nccl_split,
    .free = nccl_free,
    .stop = nccl_stop,
};

/* ---- launcher hooks ------------------------------------------------------------------ */

void nccl_backend_unique_id(unsigned char id[NCCL_ID_BYTES]) {
    ncclUniqueId uid;
    NCCL_CHECK(ncclGetUniqueId(&uid));
    memcpy(id, &uid, sizeof uid);
}

comm *nccl_backend_world(comm_job *job, comm_rank_state *rs, int world_rank,
                         int world_size, const unsigned char id[NCCL_ID_BYTES]) {
    const int gpu = cuda_thread_gpu();   /* exits unless device_select chose a GPU */
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclComm_t nccl;
    ncclResult_t res = ncclCommInitRank(&nccl, world_size, uid, world_rank);
    if (res != ncclSuccess) {
        fprintf(
            stderr, "rank %d failed: NCCL could not start on GPU %d: %s%s\n", world_rank,
            gpu, ncclGetErrorString(res),
            res == ncclInvalidUsage ? " (NCCL needs a GPU of its own for every rank)" : "");
        exit(1);
    }
    int *ranks = malloc((size_t)world_size * sizeof *ranks);
    if (!ranks) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    for (int r = 0; r < world_size; r++) ranks[r] = r;
    comm *c = comm_create(job, rs, &nccl_backend, world_rank, world_size, ranks, "world");
    free(ranks);
    c->impl = group_create(nccl, gpu, world_size);
    return c;
}

int nccl_backend_run_rank(comm *world, rank_main_fn fn, void *args) {
    return comm_run_rank_thread(world, fn, args);
}
