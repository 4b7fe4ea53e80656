/* The communicator over Open MPI: the same checks as test_comm.c (tests/comm_faults.c
 * holds the shared programs), world size from mpirun. Build with MPI=1, run as
 *   CK_FORK=no mpirun --allow-run-as-root --oversubscribe -np N test_mpi_comm
 * Fault scenarios (each must end the job with a message naming the ranks):
 *   mpirun --allow-run-as-root --oversubscribe -np N test_mpi_comm SCENARIO [timeout] */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "compare.h"
#include "check_run.h"

/* tests/comm_faults.c */
int comm_fault_main(comm *world, void *scenario);
int comm_check_collectives(comm *c, size_t count, int order, const char *label);
int comm_test_split_main(comm *world, void *arg);
int comm_test_async_main(comm *world, void *arg);
int comm_test_p2p_main(comm *world, void *arg);
extern const char *const comm_fault_scenarios[];

static comm_options options(void) {
    comm_options o = comm_options_default();
    o.timeout_seconds = 60;
    return o;
}

static int collectives_main(comm *world, void *arg) {
    size_t count = *(size_t *)arg;
    if (strcmp(comm_backend_name(world), "mpi")) return 1;
    return comm_check_collectives(world, count, -1, "mpi") ? 1 : 0;
}

START_TEST(test_collectives) {
    static const size_t counts[] = {0, 1, 7, 1000003};
    comm_options o = options();
    ck_assert_int_eq(launch(&o, collectives_main, (void *)&counts[_i]), 0);
}
END_TEST

START_TEST(test_split) {
    comm_options o = options();
    ck_assert_int_eq(launch(&o, comm_test_split_main, NULL), 0);
}
END_TEST

START_TEST(test_async) {
    comm_options o = options();
    ck_assert_int_eq(launch(&o, comm_test_async_main, NULL), 0);
}
END_TEST

START_TEST(test_send_recv) {
    comm_options o = options();
    ck_assert_int_eq(launch(&o, comm_test_p2p_main, NULL), 0);
}
END_TEST

/* MPI counts the textbook volume: ring all-reduce 2(N-1)/N x bytes, and so on. */
static int accounting_main(comm *world, void *arg) {
    (void)arg;
    int n = comm_size(world), r = comm_rank(world), failures = 0;
    size_t count = 1000003;
    uint64_t bytes = count * 4;
    float *x = mem_alloc(MEM_GRADS, bytes), *shard = mem_alloc(MEM_GRADS, bytes);
    comm_stats_reset(world);
    comm_allreduce(world, x, count, COMM_F32, COMM_SUM);
    comm_reduce_scatter(world, x, shard, count, COMM_F32, COMM_SUM);
    comm_allgather(world, shard, x, count, COMM_F32);
    comm_broadcast(world, x, count, COMM_F32, 0);
    comm_stats s = comm_stats_get(world);
    uint64_t ring = 2 * (uint64_t)(n - 1) * bytes / (uint64_t)n, half = (uint64_t)(n - 1) * bytes / (uint64_t)n;
    if (s.bytes_sent[COMM_KIND_ALLREDUCE] != ring || s.bytes_received[COMM_KIND_ALLREDUCE] != ring ||
        s.bytes_sent[COMM_KIND_REDUCE_SCATTER] != half || s.bytes_received[COMM_KIND_ALLGATHER] != half ||
        s.bytes_received[COMM_KIND_BROADCAST] != (r == 0 ? 0 : bytes) ||
        s.calls[COMM_KIND_ALLREDUCE] != 1 || !(s.seconds[COMM_KIND_ALLREDUCE] > 0))
        failures++;
    if (r == 0)
        printf("mpi all-reduce of %llu bytes, %d ranks: rank 0 counted %llu bytes sent "
               "(modelled 2(N-1)/N x bytes)\n", (unsigned long long)bytes, n,
               (unsigned long long)s.bytes_sent[COMM_KIND_ALLREDUCE]);
    comm *pair = comm_split(world, r / 2, r, "pair");
    comm_allreduce(pair, x, 1000, COMM_F32, COMM_SUM);
    comm_stats all = comm_stats_all(world), p = comm_stats_get(pair);
    if (all.calls[COMM_KIND_ALLREDUCE] != 2 ||
        comm_stats_total_sent(&all) != comm_stats_total_sent(&s) + comm_stats_total_sent(&p))
        failures++;
    comm_stats_reset(world);
    all = comm_stats_all(world);
    if (comm_stats_total_sent(&all) != 0) failures++;
    if (!comm_bytes_are_modelled(world) || strcmp(comm_backend_name(world), "mpi")) failures++;
    if (comm_mem_stats(world) != mem_stats_current()) failures++;
    comm_free(pair);
    mem_free(x);
    mem_free(shard);
    return failures ? 1 : 0;
}

START_TEST(test_accounting) {
    comm_options o = options();
    ck_assert_int_eq(launch(&o, accounting_main, NULL), 0);
}
END_TEST

static int trace_main(comm *world, void *arg) {
    (void)arg;
    float x[1024] = {0};
    trace_begin(world, "forward");
    comm_allreduce(world, x, 1024, COMM_F32, COMM_SUM);
    comm_wait(comm_allreduce_start(world, x, 1024, COMM_F32, COMM_SUM));
    trace_end(world);
    return 0;
}

