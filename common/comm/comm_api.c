/* The comm front end: the calls of comm.h checked, numbered, recorded in the flight
 * recorder, handed to the backend and accounted. Below it: comm_call.c (what a call
 * is and how it is described), comm_job.c (jobs, ranks, groups, the link model),
 * comm_codec.c (element types on the wire), comm_failure.c (flight recorder, failure
 * reports), comm_accounting.c (counters and the trace). Backends: comm_threads.c,
 * comm_mpi.c, gpu/ (NCCL). */
#include "comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the API: check, number, record, hand to the backend, account ----------------- */
static comm_call make_call(int kind, const void *send, void *recv, size_t count,
                           comm_dtype dt, int op, int root) {
    return (comm_call){.kind = kind, .send = send, .recv = recv, .count = count,
                       .dt = (int)dt, .op = op, .root = root};
}

/* All-to-all: the arrays of the -v form, buffers for the blocks, no overlap (a peer
 * may still read this rank's send while it writes its recv). */
static void check_alltoall(comm *c, const comm_call *call) {
    if (call->op == 1 && (!call->send_counts || !call->send_offsets || !call->recv_counts ||
                          !call->recv_offsets))
        comm_fail(c, "comm_alltoallv on '%s': NULL counts or offsets", c->name);
    size_t es = comm_dtype_size(call->dt);
    size_t send_extent = comm_alltoall_extent(call, 0, c->size) * es;
    size_t recv_extent = comm_alltoall_extent(call, 1, c->size) * es;
    if ((send_extent && !call->send) || (recv_extent && !call->recv))
        comm_fail(c, "comm_alltoall on '%s': NULL buffer for %zu bytes", c->name,
                  call->send ? recv_extent : send_extent);
    const char *send = call->send, *recv = call->recv;
    if (send_extent && recv_extent && send < recv + recv_extent && recv < send + send_extent)
        comm_fail(c, "comm_alltoall on '%s': send and recv overlap (not supported in place)",
                  c->name);
}

static void check_call(comm *c, const comm_call *call) {
    const char *name = comm_kind_name((comm_kind)call->kind);
    if (call->dt < COMM_F32 || call->dt >= COMM_NDTYPES)
        comm_fail(c, "comm_%s on '%s': unknown dtype %d", name, c->name, call->dt);
    if (call->kind != COMM_KIND_ALLGATHER && call->kind != COMM_KIND_BROADCAST &&
        call->kind != COMM_KIND_BARRIER && (call->op < COMM_SUM || call->op > COMM_MAX))
        comm_fail(c, "comm_%s on '%s': unknown op %d", name, c->name, call->op);
    if (call->root != -1 && (call->root < 0 || call->root >= c->size))
        comm_fail(c, "comm_%s on '%s': rank %d out of range (the group has %d ranks)", name,
                  c->name, call->root, c->size);
    if (call->count > 0 && (!call->send || !call->recv))
        comm_fail(c, "comm_%s on '%s': NULL buffer for %zu elements", name, c->name,
                  call->count);
    if (call->kind == COMM_KIND_ALLTOALL) check_alltoall(c, call);
}

/* Bytes a call carries, for the trace: the buffer, or what all-to-all sends away. */
static uint64_t call_bytes(const comm *c, const comm_call *call) {
    size_t elements = call->kind == COMM_KIND_ALLTOALL
                          ? comm_alltoall_moved(call, 0, c->size, c->rank)
                          : call->count;
    return elements * comm_dtype_size(call->dt);
}

static void trace_call(comm *c, int tid, const char *prefix, const comm_call *call,
                       double t0, double t1) {
    if (!c->job->opts.trace_path) return;
    char name[48];
    snprintf(name, sizeof name, "%s%s", prefix, comm_kind_name((comm_kind)call->kind));
    comm_trace_span(c, tid, name, t0, t1, call_bytes(c, call));
}

