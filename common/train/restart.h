/* Restarts after a failure: the program's half of `./run N ... --save DIR --max-restarts K`.
 *
 * ./run is the loop (a killed rank under Open MPI, or any SIGKILL of a threads job, takes
 * its process with it: only a parent outside it can start the job again). Each attempt
 * is a fresh process (threads) or a fresh mpirun (Open MPI) resuming each strategy from
 * its own newest checkpoint in DIR (resume_source.c):
 *
 *   attempt 0:  the job as given                 ./run adds --restart-attempt 0
 *   fails:      every rank stops (the communicator's failure path, or mpirun)
 *   ./run:      reads DIR/restart-progress, prints what failed, where it resumes and
 *               the steps lost; with --elastic and a rank gone for good, the largest
 *               rank count <= the survivors that the program accepts (RUN_LAYOUT_PROBE)
 *   attempt k:  the job's flags --restart-attempt k --restart-record "what it cost so far"
 *
 * The program's part: world rank 0 keeps DIR/restart-progress up to date (the last
 * step done, when, how long the checkpoint took to load), a test hook fails a rank at
 * a given step, and the run's end reports what the failures cost (restart_print,
 * restart_json_keys). */
#ifndef RESTART_H
#define RESTART_H
#include "comm.h"
#include "run_config.h"

/* --test-fail-how's values: SIGKILL of the rank's process, comm_abort on the rank, or
 * SIGSTOP of its process (a stuck rank: Open MPI's --comm-timeout names it; under
 * threads it would stop every rank, and nothing would be left to notice). */
extern const char *const restart_fail_hows[];

/* From cli_parse, before any rank starts: why the restart flags cannot be taken (one
 * line in why, returned: --max-restarts needs --save and ./run, --elastic needs
 * --max-restarts, --restart-record holds 7 numbers, ...), or NULL. program: the name
 * the refusal of a program that trains nothing names. */
const char *restart_flags_check(const run_config *cfg, const char *program, char *why,
                                size_t why_len);
/* Then, the flags checked: ./run's record of the earlier attempts read, and the test
 * hooks set to fire on their attempts only. */
void restart_take_flags(run_config *cfg);

/* The training loop's calls, on every rank (they do nothing without --save and
 * --max-restarts, and in runs that do not save: the baseline a chapter compares with). */
/* strategy: the loop's (its checkpoints are DIR/latest-STRATEGY's); done: the step it
 * resumes after (0: from the start) */
void restart_loop_start(const run_config *cfg, comm *world, const char *strategy, int done,
                        double load_seconds);
void restart_step_done(const run_config *cfg, comm *world, int step);
void restart_maybe_fail(const run_config *cfg, comm *world, const char *strategy, int step);
void restart_loop_end(const run_config *cfg, comm *world);
/* Whether this run is ./run's attempt 1 or later of a job that saves (a retry). */
int restart_is_retry(const run_config *cfg);
/* Whether this attempt runs on another number of ranks than the job's first (--elastic). */
int restart_world_changed(const run_config *cfg);
/* The step a resume continues after: the checkpoint's, moved by the negative control. */
int restart_resumed_step(const run_config *cfg, int checkpoint_step);

/* What the failures cost, summed over the attempts (0 everywhere before any failure). */
typedef struct {
    int restarts, lost_steps;
    double detect_seconds;    /* from each failure to the end of its job */
    double relaunch_seconds;  /* from a job's end to its restart's first step, less load */
    double load_seconds;      /* reading the checkpoints */
} restart_cost;
restart_cost restart_cost_so_far(void);

/* --json's keys (docs/json.md), each line starting ",\n ": nothing without --max-restarts. */
void restart_json_keys(const run_config *cfg);

#endif
