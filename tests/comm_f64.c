/* COMM_F64 on any backend (tests/test_comm.c: threads; tests/test_mpi_comm.c: MPI):
 * every collective and send/recv of doubles whose values need more than fp32's 24
 * bits, against the same arithmetic done serially in double: exact, tolerance 0.
 * The negative control sends the same values as fp32 and must see them differ. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"

int comm_check_f64(comm *c, size_t count, const char *label);
double comm_f64_sum_through(comm *c, size_t count, comm_dtype wire);

/* Integers 1..8 plus multiples of 2^-40: 48 significant bits, so that any sum over
 * up to 8 ranks is exact in double and every one of them is rounded in fp32. */
static double value(int rank, size_t i) {
    return (double)(rank + 1) + (double)((i % 1021) + 1) * 0x1p-40;
}

static double largest_diff(const double *got, const double *want, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    return worst;
}

static void fill(double *x, int rank, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] = value(rank, i);
}

/* sum, avg, max over the ranks of element i, in double, in rank order */
static double serial(int n, size_t i, comm_op op) {
    double acc = op == COMM_MAX ? -INFINITY : 0;
    for (int q = 0; q < n; q++) acc = op == COMM_MAX ? fmax(acc, value(q, i)) : acc + value(q, i);
    return op == COMM_AVG ? acc / n : acc;
}

typedef struct {
    const char *names[12];
    double diffs[12];
    int count;
} f64_checks;

static void record(f64_checks *k, const char *name, double diff) {
    k->names[k->count] = name;
    k->diffs[k->count++] = diff;
}

static void check_reductions(comm *c, double *buf, double *want, size_t count,
                             f64_checks *k) {
    static const char *names[] = {"f64 allreduce sum", "f64 allreduce avg",
                                  "f64 allreduce max"};
    int r = comm_rank(c), n = comm_size(c);
    for (int op = COMM_SUM; op <= COMM_MAX; op++) {
        fill(buf, r, count);
        for (size_t i = 0; i < count; i++) want[i] = serial(n, i, (comm_op)op);
        comm_allreduce(c, buf, count, COMM_F64, (comm_op)op);
        record(k, names[op], largest_diff(buf, want, count));
    }
    fill(buf, r, count);
    comm_request *req = comm_allreduce_start(c, buf, count, COMM_F64, COMM_SUM);
    comm_wait(req);
    for (size_t i = 0; i < count; i++) want[i] = serial(n, i, COMM_SUM);
    record(k, "f64 allreduce_start sum", largest_diff(buf, want, count));
    fill(buf, r, count);
    comm_reduce(c, buf, count, COMM_F64, COMM_SUM, 0);
    record(k, "f64 reduce sum to root 0", r == 0 ? largest_diff(buf, want, count) : 0);
}

static void check_moves(comm *c, double *buf, double *want, double *shard, size_t count,
                        f64_checks *k) {
    int r = comm_rank(c), n = comm_size(c);
    size_t off, len = comm_shard(count, n, r, &off);
    fill(buf, r, count);
    comm_reduce_scatter(c, buf, shard, count, COMM_F64, COMM_SUM);
    for (size_t i = 0; i < len; i++) want[i] = serial(n, off + i, COMM_SUM);
    record(k, "f64 reduce_scatter sum", largest_diff(shard, want, len));
    for (size_t i = 0; i < len; i++) shard[i] = value(r, off + i) + (double)r;
    comm_allgather(c, shard, buf, count, COMM_F64);
    for (int q = 0; q < n; q++) {
        size_t qo, ql = comm_shard(count, n, q, &qo);
        for (size_t i = 0; i < ql; i++) want[qo + i] = value(q, qo + i) + (double)q;
    }
    record(k, "f64 allgather", largest_diff(buf, want, count));
    fill(buf, r, count);
    comm_broadcast(c, buf, count, COMM_F64, n - 1);
    for (size_t i = 0; i < count; i++) want[i] = value(n - 1, i);
    record(k, "f64 broadcast from rank N-1", largest_diff(buf, want, count));
}