static void run_blocking(comm *c, comm_call call) {
    check_call(c, &call);
    call.seq = ++c->seq;
    uint64_t flight = comm_flight_begin(c, &call, FLIGHT_RUNNING);
    double t0 = comm_now();
    c->backend->run(c, &call);
    double t1 = comm_now();
    comm_flight_set(c, flight, FLIGHT_DONE);
    if (!comm_counting_paused(c)) {
        c->counters.calls[call.kind]++;
        c->counters.seconds[call.kind] += t1 - t0;
    }
    comm_count_modelled(c, &call);
    trace_call(c, comm_world_rank(c), "", &call, t0, t1);
}

static comm_request *start(comm *c, comm_call call) {
    check_call(c, &call);
    call.seq = ++c->seq;
    comm_request *req = calloc(1, sizeof *req);
    if (!req) comm_fail(c, "out of memory");
    *req = (comm_request){.c = c, .call = call, .t_start = comm_now()};
    req->flight = comm_flight_begin(c, &call, FLIGHT_QUEUED);
    if (!comm_counting_paused(c)) c->counters.calls[call.kind]++;
    comm_count_modelled(c, &call);
    req->next_unwaited = c->unwaited;
    if (c->unwaited) c->unwaited->prev_unwaited = req;
    c->unwaited = req;
    c->backend->start(c, req);
    return req;
}

void comm_wait(comm_request *req) {
    if (!req) return;
    comm *c = req->c;
    double t0 = comm_now();
    c->backend->wait(c, req);
    double t1 = comm_now();
    comm_flight_set(c, req->flight, FLIGHT_DONE);
    double done = req->t_done > req->t_start ? req->t_done : t1;
    /* Hidden: the part of the flight before the program started waiting for it. */
    double hidden = (t0 < done ? t0 : done) - req->t_start;
    if (!comm_counting_paused(c)) {
        c->counters.seconds[req->call.kind] += t1 - t0;
        c->counters.async_seconds += done - req->t_start;
        c->counters.hidden_seconds += hidden > 0 ? hidden : 0;
    }
    trace_call(c, 1000 + comm_world_rank(c), "", &req->call, req->t_start, done);
    trace_call(c, comm_world_rank(c), "wait ", &req->call, t0, t1);
    if (req->prev_unwaited) req->prev_unwaited->next_unwaited = req->next_unwaited;
    else c->unwaited = req->next_unwaited;
    if (req->next_unwaited) req->next_unwaited->prev_unwaited = req->prev_unwaited;
    free(req);
}

void comm_allreduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op) {
    run_blocking(c, make_call(COMM_KIND_ALLREDUCE, buf, buf, count, dt, (int)op, -1));
}
void comm_reduce_scatter(comm *c, const void *send, void *recv, size_t count,
                         comm_dtype dt, comm_op op) {
    run_blocking(c,
                 make_call(COMM_KIND_REDUCE_SCATTER, send, recv, count, dt, (int)op, -1));
}
void comm_allgather(comm *c, const void *send, void *recv, size_t count, comm_dtype dt) {
    run_blocking(c, make_call(COMM_KIND_ALLGATHER, send, recv, count, dt, -1, -1));
}
void comm_broadcast(comm *c, void *buf, size_t count, comm_dtype dt, int root) {
    run_blocking(c, make_call(COMM_KIND_BROADCAST, buf, buf, count, dt, -1, root));
}
void comm_reduce(comm *c, void *buf, size_t count, comm_dtype dt, comm_op op, int root) {
    run_blocking(c, make_call(COMM_KIND_REDUCE, buf, buf, count, dt, (int)op, root));
}
void comm_barrier(comm *c) {
    run_blocking(c, make_call(COMM_KIND_BARRIER, NULL, NULL, 0, COMM_F32, -1, -1));
}

