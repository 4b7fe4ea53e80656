/* ZeRO as a configuration of the mesh trainer (pipeline.h: one stage of the whole model,
 * dp = every rank, run in ZeRO's way, zero.h): every rank trains its share of each
 * global batch at one ZeRO stage, and the run's outcome (strategy_outcome.h) holds what
 * the tables show: the comparison row, the model-state bytes held between steps, the
 * collectives per kind, and the whole model's first gradients and final parameters on
 * world rank 0. HSDP: the mesh's dp_shard is a node of ranks_per_node ranks. */
#ifndef ZERO_TRAIN_H
#define ZERO_TRAIN_H

#include "data.h"
#include "strategy_outcome.h"
#include "tolerances.h"
#include "zero.h"
#include "zero_formulas.h"

/* The outcome's extra for ZeRO (strategy_outcome.extra). */
typedef struct {
    zero_options opts;
    size_t shard_len_largest;   /* elements of the largest rank's piece */
} zero_extra;
static inline const zero_extra *zero_extra_of(const strategy_outcome *o) { return o->extra; }

/* Collective over world: trains cfg->steps steps of opts->stage and fills out (its
 * buffers on world rank 0, the measurements on every rank; out->extra, when set, is
 * a zero_extra). Frees everything it allocated on the rank's accounting before it
 * returns, so stages run one after the other measure only themselves. */
void zero_train(comm *world, const run_config *cfg, const dataset *data,
                const zero_options *opts, strategy_outcome *out);
/* strategy_launch of zero_train on cfg->comm's ranks. */
int zero_launch(const run_config *cfg, const dataset *data, const zero_options *opts,
                strategy_outcome *rank0_out);

/* "zero0" .. "zero3", the strategy names of the JSON output. */
const char *zero_strategy_name(int stage);
/* The largest of the checked differences against its tolerance (tolerances.h; 1 = at
 * the limit): the gradients always, loss and parameters in runs of at most TOL_STEPS
 * steps or when all_three is set. */
double zero_worst_fraction_of_tolerance(const run_result *r, const run_tolerances *tol,
                                        int all_three);

#endif
