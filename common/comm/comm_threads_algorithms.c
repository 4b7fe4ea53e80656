/* The threads backend's collectives: ring all-reduce, reduce-scatter and all-gather,
 * chain broadcast and reduce, the naive and the recursive-doubling all-reduce, the
 * pairwise all-to-all and the barrier, written over the progress counters of
 * comm_threads.c (see there). */
#include "comm_threads_algorithms.h"

#include <stdio.h>
#include <string.h>

/* ---- the algorithms ---------------------------------------------------------------- */
/* Ring all-reduce, in place. The buffer goes round the ring in slabs of N x
 * COMM_SLICE_ELEMENTS, each in 2(N-1) steps, so that a chunk is still in cache
 * when the next rank copies it (NCCL pipelines the same way). In a slab of `count`
 * elements, chunk i is comm_shard(count, N, i).
 * Reduce-scatter, steps s = 1..N-1: rank r adds its left neighbour's chunk r-s-1 into
 * its own copy. The left neighbour added into that chunk one step earlier, so after
 * step s it holds the sum over s+1 ranks, and after N-1 steps rank r owns the full
 * sum of chunk r. All-gather, steps N-1+s: rank r copies chunk r-s, which its left
 * neighbour completed one step earlier. Each rank copies 2(N-1) chunks, 2(N-1)/N of
 * the buffer, from its neighbour. */
static void ring_allreduce(comm *c, const comm_call *call) {
    int n = c->size, r = c->rank, left = mod(r - 1, n), right = mod(r + 1, n);
    size_t slab = (size_t)n * COMM_SLICE_ELEMENTS;
    int slabs = call->count ? (int)((call->count + slab - 1) / slab) : 1, steps = 2 * n - 2;
    threads_enter(c, call, call->recv, call->recv, NULL);
    for (int p = 0; p < slabs; p++) {
        size_t first = (size_t)p * slab, count = call->count - first;
        if (count > slab) count = slab;
        char *buf = at(call->recv, first, call);
        const char *theirs = at(member_of(c, left)->recv, first, call);
        int step = p * steps;   /* steps of the earlier slabs */
        for (int s = 1; s <= n - 1; s++) {                       /* reduce-scatter */
            size_t off, len = comm_shard(count, n, mod(r - s - 1, n), &off);
            threads_wait_step(c, call, left, step + s - 1);
            threads_pull(c, left, at(buf, off, call), at(buf, off, call),
                         at(theirs, off, call), len, call);
            if (s == n - 1 && call->op == COMM_AVG)
                threads_divide(c, at(buf, off, call), len, call, n);
            threads_publish(c, step + s);
        }
        for (int s = 1; s <= n - 1; s++) {                       /* all-gather */
            size_t off, len = comm_shard(count, n, mod(r - s, n), &off);
            threads_wait_step(c, call, left, step + n - 2 + s);
            threads_wait_step(c, call, right, step + s);   /* it has read our partial sum */
            threads_pull(c, left, at(buf, off, call), NULL, at(theirs, off, call), len, call);
            threads_publish(c, step + n - 1 + s);
        }
    }
    threads_finish(c, call, slabs * steps);
}

/* Ring reduce-scatter out of a read-only send buffer: the first half of the
 * all-reduce, with the partial sums in a two-slot scratch (the right neighbour reads
 * slot s%2 at step s+1) and the last step writing straight into recv. */
static void ring_reduce_scatter(comm *c, const comm_call *call, char *scratch) {
    int n = c->size, r = c->rank, left = mod(r - 1, n), right = mod(r + 1, n);
    size_t slot = comm_shard(call->count, n, 0, NULL) * comm_dtype_size(call->dt);
    threads_enter(c, call, call->send, call->recv, scratch);
    for (int s = 1; s <= n - 1; s++) {
        size_t off, len = comm_shard(call->count, n, mod(r - s - 1, n), &off);
        threads_wait_step(c, call, left, s - 1);
        member *l = member_of(c, left);
        const char *theirs = s == 1 ? at(l->send, off, call)
                                    : (char *)l->scratch + (size_t)((s - 1) % 2) * slot;
        char *out = s == n - 1 ? call->recv : scratch + (size_t)(s % 2) * slot;
        if (s >= 3) threads_wait_step(c, call, right, s - 1);   /* it has read this slot */
        threads_pull(c, left, out, at(call->send, off, call), theirs, len, call);
        threads_publish(c, s);
    }
    if (call->op == COMM_AVG)
        threads_divide(c, call->recv, comm_shard(call->count, n, r, NULL), call, n);
    threads_finish(c, call, n - 1);
}

