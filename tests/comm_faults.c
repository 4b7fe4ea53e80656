/* Shared by tests/test_comm.c (threads) and tests/test_mpi_comm.c (MPI), so both
 * backends pass the very same checks: the fault scenarios (programs that must end with
 * a clear message, never hang), every collective against a serial reference, and the
 * rank programs for groups, async overlap and send/recv. Linked into every test binary
 * (no main here); the two test files declare what they use. */
#include "comm.h"
#include "comm_internal.h"   /* COMM_SLICE_ELEMENTS: the threads ring's rounding order */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int comm_fault_main(comm *world, void *scenario);
int comm_check_collectives(comm *c, size_t count, int order, const char *label);
int comm_test_split_main(comm *world, void *arg);
int comm_test_async_main(comm *world, void *arg);
int comm_test_p2p_main(comm *world, void *arg);
extern const char *const comm_fault_scenarios[];

const char *const comm_fault_scenarios[] = {
    "mismatch",        /* rank 1 calls all-gather while the others call all-reduce */
    "mismatch-count",  /* rank 1 all-reduces one element fewer */
    "mismatch-root",   /* rank 1 broadcasts from another root */
    "hang",            /* the last rank skips an all-reduce and returns */
    "async-hang",      /* the same with an asynchronous all-reduce */
    "recv-hang",       /* rank 0 receives a message nobody sends */
    "recv-size",       /* rank 1 expects fewer bytes than rank 0 sends */
    "abort",           /* the last rank calls comm_abort while the others all-reduce */
    "fail",            /* rank 1 returns 3 from rank_main while the others wait */
    "alltoall-hang",   /* the last rank skips an all-to-all */
    "alltoallv-count", /* rank 1 expects one element fewer from rank 0 than it sends */
    NULL,
};

/* 2 elements from every rank to every rank; rank 1's recv_counts[0] says 1. */
static void alltoall_fault(comm *world, const char *name) {
    int r = comm_rank(world), n = comm_size(world);
    float send[16] = {0}, recv[16];
    size_t counts[8], offsets[8], expected[8];
    for (int j = 0; j < n && j < 8; j++) {
        counts[j] = expected[j] = 2;
        offsets[j] = 2 * (size_t)j;
    }
    if (!strcmp(name, "alltoall-hang")) {
        if (r != n - 1) comm_alltoall(world, send, recv, 2, COMM_F32);
    } else {
        if (r == 1) expected[0] = 1;
        comm_alltoallv(world, send, counts, offsets, recv, expected, offsets, COMM_F32);
    }
}

/* Every scenario first runs one good collective, so the flight recorder shows it. */
int comm_fault_main(comm *world, void *scenario) {
    const char *name = scenario;
    int r = comm_rank(world), n = comm_size(world);
    float x[16] = {0};
    size_t off, len = comm_shard(16, n, r, &off);
    (void)len;
    comm_allreduce(world, x, 16, COMM_F32, COMM_SUM);
    if (!strcmp(name, "mismatch")) {
        if (r == 1) comm_allgather(world, x + off, x, 16, COMM_F32);
        else comm_allreduce(world, x, 16, COMM_F32, COMM_SUM);
    } else if (!strcmp(name, "mismatch-count")) {
        comm_allreduce(world, x, r == 1 ? 15 : 16, COMM_F32, COMM_SUM);
    } else if (!strcmp(name, "mismatch-root")) {
        comm_broadcast(world, x, 16, COMM_F32, r == 1 ? 1 : 0);
    } else if (!strcmp(name, "hang")) {
        if (r != n - 1) comm_allreduce(world, x, 16, COMM_F32, COMM_SUM);
    } else if (!strcmp(name, "async-hang")) {
        if (r != n - 1) comm_wait(comm_allreduce_start(world, x, 16, COMM_F32, COMM_SUM));
    } else if (!strcmp(name, "recv-hang")) {
        if (r == 0) comm_recv(world, x, 16, COMM_F32, n - 1, 7);
    } else if (!strcmp(name, "recv-size")) {
        if (r == 0) comm_send(world, x, 16, COMM_F32, 1, 5);
        if (r == 1) comm_recv(world, x, 15, COMM_F32, 0, 5);
    } else if (!strcmp(name, "abort")) {
        if (r == n - 1) comm_abort(world, "boom: loss is NaN at step %d", 7);
        comm_allreduce(world, x, 16, COMM_F32, COMM_SUM);
    } else if (!strcmp(name, "fail")) {
        if (r == 1) return 3;
        comm_barrier(world);
    } else if (!strncmp(name, "alltoall", 8)) {
        alltoall_fault(world, name);
    } else {
        fprintf(stderr, "unknown fault scenario '%s'\n", name);
        return 2;
    }
    return 0;
}

