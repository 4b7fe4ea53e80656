/* Runs a Check suite the way every test program here does, and the two things a suite
 * needs beyond Check: tests that only mean something at some world sizes, and MPI
 * tests whose processes leave each test together. */
#ifndef CHECK_RUN_H
#define CHECK_RUN_H
#include <check.h>

/* Runs every test of suite and returns the exit status (0: all passed). Under MPI
 * (under_mpi = 1) tests run without fork(), which MPI does not survive, and only world
 * rank 0's process prints Check's report. */
int check_run(Suite *suite, int under_mpi);

/* The ranks of this MPI job (mpirun's -np), or 1 when not under mpirun. */
int check_world_size(void);

/* Adds test to tc where it means something (runs_here); elsewhere prints one line
 * "SKIP: <test>: <why>" (from world rank 0's process only), which tools/run-tests
 * counts as skipped rather than passed. */
void check_add_test_where(TCase *tc, const TTest *test, int runs_here, const char *why);

/* ---- MPI: every process leaves a test together --------------------------------------
 * Under mpirun only world rank 0's process holds the baseline, so it alone judges a
 * result. If it left a test at a failed ck_assert, the others would go on into the
 * test's next launch() and wait there for ever. So an MPI test judges with
 * check_expect(), which records (and prints) a failure and carries on, and ends with
 * check_agree(), which every process calls: the verdict is shared, and the test fails
 * on every process at the same point, with rank 0's first failure as its message. */
typedef struct {
    int failures;
    char first[256];   /* the first failed condition, "file:line: text" */
} check_verdict;

#define check_expect(verdict, condition) \
    check_note((verdict), (condition) ? 1 : 0, #condition, __FILE__, __LINE__)
void check_note(check_verdict *v, int ok, const char *condition, const char *file, int line);
/* Collective over every process of the job (a small launch of its own). */
void check_agree(const check_verdict *v);

#endif