/* Ring all-gather: step s, rank r copies chunk r-s from its left neighbour. */
static void ring_allgather(comm *c, const comm_call *call) {
    int n = c->size, r = c->rank, left = mod(r - 1, n);
    size_t off, len = comm_shard(call->count, n, r, &off);
    if (len && call->send != at(call->recv, off, call))
        threads_move_bytes(c, at(call->recv, off, call), call->send,
                           len * comm_dtype_size(call->dt), 1);
    threads_enter(c, call, call->send, call->recv, NULL);
    for (int s = 1; s <= n - 1; s++) {
        len = comm_shard(call->count, n, mod(r - s, n), &off);
        threads_wait_step(c, call, left, s - 1);
        const char *theirs = member_of(c, left)->recv;
        threads_pull(c, left, at(call->recv, off, call), NULL, at(theirs, off, call), len, call);
        threads_publish(c, s);
    }
    threads_finish(c, call, n - 1);
}

static int slice_count(const comm_call *call) {
    return call->count ? (int)((call->count + COMM_SLICE_ELEMENTS - 1) / COMM_SLICE_ELEMENTS) : 1;
}

/* Pipelined chain from the root: the next rank copies slice 0 from the root, then
 * slice 1 while its right neighbour copies slice 0 from it, and so on. */
static void chain_broadcast(comm *c, const comm_call *call) {
    int n = c->size, left = mod(c->rank - 1, n), slices = slice_count(call);
    size_t slice = COMM_SLICE_ELEMENTS;
    threads_enter(c, call, call->recv, call->recv, NULL);
    if (c->rank == call->root) threads_publish(c, slices);     /* the root has every slice */
    else
        for (int i = 0; i < slices; i++) {
            size_t off = (size_t)i * slice, len = call->count - off;
            if (len > slice) len = slice;
            threads_wait_step(c, call, left, i + 1);
            const char *theirs = member_of(c, left)->recv;
            threads_pull(c, left, at(call->recv, off, call), NULL, at(theirs, off, call), len,
                         call);
            threads_publish(c, i + 1);
        }
    threads_finish(c, call, slices);
}

/* Pipelined chain to the root: the rank after the root starts from its own data, each
 * next rank adds its own slice to what arrives and passes the sum on through a
 * two-slot scratch (buffers of non-roots stay unchanged), the root adds last. */
static void chain_reduce(comm *c, const comm_call *call, char *scratch) {
    int n = c->size, left = mod(c->rank - 1, n), right = mod(c->rank + 1, n);
    int pos = mod(c->rank - call->root - 1, n), slices = slice_count(call);
    size_t slice = COMM_SLICE_ELEMENTS, stride = slice * comm_dtype_size(call->dt);
    char *buf = call->recv;
    threads_enter(c, call, buf, buf, scratch);
    if (pos == 0) threads_publish(c, slices);                  /* first of the chain: all ready */
    else
        for (int i = 0; i < slices; i++) {
            size_t off = (size_t)i * slice, len = call->count - off;
            if (len > slice) len = slice;
            threads_wait_step(c, call, left, i + 1);
            member *l = member_of(c, left);
            const char *theirs = pos == 1 ? at(l->send, off, call)
                                          : (char *)l->scratch + (size_t)(i % 2) * stride;
            char *out = pos == n - 1 ? at(buf, off, call) : scratch + (size_t)(i % 2) * stride;
            if (pos < n - 1 && i >= 2) threads_wait_step(c, call, right, i - 1);  /* slot is free */
            threads_pull(c, left, out, at(buf, off, call), theirs, len, call);
            threads_publish(c, i + 1);
        }
    if (pos == n - 1 && call->op == COMM_AVG) threads_divide(c, buf, call->count, call, n);
    threads_finish(c, call, slices);
}

/* The naive all-reduce of the lesson: rank 0 adds every other rank's whole buffer into
 * its own, then every rank copies the result from rank 0. Rank 0 moves (N-1) times the
 * buffer each way: the bottleneck the ring removes. */
static void naive_allreduce(comm *c, const comm_call *call) {
    char *buf = call->recv;
    threads_enter(c, call, buf, buf, NULL);
    if (c->rank == 0) {
        for (int q = 1; q < c->size; q++) {
            threads_wait_step(c, call, q, 0);
            threads_pull(c, q, buf, buf, member_of(c, q)->recv, call->count, call);
        }
        if (call->op == COMM_AVG) threads_divide(c, buf, call->count, call, c->size);
        threads_publish(c, 1);
        for (int q = 1; q < c->size; q++) threads_wait_step(c, call, q, 2);   /* all copied */
        threads_publish(c, 2);
    } else {
        threads_wait_step(c, call, 0, 1);
        threads_pull(c, 0, buf, NULL, member_of(c, 0)->recv, call->count, call);
        threads_publish(c, 2);
    }
    threads_finish(c, call, 2);
}

