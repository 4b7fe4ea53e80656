/* Comparing a strategy with the single-device baseline, and collecting one table row
 * from all ranks. Used by every chapter. */
#ifndef COMPARE_H
#define COMPARE_H

#include "comm.h"
#include "report.h"
#include "train.h"

/* Fills r's diff_* fields from whole-model host vectors (any may be NULL: "-"). */
void compare_to_baseline(run_result *r, const baseline_run *b, const float *loss,
                         const float *first_grads, const float *final_params);

/* The largest of r's differences against its tolerance (1 = at the limit; a NaN is
 * infinitely far); a tolerance <= 0 leaves that difference unchecked. */
double run_worst_fraction_of_tolerance(const run_result *r, double tol_grads,
                                       double tol_loss, double tol_params);

/* Per-rank measurements -> the row of the table: the largest rank's time,
 * communication, bytes sent and memory (each maximum taken over ranks on its own), and
 * the least time any rank was blocked (comm_seconds_least).
 * Collective over `group`; every rank gets the result. */
void run_result_take_max(comm *group, run_result *r);

/* Fills r's comm_seconds, hidden_seconds and bytes_sent_per_step from this rank's
 * communicator statistics over `steps` steps (call comm_stats_reset before them). */
void run_result_add_comm(run_result *r, comm *world, int steps);

/* True in the process that runs world rank 0 (always, for the threads backend): the
 * baseline is trained there before launch(). */
int process_hosts_rank0(void);

#endif