/* ---- collectives against a serial reference ------------------------------------- */
static uint32_t mix(uint32_t a, uint32_t b) {
    uint32_t h = a * 0x9e3779b1u ^ (b + 0x7f4a7c15u) * 0x85ebca77u;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return h;
}

/* Multiples of 2^-10 in [-1, 1]: sums over a few ranks are exact in fp32, so every fp32
 * result must match the reference exactly (tolerance 0), whatever the order. */
static float input(int rank, size_t i) {
    return (float)((int)(mix((uint32_t)rank, (uint32_t)i) % 2001u) - 1000) / 1024.0f;
}

static double diff(double a, double b) {
    double d = fabs(a - b);
    return d <= 1e30 ? d : INFINITY;   /* NaN counts as a failure */
}

static float widen(const void *p, size_t i, comm_dtype dt) {
    float f;
    comm_convert(&f, COMM_F32, (const char *)p + i * comm_dtype_size(dt), dt, 1);
    return f;
}
static float round_to(float x, comm_dtype dt) {
    unsigned char narrow[4];
    comm_convert(narrow, dt, &x, COMM_F32, 1);
    return widen(narrow, 0, dt);
}
/* Inputs in each wire type: representable values, scaled so fp8 sums stay < 448. */
static float input_in(comm_dtype dt, int rank, size_t i) {
    return round_to(input(rank, i) * (dt == COMM_F8E4M3 ? 4.0f : 1.0f), dt);
}

/* Recursive doubling's order: ranks 2i and 2i+1 (i < E = n - P) add first, then the
 * P partial sums pair up 1, 2, 4, ... apart, each pair rounding once. */
static float doubling_sum(const float *v, comm_dtype dt, int n) {
    float partial[64];
    int p = 1;
    while (2 * p <= n) p *= 2;
    int extra = n - p;
    for (int q = 0; q < p; q++)
        partial[q] = q < extra ? round_to(v[2 * q] + v[2 * q + 1], dt) : v[q + extra];
    for (int distance = 1; distance < p; distance *= 2)
        for (int q = 0; q < p; q++)
            if (!(q & distance)) partial[q] = round_to(partial[q] + partial[q + distance], dt);
    return partial[0];
}

/* The sum of v[0..n) as the threads backend rounds it, once per hop. order 0 (ring):
 * in its slab, the chunk holding element i starts at rank chunk+1 and goes round to
 * rank chunk; order 1 (naive): rank 0 adds rank 1, then 2, ...; order 2: recursive
 * doubling. */
static float ordered_sum(const float *v, comm_dtype dt, int n, size_t count, size_t i,
                         int order) {
    if (order == 2) return doubling_sum(v, dt, n);
    int start = 0;
    if (order == 0) {
        size_t slab = (size_t)n * COMM_SLICE_ELEMENTS, first = i / slab * slab;
        count = count - first < slab ? count - first : slab;
        i -= first;
        size_t base = count / (size_t)n, extra = count % (size_t)n, chunk;
        chunk = i < extra * (base + 1) ? i / (base + 1) : extra + (i - extra * (base + 1)) / base;
        start = (int)((chunk + 1) % (size_t)n);
    }
    float acc = v[start];
    for (int k = 1; k < n; k++) acc = round_to(acc + v[(start + k) % n], dt);
    return acc;
}

enum { MAX_CHECKS = 40 };
typedef struct {
    comm *c;
    int n, failures, count_checks;
    const char *names[MAX_CHECKS];
    float diffs[MAX_CHECKS], tolerances[MAX_CHECKS];
} checker;

static void check(checker *k, const char *name, double d, double tolerance) {
    if (k->count_checks == MAX_CHECKS) return;
    k->names[k->count_checks] = name;
    k->diffs[k->count_checks] = (float)d;
    k->tolerances[k->count_checks++] = (float)tolerance;
    if (!(d <= tolerance)) {
        k->failures++;
        fprintf(stderr, "rank %d of '%s' (%d ranks): %s: max |diff| %g > tolerance %g\n",
                comm_rank(k->c), comm_name(k->c), k->n, name, d, tolerance);
    }
}

