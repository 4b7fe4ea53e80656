/* Training one ZeRO stage on every rank for cfg->steps steps, and collecting what the
 * chapter's tables show: the comparison row, the model-state bytes held between steps,
 * and the collectives per kind. Used by main.c and the tests. */
#ifndef STAGE_RUN_H
#define STAGE_RUN_H

#include "compare.h"
#include "estimate.h"
#include "baseline.h"
#include "replica.h"
#include "zero.h"

/* Agreement with the single-device baseline that every stage must reach (the same as
 * chapter 1's DDP): float sums in another order (ranks' partial gradients, then a
 * reduction) differ by a few ulps. Gradients are compared after step 1; loss and
 * parameters only when the run has at most ZERO_TOL_STEPS steps, because AdamW divides
 * by sqrt(v): where a gradient is close to 0 a rounding difference changes the update
 * by a good part of the learning rate, and over many steps that grows towards lr. */
#define ZERO_TOL_LOSS 1e-5
#define ZERO_TOL_GRADS 1e-6
#define ZERO_TOL_PARAMS 1e-4
#define ZERO_TOL_STEPS 5

typedef struct {
    zero_options opts;
    int world_size;
    run_result result;     /* the comparison row; time, comm and peaks of the largest rank */
    float *loss;           /* per step, global-batch mean */
    double *step_seconds;  /* per step, on world rank 0 */
    /* bytes held between steps, largest rank: what the formulas describe */
    double state[3];       /* params, grads, optimizer */
    size_t shard_len_largest;
    /* per timed step, largest rank */
    double comm_calls[COMM_NKINDS], comm_bytes[COMM_NKINDS], comm_seconds[COMM_NKINDS];
    double async_seconds, hidden_seconds;
    /* whole model on the host, world rank 0 only: step 1's reduced gradient before the
     * update, and the parameters after the last step */
    float *first_grads, *final_params;
} stage_outcome;

/* Collective over world. Frees everything it allocated on the rank's accounting
 * before it returns, so stages run one after the other measure only themselves. */
void stage_train(comm *world, const run_config *cfg, const dataset *data,
                 const zero_options *opts, stage_outcome *out);
void stage_outcome_free(stage_outcome *o);

/* launch() + stage_train on cfg->comm's ranks; returns world rank 0's outcome in this
 * process (zeroed in other MPI processes) and launch's status. For the tests. */
int stage_run_launch(const run_config *cfg, const dataset *data, const zero_options *opts,
                     stage_outcome *rank0_out);

/* "zero0" .. "zero3", the strategy names of the JSON output. */
const char *stage_strategy_name(int stage);
/* The largest of the checked differences against its tolerance (1 = at the limit):
 * the gradients always, loss and parameters in runs of at most ZERO_TOL_STEPS steps
 * or when all_three is set. */
double stage_worst_fraction_of_tolerance(const run_result *r, int all_three);

#endif