/* Recursive doubling, the latency-optimal all-reduce: in round k = 1..L the ranks
 * pair up 2^(k-1) apart and each adds its partner's whole buffer into its own, so
 * after L = log2 N rounds everyone holds the sum: L messages instead of the ring's
 * 2(N-1), but each carries the whole buffer (L x bytes instead of 2(N-1)/N x bytes).
 * For N not a power of two, P = 2^floor(log2 N) ranks take part and the E = N - P
 * others fold in first: step 1, rank 2i (i < E) adds rank 2i+1's buffer into its own;
 * at the end rank 2i+1 copies the result back (2 rounds more). a + b == b + a in
 * floating point, so both partners of a round compute the same bits and every rank
 * ends with an identical result.
 * Round k writes into location k % 2 (0: the buffer, 1: the scratch) from location
 * (k-1) % 2 of both partners, so a partner's read never sees a half-written value;
 * before overwriting a location a rank waits for the partner that read it. Steps:
 * 1 fold, 1 + k round k, L + 2 result in place (and divided for AVG). */
typedef struct {
    int extra;          /* E: ranks folded into a partner */
    int virtual_rank;   /* 0..P-1 for ranks taking part, -1 for the folded ones */
    int rounds;         /* L = log2 P */
} doubling_plan;

static doubling_plan doubling_plan_of(int n, int r) {
    int p = 1, rounds = 0;
    while (2 * p <= n) { p *= 2; rounds++; }
    doubling_plan d = {.extra = n - p, .rounds = rounds};
    if (r < 2 * d.extra) d.virtual_rank = r % 2 ? -1 : r / 2;
    else d.virtual_rank = r - d.extra;
    return d;
}

static int doubling_real_rank(const doubling_plan *d, int virtual_rank) {
    return virtual_rank < d->extra ? 2 * virtual_rank : virtual_rank + d->extra;
}

static char *doubling_location(member *m, int round) {
    return round % 2 ? m->scratch : m->recv;
}

static void doubling_rounds(comm *c, const comm_call *call, const doubling_plan *d) {
    member *me = member_of(c, c->rank);
    for (int k = 1; k <= d->rounds; k++) {
        int partner = doubling_real_rank(d, d->virtual_rank ^ (1 << (k - 1)));
        threads_wait_step(c, call, partner, k);       /* its round k-1 result is ready */
        if (k >= 2) {                         /* the last reader of location k % 2 */
            int previous = doubling_real_rank(d, d->virtual_rank ^ (1 << (k - 2)));
            threads_wait_step(c, call, previous, k);
        }
        threads_pull(c, partner, doubling_location(me, k), doubling_location(me, k - 1),
             doubling_location(member_of(c, partner), k - 1), call->count, call);
        threads_publish(c, 1 + k);
    }
    if (d->rounds) {   /* the last partner has read location (L-1) % 2 */
        int last = doubling_real_rank(d, d->virtual_rank ^ (1 << (d->rounds - 1)));
        threads_wait_step(c, call, last, 1 + d->rounds);
    }
    if (d->rounds % 2 && call->count)
        threads_move_bytes(c, call->recv, me->scratch, call->count * comm_dtype_size(call->dt), 0);
    if (call->op == COMM_AVG) threads_divide(c, call->recv, call->count, call, c->size);
}

static void doubling_allreduce(comm *c, const comm_call *call, void *scratch) {
    int r = c->rank;
    doubling_plan d = doubling_plan_of(c->size, r);
    int done = d.rounds + 2;
    char *buf = call->recv;
    threads_enter(c, call, buf, buf, scratch);
    if (d.virtual_rank < 0) {                 /* folded: hand over, then copy back */
        threads_wait_step(c, call, r - 1, done);
        threads_pull(c, r - 1, buf, NULL, member_of(c, r - 1)->recv, call->count, call);
        threads_publish(c, done);
    } else {
        if (r < 2 * d.extra) {                /* take in the folded neighbour */
            threads_wait_step(c, call, r + 1, 0);
            threads_pull(c, r + 1, buf, buf, member_of(c, r + 1)->recv, call->count, call);
        }
        threads_publish(c, 1);
        doubling_rounds(c, call, &d);
        threads_publish(c, done);
        if (r < 2 * d.extra) threads_wait_step(c, call, r + 1, done);   /* it has copied */
    }
    threads_finish(c, call, done);
}

/* All-to-all: copies rank `source`'s block for this rank (its own: a local copy). The
 * length comes from the sender's counts and must be the receiver's; when they differ
 * nothing is copied and `mismatch` says why. */