static double compare(const float *got, const float *want, size_t count) {
    double worst = 0;
    for (size_t i = 0; i < count; i++) worst = fmax(worst, diff(got[i], want[i]));
    return worst;
}

/* order: 0 ring, 1 naive (the threads backend: 16-bit sums must round exactly as the
 * reference does), -1 unknown order (MPI: within the rounding bound). Rank 0 prints
 * the largest difference of each check over all ranks. Returns the failures here. */
int comm_check_collectives(comm *c, size_t count, int order, const char *label) {
    int n = comm_size(c), r = comm_rank(c);
    checker k = {.c = c, .n = n};
    size_t bytes = count * sizeof(float) + 64, off, len = comm_shard(count, n, r, &off);
    float *x = mem_alloc(MEM_OTHER, bytes), *buf = mem_alloc(MEM_OTHER, bytes);
    float *sum = mem_alloc(MEM_OTHER, bytes), *avg = mem_alloc(MEM_OTHER, bytes);
    float *max = mem_alloc(MEM_OTHER, bytes), *shard = mem_alloc(MEM_OTHER, bytes);
    for (size_t i = 0; i < count; i++) {
        float s = 0, m = -INFINITY;
        for (int q = 0; q < n; q++) {
            s += input(q, i);
            m = fmaxf(m, input(q, i));
        }
        x[i] = input(r, i);
        sum[i] = s;
        avg[i] = s / (float)n;
        max[i] = m;
    }
    static const char *ar_names[] = {"allreduce sum", "allreduce avg", "allreduce max"};
    static const char *rs_names[] = {"reduce_scatter sum", "reduce_scatter avg",
                                     "reduce_scatter max"};
    const float *refs[] = {sum, avg, max};
    for (int op = COMM_SUM; op <= COMM_MAX; op++) {
        memcpy(buf, x, count * sizeof *x);
        comm_allreduce(c, buf, count, COMM_F32, (comm_op)op);
        check(&k, ar_names[op], compare(buf, refs[op], count), 0);
        comm_reduce_scatter(c, x, shard, count, COMM_F32, (comm_op)op);
        check(&k, rs_names[op], compare(shard, refs[op] + off, len), 0);
    }
    memcpy(buf, x, count * sizeof *x);
    comm_reduce_scatter(c, buf, buf + off, count, COMM_F32, COMM_SUM);
    check(&k, "reduce_scatter in place", compare(buf + off, sum + off, len), 0);

    for (size_t i = 0; i < count; i++) buf[i] = -77.0f;
    comm_allgather(c, x + off, buf, count, COMM_F32);
    double worst = 0, worst_in_place = 0;
    for (int q = 0; q < n; q++) {
        size_t qoff, qlen = comm_shard(count, n, q, &qoff);
        for (size_t i = qoff; i < qoff + qlen; i++) worst = fmax(worst, diff(buf[i], input(q, i)));
    }
    for (size_t i = 0; i < count; i++) buf[i] = (i >= off && i < off + len) ? x[i] : -77.0f;
    comm_allgather(c, buf + off, buf, count, COMM_F32);
    for (int q = 0; q < n; q++) {
        size_t qoff, qlen = comm_shard(count, n, q, &qoff);
        for (size_t i = qoff; i < qoff + qlen; i++)
            worst_in_place = fmax(worst_in_place, diff(buf[i], input(q, i)));
    }
    check(&k, "allgather", worst, 0);
    check(&k, "allgather in place", worst_in_place, 0);

    static const char *bc_names[] = {"broadcast root 0", "broadcast root N-1"};
    for (int b = 0; b < 2; b++) {
        int root = b ? n - 1 : 0;
        memcpy(buf, x, count * sizeof *x);
        comm_broadcast(c, buf, count, COMM_F32, root);
        worst = 0;
        for (size_t i = 0; i < count; i++) worst = fmax(worst, diff(buf[i], input(root, i)));
        check(&k, bc_names[b], worst, 0);
    }

    static const char *red_names[] = {"reduce sum root N-1", "reduce avg root 0",
                                      "reduce max root N/2"};
    const int roots[] = {n - 1, 0, n / 2};
    double unchanged = 0;
    for (int op = COMM_SUM; op <= COMM_MAX; op++) {
        memcpy(buf, x, count * sizeof *x);
        comm_reduce(c, buf, count, COMM_F32, (comm_op)op, roots[op]);
        /* every rank records every check: the final all-reduce has one count */
        check(&k, red_names[op], r == roots[op] ? compare(buf, refs[op], count) : 0, 0);
        if (r != roots[op]) unchanged = fmax(unchanged, compare(buf, x, count));
    }
    check(&k, "reduce: non-roots unchanged", unchanged, 0);
    comm_barrier(c);

    /* 16- and 8-bit all-reduce (sum). Bound for any order: each of the n-1 roundings
     * errs by at most half an ulp of a partial sum <= sum |x| (plus half the smallest
     * subnormal for fp8). The rounding reference is costly: each rank checks its own
     * shard of the result (the fp32 checks above cover every element on every rank). */
    static const comm_dtype dts[] = {COMM_BF16, COMM_F16, COMM_F8E4M3};
    static const char *same_names[] = {"bf16 allreduce vs same-order rounding",
                                       "f16 allreduce vs same-order rounding",
                                       "f8e4m3 allreduce vs same-order rounding"};
    static const char *bound_names[] = {"bf16 allreduce vs exact sum (relative to bound)",
                                        "f16 allreduce vs exact sum (relative to bound)",
                                        "f8e4m3 allreduce vs exact sum (relative to bound)"};
    static const double half_ulp[] = {0x1p-8, 0x1p-11, 0x1p-4};
    for (int t = 0; t < 3; t++) {
        comm_dtype dt = dts[t];
        void *wire = buf;
        for (size_t i = 0; i < count; i++) {
            float v = input_in(dt, r, i);
            comm_convert((char *)wire + i * comm_dtype_size(dt), dt, &v, COMM_F32, 1);
        }
        comm_allreduce(c, wire, count, dt, COMM_SUM);
        double worst_same = 0, worst_ratio = 0;
        float v[64];
        for (size_t i = off; i < off + len && n <= 64; i++) {
            double got = widen(wire, i, dt), exact = 0, magnitude = 0;
            for (int q = 0; q < n; q++) {
                v[q] = input_in(dt, q, i);
                exact += v[q];
                magnitude += fabs(v[q]);
            }
            if (order >= 0)
                worst_same = fmax(worst_same, diff(got, ordered_sum(v, dt, n, count, i, order)));
            double bound = (n - 1) * (half_ulp[t] * magnitude + (t == 2 ? 0x1p-10 : 0)) + 1e-30;
            worst_ratio = fmax(worst_ratio, diff(got, exact) / bound);
        }
        if (order >= 0) check(&k, same_names[t], worst_same, 0);
        check(&k, bound_names[t], worst_ratio, 1.0);
    }

    /* Largest difference of each check over all ranks (one small all-reduce). */
    float worst_all[MAX_CHECKS];
    memcpy(worst_all, k.diffs, sizeof worst_all);
    comm_allreduce(c, worst_all, (size_t)k.count_checks, COMM_F32, COMM_MAX);
    if (r == 0) {
        printf("%s: %d ranks, count %zu: largest |diff| per check (tolerance):\n", label, n,
               count);
        for (int i = 0; i < k.count_checks; i++)
            printf("    %-50s %-10g (%g)\n", k.names[i], worst_all[i], k.tolerances[i]);
        fflush(stdout);
    }
    mem_free(x);
    mem_free(buf);
    mem_free(sum);
    mem_free(avg);
    mem_free(max);
    mem_free(shard);
    return k.failures;
}

