#include "check_run.h"

#include <stdio.h>

#include "comm.h"
#include "compare.h"

int check_run(Suite *suite, int under_mpi) {
    SRunner *runner = srunner_create(suite);
    if (under_mpi) srunner_set_fork_status(runner, CK_NOFORK);
    srunner_run_all(runner, !under_mpi || process_hosts_rank0() ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}

void check_add_test_where(TCase *tc, const TTest *test, int runs_here, const char *why) {
    if (runs_here) {
        tcase_add_test(tc, test);
    } else if (process_hosts_rank0()) {
        printf("SKIP: %s: %s\n", test->name, why);
        fflush(stdout);
    }
}

void check_note(check_verdict *v, int ok, const char *condition, const char *file, int line) {
    if (ok) return;
    if (v->failures++ == 0)
        snprintf(v->first, sizeof v->first, "%s:%d: %s", file, line, condition);
    fprintf(stderr, "%s:%d: failed: %s\n", file, line, condition);
}

/* The largest failure count of any process, on every process. */
static int share_failures(comm *world, void *arg) {
    float failures = (float)*(int *)arg;
    comm_allreduce(world, &failures, 1, COMM_F32, COMM_MAX);
    *(int *)arg = (int)failures;
    return 0;
}

void check_agree(const check_verdict *v) {
    int failures = v->failures;
    comm_options o = comm_options_default();
    ck_assert_int_eq(launch(&o, share_failures, &failures), 0);
    ck_assert_msg(failures == 0, "%s", v->failures ? v->first : "failed on another process");
}

int check_world_size(void) {
    int n = launch_mpi_world_size();
    return n > 0 ? n : 1;
}