static void take_block(comm *c, const comm_call *call, int source, char *mismatch,
                       size_t size) {
    member *m = member_of(c, source);
    const comm_call *theirs = source == c->rank ? call : &m->call;
    const void *their_send = source == c->rank ? call->send : m->send;
    size_t their_offset, my_offset;
    size_t len = comm_alltoall_block(theirs, 0, c->rank, &their_offset);
    size_t expected = comm_alltoall_block(call, 1, source, &my_offset);
    if (len != expected) {
        if (!mismatch[0])
            comm_alltoallv_mismatch(mismatch, size, c->name, source, len, c->rank, expected);
        return;
    }
    if (source == c->rank && len)
        threads_move_bytes(c, at(call->recv, my_offset, call), at(their_send, their_offset, call),
                           len * comm_dtype_size(call->dt), 0);
    else if (source != c->rank)
        threads_pull(c, source, at(call->recv, my_offset, call), NULL,
                     at(their_send, their_offset, call), len, call);
}

/* Pairwise all-to-all: at step k = 1..N-1 rank r copies its block out of rank r-k's
 * send buffer, so rank r+k takes r's block at the same step ("send to r+k, receive
 * from r-k") and no peer is read by two ranks at once. Step 1 = "took every block": a
 * rank leaves once every peer has taken its blocks out of its buffers, and reports
 * counts that disagree only then, so that no peer reads the arrays of a rank gone. */
static void pairwise_alltoall(comm *c, const comm_call *call) {
    int n = c->size, r = c->rank;
    char mismatch[200] = "";
    threads_enter(c, call, call->send, call->recv, NULL);
    take_block(c, call, r, mismatch, sizeof mismatch);
    for (int k = 1; k < n; k++) {
        int source = mod(r - k, n);
        threads_wait_step(c, call, source, 0);
        if (comm_job_stopping(c->job)) comm_leave_thread();   /* it may have left */
        const comm_call *theirs = &member_of(c, source)->call;
        if (!comm_call_matches(call, theirs)) comm_fail_mismatch(c, source, call, theirs);
        take_block(c, call, source, mismatch, sizeof mismatch);
    }
    threads_publish(c, 1);
    for (int q = 0; q < n; q++) threads_wait_step(c, call, q, 1);
    threads_finish(c, call, 1);
    if (mismatch[0]) comm_fail(c, "%s", mismatch);
}

/* Step 1 = "arrived and checked": nobody leaves before its right neighbour has read
 * its call (enter), as in every collective. */
void threads_barrier(comm *c, const comm_call *call) {
    threads_enter(c, call, NULL, NULL, NULL);
    threads_publish(c, 1);
    for (int q = 0; q < c->size; q++) threads_wait_step(c, call, q, 1);
    threads_finish(c, call, 1);
}

size_t threads_scratch_bytes(const comm *c, const comm_call *call) {
    size_t es = comm_dtype_size(call->dt);
    if (call->kind == COMM_KIND_ALLREDUCE && c->job->opts.allreduce == ALLREDUCE_DOUBLING)
        return c->size > 1 ? call->count * es : 0;   /* odd rounds' location */
    if (c->size < 3) return 0;
    if (call->kind == COMM_KIND_REDUCE_SCATTER)
        return 2 * comm_shard(call->count, c->size, 0, NULL) * es;
    if (call->kind == COMM_KIND_REDUCE)
        return 2 * (call->count < COMM_SLICE_ELEMENTS ? call->count : COMM_SLICE_ELEMENTS) * es;
    return 0;
}

void threads_execute(comm *c, const comm_call *call, void *scratch) {
    if (comm_job_stopping(c->job)) comm_leave_thread();
    if (c->size == 1 && call->kind == COMM_KIND_ALLTOALL) {
        char mismatch[200] = "";
        take_block(c, call, 0, mismatch, sizeof mismatch);
        if (mismatch[0]) comm_fail(c, "%s", mismatch);
        return;
    }
    if (c->size == 1) {   /* alone: only out-of-place copies remain */
        size_t bytes = call->count * comm_dtype_size(call->dt);
        if ((call->kind == COMM_KIND_REDUCE_SCATTER || call->kind == COMM_KIND_ALLGATHER) &&
            bytes && call->send != call->recv)
            threads_move_bytes(c, call->recv, call->send, bytes, 1);
        return;
    }
    switch (call->kind) {
    case COMM_KIND_ALLREDUCE:
        if (c->job->opts.allreduce == ALLREDUCE_NAIVE) naive_allreduce(c, call);
        else if (c->job->opts.allreduce == ALLREDUCE_DOUBLING)
            doubling_allreduce(c, call, scratch);
        else ring_allreduce(c, call);
        break;
    case COMM_KIND_REDUCE_SCATTER: ring_reduce_scatter(c, call, scratch); break;
    case COMM_KIND_ALLGATHER: ring_allgather(c, call); break;
    case COMM_KIND_BROADCAST: chain_broadcast(c, call); break;
    case COMM_KIND_REDUCE: chain_reduce(c, call, scratch); break;
    case COMM_KIND_ALLTOALL: pairwise_alltoall(c, call); break;
    default: threads_barrier(c, call); break;
    }
}

