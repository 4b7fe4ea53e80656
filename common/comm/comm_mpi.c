/* The MPI backend (built with MPI=1): ranks are the processes mpirun started, and the
 * collectives are Open MPI's. This file adds what MPI does not have:
 *  - bf16/fp16/fp8 reductions: MPI_Op_create on MPI_UINT16_T / MPI_UINT8_T, widening
 *    to fp32 per hop (comm_reduce_buffers), and AVG = SUM then divide;
 *  - a mismatch check before each collective: an MPI_Allgather of every rank's call on
 *    a duplicate communicator (so it can never pair with a data collective), and for
 *    all-to-all -v one count per peer (comm_mpi_alltoall.c);
 *  - timeouts: a blocking MPI call runs under a watchdog thread that reports and ends
 *    the job at the deadline; waits for requests poll MPI_Test against the deadline;
 *  - buffered sends (the message is copied, MPI_Isend completes in the background);
 *  - GPU=1: each process computes on its node-local GPU (local rank % GPUs). With a GPU
 *    per process the world is NCCL's (gpu/comm_nccl.c: rank 0 makes the id, MPI_Bcast
 *    shares it); with processes sharing GPUs it stays MPI and device buffers are staged
 *    through host copies (this Open MPI cannot read device memory).
 * Bytes are counted as the textbook volume (comm_accounting.c, bytes_modelled = 1). */
#include "comm_internal.h"
#include "comm_mpi_alltoall.h"
#include "comm_mpi_roll_call.h"
#include "comm_mpi_staging.h"
#include "comm_mpi_watchdog.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device.h"

typedef struct pending_send {
    MPI_Request request;
    struct pending_send *next;
    char data[];
} pending_send;

typedef struct {
    MPI_Comm data;           /* the collectives and messages */
    MPI_Comm check;          /* the mismatch check */
    pending_send *sends;     /* buffered sends not yet known to be complete */
} mpi_comm;

typedef struct {
    MPI_Request request;
    int *counts, *displs;    /* for the v-collectives, alive until completion */
    void *tmp;               /* reduce-scatter whose recv lies inside send */
    comm_call host;          /* the call as MPI sees it: with host copies when staged */
    int staged;
} mpi_request;

static const comm_backend mpi_backend;

/* ---- process-wide state: the reduction ops (the watchdog: comm_mpi_watchdog.c) -------- */
static MPI_Op wire_ops[4][2];   /* [dtype][0 sum, 1 max] for the 16- and 8-bit types */
static MPI_Comm roll_call_comm = MPI_COMM_NULL;   /* the roll call after a timeout */

#define WIRE_OP(name, dt, op)                                                     \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {      \
        (void)type;                                                               \
        comm_reduce_buffers(inout, inout, in, (size_t)*len, dt, op);              \
    }
WIRE_OP(sum_bf16, COMM_BF16, COMM_SUM)
WIRE_OP(max_bf16, COMM_BF16, COMM_MAX)
WIRE_OP(sum_f16, COMM_F16, COMM_SUM)
WIRE_OP(max_f16, COMM_F16, COMM_MAX)
WIRE_OP(sum_f8, COMM_F8E4M3, COMM_SUM)
WIRE_OP(max_f8, COMM_F8E4M3, COMM_MAX)

static int initialised_here;   /* init_once ran: ops made, watchdog started */

static void finalize_at_exit(void) {
    mpi_watchdog_stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (int dt = 1; dt < 4; dt++)
        for (int op = 0; op < 2; op++) MPI_Op_free(&wire_ops[dt][op]);
    if (roll_call_comm != MPI_COMM_NULL) MPI_Comm_free(&roll_call_comm);
    MPI_Finalize();
}