/* ---- groups: split both ways (a 2x2 mesh on 4 ranks), used concurrently ----------- */
int comm_test_split_main(comm *world, void *arg) {
    (void)arg;
    int r = comm_rank(world), n = comm_size(world), failures = 0;
    comm *tp = comm_split(world, r / 2, r % 2, "tp");      /* 4 ranks: {0,1} {2,3} */
    comm *dp = comm_split(world, r % 2, r / 2, "dp");      /*          {0,2} {1,3} */
    comm *rev = comm_split(world, 0, -r, "reversed");      /*          3,2,1,0 */
    comm *none = comm_split(world, r == 0 ? -1 : 1, 0, "without 0");
    int tp_size = 0, dp_size = 0;
    float want_tp = 0, want_dp = 0;
    for (int q = 0; q < n; q++) {
        if (q / 2 == r / 2) tp_size++, want_tp += (float)(q + 1);
        if (q % 2 == r % 2) dp_size++, want_dp += (float)(q + 1);
    }
    if (comm_size(tp) != tp_size || comm_rank(tp) != r % 2 || strcmp(comm_name(tp), "tp"))
        failures++;
    if (comm_size(dp) != dp_size || comm_rank(dp) != r / 2 || comm_world_rank(dp) != r)
        failures++;
    if (comm_rank(rev) != n - 1 - r || comm_size(rev) != n) failures++;
    if ((r == 0) != (none == NULL) || (none && comm_size(none) != n - 1)) failures++;

    /* both directions at once: an async all-reduce in tp while dp all-reduces */
    float a[1000], b[1000];
    for (int i = 0; i < 1000; i++) a[i] = b[i] = (float)(r + 1);
    comm_request *req = comm_allreduce_start(tp, a, 1000, COMM_F32, COMM_SUM);
    comm_allreduce(dp, b, 1000, COMM_F32, COMM_SUM);
    comm_wait(req);
    for (int i = 0; i < 1000; i++)
        if (a[i] != want_tp || b[i] != want_dp) failures++;
    if (none) {
        float x = 1;
        comm_allreduce(none, &x, 1, COMM_F32, COMM_SUM);
        if (x != (float)(n - 1)) failures++;
    }
    /* the whole reference check inside each group, both groups of a split at once */
    int order = strcmp(comm_backend_name(world), "threads") ? -1 : 0;
    failures += comm_check_collectives(tp, 1001, order, "group tp (mesh rows)");
    failures += comm_check_collectives(dp, 7, order, "group dp (mesh columns)");
    failures += comm_check_collectives(rev, 1003, order, "group reversed");
    comm_free(none);
    comm_free(rev);
    comm_free(dp);
    comm_free(tp);
    if (failures) fprintf(stderr, "rank %d: %d split failures\n", r, failures);
    return failures ? 1 : 0;
}


