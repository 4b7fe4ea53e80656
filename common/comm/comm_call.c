/* What a call is, below everything that handles one: the clock calls are timed by,
 * the names of kinds and ops, whether two ranks' calls match, and one line that
 * describes a call (for failure reports and traces). */
#include "comm_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

double comm_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static const char *op_name(int op) {
    static const char *names[] = {"sum", "avg", "max"};
    return (op >= COMM_SUM && op <= COMM_MAX) ? names[op] : "?";
}

const char *comm_kind_name(comm_kind kind) {
    static const char *names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                  "reduce", "sendrecv", "barrier", "alltoall"};
    if ((int)kind == COMM_KIND_SPLIT) return "split";
    return (kind >= 0 && kind < COMM_NKINDS) ? names[kind] : "?";
}

int comm_call_matches(const comm_call *a, const comm_call *b) {
    return a->kind == b->kind && a->count == b->count && a->dt == b->dt &&
           a->op == b->op && a->root == b->root;
}

void comm_call_describe(const comm_call *call, char *out, size_t size) {
    const char *name = comm_kind_name((comm_kind)call->kind);
    if (call->kind == COMM_KIND_ALLTOALL && call->op == 1) {
        snprintf(out, size, "alltoallv(%s)", comm_dtype_name(call->dt));
    } else if (call->kind == COMM_KIND_ALLTOALL) {
        snprintf(out, size, "alltoall(%zu x %s per rank)", call->count,
                 comm_dtype_name(call->dt));
    } else if (call->kind == COMM_KIND_BARRIER || call->kind == COMM_KIND_SPLIT) {
        snprintf(out, size, "%s", name);
    } else if (call->kind == COMM_KIND_SENDRECV) {
        snprintf(out, size, "%s(%zu x %s, peer %d, tag %d)", call->op ? "recv" : "send",
                 call->count, comm_dtype_name(call->dt), call->root, call->tag);
    } else {
        char extra[32] = "";
        if (call->op >= 0) snprintf(extra, sizeof extra, ", %s", op_name(call->op));
        if (call->root >= 0)
            snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ", root %d",
                     call->root);
        snprintf(out, size, "%s(%zu x %s%s)", name, call->count, comm_dtype_name(call->dt),
                 extra);
    }
}


/* ---- all-to-all blocks ---------------------------------------------------------------- */
size_t comm_alltoall_block(const comm_call *call, int recv_side, int peer, size_t *offset) {
    const size_t *counts = recv_side ? call->recv_counts : call->send_counts;
    const size_t *offsets = recv_side ? call->recv_offsets : call->send_offsets;
    if (!counts) {   /* the even form */
        *offset = (size_t)peer * call->count;
        return call->count;
    }
    *offset = offsets[peer];
    return counts[peer];
}

size_t comm_alltoall_extent(const comm_call *call, int recv_side, int size) {
    size_t extent = 0;
    for (int j = 0; j < size; j++) {
        size_t offset, len = comm_alltoall_block(call, recv_side, j, &offset);
        if (len && offset + len > extent) extent = offset + len;
    }
    return extent;
}

size_t comm_alltoall_moved(const comm_call *call, int recv_side, int size, int rank) {
    size_t moved = 0, offset;
    for (int j = 0; j < size; j++)
        if (j != rank) moved += comm_alltoall_block(call, recv_side, j, &offset);
    return moved;
}

void comm_alltoallv_mismatch(char *text, size_t size, const char *group, int source,
                             size_t sent, int receiver, size_t expected) {
    snprintf(text, size, "comm_alltoallv on '%s': rank %d sends %zu elements to rank %d, which"
             " expects %zu (its recv_counts[%d])", group, source, sent, receiver, expected,
             source);
}

int comm_alltoallv_arrivals_differ(const comm *c, const comm_call *call,
                                   const uint64_t *arriving, char *why, size_t size) {
    for (int j = 0; j < c->size; j++)
        if (arriving[j] != call->recv_counts[j]) {
            comm_alltoallv_mismatch(why, size, c->name, j, (size_t)arriving[j], c->rank,
                                    call->recv_counts[j]);
            return 1;
        }
    return 0;
}