/* Around the ring: even ranks send first, odd ones receive first (no two blocking
 * sends wait on each other under MPI). */
static void check_send_recv(comm *c, double *buf, double *want, size_t count,
                            f64_checks *k) {
    int r = comm_rank(c), n = comm_size(c);
    size_t m = count < 4096 ? count : 4096;
    if (n < 2) {
        record(k, "f64 send/recv around the ring", 0);
        return;
    }
    double *out = want;
    fill(out, r, m);
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    if (r % 2 == 0) comm_send(c, out, m, COMM_F64, next, 7);
    comm_recv(c, buf, m, COMM_F64, prev, 7);
    if (r % 2 == 1) comm_send(c, out, m, COMM_F64, next, 7);
    for (size_t i = 0; i < m; i++) out[i] = value(prev, i);
    record(k, "f64 send/recv around the ring", largest_diff(buf, out, m));
}

/* The bytes of an f64 all-reduce are twice those of an fp32 one of the same count. */
static void check_bytes(comm *c, double *buf, size_t count, f64_checks *k) {
    comm_stats_reset(c);
    comm_allreduce(c, buf, count, COMM_F32, COMM_SUM);
    uint64_t f32_bytes = comm_stats_get(c).bytes_sent[COMM_KIND_ALLREDUCE];
    comm_stats_reset(c);
    comm_allreduce(c, buf, count, COMM_F64, COMM_SUM);
    uint64_t f64_bytes = comm_stats_get(c).bytes_sent[COMM_KIND_ALLREDUCE];
    record(k, "f64 allreduce bytes - 2 x fp32's", fabs((double)f64_bytes - 2.0 * (double)f32_bytes));
}

int comm_check_f64(comm *c, size_t count, const char *label) {
    size_t bytes = (count ? count : 1) * sizeof(double);
    double *buf = mem_alloc(MEM_COMM, bytes), *want = mem_alloc(MEM_COMM, bytes),
           *shard = mem_alloc(MEM_COMM, bytes);
    f64_checks k = {.count = 0};
    check_reductions(c, buf, want, count, &k);
    check_moves(c, buf, want, shard, count, &k);
    check_send_recv(c, buf, want, count, &k);
    check_bytes(c, buf, count, &k);
    double worst[12];
    memcpy(worst, k.diffs, sizeof worst);
    comm_allreduce(c, worst, (size_t)k.count, COMM_F64, COMM_MAX);
    int failures = 0;
    for (int i = 0; i < k.count; i++) failures += worst[i] != 0;
    if (comm_rank(c) == 0) {
        printf("%s: %d ranks, count %zu: largest |diff| per f64 check (tolerance 0):\n",
               label, comm_size(c), count);
        for (int i = 0; i < k.count; i++) printf("    %-40s %g\n", k.names[i], worst[i]);
        fflush(stdout);
    }
    mem_free(buf);
    mem_free(want);
    mem_free(shard);
    return failures;
}

/* The largest difference of an all-reduce sum of the same values sent as `wire`
 * (COMM_F64, or COMM_F32 for the negative control) from the exact sums. */
double comm_f64_sum_through(comm *c, size_t count, comm_dtype wire) {
    double *x = mem_alloc(MEM_COMM, count * sizeof *x);
    void *on_wire = mem_alloc(MEM_COMM, count * comm_dtype_size(wire));
    fill(x, comm_rank(c), count);
    comm_convert(on_wire, wire, x, COMM_F64, count);
    comm_allreduce(c, on_wire, count, wire, COMM_SUM);
    comm_convert(x, COMM_F64, on_wire, wire, count);
    double worst = 0;
    for (size_t i = 0; i < count; i++)
        worst = fmax(worst, fabs(x[i] - serial(comm_size(c), i, COMM_SUM)));
    comm_allreduce(c, &worst, 1, COMM_F64, COMM_MAX);
    mem_free(x);
    mem_free(on_wire);
    return worst;
}