START_TEST(test_trace) {
    static char path[128];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/test_mpi_comm_trace_%s.json", dir ? dir : "/tmp",
             getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : "1");
    comm_options o = options();
    o.trace_path = path;
    ck_assert_int_eq(launch(&o, trace_main, NULL), 0);
    check_verdict v = {0};
    FILE *f = process_hosts_rank0() ? fopen(path, "r") : NULL;   /* rank 0 wrote it */
    if (process_hosts_rank0()) check_expect(&v, f != NULL);
    if (f) {
        static char text[1 << 16];
        size_t len = fread(text, 1, sizeof text - 1, f);
        text[len] = 0;
        fclose(f);
        unlink(path);
        check_expect(&v, strncmp(text, "{\"traceEvents\":[", 16) == 0);
        check_expect(&v, strstr(text, "\"name\":\"forward\""));
        check_expect(&v, strstr(text, "\"name\":\"allreduce\",\"cat\":\"comm\""));
        int n = launch_mpi_world_size();
        char tid[32];
        snprintf(tid, sizeof tid, "\"tid\":%d,", n > 0 ? n - 1 : 0);   /* every rank is there */
        check_expect(&v, strstr(text, tid));
    }
    check_agree(&v);
}
END_TEST

/* ---- COMM_F64 over MPI_DOUBLE (tests/comm_f64.c) ------------------------------------ */
int comm_check_f64(comm *c, size_t count, const char *label);
double comm_f64_sum_through(comm *c, size_t count, comm_dtype wire);

static int f64_main(comm *world, void *arg) {
    return comm_check_f64(world, *(size_t *)arg, "mpi") ? 1 : 0;
}

START_TEST(test_f64) {
    static const size_t counts[] = {0, 7, 1000003};
    comm_options o = options();
    ck_assert_int_eq(launch(&o, f64_main, (void *)&counts[_i]), 0);
}
END_TEST

/* Negative control: the same doubles sent as fp32 lose their low bits. */
static int f64_through_main(comm *world, void *arg) {
    double *diffs = arg;
    diffs[0] = comm_f64_sum_through(world, 1000, COMM_F64);
    diffs[1] = comm_f64_sum_through(world, 1000, COMM_F32);
    return 0;
}

START_TEST(test_f64_negative) {
    double diffs[2] = {-1, -1};
    comm_options o = options();
    ck_assert_int_eq(launch(&o, f64_through_main, diffs), 0);
    if (process_hosts_rank0())
        printf("f64 all-reduce sum: largest |diff| %g as f64, %g as fp32 (negative "
               "control: must be > 0)\n", diffs[0], diffs[1]);
    check_verdict v = {0};
    check_expect(&v, diffs[0] == 0);
    check_expect(&v, diffs[1] > 0);
    check_agree(&v);
}
END_TEST

/* ---- all-to-all against a serial reference (tests/comm_alltoall.c) ------------------ */
int comm_check_alltoall(comm *c, int rotated_reference, const char *label);

/* arg: where the check's failures go (every process gets the same count); the rank
 * returns 0 so that the negative control's failures do not end the job. */
static int alltoall_main(comm *world, void *arg) {
    int *result = arg;   /* in: 1 for the negative control; out: the failures */
    *result = comm_check_alltoall(world, *result,
                                  *result ? "mpi negative control (blocks one rank too far)"
                                          : "mpi");
    return 0;
}

START_TEST(test_alltoall) {
    int failures = 0;
    comm_options o = options();
    ck_assert_int_eq(launch(&o, alltoall_main, &failures), 0);
    check_verdict v = {0};
    check_expect(&v, failures == 0);
    check_agree(&v);
}
END_TEST

START_TEST(test_alltoall_negative) {
    int failures = 1;
    comm_options o = options();
    ck_assert_int_eq(launch(&o, alltoall_main, &failures), 0);
    if (process_hosts_rank0())
        printf("negative control: all-to-all against a reference one rank off -> %d "
               "failed checks (must be > 0 from 2 ranks on)\n", failures);
    check_verdict v = {0};
    check_expect(&v, check_world_size() < 2 || failures > 0);
    check_agree(&v);
}
END_TEST

int main(int argc, char **argv) {
    if (argc > 1) {   /* a fault scenario, see tests/comm_faults.c */
        comm_options o = options();
        o.timeout_seconds = argc > 2 ? atof(argv[2]) : 2.0;
        return launch(&o, comm_fault_main, argv[1]);
    }
    Suite *s = suite_create("mpi_comm");
    TCase *tc = tcase_create("mpi");
    tcase_add_loop_test(tc, test_collectives, 0, 4);   /* counts 0, 1, 7, 1000003 */
    tcase_add_test(tc, test_split);
    tcase_add_test(tc, test_async);
    tcase_add_test(tc, test_send_recv);
    tcase_add_test(tc, test_accounting);
    tcase_add_test(tc, test_trace);
    tcase_add_loop_test(tc, test_f64, 0, 3);   /* counts 0, 7, 1000003 */
    tcase_add_test(tc, test_f64_negative);
    tcase_add_test(tc, test_alltoall);
    tcase_add_test(tc, test_alltoall_negative);
    suite_add_tcase(s, tc);
    return check_run(s, 1);
}