/* ---- async: compute overlaps communication; requests run in order ----------------- */
int comm_test_async_main(comm *world, void *arg) {
    (void)arg;
    int n = comm_size(world), r = comm_rank(world), failures = 0;
    size_t count = 1 << 20, off, len = comm_shard(count, n, r, &off);
    float *a = mem_alloc(MEM_GRADS, count * 4), *shard = mem_alloc(MEM_GRADS, count * 4);
    float *full = mem_alloc(MEM_GRADS, count * 4), *b = mem_alloc(MEM_GRADS, count * 4);
    for (size_t i = 0; i < count; i++) a[i] = b[i] = (float)(r + 1) * (float)(i % 5);
    comm_stats_reset(world);
    const double t_start = comm_now();
    comm_request *req = comm_allreduce_start(world, a, count, COMM_F32, COMM_SUM);
    const double t_started = comm_now();
    volatile double work = 0;
    while (comm_now() - t_started < 0.05) work += 1;   /* 50 ms of "backward pass" */
    const double t_wait = comm_now();
    comm_wait(req);
    const double t_end = comm_now();
    float total = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < count; i++)
        if (a[i] != total * (float)(i % 5)) failures++;
    comm_stats s = comm_stats_get(world);
    const double in_flight = s.async_seconds, hidden = s.hidden_seconds;
    const double blocked = s.seconds[COMM_KIND_ALLREDUCE];
    if (r == 0)
        printf("async all-reduce of 4 MiB behind 50 ms of compute, %d ranks: in flight %.2f ms, "
               "hidden %.2f ms, blocked in wait %.3f ms\n", n, 1e3 * in_flight, 1e3 * hidden,
               1e3 * blocked);
    /* The accounting, bracketed by this rank's own clock readings: in flight is [start,
     * done], hidden the part of it before the wait began, blocked the wait. Either the
     * all-reduce was done before the wait (hidden is all of the flight, which fits
     * between start and the end of the wait) or it was still running (hidden runs from
     * the start to the wait, so covers the 50 ms of compute, and is less than the
     * flight). What was not hidden was waited for. */
    const int done_before_wait = hidden == in_flight;
    const int hidden_ok = done_before_wait
        ? in_flight > 0 && in_flight <= t_end - t_start
        : hidden >= t_wait - t_started && hidden <= t_end - t_start && hidden < in_flight;
    const int blocked_ok = blocked >= 0 && blocked <= t_end - t_wait &&
                           in_flight - hidden <= blocked + 1e-9;
    if (!hidden_ok || !blocked_ok || s.calls[COMM_KIND_ALLREDUCE] != 1) {
        fprintf(stderr, "rank %d: async accounting: in flight %.6f s, hidden %.6f s, blocked "
                "%.6f s; the wait began %.6f s after the start and ended %.6f s after it\n", r,
                in_flight, hidden, blocked, t_wait - t_start, t_end - t_start);
        failures++;
    }

    /* three requests and a blocking call behind them, waited for out of order. On the
     * threads backend (as on NCCL) requests also run in order, so the all-gather may read
     * what the reduce-scatter writes before anyone waited; MPI needs its own input. */
    int in_order = !strcmp(comm_backend_name(world), "threads");
    float *gather_in = in_order ? shard : full + off;
    if (!in_order)
        for (size_t i = 0; i < len; i++) gather_in[i] = (float)n * total * (float)((off + i) % 5);
    comm_request *r1 = comm_reduce_scatter_start(world, a, shard, count, COMM_F32, COMM_SUM);
    comm_request *r2 = comm_allgather_start(world, gather_in, full, count, COMM_F32);
    comm_request *r3 = comm_allreduce_start(world, b, count, COMM_F32, COMM_AVG);
    float one = 1;
    comm_allreduce(world, &one, 1, COMM_F32, COMM_SUM);
    comm_wait(r3);
    comm_wait(r1);
    comm_wait(r2);
    for (size_t i = 0; i < count; i++) {
        float sum = (float)n * total * (float)(i % 5);
        if (full[i] != sum || b[i] != total * (float)(i % 5) / (float)n) failures++;
        if (i >= off && i < off + len && shard[i - off] != sum) failures++;
    }
    if (one != (float)n) failures++;
    mem_free(a);
    mem_free(b);
    mem_free(shard);
    mem_free(full);
    return failures ? 1 : 0;
}


