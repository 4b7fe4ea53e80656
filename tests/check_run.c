#include "check_run.h"

#include "compare.h"

int check_run(Suite *suite, int under_mpi) {
    SRunner *runner = srunner_create(suite);
    if (under_mpi) srunner_set_fork_status(runner, CK_NOFORK);
    srunner_run_all(runner, !under_mpi || process_hosts_rank0() ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed ? 1 : 0;
}