static void init_once(void) {
    int initialized = 0, provided = 0;
    MPI_Initialized(&initialized);
    if (initialised_here) return;
    if (!initialized) {
        MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (provided < MPI_THREAD_MULTIPLE) {
            fprintf(stderr, "error: this MPI does not provide MPI_THREAD_MULTIPLE\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    MPI_User_function *fns[4][2] = {{NULL, NULL}, {sum_bf16, max_bf16}, {sum_f16, max_f16},
                                    {sum_f8, max_f8}};
    for (int dt = 1; dt < 4; dt++)
        for (int op = 0; op < 2; op++) MPI_Op_create(fns[dt][op], 1, &wire_ops[dt][op]);
    mpi_watchdog_start();
    initialised_here = 1;
    atexit(finalize_at_exit);
}

/* ---- helpers --------------------------------------------------------------------- */
static MPI_Datatype type_of(int dt) {
    switch (dt) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_F8E4M3: return MPI_UINT8_T;
    default: return MPI_UINT16_T;
    }
}
/* fp32 and f64 reduce with MPI's own ops; the narrow types with ours (wire_ops). */
static MPI_Op op_of(int dt, int op) {
    if (dt == COMM_F32 || dt == COMM_F64) return op == COMM_MAX ? MPI_MAX : MPI_SUM;
    return wire_ops[dt][op == COMM_MAX];
}
static void check_mpi(comm *c, int err, const char *what) {
    if (err == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    comm_fail(c, "%s on '%s': %s", what, c->name, text);
}
static int int_count(comm *c, size_t count) {
    if (count > INT_MAX) comm_fail(c, "%zu elements: more than MPI's int counts allow", count);
    return (int)count;
}

static void stop_now(comm *c, double grace_seconds) {
    fflush(stdout);
    fflush(stderr);
    if (grace_seconds > 0) {   /* let the other ranks print their own report */
        struct timespec pause = {.tv_sec = (time_t)grace_seconds,
                                 .tv_nsec = (long)((grace_seconds - (double)(time_t)grace_seconds) * 1e9)};
        nanosleep(&pause, NULL);
    }
    MPI_Abort(MPI_COMM_WORLD, comm_job_exit_status(c->job));
}

/* Every rank's call, exchanged on the check communicator. On a difference, group rank
 * 0 reports itself and the first rank that differs; the others wait to be ended. */
static void check_call(comm *c, const comm_call *call) {
    if (c->size == 1) return;
    int64_t mine[5] = {call->kind, (int64_t)call->count, call->dt, call->op, call->root};
    int64_t *all = malloc((size_t)c->size * sizeof mine);
    if (!all) comm_fail(c, "out of memory");
    mpi_watchdog_arm(c, call);
    int err = MPI_Allgather(mine, 5, MPI_INT64_T, all, 5, MPI_INT64_T,
                            ((mpi_comm *)c->impl)->check);
    mpi_watchdog_disarm();
    check_mpi(c, err, "the mismatch check");
    for (int q = 1; q < c->size; q++) {
        if (!memcmp(all, all + 5 * q, sizeof mine)) continue;
        comm_call first = *call, other = *call;
        first.kind = (int)all[0], first.count = (size_t)all[1], first.dt = (int)all[2];
        first.op = (int)all[3], first.root = (int)all[4];
        other.kind = (int)all[5 * q], other.count = (size_t)all[5 * q + 1];
        other.dt = (int)all[5 * q + 2], other.op = (int)all[5 * q + 3];
        other.root = (int)all[5 * q + 4];
        free(all);
        if (c->rank == 0) comm_fail_mismatch(c, q, &first, &other);
        stop_now(c, 5.0);
    }
    free(all);
}

/* What to do once a collective has finished: AVG's division, the copy out of tmp. */
static void after(comm *c, const comm_call *call, void *tmp) {
    if (call->kind == COMM_KIND_ALLTOALL) return;   /* op says which form, not a sum */
    size_t len = comm_shard(call->count, c->size, c->rank, NULL);
    if (call->kind == COMM_KIND_REDUCE_SCATTER && tmp && len)
        memcpy(call->recv, tmp, len * comm_dtype_size(call->dt));
    if (call->op != COMM_AVG) return;
    if (call->kind == COMM_KIND_ALLREDUCE) comm_divide_buffer(call->recv, call->count, call->dt, c->size);
    if (call->kind == COMM_KIND_REDUCE_SCATTER) comm_divide_buffer(call->recv, len, call->dt, c->size);
    if (call->kind == COMM_KIND_REDUCE && c->rank == call->root)
        comm_divide_buffer(call->recv, call->count, call->dt, c->size);
}

/* Issues the collective: blocking, or not (then r->request completes it). */
static int issue(comm *c, const comm_call *call, mpi_request *r, int nonblocking) {
    MPI_Comm comm_ = ((mpi_comm *)c->impl)->data;
    MPI_Datatype type = type_of(call->dt);
    MPI_Op op = call->op >= 0 ? op_of(call->dt, call->op) : MPI_OP_NULL;
    int count = int_count(c, call->count), n = c->size;
    size_t es = comm_dtype_size(call->dt), off, len = comm_shard(call->count, n, c->rank, &off);
    MPI_Request *req = nonblocking ? &r->request : NULL;
    if (call->kind == COMM_KIND_ALLTOALL)   /* comm_mpi_alltoall.c */
        return mpi_issue_alltoall(c, call, comm_, type, &r->counts, req);
    if (call->kind == COMM_KIND_REDUCE_SCATTER || call->kind == COMM_KIND_ALLGATHER) {
        r->counts = malloc(2 * (size_t)n * sizeof(int));
        if (!r->counts) comm_fail(c, "out of memory");
        r->displs = r->counts + n;
        for (int q = 0; q < n; q++) {
            size_t qoff, qlen = comm_shard(call->count, n, q, &qoff);
            r->counts[q] = (int)qlen;
            r->displs[q] = (int)qoff;
        }
    }
    switch (call->kind) {
    case COMM_KIND_ALLREDUCE:
        return req ? MPI_Iallreduce(MPI_IN_PLACE, call->recv, count, type, op, comm_, req)
                   : MPI_Allreduce(MPI_IN_PLACE, call->recv, count, type, op, comm_);
    case COMM_KIND_REDUCE_SCATTER: {
        const char *send = call->send, *recv = call->recv;
        void *out = call->recv;
        if (len && recv >= send && recv < send + call->count * es) {   /* recv inside send */
            r->tmp = malloc(len * es);
            if (!r->tmp) comm_fail(c, "out of memory");
            out = r->tmp;
        }
        return req ? MPI_Ireduce_scatter(call->send, out, r->counts, type, op, comm_, req)
                   : MPI_Reduce_scatter(call->send, out, r->counts, type, op, comm_);
    }
    case COMM_KIND_ALLGATHER: {
        const void *send = call->send == (char *)call->recv + off * es ? MPI_IN_PLACE : call->send;
        return req ? MPI_Iallgatherv(send, (int)len, type, call->recv, r->counts, r->displs,
                                     type, comm_, req)
                   : MPI_Allgatherv(send, (int)len, type, call->recv, r->counts, r->displs,
                                    type, comm_);
    }
    case COMM_KIND_BROADCAST: return MPI_Bcast(call->recv, count, type, call->root, comm_);
    case COMM_KIND_REDUCE:
        if (c->rank == call->root)
            return MPI_Reduce(MPI_IN_PLACE, call->recv, count, type, op, call->root, comm_);
        return MPI_Reduce(call->recv, NULL, count, type, op, call->root, comm_);
    default: return MPI_Barrier(comm_);
    }
}

static void release(mpi_request *r) {
    free(r->counts);
    free(r->tmp);
    r->counts = NULL;
    r->tmp = NULL;
}

/* Asks ready() until it says done; the deadline replaces MPI's waiting forever. ready
 * returns an MPI error code and sets *done. */
typedef int (*ready_fn)(void *state, int *done);
static void poll_until(comm *c, const comm_call *call, ready_fn ready, void *state) {
    double start = comm_now();
    struct timespec nap = {.tv_nsec = 20000};
    char what[96];
    comm_call_describe(call, what, sizeof what);
    for (long spins = 0;; spins++) {
        int done = 0;
        check_mpi(c, ready(state, &done), what);
        if (done) return;
        double waited = comm_now() - start;
        if (waited > c->job->opts.timeout_seconds)
            comm_fail_timeout(c, call, call->kind == COMM_KIND_SENDRECV ? call->root : -1, waited);
        if (spins > 1000) nanosleep(&nap, NULL);   /* long waits: let the core go */
    }
}

typedef struct {
    MPI_Request *request;
    MPI_Status *status;
} test_state;
static int request_done(void *state, int *done) {
    test_state *s = state;
    return MPI_Test(s->request, done, s->status);
}
static void poll_request(comm *c, MPI_Request *request, MPI_Status *status, const comm_call *call) {
    test_state s = {request, status};
    poll_until(c, call, request_done, &s);
}

/* A message from call->root with call->tag, matched (so no other thread can take it)
 * but not yet received. */
typedef struct {
    int source, tag;
    MPI_Comm comm;
    MPI_Message message;
    MPI_Status status;
} probe_state;
static int message_arrived(void *state, int *done) {
    probe_state *s = state;
    return MPI_Improbe(s->source, s->tag, s->comm, done, &s->message, &s->status);
}

/* ---- the backend -------------------------------------------------------------------- */
static void mpi_run(comm *c, const comm_call *call) {
    mpi_request r = {0};
    check_call(c, call);
    if (call->kind == COMM_KIND_ALLTOALL && call->send_counts) {
        mpi_watchdog_arm(c, call);
        int err = mpi_check_alltoallv_counts(c, call, ((mpi_comm *)c->impl)->check);
        mpi_watchdog_disarm();
        check_mpi(c, err, "the all-to-all count check");
    }
    comm_call host;
    const int staged = mpi_stage_in(c, call, &host);
    mpi_watchdog_arm(c, call);
    int err = issue(c, &host, &r, 0);
    mpi_watchdog_disarm();
    check_mpi(c, err, comm_kind_name((comm_kind)call->kind));
    after(c, &host, r.tmp);
    if (staged) mpi_stage_out(c, call, &host);
    release(&r);
}

static void mpi_start(comm *c, comm_request *req) {
    mpi_request *r = calloc(1, sizeof *r);
    if (!r) comm_fail(c, "out of memory");
    req->impl = r;
    comm_flight_set(c, req->flight, FLIGHT_RUNNING);   /* in flight from here */
    check_call(c, &req->call);
    r->staged = mpi_stage_in(c, &req->call, &r->host);
    check_mpi(c, issue(c, &r->host, r, 1), comm_kind_name((comm_kind)req->call.kind));
}

static void mpi_wait(comm *c, comm_request *req) {
    mpi_request *r = req->impl;
    poll_request(c, &r->request, MPI_STATUS_IGNORE, &req->call);
    req->t_done = comm_now();
    after(c, &r->host, r->tmp);
    if (r->staged) mpi_stage_out(c, &req->call, &r->host);
    release(r);
    free(r);
    req->impl = NULL;
}

/* Completed buffered sends are freed; with `all`, waits for every one. */
static void reap_sends(comm *c, int all) {
    mpi_comm *m = c->impl;
    for (pending_send **link = &m->sends; *link;) {
        pending_send *s = *link;
        int done = 0;
        if (all) {
            comm_call call = {.kind = COMM_KIND_SENDRECV, .op = 0, .root = -1};
            poll_request(c, &s->request, MPI_STATUS_IGNORE, &call);
            done = 1;
        } else {
            MPI_Test(&s->request, &done, MPI_STATUS_IGNORE);
        }
        if (done) {
            *link = s->next;
            free(s);
        } else {
            link = &s->next;
        }
    }
}

static void mpi_send(comm *c, const comm_call *call) {
    mpi_comm *m = c->impl;
    size_t bytes = call->count * comm_dtype_size(call->dt);
    reap_sends(c, 0);
    pending_send *s = malloc(sizeof *s + bytes);
    if (!s) comm_fail(c, "out of memory sending %zu bytes", bytes);
#ifdef USE_CUDA
    if (mpi_staging_gpu(c) && bytes) {   /* device memory comes down through the GPU */
        comm_gpu_compute_done();
        comm_gpu_copy(mpi_staging_gpu(c), s->data, call->send, bytes);
    } else
#endif
    if (bytes) memcpy(s->data, call->send, bytes);
    check_mpi(c, MPI_Isend(s->data, int_count(c, bytes), MPI_BYTE, call->root, call->tag,
                           m->data, &s->request), "send");
    s->next = m->sends;
    m->sends = s;
}

static void mpi_recv(comm *c, const comm_call *call) {
    size_t bytes = call->count * comm_dtype_size(call->dt);
    MPI_Request request;
    MPI_Status status;
    reap_sends(c, 0);
    void *into = call->recv;
#ifdef USE_CUDA
    const int staged = mpi_staging_gpu(c) && bytes && comm_gpu_is_device(call->recv);
    if (staged) into = mpi_host_block(c, bytes);
#endif
    /* The size is checked before the bytes are taken: a receive that expects another
     * size than was sent is the two ranks' calls disagreeing, and is reported so. */
    probe_state probe = {.source = call->root, .tag = call->tag,
                         .comm = ((mpi_comm *)c->impl)->data};
    poll_until(c, call, message_arrived, &probe);
    int got = 0;
    MPI_Get_count(&probe.status, MPI_BYTE, &got);
    if ((size_t)got != bytes)
        comm_fail(c, "recv on '%s': rank %d sent %d bytes with tag %d, rank %d expects %zu",
                  c->name, c->world_ranks[call->root], got, call->tag, comm_world_rank(c), bytes);
    check_mpi(c, MPI_Imrecv(into, int_count(c, bytes), MPI_BYTE, &probe.message, &request),
              "recv");
    poll_request(c, &request, &status, call);
#ifdef USE_CUDA
    if (staged) {
        comm_gpu_compute_done();   /* queued kernels may still read the old contents */
        comm_gpu_copy(mpi_staging_gpu(c), call->recv, into, bytes);
        free(into);
    }
#endif
}

static comm *wrap(comm_job *job, comm_rank_state *rs, MPI_Comm data, const char *name) {
    mpi_comm *m = calloc(1, sizeof *m);
    int rank, size;
    MPI_Comm_rank(data, &rank);
    MPI_Comm_size(data, &size);
    int *mine = malloc((size_t)size * sizeof *mine), *world = malloc((size_t)size * sizeof *world);
    if (!m || !mine || !world) { fprintf(stderr, "comm: out of memory\n"); exit(1); }
    MPI_Group group, world_group;
    MPI_Comm_group(data, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    for (int q = 0; q < size; q++) mine[q] = q;
    MPI_Group_translate_ranks(group, size, mine, world_group, world);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    m->data = data;
    MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
    MPI_Comm_dup(data, &m->check);
    comm *c = comm_create(job, rs, &mpi_backend, rank, size, world, name);
    c->impl = m;
    free(mine);
    free(world);
    return c;
}

static comm *mpi_split(comm *c, int color, int key, const char *name, uint64_t seq) {
    comm_call call = {.kind = COMM_KIND_SPLIT, .op = -1, .root = -1, .seq = seq};
    MPI_Comm data;
    check_call(c, &call);
    mpi_watchdog_arm(c, &call);
    int err = MPI_Comm_split(((mpi_comm *)c->impl)->data, color < 0 ? MPI_UNDEFINED : color,
                             key, &data);
    mpi_watchdog_disarm();
    check_mpi(c, err, "split");
    if (data == MPI_COMM_NULL) return NULL;
    mpi_watchdog_arm(c, &call);
    comm *group = wrap(c->job, c->rs, data, name);
    mpi_watchdog_disarm();
    return group;
}

static void mpi_free(comm *c) {
    mpi_comm *m = c->impl;
    reap_sends(c, 1);
    MPI_Comm_free(&m->check);
    MPI_Comm_free(&m->data);
    free(m);
}

static void name_silent_ranks(comm *c) {
    (void)c;
    mpi_roll_call_name_silent(roll_call_comm);
}

static const comm_backend mpi_backend = {
    .name = "mpi",
    .bytes_modelled = 1,
    .run = mpi_run,
    .start = mpi_start,
    .wait = mpi_wait,
    .send = mpi_send,
    .recv = mpi_recv,
    .split = mpi_split,
    .free = mpi_free,
    .stop = stop_now,
    .name_silent_ranks = name_silent_ranks,
};

/* ---- launch ---------------------------------------------------------------------------- */
static void write_trace(comm_job *job, MPI_Comm control, int rank, int size) {
    char *part = comm_trace_rank_json(job, &job->ranks[0]);
    int len = part ? (int)strlen(part) : 0, *lens = NULL, *displs = NULL, total = 0;
    char *all = NULL;
    if (rank == 0) {
        lens = calloc(2 * (size_t)size, sizeof *lens);
        displs = lens + size;
    }
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, control);
    if (rank == 0) {
        for (int q = 0; q < size; q++) {
            displs[q] = total;
            total += lens[q];
        }
        all = malloc((size_t)total + 1);
    }
    MPI_Gatherv(part, len, MPI_CHAR, all, lens, displs, MPI_CHAR, 0, control);
    if (rank == 0 && all) {
        all[total] = 0;
        comm_trace_write(job->opts.trace_path, &all, 1);
    }
    free(all);
    free(lens);
    free(part);
}

int mpi_launch(const comm_options *opts, rank_main_fn fn, void *args) {
    comm_options defaults = comm_options_default();
    init_once();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    comm_job *job = comm_job_create(opts ? opts : &defaults, 1, rank);
    comm_rank_state *rs = &job->ranks[0];
    MPI_Comm data, control;
    MPI_Comm_dup(MPI_COMM_WORLD, &data);
    MPI_Comm_dup(MPI_COMM_WORLD, &control);
    if (roll_call_comm == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &roll_call_comm);
    mem_stats *caller_stats = mem_stats_current();
    mem_stats_bind(&rs->mem);

    /* The device: the node-local rank picks among the node's GPUs. */
    MPI_Comm node;
    int local_rank = 0, local_size = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
    const device_kind device =
        device_select_for_rank(job->opts.device, job->opts.tf32, local_rank);
    comm *world = NULL;
#ifdef USE_CUDA
    /* NCCL when every node has a GPU per process; all processes must agree */
    int nccl = device == DEVICE_CUDA && local_size <= device_gpu_count();
    MPI_Allreduce(MPI_IN_PLACE, &nccl, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (nccl) {
        unsigned char id[NCCL_ID_BYTES];
        if (rank == 0) nccl_unique_id(id);
        MPI_Bcast(id, NCCL_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD);
        MPI_Comm_free(&data);
        world = nccl_world(job, rs, rank, size, id);
    } else if (device == DEVICE_CUDA) {
        job->impl = comm_gpu_open();   /* device buffers go through host copies */
    }
#else
    (void)device, (void)local_size;
#endif
    if (!world) world = wrap(job, rs, data, "world");

    comm_call start = {.kind = COMM_KIND_BARRIER, .op = -1, .root = -1};
    mpi_watchdog_arm(world, &start);
    MPI_Barrier(control);   /* a common time origin for the trace */
    mpi_watchdog_disarm();
    job->t0 = comm_now();
    int status = fn(world, args);
    atomic_store(&rs->status, status);
    atomic_store(&rs->finished, 1);
    if (status != 0) {
        fprintf(stderr, "rank %d failed: rank_main returned %d\n", rank, status);
        stop_now(world, 0);
    }
    /* Wait for the others without a deadline: one stuck in comm times out by itself and
     * ends the job; one still computing is entitled to. */
    MPI_Request done;
    MPI_Ibarrier(control, &done);
    for (int finished = 0; !finished;) {
        MPI_Test(&done, &finished, MPI_STATUS_IGNORE);
        mpi_roll_call_answer(roll_call_comm);
        if (!finished) {
            struct timespec nap = {.tv_nsec = 200000};
            nanosleep(&nap, NULL);
        }
    }
    if (job->opts.trace_path) write_trace(job, control, rank, size);
    MPI_Comm_free(&control);
#ifdef USE_CUDA
    comm_gpu_close(job->impl);
    job->impl = NULL;
#endif
    mem_stats_bind(caller_stats);   /* the caller's thread outlives the rank's stats */
    comm_job_free(job);   /* frees world and any group left */
    return status;
}
