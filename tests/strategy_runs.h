/* One strategy run for the suites: the outcome and its extra together on the heap (the
 * outcome points at its extra), launched on cfg->comm's ranks (the launch must succeed)
 * and compared with the baseline b when given (world rank 0's process). */
#ifndef STRATEGY_RUNS_H
#define STRATEGY_RUNS_H

#include "ddp.h"
#include "mesh_train.h"
#include "pp_train.h"
#include "zero_train.h"

/* A ZeRO stage: the outcome with its zero_extra (zero_extra_of), on the heap, given
 * back by zero_outcome_free. Under MPI, world rank 0's in its process; in the others
 * the buffers are there but unwritten. */
strategy_outcome launch_zero(const run_config *cfg, const dataset *d, zero_options opts);
void zero_outcome_free(strategy_outcome *o);

typedef struct {
    strategy_outcome run;
    ddp_extra x;
} ddp_result;
ddp_result *launch_ddp(const run_config *cfg, const dataset *d, ddp_options opts,
                       const baseline_run *b);
void ddp_result_free(ddp_result *o);   /* NULL is fine */

typedef struct {
    strategy_outcome run;
    pp_extra x;
} pp_result;
/* stages 0: one pipeline of every rank */
pp_result *launch_pp(const run_config *cfg, const dataset *d, int stages,
                     pipeline_options opts, const baseline_run *b);
void pp_result_free(pp_result *o);

typedef struct {
    strategy_outcome run;
    mesh_extra x;
} mesh_result;
mesh_result *launch_mesh(const run_config *cfg, const dataset *d, mesh_shape shape,
                         pipeline_options opts, const baseline_run *b);
void mesh_result_free(mesh_result *o);
/* Every rank's bytes per group kind within bytes_error of their formulas (relative),
 * its model state per tag equal to its formula, the tied copies equal. */
void check_mesh_formulas(const mesh_result *o, mesh_shape shape, double bytes_error);

#endif
