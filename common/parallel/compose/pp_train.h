/* Pipeline parallelism (pipeline.h) trained as a strategy: one schedule on every rank,
 * the ranks as pipelines of p stages side by side (data parallel), and what chapter 4's
 * tables show in the outcome's extra (strategy_outcome.h): the bubble measured against
 * its formula, activations and bytes per stage, and the last step's passes. */
#ifndef PP_TRAIN_H
#define PP_TRAIN_H

#include "pipeline.h"
#include "strategy_outcome.h"
#include "tolerances.h"

/* Against the baseline (the other chapters' tolerances): gradients of step 1, loss
 * per step and parameters after a few steps. */
#define PP_TOL_GRADS TOL_GRADS
#define PP_TOL_LOSS TOL_LOSS
#define PP_TOL_PARAMS TOL_PARAMS

/* The outcome's extra for the pipeline (strategy_outcome.extra): pp_launch allocates
 * its arrays before the ranks start, world rank 0 fills them; pp_extra_free. */
typedef struct {
    pipeline_options opts;
    int stages;
    int replicas;               /* pipelines side by side (data parallel): ranks / stages */
    pipeline_measures measured; /* world rank 0's pipeline */
    pp_bubble formula;          /* the textbook's (streams: a GPU's) */
    pp_bubble cpu_ranks;        /* the simulator's for one operation at a time, as here */
    int *in_flight_formula;     /* [stages] what the schedule holds at most */
    double bytes_formula;       /* per boundary per step: 2 m b s h x 4 B (2 B in 16 bits) */
    double tied_drift;          /* the tied weight's two copies, at the end */
    pp_span *spans;             /* the last step's passes, every rank (seconds) */
    int nspans, spans_room;
} pp_extra;
static inline const pp_extra *pp_extra_of(const strategy_outcome *o) { return o->extra; }
void pp_extra_free(pp_extra *x);

/* After the loop, before the parameters are gathered: a strategy's own measurements of
 * the pipeline rank (collective over the mesh as it needs). */
typedef void (*pp_measure_fn)(comm *world, pipeline_rank *r, void *ctx,
                              strategy_outcome *out);

/* Collective over world, the mesh m's: trains cfg->steps steps of a pipeline rank named
 * `name` (NULL: the schedule's), calls measure (may be NULL), then gathers the whole
 * parameters into out. Returns the tied weight's drift. */
double pp_train_on_mesh(comm *world, const mesh *m, const run_config *cfg,
                        const dataset *data, const pipeline_options *opts, const char *name,
                        pp_measure_fn measure, void *ctx, strategy_outcome *out);

/* Launches cfg->comm.ranks ranks as pipelines of `stages` stages (0: one pipeline of
 * every rank), the ranks / stages pipelines data parallel (each on batch / d sequences);
 * stages must divide the ranks. rank0_out->extra, when set, is a pp_extra. Returns
 * launch's status. */
int pp_launch(const run_config *cfg, const dataset *data, int stages,
              const pipeline_options *opts, strategy_outcome *rank0_out);

/* The largest checked difference against its tolerance (1 = at the limit). */
double pp_worst_fraction_of_tolerance(const run_result *r);

#endif
