/* Training with one pipeline schedule on every rank, and what the chapter's tables show:
 * the comparison row, the bubble measured against its formula, activations per stage,
 * bytes per stage, and the last step's passes for the pictures. Used by main.c and the
 * tests. */
#ifndef TRAIN_RUN_H
#define TRAIN_RUN_H

#include "compare.h"
#include "pipeline.h"
#include "baseline.h"
#include "replica.h"
#include "tolerances.h"

/* Against the baseline (the other chapters' tolerances): gradients of step 1, loss
 * per step and parameters after a few steps. */
#define PP_TOL_GRADS TOL_GRADS
#define PP_TOL_LOSS TOL_LOSS
#define PP_TOL_PARAMS TOL_PARAMS

typedef struct {
    pipeline_options opts;
    int stages;
    int replicas;               /* pipelines side by side (data parallel): ranks / stages */
    run_result result;          /* compared with the baseline when one was given */
    float *loss;                /* per step */
    pipeline_measures measured;
    pp_bubble formula;          /* the textbook's (streams: a GPU's) */
    pp_bubble cpu_ranks;        /* the simulator's for one operation at a time, as here */
    int *in_flight_formula;     /* [stages] what the schedule holds at most */
    double bytes_formula;       /* per boundary per step: 2 m b s h x 4 B */
    double tied_drift;          /* the tied weight's two copies, at the end */
    pp_span *spans;             /* the last step's passes, every rank (seconds) */
    int nspans;
} pp_outcome;

/* Launches cfg->comm.ranks ranks as pipelines of `stages` stages (0: one pipeline of
 * every rank), the ranks / stages pipelines data parallel (each on batch / d sequences,
 * stage gradients all-reduced), and trains; stages must divide the ranks. The outcome
 * is world rank 0's, its pipeline's measures (zeroed in other MPI processes). Returns
 * launch's status. */
int pp_run_launch(const run_config *cfg, const dataset *data, int stages,
                  const pipeline_options *opts, const baseline_run *baseline, pp_outcome *out);
void pp_outcome_free(pp_outcome *o);

/* The largest checked difference against its tolerance (1 = at the limit). */
double pp_worst_fraction_of_tolerance(const run_result *r);

#endif