/* ---- send/recv: per-tag order, sizes, to self -------------------------------------- */
int comm_test_p2p_main(comm *world, void *arg) {
    (void)arg;
    int n = comm_size(world), r = comm_rank(world), failures = 0;
    int right = (r + 1) % n, left = (r + n - 1) % n;
    for (int k = 0; k < 4; k++) {   /* interleaved tags, all sent before any receive */
        float one = (float)(100 * r + k), two = (float)(1000 + 100 * r + k);
        comm_send(world, &one, 1, COMM_F32, right, 1);
        comm_send(world, &two, 1, COMM_F32, right, 2);
    }
    for (int k = 0; k < 4; k++) {   /* tag 2 first: each tag in its own order */
        float got;
        comm_recv(world, &got, 1, COMM_F32, left, 2);
        if (got != (float)(1000 + 100 * left + k)) failures++;
    }
    for (int k = 0; k < 4; k++) {
        float got;
        comm_recv(world, &got, 1, COMM_F32, left, 1);
        if (got != (float)(100 * left + k)) failures++;
    }
    size_t count = 1000003;
    float *big = mem_alloc(MEM_ACTIVATIONS, count * 4), *in = mem_alloc(MEM_ACTIVATIONS, count * 4);
    for (size_t i = 0; i < count; i++) big[i] = (float)r + (float)i;
    comm_send(world, big, count, COMM_F32, right, 3);
    comm_send(world, NULL, 0, COMM_F32, right, 4);
    comm_send(world, big, 10, COMM_F32, r, 5);   /* to itself */
    comm_recv(world, in, count, COMM_F32, left, 3);
    for (size_t i = 0; i < count; i++)
        if (in[i] != (float)left + (float)i) failures++;
    comm_recv(world, NULL, 0, COMM_F32, left, 4);
    comm_recv(world, in, 10, COMM_F32, r, 5);
    for (int i = 0; i < 10; i++)
        if (in[i] != big[i]) failures++;
    comm_stats s = comm_stats_get(world);
    uint64_t bytes = 8 * 4 + count * 4 + 40;
    if (s.bytes_sent[COMM_KIND_SENDRECV] != bytes || s.bytes_received[COMM_KIND_SENDRECV] != bytes ||
        s.calls[COMM_KIND_SENDRECV] != 2 * 11)
        failures++;
    mem_free(big);
    mem_free(in);
    return failures ? 1 : 0;
}