void comm_alltoall(comm *c, const void *send, void *recv, size_t count, comm_dtype dt) {
    run_blocking(c, make_call(COMM_KIND_ALLTOALL, send, recv, count, dt, 0, -1));
}
void comm_alltoallv(comm *c, const void *send, const size_t *send_counts,
                    const size_t *send_offsets, void *recv, const size_t *recv_counts,
                    const size_t *recv_offsets, comm_dtype dt) {
    comm_call call = make_call(COMM_KIND_ALLTOALL, send, recv, 0, dt, 1, -1);
    call.send_counts = send_counts;
    call.send_offsets = send_offsets;
    call.recv_counts = recv_counts;
    call.recv_offsets = recv_offsets;
    run_blocking(c, call);
}

comm_request *comm_allreduce_start(comm *c, void *buf, size_t count, comm_dtype dt,
                                   comm_op op) {
    return start(c, make_call(COMM_KIND_ALLREDUCE, buf, buf, count, dt, (int)op, -1));
}
comm_request *comm_reduce_scatter_start(comm *c, const void *send, void *recv,
                                        size_t count, comm_dtype dt, comm_op op) {
    return start(c,
                 make_call(COMM_KIND_REDUCE_SCATTER, send, recv, count, dt, (int)op, -1));
}
comm_request *comm_allgather_start(comm *c, const void *send, void *recv, size_t count,
                                   comm_dtype dt) {
    return start(c, make_call(COMM_KIND_ALLGATHER, send, recv, count, dt, -1, -1));
}

static void point_to_point(comm *c, comm_call call, int tag) {
    int is_recv = call.op;
    const char *name = is_recv ? "comm_recv" : "comm_send";
    if (call.dt < COMM_F32 || call.dt >= COMM_NDTYPES)
        comm_fail(c, "%s on '%s': unknown dtype %d", name, c->name, call.dt);
    if (call.root < 0 || call.root >= c->size)
        comm_fail(c, "%s on '%s': peer %d out of range (the group has %d ranks)", name,
                  c->name, call.root, c->size);
    if (tag < 0 || tag > 32767)
        comm_fail(c, "%s on '%s': tag %d outside 0..32767", name, c->name, tag);
    if (call.count > 0 && !call.send)
        comm_fail(c, "%s on '%s': NULL buffer", name, c->name);
    call.seq = 0;
    call.tag = tag;
    uint64_t flight = comm_flight_begin(c, &call, FLIGHT_RUNNING);
    size_t bytes = call.count * comm_dtype_size(call.dt);
    double t0 = comm_now();
    if (is_recv) c->backend->recv(c, &call);
    else c->backend->send(c, &call);
    double t1 = comm_now();
    comm_flight_set(c, flight, FLIGHT_DONE);
    if (!comm_counting_paused(c)) {
        c->counters.calls[COMM_KIND_SENDRECV]++;
        c->counters.seconds[COMM_KIND_SENDRECV] += t1 - t0;
    }
    comm_count_modelled(c, &call);
    if (c->job->opts.trace_path)
        comm_trace_span(c, comm_world_rank(c), is_recv ? "recv" : "send", t0, t1, bytes);
}

void comm_send(comm *c, const void *buf, size_t count, comm_dtype dt, int peer, int tag) {
    point_to_point(c, make_call(COMM_KIND_SENDRECV, buf, NULL, count, dt, 0, peer), tag);
}
void comm_recv(comm *c, void *buf, size_t count, comm_dtype dt, int peer, int tag) {
    point_to_point(c, make_call(COMM_KIND_SENDRECV, buf, buf, count, dt, 1, peer), tag);
}

comm *comm_split(comm *c, int color, int key, const char *name) {
    comm_call call = make_call(COMM_KIND_SPLIT, NULL, NULL, 0, COMM_F32, -1, -1);
    call.seq = ++c->seq;
    uint64_t flight = comm_flight_begin(c, &call, FLIGHT_RUNNING);
    double t0 = comm_now();
    comm *group = c->backend->split(c, color, key, name ? name : "group", call.seq);
    comm_flight_set(c, flight, FLIGHT_DONE);
    if (c->job->opts.trace_path)
        comm_trace_span(c, comm_world_rank(c), "split", t0, comm_now(), 0);
    return group;
}
