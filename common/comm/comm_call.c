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
                                  "reduce", "sendrecv", "barrier"};
    if ((int)kind == COMM_KIND_SPLIT) return "split";
    return (kind >= 0 && kind < COMM_NKINDS) ? names[kind] : "?";
}

int comm_call_matches(const comm_call *a, const comm_call *b) {
    return a->kind == b->kind && a->count == b->count && a->dt == b->dt &&
           a->op == b->op && a->root == b->root;
}

void comm_call_describe(const comm_call *call, char *out, size_t size) {
    const char *name = comm_kind_name((comm_kind)call->kind);
    if (call->kind == COMM_KIND_BARRIER || call->kind == COMM_KIND_SPLIT) {
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

